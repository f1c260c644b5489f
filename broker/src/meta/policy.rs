//! User policies: validation (RabbitMQ 3.10.8 `rabbit_policies`,
//! `rabbit_policy`), matching and precedence. Operator policies are not
//! modelled.

use std::cmp::Ordering;

use regex::Regex;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use super::error::AmqpError;
use super::queue_args::{valid_max_age, QueueType};

/// A user policy (`rabbitmqctl set_policy`). `definition` is a JSON object of
/// policy keys (spec §1.2); `pattern` is a regex searched (unanchored) in the
/// queue/exchange name; `apply_to` is `queues`, `exchanges` or `all`; the
/// highest `priority` among matching policies wins.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Policy {
    pub vhost: String,
    pub name: String,
    pub pattern: String,
    /// JSON object. Stored as JSON text in binary encodings (serde_json's
    /// `Value` needs a self-describing format to deserialize).
    #[serde(with = "json_text")]
    pub definition: Value,
    pub priority: i32,
    pub apply_to: String,
}

mod json_text {
    use super::*;

    pub fn serialize<S: Serializer>(v: &Value, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&v.to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Value, D::Error> {
        let text = String::deserialize(d)?;
        serde_json::from_str(&text).map_err(serde::de::Error::custom)
    }
}

/// A validated policy with its compiled pattern. Serializes as the policy
/// alone; the regex is recompiled on deserialize.
#[derive(Debug, Clone)]
pub(crate) struct StoredPolicy {
    pub policy: Policy,
    pub regex: Regex,
}

impl Serialize for StoredPolicy {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.policy.serialize(s)
    }
}

impl<'de> Deserialize<'de> for StoredPolicy {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let policy = Policy::deserialize(d)?;
        let regex = Regex::new(&policy.pattern).map_err(serde::de::Error::custom)?;
        Ok(StoredPolicy { policy, regex })
    }
}

/// Erlang `~p` of a decoded JSON term (strings are binaries).
fn erl_json(v: &Value) -> String {
    match v {
        Value::Null => "null".to_owned(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => i.to_string(),
            (_, Some(u), _) => u.to_string(),
            (_, _, Some(f)) => super::value::erl_float(f),
            _ => n.to_string(),
        },
        Value::String(s) => super::value::erl_binary(s.as_bytes()),
        Value::Array(a) => format!("[{}]", a.iter().map(erl_json).collect::<Vec<_>>().join(",")),
        Value::Object(o) => format!(
            "#{{{}}}",
            o.iter()
                .map(|(k, v)| format!(
                    "{} => {}",
                    super::value::erl_binary(k.as_bytes()),
                    erl_json(v)
                ))
                .collect::<Vec<_>>()
                .join(",")
        ),
    }
}

fn int_at_least(v: &Value, min: i64) -> bool {
    v.as_i64().map(|i| i >= min).unwrap_or(false) || (min <= 0 && v.as_u64().is_some())
}

fn str_in(v: &Value, allowed: &[&str]) -> bool {
    v.as_str().map(|s| allowed.contains(&s)).unwrap_or(false)
}

/// One key's validation (`rabbit_policies:validate_policy0/2`, 3.10.8).
/// Ok(true) = known and valid, Ok(false) = not a known policy key,
/// Err = the detail text RabbitMQ gives (observed e.g. `-1 is not a valid
/// maximum length`).
fn validate_key(key: &str, v: &Value) -> Result<bool, String> {
    // RabbitMQ 4.3 delayed retry (rabbit_quorum_queue:validate_policy0/2 texts).
    let positive = |what: &str| {
        if v.as_u64().is_some_and(|u| u > 0) {
            Ok(true)
        } else {
            Err(format!(
                "{} is not a valid delayed retry {what} delay. Must be a positive integer",
                erl_json(v)
            ))
        }
    };
    match key {
        "delayed-retry-type" if str_in(v, &["all", "failed", "returned", "disabled"]) => {
            return Ok(true)
        }
        "delayed-retry-type" => {
            return Err(format!(
            "{} is not a valid delayed retry type. Must be one of: all, failed, returned, disabled",
            erl_json(v)
        ))
        }
        "delayed-retry-min" => return positive("minimum"),
        "delayed-retry-max" => return positive("maximum"),
        _ => {}
    }
    // (value is valid, what RabbitMQ calls it in the error text)
    let (valid, what) = match key {
        "alternate-exchange" => (v.is_string(), "alternate exchange name"),
        "dead-letter-exchange" => (v.is_string(), "dead letter exchange name"),
        "dead-letter-routing-key" => (v.is_string(), "dead letter routing key"),
        "dead-letter-strategy" => (
            str_in(v, &["at-most-once", "at-least-once"]),
            "dead letter strategy",
        ),
        "message-ttl" => (int_at_least(v, 0), "message TTL"),
        "expires" => (int_at_least(v, 1), "queue expiry"),
        "max-length" => (int_at_least(v, 0), "maximum length"),
        "max-length-bytes" => (int_at_least(v, 0), "maximum length in bytes"),
        "max-in-memory-length" | "max-in-memory-bytes" => {
            (int_at_least(v, 0), "maximum memory in bytes")
        }
        "queue-mode" => (str_in(v, &["default", "lazy"]), "queue-mode value"),
        "queue-version" => (matches!(v.as_i64(), Some(1 | 2)), "queue-version value"),
        "overflow" => (
            str_in(v, &["drop-head", "reject-publish", "reject-publish-dlx"]),
            "overflow value",
        ),
        // 3.10.8 requires >= 0 (4.x accepts any integer).
        "delivery-limit" => (int_at_least(v, 0), "delivery limit"),
        // RabbitMQ 3.12+ / 4.3: consumer timeout in ms.
        "consumer-timeout" => (int_at_least(v, 0), "consumer timeout"),
        "max-age" => (v.as_str().map(valid_max_age).unwrap_or(false), "max age"),
        "queue-leader-locator" => (
            str_in(v, &["client-local", "balanced", "random", "least-leaders"]),
            "queue leader locator value",
        ),
        "initial-cluster-size" => (int_at_least(v, 0), "cluster size"),
        "stream-max-segment-size-bytes" => (
            int_at_least(v, 0) && v.as_i64().map(|i| i <= 3_000_000_000).unwrap_or(false),
            "segment size",
        ),
        // Classic-mirroring and master-locator keys: accepted without deep
        // validation (they make a policy inapplicable to quorum queues anyway).
        "ha-mode"
        | "ha-params"
        | "ha-sync-mode"
        | "ha-sync-batch-size"
        | "ha-promote-on-shutdown"
        | "ha-promote-on-failure"
        | "queue-master-locator" => (true, ""),
        _ => return Ok(false),
    };
    if valid {
        Ok(true)
    } else {
        Err(format!("{} is not a valid {what}", erl_json(v)))
    }
}

/// The delayed-retry keys together (RabbitMQ 4.3
/// `validate_delayed_retry_constraints/1`): a type other than `disabled`
/// needs `delayed-retry-min`; max must not be below min.
fn validate_delayed_retry(obj: &serde_json::Map<String, Value>) -> Result<(), String> {
    let ty = obj.get("delayed-retry-type").and_then(Value::as_str);
    let min = obj.get("delayed-retry-min").and_then(Value::as_u64);
    let max = obj.get("delayed-retry-max").and_then(Value::as_u64);
    match (ty, min, max) {
        (Some(t), None, _) if t != "disabled" => Err(format!(
            "delayed-retry-min is required when delayed-retry-type is {t}"
        )),
        (_, Some(min), Some(max)) if max < min => Err(format!(
            "delayed-retry-max ({max}) must not be smaller than delayed-retry-min ({min})"
        )),
        _ => Ok(()),
    }
}

/// Validates a policy as `rabbitmqctl set_policy` does (3.10.8): apply-to,
/// pattern, then the definition (non-empty object; each known key's value;
/// then unknown keys). Returns the compiled pattern. Errors are
/// `AmqpError::policy_invalid` with RabbitMQ's detail text, e.g.
/// `apply-to 'foo' unrecognised; should be 'queues', 'exchanges' or 'all'`,
/// `no policy provided`, `[{<<"foo">>,1}] are not recognised policy settings`.
pub(crate) fn validate(p: &Policy) -> Result<Regex, AmqpError> {
    if !["queues", "exchanges", "all"].contains(&p.apply_to.as_str()) {
        return Err(AmqpError::policy_invalid(format!(
            "apply-to '{}' unrecognised; should be 'queues', 'exchanges' or 'all'",
            p.apply_to
        )));
    }
    let regex = Regex::new(&p.pattern).map_err(|e| {
        AmqpError::policy_invalid(format!(
            "pattern should be regular expression but is invalid: {e}"
        ))
    })?;
    let obj = match &p.definition {
        Value::Object(o) => o,
        other => {
            return Err(AmqpError::policy_invalid(format!(
                "definition must be a dictionary: {}",
                erl_json(other)
            )))
        }
    };
    if obj.is_empty() {
        return Err(AmqpError::policy_invalid("no policy provided"));
    }
    let mut unknown = Vec::new();
    for (k, v) in obj {
        match validate_key(k, v) {
            Ok(true) => {}
            Ok(false) => unknown.push(format!(
                "{{{},{}}}",
                super::value::erl_binary(k.as_bytes()),
                erl_json(v)
            )),
            Err(detail) => return Err(AmqpError::policy_invalid(detail)),
        }
    }
    if !unknown.is_empty() {
        return Err(AmqpError::policy_invalid(format!(
            "[{}] are not recognised policy settings",
            unknown.join(",")
        )));
    }
    validate_delayed_retry(obj).map_err(AmqpError::policy_invalid)?;
    Ok(regex)
}

/// What a policy is matched against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// A queue of the given declared type (for `is_policy_applicable`).
    Queue(QueueType),
    Exchange,
}

impl StoredPolicy {
    /// `rabbit_policy:matches/2`: apply-to fits, the policy has no key the
    /// queue type lists as unsupported, and the pattern matches the name.
    pub(crate) fn matches(&self, target: Target, name: &str) -> bool {
        let p = &self.policy;
        let type_ok = match target {
            Target::Queue(_) => p.apply_to == "queues" || p.apply_to == "all",
            Target::Exchange => p.apply_to == "exchanges" || p.apply_to == "all",
        };
        let applicable = match (target, &p.definition) {
            (Target::Queue(t), Value::Object(o)) => o
                .keys()
                .all(|k| !t.unsupported_policies().contains(&k.as_str())),
            _ => true,
        };
        type_ok && applicable && self.regex.is_match(name)
    }
}

/// Precedence among matching policies: highest priority; ties (undefined
/// order in RabbitMQ) go to the name that sorts last, which is what a 3.10.8
/// node picked in our one observation (`lo2` over `lo`).
fn better(a: &Policy, b: &Policy) -> Ordering {
    a.priority
        .cmp(&b.priority)
        .then_with(|| a.name.cmp(&b.name))
}

/// The winning policy for `name` among `policies` (`rabbit_policy:match/2`).
pub(crate) fn select<'a>(
    policies: impl Iterator<Item = &'a StoredPolicy>,
    target: Target,
    name: &str,
) -> Option<&'a Policy> {
    policies
        .filter(|p| p.matches(target, name))
        .map(|p| &p.policy)
        .max_by(|a, b| better(a, b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pol(name: &str, pattern: &str, def: Value, priority: i32, apply_to: &str) -> Policy {
        Policy {
            vhost: "/".into(),
            name: name.into(),
            pattern: pattern.into(),
            definition: def,
            priority,
            apply_to: apply_to.into(),
        }
    }

    fn detail(p: Policy) -> String {
        validate(&p).unwrap_err().text
    }

    #[test]
    fn validation_texts() {
        let f = |def: Value| detail(pol("p", "^a", def, 0, "queues"));
        assert_eq!(
            f(json!({"max-length": -1})),
            "Validation failed\n\n-1 is not a valid maximum length\n"
        );
        assert_eq!(
            f(json!({"foo": 1})),
            "Validation failed\n\n[{<<\"foo\">>,1}] are not recognised policy settings\n"
        );
        assert_eq!(
            f(json!({"dead-letter-exchange": 5})),
            "Validation failed\n\n5 is not a valid dead letter exchange name\n"
        );
        assert_eq!(
            f(json!({"delivery-limit": -1})),
            "Validation failed\n\n-1 is not a valid delivery limit\n"
        );
        assert_eq!(
            f(json!({"consumer-timeout": -1})),
            "Validation failed\n\n-1 is not a valid consumer timeout\n"
        );
        assert_eq!(
            f(json!({"overflow": "x"})),
            "Validation failed\n\n<<\"x\">> is not a valid overflow value\n"
        );
        assert_eq!(
            f(json!({"expires": 0})),
            "Validation failed\n\n0 is not a valid queue expiry\n"
        );
        assert_eq!(f(json!({})), "Validation failed\n\nno policy provided\n");
        // RabbitMQ 4.3 delayed retry (rabbit_quorum_queue texts).
        assert_eq!(
            f(json!({"delayed-retry-type": "x"})),
            "Validation failed\n\n<<\"x\">> is not a valid delayed retry type. Must be one of: all, failed, returned, disabled\n"
        );
        assert_eq!(
            f(json!({"delayed-retry-min": 0})),
            "Validation failed\n\n0 is not a valid delayed retry minimum delay. Must be a positive integer\n"
        );
        assert_eq!(
            f(json!({"delayed-retry-max": "5"})),
            "Validation failed\n\n<<\"5\">> is not a valid delayed retry maximum delay. Must be a positive integer\n"
        );
        assert_eq!(
            f(json!({"delayed-retry-type": "failed"})),
            "Validation failed\n\ndelayed-retry-min is required when delayed-retry-type is failed\n"
        );
        assert_eq!(
            f(json!({"delayed-retry-type": "all", "delayed-retry-min": 300, "delayed-retry-max": 200})),
            "Validation failed\n\ndelayed-retry-max (200) must not be smaller than delayed-retry-min (300)\n"
        );
        assert!(validate(&pol(
            "p",
            "a",
            json!({"delayed-retry-type": "returned", "delayed-retry-min": 50}),
            0,
            "queues"
        ))
        .is_ok());
        assert_eq!(
            f(json!({"max-length": 1.5})),
            "Validation failed\n\n1.5 is not a valid maximum length\n"
        );
        assert_eq!(
            f(json!({"max-length": 5, "bar": 1, "baz": 2})),
            "Validation failed\n\n[{<<\"bar\">>,1},{<<\"baz\">>,2}] are not recognised policy settings\n"
        );
        assert_eq!(
            detail(pol("p", "a", json!({"max-length": 1}), 0, "foo")),
            "Validation failed\n\napply-to 'foo' unrecognised; should be 'queues', 'exchanges' or 'all'\n"
        );
        assert!(detail(pol("p", "(", json!({"max-length": 1}), 0, "all"))
            .contains("pattern should be regular expression"));
        assert!(validate(&pol(
            "p",
            "^dlx\\.",
            json!({"dead-letter-exchange": "", "overflow": "reject-publish"}),
            0,
            "all"
        ))
        .is_ok());
    }

    fn stored(p: Policy) -> StoredPolicy {
        let regex = validate(&p).unwrap();
        StoredPolicy { policy: p, regex }
    }

    #[test]
    fn precedence_and_applicability() {
        let ps = [
            stored(pol(
                "hi",
                "^p_",
                json!({"max-length": 5, "queue-mode": "lazy"}),
                10,
                "queues",
            )),
            stored(pol("lo", "^p_", json!({"max-length": 7}), 1, "queues")),
            stored(pol("lo2", "^p_", json!({"max-length": 3}), 1, "queues")),
            stored(pol(
                "ex",
                "^p_",
                json!({"alternate-exchange": "ae"}),
                99,
                "exchanges",
            )),
        ];
        // queue-mode makes "hi" inapplicable to a quorum queue (3.10.8 observed).
        let q = select(ps.iter(), Target::Queue(QueueType::Quorum), "p_a").unwrap();
        assert_eq!(q.name, "lo2");
        // ...but it applies to a classic queue.
        assert_eq!(
            select(ps.iter(), Target::Queue(QueueType::Classic), "p_a")
                .unwrap()
                .name,
            "hi"
        );
        assert_eq!(
            select(ps.iter(), Target::Exchange, "p_x").unwrap().name,
            "ex"
        );
        assert!(select(ps.iter(), Target::Queue(QueueType::Quorum), "zz").is_none());
        // `^` anchors; otherwise the search is unanchored, like re:run.
        assert!(select(ps.iter(), Target::Exchange, "a_p_x").is_none());
        let un = [stored(pol(
            "un",
            "p_x",
            json!({"alternate-exchange": "ae"}),
            0,
            "all",
        ))];
        assert_eq!(
            select(un.iter(), Target::Exchange, "a_p_x_b").unwrap().name,
            "un"
        );
    }
}
