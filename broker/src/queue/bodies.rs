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
//!
//! Durability (issue 11): a body leaves memory only once written; segments
//! and a new segment's directory entry are synced before the snapshot that
//! indexes them; each indexed body carries its CRC-32, checked on read. A
//! write or sync failure stops the node (as the WAL's, `raft_log::fail_stop`)
//! and fails the snapshot, so the log holding the bodies is never purged.

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
/// A spilled body this big or bigger (bytes) is written from its own buffer, not copied into
/// the spill's batch.
const OWN_WRITE_BYTES: usize = 64 << 10;
/// A segment file is closed for appends past this size (bytes).
const SEGMENT_BYTES: u64 = 64 * 1024 * 1024;

/// Payload storage keyed by message id.
pub trait BodyStore: Send + Sync + 'static {
    /// Stores the encoded message under `id`.
    fn put(&mut self, id: MsgId, payload: &Bytes);
    /// The payload of `id`, if stored and readable (a body that cannot be read back intact is
    /// reported by the store and counted in [`BodyStore::unreadable`]).
    fn get(&self, id: MsgId) -> Option<Bytes>;
    /// Ids of every stored body.
    fn ids(&self) -> Vec<MsgId>;
    /// Deletes the payload of `id` (no-op if absent).
    fn remove(&mut self, id: MsgId);
    /// Makes every stored body independent of the Raft log and returns the
    /// index to keep in the snapshot (called just before a snapshot).
    ///
    /// Errors: a body could not be written or synced; the snapshot must then not be taken
    /// (the Raft log it would let go of is the only durable copy of those bodies).
    fn persist_all(&mut self) -> std::io::Result<Vec<u8>>;
    /// Adopts the index saved by `persist_all` (restore from a snapshot).
    fn restore(&mut self, index: &[u8]) -> Result<(), String>;
    /// Called once the group is open: with no snapshot restored, bodies
    /// left on disk by an earlier run are unreferenced (the whole log is
    /// still there to replay them) and can go.
    fn finish_open(&mut self) {}
    /// Bodies that could not be read back intact since the store opened (missing segment,
    /// short read, checksum mismatch): each was reported when it happened; a queue with any is
    /// unhealthy.
    fn unreadable(&self) -> u64 {
        0
    }
}

/// Where a spilled body is: segment number, byte offset, length, and the CRC-32 (IEEE) of its
/// bytes, checked on every read. `crc` is `None` only for bodies indexed by a snapshot of an
/// earlier version (see [`decode_index`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Loc {
    seg: u32,
    off: u64,
    len: u32,
    crc: Option<u32>,
}

/// A location as snapshots written before body checksums stored it.
#[derive(Debug, Clone, Copy, Deserialize)]
struct LocV1 {
    seg: u32,
    off: u64,
    len: u32,
}

/// First field of a snapshot's body index since body checksums ("QUORUMQ2"); the earlier form
/// was a bare `Vec<(MsgId, LocV1)>`, whose leading length is never this large.
const INDEX_MAGIC: u64 = 0x5155_4F52_554D_5132;

fn encode_index(spilled: &BTreeMap<MsgId, Loc>) -> std::io::Result<Vec<u8>> {
    let index: Vec<(MsgId, Loc)> = spilled.iter().map(|(k, v)| (*k, *v)).collect();
    raft_log::codec::encode(&(INDEX_MAGIC, index)).map_err(std::io::Error::other)
}

/// `e` with the operation and the file it failed on ("write <dir>/0000000003.seg: ..."), so
/// the fail-stop's log line names the file.
fn on_file(what: &str, path: &Path, e: std::io::Error) -> std::io::Error {
    std::io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
}

/// Decodes a body index of either form. Errors: the bytes are neither.
fn decode_index(bytes: &[u8]) -> Result<Vec<(MsgId, Loc)>, String> {
    if let Ok((INDEX_MAGIC, index)) = raft_log::codec::decode::<(u64, Vec<(MsgId, Loc)>)>(bytes) {
        return Ok(index);
    }
    let v1: Vec<(MsgId, LocV1)> = raft_log::codec::decode(bytes).map_err(|e| e.to_string())?;
    Ok(v1
        .into_iter()
        .map(|(id, l)| {
            let loc = Loc {
                seg: l.seg,
                off: l.off,
                len: l.len,
                crc: None,
            };
            (id, loc)
        })
        .collect())
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
    /// A segment file was created since the last sync (the directory needs an fsync).
    dir_dirty: bool,
    /// The directory is known to exist (created lazily, see [`SegmentBodies::create_dir`]).
    dir_created: bool,
    /// Drained segments: no live body, but the last saved snapshot may
    /// still name them, so their files go only at the next snapshot.
    retired: Vec<u32>,
    /// Drained before the previous snapshot: safe to delete now.
    deletable: Vec<u32>,
    /// Segments found on disk at open, before any restore.
    found_at_open: Vec<u32>,
    restored: bool,
    /// Set when a segment write, sync or creation failed: the active segment's length is
    /// unknown, so nothing more is spilled (bodies stay in memory) and no snapshot is taken.
    failed: Option<String>,
    /// Called on such a failure (default [`raft_log::fail_stop`], as for the WAL).
    on_failure: fn(&std::io::Error),
    /// Reads that failed or came back damaged ([`BodyStore::unreadable`]).
    unreadable: std::sync::atomic::AtomicU64,
}

impl SegmentBodies {
    /// Body store in `dir` (created, and its parent directory fsynced so the new entry
    /// survives a power loss, only before the first segment file). Segment files already there belong to the previous run:
    /// they are adopted by [`restore`] when the snapshot names them, and deleted otherwise.
    /// A failed body write or sync stops the node ([`raft_log::fail_stop`]).
    ///
    /// Errors: listing `dir`.
    ///
    /// [`restore`]: BodyStore::restore
    pub fn open(dir: &Path, budget: usize) -> std::io::Result<Self> {
        Self::open_with_failure_hook(dir, budget, raft_log::fail_stop)
    }

    /// [`SegmentBodies::open`] with `on_failure` called instead of the fail-stop (tests).
    pub fn open_with_failure_hook(
        dir: &Path,
        budget: usize,
        on_failure: fn(&std::io::Error),
    ) -> std::io::Result<Self> {
        let mut store = SegmentBodies {
            dir: dir.to_path_buf(),
            mem: BTreeMap::new(),
            mem_bytes: 0,
            budget,
            spilled: BTreeMap::new(),
            segs: BTreeMap::new(),
            active: 0,
            dirty: false,
            dir_dirty: false,
            dir_created: false,
            retired: Vec::new(),
            deletable: Vec::new(),
            found_at_open: Vec::new(),
            restored: false,
            failed: None,
            on_failure,
            unreadable: std::sync::atomic::AtomicU64::new(0),
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
        let entries = match fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            // Not created yet: nothing was ever spilled.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(e),
        };
        for e in entries {
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

    /// Creates the store's directory before its first segment file, and fsyncs
    /// the parent so the new entry survives a power loss. A queue that never
    /// spills never creates one: creating (and syncing) a directory per queue
    /// on open cost every declare a blocking directory fsync on every member
    /// (issue 31).
    fn create_dir(&mut self) -> std::io::Result<()> {
        if self.dir_created {
            return Ok(());
        }
        if !self.dir.exists() {
            fs::create_dir_all(&self.dir)?;
            if let Some(parent) = self.dir.parent() {
                File::open(parent)?.sync_all()?;
            }
        }
        self.dir_created = true;
        Ok(())
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
            self.create_dir()?;
            let file = OpenOptions::new()
                .create(true)
                .read(true)
                .append(true)
                .open(self.seg_path(self.active))?;
            self.dir_dirty = true;
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

    /// Records a write/sync failure: reported once through `on_failure`, and every later
    /// spill or snapshot fails with it.
    fn fail(&mut self, e: std::io::Error) -> std::io::Error {
        tracing::error!(error = %e, dir = %self.dir.display(), "body segment write failed; bodies stay in memory and no snapshot is taken");
        if self.failed.is_none() {
            self.failed = Some(e.to_string());
            (self.on_failure)(&e);
        }
        e
    }

    fn check(&self) -> std::io::Result<()> {
        match &self.failed {
            Some(e) => Err(std::io::Error::other(format!(
                "body store failed earlier: {e}"
            ))),
            None => Ok(()),
        }
    }

    /// Appends the oldest in-memory bodies to the active segment until at
    /// most `keep` bytes stay in memory. Bodies leave memory only once written.
    fn spill(&mut self, keep: usize) -> std::io::Result<()> {
        if self.mem_bytes <= keep {
            return Ok(());
        }
        self.check()?;
        let mut moved = Vec::new();
        let mut left = self.mem_bytes;
        let mut at = 0u64;
        for (&id, payload) in &self.mem {
            if left <= keep {
                break;
            }
            left -= payload.len();
            let crc = crc32fast::hash(payload);
            moved.push((id, at, payload.len() as u32, crc));
            at += payload.len() as u64;
        }
        if let Err(e) = self.active_segment() {
            let path = self.seg_path(self.active);
            return Err(self.fail(on_file("creating", &path, e)));
        }
        let path = self.seg_path(self.active);
        // Small bodies are gathered into one write; a big one is written from its own buffer.
        let written = {
            let file = &mut self.segs.get_mut(&self.active).expect("just made").file;
            let mut batch = Vec::new();
            let mut result = Ok(());
            for (id, _, _, _) in &moved {
                let body = &self.mem[id];
                if body.len() < OWN_WRITE_BYTES {
                    batch.extend_from_slice(body);
                    continue;
                }
                result = file.write_all(&batch).and_then(|()| file.write_all(body));
                batch.clear();
                if result.is_err() {
                    break;
                }
            }
            result.and_then(|()| file.write_all(&batch))
        };
        if let Err(e) = written {
            return Err(self.fail(on_file("write", &path, e)));
        }
        let active = self.segs.get_mut(&self.active).expect("just written");
        let base = active.len;
        active.len += at;
        active.live += moved.len() as u64;
        let seg = self.active;
        for (id, off, len, crc) in moved {
            self.mem.remove(&id);
            self.spilled.insert(
                id,
                Loc {
                    seg,
                    off: base + off,
                    len,
                    crc: Some(crc),
                },
            );
        }
        self.mem_bytes = left;
        self.dirty = true;
        Ok(())
    }

    /// `fdatasync`s the segments written since the last sync, and the directory when a
    /// segment file was created.
    fn sync(&mut self) -> std::io::Result<()> {
        if self.dirty {
            let res = self.segs.iter().try_for_each(|(&id, s)| {
                s.file
                    .sync_data()
                    .map_err(|e| on_file("fdatasync", &self.seg_path(id), e))
            });
            if let Err(e) = res {
                return Err(self.fail(e));
            }
            self.dirty = false;
        }
        if self.dir_dirty {
            if let Err(e) = File::open(&self.dir).and_then(|d| d.sync_all()) {
                let dir = self.dir.clone();
                return Err(self.fail(on_file("fsync of the directory", &dir, e)));
            }
            self.dir_dirty = false;
        }
        Ok(())
    }

    /// Reads a spilled body back and verifies it. Errors: what is wrong, for the report.
    fn read(&self, loc: &Loc) -> Result<Bytes, String> {
        let seg = self
            .segs
            .get(&loc.seg)
            .ok_or_else(|| format!("segment {} is not open", loc.seg))?;
        let mut buf = vec![0u8; loc.len as usize];
        seg.file
            .read_exact_at(&mut buf, loc.off)
            .map_err(|e| format!("segment {} offset {}: {e}", loc.seg, loc.off))?;
        match loc.crc {
            Some(crc) if crc32fast::hash(&buf) != crc => Err(format!(
                "segment {} offset {} length {}: checksum mismatch",
                loc.seg, loc.off, loc.len
            )),
            _ => Ok(Bytes::from(buf)),
        }
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
        if self.mem_bytes > self.budget && self.failed.is_none() {
            // A failure is reported by `spill`; the bodies stay in memory.
            let _ = self.spill(self.budget / 2);
        }
    }

    fn get(&self, id: MsgId) -> Option<Bytes> {
        if let Some(b) = self.mem.get(&id) {
            return Some(b.clone());
        }
        let loc = self.spilled.get(&id)?;
        match self.read(loc) {
            Ok(b) => Some(b),
            Err(e) => {
                self.unreadable
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tracing::error!(dir = %self.dir.display(), id, error = %e,
                    "message body unreadable: the message stays in the queue, undelivered (queue unhealthy)");
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

    fn persist_all(&mut self) -> std::io::Result<Vec<u8>> {
        self.check()?;
        self.spill(0)?;
        self.sync()?;
        // Segments drained before the previous snapshot are named by no
        // saved snapshot any more.
        for seg in std::mem::take(&mut self.deletable) {
            if let Err(e) = fs::remove_file(self.seg_path(seg)) {
                tracing::warn!(error = %e, seg, "failed to delete body segment");
            }
        }
        self.deletable = std::mem::take(&mut self.retired);
        encode_index(&self.spilled)
    }

    fn restore(&mut self, index: &[u8]) -> Result<(), String> {
        let index = decode_index(index)?;
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
                "body segment {} named by the snapshot is missing",
                self.seg_path(*missing).display()
            ));
        }
        if let Some((id, loc)) = self
            .spilled
            .iter()
            .find(|(_, l)| l.off + u64::from(l.len) > self.segs[&l.seg].len)
        {
            return Err(format!(
                "body of message {id} ends past {} ({} bytes): the segment was cut",
                self.seg_path(loc.seg).display(),
                self.segs[&loc.seg].len
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

    fn unreadable(&self) -> u64 {
        self.unreadable.load(std::sync::atomic::Ordering::Relaxed)
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

    fn persist_all(&mut self) -> std::io::Result<Vec<u8>> {
        Ok(Vec::new())
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

    /// Small bodies batched and big ones written from their own buffers, interleaved in one
    /// spill, all read back intact (after a reopen too).
    #[test]
    fn mixed_small_and_big_bodies_spill_and_read_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sizes = [
            10,
            OWN_WRITE_BYTES,
            3,
            OWN_WRITE_BYTES * 2 + 1,
            7,
            OWN_WRITE_BYTES - 1,
        ];
        let make = |id: u64, n: usize| -> Bytes {
            (0..n)
                .map(|i| (i as u64 * 31 + id) as u8)
                .collect::<Vec<u8>>()
                .into()
        };
        let mut b = SegmentBodies::open(dir.path(), OWN_WRITE_BYTES * 8).expect("open");
        for (id, n) in sizes.iter().enumerate() {
            b.put(id as u64, &make(id as u64, *n));
        }
        let index = b.persist_all().expect("spilled");
        assert_eq!(b.spilled.len(), sizes.len(), "everything on disk");
        for (id, n) in sizes.iter().enumerate() {
            assert_eq!(b.get(id as u64), Some(make(id as u64, *n)), "body {id}");
        }
        drop(b);
        let mut b = SegmentBodies::open(dir.path(), OWN_WRITE_BYTES * 8).expect("reopen");
        b.restore(&index).expect("restored");
        for (id, n) in sizes.iter().enumerate() {
            assert_eq!(
                b.get(id as u64),
                Some(make(id as u64, *n)),
                "body {id} after reopen"
            );
        }
    }

    #[test]
    fn snapshot_index_survives_reopen_and_replay_does_not_duplicate() {
        let dir = tempfile::tempdir().expect("tempdir");
        let index = {
            let mut b = SegmentBodies::open(dir.path(), 1 << 20).expect("open");
            b.put(1, &Bytes::from_static(b"one"));
            b.put(2, &Bytes::from_static(b"two"));
            let index = b.persist_all().expect("persist");
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
        b.persist_all().expect("persist");
        b.active += 1; // the next spill goes to a new segment
        b.put(2, &Bytes::from_static(b"b"));
        let index = b.persist_all().expect("persist");
        b.remove(1);
        assert_eq!(
            b.existing_segments().expect("ls").len(),
            2,
            "the last snapshot still names segment 0"
        );
        b.persist_all().expect("persist");
        assert_eq!(
            b.existing_segments().expect("ls").len(),
            2,
            "kept until the snapshot after next"
        );
        b.persist_all().expect("persist");
        assert_eq!(
            b.existing_segments().expect("ls").len(),
            1,
            "segment 0 deleted"
        );
        // A snapshot naming a deleted segment fails loudly.
        let mut c = SegmentBodies::open(dir.path(), 1 << 20).expect("reopen");
        assert!(c.restore(&index).is_err());
        let empty = encode_index(&BTreeMap::new()).expect("encode");

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

    static FAILURES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

    fn count_failure(_: &std::io::Error) {
        FAILURES.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// Issue 11 item 3: a body that cannot be written stays readable from memory, the failure
    /// is reported once (the node's fail-stop in production), and no snapshot index is handed
    /// out, so the Raft log that holds the bodies is not purged.
    #[test]
    fn a_failed_spill_keeps_bodies_in_memory_and_refuses_the_snapshot() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("q");
        let mut b = SegmentBodies::open_with_failure_hook(&dir, 10, count_failure).expect("open");
        // A file where the directory would go: the first spill cannot create its segment.
        std::fs::write(&dir, b"not a directory").expect("block the directory");
        for id in 0..5u64 {
            b.put(id, &body(id));
        }
        assert_eq!(FAILURES.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert!(b.spilled.is_empty(), "nothing claims to be on disk");
        for id in 0..5u64 {
            assert_eq!(
                b.get(id),
                Some(body(id)),
                "body {id} lost by a failed spill"
            );
        }
        let err = b
            .persist_all()
            .expect_err("no snapshot over unwritten bodies")
            .to_string();
        let seg = dir.join("0000000000.seg");
        assert!(
            err.contains(&format!("creating {}", seg.display())),
            "the error names the file: {err}"
        );
        assert_eq!(
            FAILURES.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "reported once"
        );
    }

    /// Opening creates no directory (issue 31: a directory and its parent's fsync per queue
    /// replica made every declare dearer); the first spill creates it.
    #[test]
    fn the_directory_is_created_by_the_first_spill() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("q");
        let mut b = SegmentBodies::open(&dir, 1 << 20).expect("open");
        b.put(2, &body(2));
        assert!(!dir.exists(), "no directory before a body is spilled");
        b.persist_all().expect("persist");
        assert!(dir.is_dir(), "the first spill created the directory");
        assert_eq!(b.get(2), Some(body(2)));
        let reopened = SegmentBodies::open(&dir, 1 << 20).expect("reopen");
        assert!(
            !reopened.found_at_open.is_empty(),
            "the segment is found again"
        );
    }

    /// A spilled body whose bytes changed on disk is not handed out: it is reported and counted.
    #[test]
    fn a_damaged_body_is_reported_not_returned() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut b = SegmentBodies::open(dir.path(), 1 << 20).expect("open");
        b.put(1, &Bytes::from_static(b"first body"));
        b.put(2, &Bytes::from_static(b"second body"));
        b.persist_all().expect("persist");
        let loc = b.spilled[&2];
        let f = OpenOptions::new()
            .write(true)
            .open(b.seg_path(loc.seg))
            .expect("segment");
        f.write_all_at(b"X", loc.off + 3).expect("damage");
        assert_eq!(b.get(1), Some(Bytes::from_static(b"first body")));
        assert_eq!(b.get(2), None);
        assert_eq!(b.unreadable(), 1);
        assert_eq!(b.ids().len(), 2, "the damaged message is still indexed");
    }

    /// A snapshot that names a missing or cut segment refuses to restore, naming the file.
    #[test]
    fn a_missing_or_cut_segment_fails_the_restore_by_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (index, path) = {
            let mut b = SegmentBodies::open(dir.path(), 1 << 20).expect("open");
            b.put(1, &Bytes::from_static(b"body one"));
            let index = b.persist_all().expect("persist");
            (index, b.seg_path(b.spilled[&1].seg))
        };
        let f = OpenOptions::new().write(true).open(&path).expect("segment");
        f.set_len(3).expect("cut");
        let mut b = SegmentBodies::open(dir.path(), 1 << 20).expect("reopen");
        let err = b.restore(&index).expect_err("a cut segment");
        assert!(err.contains(&path.display().to_string()), "{err}");
        std::fs::remove_file(&path).expect("rm");
        let mut b = SegmentBodies::open(dir.path(), 1 << 20).expect("reopen");
        let err = b.restore(&index).expect_err("a missing segment");
        assert!(
            err.contains("missing") && err.contains(&path.display().to_string()),
            "{err}"
        );
    }

    /// Snapshots written before body checksums still restore (their bodies unchecked).
    #[test]
    fn an_index_without_checksums_still_restores() {
        #[derive(Serialize)]
        struct OldLoc {
            seg: u32,
            off: u64,
            len: u32,
        }
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("0000000000.seg"), b"old body").expect("segment");
        let old = raft_log::codec::encode(&vec![(
            7u64,
            OldLoc {
                seg: 0,
                off: 0,
                len: 8,
            },
        )])
        .expect("encode");
        let mut b = SegmentBodies::open(dir.path(), 1 << 20).expect("open");
        b.restore(&old).expect("restore an old index");
        assert_eq!(b.get(7), Some(Bytes::from_static(b"old body")));
        let new = b.persist_all().expect("persist");
        let mut c = SegmentBodies::open(dir.path(), 1 << 20).expect("reopen");
        c.restore(&new).expect("restore the new index");
        assert_eq!(c.get(7), Some(Bytes::from_static(b"old body")));
    }
}
