//! What operators see of the cluster: nodes, their liveness, and where each
//! queue's replicas and leader are (`quorumqctl cluster_status`,
//! `list_queues`).

use std::collections::BTreeMap;

use super::detector::Detector;
use super::peers::Peers;
use super::types::Raft;

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
    /// Delayed-retry messages waiting to be ready again (count; RabbitMQ 4.3
    /// `messages_delayed`; not part of `messages_ready`).
    pub messages_delayed: u64,
}

/// The cluster as this node sees it (nodes, liveness, meta leader).
///
/// `peers`: the addresses known here; `meta_raft`: the meta group (its
/// membership and leader); `detector`: liveness and AMQP addresses.
pub fn cluster_status(peers: &Peers, meta_raft: &Raft, detector: &Detector) -> ClusterStatus {
    // The meta group's members (a forgotten node is not one), with the
    // addresses known here; every known address while the membership
    // is not known yet.
    let known: BTreeMap<u64, String> = peers.all().into_iter().collect();
    let metrics = meta_raft.metrics().borrow().clone();
    let mut ids: BTreeMap<u64, String> = metrics
        .membership_config
        .membership()
        .nodes()
        .map(|(id, _)| (*id, known.get(id).cloned().unwrap_or_default()))
        .collect();
    if ids.is_empty() {
        ids = known;
    }
    ClusterStatus {
        nodes: ids
            .into_iter()
            .map(|(id, addr)| NodeStatus {
                id,
                cluster_addr: addr,
                amqp_addr: detector.amqp_addr_of(id).unwrap_or_default(),
                running: detector.is_alive(id),
            })
            .collect(),
        meta_leader: metrics.current_leader,
    }
}
