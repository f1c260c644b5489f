//! queue.declare argument validation and redeclare equivalence, in
//! RabbitMQ 3.10.8's order and with its exact texts (spec §1.1-1.5;
//! `rabbit_amqqueue:check_declare_arguments/2`, `rabbit_misc:assert_args_equivalence/4`;
//! every text below observed on 3.10.8 with pika).

use amq_protocol::types::{AMQPValue, FieldTable, LongString, ShortString};
use serde::{Deserialize, Serialize};

use super::error::AmqpError;
use super::value::{as_integer, as_longstr, erl_eq, erl_s_or_p, lookup, type_class, type_name};

/// Largest TTL / expiry accepted: 10 years in ms (`rabbit_misc:check_expiry/1`).
pub const MAX_EXPIRY_MS: i128 = 315_360_000_000;

/// RabbitMQ queue type as declared (`x-queue-type`). quorumq backs durable
/// `classic` queues with a quorum group too, but keeps the declared type for
/// validation and equivalence so clients see RabbitMQ's answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum QueueType {
    Classic,
    Quorum,
    Stream,
}

impl QueueType {
    /// The Erlang module name RabbitMQ prints in errors.
    pub fn module(self) -> &'static str {
        match self {
            QueueType::Classic => "rabbit_classic_queue",
            QueueType::Quorum => "rabbit_quorum_queue",
            QueueType::Stream => "rabbit_stream_queue",
        }
    }

    /// The type's supported queue arguments, in RabbitMQ 3.10.8's
    /// `capabilities()` order (this is also the equivalence check order).
    pub fn queue_arguments(self) -> &'static [&'static str] {
        match self {
            QueueType::Quorum => &[
                "x-dead-letter-exchange",
                "x-dead-letter-routing-key",
                "x-dead-letter-strategy",
                "x-expires",
                "x-max-length",
                "x-max-length-bytes",
                "x-max-in-memory-length",
                "x-max-in-memory-bytes",
                "x-overflow",
                "x-single-active-consumer",
                "x-queue-type",
                "x-quorum-initial-group-size",
                "x-delivery-limit",
                "x-message-ttl",
                "x-queue-leader-locator",
                // RabbitMQ 4.3 (quorumq deliberate difference: 3.10.8 refuses it).
                "x-max-priority",
                // RabbitMQ 4.3 delayed retry (quorum queues only).
                "x-delayed-retry-type",
                "x-delayed-retry-min",
                "x-delayed-retry-max",
                // RabbitMQ 3.12+ / 4.3: per-queue consumer timeout (ms).
                "x-consumer-timeout",
            ],
            QueueType::Classic => &[
                "x-expires",
                "x-message-ttl",
                "x-dead-letter-exchange",
                "x-dead-letter-routing-key",
                "x-max-length",
                "x-max-length-bytes",
                "x-max-priority",
                "x-overflow",
                "x-queue-mode",
                "x-queue-version",
                "x-single-active-consumer",
                "x-queue-type",
                "x-queue-master-locator",
                "x-consumer-timeout",
            ],
            QueueType::Stream => &[
                "x-max-length-bytes",
                "x-queue-type",
                "x-max-age",
                "x-stream-max-segment-size-bytes",
                "x-initial-cluster-size",
                "x-queue-leader-locator",
            ],
        }
    }

    /// Policy keys that make a whole policy inapplicable to a queue of this
    /// type (`rabbit_queue_type:is_policy_applicable/2`, 3.10.8: a policy with
    /// any of these keys does not match the queue at all; observed: a
    /// higher-priority policy with `queue-mode` is skipped for a QQ and the
    /// next one applies).
    pub fn unsupported_policies(self) -> &'static [&'static str] {
        match self {
            QueueType::Quorum => &[
                "max-priority",
                "queue-mode",
                "single-active-consumer",
                "ha-mode",
                "ha-params",
                "ha-sync-mode",
                "ha-promote-on-shutdown",
                "ha-promote-on-failure",
                "queue-master-locator",
                "max-age",
                "stream-max-segment-size-bytes",
                "initial-cluster-size",
            ],
            QueueType::Classic => &[
                "max-age",
                "stream-max-segment-size-bytes",
                "queue-leader-locator",
                "initial-cluster-size",
                "delivery-limit",
                "dead-letter-strategy",
            ],
            QueueType::Stream => &[],
        }
    }

    /// Type of a stored queue from its arguments: `x-queue-type` if present
    /// (longstr), else classic (RabbitMQ's node default).
    pub fn of_args(args: &FieldTable) -> QueueType {
        match lookup(args, "x-queue-type").and_then(as_longstr).as_deref() {
            Some("quorum") => QueueType::Quorum,
            Some("stream") => QueueType::Stream,
            _ => QueueType::Classic,
        }
    }
}

/// Every argument some queue type knows (3.10.8): a key in this list but not
/// in the target type's list is refused (spec §1.3).
const ALL_KNOWN_ARGS: &[&str] = &[
    "x-expires",
    "x-message-ttl",
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-dead-letter-strategy",
    "x-max-length",
    "x-max-length-bytes",
    "x-max-in-memory-length",
    "x-max-in-memory-bytes",
    "x-max-priority",
    "x-overflow",
    "x-queue-mode",
    "x-queue-version",
    "x-single-active-consumer",
    "x-queue-type",
    "x-queue-master-locator",
    "x-quorum-initial-group-size",
    "x-delivery-limit",
    "x-queue-leader-locator",
    "x-max-age",
    "x-stream-max-segment-size-bytes",
    "x-initial-cluster-size",
    "x-delayed-retry-type",
    "x-delayed-retry-min",
    "x-delayed-retry-max",
    "x-consumer-timeout",
];

/// quorumq's vhost default queue type is `quorum`: a declare without
/// `x-queue-type` that is durable, non-exclusive and non-auto-delete gets
/// `x-queue-type=quorum` injected, exactly like RabbitMQ's
/// `augment_declare_args/5` with a vhost `default_queue_type` (spec §1.1
/// step 1). Otherwise the arguments are unchanged (RabbitMQ default classic).
/// Private argument quorumq stores beside an injected `x-queue-type: quorum`: the client
/// declared the queue without a type (RabbitMQ 3.10 would have made it classic), so
/// classic-only operations that quorum queues refuse (`queue.delete` if-empty / if-unused)
/// behave as on a classic queue. Never sent to clients; not compared by equivalence checks.
pub const UNTYPED_MARKER: &str = "x-quorumq-untyped";

/// True when a stored queue's arguments say it was declared as a quorum queue by the client
/// (`x-queue-type: quorum` given, not injected as the default).
pub fn declared_quorum(args: &FieldTable) -> bool {
    QueueType::of_args(args) == QueueType::Quorum && lookup(args, UNTYPED_MARKER).is_none()
}

pub fn augment_declare_args(
    args: &FieldTable,
    durable: bool,
    exclusive: bool,
    auto_delete: bool,
) -> FieldTable {
    let mut out = args.clone();
    if lookup(args, "x-queue-type").is_none() && durable && !exclusive && !auto_delete {
        out.insert(
            ShortString::from("x-queue-type"),
            AMQPValue::LongString(LongString::from("quorum")),
        );
        out.insert(ShortString::from(UNTYPED_MARKER), AMQPValue::Boolean(true));
    }
    out
}

/// Outcome of a validator: Ok or the Erlang error term as RabbitMQ prints it
/// with `~255p`.
type Check = Result<(), String>;

fn int_arg(v: &AMQPValue) -> Result<i128, String> {
    as_integer(v).ok_or_else(|| format!("\"expected integer, got {}\"", type_name(v)))
}

fn check_expiry(n: i128) -> Check {
    if n < 0 {
        Err(format!("{{value_negative,{n}}}"))
    } else if n > MAX_EXPIRY_MS {
        Err(format!("{{value_too_large,{n}}}"))
    } else {
        Ok(())
    }
}

fn non_neg_int(v: &AMQPValue) -> Result<i128, String> {
    let n = int_arg(v)?;
    if n < 0 {
        Err(format!("{{value_negative,{n}}}"))
    } else {
        Ok(n)
    }
}

fn unacceptable(v: &AMQPValue) -> String {
    format!("{{unacceptable_type,{}}}", type_name(v))
}

fn str_in(v: &AMQPValue, allowed: &[&str], bad: impl Fn(&str) -> String) -> Check {
    match v {
        AMQPValue::LongString(_) | AMQPValue::ShortString(_) => {
            let s = as_longstr(v).unwrap_or_default();
            if allowed.contains(&s.as_str()) {
                Ok(())
            } else {
                Err(bad(&s))
            }
        }
        other => Err(unacceptable(other)),
    }
}

/// Largest `x-max-priority` of a quorum queue (RabbitMQ 4.3; classic: 255).
pub const MAX_QUORUM_PRIORITY: i128 = 32;

fn check_arg(key: &str, v: &AMQPValue, args: &FieldTable, qtype: QueueType) -> Check {
    match key {
        "x-expires" => {
            let n = int_arg(v)?;
            if n == 0 {
                return Err("{value_zero,0}".to_owned());
            }
            check_expiry(n)
        }
        "x-message-ttl" => check_expiry(int_arg(v)?),
        "x-dead-letter-exchange" => match v {
            AMQPValue::LongString(_) | AMQPValue::ShortString(_) => Ok(()),
            other => Err(unacceptable(other)),
        },
        "x-dead-letter-routing-key" => match v {
            AMQPValue::LongString(_) | AMQPValue::ShortString(_) => {
                if lookup(args, "x-dead-letter-exchange").is_none() {
                    Err("routing_key_but_no_dlx_defined".to_owned())
                } else {
                    Ok(())
                }
            }
            other => Err(unacceptable(other)),
        },
        "x-dead-letter-strategy" => str_in(v, &["at-most-once", "at-least-once"], |_| {
            "invalid_dlx_strategy".to_owned()
        }),
        "x-max-length"
        | "x-max-length-bytes"
        | "x-max-in-memory-length"
        | "x-max-in-memory-bytes"
        | "x-stream-max-segment-size-bytes"
        | "x-consumer-timeout" => non_neg_int(v).map(|_| ()),
        "x-max-priority" => {
            let n = non_neg_int(v)?;
            let max = match qtype {
                QueueType::Quorum => MAX_QUORUM_PRIORITY,
                _ => 255,
            };
            if n > max {
                Err(format!("{{max_value_exceeded,{n}}}"))
            } else {
                Ok(())
            }
        }
        "x-overflow" => str_in(
            v,
            &["drop-head", "reject-publish", "reject-publish-dlx"],
            |_| "invalid_overflow".to_owned(),
        ),
        "x-queue-mode" => str_in(v, &["default", "lazy"], |s| {
            format!("\"unsupported queue mode '{s}'\"")
        }),
        "x-queue-version" => {
            let n = non_neg_int(v)?;
            if n == 1 || n == 2 {
                Ok(())
            } else {
                Err(format!("\"unsupported queue version '{n}'\""))
            }
        }
        "x-single-active-consumer" => match v {
            AMQPValue::Boolean(_) => Ok(()),
            other => Err(unacceptable(other)),
        },
        "x-quorum-initial-group-size" | "x-initial-cluster-size" => {
            if non_neg_int(v)? == 0 {
                Err("{value_zero,0}".to_owned())
            } else {
                Ok(())
            }
        }
        "x-max-age" => match v {
            AMQPValue::LongString(_) | AMQPValue::ShortString(_) => {
                if valid_max_age(&as_longstr(v).unwrap_or_default()) {
                    Ok(())
                } else {
                    Err("invalid_max_age".to_owned())
                }
            }
            other => Err(unacceptable(other)),
        },
        "x-queue-leader-locator" => str_in(
            v,
            &["client-local", "balanced", "random", "least-leaders"],
            |_| "invalid_queue_locator_arg".to_owned(),
        ),
        // RabbitMQ 4.3 does not validate these at declare (a bad value
        // leaves delayed retry disabled); quorumq refuses them with the
        // texts of 4.3's policy validator (rabbit_quorum_queue:validate_policy0/2).
        "x-delayed-retry-type" => str_in(v, &["all", "failed", "returned", "disabled"], |s| {
            format!("\"'{s}' is not a valid delayed retry type. Must be one of: all, failed, returned, disabled\"")
        }),
        "x-delayed-retry-min" => positive_delay(v, "minimum"),
        "x-delayed-retry-max" => {
            let max = positive_delay(v, "maximum").and_then(|()| int_arg(v))?;
            match lookup(args, "x-delayed-retry-min").and_then(as_integer) {
                Some(min) if min > 0 && max < min => Err(format!(
                    "\"delayed-retry-max ({max}) must not be smaller than delayed-retry-min ({min})\""
                )),
                _ => Ok(()),
            }
        }
        _ => Ok(()),
    }
}

/// `x-delayed-retry-min` / `-max`: an integer > 0 (ms).
fn positive_delay(v: &AMQPValue, what: &str) -> Check {
    let n = int_arg(v)?;
    if n > 0 {
        Ok(())
    } else {
        Err(format!(
            "\"{n} is not a valid delayed retry {what} delay. Must be a positive integer\""
        ))
    }
}

/// `rabbit_amqqueue:check_max_age/1`: positive integer followed by one of Y M D h m s.
pub(crate) fn valid_max_age(s: &str) -> bool {
    let digits: String = s.chars().take_while(|c| c.is_ascii_digit()).collect();
    let unit = &s[digits.len()..];
    matches!(digits.parse::<u128>(), Ok(n) if n > 0)
        && ["Y", "M", "D", "h", "m", "s"].contains(&unit)
}

/// Validator order of `rabbit_amqqueue:declare_args/0` (3.10.8).
const VALIDATOR_ORDER: &[&str] = &[
    "x-expires",
    "x-message-ttl",
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-dead-letter-strategy",
    "x-max-length",
    "x-max-length-bytes",
    "x-max-in-memory-length",
    "x-max-in-memory-bytes",
    "x-max-priority",
    "x-overflow",
    "x-queue-mode",
    "x-queue-version",
    "x-single-active-consumer",
    "x-queue-type",
    "x-quorum-initial-group-size",
    "x-max-age",
    "x-stream-max-segment-size-bytes",
    "x-initial-cluster-size",
    "x-queue-leader-locator",
    "x-delayed-retry-type",
    "x-delayed-retry-min",
    "x-delayed-retry-max",
    "x-consumer-timeout",
];

fn invalid_arg(key: &str, rs_text: &str, term: &str) -> AmqpError {
    AmqpError::precondition_failed(format!("invalid arg '{key}' for {rs_text}: {term}"))
}

/// The `x-dead-letter-exchange` type check rabbit_channel runs before the
/// argument validators (spec §1.1 step 5): `PRECONDITION_FAILED - invalid
/// type 'signedint' for arg 'x-dead-letter-exchange' in queue 'q' in vhost '/'`.
/// Same check for `alternate-exchange` on exchange.declare. 3.10.8 observed.
pub fn check_exchange_name_arg(
    args: &FieldTable,
    key: &str,
    rs_text: &str,
) -> Result<(), AmqpError> {
    match lookup(args, key) {
        None | Some(AMQPValue::LongString(_)) | Some(AMQPValue::ShortString(_)) => Ok(()),
        Some(v) => Err(AmqpError::precondition_failed(format!(
            "invalid type '{}' for arg '{key}' in {rs_text}",
            type_name(v)
        ))),
    }
}

/// `rabbit_amqqueue:check_declare_arguments/2` on the (augmented) declare
/// arguments of a new queue; returns the declared type. Order: `x-queue-type`
/// (`{unacceptable_type,T}` / `"unsupported queue type 'x'"`), then every
/// validator of the type in `declare_args()` order (`invalid arg 'k' for
/// queue 'q' in vhost '/': <term>`), then arguments of other types in table
/// order (`invalid arg 'k' for queue 'q' in vhost '/' of queue type
/// rabbit_quorum_queue`). Unknown `x-` arguments are accepted. `stream` is
/// refused as an unsupported type (quorumq has no streams).
pub fn check_declare_arguments(args: &FieldTable, rs_text: &str) -> Result<QueueType, AmqpError> {
    let qtype = match lookup(args, "x-queue-type") {
        None => QueueType::Classic,
        Some(v @ (AMQPValue::LongString(_) | AMQPValue::ShortString(_))) => {
            match as_longstr(v).unwrap_or_default().as_str() {
                "classic" => QueueType::Classic,
                "quorum" => QueueType::Quorum,
                other => {
                    return Err(invalid_arg(
                        "x-queue-type",
                        rs_text,
                        &format!("\"unsupported queue type '{other}'\""),
                    ))
                }
            }
        }
        Some(v) => return Err(invalid_arg("x-queue-type", rs_text, &unacceptable(v))),
    };
    let supported = qtype.queue_arguments();
    for key in VALIDATOR_ORDER.iter().filter(|k| supported.contains(k)) {
        if let Some(v) = lookup(args, key) {
            check_arg(key, v, args, qtype).map_err(|term| invalid_arg(key, rs_text, &term))?;
        }
    }
    for k in args.inner().keys() {
        let k = k.as_str();
        if ALL_KNOWN_ARGS.contains(&k) && !supported.contains(&k) {
            return Err(AmqpError::precondition_failed(format!(
                "invalid arg '{k}' for {rs_text} of queue type {}",
                qtype.module()
            )));
        }
    }
    Ok(qtype)
}

/// `rabbit_amqqueue:check_consume_arguments/2` on basic.consume's
/// arguments (3.10.8 `consume_args()`): `x-priority` must be an integer of
/// any AMQP integer type, `x-cancel-on-ha-failover` a boolean; otherwise 406
/// `PRECONDITION_FAILED - invalid arg 'x-priority' for queue 'q' in vhost
/// '/': "expected integer, got longstr"`. Returns the consumer priority
/// (0 when absent; a 64-bit value saturates to the i32 range).
pub fn check_consume_arguments(args: &FieldTable, rs_text: &str) -> Result<i32, AmqpError> {
    let priority = match lookup(args, "x-priority") {
        None => 0,
        Some(v) => {
            let n = int_arg(v).map_err(|term| invalid_arg("x-priority", rs_text, &term))?;
            n.clamp(i128::from(i32::MIN), i128::from(i32::MAX)) as i32
        }
    };
    match lookup(args, "x-cancel-on-ha-failover") {
        None | Some(AMQPValue::Boolean(_)) => Ok(priority),
        Some(v) => Err(invalid_arg(
            "x-cancel-on-ha-failover",
            rs_text,
            &unacceptable(v),
        )),
    }
}

/// Quorum queue property checks (`rabbit_queue_type_util`, spec §1.4), in
/// order auto-delete, exclusive, non-durable: `PRECONDITION_FAILED - invalid
/// property 'auto-delete' for queue 'q' in vhost '/'` etc. 3.10.8 observed.
pub fn check_quorum_properties(
    rs_text: &str,
    auto_delete: bool,
    exclusive: bool,
    durable: bool,
) -> Result<(), AmqpError> {
    let prop = if auto_delete {
        "auto-delete"
    } else if exclusive {
        "exclusive-owner"
    } else if !durable {
        "non-durable"
    } else {
        return Ok(());
    };
    Err(AmqpError::precondition_failed(format!(
        "invalid property '{prop}' for {rs_text}"
    )))
}

fn val_typed(v: Option<&AMQPValue>) -> String {
    match v {
        None => "none".to_owned(),
        Some(v) => format!("the value '{}' of type '{}'", erl_s_or_p(v), type_name(v)),
    }
}

/// `rabbit_misc:assert_args_equivalence/4`: for each key in `keys`, both
/// absent or identical → ok; both present with the same type class (all
/// integer types are one class) and `==` values → ok; `x-queue-type`
/// `classic` vs absent → ok; otherwise `PRECONDITION_FAILED - inequivalent
/// arg '<k>' for <rs>: received <new> but current is <old>`, values printed
/// bare (`'6'`) when both present, else `none` / `the value '5' of type
/// 'signedint'`. 3.10.8 observed.
pub fn assert_args_equivalence(
    orig: &FieldTable,
    new: &FieldTable,
    rs_text: &str,
    keys: &[&str],
) -> Result<(), AmqpError> {
    for key in keys {
        let (o, n) = (lookup(orig, key), lookup(new, key));
        let fail = |received: String, current: String| {
            AmqpError::precondition_failed(format!(
                "inequivalent arg '{key}' for {rs_text}: received {received} but current is {current}"
            ))
        };
        match (o, n) {
            (None, None) => {}
            (Some(o), Some(n)) => {
                // Identical, or same type class and `==` values, or the bare
                // values are identical Erlang terms (assert_field_equivalence's
                // first clause: longstr "a" vs binary "a", long 5 vs timestamp 5).
                let is_float =
                    |v: &AMQPValue| matches!(v, AMQPValue::Float(_) | AMQPValue::Double(_));
                let same = o == n
                    || (type_class(o) == type_class(n) && erl_eq(o, n))
                    || (erl_eq(o, n) && is_float(o) == is_float(n));
                if !same {
                    return Err(fail(
                        format!("'{}'", erl_s_or_p(n)),
                        format!("'{}'", erl_s_or_p(o)),
                    ));
                }
            }
            (o, n) => {
                let classic = |v: Option<&AMQPValue>| matches!(v, Some(AMQPValue::LongString(s)) if s.as_bytes() == b"classic");
                if *key == "x-queue-type" && (classic(o) || classic(n)) {
                    continue;
                }
                return Err(fail(val_typed(n), val_typed(o)));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::meta::test_helpers::{s, t};

    const RS: &str = "queue 'q' in vhost '/'";

    fn qq(extra: &[(&str, AMQPValue)]) -> FieldTable {
        let mut v = vec![("x-queue-type", s("quorum"))];
        v.extend_from_slice(extra);
        t(&v)
    }
    fn err(args: FieldTable) -> String {
        check_declare_arguments(&args, RS).unwrap_err().text
    }

    #[test]
    fn queue_type_texts() {
        assert_eq!(
            err(t(&[("x-queue-type", s("fake-queue-type"))])),
            "PRECONDITION_FAILED - invalid arg 'x-queue-type' for queue 'q' in vhost '/': \"unsupported queue type 'fake-queue-type'\""
        );
        assert_eq!(
            err(t(&[("x-queue-type", AMQPValue::LongInt(5))])),
            "PRECONDITION_FAILED - invalid arg 'x-queue-type' for queue 'q' in vhost '/': {unacceptable_type,signedint}"
        );
        assert!(
            err(t(&[("x-queue-type", s("stream"))])).contains("unsupported queue type 'stream'")
        );
    }

    #[test]
    fn value_texts() {
        let cases: Vec<(FieldTable, &str)> = vec![
            (qq(&[("x-max-length", AMQPValue::LongInt(-5))]), "invalid arg 'x-max-length' for queue 'q' in vhost '/': {value_negative,-5}"),
            (qq(&[("x-consumer-timeout", AMQPValue::LongInt(-5))]), "invalid arg 'x-consumer-timeout' for queue 'q' in vhost '/': {value_negative,-5}"),
            (qq(&[("x-max-length", s("5"))]), "invalid arg 'x-max-length' for queue 'q' in vhost '/': \"expected integer, got longstr\""),
            (qq(&[("x-expires", AMQPValue::LongInt(0))]), "invalid arg 'x-expires' for queue 'q' in vhost '/': {value_zero,0}"),
            (qq(&[("x-message-ttl", AMQPValue::LongLongInt(315_360_000_001))]), "invalid arg 'x-message-ttl' for queue 'q' in vhost '/': {value_too_large,315360000001}"),
            (qq(&[("x-message-ttl", AMQPValue::Double(1.5))]), "invalid arg 'x-message-ttl' for queue 'q' in vhost '/': \"expected integer, got double\""),
            (qq(&[("x-dead-letter-routing-key", s("a"))]), "invalid arg 'x-dead-letter-routing-key' for queue 'q' in vhost '/': routing_key_but_no_dlx_defined"),
            (qq(&[("x-dead-letter-exchange", s("x")), ("x-dead-letter-routing-key", AMQPValue::LongInt(5))]), "invalid arg 'x-dead-letter-routing-key' for queue 'q' in vhost '/': {unacceptable_type,signedint}"),
            (qq(&[("x-dead-letter-strategy", s("foo"))]), "invalid arg 'x-dead-letter-strategy' for queue 'q' in vhost '/': invalid_dlx_strategy"),
            (qq(&[("x-overflow", s("foo"))]), "invalid arg 'x-overflow' for queue 'q' in vhost '/': invalid_overflow"),
            (qq(&[("x-overflow", AMQPValue::LongInt(1))]), "invalid arg 'x-overflow' for queue 'q' in vhost '/': {unacceptable_type,signedint}"),
            (qq(&[("x-single-active-consumer", s("true"))]), "invalid arg 'x-single-active-consumer' for queue 'q' in vhost '/': {unacceptable_type,longstr}"),
            (qq(&[("x-quorum-initial-group-size", AMQPValue::LongInt(0))]), "invalid arg 'x-quorum-initial-group-size' for queue 'q' in vhost '/': {value_zero,0}"),
            (qq(&[("x-queue-leader-locator", s("foo"))]), "invalid arg 'x-queue-leader-locator' for queue 'q' in vhost '/': invalid_queue_locator_arg"),
            // Quorum queues take 1-32 (RabbitMQ 4.3; 3.10.8 refuses the argument).
            (qq(&[("x-max-priority", AMQPValue::LongInt(33))]), "invalid arg 'x-max-priority' for queue 'q' in vhost '/': {max_value_exceeded,33}"),
            (qq(&[("x-max-priority", AMQPValue::LongInt(-1))]), "invalid arg 'x-max-priority' for queue 'q' in vhost '/': {value_negative,-1}"),
            (qq(&[("x-queue-mode", s("lazy"))]), "invalid arg 'x-queue-mode' for queue 'q' in vhost '/' of queue type rabbit_quorum_queue"),
            (qq(&[("x-max-age", s("1D"))]), "invalid arg 'x-max-age' for queue 'q' in vhost '/' of queue type rabbit_quorum_queue"),
            (qq(&[("x-queue-master-locator", s("min-masters"))]), "invalid arg 'x-queue-master-locator' for queue 'q' in vhost '/' of queue type rabbit_quorum_queue"),
            // Value validators run before the refused-key check (observed).
            (qq(&[("x-queue-mode", s("lazy")), ("x-max-length", AMQPValue::LongInt(-1))]), "invalid arg 'x-max-length' for queue 'q' in vhost '/': {value_negative,-1}"),
            // Classic rules for classic queues.
            (t(&[("x-queue-type", s("classic")), ("x-delivery-limit", AMQPValue::LongInt(5))]), "invalid arg 'x-delivery-limit' for queue 'q' in vhost '/' of queue type rabbit_classic_queue"),
            (t(&[("x-delivery-limit", AMQPValue::LongInt(5))]), "invalid arg 'x-delivery-limit' for queue 'q' in vhost '/' of queue type rabbit_classic_queue"),
            (t(&[("x-max-priority", AMQPValue::LongInt(300))]), "invalid arg 'x-max-priority' for queue 'q' in vhost '/': {max_value_exceeded,300}"),
            (t(&[("x-queue-mode", s("foo"))]), "invalid arg 'x-queue-mode' for queue 'q' in vhost '/': \"unsupported queue mode 'foo'\""),
            (t(&[("x-queue-version", AMQPValue::LongInt(3))]), "invalid arg 'x-queue-version' for queue 'q' in vhost '/': \"unsupported queue version '3'\""),
        ];
        for (args, text) in cases {
            assert_eq!(err(args), format!("PRECONDITION_FAILED - {text}"));
        }
    }

    #[test]
    fn delayed_retry_texts() {
        let cases: Vec<(FieldTable, &str)> = vec![
            (qq(&[("x-delayed-retry-type", s("sometimes"))]), "invalid arg 'x-delayed-retry-type' for queue 'q' in vhost '/': \"'sometimes' is not a valid delayed retry type. Must be one of: all, failed, returned, disabled\""),
            (qq(&[("x-delayed-retry-type", AMQPValue::LongInt(1))]), "invalid arg 'x-delayed-retry-type' for queue 'q' in vhost '/': {unacceptable_type,signedint}"),
            (qq(&[("x-delayed-retry-min", AMQPValue::LongInt(0))]), "invalid arg 'x-delayed-retry-min' for queue 'q' in vhost '/': \"0 is not a valid delayed retry minimum delay. Must be a positive integer\""),
            (qq(&[("x-delayed-retry-min", s("5"))]), "invalid arg 'x-delayed-retry-min' for queue 'q' in vhost '/': \"expected integer, got longstr\""),
            (qq(&[("x-delayed-retry-max", AMQPValue::LongInt(-3))]), "invalid arg 'x-delayed-retry-max' for queue 'q' in vhost '/': \"-3 is not a valid delayed retry maximum delay. Must be a positive integer\""),
            (qq(&[("x-delayed-retry-min", AMQPValue::LongInt(200)), ("x-delayed-retry-max", AMQPValue::LongInt(100))]), "invalid arg 'x-delayed-retry-max' for queue 'q' in vhost '/': \"delayed-retry-max (100) must not be smaller than delayed-retry-min (200)\""),
            // Quorum queues only (4.3: not in rabbit_classic_queue's queue_arguments).
            (t(&[("x-queue-type", s("classic")), ("x-delayed-retry-type", s("all"))]), "invalid arg 'x-delayed-retry-type' for queue 'q' in vhost '/' of queue type rabbit_classic_queue"),
            (t(&[("x-delayed-retry-min", AMQPValue::LongInt(5))]), "invalid arg 'x-delayed-retry-min' for queue 'q' in vhost '/' of queue type rabbit_classic_queue"),
        ];
        for (args, text) in cases {
            assert_eq!(err(args), format!("PRECONDITION_FAILED - {text}"));
        }
        let ok = qq(&[
            ("x-delayed-retry-type", s("failed")),
            ("x-delayed-retry-min", AMQPValue::LongInt(200)),
            ("x-delayed-retry-max", AMQPValue::LongInt(200)),
        ]);
        assert_eq!(check_declare_arguments(&ok, RS).unwrap(), QueueType::Quorum);
    }

    #[test]
    fn accepted_arguments() {
        let ok = qq(&[
            ("x-foo", s("bar")),
            ("x-max-length", AMQPValue::ShortShortUInt(0)),
            ("x-delivery-limit", s("not validated")),
            ("x-overflow", s("reject-publish-dlx")),
            ("x-dead-letter-strategy", s("at-least-once")),
            ("x-single-active-consumer", AMQPValue::Boolean(true)),
        ]);
        assert_eq!(check_declare_arguments(&ok, RS).unwrap(), QueueType::Quorum);
        assert_eq!(
            check_declare_arguments(&t(&[("x-max-priority", AMQPValue::LongInt(5))]), RS).unwrap(),
            QueueType::Classic
        );
    }

    #[test]
    fn dlx_type_text() {
        let a = t(&[("x-dead-letter-exchange", AMQPValue::LongInt(5))]);
        assert_eq!(
            check_exchange_name_arg(&a, "x-dead-letter-exchange", RS).unwrap_err().text,
            "PRECONDITION_FAILED - invalid type 'signedint' for arg 'x-dead-letter-exchange' in queue 'q' in vhost '/'"
        );
    }

    #[test]
    fn property_texts() {
        let e = |ad, ex, du| check_quorum_properties(RS, ad, ex, du).unwrap_err().text;
        assert_eq!(
            e(true, true, false),
            "PRECONDITION_FAILED - invalid property 'auto-delete' for queue 'q' in vhost '/'"
        );
        assert_eq!(
            e(false, true, false),
            "PRECONDITION_FAILED - invalid property 'exclusive-owner' for queue 'q' in vhost '/'"
        );
        assert_eq!(
            e(false, false, false),
            "PRECONDITION_FAILED - invalid property 'non-durable' for queue 'q' in vhost '/'"
        );
        assert!(check_quorum_properties(RS, false, false, true).is_ok());
    }

    #[test]
    fn consume_arguments() {
        assert_eq!(check_consume_arguments(&t(&[]), RS).unwrap(), 0);
        for v in [
            AMQPValue::ShortShortInt(-3),
            AMQPValue::ShortInt(-3),
            AMQPValue::LongInt(-3),
            AMQPValue::LongLongInt(-3),
        ] {
            assert_eq!(
                check_consume_arguments(&t(&[("x-priority", v)]), RS).unwrap(),
                -3
            );
        }
        assert_eq!(
            check_consume_arguments(&t(&[("x-priority", AMQPValue::LongLongInt(1 << 40))]), RS)
                .unwrap(),
            i32::MAX
        );
        assert_eq!(
            check_consume_arguments(&t(&[("x-priority", s("10"))]), RS)
                .unwrap_err()
                .text,
            "PRECONDITION_FAILED - invalid arg 'x-priority' for queue 'q' in vhost '/': \"expected integer, got longstr\""
        );
        assert_eq!(
            check_consume_arguments(&t(&[("x-cancel-on-ha-failover", s("x"))]), RS)
                .unwrap_err()
                .text,
            "PRECONDITION_FAILED - invalid arg 'x-cancel-on-ha-failover' for queue 'q' in vhost '/': {unacceptable_type,longstr}"
        );
    }

    #[test]
    fn equivalence_rules() {
        let keys = QueueType::Quorum.queue_arguments();
        let cur = qq(&[("x-max-length", AMQPValue::LongInt(5)), ("x-foo", s("bar"))]);
        let eqv = |new: FieldTable| assert_args_equivalence(&cur, &new, RS, keys);
        // Integer types compare by value; unknown args are not compared.
        assert!(eqv(qq(&[
            ("x-max-length", AMQPValue::ShortShortInt(5)),
            ("x-foo", s("baz"))
        ]))
        .is_ok());
        assert!(eqv(qq(&[
            ("x-max-length", AMQPValue::LongLongInt(5)),
            ("x-queue-mode", s("lazy"))
        ]))
        .is_ok());
        let txt = |new| eqv(new).unwrap_err().text;
        assert_eq!(txt(qq(&[("x-max-length", AMQPValue::LongInt(6))])), "PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue 'q' in vhost '/': received '6' but current is '5'");
        assert_eq!(txt(qq(&[("x-max-length", s("5"))])), "PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue 'q' in vhost '/': received '5' but current is '5'");
        assert_eq!(txt(qq(&[])), "PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue 'q' in vhost '/': received none but current is the value '5' of type 'signedint'");
        assert_eq!(txt(qq(&[("x-max-length", AMQPValue::LongInt(5)), ("x-message-ttl", AMQPValue::LongInt(5))])), "PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue 'q' in vhost '/': received the value '5' of type 'signedint' but current is none");
        assert_eq!(txt(t(&[("x-queue-type", s("classic")), ("x-max-length", AMQPValue::LongInt(5))])), "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'q' in vhost '/': received 'classic' but current is 'quorum'");
        assert_eq!(txt(t(&[("x-max-length", AMQPValue::LongInt(5))])), "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'q' in vhost '/': received none but current is the value 'quorum' of type 'longstr'");
        // classic vs absent is equivalent.
        let classic = t(&[("x-queue-type", s("classic"))]);
        assert!(assert_args_equivalence(
            &classic,
            &FieldTable::default(),
            RS,
            QueueType::Classic.queue_arguments()
        )
        .is_ok());
        // Floats: float and double are one class.
        let f = t(&[("x-message-ttl", AMQPValue::Float(1.5))]);
        assert!(assert_args_equivalence(
            &f,
            &t(&[("x-message-ttl", AMQPValue::Double(1.5))]),
            RS,
            &["x-message-ttl"]
        )
        .is_ok());
    }

    #[test]
    fn augment_injects_quorum_only_when_compatible() {
        let a = augment_declare_args(&FieldTable::default(), true, false, false);
        assert_eq!(QueueType::of_args(&a), QueueType::Quorum);
        assert!(!declared_quorum(&a), "injected, not declared");
        let q = augment_declare_args(&t(&[("x-queue-type", s("quorum"))]), true, false, false);
        assert!(declared_quorum(&q));
        for (d, e, ad) in [
            (false, false, false),
            (true, true, false),
            (true, false, true),
        ] {
            assert!(lookup(
                &augment_declare_args(&FieldTable::default(), d, e, ad),
                "x-queue-type"
            )
            .is_none());
        }
        let c = augment_declare_args(&t(&[("x-queue-type", s("classic"))]), true, false, false);
        assert_eq!(QueueType::of_args(&c), QueueType::Classic);
    }
}
