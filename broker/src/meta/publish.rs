//! Publish-side checks that feed routing: the `expiration` property and the
//! `CC`/`BCC` sender-selected routing headers (spec §1.7, §3.2; RabbitMQ
//! 3.10.8 `rabbit_basic:parse_expiration/1`, `header_routes/1`; texts
//! observed on 3.10.8).

use amq_protocol::types::{AMQPValue, FieldTable};

use super::error::AmqpError;
use super::queue_args::MAX_EXPIRY_MS;
use super::value::{erl_string, type_name};

/// Parses the `expiration` property (per-message TTL, ms) as Erlang's
/// `string:to_integer/1` + `check_expiry/1`: optional sign, decimal digits,
/// nothing after. Errors (406, channel): `PRECONDITION_FAILED - invalid
/// expiration '<s>': no_integer` | `{leftover_string,"<rest>"}` |
/// `{value_negative,N}` | `{value_too_large,N}` (limit 315 360 000 000).
/// `+5` and `007` are accepted; ` 5` is `no_integer`.
pub fn parse_expiration(s: &str) -> Result<u64, AmqpError> {
    let fail = |reason: String| {
        AmqpError::precondition_failed(format!("invalid expiration '{s}': {reason}"))
    };
    let bytes = s.as_bytes();
    let (negative, rest) = match bytes.first() {
        Some(b'-') => (true, &bytes[1..]),
        Some(b'+') => (false, &bytes[1..]),
        _ => (false, bytes),
    };
    let ndigits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    if ndigits == 0 {
        return Err(fail("no_integer".to_owned()));
    }
    let (digits, leftover) = rest.split_at(ndigits);
    if !leftover.is_empty() {
        return Err(fail(format!(
            "{{leftover_string,{}}}",
            erl_string(leftover)
        )));
    }
    // Value as Erlang prints it: no leading zeros, arbitrary size.
    let trimmed: String = {
        let t = String::from_utf8_lossy(digits);
        let t = t.trim_start_matches('0');
        if t.is_empty() {
            "0".to_owned()
        } else {
            t.to_owned()
        }
    };
    if negative && trimmed != "0" {
        return Err(fail(format!("{{value_negative,-{trimmed}}}")));
    }
    let max = MAX_EXPIRY_MS.to_string();
    if trimmed.len() > max.len() || (trimmed.len() == max.len() && trimmed > max) {
        return Err(fail(format!("{{value_too_large,{trimmed}}}")));
    }
    trimmed
        .parse::<u64>()
        .map_err(|_| fail("no_integer".to_owned()))
}

fn header_keys(headers: &FieldTable, key: &str) -> Result<Vec<String>, AmqpError> {
    match headers.inner().get(key) {
        None => Ok(Vec::new()),
        Some(AMQPValue::FieldArray(a)) => Ok(a
            .as_slice()
            .iter()
            .filter_map(|v| match v {
                AMQPValue::LongString(s) => {
                    Some(String::from_utf8_lossy(s.as_bytes()).into_owned())
                }
                _ => None,
            })
            .collect()),
        Some(v) => Err(AmqpError::precondition_failed(format!(
            "invalid message: {{unacceptable_type_in_header,\"{key}\",{}}}",
            type_name(v)
        ))),
    }
}

/// What basic.publish routes by, from its routing key and properties: the
/// routing keys (the key, then the `CC` and `BCC` header keys, RabbitMQ
/// "Sender-selected distribution"), the `BCC` keys alone (to strip from the
/// stored headers) and the per-message TTL of `expiration` (ms).
pub struct PublishKeys {
    pub keys: Vec<String>,
    pub bcc: Vec<String>,
    pub ttl_ms: Option<u64>,
}

/// [`PublishKeys`] of a publish to `routing_key` with `headers` and
/// `expiration`. The one place the AMQP channel and the HTTP API's publish
/// compute them.
///
/// Errors: a malformed `CC`/`BCC` header or `expiration` (406, RabbitMQ's text).
pub fn publish_keys(
    routing_key: &str,
    headers: Option<&FieldTable>,
    expiration: Option<&str>,
) -> Result<PublishKeys, AmqpError> {
    let (cc, bcc) = cc_bcc_keys(headers)?;
    let ttl_ms = expiration.map(parse_expiration).transpose()?;
    let mut keys = Vec::with_capacity(1 + cc.len() + bcc.len());
    keys.push(routing_key.to_owned());
    keys.extend(cc);
    keys.extend(bcc.iter().cloned());
    Ok(PublishKeys { keys, bcc, ttl_ms })
}

/// Extra routing keys from the `CC` and `BCC` headers (each must be an array;
/// non-longstr elements are skipped). Returns `(cc, bcc)`. A non-array value
/// closes the channel: `PRECONDITION_FAILED - invalid message:
/// {unacceptable_type_in_header,"CC",longstr}` (3.10.8 observed; CC is
/// checked before BCC).
pub fn cc_bcc_keys(headers: Option<&FieldTable>) -> Result<(Vec<String>, Vec<String>), AmqpError> {
    match headers {
        None => Ok((Vec::new(), Vec::new())),
        Some(h) => Ok((header_keys(h, "CC")?, header_keys(h, "BCC")?)),
    }
}

/// Removes the `BCC` header: it never reaches a consumer (spec §3.2).
pub fn strip_bcc(headers: &mut FieldTable) {
    if headers.contains_key("BCC") {
        let mut m = headers.inner().clone();
        m.remove("BCC");
        *headers = FieldTable::from(m);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::test_helpers::{s, t};
    use amq_protocol::types::FieldArray;

    #[test]
    fn expiration_texts() {
        let e = |s: &str| parse_expiration(s).unwrap_err().text;
        assert_eq!(
            e("abc"),
            "PRECONDITION_FAILED - invalid expiration 'abc': no_integer"
        );
        assert_eq!(
            e("12abc"),
            "PRECONDITION_FAILED - invalid expiration '12abc': {leftover_string,\"abc\"}"
        );
        assert_eq!(
            e("-5"),
            "PRECONDITION_FAILED - invalid expiration '-5': {value_negative,-5}"
        );
        assert_eq!(e("315360000001"), "PRECONDITION_FAILED - invalid expiration '315360000001': {value_too_large,315360000001}");
        assert_eq!(
            e(""),
            "PRECONDITION_FAILED - invalid expiration '': no_integer"
        );
        assert_eq!(
            e(" 5"),
            "PRECONDITION_FAILED - invalid expiration ' 5': no_integer"
        );
        assert_eq!(
            e("5 "),
            "PRECONDITION_FAILED - invalid expiration '5 ': {leftover_string,\" \"}"
        );
        assert_eq!(
            e("1.5"),
            "PRECONDITION_FAILED - invalid expiration '1.5': {leftover_string,\".5\"}"
        );
        assert_eq!(
            e("-"),
            "PRECONDITION_FAILED - invalid expiration '-': no_integer"
        );
        assert_eq!(
            e("99999999999999999999999999"),
            "PRECONDITION_FAILED - invalid expiration '99999999999999999999999999': {value_too_large,99999999999999999999999999}"
        );
        assert_eq!(parse_expiration("+5").unwrap(), 5);
        assert_eq!(parse_expiration("007").unwrap(), 7);
        assert_eq!(parse_expiration("0").unwrap(), 0);
        assert_eq!(parse_expiration("-0").unwrap(), 0);
        assert_eq!(parse_expiration("315360000000").unwrap(), 315_360_000_000);
    }

    #[test]
    fn cc_bcc() {
        let arr = |v: Vec<AMQPValue>| AMQPValue::FieldArray(FieldArray::from(v));
        let hdr = t(&[
            ("CC", arr(vec![s("cc 1"), AMQPValue::LongInt(5), s("cc 2")])),
            ("BCC", arr(vec![s("bcc")])),
            ("other", s("x")),
        ]);
        assert_eq!(
            cc_bcc_keys(Some(&hdr)).unwrap(),
            (
                vec!["cc 1".to_owned(), "cc 2".to_owned()],
                vec!["bcc".to_owned()]
            )
        );
        assert_eq!(cc_bcc_keys(None).unwrap(), (vec![], vec![]));
        assert_eq!(
            cc_bcc_keys(Some(&t(&[("CC", s("a"))]))).unwrap_err().text,
            "PRECONDITION_FAILED - invalid message: {unacceptable_type_in_header,\"CC\",longstr}"
        );
        assert_eq!(
            cc_bcc_keys(Some(&t(&[("BCC", AMQPValue::LongInt(5))]))).unwrap_err().text,
            "PRECONDITION_FAILED - invalid message: {unacceptable_type_in_header,\"BCC\",signedint}"
        );
        let mut stripped = hdr.clone();
        strip_bcc(&mut stripped);
        assert!(!stripped.contains_key("BCC"));
        assert!(stripped.contains_key("CC") && stripped.contains_key("other"));
    }
}
