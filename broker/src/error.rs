//! Errors opening a node and its Raft groups (storage, Raft, configuration).

/// Errors starting a node.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("storage: {0}")]
    Store(#[from] raft_log::StoreError),
    #[error("sled: {0}")]
    Sled(#[from] sled::Error),
    #[error("raft: {0}")]
    Raft(String),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error("config: {0}")]
    Config(String),
}
