//! The quorum-queue state machine: a pure, deterministic value with one entry
//! point, [`QueueMachine::apply`], modelled on RabbitMQ 3.10's `rabbit_fifo`
//! (ready/returns queues, consumers, limits, expiry) and `rabbit_fifo_dlx`
//! (the at-least-once dead-letter area). Reference: spec §2, §5, §6, §10.
//!
//! Files, one concept each:
//! - `types`: commands, replies, effects (the Raft log format, shared contract)
//! - `machine`: the state value, `apply` and dispatch
//! - `enqueue`, `dequeue`, `settlement`: the command handlers
//! - `remove`: an operator's removal of ready messages (redrive)
//! - `delivery`: handing ready messages to consumers
//! - `message`, `messages`: the compact message index and the ready queues
//! - `consumers`: consumer records, prefetch, round-robin
//! - `consumer_timeout`: consumer timeouts (RabbitMQ 4.3 `x-consumer-timeout`)
//! - `dead_letter`: the dead-letter handler and the held (at-least-once) area
//! - `dedup`: effectively-once enqueue of forwarded dead letters (per-source window)
//! - `limits`: max-length(-bytes), drop-head, reject-publish
//! - `expiry`: message TTL, queue TTL (x-expires), the leader's timer
//! - `delayed`: delayed retry (returns that wait before they are ready again)
//! - `queries`: read-only accessors for the broker
//! - `snapshot_format`: the snapshot's tagged on-disk form and its upgrades
//!
//! The impure shell: `registry` (the node's queues: open, follow
//! membership, reconcile, route, delete), `services` (what a queue's
//! runtime may ask of them), `runtime` (leader-only effects), `host`
//! (applies, carries out effects), `handle` (the queue reference channels
//! call), `proposer` (batch, dedupe, resend), `early` (replies handed to
//! local proposals as they apply), `error` (why a proposal failed).

pub mod bodies;
pub mod early;
pub mod error;
mod group_locks;
pub mod handle;
pub mod host;
mod proposer;
pub mod registry;
pub mod replica;
pub mod runtime;
pub mod services;
pub mod supervise;
pub mod types;

mod consumer_timeout;
mod consumers;
mod dead_letter;
pub mod dedup;
mod delayed;
mod delivery;
mod dequeue;
mod enqueue;
mod expiry;
mod limits;
mod machine;
mod message;
mod messages;
mod queries;
mod remove;
mod settlement;
mod snapshot_format;

#[cfg(test)]
mod tests;

pub use machine::QueueMachine;
pub use queries::{NodeConsumers, SeenNode};
pub use types::*;
