//! Why a proposal to a queue failed: the error every reply sender of a
//! queue carries (the proposer, the state machine's early replies, the
//! queue reference).

/// Why a proposal failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum QueueError {
    /// The queue's group is shut down (queue deleted or node stopping).
    #[error("queue is unavailable")]
    Unavailable,
    /// Raft refused or lost the write (e.g. no leader reachable in time).
    #[error("raft write failed: {0}")]
    Raft(String),
}
