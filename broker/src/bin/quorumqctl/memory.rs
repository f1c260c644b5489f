//! rabbitmqctl `set_vm_memory_high_watermark`: the memory high watermark of the node asked
//! (`--node`), until it restarts.

use anyhow::{anyhow, bail};
use quorumq_proto::v1::set_memory_watermark_request::Limit;
use quorumq_proto::v1::SetMemoryWatermarkRequest;

use crate::output::{banner, Formatter};
use crate::{ok_or_bail, Client};

/// `set_vm_memory_high_watermark FRACTION` or `set_vm_memory_high_watermark absolute LIMIT`
/// ([`parse`]).
///
/// Errors: the arguments do not parse, the call fails, or the node refuses.
pub async fn set_watermark(c: &mut Client, f: Formatter, args: &[String]) -> anyhow::Result<()> {
    let limit = parse(args)?;
    banner(f, "Setting memory threshold on the node...\n");
    ok_or_bail(
        c.set_memory_watermark(SetMemoryWatermarkRequest { limit: Some(limit) })
            .await?
            .into_inner(),
    )
}

/// The watermark rabbitmqctl's arguments give: `[FRACTION]` (0 or more; 0 raises the alarm
/// at once) or `["absolute", LIMIT]`, LIMIT in bytes or with one of rabbitmqctl's units: `k`,
/// `KiB`, `M`, `MiB`, `G`, `GiB` (powers of 1024) and `kB`, `MB`, `GB` (powers of 1000).
///
/// Errors: any other shape, a negative or non-numeric fraction, an unknown unit.
pub fn parse(args: &[String]) -> anyhow::Result<Limit> {
    match args {
        [fraction] => {
            let f: f64 = fraction
                .parse()
                .map_err(|_| anyhow!("the watermark must be a fraction, not {fraction:?}"))?;
            if !f.is_finite() || f < 0.0 {
                bail!("the watermark fraction must be 0 or more, not {fraction}");
            }
            Ok(Limit::Fraction(f))
        }
        [kind, limit] if kind == "absolute" => Ok(Limit::Bytes(bytes(limit)?)),
        _ => bail!("usage: set_vm_memory_high_watermark FRACTION | absolute LIMIT"),
    }
}

/// `LIMIT` in bytes: digits, then an optional unit.
fn bytes(limit: &str) -> anyhow::Result<u64> {
    let digits = limit
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(limit.len());
    let (n, unit) = limit.split_at(digits);
    let n: u64 = n
        .parse()
        .map_err(|_| anyhow!("the memory limit must be a number of bytes, not {limit:?}"))?;
    let scale: u64 = match unit {
        "" => 1,
        "k" | "K" | "KiB" => 1 << 10,
        "M" | "MiB" => 1 << 20,
        "G" | "GiB" => 1 << 30,
        "kB" | "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        _ => bail!("unknown unit {unit:?} in {limit:?} (k, KiB, M, MiB, G, GiB, kB, MB, GB)"),
    };
    n.checked_mul(scale)
        .ok_or_else(|| anyhow!("the memory limit {limit:?} is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_fraction_or_an_absolute_limit_with_rabbitmqctl_units() {
        assert_eq!(parse(&args(&["0.4"])).unwrap(), Limit::Fraction(0.4));
        assert_eq!(parse(&args(&["0"])).unwrap(), Limit::Fraction(0.0));
        assert_eq!(
            parse(&args(&["absolute", "1073741824"])).unwrap(),
            Limit::Bytes(1 << 30)
        );
        assert_eq!(
            parse(&args(&["absolute", "512M"])).unwrap(),
            Limit::Bytes(512 << 20)
        );
        assert_eq!(
            parse(&args(&["absolute", "2GB"])).unwrap(),
            Limit::Bytes(2_000_000_000)
        );
        assert_eq!(
            parse(&args(&["absolute", "3KiB"])).unwrap(),
            Limit::Bytes(3 << 10)
        );
    }

    #[test]
    fn bad_arguments_are_refused_with_the_reason() {
        for bad in [
            &["-0.1"][..],
            &["x"],
            &["absolute"],
            &["absolute", "12XB"],
            &["absolute", "M"],
            &["relative", "1"],
            &["absolute", "99999999999999999999G"],
        ] {
            assert!(parse(&args(bad)).is_err(), "{bad:?} was accepted");
        }
    }
}
