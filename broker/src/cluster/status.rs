//! What operators see of the cluster: nodes, their liveness, and where each
//! queue's replicas and leader are (`quorumqctl cluster_status`,
//! `list_queues`).

/// One node of the cluster as seen from the node answering.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeStatus {
    /// Node id.
    pub id: u64,
    /// Cluster gRPC address (`host:port`).
    pub cluster_addr: String,
    /// AMQP address (`host:port`); empty while unknown (node never seen).
    pub amqp_addr: String,
    /// The node answers this node's failure detector (always true for itself).
    pub running: bool,
}

/// The cluster as seen from one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterStatus {
    /// Every node of the cluster (meta group voters and learners), by id.
    pub nodes: Vec<NodeStatus>,
    /// Leader of the meta group, if known.
    pub meta_leader: Option<u64>,
}

/// Placement and counts of one queue.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueStatus {
    /// Node id of the queue's Raft leader, if known.
    pub leader: Option<u64>,
    /// Node ids holding a replica (the group's voters), sorted.
    pub members: Vec<u64>,
    /// Members currently running (as the failure detector sees them), sorted.
    pub online: Vec<u64>,
    /// Ready messages (count).
    pub messages_ready: u64,
    /// Delivered, not yet acknowledged (count).
    pub messages_unacknowledged: u64,
    /// Attached consumers (count).
    pub consumers: u64,
    /// At-least-once dead letters held in the queue (count).
    pub dead_letter_held: u64,
    /// Message bodies the leader replica could not read back intact since it opened (count;
    /// each was logged; > 0 = the queue is unhealthy: those messages stay undelivered).
    pub unreadable_bodies: u64,
}
