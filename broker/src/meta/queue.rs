//! Queue and binding records, and the queue.declare request.

use amq_protocol::types::FieldTable;
use serde::{Deserialize, Serialize};

/// Where a queue lives. Durable, non-exclusive, non-auto-delete queues are
/// quorum queues (one Raft group each). Exclusive, auto-delete or
/// non-durable queues are not replicated: they live on the node of the
/// connection that declared them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum QueueKind {
    Quorum,
    Local { node: u64 },
}

/// A queue as stored in the topology.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueueRecord {
    pub vhost: String,
    pub name: String,
    /// As RabbitMQ stores it: `durable && !exclusive` (rabbit_channel).
    pub durable: bool,
    /// Connection id that owns an exclusive queue.
    pub exclusive_owner: Option<u64>,
    pub auto_delete: bool,
    /// Declare arguments as stored (with `x-queue-type` = `quorum` injected
    /// when the declare had none and is quorum-compatible: quorumq's vhost
    /// default queue type is quorum, spec §1.1 step 1, §10.15).
    pub arguments: FieldTable,
    pub kind: QueueKind,
    /// Raft group id of the queue (fresh, never reused, >= 1; 0 is the meta
    /// group). Local queues get one too, as a unique queue id.
    pub group_id: u64,
    /// Nodes holding a replica of a quorum queue (its group's voters), the
    /// preferred leader first; the declaring node for a local queue.
    pub members: Vec<u64>,
}

/// A queue.declare as received (after the caller replaced an empty name by a
/// server-generated `amq.gen-…` one, see `Topology::check_server_named`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueueDeclare {
    pub vhost: String,
    pub name: String,
    pub passive: bool,
    pub durable: bool,
    pub exclusive: bool,
    pub auto_delete: bool,
    pub arguments: FieldTable,
    /// Node of the declaring connection (placement of Local queues).
    pub node: u64,
    /// Declaring connection id (exclusive ownership).
    pub connection: u64,
    /// The broker generated the name (`amq.gen-…`), so the reserved
    /// `amq.` prefix is allowed.
    #[serde(default)]
    pub server_named: bool,
    /// Replica placement chosen by the declaring node for a new quorum
    /// queue (`x-quorum-initial-group-size` nodes, preferred leader first).
    /// Empty = the declaring node alone.
    pub members: Vec<u64>,
}

/// Outcome of `Topology::check_queue_declare`.
#[derive(Debug, Clone, PartialEq)]
pub enum QueueDeclared {
    /// Equivalent redeclare or passive hit: the stored record.
    Existing(QueueRecord),
    /// New queue: apply it with `Topology::add_queue`.
    Create(QueueRecord),
}

/// A queue binding: messages published to `exchange` that match
/// `routing_key`/`arguments` go to `queue`. Identity is all four fields, as
/// in RabbitMQ.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Binding {
    pub exchange: String,
    /// Destination name: a queue, or an exchange when `to_exchange`.
    pub queue: String,
    pub routing_key: String,
    pub arguments: FieldTable,
    /// Exchange-to-exchange binding (exchange.bind, a RabbitMQ extension).
    #[serde(default)]
    pub to_exchange: bool,
}
