//! A queue's effective configuration: declare arguments merged with the
//! winning policy, as `rabbit_quorum_queue:init/1` and
//! `dead_letter_handler/2` do in 3.10.8 (spec §1.2 precedence, §5.1).

use amq_protocol::types::{AMQPValue, FieldTable};
use serde_json::Value;

use super::error::rs;
use super::queue_args::QueueType;
use super::value::{as_integer, as_longstr, lookup};
use crate::queue::types::{
    DeadLetterStrategy, DeadLetterTarget, DelayedRetry, DelayedRetryType, Overflow, QueueConfig,
};

/// Who wins when both the argument and the policy set a key.
#[derive(Clone, Copy)]
enum Resolve {
    /// Argument wins (dead-letter keys).
    Arg,
    /// Policy wins (overflow; expires in 3.10).
    Policy,
    /// The lower value wins (limits, TTL, delivery limit).
    Min,
}

/// A policy or argument value reduced to what the queue can use.
#[derive(Clone, Debug, PartialEq)]
enum V {
    Int(i128),
    Str(String),
}

fn from_arg(v: &AMQPValue) -> Option<V> {
    as_integer(v)
        .map(V::Int)
        .or_else(|| as_longstr(v).map(V::Str))
}

fn from_policy(v: &Value) -> Option<V> {
    if let Some(i) = v.as_i64() {
        return Some(V::Int(i128::from(i)));
    }
    if let Some(u) = v.as_u64() {
        return Some(V::Int(i128::from(u)));
    }
    v.as_str().map(|s| V::Str(s.to_owned()))
}

/// `rabbit_queue_type_util:args_policy_lookup/3`: `x-<key>` argument vs
/// `<key>` policy entry. For `Min`, values that are not integers are ignored
/// (in Erlang term order any number is below any binary, so an unvalidated
/// string argument such as `x-delivery-limit: "5"` never wins a min and, on
/// its own, never limits anything).
fn lookup_key(key: &str, resolve: Resolve, args: &FieldTable, policy: Option<&Value>) -> Option<V> {
    let a = lookup(args, &format!("x-{key}")).and_then(from_arg);
    let p = policy.and_then(|d| d.get(key)).and_then(from_policy);
    match resolve {
        Resolve::Arg => a.or(p),
        Resolve::Policy => p.or(a),
        Resolve::Min => {
            let ints = [a, p].into_iter().flatten().filter_map(|v| match v {
                V::Int(i) => Some(i),
                V::Str(_) => None,
            });
            ints.min().map(V::Int)
        }
    }
}

fn as_u64(v: Option<V>) -> Option<u64> {
    match v {
        Some(V::Int(i)) => u64::try_from(i).ok(),
        _ => None,
    }
}

fn as_string(v: Option<V>) -> Option<String> {
    match v {
        Some(V::Str(s)) => Some(s),
        _ => None,
    }
}

/// Computes the effective `QueueConfig` of queue `name` in `vhost` from its
/// stored arguments and the definition of the winning policy (if any).
/// Returns the config and the warnings RabbitMQ would log (3.10.8 texts).
///
/// Precedence (spec §1.2, 3.10.8 code): dead-letter-exchange,
/// dead-letter-routing-key, dead-letter-strategy: argument wins; overflow and
/// expires: policy wins; max-length, max-length-bytes, message-ttl,
/// delivery-limit, consumer-timeout (RabbitMQ 4.3): the lower wins.
/// `reject-publish-dlx` is kept (3.10.8 quorum queues map it to drop-head
/// with a warning; quorumq implements it, issue 28). Strategy (§5.1):
/// at-least-once only with a DLX and effective overflow reject-publish or
/// reject-publish-dlx; a DLRK or strategy without DLX disables
/// dead-lettering. Negative delivery limits count as unlimited (spec §6.1:
/// do not copy 3.10's literal negative limit), so a finite limit from the
/// other source wins.
pub fn effective_config(
    vhost: &str,
    name: &str,
    args: &FieldTable,
    policy: Option<&Value>,
) -> (QueueConfig, Vec<String>) {
    let qrs = rs("queue", name, vhost);
    let mut warnings = Vec::new();

    let overflow = match as_string(lookup_key("overflow", Resolve::Policy, args, policy)).as_deref()
    {
        Some("reject-publish") => Overflow::RejectPublish,
        Some("reject-publish-dlx") => Overflow::RejectPublishDlx,
        _ => Overflow::DropHead,
    };

    let dlx = as_string(lookup_key(
        "dead-letter-exchange",
        Resolve::Arg,
        args,
        policy,
    ));
    let dlrk = as_string(lookup_key(
        "dead-letter-routing-key",
        Resolve::Arg,
        args,
        policy,
    ));
    let strategy = as_string(lookup_key(
        "dead-letter-strategy",
        Resolve::Arg,
        args,
        policy,
    ));
    let (dead_letter, strategy) = match (dlx, dlrk, strategy) {
        (None, None, None) => (None, DeadLetterStrategy::AtMostOnce),
        (None, Some(rk), None) => {
            warnings.push(format!(
                "Disabling dead-lettering for {qrs} despite configured dead-letter-routing-key '{rk}' because dead-letter-exchange is not configured."
            ));
            (None, DeadLetterStrategy::AtMostOnce)
        }
        (None, _, Some(s)) => {
            warnings.push(format!(
                "Disabling dead-lettering for {qrs} despite configured dead-letter-strategy '{s}' because dead-letter-exchange is not configured."
            ));
            (None, DeadLetterStrategy::AtMostOnce)
        }
        (Some(exchange), routing_key, s) => {
            let target = Some(DeadLetterTarget {
                exchange,
                routing_key,
            });
            match (s.as_deref(), overflow) {
                (Some("at-least-once"), Overflow::RejectPublish | Overflow::RejectPublishDlx) => {
                    (target, DeadLetterStrategy::AtLeastOnce)
                }
                (Some("at-least-once"), Overflow::DropHead) => {
                    warnings.push(format!(
                        "Falling back to dead-letter-strategy at-most-once for {qrs} because configured dead-letter-strategy at-least-once is incompatible with effective overflow strategy drop-head. To enable dead-letter-strategy at-least-once, set overflow strategy to reject-publish."
                    ));
                    (target, DeadLetterStrategy::AtMostOnce)
                }
                _ => (target, DeadLetterStrategy::AtMostOnce),
            }
        }
    };

    // Delivery limit: negative = unlimited; min over the finite values.
    let dl_arg = lookup(args, "x-delivery-limit")
        .and_then(as_integer)
        .filter(|i| *i >= 0);
    let dl_pol = policy
        .and_then(|d| d.get("delivery-limit"))
        .and_then(|v| v.as_i64())
        .map(i128::from)
        .filter(|i| *i >= 0);
    let delivery_limit = [dl_arg, dl_pol]
        .into_iter()
        .flatten()
        .min()
        .and_then(|i| i64::try_from(i).ok());

    let config = QueueConfig {
        dead_letter,
        strategy,
        overflow,
        max_length: as_u64(lookup_key("max-length", Resolve::Min, args, policy)),
        max_length_bytes: as_u64(lookup_key("max-length-bytes", Resolve::Min, args, policy)),
        message_ttl_ms: as_u64(lookup_key("message-ttl", Resolve::Min, args, policy)),
        delivery_limit,
        expires_ms: as_u64(lookup_key("expires", Resolve::Policy, args, policy)),
        single_active_consumer: matches!(
            lookup(args, "x-single-active-consumer"),
            Some(AMQPValue::Boolean(true))
        ),
        // `x-max-priority` is an argument only (no policy key), validated at
        // declare (quorum 1-32, classic 1-255); 0 = no priorities.
        max_priority: lookup(args, "x-max-priority")
            .and_then(as_integer)
            .and_then(|n| u8::try_from(n).ok())
            .filter(|n| *n > 0),
        delayed_retry: delayed_retry(args, policy),
        consumer_timeout_ms: as_u64(lookup_key("consumer-timeout", Resolve::Min, args, policy)),
    };

    (config, warnings)
}

/// Delayed retry (RabbitMQ 4.3 `get_delayed_retry_config/1`): the type
/// (`delayed-retry-type`), min and max (ms, > 0) each from the argument, else
/// the policy (quorumq: argument wins for all three, as for the dead-letter
/// keys; 4.3 lets the policy win the type and takes the lower min and max).
/// A type other than `disabled` needs a min; max defaults to min. Quorum
/// queues only: a classic-declared queue ignores it (4.3 classic queues
/// have no delayed retry), even from a policy.
fn delayed_retry(args: &FieldTable, policy: Option<&Value>) -> DelayedRetry {
    if QueueType::of_args(args) != QueueType::Quorum {
        return DelayedRetry::default();
    }
    let kind =
        match as_string(lookup_key("delayed-retry-type", Resolve::Arg, args, policy)).as_deref() {
            Some("all") => DelayedRetryType::All,
            Some("failed") => DelayedRetryType::Failed,
            Some("returned") => DelayedRetryType::Returned,
            _ => return DelayedRetry::default(),
        };
    let positive = |key| as_u64(lookup_key(key, Resolve::Arg, args, policy)).filter(|v| *v > 0);
    let Some(min_ms) = positive("delayed-retry-min") else {
        return DelayedRetry::default();
    };
    DelayedRetry {
        kind,
        min_ms,
        max_ms: positive("delayed-retry-max").unwrap_or(min_ms),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::test_helpers::{s, t};
    use serde_json::json;

    #[test]
    fn defaults() {
        let (c, w) = effective_config("/", "q", &FieldTable::default(), None);
        assert_eq!(c, QueueConfig::default());
        assert!(w.is_empty());
    }

    #[test]
    fn consumer_timeout_the_smaller_of_argument_and_policy() {
        let arg = |ms: i32| t(&[("x-consumer-timeout", AMQPValue::LongInt(ms))]);
        let pol = |ms: u64| json!({ "consumer-timeout": ms });
        let ct = |args: &FieldTable, p: Option<&Value>| {
            effective_config("/", "q", args, p).0.consumer_timeout_ms
        };
        assert_eq!(ct(&FieldTable::default(), None), None);
        assert_eq!(ct(&arg(1000), None), Some(1000));
        assert_eq!(ct(&FieldTable::default(), Some(&pol(2000))), Some(2000));
        assert_eq!(ct(&arg(1000), Some(&pol(60_000))), Some(1000));
        assert_eq!(ct(&arg(60_000), Some(&pol(1000))), Some(1000));
    }

    #[test]
    fn precedence() {
        let args = t(&[
            ("x-dead-letter-exchange", s("arg-dlx")),
            ("x-max-length", AMQPValue::LongInt(10)),
            ("x-max-length-bytes", AMQPValue::LongInt(100)),
            ("x-message-ttl", AMQPValue::LongInt(5000)),
            ("x-overflow", s("drop-head")),
            ("x-expires", AMQPValue::LongInt(100_000)),
            ("x-delivery-limit", AMQPValue::LongInt(3)),
        ]);
        let pol = json!({
            "dead-letter-exchange": "pol-dlx",
            "dead-letter-routing-key": "pol-rk",
            "max-length": 7,
            "max-length-bytes": 1000,
            "message-ttl": 1000,
            "overflow": "reject-publish",
            "expires": 5_000_000,
            "delivery-limit": 9
        });
        let (c, w) = effective_config("/", "q", &args, Some(&pol));
        assert!(w.is_empty());
        // A for DLX; the policy DLRK combines with the argument DLX.
        assert_eq!(
            c.dead_letter,
            Some(DeadLetterTarget {
                exchange: "arg-dlx".into(),
                routing_key: Some("pol-rk".into())
            })
        );
        assert_eq!(c.max_length, Some(7));
        assert_eq!(c.max_length_bytes, Some(100));
        assert_eq!(c.message_ttl_ms, Some(1000));
        assert_eq!(
            c.overflow,
            Overflow::RejectPublish,
            "policy wins for overflow"
        );
        assert_eq!(
            c.expires_ms,
            Some(5_000_000),
            "policy wins for expires in 3.10"
        );
        assert_eq!(c.delivery_limit, Some(3));
    }

    #[test]
    fn strategy_resolution() {
        let alo = |overflow: &str| {
            t(&[
                ("x-dead-letter-exchange", s("dlx")),
                ("x-dead-letter-strategy", s("at-least-once")),
                ("x-overflow", s(overflow)),
            ])
        };
        let (c, w) = effective_config("/", "q", &alo("reject-publish"), None);
        assert_eq!(c.strategy, DeadLetterStrategy::AtLeastOnce);
        assert!(w.is_empty());
        let (c, w) = effective_config("/", "q", &alo("drop-head"), None);
        assert_eq!(c.strategy, DeadLetterStrategy::AtMostOnce);
        assert!(c.dead_letter.is_some());
        assert_eq!(w, vec!["Falling back to dead-letter-strategy at-most-once for queue 'q' in vhost '/' because configured dead-letter-strategy at-least-once is incompatible with effective overflow strategy drop-head. To enable dead-letter-strategy at-least-once, set overflow strategy to reject-publish.".to_owned()]);
        // reject-publish-dlx is kept and allows at-least-once.
        let (c, w) = effective_config("/", "q", &alo("reject-publish-dlx"), None);
        assert_eq!(
            (c.strategy, c.overflow),
            (DeadLetterStrategy::AtLeastOnce, Overflow::RejectPublishDlx)
        );
        assert!(w.is_empty());
        // Policy overflow overrides the argument and enables at-least-once.
        let (c, _) = effective_config(
            "/",
            "q",
            &alo("drop-head"),
            Some(&json!({"overflow": "reject-publish"})),
        );
        assert_eq!(c.strategy, DeadLetterStrategy::AtLeastOnce);
    }

    #[test]
    fn dlrk_or_strategy_without_dlx_disables() {
        let (c, w) = effective_config(
            "/",
            "q",
            &FieldTable::default(),
            Some(&json!({"dead-letter-routing-key": "rk"})),
        );
        assert_eq!(c.dead_letter, None);
        assert_eq!(w, vec!["Disabling dead-lettering for queue 'q' in vhost '/' despite configured dead-letter-routing-key 'rk' because dead-letter-exchange is not configured.".to_owned()]);
        let (c, w) = effective_config(
            "/",
            "q",
            &t(&[("x-dead-letter-strategy", s("at-least-once"))]),
            None,
        );
        assert_eq!(c.dead_letter, None);
        assert_eq!(w, vec!["Disabling dead-lettering for queue 'q' in vhost '/' despite configured dead-letter-strategy 'at-least-once' because dead-letter-exchange is not configured.".to_owned()]);
        // Empty DLX = default exchange: enabled.
        let (c, _) = effective_config("/", "q", &t(&[("x-dead-letter-exchange", s(""))]), None);
        assert_eq!(
            c.dead_letter,
            Some(DeadLetterTarget {
                exchange: String::new(),
                routing_key: None
            })
        );
    }

    #[test]
    fn delayed_retry_resolution() {
        let qq = |extra: &[(&str, AMQPValue)]| {
            let mut v = vec![("x-queue-type", s("quorum"))];
            v.extend_from_slice(extra);
            t(&v)
        };
        let dr = |args: FieldTable, pol: Option<Value>| {
            effective_config("/", "q", &args, pol.as_ref())
                .0
                .delayed_retry
        };
        let int = AMQPValue::LongInt;
        assert_eq!(
            dr(
                qq(&[
                    ("x-delayed-retry-type", s("failed")),
                    ("x-delayed-retry-min", int(200)),
                    ("x-delayed-retry-max", int(1000))
                ]),
                None
            ),
            DelayedRetry {
                kind: DelayedRetryType::Failed,
                min_ms: 200,
                max_ms: 1000
            }
        );
        // Max defaults to min; no min = disabled.
        assert_eq!(
            dr(
                qq(&[
                    ("x-delayed-retry-type", s("all")),
                    ("x-delayed-retry-min", int(50))
                ]),
                None
            ),
            DelayedRetry {
                kind: DelayedRetryType::All,
                min_ms: 50,
                max_ms: 50
            }
        );
        assert_eq!(
            dr(qq(&[("x-delayed-retry-type", s("all"))]), None),
            DelayedRetry::default()
        );
        // Argument wins over the policy, key by key.
        let pol = json!({"delayed-retry-type": "returned", "delayed-retry-min": 10, "delayed-retry-max": 20});
        assert_eq!(
            dr(
                qq(&[("x-delayed-retry-type", s("failed"))]),
                Some(pol.clone())
            ),
            DelayedRetry {
                kind: DelayedRetryType::Failed,
                min_ms: 10,
                max_ms: 20
            }
        );
        assert_eq!(
            dr(qq(&[("x-delayed-retry-min", int(15))]), Some(pol.clone())),
            DelayedRetry {
                kind: DelayedRetryType::Returned,
                min_ms: 15,
                max_ms: 20
            }
        );
        assert_eq!(
            dr(
                qq(&[("x-delayed-retry-type", s("disabled"))]),
                Some(pol.clone())
            ),
            DelayedRetry::default()
        );
        // Classic-declared queues ignore a delayed-retry policy.
        assert_eq!(
            dr(t(&[("x-queue-type", s("classic"))]), Some(pol)),
            DelayedRetry::default()
        );
    }

    #[test]
    fn delivery_limit_edge_cases() {
        let dl = |arg: Option<AMQPValue>, pol: Option<i64>| {
            let args = arg
                .map(|a| t(&[("x-delivery-limit", a)]))
                .unwrap_or_default();
            let p = pol.map(|p| json!({ "delivery-limit": p }));
            effective_config("/", "q", &args, p.as_ref())
                .0
                .delivery_limit
        };
        assert_eq!(dl(Some(AMQPValue::LongInt(-1)), None), None);
        assert_eq!(dl(Some(AMQPValue::LongInt(-1)), Some(5)), Some(5));
        assert_eq!(
            dl(Some(s("5")), None),
            None,
            "non-integer argument = unlimited"
        );
        assert_eq!(dl(Some(s("5")), Some(8)), Some(8));
        assert_eq!(dl(Some(AMQPValue::ShortShortUInt(0)), Some(8)), Some(0));
    }
}
