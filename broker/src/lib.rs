//! quorumq: a RabbitMQ-compatible AMQP 0-9-1 broker whose queues are
//! Raft-replicated quorum queues (openraft on our own write-ahead log), with at-least-once
//! dead-lettering. See README.md for the design and ARCHITECTURE.md.

pub mod admin;
pub mod alarms;
pub mod amqp;
pub mod cluster;
pub mod config;
pub mod connections;
pub mod consumers;
pub mod dead_letter;
pub mod error;
pub mod http;
pub mod liveness;
pub mod message;
pub mod meta;
pub mod metrics;
pub mod node;
pub mod node_counters;
pub mod queue;
pub mod tls;
pub mod tracking;
pub mod transient_queues;
pub mod utc;

/// Milliseconds since the Unix epoch: the timestamp the proposer stamps
/// into commands (the state machine never reads a clock).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
