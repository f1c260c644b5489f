//! Virtual host limits (`rabbitmqctl set_vhost_limits`, RabbitMQ 3.10.8
//! `rabbit_vhost_limit`): `max-connections` (client connections to the vhost,
//! cluster-wide) and `max-queues` (queues in the vhost). A negative value
//! means no limit; 0 refuses every new connection or queue. The definition is
//! replaced as a whole by each `set_vhost_limits`, as RabbitMQ stores it as one
//! runtime parameter.

use serde::{Deserialize, Serialize};

/// The limits of one vhost; `None` = not set (no limit).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VhostLimits {
    /// `max-connections` as given (negative = no limit).
    pub max_connections: Option<i64>,
    /// `max-queues` as given (negative = no limit).
    pub max_queues: Option<i64>,
}

impl VhostLimits {
    /// Parses a `set_vhost_limits` definition, a JSON object such as
    /// `{"max-connections": 256, "max-queues": 1024}`, validated as RabbitMQ
    /// 3.10.8 does (texts observed there, Erlang terms rendered as JSON).
    ///
    /// Errors: not a JSON object; a key other than `max-connections` /
    /// `max-queues` (`Unrecognised terms ["max-foo"] in limits`); a value that
    /// is not an integer (`max-queues should be a number, actually was "x"`).
    pub fn parse(definition: &str) -> Result<VhostLimits, String> {
        let v: serde_json::Value = serde_json::from_str(definition)
            .map_err(|e| format!("could not parse JSON document: {e}"))?;
        let obj = v
            .as_object()
            .ok_or_else(|| format!("limits must be a JSON object, actually was {v}"))?;
        let unknown: Vec<&String> = obj
            .keys()
            .filter(|k| !matches!(k.as_str(), "max-connections" | "max-queues"))
            .collect();
        if !unknown.is_empty() {
            let names: Vec<String> = unknown.iter().map(|k| format!("{k:?}")).collect();
            return Err(format!(
                "Unrecognised terms [{}] in limits",
                names.join(",")
            ));
        }
        let int = |key: &str| -> Result<Option<i64>, String> {
            match obj.get(key) {
                None => Ok(None),
                Some(x) => x
                    .as_i64()
                    .map(Some)
                    .ok_or_else(|| format!("{key} should be a number, actually was {x}")),
            }
        };
        Ok(VhostLimits {
            max_connections: int("max-connections")?,
            max_queues: int("max-queues")?,
        })
    }

    /// True when no limit is set (the vhost is listed without limits).
    pub fn is_empty(&self) -> bool {
        self.max_connections.is_none() && self.max_queues.is_none()
    }

    /// The connection limit in force: `None` when unset or negative.
    pub fn connection_limit(&self) -> Option<u64> {
        self.max_connections.and_then(|n| u64::try_from(n).ok())
    }

    /// The queue limit in force: `None` when unset or negative.
    pub fn queue_limit(&self) -> Option<u64> {
        self.max_queues.and_then(|n| u64::try_from(n).ok())
    }

    /// The definition as `rabbitmqctl list_vhost_limits` prints it:
    /// `{"max-connections":2,"max-queues":5}` (only the keys that are set).
    pub fn to_json(&self) -> String {
        let mut m = serde_json::Map::new();
        if let Some(n) = self.max_connections {
            m.insert("max-connections".into(), n.into());
        }
        if let Some(n) = self.max_queues {
            m.insert("max-queues".into(), n.into());
        }
        serde_json::Value::Object(m).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn definitions_parse_as_rabbitmq_validates_them() {
        let l = VhostLimits::parse(r#"{"max-connections": 2, "max-queues": -1}"#).unwrap();
        assert_eq!((l.max_connections, l.max_queues), (Some(2), Some(-1)));
        assert_eq!((l.connection_limit(), l.queue_limit()), (Some(2), None));
        assert_eq!(l.to_json(), r#"{"max-connections":2,"max-queues":-1}"#);
        let l = VhostLimits::parse(r#"{"max-queues": 0}"#).unwrap();
        assert_eq!((l.connection_limit(), l.queue_limit()), (None, Some(0)));
        assert_eq!(l.to_json(), r#"{"max-queues":0}"#);
        assert!(VhostLimits::parse("{}").unwrap().is_empty());
        assert_eq!(
            VhostLimits::parse(r#"{"max-foo": 5}"#).unwrap_err(),
            r#"Unrecognised terms ["max-foo"] in limits"#
        );
        assert_eq!(
            VhostLimits::parse(r#"{"max-queues": "x"}"#).unwrap_err(),
            r#"max-queues should be a number, actually was "x""#
        );
        assert!(VhostLimits::parse(r#"{"max-queues": 1.5}"#).is_err());
        assert!(VhostLimits::parse("[1]").is_err());
        assert!(VhostLimits::parse("nope").is_err());
    }
}
