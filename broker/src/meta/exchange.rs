//! Exchange records, exchange types, the predeclared set, and exchange
//! redeclare equivalence (RabbitMQ 3.10.8 `rabbit_exchange`,
//! `rabbit_channel` exchange.declare; texts observed on 3.10.8).

use amq_protocol::types::FieldTable;
use serde::{Deserialize, Serialize};

use super::error::{rs, AmqpError};
use super::queue_args::assert_args_equivalence;

/// The four built-in exchange types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExchangeKind {
    Direct,
    Fanout,
    Topic,
    Headers,
}

/// Type names that are existing atoms in a 3.10.8 node but no registered
/// exchange type: RabbitMQ answers `invalid exchange type` for them and
/// `unknown exchange type` for anything else (`rabbit_exchange:check_type/1`
/// uses `list_to_existing_atom`). Every entry observed on 3.10.8.
const EXISTING_ATOMS: &[&str] = &[
    "",
    "foo",
    "bar",
    "test",
    "hello",
    "true",
    "false",
    "undefined",
    "ok",
    "error",
    "all",
    "any",
    "none",
    "queue",
    "exchange",
    "binary",
    "list",
    "atom",
    "integer",
    "float",
    "long",
    "short",
    "void",
    "bool",
    "table",
    "array",
    "default",
    "local",
    "global",
    "name",
    "type",
    "value",
    "key",
    "node",
    "classic",
    "quorum",
    "stream",
    "longstr",
    "signedint",
    "x",
    "a",
    "b",
];

impl ExchangeKind {
    /// Parses an exchange.declare `type`. Unknown → 503 COMMAND_INVALID (hard),
    /// `unknown exchange type 'zz'` or `invalid exchange type 'foo'` (see
    /// `EXISTING_ATOMS`). RabbitMQ 3.10.8 observed.
    pub fn parse(kind: &str) -> Result<Self, AmqpError> {
        match kind {
            "direct" => Ok(ExchangeKind::Direct),
            "fanout" => Ok(ExchangeKind::Fanout),
            "topic" => Ok(ExchangeKind::Topic),
            "headers" => Ok(ExchangeKind::Headers),
            other if EXISTING_ATOMS.contains(&other) => Err(AmqpError::command_invalid(format!(
                "invalid exchange type '{other}'"
            ))),
            other => Err(AmqpError::command_invalid(format!(
                "unknown exchange type '{other}'"
            ))),
        }
    }

    /// The type name as RabbitMQ prints it.
    pub fn as_str(self) -> &'static str {
        match self {
            ExchangeKind::Direct => "direct",
            ExchangeKind::Fanout => "fanout",
            ExchangeKind::Topic => "topic",
            ExchangeKind::Headers => "headers",
        }
    }
}

/// One exchange of a vhost. `""` is the default exchange (direct, routes by
/// queue name; no explicit bindings allowed).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExchangeRecord {
    pub name: String,
    pub kind: ExchangeKind,
    pub durable: bool,
    /// Deleted when its last binding is removed (RabbitMQ `maybe_auto_delete`).
    pub auto_delete: bool,
    /// Clients cannot publish to it (403).
    pub internal: bool,
    /// Declare arguments; only `alternate-exchange` is interpreted.
    pub arguments: FieldTable,
}

/// The exchanges every vhost starts with (RabbitMQ 3.10.8
/// `rabbit_vhost:add`): `""`, `amq.direct`, `amq.fanout`, `amq.headers`,
/// `amq.match` (headers), `amq.topic`, and the internal `amq.rabbitmq.trace`
/// (topic). All durable.
pub fn predeclared() -> Vec<ExchangeRecord> {
    let mk = |name: &str, kind, internal| ExchangeRecord {
        name: name.to_owned(),
        kind,
        durable: true,
        auto_delete: false,
        internal,
        arguments: FieldTable::default(),
    };
    vec![
        mk("", ExchangeKind::Direct, false),
        mk("amq.direct", ExchangeKind::Direct, false),
        mk("amq.fanout", ExchangeKind::Fanout, false),
        mk("amq.headers", ExchangeKind::Headers, false),
        mk("amq.match", ExchangeKind::Headers, false),
        mk("amq.topic", ExchangeKind::Topic, false),
        mk("amq.rabbitmq.trace", ExchangeKind::Topic, true),
    ]
}

/// `inequivalent arg '<key>' for <rs>: received '<new>' but current is '<old>'`
/// for the bare (non-table) fields (`rabbit_misc:assert_field_equivalence`).
pub(crate) fn field_inequivalent(key: &str, rs_text: &str, new: &str, old: &str) -> AmqpError {
    AmqpError::precondition_failed(format!(
        "inequivalent arg '{key}' for {rs_text}: received '{new}' but current is '{old}'"
    ))
}

impl ExchangeRecord {
    /// Redeclare equivalence (`rabbit_exchange:assert_equivalence/6`): type,
    /// durable, auto_delete, internal, then the `alternate-exchange` argument.
    /// RabbitMQ 3.10.8 observed texts, e.g. `PRECONDITION_FAILED - inequivalent
    /// arg 'type' for exchange 'x' in vhost '/': received 'fanout' but current is 'direct'`.
    pub fn assert_equivalence(
        &self,
        vhost: &str,
        kind: ExchangeKind,
        durable: bool,
        auto_delete: bool,
        internal: bool,
        arguments: &FieldTable,
    ) -> Result<(), AmqpError> {
        let r = rs("exchange", &self.name, vhost);
        if self.kind != kind {
            return Err(field_inequivalent(
                "type",
                &r,
                kind.as_str(),
                self.kind.as_str(),
            ));
        }
        if self.durable != durable {
            return Err(field_inequivalent(
                "durable",
                &r,
                &durable.to_string(),
                &self.durable.to_string(),
            ));
        }
        if self.auto_delete != auto_delete {
            return Err(field_inequivalent(
                "auto_delete",
                &r,
                &auto_delete.to_string(),
                &self.auto_delete.to_string(),
            ));
        }
        if self.internal != internal {
            return Err(field_inequivalent(
                "internal",
                &r,
                &internal.to_string(),
                &self.internal.to_string(),
            ));
        }
        assert_args_equivalence(&self.arguments, arguments, &r, &["alternate-exchange"])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_and_invalid_types() {
        let e = ExchangeKind::parse("zzqqx-nonexist").unwrap_err();
        assert_eq!((e.code, e.hard), (503, true));
        assert_eq!(
            e.text,
            "COMMAND_INVALID - unknown exchange type 'zzqqx-nonexist'"
        );
        assert_eq!(
            ExchangeKind::parse("foo").unwrap_err().text,
            "COMMAND_INVALID - invalid exchange type 'foo'"
        );
        assert_eq!(
            ExchangeKind::parse("").unwrap_err().text,
            "COMMAND_INVALID - invalid exchange type ''"
        );
        assert_eq!(
            ExchangeKind::parse("headers").unwrap(),
            ExchangeKind::Headers
        );
    }
}
