//! Where message payloads live while the machine holds only their index.
//! RabbitMQ keeps quorum-queue bodies in the Raft log; openraft 0.9 cannot
//! retain single log entries, so the queue host keeps them here.
//!
//! [`TieredBodies`] (quorum queues) keeps recent bodies in memory — while
//! the Raft log still holds them durably — and moves them to a sled tree
//! (`bodies/<group id>`) only when memory passes a budget or when a snapshot
//! is about to let the log be purged. A message published and acked between
//! two snapshots never touches the tree. [`MemBodies`] serves local
//! (non-replicated) queues.

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;

use super::types::MsgId;

/// In-memory body budget per quorum queue (bytes) before spilling to disk.
pub const MEMORY_BUDGET: usize = 32 * 1024 * 1024;

/// Payload storage keyed by message id.
pub trait BodyStore: Send + Sync + 'static {
    /// Stores the encoded message under `id`.
    fn put(&mut self, id: MsgId, payload: &Bytes);
    /// The payload of `id`, if stored.
    fn get(&self, id: MsgId) -> Option<Bytes>;
    /// Deletes the payload of `id` (no-op if absent).
    fn remove(&mut self, id: MsgId);
    /// Makes every stored body independent of the Raft log (called before
    /// a snapshot; the snapshot save flushes the database afterwards).
    fn persist_all(&mut self);
}

/// Bodies of a quorum queue: memory first, sled tree (key = id big-endian)
/// for spilled ones.
pub struct TieredBodies {
    tree: sled::Tree,
    mem: BTreeMap<MsgId, Bytes>,
    mem_bytes: usize,
    budget: usize,
    /// Highest id ever written to the tree: ids above it are never there.
    tree_high: Option<MsgId>,
}

impl TieredBodies {
    /// Opens (or creates) the body tree of queue group `group`.
    pub fn open(db: &sled::Db, group: u64, budget: usize) -> Result<Self, sled::Error> {
        let tree = db.open_tree(tree_name(group))?;
        let tree_high = tree
            .last()?
            .and_then(|(k, _)| <[u8; 8]>::try_from(k.as_ref()).ok())
            .map(u64::from_be_bytes);
        Ok(TieredBodies {
            tree,
            mem: BTreeMap::new(),
            mem_bytes: 0,
            budget,
            tree_high,
        })
    }

    fn maybe_in_tree(&self, id: MsgId) -> bool {
        self.tree_high.is_some_and(|h| id <= h)
    }

    /// Moves the oldest in-memory bodies to the tree until `keep` bytes remain.
    fn spill(&mut self, keep: usize) {
        if self.mem.is_empty() || self.mem_bytes <= keep {
            return;
        }
        let mut batch = sled::Batch::default();
        while self.mem_bytes > keep {
            let Some((id, payload)) = self.mem.pop_first() else {
                break;
            };
            self.mem_bytes -= payload.len();
            batch.insert(&id.to_be_bytes(), payload.as_ref());
            self.tree_high = Some(self.tree_high.map_or(id, |h| h.max(id)));
        }
        if let Err(e) = self.tree.apply_batch(batch) {
            tracing::error!(error = %e, "body store spill failed");
        }
    }
}

/// Name of the body tree of a group.
pub fn tree_name(group: u64) -> String {
    format!("bodies/{group}")
}

impl BodyStore for TieredBodies {
    fn put(&mut self, id: MsgId, payload: &Bytes) {
        // Replay after a restart re-stores bodies that may already be on disk.
        if self.maybe_in_tree(id) && self.tree.contains_key(id.to_be_bytes()).unwrap_or(false) {
            return;
        }
        self.mem_bytes += payload.len();
        if let Some(old) = self.mem.insert(id, payload.clone()) {
            self.mem_bytes -= old.len();
        }
        if self.mem_bytes > self.budget {
            self.spill(self.budget / 2);
        }
    }

    fn get(&self, id: MsgId) -> Option<Bytes> {
        if let Some(b) = self.mem.get(&id) {
            return Some(b.clone());
        }
        if !self.maybe_in_tree(id) {
            return None;
        }
        match self.tree.get(id.to_be_bytes()) {
            Ok(v) => v.map(|iv| Bytes::copy_from_slice(&iv)),
            Err(e) => {
                tracing::error!(error = %e, id, "body store read failed");
                None
            }
        }
    }

    fn remove(&mut self, id: MsgId) {
        if let Some(old) = self.mem.remove(&id) {
            self.mem_bytes -= old.len();
            return;
        }
        if self.maybe_in_tree(id) {
            if let Err(e) = self.tree.remove(id.to_be_bytes()) {
                tracing::error!(error = %e, id, "body store delete failed");
            }
        }
    }

    fn persist_all(&mut self) {
        tracing::debug!(
            bodies = self.mem.len(),
            bytes = self.mem_bytes,
            "persisting bodies for a snapshot"
        );
        self.spill(0);
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

    fn persist_all(&mut self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    fn db() -> (tempfile::TempDir, sled::Db) {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = sled::Config::new().path(dir.path()).open().expect("open");
        (dir, db)
    }

    #[test]
    fn spills_past_budget_and_reads_back() {
        let (_d, db) = db();
        let mut b = TieredBodies::open(&db, 7, 10).expect("open");
        for id in 0..5u64 {
            b.put(id, &Bytes::from(vec![id as u8; 4]));
        }
        assert!(b.mem_bytes <= 10, "kept within budget");
        for id in 0..5u64 {
            assert_eq!(b.get(id), Some(Bytes::from(vec![id as u8; 4])));
        }
        b.remove(0);
        b.remove(4);
        assert_eq!(b.get(0), None);
        assert_eq!(b.get(4), None);
        assert_eq!(b.tree.len() + b.mem.len(), 3);
    }

    #[test]
    fn persist_all_survives_reopen_and_replay_does_not_duplicate() {
        let (_d, db) = db();
        {
            let mut b = TieredBodies::open(&db, 1, 1 << 20).expect("open");
            b.put(1, &Bytes::from_static(b"one"));
            b.put(2, &Bytes::from_static(b"two"));
            b.persist_all();
            b.put(3, &Bytes::from_static(b"three"));
        }
        let mut b = TieredBodies::open(&db, 1, 1 << 20).expect("reopen");
        assert_eq!(b.get(1), Some(Bytes::from_static(b"one")));
        assert_eq!(b.get(3), None, "unpersisted bodies come back by log replay");
        // Replay stores 2 again: it stays on disk only, and one remove clears it.
        b.put(2, &Bytes::from_static(b"two"));
        assert!(b.mem.is_empty());
        b.remove(2);
        assert_eq!(b.get(2), None);
    }
}
