//! Snapshot persistence (one file per group) and the snapshot byte format.
//!
//! Snapshot bytes = `codec(SnapshotHeader)` followed by the machine's own bytes
//! (`Machine::snapshot`). The header repeats the last applied log id and membership taken under
//! the same lock as the machine bytes (pitfall P7), so a receiver can check the bytes agree with
//! the `SnapshotMeta` sent alongside them (pitfall P6) and a restart can restore from the bytes
//! alone.
//!
//! Durability: [`SnapshotStore::save`] writes meta + data as one file with a CRC
//! (`snapshots/<gid>.snap`): a temporary file written and `fsync`ed, renamed over the old one,
//! then the directory `fsync`ed — so a snapshot openraft learns about is on disk, power loss
//! included, before openraft may purge the logs it covers (pitfall P4, openraft `v2.rs`:
//! snapshot must be persisted), and a crash leaves the old snapshot or the new one. (Snapshots
//! used to live in sled; its flush is only `sync_file_range` (sled#1452), a power-loss test
//! found meta and data of one batch torn apart, and sled's `drop_tree` leaves the blob files of
//! large values behind.) Saves never move the stored snapshot backwards.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use openraft::{LogId, NodeId, SnapshotMeta, StoredMembership};
use serde::{Deserialize, Serialize};

use crate::node_store::Holders;
use crate::{codec, keys, GroupId, StoreError};

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

/// First bytes of a snapshot file (format 1).
const MAGIC: &[u8; 8] = b"QQSNAP01";

/// The snapshot file of `group` in the snapshot directory.
pub(crate) fn file_name(group: GroupId) -> String {
    format!("{group:020}.snap")
}

/// The group whose snapshot file is `name`, if it is one.
pub(crate) fn group_of_file(name: &str) -> Option<GroupId> {
    name.strip_suffix(".snap")?.parse().ok()
}

/// A snapshot file's bytes: `MAGIC`, meta length (u32 LE), meta (codec), data length (u64 LE),
/// data, then the CRC-32 (IEEE, u32 LE) of everything before it.
fn encode_file(meta: &[u8], data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(MAGIC.len() + 4 + meta.len() + 8 + data.len() + 4);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(meta.len() as u32).to_le_bytes());
    out.extend_from_slice(meta);
    out.extend_from_slice(&(data.len() as u64).to_le_bytes());
    out.extend_from_slice(data);
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Splits a snapshot file into (meta, data). Errors: [`StoreError::Corrupt`] naming `path`
/// when the magic, a length or the CRC is wrong.
fn decode_file<'a>(path: &Path, bytes: &'a [u8]) -> Result<(&'a [u8], &'a [u8]), StoreError> {
    let bad = |what: &str| {
        StoreError::corrupt(format!(
            "snapshot file {} is damaged ({what}, {} bytes); restore it or rebuild the node from \
             the other replicas",
            path.display(),
            bytes.len()
        ))
    };
    if bytes.len() < MAGIC.len() + 4 + 8 + 4 || &bytes[..MAGIC.len()] != MAGIC {
        return Err(bad("no snapshot header"));
    }
    let (body, crc) = bytes.split_at(bytes.len() - 4);
    if crc32fast::hash(body).to_le_bytes() != crc {
        return Err(bad("checksum mismatch"));
    }
    let rest = &body[MAGIC.len()..];
    let meta_len =
        u32::from_le_bytes(rest[..4].try_into().map_err(|_| bad("meta length"))?) as usize;
    let rest = &rest[4..];
    if rest.len() < meta_len + 8 {
        return Err(bad("meta length"));
    }
    let (meta, rest) = rest.split_at(meta_len);
    let data_len = u64::from_le_bytes(rest[..8].try_into().map_err(|_| bad("data length"))?);
    let data = &rest[8..];
    if data.len() as u64 != data_len {
        return Err(bad("data length"));
    }
    Ok((meta, data))
}

/// Writes `bytes` as `dir/name` atomically and durably: a temporary file written and
/// `fsync`ed, renamed over `name`, then the directory `fsync`ed (the rename's entry). After a
/// crash at any point the file holds the old snapshot or the new one, never a mix.
///
/// Errors: the first failure, naming what failed on which file.
fn write_atomically(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    use crate::wal::on_file;
    use std::io::Write;
    let path = dir.join(name);
    let tmp = dir.join(format!("{name}.tmp"));
    {
        let mut f = std::fs::File::create(&tmp).map_err(|e| on_file("creating", &tmp, e))?;
        f.write_all(bytes).map_err(|e| on_file("write", &tmp, e))?;
        f.sync_all().map_err(|e| on_file("fsync", &tmp, e))?;
    }
    std::fs::rename(&tmp, &path).map_err(|e| on_file("rename to", &path, e))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| on_file("fsync of the directory", dir, e))
}

/// The persisted current snapshot of one group: the file `<group>.snap` in the node's snapshot
/// directory. Snapshots saved by earlier versions in sled (tree `snap/<gid>`) are still read
/// when the group has no file yet, and dropped after its first file save.
pub(crate) struct SnapshotStore {
    group: GroupId,
    /// Earlier versions' sled tree of this group, if the node's sled holds one (read only
    /// when no file exists). None for every group created since: creating a sled tree
    /// rewrites sled's whole tree directory (a clone and a write of every tree's name), so a
    /// tree per new group made each queue declare cost more than the last (issue 31).
    tree: Option<sled::Tree>,
    /// The node's snapshot directory.
    dir: Arc<PathBuf>,
    /// Serializes compare-and-save so a slow build cannot overwrite a newer install.
    save_lock: Arc<tokio::sync::Mutex<()>>,
    /// Keeps [`crate::NodeStore::close`] waiting while the tree is held.
    holders: Holders,
    /// Called when a snapshot file cannot be written (the node's fail-stop).
    on_failure: fn(&std::io::Error),
}

// By hand: a derived `Clone` does not count as reading `holders`, which is
// held only for its count.
impl Clone for SnapshotStore {
    fn clone(&self) -> Self {
        SnapshotStore {
            group: self.group,
            tree: self.tree.clone(),
            dir: self.dir.clone(),
            save_lock: self.save_lock.clone(),
            holders: self.holders.clone(),
            on_failure: self.on_failure,
        }
    }
}

impl SnapshotStore {
    pub(crate) fn new(
        group: GroupId,
        tree: Option<sled::Tree>,
        dir: Arc<PathBuf>,
        holders: Holders,
        on_failure: fn(&std::io::Error),
    ) -> Self {
        SnapshotStore {
            group,
            tree,
            dir,
            save_lock: Arc::new(tokio::sync::Mutex::new(())),
            holders,
            on_failure,
        }
    }

    pub(crate) fn group(&self) -> GroupId {
        self.group
    }

    fn path(&self) -> PathBuf {
        self.dir.join(file_name(self.group))
    }

    /// The stored snapshot meta and bytes, if any. Errors: [`StoreError::Corrupt`] naming the
    /// file for a damaged snapshot file or one the disk cannot read (a media error is
    /// reported like damage), decode errors, sled errors.
    pub(crate) fn load<NID: NodeId, N: openraft::Node>(
        &self,
    ) -> Result<Option<StoredSnapshot<NID, N>>, StoreError> {
        let path = self.path();
        match std::fs::read(&path) {
            Ok(bytes) => {
                let (meta, data) = decode_file(&path, &bytes)?;
                Ok(Some((codec::decode(meta)?, data.to_vec())))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let Some(tree) = &self.tree else {
                    return Ok(None);
                };
                let (Some(meta), Some(data)) =
                    (tree.get(keys::SNAP_META)?, tree.get(keys::SNAP_DATA)?)
                else {
                    return Ok(None);
                };
                Ok(Some((codec::decode(&meta)?, data.to_vec())))
            }
            Err(e) => Err(StoreError::corrupt(format!(
                "snapshot file {} cannot be read: {e}",
                path.display()
            ))),
        }
    }

    /// The stored snapshot's meta only: the file's header, not its data (a save compares
    /// against it; the data can be megabytes). Unchecked by the CRC: [`SnapshotStore::load`]
    /// checks the whole file at restore.
    ///
    /// Errors: [`StoreError::Corrupt`] for a header that does not parse, I/O, decode errors.
    fn load_meta<NID: NodeId, N: openraft::Node>(
        &self,
    ) -> Result<Option<SnapshotMeta<NID, N>>, StoreError> {
        use std::io::Read;
        let path = self.path();
        let mut f = match std::fs::File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let Some(tree) = &self.tree else {
                    return Ok(None);
                };
                return match tree.get(keys::SNAP_META)? {
                    Some(m) => Ok(Some(codec::decode(&m)?)),
                    None => Ok(None),
                };
            }
            Err(e) => return Err(StoreError::Flush(e)),
        };
        let mut head = [0u8; MAGIC.len() + 4];
        f.read_exact(&mut head).map_err(StoreError::Flush)?;
        if &head[..MAGIC.len()] != MAGIC {
            return Err(StoreError::corrupt(format!(
                "snapshot file {} is damaged (no snapshot header)",
                path.display()
            )));
        }
        let len = u32::from_le_bytes([head[8], head[9], head[10], head[11]]) as usize;
        let mut meta = vec![0u8; len];
        f.read_exact(&mut meta).map_err(StoreError::Flush)?;
        Ok(Some(codec::decode(&meta)?))
    }

    /// Persist `meta` + `data` durably (power loss included: [`write_atomically`]) unless a
    /// snapshot with a greater `last_log_id` is already stored. Returns whether it was stored.
    /// Only then may openraft purge the log it covers (pitfall P4).
    pub(crate) async fn save<NID: NodeId, N: openraft::Node>(
        &self,
        meta: &SnapshotMeta<NID, N>,
        data: &[u8],
    ) -> Result<bool, StoreError> {
        let _guard = self.save_lock.lock().await;
        if let Some(current) = self.load_meta::<NID, N>()? {
            if current.last_log_id > meta.last_log_id {
                tracing::info!(group = self.group, current = ?current.last_log_id, stale = ?meta.last_log_id,
                    "not replacing a newer snapshot");
                return Ok(false);
            }
        }
        let bytes = encode_file(&codec::encode(meta)?, data);
        let dir = self.dir.clone();
        let name = file_name(self.group);
        let written = tokio::task::spawn_blocking(move || write_atomically(&dir, &name, &bytes))
            .await
            .map_err(|e| std::io::Error::other(e.to_string()))
            .and_then(|r| r);
        if let Err(e) = written {
            // openraft answers a failed snapshot by quitting the group's core, and the node
            // stayed up leading a queue it could no longer serve (nobody elects past a live
            // leader): the fault suite's disk-full left 1,020 dead letters held for good. A
            // full disk stops the node instead, as a failed WAL write does.
            (self.on_failure)(&e);
            return Err(StoreError::Flush(e));
        }
        // The file wins from now on; an earlier version's sled copy only takes space.
        if let Some(tree) = self.tree.as_ref().filter(|t| !t.is_empty()) {
            tree.clear()?;
        }
        Ok(true)
    }
}

/// `fsync`s every file under `dir`, then the directories themselves (new files' entries).
///
/// Errors: the first failure, naming the file or directory.
pub(crate) fn sync_tree(dir: &Path) -> std::io::Result<()> {
    use crate::wal::on_file;
    let list = std::fs::read_dir(dir).map_err(|e| on_file("listing", dir, e))?;
    for entry in list {
        let path = entry.map_err(|e| on_file("listing", dir, e))?.path();
        if path.is_dir() {
            sync_tree(&path)?;
        } else {
            std::fs::File::open(&path)
                .and_then(|f| f.sync_all())
                .map_err(|e| on_file("fsync", &path, e))?;
        }
    }
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| on_file("fsync of the directory", dir, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::{BasicNode, CommittedLeaderId};

    type Meta = SnapshotMeta<u64, BasicNode>;

    fn meta(index: u64) -> Meta {
        SnapshotMeta {
            last_log_id: Some(LogId::new(CommittedLeaderId::new(1, 1), index)),
            last_membership: StoredMembership::default(),
            snapshot_id: format!("s-{index}"),
        }
    }

    fn store(dir: &Path, db: &sled::Db) -> SnapshotStore {
        store_with(dir, db, |_| {})
    }

    /// Group 7's store under `dir/snapshots`, calling `on_failure` as a node's fail-stop.
    fn store_with(dir: &Path, db: &sled::Db, on_failure: fn(&std::io::Error)) -> SnapshotStore {
        let snaps = dir.join("snapshots");
        std::fs::create_dir_all(&snaps).unwrap();
        SnapshotStore::new(
            7,
            Some(db.open_tree(keys::snap_tree(7)).unwrap()),
            Arc::new(snaps),
            Holders::default(),
            on_failure,
        )
    }

    static FAILURES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

    #[tokio::test]
    async fn a_snapshot_that_cannot_be_written_reaches_the_failure_hook() {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::open(dir.path().join("sled")).unwrap();
        let s = store_with(dir.path(), &db, |_| {
            FAILURES.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        });
        // A directory where the temporary file goes: the write fails, the read does not.
        let tmp = dir
            .path()
            .join("snapshots")
            .join(format!("{}.tmp", file_name(7)));
        std::fs::create_dir_all(tmp).unwrap();
        let e = s.save(&meta(10), b"ten").await.unwrap_err();
        assert!(matches!(e, StoreError::Flush(_)), "{e}");
        assert_eq!(FAILURES.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_saved_snapshot_loads_back_and_never_moves_backwards() {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::Config::new().temporary(true).open().unwrap();
        let s = store(dir.path(), &db);
        assert!(s.load::<u64, BasicNode>().unwrap().is_none());
        assert!(s.save(&meta(10), b"ten").await.unwrap());
        assert!(
            !s.save(&meta(5), b"five").await.unwrap(),
            "an older snapshot is refused"
        );
        let (m, data) = s.load::<u64, BasicNode>().unwrap().unwrap();
        assert_eq!((m, data), (meta(10), b"ten".to_vec()));
        assert!(s.save(&meta(20), b"twenty").await.unwrap());
        assert_eq!(s.load::<u64, BasicNode>().unwrap().unwrap().1, b"twenty");
        // No temporary file is left behind.
        let names: Vec<String> = std::fs::read_dir(dir.path().join("snapshots"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, vec![file_name(7)]);
        assert_eq!(group_of_file(&file_name(7)), Some(7));
    }

    #[tokio::test]
    async fn a_damaged_snapshot_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::Config::new().temporary(true).open().unwrap();
        let s = store(dir.path(), &db);
        s.save(&meta(10), &[9u8; 1000]).await.unwrap();
        let path = dir.path().join("snapshots").join(file_name(7));
        let bytes = std::fs::read(&path).unwrap();
        for (i, cut) in [(500usize, false), (0, false), (bytes.len() - 1, true)] {
            let mut damaged = bytes.clone();
            if cut {
                damaged.truncate(i);
            } else {
                damaged[i] ^= 0x40;
            }
            std::fs::write(&path, &damaged).unwrap();
            let e = s
                .load::<u64, BasicNode>()
                .expect_err("damage must be reported");
            assert!(matches!(e, StoreError::Corrupt(_)), "{e}");
            assert!(e.to_string().contains(&path.display().to_string()), "{e}");
        }
        std::fs::write(&path, &bytes).unwrap();
        assert!(s.load::<u64, BasicNode>().unwrap().is_some());
    }

    #[tokio::test]
    async fn a_snapshot_of_an_earlier_version_in_sled_loads_and_moves_to_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::Config::new().temporary(true).open().unwrap();
        let s = store(dir.path(), &db);
        let tree = db.open_tree(keys::snap_tree(7)).unwrap();
        tree.insert(keys::SNAP_META, codec::encode(&meta(3)).unwrap())
            .unwrap();
        tree.insert(keys::SNAP_DATA, &b"old"[..]).unwrap();
        assert_eq!(
            s.load::<u64, BasicNode>().unwrap().unwrap(),
            (meta(3), b"old".to_vec())
        );
        assert!(!s.save(&meta(2), b"older").await.unwrap());
        assert!(s.save(&meta(4), b"new").await.unwrap());
        assert!(
            tree.is_empty(),
            "the sled copy is dropped once a file holds the snapshot"
        );
        assert_eq!(s.load::<u64, BasicNode>().unwrap().unwrap().1, b"new");
    }
}
