//! Binding matching for the four exchange types (RabbitMQ 3.10.8
//! `rabbit_exchange_type_{direct,fanout,topic,headers}`).

use amq_protocol::types::{AMQPValue, FieldTable};

use super::error::AmqpError;
use super::value::{erl_binary, erl_eq, erl_p, lookup, type_name};

/// Splits a topic key into words exactly as `split_topic_key/1`: `""` has
/// zero words, `"a."` is `["a", ""]`, `"."` is `["", ""]`.
fn words(key: &str) -> Vec<&str> {
    if key.is_empty() {
        Vec::new()
    } else {
        key.split('.').collect()
    }
}

/// Topic match (RabbitMQ 3.10.8 trie semantics): binding word `*` matches
/// exactly one word (possibly empty), `#` zero or more words, anything else
/// that literal word. Empty words are words (`"a..b"` has three).
pub fn topic_matches(binding_key: &str, routing_key: &str) -> bool {
    let b = words(binding_key);
    let r = words(routing_key);
    // m[j] = binding prefix b[..i] matches routing prefix r[..j].
    let mut m = vec![false; r.len() + 1];
    m[0] = true;
    for bw in &b {
        let mut next = vec![false; r.len() + 1];
        match *bw {
            "#" => {
                let mut any = false;
                for j in 0..=r.len() {
                    any |= m[j];
                    next[j] = any;
                }
            }
            "*" => {
                next[1..].copy_from_slice(&m[..r.len()]);
            }
            lit => {
                for j in 1..=r.len() {
                    next[j] = m[j - 1] && r[j - 1] == lit;
                }
            }
        }
        m = next;
    }
    m[r.len()]
}

/// `x-match` mode of a headers binding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XMatch {
    All,
    Any,
    AllWithX,
    AnyWithX,
}

fn x_match(args: &FieldTable) -> XMatch {
    match lookup(args, "x-match") {
        Some(AMQPValue::LongString(s)) => match s.as_bytes() {
            b"any" => XMatch::Any,
            b"all-with-x" => XMatch::AllWithX,
            b"any-with-x" => XMatch::AnyWithX,
            _ => XMatch::All,
        },
        // Legacy: unvalidated or absent means all.
        _ => XMatch::All,
    }
}

/// Binding validation of a headers exchange (`validate_binding/2`): `x-match`
/// must be a longstr `all`/`any`/`all-with-x`/`any-with-x` or absent.
/// Texts observed on 3.10.8: `PRECONDITION_FAILED - Invalid x-match field
/// value <<"foo">>; expected all, any, all-with-x, or any-with-x` and
/// `PRECONDITION_FAILED - Invalid x-match field type signedint (value 5); expected longstr`.
pub fn validate_headers_binding(args: &FieldTable) -> Result<(), AmqpError> {
    match lookup(args, "x-match") {
        None => Ok(()),
        Some(AMQPValue::LongString(s)) => match s.as_bytes() {
            b"all" | b"any" | b"all-with-x" | b"any-with-x" => Ok(()),
            other => Err(AmqpError::precondition_failed(format!(
                "Invalid x-match field value {}; expected all, any, all-with-x, or any-with-x",
                erl_binary(other)
            ))),
        },
        Some(v) => Err(AmqpError::precondition_failed(format!(
            "Invalid x-match field type {} (value {}); expected longstr",
            type_name(v),
            erl_p(v)
        ))),
    }
}

/// Headers match (`headers_match/2`, 3.10.8). Binding keys `x-match` are
/// never compared; other `x-` keys only with `all-with-x`/`any-with-x`. A
/// binding value of type void matches on presence; otherwise Erlang `==` on
/// the values (types ignored: long 5 matches short 5). `all` with no
/// relevant keys matches everything; `any` with none matches nothing. No
/// headers = empty table.
pub fn headers_match(binding_args: &FieldTable, headers: Option<&FieldTable>) -> bool {
    let mode = x_match(binding_args);
    let with_x = matches!(mode, XMatch::AllWithX | XMatch::AnyWithX);
    let empty = FieldTable::default();
    let data = headers.unwrap_or(&empty);
    let mut all = true;
    let mut any = false;
    for (k, pv) in binding_args.inner() {
        let k = k.as_str();
        if k == "x-match" || (!with_x && k.starts_with("x-")) {
            continue;
        }
        let hit = match lookup(data, k) {
            None => false,
            Some(dv) => matches!(pv, AMQPValue::Void) || erl_eq(pv, dv),
        };
        all &= hit;
        any |= hit;
    }
    match mode {
        XMatch::All | XMatch::AllWithX => all,
        XMatch::Any | XMatch::AnyWithX => any,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::test_helpers::{s, t};
    use proptest::prelude::*;

    #[test]
    fn topic_basics() {
        assert!(topic_matches("a.b", "a.b"));
        assert!(!topic_matches("a.b", "a.b.c"));
        assert!(topic_matches("*.b", "a.b"));
        assert!(!topic_matches("*", ""));
        assert!(topic_matches("*", "abc"));
        assert!(topic_matches("#", ""));
        assert!(topic_matches("#", "a.b.c"));
        assert!(topic_matches("a.#", "a"));
        assert!(topic_matches("a.#", "a.b.c"));
        assert!(!topic_matches("a.#", "b.a"));
        assert!(topic_matches("#.a", "a"));
        assert!(topic_matches("#.a.#", "x.a.y"));
        assert!(topic_matches("", ""));
        assert!(!topic_matches("", "a"));
    }

    #[test]
    fn topic_dead_letter_patterns() {
        // From dead_lettering_SUITE: "#.dl.routing.key" and "*.normal.routing.key".
        assert!(topic_matches("#.dl.routing.key", "dl.routing.key"));
        assert!(topic_matches("#.dl.routing.key", "x.y.dl.routing.key"));
        assert!(!topic_matches("#.dl.routing.key", "dl.routing.key.z"));
        assert!(topic_matches(
            "*.normal.routing.key",
            "a.normal.routing.key"
        ));
        assert!(!topic_matches("*.normal.routing.key", "normal.routing.key"));
        assert!(!topic_matches(
            "*.normal.routing.key",
            "a.b.normal.routing.key"
        ));
    }

    #[test]
    fn topic_empty_words() {
        assert!(!topic_matches("*", ""));
        assert!(topic_matches("*.*", "."));
        assert!(topic_matches("a.*", "a."));
        assert!(!topic_matches("a.*", "a"));
        assert!(topic_matches("a..b", "a..b"));
        assert!(topic_matches("a.*.b", "a..b"));
        assert!(topic_matches("#.", "a."));
        assert!(topic_matches("#", "."));
        assert!(topic_matches("a.#.b", "a.b"));
        assert!(topic_matches("#.#", "a"));
        assert!(topic_matches("#.*", "a"));
        assert!(!topic_matches("#.*", ""));
    }

    #[test]
    fn headers_all_default() {
        let b = t(&[("a", s("1")), ("b", AMQPValue::LongInt(2))]);
        assert!(headers_match(
            &b,
            Some(&t(&[
                ("a", s("1")),
                ("b", AMQPValue::LongLongInt(2)),
                ("c", s("z"))
            ]))
        ));
        assert!(!headers_match(&b, Some(&t(&[("a", s("1"))]))));
        assert!(!headers_match(&b, None));
        // Empty binding with all: matches everything, even no headers.
        assert!(headers_match(&FieldTable::default(), None));
        let bx = t(&[("x-match", s("all")), ("a", s("1"))]);
        assert!(headers_match(&bx, Some(&t(&[("a", s("1"))]))));
    }

    #[test]
    fn headers_any() {
        let b = t(&[("x-match", s("any")), ("a", s("1")), ("b", s("2"))]);
        assert!(headers_match(&b, Some(&t(&[("b", s("2"))]))));
        assert!(!headers_match(&b, Some(&t(&[("b", s("3"))]))));
        assert!(!headers_match(
            &t(&[("x-match", s("any"))]),
            Some(&t(&[("a", s("1"))]))
        ));
    }

    #[test]
    fn headers_with_x() {
        let hdr = t(&[("x-foo", s("1"))]);
        // Plain all/any ignore x- keys of the binding.
        assert!(headers_match(
            &t(&[("x-match", s("all")), ("x-foo", s("2"))]),
            Some(&hdr)
        ));
        assert!(!headers_match(
            &t(&[("x-match", s("any")), ("x-foo", s("1"))]),
            Some(&hdr)
        ));
        // with-x variants compare them.
        assert!(!headers_match(
            &t(&[("x-match", s("all-with-x")), ("x-foo", s("2"))]),
            Some(&hdr)
        ));
        assert!(headers_match(
            &t(&[("x-match", s("all-with-x")), ("x-foo", s("1"))]),
            Some(&hdr)
        ));
        assert!(headers_match(
            &t(&[
                ("x-match", s("any-with-x")),
                ("x-foo", s("1")),
                ("b", s("9"))
            ]),
            Some(&hdr)
        ));
        assert!(!headers_match(
            &t(&[("x-match", s("any-with-x")), ("x-foo", s("3"))]),
            Some(&hdr)
        ));
    }

    #[test]
    fn headers_void_means_presence() {
        let b = t(&[("a", AMQPValue::Void)]);
        assert!(headers_match(
            &b,
            Some(&t(&[("a", AMQPValue::Boolean(false))]))
        ));
        assert!(!headers_match(
            &b,
            Some(&t(&[("b", AMQPValue::Boolean(false))]))
        ));
    }

    #[test]
    fn headers_binding_validation_texts() {
        assert_eq!(
            validate_headers_binding(&t(&[("x-match", s("foo"))])).unwrap_err().text,
            "PRECONDITION_FAILED - Invalid x-match field value <<\"foo\">>; expected all, any, all-with-x, or any-with-x"
        );
        assert_eq!(
            validate_headers_binding(&t(&[("x-match", AMQPValue::LongInt(5))])).unwrap_err().text,
            "PRECONDITION_FAILED - Invalid x-match field type signedint (value 5); expected longstr"
        );
        assert!(validate_headers_binding(&t(&[("x-match", s("any-with-x"))])).is_ok());
        assert!(validate_headers_binding(&FieldTable::default()).is_ok());
    }

    /// Naive model: each word w becomes `w/`; `*` = `[^/]*/`, `#` = `([^/]*/)*`.
    fn naive(binding: &str, rk: &str) -> bool {
        let enc = |k: &str| -> String { words(k).iter().map(|w| format!("{w}/")).collect() };
        let mut re = String::from("^");
        for w in words(binding) {
            match w {
                "*" => re.push_str("[^/]*/"),
                "#" => re.push_str("(?:[^/]*/)*"),
                lit => {
                    re.push_str(&regex::escape(lit));
                    re.push('/');
                }
            }
        }
        re.push('$');
        regex::Regex::new(&re)
            .map(|r| r.is_match(&enc(rk)))
            .unwrap_or(false)
    }

    fn key(alphabet: &'static [&'static str]) -> impl Strategy<Value = String> {
        prop::collection::vec(prop::sample::select(alphabet), 0..6).prop_map(|ws| ws.join("."))
    }

    proptest! {
        #[test]
        fn topic_agrees_with_regex_model(
            b in key(&["a", "b", "", "*", "#"]),
            r in key(&["a", "b", "", "*", "#"]),
        ) {
            prop_assert_eq!(topic_matches(&b, &r), naive(&b, &r), "binding {:?} key {:?}", b, r);
        }
    }
}
