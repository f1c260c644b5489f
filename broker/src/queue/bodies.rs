//! Where message payloads live while the machine holds only their index.
//! RabbitMQ keeps quorum-queue bodies in the Raft log; openraft 0.9 cannot
//! retain single log entries, so the queue host keeps them here.
//!
//! [`SegmentBodies`] (quorum queues) keeps recent bodies in memory — while
//! the Raft log still holds them durably — and appends older ones to
//! per-queue segment files when memory passes a budget or when a snapshot is
//! about to let the log be purged. A message published and acked between
//! two snapshots never touches a segment file. The location index of
//! spilled bodies is part of the queue's snapshot, so after a restart the
//! snapshot names exactly the bodies it needs; bodies spilled after the
//! last snapshot are recovered from the Raft log by replay. A segment file
//! is deleted once none of its bodies is live. [`MemBodies`] serves local
//! (non-replicated) queues.

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::types::MsgId;

/// In-memory body budget per quorum queue (bytes) before spilling to disk.
pub const MEMORY_BUDGET: usize = 16 * 1024 * 1024;
/// A segment file is closed for appends past this size (bytes).
const SEGMENT_BYTES: u64 = 64 * 1024 * 1024;

/// Payload storage keyed by message id.
pub trait BodyStore: Send + Sync + 'static {
    /// Stores the encoded message under `id`.
    fn put(&mut self, id: MsgId, payload: &Bytes);
    /// The payload of `id`, if stored.
    fn get(&self, id: MsgId) -> Option<Bytes>;
    /// Ids of every stored body.
    fn ids(&self) -> Vec<MsgId>;
    /// Deletes the payload of `id` (no-op if absent).
    fn remove(&mut self, id: MsgId);
    /// Makes every stored body independent of the Raft log and returns the
    /// index to keep in the snapshot (called just before a snapshot).
    fn persist_all(&mut self) -> Vec<u8>;
    /// Adopts the index saved by `persist_all` (restore from a snapshot).
    fn restore(&mut self, index: &[u8]) -> Result<(), String>;
    /// Called once the group is open: with no snapshot restored, bodies
    /// left on disk by an earlier run are unreferenced (the whole log is
    /// still there to replay them) and can go.
    fn finish_open(&mut self) {}
}

/// Where a spilled body is: segment number, byte offset, length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Loc {
    seg: u32,
    off: u64,
    len: u32,
}

struct Segment {
    file: File,
    len: u64,
    live: u64,
}

/// Bodies of a quorum queue: memory first, then append-only segment files
/// under `<dir>/<segment>.seg`.
pub struct SegmentBodies {
    dir: PathBuf,
    mem: BTreeMap<MsgId, Bytes>,
    mem_bytes: usize,
    budget: usize,
    spilled: BTreeMap<MsgId, Loc>,
    segs: BTreeMap<u32, Segment>,
    active: u32,
    /// Segments written since the last sync.
    dirty: bool,
    /// Drained segments: no live body, but the last saved snapshot may
    /// still name them, so their files go only at the next snapshot.
    retired: Vec<u32>,
    /// Drained before the previous snapshot: safe to delete now.
    deletable: Vec<u32>,
    /// Segments found on disk at open, before any restore.
    found_at_open: Vec<u32>,
    restored: bool,
}

impl SegmentBodies {
    /// Body store in `dir` (created if missing). Segment files already
    /// there belong to the previous run: they are adopted by [`restore`]
    /// when the snapshot names them, and deleted otherwise.
    ///
    /// [`restore`]: BodyStore::restore
    pub fn open(dir: &Path, budget: usize) -> std::io::Result<Self> {
        fs::create_dir_all(dir)?;
        let mut store = SegmentBodies {
            dir: dir.to_path_buf(),
            mem: BTreeMap::new(),
            mem_bytes: 0,
            budget,
            spilled: BTreeMap::new(),
            segs: BTreeMap::new(),
            active: 0,
            dirty: false,
            retired: Vec::new(),
            deletable: Vec::new(),
            found_at_open: Vec::new(),
            restored: false,
        };
        store.found_at_open = store.existing_segments()?;
        store.active = store.found_at_open.iter().max().map_or(0, |m| m + 1);
        Ok(store)
    }

    fn seg_path(&self, seg: u32) -> PathBuf {
        self.dir.join(format!("{seg:010}.seg"))
    }

    fn existing_segments(&self) -> std::io::Result<Vec<u32>> {
        let mut out = Vec::new();
        for e in fs::read_dir(&self.dir)? {
            let name = e?.file_name();
            if let Some(n) = name
                .to_str()
                .and_then(|n| n.strip_suffix(".seg"))
                .and_then(|n| n.parse().ok())
            {
                out.push(n);
            }
        }
        Ok(out)
    }

    fn active_segment(&mut self) -> std::io::Result<&mut Segment> {
        let full = self
            .segs
            .get(&self.active)
            .is_some_and(|s| s.len >= SEGMENT_BYTES);
        if full {
            self.active += 1;
        }
        if !self.segs.contains_key(&self.active) {
            let file = OpenOptions::new()
                .create(true)
                .read(true)
                .append(true)
                .open(self.seg_path(self.active))?;
            self.segs.insert(
                self.active,
                Segment {
                    file,
                    len: 0,
                    live: 0,
                },
            );
        }
        self.segs
            .get_mut(&self.active)
            .ok_or_else(|| std::io::Error::other("segment vanished"))
    }

    /// Appends the oldest in-memory bodies to the active segment until at
    /// most `keep` bytes stay in memory.
    fn spill(&mut self, keep: usize) -> std::io::Result<()> {
        if self.mem_bytes <= keep {
            return Ok(());
        }
        let mut buf = Vec::new();
        let mut moved = Vec::new();
        while self.mem_bytes > keep {
            let Some((id, payload)) = self.mem.pop_first() else {
                break;
            };
            self.mem_bytes -= payload.len();
            moved.push((id, buf.len() as u64, payload.len() as u32));
            buf.extend_from_slice(&payload);
        }
        let active = self.active_segment()?;
        let base = active.len;
        active.file.write_all(&buf)?;
        active.len += buf.len() as u64;
        active.live += moved.len() as u64;
        let seg = self.active;
        for (id, off, len) in moved {
            self.spilled.insert(
                id,
                Loc {
                    seg,
                    off: base + off,
                    len,
                },
            );
        }
        self.dirty = true;
        Ok(())
    }

    fn release(&mut self, loc: Loc) {
        let Some(s) = self.segs.get_mut(&loc.seg) else {
            return;
        };
        s.live = s.live.saturating_sub(1);
        if s.live == 0 && loc.seg != self.active {
            self.segs.remove(&loc.seg);
            self.retired.push(loc.seg);
        }
    }
}

impl BodyStore for SegmentBodies {
    fn put(&mut self, id: MsgId, payload: &Bytes) {
        // Replay after a restart re-stores bodies the snapshot already has.
        if self.spilled.contains_key(&id) {
            return;
        }
        self.mem_bytes += payload.len();
        if let Some(old) = self.mem.insert(id, payload.clone()) {
            self.mem_bytes -= old.len();
        }
        if self.mem_bytes > self.budget {
            if let Err(e) = self.spill(self.budget / 2) {
                tracing::error!(error = %e, dir = %self.dir.display(), "body spill failed; keeping bodies in memory");
            }
        }
    }

    fn get(&self, id: MsgId) -> Option<Bytes> {
        if let Some(b) = self.mem.get(&id) {
            return Some(b.clone());
        }
        let loc = self.spilled.get(&id)?;
        let seg = self.segs.get(&loc.seg)?;
        let mut buf = vec![0u8; loc.len as usize];
        match seg.file.read_exact_at(&mut buf, loc.off) {
            Ok(()) => Some(Bytes::from(buf)),
            Err(e) => {
                tracing::error!(error = %e, id, "body read failed");
                None
            }
        }
    }

    fn ids(&self) -> Vec<MsgId> {
        self.mem
            .keys()
            .chain(self.spilled.keys())
            .copied()
            .collect()
    }

    fn remove(&mut self, id: MsgId) {
        if let Some(old) = self.mem.remove(&id) {
            self.mem_bytes -= old.len();
        } else if let Some(loc) = self.spilled.remove(&id) {
            self.release(loc);
        }
    }

    fn persist_all(&mut self) -> Vec<u8> {
        if let Err(e) = self.spill(0) {
            tracing::error!(error = %e, "body spill before snapshot failed");
        }
        if self.dirty {
            for s in self.segs.values() {
                if let Err(e) = s.file.sync_data() {
                    tracing::error!(error = %e, "body segment sync failed");
                }
            }
            self.dirty = false;
        }
        // Segments drained before the previous snapshot are named by no
        // saved snapshot any more.
        for seg in std::mem::take(&mut self.deletable) {
            if let Err(e) = fs::remove_file(self.seg_path(seg)) {
                tracing::warn!(error = %e, seg, "failed to delete body segment");
            }
        }
        self.deletable = std::mem::take(&mut self.retired);
        let index: Vec<(MsgId, Loc)> = self.spilled.iter().map(|(k, v)| (*k, *v)).collect();
        raft_log::codec::encode(&index).unwrap_or_default()
    }

    fn restore(&mut self, index: &[u8]) -> Result<(), String> {
        let index: Vec<(MsgId, Loc)> = raft_log::codec::decode(index).map_err(|e| e.to_string())?;
        self.restored = true;
        self.mem.clear();
        self.mem_bytes = 0;
        self.spilled = index.into_iter().collect();
        self.segs.clear();
        let mut live: HashMap<u32, u64> = HashMap::new();
        for loc in self.spilled.values() {
            *live.entry(loc.seg).or_default() += 1;
        }
        let on_disk = self.existing_segments().map_err(|e| e.to_string())?;
        for seg in on_disk {
            match live.get(&seg) {
                Some(&n) => {
                    let path = self.seg_path(seg);
                    let file = OpenOptions::new()
                        .read(true)
                        .append(true)
                        .open(&path)
                        .map_err(|e| e.to_string())?;
                    let len = file.metadata().map_err(|e| e.to_string())?.len();
                    self.segs.insert(seg, Segment { file, len, live: n });
                }
                None => {
                    let _ = fs::remove_file(self.seg_path(seg));
                }
            }
        }
        if let Some(missing) = live.keys().find(|s| !self.segs.contains_key(s)) {
            return Err(format!(
                "body segment {missing} named by the snapshot is missing"
            ));
        }
        // New appends go to a fresh segment after every adopted one.
        self.active = self
            .segs
            .keys()
            .max()
            .map_or(self.active, |m| m + 1)
            .max(self.active);
        Ok(())
    }

    fn finish_open(&mut self) {
        if self.restored {
            return;
        }
        for seg in std::mem::take(&mut self.found_at_open) {
            if !self.segs.contains_key(&seg) {
                let _ = fs::remove_file(self.seg_path(seg));
            }
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

    fn ids(&self) -> Vec<MsgId> {
        self.map.keys().copied().collect()
    }

    fn remove(&mut self, id: MsgId) {
        self.map.remove(&id);
    }

    fn persist_all(&mut self) -> Vec<u8> {
        Vec::new()
    }

    fn restore(&mut self, _index: &[u8]) -> Result<(), String> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(id: u64) -> Bytes {
        Bytes::from(vec![id as u8; 4])
    }

    #[test]
    fn spills_past_budget_and_reads_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut b = SegmentBodies::open(dir.path(), 10).expect("open");
        for id in 0..5u64 {
            b.put(id, &body(id));
        }
        assert!(b.mem_bytes <= 10, "kept within budget");
        assert!(!b.spilled.is_empty());
        for id in 0..5u64 {
            assert_eq!(b.get(id), Some(body(id)));
        }
        b.remove(0);
        b.remove(4);
        assert_eq!(b.get(0), None);
        assert_eq!(b.get(4), None);
        assert_eq!(b.spilled.len() + b.mem.len(), 3);
    }

    #[test]
    fn snapshot_index_survives_reopen_and_replay_does_not_duplicate() {
        let dir = tempfile::tempdir().expect("tempdir");
        let index = {
            let mut b = SegmentBodies::open(dir.path(), 1 << 20).expect("open");
            b.put(1, &Bytes::from_static(b"one"));
            b.put(2, &Bytes::from_static(b"two"));
            let index = b.persist_all();
            b.put(3, &Bytes::from_static(b"three"));
            index
        };
        let mut b = SegmentBodies::open(dir.path(), 1 << 20).expect("reopen");
        b.restore(&index).expect("restore");
        assert_eq!(b.get(1), Some(Bytes::from_static(b"one")));
        assert_eq!(
            b.get(3),
            None,
            "bodies after the snapshot come back by log replay"
        );
        b.put(2, &Bytes::from_static(b"two"));
        assert!(
            b.mem.is_empty(),
            "replayed body already on disk is not duplicated"
        );
        b.remove(2);
        assert_eq!(b.get(2), None);
    }

    #[test]
    fn drained_segments_are_deleted_and_orphans_removed_on_restore() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut b = SegmentBodies::open(dir.path(), 1 << 20).expect("open");
        b.put(1, &Bytes::from_static(b"a"));
        let _ = b.persist_all();
        b.active += 1; // the next spill goes to a new segment
        b.put(2, &Bytes::from_static(b"b"));
        let index = b.persist_all();
        b.remove(1);
        assert_eq!(
            b.existing_segments().expect("ls").len(),
            2,
            "the last snapshot still names segment 0"
        );
        let _ = b.persist_all();
        assert_eq!(
            b.existing_segments().expect("ls").len(),
            2,
            "kept until the snapshot after next"
        );
        let _ = b.persist_all();
        assert_eq!(
            b.existing_segments().expect("ls").len(),
            1,
            "segment 0 deleted"
        );
        // A snapshot naming a deleted segment fails loudly.
        let mut c = SegmentBodies::open(dir.path(), 1 << 20).expect("reopen");
        assert!(c.restore(&index).is_err());
        let empty = raft_log::codec::encode(&Vec::<(MsgId, Loc)>::new()).expect("encode");

        c.restore(&empty).expect("restore empty");
        assert!(
            c.existing_segments().expect("ls").is_empty(),
            "orphan segments removed"
        );
    }

    #[test]
    fn segments_of_a_run_without_snapshot_are_removed() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let mut b = SegmentBodies::open(dir.path(), 4).expect("open");
            b.put(1, &Bytes::from_static(b"spilled"));
            assert!(!b.spilled.is_empty());
        }
        let mut b = SegmentBodies::open(dir.path(), 4).expect("reopen");
        assert_eq!(b.existing_segments().expect("ls").len(), 1);
        b.finish_open();
        assert!(b.existing_segments().expect("ls").is_empty());
    }
}
