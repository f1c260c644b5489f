//! `Wal`: the node-wide write-ahead log that holds every group's Raft log entries, votes,
//! committed ids and purge points, in append-only segment files `<dir>/<id:020>.wal`.
//!
//! Why not sled for the log: Raft entries are written once, read back once (apply) and deleted
//! in prefix order — a log, not a tree. sled rewrote pages of large batched entries many times
//! over (measured 25–90× the payload in `write_bytes` for a 100 MB run). Here every byte is
//! written once, with one `fdatasync` per group commit for all groups (Ra's WAL design).
//!
//! Layout and rules (record format in [`record`]):
//! - Records of all groups are appended to the *current* segment; when it reaches
//!   `segment_bytes` a new segment starts. Every segment starts with a `Checkpoint` record: the
//!   vote, committed id, purge point and live index range of every group. Recovery applies
//!   records in file order; a checkpoint trims what earlier segments said, so non-entry records
//!   of older segments are never needed again.
//! - An older segment file is deleted once no live entry points into it and a newer
//!   checkpoint is durable.
//! - Appends only buffer; [`Wal::sync`] (run by the node's `Flusher` thread) writes the buffers,
//!   `fdatasync`s the touched segments (and the directory after a segment was created), then
//!   the flusher completes the waiting callbacks. A torn record therefore only ever covers
//!   writes nobody was told about: recovery cuts the log at the first torn record and drops the
//!   segments after it.
//! - Recently appended entries stay in memory (per group, `group_cache_bytes`) so the state
//!   machine's read-after-commit never touches the disk; older ones are read with `pread`.

mod group;
mod record;

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};

use crate::{codec, GroupId, StoreError};
use group::{GroupLog, Slot};
use record::Kind;

/// Segment count from which a roll also rewrites the small groups pinning the oldest segment.
const COMPACT_AFTER_SEGMENTS: usize = 4;

/// Tuning of the [`Wal`].
#[derive(Debug, Clone, Copy)]
pub struct WalOptions {
    /// A new segment starts once the current one holds this many bytes (default 64 MiB).
    pub segment_bytes: u64,
    /// Bytes of recently appended entries kept in memory per group (default 8 MiB).
    pub group_cache_bytes: usize,
}

impl Default for WalOptions {
    fn default() -> Self {
        WalOptions {
            segment_bytes: 64 << 20,
            group_cache_bytes: 8 << 20,
        }
    }
}

/// The node-wide log. All methods take `&self`; one mutex guards the in-memory state and is
/// never held across I/O other than creating a segment file.
pub(crate) struct Wal {
    dir: PathBuf,
    opts: WalOptions,
    state: Mutex<State>,
}

/// What one record says, without where it is.
#[derive(Debug, Clone, Copy)]
struct Rec<'a> {
    kind: Kind,
    group: GroupId,
    index: u64,
    payload: &'a [u8],
}

/// A group's metadata records, encoded (see [`GroupLog`]'s fields of the same names).
#[derive(Debug, Default)]
pub(crate) struct GroupMeta {
    /// codec(`Vote`).
    pub vote: Option<Vec<u8>>,
    /// codec(`Option<LogId>`).
    pub committed: Option<Vec<u8>>,
    /// codec(`LogId`) of the last purged entry.
    pub purged: Option<Vec<u8>>,
}

/// One group's state as recorded in a checkpoint.
#[derive(Debug, Serialize, Deserialize)]
struct GroupCheckpoint {
    group: GroupId,
    first: u64,
    next: u64,
    vote: Option<Vec<u8>>,
    committed: Option<Vec<u8>>,
    purged: Option<Vec<u8>>,
}

struct Seg {
    file: Arc<File>,
    /// Bytes written to the file (all of them once `sync` returns).
    written: u64,
    /// Live entries pointing into this segment.
    live: usize,
}

/// Bytes appended to a segment but not yet written to its file.
struct Chunk {
    seg: u64,
    at: u64,
    data: Vec<u8>,
}

struct State {
    groups: HashMap<GroupId, GroupLog>,
    segs: BTreeMap<u64, Seg>,
    current: u64,
    current_len: u64,
    pending: Vec<Chunk>,
    dir_dirty: bool,
    /// Highest segment whose checkpoint is on disk; older empty segments may be deleted.
    durable_checkpoint: u64,
    /// Set when a write or sync failed: nothing written since can be made durable.
    failed: Option<String>,
}

fn seg_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("{id:020}.wal"))
}

fn seg_id(name: &str) -> Option<u64> {
    let id = name.strip_suffix(".wal")?;
    (id.len() == 20).then(|| id.parse().ok()).flatten()
}

impl State {
    fn empty() -> State {
        State {
            groups: HashMap::new(),
            segs: BTreeMap::new(),
            current: 0,
            current_len: 0,
            pending: Vec::new(),
            dir_dirty: false,
            durable_checkpoint: 0,
            failed: None,
        }
    }

    fn check(&self) -> Result<(), StoreError> {
        match &self.failed {
            Some(e) => Err(StoreError::Flush(io::Error::other(format!(
                "WAL failed earlier: {e}"
            )))),
            None => Ok(()),
        }
    }

    /// Apply one record to the in-memory state. `at` is the payload's offset in segment `seg`,
    /// `data` its bytes when they should stay cached. Used by appends and by recovery alike.
    fn apply(
        &mut self,
        rec: Rec<'_>,
        seg: u64,
        at: u64,
        data: Option<Arc<[u8]>>,
    ) -> Result<(), StoreError> {
        let Rec {
            kind,
            group,
            index,
            payload,
        } = rec;
        let State { groups, segs, .. } = self;
        let mut on_remove = |s: u64| {
            if let Some(seg) = segs.get_mut(&s) {
                seg.live -= 1;
            }
        };
        match kind {
            Kind::Entry => {
                let slot = Slot {
                    seg,
                    at,
                    len: payload.len() as u32,
                    data,
                };
                groups
                    .entry(group)
                    .or_default()
                    .put(index, slot, &mut on_remove)
                    .map_err(|e| StoreError::corrupt(format!("group {group}: {e}")))?;
                if let Some(s) = segs.get_mut(&seg) {
                    s.live += 1;
                }
            }
            Kind::Truncate => {
                if let Some(g) = groups.get_mut(&group) {
                    g.truncate_from(index, &mut on_remove);
                }
            }
            Kind::Purge => {
                let g = groups.entry(group).or_default();
                g.purge_to(index, &mut on_remove);
                g.purged = Some(payload.to_vec());
            }
            Kind::Vote => groups.entry(group).or_default().vote = Some(payload.to_vec()),
            Kind::Committed => groups.entry(group).or_default().committed = Some(payload.to_vec()),
            Kind::Drop => {
                if let Some(mut g) = groups.remove(&group) {
                    g.clear(&mut on_remove);
                }
            }
            Kind::Rewrite => {
                let g = groups.entry(group).or_default();
                g.clear(&mut on_remove);
                let (mut pos, mut index, mut added) = (0usize, index, 0usize);
                while pos < payload.len() {
                    let len = payload
                        .get(pos..pos + 4)
                        .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize)
                        .filter(|len| pos + 4 + len <= payload.len())
                        .ok_or_else(|| {
                            StoreError::corrupt(format!("group {group}: bad rewrite record"))
                        })?;
                    let start = pos + 4;
                    let slot = Slot {
                        seg,
                        at: at + start as u64,
                        len: len as u32,
                        data: data
                            .as_ref()
                            .map(|d| Arc::<[u8]>::from(&d[start..start + len])),
                    };
                    g.put(index, slot, &mut on_remove)
                        .map_err(|e| StoreError::corrupt(format!("group {group}: {e}")))?;
                    added += 1;
                    index += 1;
                    pos = start + len;
                }
                if let Some(s) = segs.get_mut(&seg) {
                    s.live += added;
                }
            }
            Kind::Checkpoint => {
                let list: Vec<GroupCheckpoint> = codec::decode(payload)?;
                let listed: HashMap<GroupId, GroupCheckpoint> =
                    list.into_iter().map(|c| (c.group, c)).collect();
                groups.retain(|id, g| {
                    let keep = listed.contains_key(id);
                    if !keep {
                        g.clear(&mut on_remove);
                    }
                    keep
                });
                for (id, c) in listed {
                    let g = groups.entry(id).or_default();
                    if c.first > 0 {
                        g.purge_to(c.first - 1, &mut on_remove);
                    }
                    g.truncate_from(c.next, &mut on_remove);
                    g.vote = c.vote;
                    g.committed = c.committed;
                    g.purged = c.purged;
                }
            }
        }
        Ok(())
    }

    /// Frame a record into the current segment's buffer and apply it. Returns the payload's
    /// location.
    fn push(
        &mut self,
        dir: &Path,
        opts: &WalOptions,
        rec: Rec<'_>,
        cache: bool,
    ) -> Result<(), StoreError> {
        let Rec {
            kind,
            group,
            index,
            payload,
        } = rec;
        if kind == Kind::Entry {
            if let Some(g) = self.groups.get(&group) {
                g.can_put(index)
                    .map_err(|e| StoreError::corrupt(format!("group {group}: {e}")))?;
            }
        }
        if self.current_len >= opts.segment_bytes {
            self.roll(dir)?;
            self.compact_oldest(opts)?;
        }
        let at = self.frame(kind, group, index, payload);
        let data = cache.then(|| Arc::<[u8]>::from(payload));
        self.apply(rec, self.current, at, data)
    }

    /// Append the framed record to the pending buffer of the current segment; returns the
    /// payload's offset in the segment.
    fn frame(&mut self, kind: Kind, group: GroupId, index: u64, payload: &[u8]) -> u64 {
        let (seg, at) = (self.current, self.current_len);
        let chunk = match self.pending.last_mut() {
            Some(c) if c.seg == seg => c,
            _ => {
                self.pending.push(Chunk {
                    seg,
                    at,
                    data: Vec::new(),
                });
                self.pending.last_mut().expect("just pushed")
            }
        };
        let before = chunk.data.len();
        let payload_in_chunk = record::frame(&mut chunk.data, kind, group, index, payload);
        self.current_len += (chunk.data.len() - before) as u64;
        at + (payload_in_chunk - before) as u64
    }

    /// Rewrite into the current segment every small group that still has entries in the oldest
    /// segment, once there are at least [`COMPACT_AFTER_SEGMENTS`] segments, so an idle queue's
    /// few unpurged entries cannot pin segments full of other groups' drained entries. A group
    /// is small when its entries total at most a quarter segment; larger groups are busy and
    /// their snapshots purge them. Each group is rewritten as one record (all or nothing).
    fn compact_oldest(&mut self, opts: &WalOptions) -> Result<(), StoreError> {
        if self.segs.len() < COMPACT_AFTER_SEGMENTS {
            return Ok(());
        }
        let Some(&oldest) = self.segs.keys().next() else {
            return Ok(());
        };
        if oldest >= self.current {
            return Ok(());
        }
        let small = opts.segment_bytes / 4;
        let pinning: Vec<GroupId> = self
            .groups
            .iter()
            .filter(|(_, g)| {
                g.slots().any(|(_, s)| s.seg == oldest)
                    && g.slots().map(|(_, s)| u64::from(s.len)).sum::<u64>() <= small
            })
            .map(|(&id, _)| id)
            .collect();
        for group in pinning {
            let (first, payload) = {
                let g = &self.groups[&group];
                let mut payload = Vec::new();
                for (_, s) in g.slots() {
                    payload.extend_from_slice(&s.len.to_le_bytes());
                    match &s.data {
                        Some(d) => payload.extend_from_slice(d),
                        None => {
                            // Uncached bytes are always written (eviction waits for that).
                            let file = &self
                                .segs
                                .get(&s.seg)
                                .ok_or_else(|| StoreError::corrupt("entry in a missing segment"))?
                                .file;
                            let at = payload.len();
                            payload.resize(at + s.len as usize, 0);
                            file.read_exact_at(&mut payload[at..], s.at)
                                .map_err(StoreError::Flush)?;
                        }
                    }
                }
                (g.first(), payload)
            };
            tracing::debug!(
                group,
                segment = oldest,
                bytes = payload.len(),
                "WAL: rewriting a small group out of the oldest segment"
            );
            let rec = Rec {
                kind: Kind::Rewrite,
                group,
                index: first,
                payload: &payload,
            };
            let at = self.frame(rec.kind, group, first, &payload);
            // Keep the bytes cached: the new location is unwritten until the next sync.
            let data = Some(Arc::<[u8]>::from(&payload[..]));
            self.apply(rec, self.current, at, data)?;
        }
        Ok(())
    }

    /// Start a new segment (file created now, made durable by the next sync) that opens with a
    /// checkpoint of every group.
    fn roll(&mut self, dir: &Path) -> Result<(), StoreError> {
        let id = self
            .segs
            .keys()
            .next_back()
            .map_or(0, |last| last + 1)
            .max(self.current + 1);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(seg_path(dir, id))
            .map_err(StoreError::Flush)?;
        self.segs.insert(
            id,
            Seg {
                file: Arc::new(file),
                written: 0,
                live: 0,
            },
        );
        self.current = id;
        self.current_len = 0;
        self.dir_dirty = true;
        let list: Vec<GroupCheckpoint> = self
            .groups
            .iter()
            .filter(|(_, g)| !g.is_blank())
            .map(|(&group, g)| GroupCheckpoint {
                group,
                first: g.first(),
                next: g.next(),
                vote: g.vote.clone(),
                committed: g.committed.clone(),
                purged: g.purged.clone(),
            })
            .collect();
        let payload = codec::encode(&list)?;
        self.frame(Kind::Checkpoint, 0, 0, &payload);
        Ok(())
    }
}

impl Wal {
    /// Open (or create) the WAL in `dir`: replay every segment, cut a torn tail, start a fresh
    /// segment with a checkpoint, make it durable and delete the segments nobody needs.
    ///
    /// Errors: I/O as [`StoreError::Flush`]; [`StoreError::Corrupt`]/[`StoreError::Decode`] if a
    /// complete (CRC-valid) record contradicts the log (e.g. an entry that leaves a hole).
    pub fn open(dir: &Path, opts: WalOptions) -> Result<Wal, StoreError> {
        fs::create_dir_all(dir).map_err(StoreError::Flush)?;
        let mut ids: Vec<u64> = fs::read_dir(dir)
            .map_err(StoreError::Flush)?
            .filter_map(|e| e.ok()?.file_name().to_str().and_then(seg_id))
            .collect();
        ids.sort_unstable();
        let mut st = State::empty();
        let mut ended = false;
        for id in ids {
            let path = seg_path(dir, id);
            if ended {
                tracing::warn!(segment = %path.display(), "deleting WAL segment after a torn record");
                fs::remove_file(&path).map_err(StoreError::Flush)?;
                continue;
            }
            let bytes = fs::read(&path).map_err(StoreError::Flush)?;
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .map_err(StoreError::Flush)?;
            st.segs.insert(
                id,
                Seg {
                    file: Arc::new(file),
                    written: 0,
                    live: 0,
                },
            );
            let mut at = 0;
            loop {
                match record::parse(&bytes, at) {
                    Ok(None) => break,
                    Ok(Some(r)) if at > 0 || r.kind == Kind::Checkpoint => {
                        let rec = Rec {
                            kind: r.kind,
                            group: r.group,
                            index: r.index,
                            payload: r.payload,
                        };
                        st.apply(rec, id, r.payload_at as u64, None)?;
                        at = r.next;
                    }
                    _ => {
                        tracing::warn!(segment = %path.display(), offset = at, len = bytes.len(),
                            "torn WAL record: the log ends here (unacknowledged writes)");
                        ended = true;
                        break;
                    }
                }
            }
            let seg = st.segs.get_mut(&id).expect("inserted above");
            if ended {
                seg.file.set_len(at as u64).map_err(StoreError::Flush)?;
                seg.file.sync_all().map_err(StoreError::Flush)?;
            }
            seg.written = at as u64;
            st.current = id;
        }
        let wal = Wal {
            dir: dir.to_path_buf(),
            opts,
            state: Mutex::new(st),
        };
        wal.lock().roll(dir)?;
        wal.sync().map_err(StoreError::Flush)?;
        Ok(wal)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is only mutated by infallible bookkeeping after checks; a panic elsewhere
        // while holding the lock leaves it consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Append `entries` (log index, codec(`Entry`)) of `group`; readable at once, durable after
    /// the next [`Wal::sync`]. Errors: [`StoreError::Corrupt`] if the indexes leave a hole;
    /// [`StoreError::Flush`] if the WAL failed earlier or a segment file cannot be created.
    pub fn append(&self, group: GroupId, entries: Vec<(u64, Vec<u8>)>) -> Result<(), StoreError> {
        let mut st = self.lock();
        st.check()?;
        for (index, data) in entries {
            let rec = Rec {
                kind: Kind::Entry,
                group,
                index,
                payload: &data,
            };
            st.push(&self.dir, &self.opts, rec, true)?;
        }
        let State { groups, segs, .. } = &mut *st;
        if let Some(g) = groups.get_mut(&group) {
            g.evict(self.opts.group_cache_bytes, |s| {
                segs.get(&s.seg)
                    .is_some_and(|seg| seg.written >= s.at + u64::from(s.len))
            });
        }
        Ok(())
    }

    /// Remove the entries `>= index` of `group` (durable after the next sync).
    pub fn truncate(&self, group: GroupId, index: u64) -> Result<(), StoreError> {
        self.record(Kind::Truncate, group, index, &[])
    }

    /// Remove the entries `<= index` of `group`; `log_id` = codec(`LogId`) of entry `index`.
    pub fn purge(&self, group: GroupId, index: u64, log_id: &[u8]) -> Result<(), StoreError> {
        self.record(Kind::Purge, group, index, log_id)
    }

    /// Record the vote (codec(`Vote`)) of `group`.
    pub fn set_vote(&self, group: GroupId, vote: &[u8]) -> Result<(), StoreError> {
        self.record(Kind::Vote, group, 0, vote)
    }

    /// Record the committed id (codec(`Option<LogId>`)) of `group`.
    pub fn set_committed(&self, group: GroupId, committed: &[u8]) -> Result<(), StoreError> {
        self.record(Kind::Committed, group, 0, committed)
    }

    /// Delete `group` with everything it had.
    pub fn drop_group(&self, group: GroupId) -> Result<(), StoreError> {
        self.record(Kind::Drop, group, 0, &[])
    }

    fn record(
        &self,
        kind: Kind,
        group: GroupId,
        index: u64,
        payload: &[u8],
    ) -> Result<(), StoreError> {
        let mut st = self.lock();
        st.check()?;
        let rec = Rec {
            kind,
            group,
            index,
            payload,
        };
        st.push(&self.dir, &self.opts, rec, false)
    }

    /// The encoded entries `start..=end` of `group` that are held (a contiguous run; indexes
    /// outside the held range are skipped). Errors: [`StoreError::Flush`] if a `pread` fails.
    pub fn read(&self, group: GroupId, start: u64, end: u64) -> Result<Vec<Arc<[u8]>>, StoreError> {
        enum Src {
            Mem(Arc<[u8]>),
            Disk(Arc<File>, u64, u32),
        }
        let srcs: Vec<Src> = {
            let st = self.lock();
            let Some(g) = st.groups.get(&group) else {
                return Ok(Vec::new());
            };
            let (lo, hi) = (start.max(g.first()), end.min(g.next().saturating_sub(1)));
            if g.len() == 0 || lo > hi {
                return Ok(Vec::new());
            }
            (lo..=hi)
                .map(|i| {
                    let s = g.get(i).expect("index within the held range");
                    match (&s.data, st.segs.get(&s.seg)) {
                        (Some(d), _) => Ok(Src::Mem(d.clone())),
                        (None, Some(seg)) => Ok(Src::Disk(seg.file.clone(), s.at, s.len)),
                        (None, None) => Err(StoreError::corrupt(format!(
                            "group {group} entry {i} points into missing segment {}",
                            s.seg
                        ))),
                    }
                })
                .collect::<Result<_, _>>()?
        };
        srcs.into_iter()
            .map(|s| match s {
                Src::Mem(d) => Ok(d),
                Src::Disk(f, at, len) => {
                    let mut buf = vec![0; len as usize];
                    f.read_exact_at(&mut buf, at).map_err(StoreError::Flush)?;
                    Ok(buf.into())
                }
            })
            .collect()
    }

    /// The last entry of `group`, encoded, if any.
    pub fn last(&self, group: GroupId) -> Result<Option<Arc<[u8]>>, StoreError> {
        let next = self.lock().groups.get(&group).map_or(0, |g| g.next());
        match next.checked_sub(1) {
            Some(i) => Ok(self.read(group, i, i)?.pop()),
            None => Ok(None),
        }
    }

    /// The vote, committed id and purge point of `group`, encoded.
    pub fn meta(&self, group: GroupId) -> GroupMeta {
        let st = self.lock();
        match st.groups.get(&group) {
            Some(g) => GroupMeta {
                vote: g.vote.clone(),
                committed: g.committed.clone(),
                purged: g.purged.clone(),
            },
            None => GroupMeta::default(),
        }
    }

    /// Number of entries `group` holds.
    pub fn len(&self, group: GroupId) -> usize {
        self.lock().groups.get(&group).map_or(0, |g| g.len())
    }

    /// Groups with entries or metadata.
    pub fn groups(&self) -> Vec<GroupId> {
        let st = self.lock();
        st.groups
            .iter()
            .filter(|(_, g)| !g.is_blank())
            .map(|(&id, _)| id)
            .collect()
    }

    /// Number of segment files (for tests and metrics).
    pub fn segments(&self) -> usize {
        self.lock().segs.len()
    }

    /// Write every buffered record, `fdatasync` the touched segments (and the directory after a
    /// segment was created), then delete segment files nobody needs. Called by the node's
    /// flusher thread only (one sync at a time). After a failure every later append fails too:
    /// buffered records were lost, so nothing after them may be acknowledged.
    ///
    /// Errors: the first I/O error of the round.
    pub fn sync(&self) -> io::Result<()> {
        let (chunks, files, dir_dirty, doomed) = {
            let mut st = self.lock();
            if let Some(e) = &st.failed {
                return Err(io::Error::other(format!("WAL failed earlier: {e}")));
            }
            let chunks = std::mem::take(&mut st.pending);
            let mut files: Vec<(u64, Arc<File>)> = Vec::new();
            for c in &chunks {
                if files.last().is_none_or(|(id, _)| *id != c.seg) {
                    files.push((c.seg, st.segs[&c.seg].file.clone()));
                }
            }
            // Segments that no live entry points into, older than the newest checkpoint that is
            // durable once this round's writes are: the records that emptied them are in
            // `chunks` or were written before, so deleting them after the writes loses nothing.
            let newest = files
                .last()
                .map_or(0, |(id, _)| *id)
                .max(st.durable_checkpoint);
            let doomed: Vec<u64> = st
                .segs
                .range(..newest.min(st.current))
                .filter(|(_, s)| s.live == 0)
                .map(|(&id, _)| id)
                .collect();
            (chunks, files, std::mem::take(&mut st.dir_dirty), doomed)
        };
        let io = || -> io::Result<()> {
            for c in &chunks {
                let (_, f) = files
                    .iter()
                    .find(|(id, _)| *id == c.seg)
                    .expect("collected above");
                f.write_all_at(&c.data, c.at)?;
            }
            for (_, f) in &files {
                f.sync_data()?;
            }
            if dir_dirty {
                File::open(&self.dir)?.sync_all()?;
            }
            Ok(())
        };
        let res = io();
        {
            let mut st = self.lock();
            if let Err(e) = &res {
                st.failed = Some(e.to_string());
                return res;
            }
            for c in &chunks {
                if let Some(s) = st.segs.get_mut(&c.seg) {
                    s.written = s.written.max(c.at + c.data.len() as u64);
                }
            }
            if let Some((last, _)) = files.last() {
                st.durable_checkpoint = st.durable_checkpoint.max(*last);
            }
            for id in &doomed {
                st.segs.remove(id);
            }
        }
        for id in doomed {
            let path = seg_path(&self.dir, id);
            if let Err(e) = fs::remove_file(&path) {
                tracing::warn!(segment = %path.display(), error = %e, "could not delete drained WAL segment");
            }
        }
        Ok(())
    }
}
