//! The WAL's in-memory state: every group's index ([`GroupLog`]), the segment files, the
//! records not yet written, and how each record changes them ([`State::apply`], shared by
//! appends and recovery). No I/O except creating a segment file and reading entries back
//! for compaction; the file writes and syncs are [`super::Wal::sync`]'s.

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::group::{EntryBytes, GroupLog, Slot};
use super::record::{self, Kind};
use super::runway::{Runway, RUNWAY_BYTES};
use super::WalOptions;
use crate::{codec, GroupId, StoreError};

/// Segment count from which a roll also rewrites the small groups pinning the oldest segments
/// ([`State::compact_old_segments`]).
const COMPACT_AFTER_SEGMENTS: usize = 4;

/// What one record says, without where it is.
#[derive(Debug, Clone, Copy)]
pub(super) struct Rec<'a> {
    pub kind: Kind,
    pub group: GroupId,
    pub index: u64,
    pub payload: &'a [u8],
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

pub(super) struct Seg {
    pub file: Arc<File>,
    /// Bytes written to the file (all of them once `sync` returns).
    pub written: u64,
    /// Live entries pointing into this segment.
    pub live: usize,
}

/// Bytes appended to a segment but not yet written to its file.
pub(super) struct Chunk {
    pub seg: u64,
    pub at: u64,
    pub data: Vec<u8>,
    /// A big record's payload, written from the entry's own (cached) bytes after `data`
    /// instead of copied into it: a 100 MiB body is not held a second time until the sync.
    pub shared: Option<EntryBytes>,
}

impl Chunk {
    /// Bytes the chunk covers in its segment.
    pub fn len(&self) -> u64 {
        (self.data.len() + self.shared.as_ref().map_or(0, |b| b.len())) as u64
    }
}

/// Record payloads of at least this many bytes are written from their own buffer
/// ([`Chunk::shared`]) rather than copied into the pending bytes.
pub(super) const SHARED_PAYLOAD_BYTES: usize = 256 * 1024;

pub(super) struct State {
    pub groups: HashMap<GroupId, GroupLog>,
    pub segs: BTreeMap<u64, Seg>,
    /// The segment appends go to.
    pub current: u64,
    /// Logical length of the current segment (written + pending), in bytes.
    pub current_len: u64,
    /// The zeros ahead of the current segment's records.
    pub runway: Runway,
    pub pending: Vec<Chunk>,
    /// A segment file was created since the last sync (the directory needs an fsync).
    pub dir_dirty: bool,
    /// Highest segment whose checkpoint is on disk; older empty segments may be deleted.
    pub durable_checkpoint: u64,
    /// Set when a write or sync failed: nothing written since can be made durable.
    pub failed: Option<String>,
    /// The current sync round's [`Kind::Mark`] is framed (cleared when `sync` takes `pending`).
    pub marked: bool,
    /// Ordinal of the last [`Kind::Mark`] framed or replayed.
    pub rounds: u64,
    /// This incarnation's mark nonce (random per open).
    pub nonce: u64,
    /// Records are being replayed by recovery (`Wal::open`), not appended.
    pub replaying: bool,
    /// During replay: each group's `[first, next)` as the last checkpoint declared it and the
    /// records since changed it. At the end of recovery every group must hold exactly this
    /// range (the entries of deleted segments are dead by then); a shortfall means a segment
    /// with live entries is missing.
    pub ranges: HashMap<GroupId, (u64, u64)>,
}

/// A nonce no client can predict: std's per-process random hash keys over the clock.
fn random_nonce() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

/// Path of segment `id` in `dir`.
pub(super) fn seg_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(super::seg_file_name(id))
}

/// Segment id of a file name, if it is a segment's.
pub(super) fn seg_id(name: &str) -> Option<u64> {
    let id = name.strip_suffix(".wal")?;
    (id.len() == 20).then(|| id.parse().ok()).flatten()
}

impl State {
    pub(super) fn empty() -> State {
        State {
            groups: HashMap::new(),
            segs: BTreeMap::new(),
            current: 0,
            current_len: 0,
            runway: Runway::none(),
            pending: Vec::new(),
            dir_dirty: false,
            durable_checkpoint: 0,
            failed: None,
            marked: false,
            rounds: 0,
            nonce: random_nonce(),
            replaying: false,
            ranges: HashMap::new(),
        }
    }

    pub(super) fn check(&self) -> Result<(), StoreError> {
        match &self.failed {
            Some(e) => Err(StoreError::Flush(io::Error::other(format!(
                "WAL failed earlier: {e}"
            )))),
            None => Ok(()),
        }
    }

    /// Apply one record to the in-memory state. `at` is the payload's offset in segment `seg`,
    /// `data` its bytes when they should stay cached. Used by appends and by recovery alike.
    pub(super) fn apply(
        &mut self,
        rec: Rec<'_>,
        seg: u64,
        at: u64,
        data: Option<EntryBytes>,
    ) -> Result<(), StoreError> {
        let Rec {
            kind,
            group,
            index,
            payload,
        } = rec;
        if kind == Kind::Mark {
            self.rounds = self.rounds.max(index);
            return Ok(());
        }
        if self.replaying {
            self.track_range(rec);
        }
        let replaying = self.replaying;
        let State {
            groups,
            segs,
            ranges,
            ..
        } = self;
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
                let g = groups.entry(group).or_default();
                if replaying {
                    g.rebase_for_replay(index, &mut on_remove);
                }
                g.put(index, slot, &mut on_remove)
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
                        data: data.as_ref().map(|d| d.slice(start..start + len)),
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
            Kind::Mark => {} // handled above
            Kind::Checkpoint => {
                let list: Vec<GroupCheckpoint> = codec::decode(payload)?;
                if replaying {
                    *ranges = list.iter().map(|c| (c.group, (c.first, c.next))).collect();
                }
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

    /// Replay only: how `rec` changes its group's `[first, next)` (see [`State::ranges`]),
    /// following [`GroupLog`]'s rules without the entries themselves.
    fn track_range(&mut self, rec: Rec<'_>) {
        let Rec {
            kind,
            group,
            index,
            payload,
        } = rec;
        let ranges = &mut self.ranges;
        match kind {
            // Set from the checkpoint `apply` decodes anyway.
            Kind::Checkpoint => {}
            Kind::Entry => {
                let r = ranges.entry(group).or_insert((index, index));
                if r.0 == r.1 || index < r.0 {
                    r.0 = index;
                }
                r.1 = index + 1;
            }
            Kind::Truncate => {
                if let Some(r) = ranges.get_mut(&group) {
                    r.1 = r.1.min(index.max(r.0));
                }
            }
            Kind::Purge => {
                let r = ranges.entry(group).or_insert((index + 1, index + 1));
                if index >= r.0 {
                    r.0 = index + 1;
                    r.1 = r.1.max(r.0);
                }
            }
            Kind::Drop => {
                ranges.remove(&group);
            }
            Kind::Rewrite => {
                let (mut pos, mut n) = (0usize, 0u64);
                while let Some(len) = payload.get(pos..pos + 4) {
                    pos += 4 + u32::from_le_bytes(len.try_into().expect("4 bytes")) as usize;
                    n += 1;
                }
                ranges.insert(group, (index, index + n));
            }
            Kind::Vote | Kind::Committed | Kind::Mark => {}
        }
    }

    /// End of replay: every group holds exactly the range the log declares
    /// ([`State::ranges`]). Errors: [`StoreError::Corrupt`] naming the first group that does
    /// not (a segment holding live entries is missing).
    pub(super) fn check_ranges(&self) -> Result<(), StoreError> {
        let held = |g: &GroupLog| (g.len() > 0).then(|| (g.first(), g.next()));
        for (id, g) in &self.groups {
            let want = self.ranges.get(id).copied().filter(|r| r.0 < r.1);
            if held(g) != want {
                return Err(StoreError::corrupt(format!(
                    "group {id}: the log declares entries {want:?} but recovery found {:?}: \
                     a segment file holding live entries is missing",
                    held(g)
                )));
            }
        }
        if let Some((id, r)) = self
            .ranges
            .iter()
            .find(|(id, r)| r.0 < r.1 && !self.groups.contains_key(id))
        {
            return Err(StoreError::corrupt(format!(
                "group {id}: the log declares entries {r:?} but recovery found none: \
                 a segment file holding live entries is missing"
            )));
        }
        Ok(())
    }

    /// Frame a record into the current segment's buffer and apply it; `data` (the payload's
    /// bytes) stays in the read cache, `None` for records that are not entries.
    pub(super) fn push(
        &mut self,
        dir: &Path,
        opts: &WalOptions,
        rec: Rec<'_>,
        data: Option<EntryBytes>,
    ) -> Result<(), StoreError> {
        let limit = opts.max_record_bytes.min(record::MAX_PAYLOAD_BYTES);
        if rec.payload.len() > limit {
            return Err(StoreError::TooLarge(format!(
                "group {} entry {}: {} bytes, at most {limit} accepted",
                rec.group,
                rec.index,
                rec.payload.len(),
            )));
        }
        if rec.kind == Kind::Entry {
            if let Some(g) = self.groups.get(&rec.group) {
                g.can_put(rec.index)
                    .map_err(|e| StoreError::corrupt(format!("group {}: {e}", rec.group)))?;
            }
        }
        if self.current_len >= opts.segment_bytes {
            if let Err(e) = self
                .roll(dir, opts)
                .and_then(|()| self.compact_old_segments(dir, opts))
            {
                if let StoreError::Flush(io) = &e {
                    (opts.on_failure)(io);
                }
                return Err(e);
            }
        }
        if let Err(e) = self.keep_runway(rec.payload.len() as u64, runway(opts)) {
            let e = super::on_file("preallocating", &seg_path(dir, self.current), e);
            (opts.on_failure)(&e);
            return Err(StoreError::Flush(e));
        }
        let at = self.frame_with(&rec, data.as_ref());
        self.apply(rec, self.current, at, data)
    }

    /// Extend the current segment's runway if fewer than half of `runway` bytes of zeros are
    /// left past the record about to be framed (`payload` bytes). Errors: write or
    /// `fallocate` failures other than a refusal.
    fn keep_runway(&mut self, payload: u64, runway: u64) -> io::Result<()> {
        let end = self.current_len
            + (record::HEADER_BYTES * 2 + record::MARK_PAYLOAD_BYTES) as u64
            + payload;
        let Some(seg) = self.segs.get(&self.current) else {
            return Ok(());
        };
        self.runway
            .keep(&seg.file, end, runway, self.current_len, self.rounds)
    }

    /// Append the framed record to the pending buffer of the current segment; returns the
    /// payload's offset in the segment. The first record of a sync round other than a
    /// segment's checkpoint is preceded by the round's [`Kind::Mark`].
    pub(super) fn frame(&mut self, rec: &Rec<'_>) -> u64 {
        self.frame_with(rec, None)
    }

    /// [`State::frame`]; when `shared` holds `rec`'s payload and it is big
    /// ([`SHARED_PAYLOAD_BYTES`]), only the header is copied and the payload is written from
    /// `shared` itself.
    fn frame_with(&mut self, rec: &Rec<'_>, shared: Option<&EntryBytes>) -> u64 {
        if !self.marked && rec.kind != Kind::Checkpoint {
            self.marked = true;
            self.rounds += 1;
            let nonce = self.nonce.to_le_bytes();
            self.frame(&Rec {
                kind: Kind::Mark,
                group: 0,
                index: self.rounds,
                payload: &nonce,
            });
        }
        let (seg, at) = (self.current, self.current_len);
        let chunk = match self.pending.last_mut() {
            Some(c) if c.seg == seg && c.shared.is_none() => c,
            _ => {
                self.pending.push(Chunk {
                    seg,
                    at,
                    data: Vec::new(),
                    shared: None,
                });
                self.pending.last_mut().expect("just pushed")
            }
        };
        let before = chunk.data.len();
        let shared = shared
            .filter(|b| b.len() >= SHARED_PAYLOAD_BYTES && b.as_ptr() == rec.payload.as_ptr());
        let payload_in_chunk = match shared {
            Some(b) => {
                let p = record::frame_header(
                    &mut chunk.data,
                    rec.kind,
                    rec.group,
                    rec.index,
                    rec.payload,
                );
                chunk.shared = Some(b.clone());
                p
            }
            None => record::frame(&mut chunk.data, rec.kind, rec.group, rec.index, rec.payload),
        };
        self.current_len += chunk.len() - before as u64;
        at + (payload_in_chunk - before) as u64
    }

    /// Free the oldest segments for deletion, once there are at least
    /// [`COMPACT_AFTER_SEGMENTS`]: going from the oldest segment up, every small group that
    /// still has entries in it is rewritten into the current segment, so an idle queue's few
    /// unpurged entries cannot pin segments full of other groups' drained entries. It stops at
    /// the first segment a busy group holds (only a prefix of segments is ever deleted; busy
    /// groups are purged by their snapshots, and one that is not is reported), once fewer than
    /// [`COMPACT_AFTER_SEGMENTS`] segments would be left, or after rewriting a segment's worth
    /// of bytes. A group is small when its entries total at most a quarter segment. Each group
    /// is rewritten as one record (all or nothing).
    ///
    /// Runs at every roll, including the one that opens the log: a node restarted often (the
    /// fault suite kills one every few minutes) starts a new segment each time and may never
    /// fill one, and its log grew a segment per restart, none ever deleted, until the disk was
    /// full.
    pub(super) fn compact_old_segments(
        &mut self,
        dir: &Path,
        opts: &WalOptions,
    ) -> Result<(), StoreError> {
        let small = opts.segment_bytes / 4;
        let old: Vec<u64> = self.segs.range(..self.current).map(|(&id, _)| id).collect();
        let mut left = self.segs.len();
        let mut rewritten = 0u64;
        for seg in old {
            if left < COMPACT_AFTER_SEGMENTS || rewritten >= opts.segment_bytes {
                break;
            }
            let mut pinning: Vec<GroupId> = Vec::new();
            let mut busy: Vec<(u64, GroupId, usize, u64, u64)> = Vec::new();
            for (&id, g) in &self.groups {
                if !g.slots().any(|(_, s)| s.seg == seg) {
                    continue;
                }
                let bytes = g.slots().map(|(_, s)| u64::from(s.len)).sum::<u64>();
                if bytes <= small {
                    pinning.push(id);
                } else {
                    busy.push((bytes, id, g.len(), g.first(), g.next()));
                }
            }
            if !busy.is_empty() {
                // Busy groups are left to their snapshots' purges; one still here after
                // COMPACT_AFTER_SEGMENTS rolls is not being purged, and holds the disk.
                busy.sort_unstable_by(|a, b| b.cmp(a));
                let top: Vec<String> = busy
                    .iter()
                    .take(5)
                    .map(|(bytes, id, n, first, next)| {
                        format!("group {id}: {n} entries [{first}, {next}), {bytes} bytes")
                    })
                    .collect();
                tracing::warn!(
                    segments = self.segs.len(),
                    oldest = seg,
                    groups = busy.len(),
                    "WAL: an old segment is held by groups too large to rewrite, whose \
                     snapshots have not purged them: {}",
                    top.join("; ")
                );
                break;
            }
            for group in pinning {
                rewritten += self.rewrite_group(dir, group, seg)?;
            }
            left -= 1;
        }
        Ok(())
    }

    /// Rewrite every entry of `group` into the current segment as one [`Kind::Rewrite`]
    /// record (to free `seg`); returns the bytes rewritten. Errors: a read of an uncached
    /// entry failed, or a segment it points into is missing.
    fn rewrite_group(&mut self, dir: &Path, group: GroupId, seg: u64) -> Result<u64, StoreError> {
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
                        file.read_exact_at(&mut payload[at..], s.at).map_err(|e| {
                            StoreError::Flush(super::on_file("read", &seg_path(dir, s.seg), e))
                        })?;
                    }
                }
            }
            (g.first(), payload)
        };
        tracing::debug!(
            group,
            segment = seg,
            bytes = payload.len(),
            "WAL: rewriting a small group out of an old segment"
        );
        let n = payload.len() as u64;
        // Kept cached: the new location is unwritten until the next sync.
        let payload = bytes::Bytes::from(payload);
        let rec = Rec {
            kind: Kind::Rewrite,
            group,
            index: first,
            payload: &payload,
        };
        let at = self.frame(&rec);
        self.apply(rec, self.current, at, Some(payload.clone()))?;
        Ok(n)
    }

    /// Start a new segment (file created now, made durable by the next sync) that opens with a
    /// checkpoint of every group.
    ///
    /// The new file is preallocated a runway ahead (see [`preallocate`]); the segment it
    /// replaces, if preallocated, is first cut to its records' length and `fsync`ed, so that
    /// only the last segment ever has a zero tail (recovery reads one in an earlier segment as
    /// torn) and every later record is written after the cut is durable.
    pub(super) fn roll(&mut self, dir: &Path, opts: &WalOptions) -> Result<(), StoreError> {
        if self.runway.allocated() > self.current_len {
            if let Some(old) = self.segs.get(&self.current) {
                old.file
                    .set_len(self.current_len)
                    .and_then(|()| old.file.sync_all())
                    .map_err(|e| {
                        let path = seg_path(dir, self.current);
                        StoreError::Flush(super::on_file("cutting and fsync of", &path, e))
                    })?;
            }
        }
        let id = self
            .segs
            .keys()
            .next_back()
            .map_or(0, |last| last + 1)
            .max(self.current + 1);
        let path = seg_path(dir, id);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| StoreError::Flush(super::on_file("creating", &path, e)))?;
        self.runway
            .start(&file, runway(opts), self.rounds)
            .map_err(|e| StoreError::Flush(super::on_file("preallocating", &path, e)))?;
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
        self.frame(&Rec {
            kind: Kind::Checkpoint,
            group: 0,
            index: 0,
            payload: &payload,
        });
        Ok(())
    }
}

/// Zeros kept ahead of the records: [`RUNWAY_BYTES`], at most a segment's worth.
fn runway(opts: &WalOptions) -> u64 {
    RUNWAY_BYTES.min(opts.segment_bytes).max(1)
}
