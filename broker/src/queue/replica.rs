//! A quorum queue's local replica as the transport sees it
//! ([`GroupReplica`]): its Raft handle, its counts, and the message bodies
//! a snapshot of it carries to another node.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use super::host::QueueHost;
use crate::cluster::groups::GroupReplica;
use crate::cluster::status::QueueStatus;
use crate::cluster::types::Raft;
use crate::queue::types::ConsumerId;

/// The replica of one queue group on this node.
pub struct QueueReplica {
    /// The group's Raft handle.
    pub raft: Raft,
    /// The state machine and body store.
    pub host: Arc<Mutex<QueueHost>>,
    /// A replica seeded as a member of a new group: its wait for the seed to
    /// be durable before it answers (and, leading, sends) anything.
    pub seed_sync: Option<Arc<crate::cluster::bootstrap::SeedSync>>,
}

impl GroupReplica for QueueReplica {
    fn raft(&self) -> &Raft {
        &self.raft
    }

    fn seed_sync(&self) -> Option<&crate::cluster::bootstrap::SeedSync> {
        self.seed_sync.as_deref()
    }

    fn counts(&self) -> QueueStatus {
        self.host.lock().map(|h| h.status()).unwrap_or_default()
    }

    fn snapshot_body_ids(&self, snapshot: &[u8]) -> Result<Vec<u64>, String> {
        QueueHost::snapshot_body_ids(snapshot)
    }

    fn read_bodies(&self, ids: &[u64]) -> Vec<(u64, Option<Bytes>)> {
        match self.host.lock() {
            Ok(h) => ids.iter().map(|id| (*id, h.payload(*id))).collect(),
            Err(_) => ids.iter().map(|id| (*id, None)).collect(),
        }
    }

    fn delivery_due(&self, consumer: ConsumerId, id: u64, count: u32) -> bool {
        self.host
            .lock()
            .map(|h| h.machine().is_checked_out_to(consumer, id, count))
            .unwrap_or(true)
    }

    fn write_bodies(&self, bodies: Vec<(u64, Bytes)>) -> Result<(), String> {
        self.host
            .lock()
            .map_err(|_| "queue lock poisoned".to_string())?
            .import_bodies(bodies);
        Ok(())
    }

    fn finish_snapshot(
        &self,
        snapshot: Vec<u8>,
        received: &HashSet<u64>,
    ) -> Result<Vec<u8>, String> {
        self.host
            .lock()
            .map_err(|_| "queue lock poisoned".to_string())?
            .finish_import(snapshot, received)
    }
}

/// The meta group's replica: Raft only (its snapshots carry no bodies).
pub struct MetaReplica {
    /// The meta group's Raft handle.
    pub raft: Raft,
}

impl GroupReplica for MetaReplica {
    fn raft(&self) -> &Raft {
        &self.raft
    }
}
