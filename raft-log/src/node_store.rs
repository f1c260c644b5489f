//! `NodeStore`: the node's Raft storage — the write-ahead log of every group's log, vote and
//! committed id (`<dir>/wal`), one sled `Db` for snapshots (`<dir>/sled`), and the node-wide
//! [`Flusher`]; hands out the per-group log stores and state machines.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use openraft::{Entry, RaftTypeConfig};

use crate::snapshot::SnapshotStore;
use crate::state_machine::GroupTypeConfig;
use crate::wal::{Wal, WalOptions};
use crate::{keys, Flusher, GroupId, GroupStateMachine, LogStore, Machine, StoreError};

/// Sizes of a [`NodeStore`]; `Default` is what the broker runs with.
#[derive(Debug, Clone, Copy)]
pub struct StoreOptions {
    /// sled page cache for snapshots, in bytes (default 16 MiB).
    pub sled_cache_bytes: u64,
    /// WAL segment size in bytes (default 64 MiB).
    pub segment_bytes: u64,
    /// Recently appended log bytes kept in memory per group (default 8 MiB).
    pub group_cache_bytes: usize,
    /// Shortest time between two WAL syncs (see [`Flusher::start_paced`]; default 0).
    pub min_sync_interval: std::time::Duration,
    /// Largest encoded entry `append` accepts, in bytes (default and upper bound
    /// [`crate::MAX_ENTRY_BYTES`]); larger ones fail with [`StoreError::TooLarge`].
    pub max_entry_bytes: usize,
    /// Called when a WAL write, `fdatasync` or segment creation fails, before the error is
    /// returned to the waiting appends, and when a snapshot file cannot be written (default
    /// [`fail_stop`]).
    pub on_sync_failure: fn(&std::io::Error),
    /// The operator's explicit repair of a corrupt WAL: `(segment id, byte offset)` as the
    /// [`StoreError::Corrupt`] of an earlier open named it (see [`crate::parse_truncate_at`]);
    /// recovery cuts the log there, dropping every later record. Default none: a corrupt
    /// record that later synced records follow fails the open.
    pub wal_truncate_at: Option<(u64, u64)>,
    /// Called after every WAL sync round with its duration (write + `fdatasync`; for a
    /// latency histogram). Default: nothing.
    pub on_wal_sync: fn(std::time::Duration),
}

/// The default [`StoreOptions::on_sync_failure`]: logs the error and exits the process with
/// status 70 (EX_SOFTWARE), so the node is fail-stop.
///
/// After a failed write or `fdatasync` the file's contents and the kernel's page cache are in
/// an unknown state (PostgreSQL's "fsyncgate", 2018: a retried fsync can report success for
/// pages the kernel already dropped), and openraft stops only the groups whose appends were
/// waiting, leaving the others running on a WAL with a hole. Nothing after the last good sync
/// may be acknowledged; on restart the WAL is replayed from disk and a torn tail is cut, and
/// the other replicas hold every committed entry. A full disk therefore stops the node (as etcd
/// does) instead of leaving it up with dead Raft groups that still route publishes.
///
/// The error names the operation and the file (`fdatasync <dir>/wal/<id>.wal: Input/output
/// error (os error 5)`); a WAL segment that cannot be read back is fatal the same way.
pub fn fail_stop(e: &std::io::Error) {
    tracing::error!(error = %e, "raft-log disk I/O failed: stopping the process (fail-stop)");
    eprintln!("raft-log disk I/O failed: {e}; stopping the process (fail-stop, exit status 70)");
    std::process::exit(70);
}

impl Default for StoreOptions {
    fn default() -> Self {
        let wal = WalOptions::default();
        StoreOptions {
            sled_cache_bytes: 16 << 20,
            segment_bytes: wal.segment_bytes,
            group_cache_bytes: wal.group_cache_bytes,
            min_sync_interval: std::time::Duration::ZERO,
            max_entry_bytes: wal.max_record_bytes,
            on_sync_failure: fail_stop,
            wal_truncate_at: None,
            on_wal_sync: |_| {},
        }
    }
}

/// The node's Raft storage: the WAL, one sled `Db` (exclusively locked by sled, which also
/// guards the WAL directory next to it) and the flusher that group-commits every group's
/// appends. Cheap to clone.
///
/// Dropping the last clone *and* every `LogStore`/`GroupStateMachine` obtained from it stops the
/// flusher thread and closes the `Db`; only then can the directory be opened again.
#[derive(Clone)]
pub struct NodeStore {
    db: sled::Db,
    /// sled's directory (node records; [`NodeStore::sync_sled`] fsyncs it).
    sled_dir: Arc<std::path::PathBuf>,
    /// One snapshot file per group (`snapshot.rs`).
    snap_dir: Arc<std::path::PathBuf>,
    wal: Arc<Wal>,
    flusher: Flusher,
    holders: Holders,
    /// Called when a snapshot cannot be written ([`StoreOptions::on_sync_failure`]).
    on_failure: fn(&std::io::Error),
    /// Groups whose snapshot tree (`snap/<gid>`) an earlier version left in sled, listed
    /// once at open: only these get their tree opened (new groups get none, see
    /// [`NodeStore::state_machine`]) and dropped.
    legacy_trees: Arc<std::sync::Mutex<BTreeSet<GroupId>>>,
}

/// Counts the live holders of a node's stores: every `NodeStore` clone, `LogStore` and
/// `GroupStateMachine` (with its snapshot builders). [`NodeStore::close`] waits for the others
/// to go, because sled releases its directory lock only with its last tree.
#[derive(Clone, Default)]
pub(crate) struct Holders(Arc<()>);

impl Holders {
    /// Number of live holders, this one included.
    fn count(&self) -> usize {
        Arc::strong_count(&self.0)
    }
}

impl NodeStore {
    /// Open (or create) the store in `dir` with a sled page cache of `cache_capacity_bytes` bytes
    /// and default WAL sizes ([`NodeStore::open_with`]).
    ///
    /// Errors: as [`NodeStore::open_with`].
    pub fn open(dir: &Path, cache_capacity_bytes: u64) -> Result<NodeStore, StoreError> {
        Self::open_with(
            dir,
            StoreOptions {
                sled_cache_bytes: cache_capacity_bytes,
                ..StoreOptions::default()
            },
        )
    }

    /// Open (or create) the store in `dir`: sled in `dir/sled` (takes sled's exclusive lock
    /// first), then the WAL in `dir/wal` (replayed; a torn tail is cut), then the flusher
    /// thread `raft-log-flusher`, whose every round is one WAL sync (write + `fdatasync`).
    ///
    /// Does not need a tokio runtime (the flusher is an OS thread).
    ///
    /// Errors: [`StoreError::Corrupt`] if `dir` is in the earlier layout (sled files directly in
    /// it); [`StoreError::Sled`] if sled cannot open the directory (already open in this or
    /// another process, corrupt files, I/O); WAL recovery errors ([`StoreError::Flush`] for
    /// I/O, [`StoreError::Corrupt`]/[`StoreError::Decode`] for contradictory records, and
    /// `Corrupt` naming the segment file and offset for a damaged record that later synced
    /// records follow, unless [`StoreOptions::wal_truncate_at`] names that spot);
    /// [`StoreError::Flush`] if the thread cannot spawn.
    pub fn open_with(dir: &Path, opts: StoreOptions) -> Result<NodeStore, StoreError> {
        // Before the WAL, sled lived directly in `dir` and held the logs; nothing migrates
        // that layout, so refuse it instead of starting empty beside it.
        if dir.join("db").exists() && !dir.join("sled").exists() {
            return Err(StoreError::corrupt(format!(
                "{} holds data in the earlier sled-only layout, which this version cannot read; \
                 move it away or use another data directory",
                dir.display()
            )));
        }
        let db = sled::Config::new()
            .path(dir.join("sled"))
            .cache_capacity(opts.sled_cache_bytes)
            .open()
            .map_err(|e| match e {
                sled::Error::Io(io) => {
                    sled::Error::Io(crate::wal::on_file("opening", &dir.join("sled"), io))
                }
                e => e,
            })?;
        // sled creates its files without syncing them or their directory: a power loss
        // before the first snapshot could leave no sled files at all.
        let snap_dir = Arc::new(dir.join("snapshots"));
        std::fs::create_dir_all(snap_dir.as_ref())
            .map_err(|e| StoreError::Flush(crate::wal::on_file("creating", &snap_dir, e)))?;
        // Their entries, and this directory's in its parent, too.
        crate::snapshot::sync_tree(&dir.join("sled")).map_err(StoreError::Flush)?;
        for d in [Some(dir), dir.parent()].into_iter().flatten() {
            std::fs::File::open(d)
                .and_then(|f| f.sync_all())
                .map_err(|e| StoreError::Flush(crate::wal::on_file("fsync of", d, e)))?;
        }
        let wal = Arc::new(Wal::open(
            &dir.join("wal"),
            WalOptions {
                segment_bytes: opts.segment_bytes,
                group_cache_bytes: opts.group_cache_bytes,
                max_record_bytes: opts.max_entry_bytes.min(crate::MAX_ENTRY_BYTES),
                on_failure: opts.on_sync_failure,
                truncate_at: opts.wal_truncate_at,
                on_synced: opts.on_wal_sync,
            },
        )?);
        let sync_wal = wal.clone();
        let flusher =
            Flusher::start_paced("raft-log-flusher", opts.min_sync_interval, move || {
                sync_wal.sync()
            })?;
        let legacy_trees: BTreeSet<GroupId> = db
            .tree_names()
            .iter()
            .filter_map(|n| keys::group_of_tree(n))
            .collect();
        tracing::info!(dir = %dir.display(), segments = wal.segments(), "opened raft-log store");
        Ok(NodeStore {
            db,
            sled_dir: Arc::new(dir.join("sled")),
            snap_dir,
            wal,
            flusher,
            holders: Holders::default(),
            on_failure: opts.on_sync_failure,
            legacy_trees: Arc::new(std::sync::Mutex::new(legacy_trees)),
        })
    }

    /// Sets every group's log read cache budget to `budget` bytes (`None`: the configured
    /// `group_cache_bytes`) and drops what is over it now (entries already written; later
    /// reads go to the segment files); returns the bytes dropped. For memory pressure: see
    /// [`Wal::shrink_caches`].
    pub fn set_log_cache_budget(&self, budget: Option<usize>) -> usize {
        self.wal.shrink_caches(budget)
    }

    /// The underlying sled `Db` (for node-local records such as an epoch counter and metrics;
    /// do not write `snap/` trees).
    pub fn db(&self) -> &sled::Db {
        &self.db
    }

    /// The node-wide flusher (for its [`crate::FlusherStats`]).
    pub fn flusher(&self) -> &Flusher {
        &self.flusher
    }

    /// The log store of `group` (its part of the WAL; empty if the group is new).
    ///
    /// Use exactly one `Raft` per group per node; clones of the returned store share state.
    /// Errors: decode errors or [`StoreError::Corrupt`] for a bad last entry or vote record.
    pub fn log_store<C>(&self, group: GroupId) -> Result<LogStore<C>, StoreError>
    where
        C: RaftTypeConfig<Entry = Entry<C>>,
    {
        LogStore::new(
            group,
            self.wal.clone(),
            self.flusher.clone(),
            self.holders.clone(),
        )
    }

    /// The state machine of `group` wrapping `machine` (its snapshot file; the sled tree
    /// `snap/<gid>` only if an earlier version left one: creating a sled tree costs time and
    /// bytes in proportion to the trees sled holds, so a tree per new group made every queue
    /// declare dearer than the last, issue 31).
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
        let tree = if self.is_legacy(group) {
            Some(self.db.open_tree(keys::snap_tree(group))?)
        } else {
            None
        };
        GroupStateMachine::open(
            SnapshotStore::new(
                group,
                tree,
                self.snap_dir.clone(),
                self.holders.clone(),
                self.on_failure,
            ),
            machine,
        )
    }

    /// Delete the log, vote and snapshot of `group` (queue deleted; pitfall P9: group ids are
    /// never reused). Shut the group's `Raft` down first: stores still held by it would keep
    /// writing. Durable with the next flush ([`NodeStore::flush`]).
    ///
    /// Errors: [`StoreError::Sled`]; WAL errors.
    pub fn drop_group(&self, group: GroupId) -> Result<(), StoreError> {
        self.wal.drop_group(group)?;
        if self.is_legacy(group) {
            self.db.drop_tree(keys::snap_tree(group))?;
            if let Ok(mut l) = self.legacy_trees.lock() {
                l.remove(&group);
            }
        }
        match std::fs::remove_file(self.snap_dir.join(crate::snapshot::file_name(group))) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(StoreError::Flush(e)),
            _ => Ok(()),
        }
    }

    /// Groups that have a log, a vote or a snapshot on disk, ascending. Reconcile this with cluster metadata
    /// at startup (e.g. drop groups of deleted queues if a crash interrupted `drop_group`).
    ///
    /// Errors: [`StoreError::Flush`] if the snapshot directory cannot be listed.
    pub fn groups(&self) -> Result<Vec<GroupId>, StoreError> {
        let mut set: BTreeSet<GroupId> = self
            .legacy_trees
            .lock()
            .map(|l| l.clone())
            .unwrap_or_default();
        set.extend(self.wal.groups());
        let files = std::fs::read_dir(self.snap_dir.as_ref()).map_err(StoreError::Flush)?;
        for f in files {
            let f = f.map_err(StoreError::Flush)?;
            if let Some(g) = f
                .file_name()
                .to_str()
                .and_then(crate::snapshot::group_of_file)
            {
                set.insert(g);
            }
        }
        Ok(set.into_iter().collect())
    }

    /// True when an earlier version left `group` a sled snapshot tree (a poisoned lock
    /// answers yes: opening an existing tree is harmless).
    fn is_legacy(&self, group: GroupId) -> bool {
        self.legacy_trees
            .lock()
            .map_or(true, |l| l.contains(&group))
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
        while self.holders.count() > 1 {
            if tokio::time::Instant::now() >= deadline {
                return Err(StoreError::Busy(format!(
                    "{} store handles still alive",
                    self.holders.count() - 1
                )));
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        drop(self);
        Ok(())
    }

    /// Make every write so far durable: one WAL sync shared through the flusher, then
    /// [`NodeStore::sync_sled`] (node-local records), then the snapshot directory (snapshot files
    /// removed by `drop_group`).
    ///
    /// Errors: [`StoreError::Flush`], [`StoreError::FlusherStopped`], [`StoreError::Sled`].
    pub async fn flush(&self) -> Result<(), StoreError> {
        self.flusher.flush().await?;
        self.sync_sled_async().await?;
        // Snapshot files removed by `drop_group`.
        let dir = self.snap_dir.clone();
        tokio::task::spawn_blocking(move || std::fs::File::open(dir.as_ref())?.sync_all())
            .await
            .map_err(|e| StoreError::Flush(std::io::Error::other(e.to_string())))?
            .map_err(StoreError::Flush)
    }

    /// Makes every sled write so far durable, power loss included: sled's flush (only
    /// `sync_file_range`: no disk-cache flush, no size metadata; sled#1452), then an `fsync`
    /// of every file and directory under sled's directory. Blocks; for node-local records
    /// that must survive (the boot epoch, the cluster id, peer addresses).
    ///
    /// Errors: [`StoreError::Sled`], [`StoreError::Flush`].
    pub fn sync_sled(&self) -> Result<(), StoreError> {
        self.db.flush()?;
        crate::snapshot::sync_tree(&self.sled_dir).map_err(StoreError::Flush)
    }

    /// [`NodeStore::sync_sled`] without blocking the async runtime.
    ///
    /// Errors: as `sync_sled`.
    pub async fn sync_sled_async(&self) -> Result<(), StoreError> {
        self.db.flush_async().await?;
        let dir = self.sled_dir.clone();
        tokio::task::spawn_blocking(move || crate::snapshot::sync_tree(&dir))
            .await
            .map_err(|e| StoreError::Flush(std::io::Error::other(e.to_string())))?
            .map_err(StoreError::Flush)
    }
}
