//! The Raft groups this node runs a replica of, by group id: what the
//! transport server routes incoming RPCs to. A replica is seen through the
//! narrow [`GroupReplica`] capability (its Raft handle, its counts, and the
//! message bodies a snapshot of it indexes), never through the queue itself.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::status::QueueStatus;
use super::types::Raft;
use crate::queue::types::ConsumerId;

/// What the transport needs of one local replica.
pub trait GroupReplica: Send + Sync + 'static {
    /// The group's Raft handle.
    fn raft(&self) -> &Raft;

    /// A replica seeded as a member of a new group
    /// ([`super::bootstrap::seed_new_group`]): what it waits for before it
    /// answers an append or a vote. None for other replicas.
    fn seed_sync(&self) -> Option<&super::bootstrap::SeedSync> {
        None
    }

    /// Counts of the local replica (queue groups; zeros for the meta group).
    fn counts(&self) -> QueueStatus {
        QueueStatus::default()
    }

    /// Sender side of a snapshot install: the message ids whose bodies the
    /// snapshot (the bytes openraft holds, `raft_log::SnapshotPayload`)
    /// needs. Empty for groups without bodies.
    ///
    /// Errors: the snapshot does not decode.
    fn snapshot_body_ids(&self, snapshot: &[u8]) -> Result<Vec<u64>, String> {
        let _ = snapshot;
        Ok(Vec::new())
    }

    /// Sender side: the bodies of `ids` (None where this replica has none).
    fn read_bodies(&self, ids: &[u64]) -> Vec<(u64, Option<Bytes>)> {
        ids.iter().map(|id| (*id, None)).collect()
    }

    /// Whether a delivery of message `id` with delivery count `count` to
    /// `consumer` is still due in this replica's state (the message is
    /// checked out to it with that count). True for groups without
    /// consumers and when the replica cannot tell.
    fn delivery_due(&self, consumer: ConsumerId, id: u64, count: u32) -> bool {
        let _ = (consumer, id, count);
        true
    }

    /// Receiver side: store received bodies in this replica's body store.
    ///
    /// Errors: the store could not take them.
    fn write_bodies(&self, bodies: Vec<(u64, Bytes)>) -> Result<(), String> {
        let _ = bodies;
        Ok(())
    }

    /// Receiver side, after every body arrived: the snapshot bytes rewritten
    /// to index this replica's own body store (bodies not in `received`
    /// are dropped from it: the snapshot replaces the whole state).
    ///
    /// Errors: the snapshot does not decode, or the store failed.
    fn finish_snapshot(
        &self,
        snapshot: Vec<u8>,
        received: &HashSet<u64>,
    ) -> Result<Vec<u8>, String> {
        let _ = received;
        Ok(snapshot)
    }
}

struct Entry {
    replica: Arc<dyn GroupReplica>,
    /// When the replica was registered (opened on this node).
    opened: Instant,
    /// When this replica last took an append-entries RPC from a leader
    /// (ms since [`clock_base`], 0 = never): its leader lease runs from here.
    heard: AtomicU64,
}

/// Local replicas by group id.
#[derive(Default)]
pub struct GroupTable {
    groups: RwLock<HashMap<u64, Arc<Entry>>>,
    /// Woken when a replica is registered ([`GroupTable::wait_for`]).
    registered: tokio::sync::Notify,
}

/// The origin of [`GroupTable`]'s timestamps (first use in this process).
fn clock_base() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

impl GroupTable {
    /// Registers (or replaces) the replica of `group`.
    pub fn insert(&self, group: u64, replica: Arc<dyn GroupReplica>) {
        if let Ok(mut g) = self.groups.write() {
            let heard = AtomicU64::new(0);
            let opened = Instant::now();
            g.insert(
                group,
                Arc::new(Entry {
                    replica,
                    opened,
                    heard,
                }),
            );
        }
        self.registered.notify_waiters();
    }

    /// The replica of `group` as `find` returns it, waiting up to `limit`
    /// for it to be registered: a member opens a new queue's replica when it
    /// applies the queue's record, a little after the leader's first vote
    /// request or append can arrive (issue 31: refusing those at once made
    /// the leader retry, and log, per group).
    pub async fn wait_for(
        &self,
        group: u64,
        limit: Duration,
        find: fn(&GroupTable, u64) -> Option<Arc<dyn GroupReplica>>,
    ) -> Option<Arc<dyn GroupReplica>> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let registered = self.registered.notified();
            tokio::pin!(registered);
            registered.as_mut().enable();
            if let Some(r) = find(self, group) {
                return Some(r);
            }
            if tokio::time::timeout_at(deadline, registered).await.is_err() {
                return find(self, group);
            }
        }
    }

    /// The replica of `group` for an append-entries RPC from a leader: also
    /// notes that it hears from its leader now (see [`GroupTable::last_heard`]).
    pub fn get_for_append(&self, group: u64) -> Option<Arc<dyn GroupReplica>> {
        let g = self.groups.read().ok()?;
        let e = g.get(&group)?;
        let ms = clock_base().elapsed().as_millis() as u64;
        e.heard.store(ms.max(1), Ordering::Relaxed);
        Some(e.replica.clone())
    }

    /// When `group`'s replica was registered on this node.
    pub fn opened_at(&self, group: u64) -> Option<Instant> {
        Some(self.groups.read().ok()?.get(&group)?.opened)
    }

    /// When `group`'s replica last heard from a leader, if ever since it was
    /// registered. openraft refuses votes for `election_timeout_max` after
    /// that (the leader lease), so an election started earlier is wasted.
    pub fn last_heard(&self, group: u64) -> Option<Instant> {
        let e = self.groups.read().ok()?.get(&group).cloned()?;
        match e.heard.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(clock_base() + Duration::from_millis(ms)),
        }
    }

    /// Forgets `group` (deleted queue, node stopping).
    pub fn remove(&self, group: u64) {
        if let Ok(mut g) = self.groups.write() {
            g.remove(&group);
        }
    }

    /// The replica of `group`, if this node runs one.
    pub fn get(&self, group: u64) -> Option<Arc<dyn GroupReplica>> {
        Some(self.groups.read().ok()?.get(&group)?.replica.clone())
    }

    /// Every local replica, with its group id.
    pub fn all(&self) -> Vec<(u64, Arc<dyn GroupReplica>)> {
        self.groups
            .read()
            .map(|g| g.iter().map(|(k, v)| (*k, v.replica.clone())).collect())
            .unwrap_or_default()
    }
}
