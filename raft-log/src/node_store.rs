//! `NodeStore`: one sled `Db` per node plus the node-wide [`Flusher`]; hands out the per-group
//! log stores and state machines.

use std::collections::BTreeSet;
use std::path::Path;

use openraft::{Entry, RaftTypeConfig};

use crate::snapshot::SnapshotStore;
use crate::state_machine::GroupTypeConfig;
use crate::{keys, Flusher, GroupId, GroupStateMachine, LogStore, Machine, StoreError};

/// The node's Raft storage: one sled `Db` (one data directory, exclusively locked by sled) and the
/// flusher that group-commits every group's appends. Cheap to clone.
///
/// Dropping the last clone *and* every `LogStore`/`GroupStateMachine` obtained from it stops the
/// flusher thread and closes the `Db`; only then can the directory be opened again.
#[derive(Clone)]
pub struct NodeStore {
    db: sled::Db,
    flusher: Flusher,
}

impl NodeStore {
    /// Open (or create) the store in `dir` with a sled page cache of `cache_capacity_bytes` bytes
    /// (sled's default is 1 GiB), and start the flusher thread `raft-log-flusher`.
    ///
    /// Does not need a tokio runtime (the flusher is an OS thread). sled's background flush
    /// (`flush_every_ms`, default 500 ms) stays on; durability of acknowledged Raft writes comes
    /// from the explicit flushes, which on Linux are `sync_file_range`, not `fsync` (sled#1452,
    /// architecture-anchors §2.1).
    ///
    /// Errors: [`StoreError::Sled`] if sled cannot open the directory (already open in this or
    /// another process, corrupt files, I/O); [`StoreError::Flush`] if the thread cannot spawn.
    pub fn open(dir: &Path, cache_capacity_bytes: u64) -> Result<NodeStore, StoreError> {
        /// sled segment (and IO buffer) size in bytes; see below.
        const SEGMENT_BYTES: usize = 8 * 1024 * 1024;

        let db = sled::Config::new()
            .path(dir)
            .cache_capacity(cache_capacity_bytes)
            // sled writes any page over segment_size/4 as a separate blob
            // file (open + write + close). Raft entries carry batches of
            // message bodies, so with the 512 KiB default most log pages
            // became blobs; 8 MiB segments keep pages up to 2 MiB inline.
            .segment_size(SEGMENT_BYTES)
            .open()?;

        let flush_db = db.clone();
        let flusher = Flusher::start("raft-log-flusher", move || {
            flush_db.flush().map(|_| ()).map_err(std::io::Error::other)
        })?;
        tracing::info!(dir = %dir.display(), recovered = db.was_recovered(), "opened raft-log store");
        Ok(NodeStore { db, flusher })
    }

    /// The underlying sled `Db` (for metrics such as `size_on_disk`; do not write Raft trees).
    pub fn db(&self) -> &sled::Db {
        &self.db
    }

    /// The node-wide flusher (for its [`crate::FlusherStats`]).
    pub fn flusher(&self) -> &Flusher {
        &self.flusher
    }

    /// The log store of `group` (trees `log/<gid>`, `meta/<gid>`, created if missing).
    ///
    /// Use exactly one `Raft` per group per node; clones of the returned store share state.
    /// Errors: [`StoreError::Sled`].
    pub fn log_store<C>(&self, group: GroupId) -> Result<LogStore<C>, StoreError>
    where
        C: RaftTypeConfig<Entry = Entry<C>>,
    {
        let log = self.db.open_tree(keys::log_tree(group))?;
        let meta = self.db.open_tree(keys::meta_tree(group))?;
        Ok(LogStore::new(group, log, meta, self.flusher.clone()))
    }

    /// The state machine of `group` wrapping `machine` (tree `snap/<gid>`, created if missing).
    ///
    /// If a snapshot is persisted, `machine` is first restored from it (`Machine::restore`), so
    /// `Raft::new` replays only the log after the snapshot. Pass a fresh/empty machine.
    /// Errors: [`StoreError::Sled`]; decode errors or [`StoreError::Corrupt`] for a bad stored
    /// snapshot; whatever `Machine::restore` returns.
    pub fn state_machine<C, M>(
        &self,
        group: GroupId,
        machine: M,
    ) -> Result<GroupStateMachine<C, M>, StoreError>
    where
        C: GroupTypeConfig,
        M: Machine<C>,
    {
        let tree = self.db.open_tree(keys::snap_tree(group))?;
        GroupStateMachine::open(
            SnapshotStore::new(group, tree, self.flusher.clone()),
            machine,
        )
    }

    /// Delete the `log/`, `meta/` and `snap/` trees of `group` (queue deleted; pitfall P9: group
    /// ids are never reused). Shut the group's `Raft` down first: stores still held by it would
    /// keep writing into the dropped trees. Durable with the next flush ([`NodeStore::flush`]).
    ///
    /// Errors: [`StoreError::Sled`].
    pub fn drop_group(&self, group: GroupId) -> Result<(), StoreError> {
        for name in [
            keys::log_tree(group),
            keys::meta_tree(group),
            keys::snap_tree(group),
        ] {
            self.db.drop_tree(name)?;
        }
        Ok(())
    }

    /// Groups that have at least one tree on disk, ascending. Reconcile this with cluster metadata
    /// at startup (e.g. drop groups of deleted queues if a crash interrupted `drop_group`).
    ///
    /// Errors: none today (sled lists trees from memory); kept fallible for future formats.
    pub fn groups(&self) -> Result<Vec<GroupId>, StoreError> {
        let set: BTreeSet<GroupId> = self
            .db
            .tree_names()
            .iter()
            .filter_map(|n| keys::group_of_tree(n))
            .collect();
        Ok(set.into_iter().collect())
    }

    /// Flush, then wait until every `LogStore`, `GroupStateMachine` and snapshot builder obtained
    /// from this store has been dropped, then close the `Db` (joins the flusher thread, releases
    /// sled's directory lock). For in-process restarts: after `Raft::shutdown` openraft's state
    /// machine worker drops its store a little later, asynchronously.
    ///
    /// Errors: flush errors; [`StoreError::Busy`] if handles are still alive after `timeout`
    /// (the store is then dropped anyway and closes when the last handle goes).
    pub async fn close(self, timeout: std::time::Duration) -> Result<(), StoreError> {
        self.flush().await?;
        let deadline = tokio::time::Instant::now() + timeout;
        // Our own handle is one of the holders.
        while self.flusher.handles() > 1 {
            if tokio::time::Instant::now() >= deadline {
                return Err(StoreError::Busy(format!(
                    "{} store handles still alive",
                    self.flusher.handles() - 1
                )));
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        drop(self);
        Ok(())
    }

    /// Make every write so far durable (one shared flush through the flusher).
    ///
    /// Errors: [`StoreError::Flush`], [`StoreError::FlusherStopped`].
    pub async fn flush(&self) -> Result<(), StoreError> {
        self.flusher.flush().await
    }
}
