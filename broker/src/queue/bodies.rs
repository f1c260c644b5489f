//! Where message payloads live while the machine holds only their index:
//! a sled tree per quorum queue (`bodies/<group id>`), or memory for local
//! (non-replicated) queues. RabbitMQ keeps quorum-queue bodies in the Raft
//! log; openraft 0.9 can't retain single log entries, so the state machine
//! keeps them here instead (research §3.1 take-away).

use std::collections::HashMap;

use bytes::Bytes;

use super::types::MsgId;

/// Payload storage keyed by message id. Writes are not flushed here: the
/// Raft log (flushed before commit) is the durable copy until a snapshot.
pub trait BodyStore: Send + Sync + 'static {
    /// Stores the encoded message under `id`.
    fn put(&mut self, id: MsgId, payload: &Bytes);
    /// The payload of `id`, if stored.
    fn get(&self, id: MsgId) -> Option<Bytes>;
    /// Deletes the payload of `id` (no-op if absent).
    fn remove(&mut self, id: MsgId);
}

/// Bodies of a quorum queue in a sled tree, key = id big-endian.
pub struct SledBodies {
    tree: sled::Tree,
}

impl SledBodies {
    /// Opens (or creates) the body tree of queue group `group`.
    pub fn open(db: &sled::Db, group: u64) -> Result<Self, sled::Error> {
        Ok(SledBodies {
            tree: db.open_tree(tree_name(group))?,
        })
    }
}

/// Name of the body tree of a group.
pub fn tree_name(group: u64) -> String {
    format!("bodies/{group}")
}

impl BodyStore for SledBodies {
    fn put(&mut self, id: MsgId, payload: &Bytes) {
        if let Err(e) = self.tree.insert(id.to_be_bytes(), payload.as_ref()) {
            tracing::error!(error = %e, id, "body store write failed");
        }
    }

    fn get(&self, id: MsgId) -> Option<Bytes> {
        match self.tree.get(id.to_be_bytes()) {
            Ok(v) => v.map(|iv| Bytes::copy_from_slice(&iv)),
            Err(e) => {
                tracing::error!(error = %e, id, "body store read failed");
                None
            }
        }
    }

    fn remove(&mut self, id: MsgId) {
        if let Err(e) = self.tree.remove(id.to_be_bytes()) {
            tracing::error!(error = %e, id, "body store delete failed");
        }
    }
}

/// Bodies of a local (exclusive / auto-delete / non-durable) queue.
#[derive(Default)]
pub struct MemBodies {
    map: HashMap<MsgId, Bytes>,
}

impl BodyStore for MemBodies {
    fn put(&mut self, id: MsgId, payload: &Bytes) {
        self.map.insert(id, payload.clone());
    }

    fn get(&self, id: MsgId) -> Option<Bytes> {
        self.map.get(&id).cloned()
    }

    fn remove(&mut self, id: MsgId) {
        self.map.remove(&id);
    }
}
