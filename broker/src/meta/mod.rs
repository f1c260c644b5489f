//! The topology model the meta Raft group replicates: vhosts, exchanges,
//! queue records, bindings, policies. Pure and deterministic: no I/O, no
//! clock, no randomness. Behaviour follows RabbitMQ 3.10.8 (spec
//! `rabbitmq-quorum-queues-and-dlx.md` §1, §3.1-3.2, §5.1, §10), error texts
//! checked against a running 3.10.8 where the docstrings say "observed".

pub mod access;
pub mod command;
pub mod effective;
pub mod error;
pub mod exchange;
pub mod host;
pub mod limits;
pub mod policy;
pub mod publish;
pub mod queue;
pub mod queue_args;
pub mod replica_counts;
pub mod routing;
pub mod topology;
pub mod value;

#[cfg(test)]
mod test_helpers;
#[cfg(test)]
mod topology_tests;

pub use error::AmqpError;
pub use exchange::{ExchangeKind, ExchangeRecord};
pub use limits::VhostLimits;
pub use policy::Policy;
pub use publish::{cc_bcc_keys, parse_expiration, strip_bcc};
pub use queue::{Binding, QueueDeclare, QueueDeclared, QueueKind, QueueRecord};
pub use queue_args::QueueType;
pub use topology::Topology;
