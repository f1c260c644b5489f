//! AMQP errors as RabbitMQ sends them (reply code + full reply text).

use serde::{Deserialize, Serialize};

/// An AMQP error as RabbitMQ sends it: reply code and the full reply text,
/// e.g. `(406, "PRECONDITION_FAILED - inequivalent arg 'durable' for queue
/// 'q' in vhost '/': received 'false' but current is 'true'")`.
/// `hard` = connection-level error (connection.close: 503 COMMAND_INVALID,
/// 530 NOT_ALLOWED, ...), otherwise channel-level (channel.close).
/// Source: RabbitMQ 3.10.8 `rabbit_misc:protocol_error/3` (observed texts).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{code} {text}")]
pub struct AmqpError {
    /// AMQP reply code (403, 404, 405, 406, 503, 530, ...).
    pub code: u16,
    /// Full reply text including the `NAME - ` prefix.
    pub text: String,
    /// True for connection-level errors.
    pub hard: bool,
}

impl AmqpError {
    fn new(code: u16, name: &str, detail: impl AsRef<str>, hard: bool) -> Self {
        AmqpError {
            code,
            text: format!("{name} - {}", detail.as_ref()),
            hard,
        }
    }

    /// 406 PRECONDITION_FAILED (channel).
    pub fn precondition_failed(detail: impl AsRef<str>) -> Self {
        Self::new(406, "PRECONDITION_FAILED", detail, false)
    }

    /// 404 NOT_FOUND (channel).
    pub fn not_found(detail: impl AsRef<str>) -> Self {
        Self::new(404, "NOT_FOUND", detail, false)
    }

    /// 403 ACCESS_REFUSED (channel).
    pub fn access_refused(detail: impl AsRef<str>) -> Self {
        Self::new(403, "ACCESS_REFUSED", detail, false)
    }

    /// 405 RESOURCE_LOCKED (channel).
    pub fn resource_locked(detail: impl AsRef<str>) -> Self {
        Self::new(405, "RESOURCE_LOCKED", detail, false)
    }

    /// 503 COMMAND_INVALID (connection).
    pub fn command_invalid(detail: impl AsRef<str>) -> Self {
        Self::new(503, "COMMAND_INVALID", detail, true)
    }

    /// 530 NOT_ALLOWED (connection).
    pub fn not_allowed(detail: impl AsRef<str>) -> Self {
        Self::new(530, "NOT_ALLOWED", detail, true)
    }

    /// Policy validation failure. RabbitMQ reports these through rabbitmqctl /
    /// the HTTP API (400), not AMQP; we use code 406 and the text rabbitmqctl
    /// prints: `Validation failed\n\n<detail>\n` (RabbitMQ 3.10.8 observed detail
    /// texts, e.g. `-1 is not a valid maximum length`). No `NAME - ` prefix.
    pub fn policy_invalid(detail: impl AsRef<str>) -> Self {
        AmqpError {
            code: 406,
            text: format!("Validation failed\n\n{}\n", detail.as_ref()),
            hard: false,
        }
    }
}

/// `rabbit_misc:rs/1`: `<kind> '<name>' in vhost '<vhost>'`.
pub(crate) fn rs(kind: &str, name: &str, vhost: &str) -> String {
    format!("{kind} '{name}' in vhost '{vhost}'")
}
