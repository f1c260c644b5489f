//! `quorumq-faults`: the fault-injection suite (see `cluster_tests::faults`).
//! Normally started by `cluster-tests/faults/run.sh`, which builds the
//! binaries and points `QUORUMQ_BIN` at them.
//!
//! Prints a one-screen summary; its last line is the verdict:
//! `verdict: ops=N lost=L unexpected=U duplicates=D faults=K seed=S`.
//! Exit status 0 only when every workload lost nothing, delivered nothing
//! unexpected, every dead letter carried a well-formed x-death, every queue
//! drained after healing, something was confirmed and delivered, every
//! scheduled fault was injected and healed, confirms resumed within 10 s of
//! each heal, and every nemesis kind asked for could run here (exclude one
//! on purpose with `--exclude`).

use clap::Parser;
use cluster_tests::faults::{self, checker, nemesis, workload, Options, Profile, Report};
use std::{path::PathBuf, time::Duration};

#[derive(Parser)]
#[command(
    about = "quorumq fault-injection suite: partitions, kill -9, pauses, lossy links, full disk"
)]
struct Args {
    /// `short`: every nemesis kind once, spread over the workloads (a few
    /// minutes); `long`: random kinds for --time per workload.
    #[arg(long, default_value = "short")]
    profile: String,
    /// Nemesis phase per workload in seconds (long profile; default 450 = 30 min over 4 workloads).
    #[arg(long, default_value_t = 450)]
    time: u64,
    /// Nemesis kinds, comma-separated, or `all`: kill, kill-leader, pause,
    /// partition-one, partition-halves, bridge, partition-leader, loss, delay,
    /// rolling-restart, disk-full, slow-link.
    #[arg(long, default_value = "all")]
    nemesis: String,
    /// Nemesis kinds to leave out on purpose, comma-separated (a kind asked
    /// for that this machine cannot run fails the run instead).
    #[arg(long, default_value = "")]
    exclude: String,
    /// Workloads, comma-separated, or `all`: total-queue, dead-letter, delivery-limit, expiry.
    #[arg(long, default_value = "all")]
    workload: String,
    /// Seed of the schedule (default: from the clock; printed).
    #[arg(long)]
    seed: Option<u64>,
    /// Publish rate per publisher, msg/s (one publisher per node).
    #[arg(long, default_value_t = 100)]
    rate: u64,
    /// `namespaces` (default; falls back to `proxy` where they are unavailable) or
    /// `proxy`: nodes on 127.0.0.1x behind forwarding proxies on 127.0.0.2x.
    #[arg(long, default_value = "namespaces")]
    network: String,
    /// Results root; the run writes to `<root>/<unix time>-seed<S>/`.
    #[arg(long, default_value = "cluster-tests/faults/results")]
    results: PathBuf,
}

fn list<T: Copy>(
    spec: &str,
    all: &[T],
    parse: impl Fn(&str) -> Option<T>,
) -> Result<Vec<T>, String> {
    if spec == "all" {
        return Ok(all.to_vec());
    }
    spec.split(',')
        .map(|s| parse(s.trim()).ok_or_else(|| format!("unknown name {s:?}")))
        .collect()
}

fn summary(r: &Report, results: &std::path::Path) -> (u64, u64, u64, u64, u64) {
    println!("quorumq fault suite — seed {}, {}", r.seed, r.network);
    if !r.skipped.is_empty() {
        println!(
            "FAILED: cannot run here: {} (leave out on purpose with --exclude)",
            r.skipped.join(", ")
        );
    }
    if !r.excluded.is_empty() {
        println!("excluded by --exclude: {}", r.excluded.join(", "));
    }
    println!(
        "{:<15} {:>6} {:>6} {:>6} {:>6} {:>5} {:>5} {:>5} {:>5} {:>6} {:>6} {:>6}",
        "workload",
        "ops",
        "acked",
        "nacked",
        "unkn",
        "lost",
        "unexp",
        "dup",
        "fresh",
        "unconf",
        "malf",
        "faults"
    );
    let (mut ops, mut lost, mut unexpected, mut dups, mut faults) = (0, 0, 0, 0, 0);
    let mut fresh = 0;
    for v in &r.verdicts {
        println!(
            "{:<15} {:>6} {:>6} {:>6} {:>6} {:>5} {:>5} {:>5} {:>5} {:>6} {:>6} {:>6}{}",
            v.workload,
            v.ops,
            v.confirmed,
            v.nacked,
            v.unknown,
            v.lost,
            v.unexpected,
            v.duplicates,
            v.fresh_duplicates,
            v.delivered_unconfirmed,
            v.malformed,
            v.faults,
            if v.passed() { "" } else { "  FAILED" }
        );
        if !v.lost_sample.is_empty() {
            println!("    lost e.g. {:?}", v.lost_sample);
        }
        for m in &v.malformed_sample {
            println!("    malformed: {m}");
        }
        for p in v.problems() {
            println!("    problem: {p}");
        }
        for w in v.warnings() {
            println!("    warning: {w}");
        }
        let kinds: Vec<String> = v
            .faults_by_kind
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        println!(
            "    faults injected/healed/scheduled: {}/{}/{} ({})",
            v.faults,
            v.healed,
            v.scheduled,
            kinds.join(", ")
        );
        let rec: Vec<String> = v
            .recoveries
            .iter()
            .map(|r| match r.first_confirm_ms {
                Some(ms) => format!(
                    "{} {:.2}/{:.2}s",
                    r.kind,
                    ms as f64 / 1000.0,
                    r.max_gap_ms as f64 / 1000.0
                ),
                None => format!("{} -/{:.2}s", r.kind, r.max_gap_ms as f64 / 1000.0),
            })
            .collect();
        println!(
            "    first confirm after heal / longest confirm gap: {}",
            rec.join(", ")
        );
        match v.longest_recovery_ms() {
            Some(ms) => println!(
                "    longest time from a heal to a confirm: {:.2}s (bound {:.0}s)",
                ms as f64 / 1000.0,
                checker::RECOVERY_BOUND_MS as f64 / 1000.0
            ),
            None if v.recoveries.is_empty() => {}
            None => println!("    a heal had no confirm after it"),
        }
        ops += v.ops;
        lost += v.lost;
        unexpected += v.unexpected;
        dups += v.duplicates;
        fresh += v.fresh_duplicates;
        faults += v.faults;
    }
    println!("results: {}", results.display());
    println!("duplicates: {dups} deliveries beyond an id's first, {fresh} of them not flagged redelivered (second copies)");
    (ops, lost, unexpected, dups, faults)
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let profile = match args.profile.as_str() {
        "short" => Profile::Short,
        "long" => Profile::Long,
        other => {
            eprintln!("--profile must be short or long, not {other:?}");
            std::process::exit(2);
        }
    };
    let excluded = if args.exclude.is_empty() {
        Ok(Vec::new())
    } else {
        list(&args.exclude, &nemesis::Kind::ALL, nemesis::Kind::parse)
    };
    let (mut nemeses, workloads, excluded) = match (
        list(&args.nemesis, &nemesis::Kind::ALL, nemesis::Kind::parse),
        list(&args.workload, &workload::Kind::ALL, workload::Kind::parse),
        excluded,
    ) {
        (Ok(n), Ok(w), Ok(x)) => (n, w, x),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    nemeses.retain(|k| !excluded.contains(k));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let seed = args.seed.unwrap_or(now.as_nanos() as u64 % 1_000_000);
    let results = args.results.join(format!("{}-seed{seed}", now.as_secs()));
    eprintln!("seed {seed}; results in {}", results.display());
    let proxies = match args.network.as_str() {
        "namespaces" => false,
        "proxy" => true,
        other => {
            eprintln!("--network must be namespaces or proxy, not {other:?}");
            std::process::exit(2);
        }
    };
    let opts = Options {
        profile,
        time: Duration::from_secs(args.time),
        workloads,
        nemeses,
        seed,
        rate: args.rate,
        results: results.clone(),
        proxies,
        excluded,
    };
    match faults::run(&opts).await {
        Ok(report) => {
            let (ops, lost, unexpected, dups, faults) = summary(&report, &results);
            println!("verdict: ops={ops} lost={lost} unexpected={unexpected} duplicates={dups} faults={faults} seed={seed}");
            std::process::exit(if report.passed() { 0 } else { 1 });
        }
        Err(e) => {
            eprintln!("fault suite aborted: {e:#}");
            println!("verdict: aborted seed={seed}");
            std::process::exit(1);
        }
    }
}
