//! AMQP errors as the connection sends them: a channel.close or a
//! connection.close carrying RabbitMQ's reply code and text.

use crate::meta::error::AmqpError;

/// An error raised while handling a frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProtocolError {
    /// Closes the channel (soft error, e.g. 404, 406, 403, 405).
    Channel { code: u16, text: String },
    /// Closes the connection (hard error, e.g. 501, 503, 504, 505, 530).
    Connection { code: u16, text: String },
}

impl ProtocolError {
    /// Channel-level error with RabbitMQ's `NAME - detail` text.
    pub fn channel(code: u16, text: impl Into<String>) -> Self {
        ProtocolError::Channel {
            code,
            text: text.into(),
        }
    }

    /// Connection-level error.
    pub fn connection(code: u16, text: impl Into<String>) -> Self {
        ProtocolError::Connection {
            code,
            text: text.into(),
        }
    }

    /// 406 PRECONDITION_FAILED.
    pub fn precondition(detail: impl std::fmt::Display) -> Self {
        Self::channel(406, format!("PRECONDITION_FAILED - {detail}"))
    }

    /// 404 NOT_FOUND.
    pub fn not_found(detail: impl std::fmt::Display) -> Self {
        Self::channel(404, format!("NOT_FOUND - {detail}"))
    }

    /// 541 INTERNAL_ERROR (connection).
    pub fn internal(detail: impl std::fmt::Display) -> Self {
        Self::connection(541, format!("INTERNAL_ERROR - {detail}"))
    }

    /// 503 COMMAND_INVALID (connection).
    pub fn command_invalid(detail: impl std::fmt::Display) -> Self {
        Self::connection(503, format!("COMMAND_INVALID - {detail}"))
    }

    /// 505 UNEXPECTED_FRAME (connection).
    pub fn unexpected_frame(detail: impl std::fmt::Display) -> Self {
        Self::connection(505, format!("UNEXPECTED_FRAME - {detail}"))
    }

    /// 540 NOT_IMPLEMENTED (connection, as RabbitMQ).
    pub fn not_implemented(detail: impl std::fmt::Display) -> Self {
        Self::connection(540, format!("NOT_IMPLEMENTED - {detail}"))
    }
}

impl From<AmqpError> for ProtocolError {
    fn from(e: AmqpError) -> Self {
        if e.hard {
            ProtocolError::Connection {
                code: e.code,
                text: e.text,
            }
        } else {
            ProtocolError::Channel {
                code: e.code,
                text: e.text,
            }
        }
    }
}
