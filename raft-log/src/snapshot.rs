//! Snapshot persistence (`snap/<gid>` tree) and the snapshot byte format.
//!
//! Snapshot bytes = `codec(SnapshotHeader)` followed by the machine's own bytes
//! (`Machine::snapshot`). The header repeats the last applied log id and membership taken under
//! the same lock as the machine bytes (pitfall P7), so a receiver can check the bytes agree with
//! the `SnapshotMeta` sent alongside them (pitfall P6) and a restart can restore from the bytes
//! alone.
//!
//! Durability: [`SnapshotStore::save`] writes meta + data in one atomic sled batch, waits for
//! sled's flush — which is only write + `sync_file_range` (sled#1452: no device-cache flush, no
//! size metadata) — and then `fsync`s every file and directory under sled's directory itself, so
//! a snapshot openraft learns about is on disk, power loss included, before openraft may purge
//! the logs it covers (pitfall P4, openraft `v2.rs`: snapshot must be persisted). Saves never
//! move the stored snapshot backwards.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use openraft::{LogId, NodeId, SnapshotMeta, StoredMembership};
use serde::{Deserialize, Serialize};

use crate::{codec, keys, Flusher, GroupId, StoreError};

/// Versioned header at the start of snapshot bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(bound = "")]
pub enum SnapshotHeader<NID: NodeId, N: openraft::Node> {
    /// Format 1: followed by exactly `machine_len` bytes of `Machine::snapshot` output.
    V1 {
        /// Last log id applied to the machine when it was serialized.
        last_applied: Option<LogId<NID>>,
        /// Last membership applied to the machine when it was serialized.
        last_membership: StoredMembership<NID, N>,
        /// Length of the machine bytes that follow, in bytes.
        machine_len: u64,
    },
}

/// Decoded snapshot bytes: applied position plus the machine's own serialization.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotPayload<NID: NodeId, N: openraft::Node> {
    /// Last log id included in the machine state.
    pub last_applied: Option<LogId<NID>>,
    /// Last membership included.
    pub last_membership: StoredMembership<NID, N>,
    /// `Machine::snapshot` output.
    pub machine: Vec<u8>,
}

impl<NID: NodeId, N: openraft::Node> SnapshotPayload<NID, N> {
    /// Serialize to snapshot bytes (header + machine bytes). Errors: [`StoreError::Encode`].
    pub fn encode(&self) -> Result<Vec<u8>, StoreError> {
        let header = SnapshotHeader::<NID, N>::V1 {
            last_applied: self.last_applied.clone(),
            last_membership: self.last_membership.clone(),
            machine_len: self.machine.len() as u64,
        };
        let mut out = codec::encode(&header)?;
        out.extend_from_slice(&self.machine);
        Ok(out)
    }

    /// Parse snapshot bytes. Errors: [`StoreError::Decode`], or [`StoreError::Corrupt`] if the
    /// length in the header does not match.
    pub fn decode(bytes: &[u8]) -> Result<Self, StoreError> {
        let (header, used) = codec::decode_prefix::<SnapshotHeader<NID, N>>(bytes)?;
        let SnapshotHeader::V1 {
            last_applied,
            last_membership,
            machine_len,
        } = header;
        let rest = &bytes[used..];
        if rest.len() as u64 != machine_len {
            return Err(StoreError::corrupt(format!(
                "snapshot header says {machine_len} machine bytes, found {}",
                rest.len()
            )));
        }
        Ok(SnapshotPayload {
            last_applied,
            last_membership,
            machine: rest.to_vec(),
        })
    }

    /// Check the payload describes the same state as `meta`. Errors: [`StoreError::Corrupt`].
    pub fn check_meta(&self, meta: &SnapshotMeta<NID, N>) -> Result<(), StoreError> {
        if self.last_applied != meta.last_log_id || self.last_membership != meta.last_membership {
            return Err(StoreError::corrupt(format!(
                "snapshot bytes at {:?} do not match meta {:?}",
                self.last_applied, meta.last_log_id
            )));
        }
        Ok(())
    }
}

/// A stored snapshot: its meta and its bytes.
pub(crate) type StoredSnapshot<NID, N> = (SnapshotMeta<NID, N>, Vec<u8>);

/// The persisted current snapshot of one group.
pub(crate) struct SnapshotStore {
    group: GroupId,
    tree: sled::Tree,
    flusher: Flusher,
    /// sled's directory: fsynced after each save.
    sled_dir: Arc<PathBuf>,
    /// Serializes compare-and-save so a slow build cannot overwrite a newer install.
    save_lock: Arc<tokio::sync::Mutex<()>>,
}

impl Clone for SnapshotStore {
    fn clone(&self) -> Self {
        SnapshotStore {
            group: self.group,
            tree: self.tree.clone(),
            flusher: self.flusher.clone(),
            sled_dir: self.sled_dir.clone(),
            save_lock: self.save_lock.clone(),
        }
    }
}

impl SnapshotStore {
    pub(crate) fn new(
        group: GroupId,
        tree: sled::Tree,
        flusher: Flusher,
        sled_dir: Arc<PathBuf>,
    ) -> Self {
        SnapshotStore {
            group,
            tree,
            flusher,
            sled_dir,
            save_lock: Arc::new(tokio::sync::Mutex::new(())),
        }
    }

    pub(crate) fn group(&self) -> GroupId {
        self.group
    }

    /// The stored snapshot meta and bytes, if any.
    pub(crate) fn load<NID: NodeId, N: openraft::Node>(
        &self,
    ) -> Result<Option<StoredSnapshot<NID, N>>, StoreError> {
        let (Some(meta), Some(data)) = (
            self.tree.get(keys::SNAP_META)?,
            self.tree.get(keys::SNAP_DATA)?,
        ) else {
            return Ok(None);
        };
        Ok(Some((codec::decode(&meta)?, data.to_vec())))
    }

    /// Persist `meta` + `data` durably unless a snapshot with a greater `last_log_id` is already
    /// stored. Returns whether it was stored.
    pub(crate) async fn save<NID: NodeId, N: openraft::Node>(
        &self,
        meta: &SnapshotMeta<NID, N>,
        data: &[u8],
    ) -> Result<bool, StoreError> {
        let _guard = self.save_lock.lock().await;
        if let Some(m) = self.tree.get(keys::SNAP_META)? {
            let current: SnapshotMeta<NID, N> = codec::decode(&m)?;
            if current.last_log_id > meta.last_log_id {
                tracing::info!(group = self.group, current = ?current.last_log_id, stale = ?meta.last_log_id,
                    "not replacing a newer snapshot");
                return Ok(false);
            }
        }
        let mut batch = sled::Batch::default();
        batch.insert(keys::SNAP_META, codec::encode(meta)?);
        batch.insert(keys::SNAP_DATA, data);
        self.tree.apply_batch(batch)?;
        self.tree.flush_async().await?;
        let dir = self.sled_dir.clone();
        tokio::task::spawn_blocking(move || sync_tree(&dir))
            .await
            .map_err(|e| StoreError::Flush(std::io::Error::other(e.to_string())))?
            .map_err(StoreError::Flush)?;
        Ok(true)
    }
}

/// `fsync`s every file under `dir`, then the directories themselves (new files' entries).
pub(crate) fn sync_tree(dir: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            sync_tree(&path)?;
        } else {
            std::fs::File::open(&path)?.sync_all()?;
        }
    }
    std::fs::File::open(dir)?.sync_all()
}
