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
//! - The oldest segment files are deleted, in order, once no live entry points into them and a
//!   newer checkpoint is durable (only a prefix: recovery replays every record since the first
//!   surviving checkpoint; small groups pinning the oldest segment are rewritten forward).
//! - Appends only buffer; [`Wal::sync`] (run by the node's `Flusher` thread) writes the buffers,
//!   `fdatasync`s the touched segments (and the directory after a segment was created), then
//!   the flusher completes the waiting callbacks. A torn record therefore only ever covers
//!   writes nobody was told about: recovery cuts the log at the first torn record and drops the
//!   segments after it.
//! - Corruption is not a torn tail: each sync round opens with a [`Kind::Mark`] record, and a
//!   round's writes start only after the previous round's `fdatasync` returned. A bad record
//!   followed by a later round's mark was synced, so recovery refuses to open (naming segment
//!   file and offset) instead of cutting acknowledged writes; only the operator's explicit
//!   [`WalOptions::truncate_at`] at that spot cuts there. A crash mid-round may persist the
//!   round's pages in any order, but never a later round's mark.
//! - Recently appended entries stay in memory (per group, `group_cache_bytes`) so the state
//!   machine's read-after-commit never touches the disk; older ones are read with `pread`.

mod group;
#[cfg(test)]
mod power_loss;
mod record;
mod runway;
mod state;

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::{GroupId, StoreError};
use group::EntryBytes;
use record::Kind;
use state::{seg_id, seg_path, Rec, Seg, State};

/// Largest record payload the WAL holds (bytes).
pub(crate) const MAX_ENTRY_BYTES: usize = record::MAX_PAYLOAD_BYTES;

/// Tuning of the [`Wal`].
#[derive(Debug, Clone, Copy)]
pub struct WalOptions {
    /// A new segment starts once the current one holds this many bytes (default 64 MiB).
    pub segment_bytes: u64,
    /// Bytes of recently appended entries kept in memory per group (default 8 MiB).
    pub group_cache_bytes: usize,
    /// Largest entry payload accepted (default and upper bound [`MAX_ENTRY_BYTES`]).
    pub max_record_bytes: usize,
    /// Called when a write, `fdatasync` or segment creation fails, before the error is
    /// returned (default [`crate::fail_stop`]).
    pub on_failure: fn(&io::Error),
    /// The operator's explicit repair: `(segment id, offset)` of a corrupt record `open`
    /// reported, where recovery may cut the log (dropping everything after it). Default none.
    pub truncate_at: Option<(u64, u64)>,
    /// Called after every successful sync round with its duration (writes + `fdatasync`s;
    /// metrics). Default: nothing.
    pub on_synced: fn(std::time::Duration),
}

impl Default for WalOptions {
    fn default() -> Self {
        WalOptions {
            segment_bytes: 64 << 20,
            group_cache_bytes: 8 << 20,
            max_record_bytes: MAX_ENTRY_BYTES,
            on_failure: crate::fail_stop,
            truncate_at: None,
            on_synced: |_| {},
        }
    }
}

/// The node-wide log. All methods take `&self`; one mutex guards the in-memory state and is
/// never held across I/O other than creating a segment file.
pub(crate) struct Wal {
    dir: PathBuf,
    opts: WalOptions,
    state: Mutex<State>,
    /// Per-group read cache budget in force (bytes): `opts.group_cache_bytes`, or less while
    /// the node is short of memory ([`Wal::shrink_caches`]).
    cache_budget: std::sync::atomic::AtomicUsize,
    /// Tests: each deleted segment's name and bytes as they were when it was deleted (the
    /// power-loss simulation lets an unsynced unlink come undone).
    #[cfg(test)]
    deleted: Mutex<Vec<(String, Vec<u8>)>>,
}

/// A group's metadata records, encoded (see [`group::GroupLog`]'s fields of the same names).
#[derive(Debug, Default)]
pub(crate) struct GroupMeta {
    /// codec(`Vote`).
    pub vote: Option<Vec<u8>>,
    /// codec(`Option<LogId>`).
    pub committed: Option<Vec<u8>>,
    /// codec(`LogId`) of the last purged entry.
    pub purged: Option<Vec<u8>>,
}

impl Wal {
    /// Open (or create) the WAL in `dir`: replay every segment, cut a torn tail, start a fresh
    /// segment with a checkpoint, make it durable and delete the segments nobody needs.
    ///
    /// Errors: I/O as [`StoreError::Flush`]; [`StoreError::Corrupt`]/[`StoreError::Decode`] if a
    /// complete (CRC-valid) record contradicts the log (e.g. an entry that leaves a hole);
    /// [`StoreError::Corrupt`] naming the segment file and offset if the disk cannot read a
    /// segment (a media error: what it holds may be synced records), unless
    /// `opts.truncate_at` names the end of its readable records;
    /// [`StoreError::Corrupt`] naming the segment file and offset if a bad record is followed
    /// by a later sync round's mark (it was synced: corruption, not a torn tail), unless
    /// `opts.truncate_at` names that spot.
    pub fn open(dir: &Path, opts: WalOptions) -> Result<Wal, StoreError> {
        fs::create_dir_all(dir).map_err(StoreError::Flush)?;
        let mut ids: Vec<u64> = fs::read_dir(dir)
            .map_err(StoreError::Flush)?
            .filter_map(|e| e.ok()?.file_name().to_str().and_then(seg_id))
            .collect();
        ids.sort_unstable();
        // Segment ids are consecutive and only a prefix is ever deleted, so a gap in them comes
        // from a power loss that kept some directory changes and lost others (the directory is
        // fsynced when a round created a segment, never after deletions): either segments
        // deleted earlier reappeared before the gap (their unlink was not durable), or
        // segments after it were created by the round that crashed (their directory entry
        // made it, an earlier one's did not). The first reading is tried first and taken if
        // the log it leaves holds every entry it declares live; else the second, which only
        // drops writes of the crashed, unacknowledged round, if nothing after the gap was
        // synced; else the log is missing a segment it needs and the open fails.
        let first_gap = ids.windows(2).position(|w| w[1] != w[0] + 1).map(|p| p + 1);
        let last_gap = ids
            .windows(2)
            .rposition(|w| w[1] != w[0] + 1)
            .map(|p| p + 1);
        let Replayed {
            mut st,
            torn,
            dropped,
        } = match (first_gap, last_gap) {
            (Some(first), Some(last)) => replay_across_gap(dir, &ids, first, last, &opts)?,
            _ => replay(dir, &ids, &opts)?,
        };
        if let Some((id, at)) = torn {
            let seg = st.segs.get_mut(&id).expect("replay holds the torn segment");
            seg.file
                .set_len(at)
                .and_then(|()| seg.file.sync_all())
                .map_err(|e| {
                    StoreError::Flush(on_file("cutting the torn tail of", &seg_path(dir, id), e))
                })?;
        }
        for id in dropped {
            let path = seg_path(dir, id);
            fs::remove_file(&path).map_err(|e| StoreError::Flush(on_file("deleting", &path, e)))?;
        }
        st.replaying = false;
        st.ranges.clear();
        let wal = Wal {
            dir: dir.to_path_buf(),
            cache_budget: std::sync::atomic::AtomicUsize::new(opts.group_cache_bytes),
            opts,
            state: Mutex::new(st),
            #[cfg(test)]
            deleted: Mutex::new(Vec::new()),
        };
        {
            let mut st = wal.lock();
            st.roll(dir, &wal.opts)?;
            st.compact_old_segments(dir, &wal.opts)?;
        }
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
            let data = bytes::Bytes::from(data);
            let rec = Rec {
                kind: Kind::Entry,
                group,
                index,
                payload: &data,
            };
            st.push(&self.dir, &self.opts, rec, Some(data.clone()))?;
        }
        let State { groups, segs, .. } = &mut *st;
        if let Some(g) = groups.get_mut(&group) {
            let budget = self.cache_budget.load(std::sync::atomic::Ordering::Relaxed);
            g.evict(budget, |s| written(segs, s));
        }
        Ok(())
    }

    /// Sets the per-group read cache budget to `budget` bytes (`None`: back to
    /// `group_cache_bytes`) and drops every group's cache down to it at once (oldest entries
    /// first, only entries already written to a segment); returns the bytes dropped. For a
    /// memory alarm: a group's cache is otherwise trimmed only when that group appends, so
    /// queues drained of a flood kept up to `group_cache_bytes` each in memory for good.
    pub fn shrink_caches(&self, budget: Option<usize>) -> usize {
        let budget = budget.unwrap_or(self.opts.group_cache_bytes);
        self.cache_budget
            .store(budget, std::sync::atomic::Ordering::Relaxed);
        let mut st = self.lock();
        let State { groups, segs, .. } = &mut *st;
        let mut dropped = 0;
        for g in groups.values_mut() {
            let before = g.cached_bytes();
            g.evict(budget, |s| written(segs, s));
            dropped += before - g.cached_bytes();
        }
        dropped
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
        st.push(&self.dir, &self.opts, rec, None)
    }

    /// The encoded entries `start..=end` of `group` that are held (a contiguous run; indexes
    /// outside the held range are skipped). Errors: [`StoreError::Flush`] naming the segment
    /// if a `pread` fails (after [`WalOptions::on_failure`]: the node's fail-stop).
    pub fn read(
        &self,
        group: GroupId,
        start: u64,
        end: u64,
    ) -> Result<Vec<EntryBytes>, StoreError> {
        enum Src {
            Mem(EntryBytes),
            Disk(Arc<File>, u64, u64, u32),
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
                        (None, Some(seg)) => Ok(Src::Disk(seg.file.clone(), s.seg, s.at, s.len)),
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
                Src::Disk(f, seg, at, len) => {
                    let mut buf = vec![0; len as usize];
                    if let Err(e) = f.read_exact_at(&mut buf, at) {
                        // A segment the disk cannot read back: the entries in it are gone
                        // for this node (openraft would stop only this group, leaving the
                        // node up with a dead queue), so the node stops; restarting
                        // reports the segment like corruption.
                        let e = on_file(
                            &format!("read of {len} bytes at offset {at} of"),
                            &seg_path(&self.dir, seg),
                            e,
                        );
                        (self.opts.on_failure)(&e);
                        return Err(StoreError::Flush(e));
                    }
                    Ok(bytes::Bytes::from(buf))
                }
            })
            .collect()
    }

    /// The last entry of `group`, encoded, if any.
    pub fn last(&self, group: GroupId) -> Result<Option<EntryBytes>, StoreError> {
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
            st.marked = false;
            let mut files: Vec<(u64, Arc<File>)> = Vec::new();
            for c in &chunks {
                if files.last().is_none_or(|(id, _)| *id != c.seg) {
                    files.push((c.seg, st.segs[&c.seg].file.clone()));
                }
            }
            // The oldest segments, as long as no live entry points into them, older than the
            // newest checkpoint that is durable once this round's writes are. Only a prefix:
            // recovery then replays every record since the first surviving checkpoint. A dead
            // segment deleted from the middle left older segments' dead entries of the same
            // group to be replayed below a hole, before the record that removed them (found by
            // the fault suite: "append of index 109164 to a log holding [106242, 106602)").
            let newest = files
                .last()
                .map_or(0, |(id, _)| *id)
                .max(st.durable_checkpoint);
            let doomed: Vec<u64> = st
                .segs
                .range(..newest.min(st.current))
                .take_while(|(_, s)| s.live == 0)
                .map(|(&id, _)| id)
                .collect();
            (chunks, files, std::mem::take(&mut st.dir_dirty), doomed)
        };
        // Errors name the file (the fail-stop's log line says which one failed).
        let io = || -> io::Result<()> {
            for c in &chunks {
                let (_, f) = files
                    .iter()
                    .find(|(id, _)| *id == c.seg)
                    .expect("collected above");
                f.write_all_at(&c.data, c.at)
                    .and_then(|()| match &c.shared {
                        Some(b) => f.write_all_at(b, c.at + c.data.len() as u64),
                        None => Ok(()),
                    })
                    .map_err(|e| on_file("write", &seg_path(&self.dir, c.seg), e))?;
            }
            for (id, f) in &files {
                f.sync_data()
                    .map_err(|e| on_file("fdatasync", &seg_path(&self.dir, *id), e))?;
            }
            if dir_dirty {
                File::open(&self.dir)
                    .and_then(|d| d.sync_all())
                    .map_err(|e| on_file("fsync of the directory", &self.dir, e))?;
            }
            Ok(())
        };
        let started = std::time::Instant::now();
        let res = io();
        if res.is_ok() && !chunks.is_empty() {
            (self.opts.on_synced)(started.elapsed());
        }
        {
            let mut st = self.lock();
            if let Err(e) = &res {
                st.failed = Some(e.to_string());
                drop(st);
                (self.opts.on_failure)(e);
                return res;
            }
            for c in &chunks {
                if let Some(s) = st.segs.get_mut(&c.seg) {
                    s.written = s.written.max(c.at + c.len());
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
            #[cfg(test)]
            if let Ok(bytes) = fs::read(&path) {
                self.deleted
                    .lock()
                    .unwrap()
                    .push((seg_file_name(id), bytes));
            }
            if let Err(e) = fs::remove_file(&path) {
                tracing::warn!(segment = %path.display(), error = %e, "could not delete drained WAL segment");
            }
        }
        Ok(())
    }
}

/// What a replay leaves: the state, where a torn record ends the log (`(segment, offset)` to
/// cut at) and the segments to delete.
struct Replayed {
    st: State,
    torn: Option<(u64, u64)>,
    dropped: Vec<u64>,
}

/// Whether segment `id` opens with an intact checkpoint record. Errors: as [`read_segment`].
fn starts_with_checkpoint(dir: &Path, id: u64) -> Result<bool, StoreError> {
    let bytes = read_segment(dir, id)?;
    Ok(matches!(record::parse(&bytes, 0), Ok(Some(r)) if r.kind == Kind::Checkpoint))
}

/// `e` with what failed on which file put before its message (its kind kept): the
/// fail-stop's log line and a refused open name the file.
/// True when the bytes of `slot` are written to their segment (its cached copy may go).
fn written(segs: &std::collections::BTreeMap<u64, state::Seg>, slot: &group::Slot) -> bool {
    segs.get(&slot.seg)
        .is_some_and(|seg| seg.written >= slot.at + u64::from(slot.len))
}

pub(crate) fn on_file(what: &str, path: &Path, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
}

/// Segment `id`'s bytes, whole. Errors: [`StoreError::Corrupt`] naming the file if the disk
/// cannot read it (see [`read_readable`]), `Flush` for other I/O.
fn read_segment(dir: &Path, id: u64) -> Result<Vec<u8>, StoreError> {
    let path = seg_path(dir, id);
    match read_readable(&path).map_err(|e| StoreError::Flush(on_file("read", &path, e)))? {
        (bytes, None) => Ok(bytes),
        (_, Some((bad, e))) => Err(StoreError::corrupt(format!(
            "WAL segment {} is corrupt at offset {bad}: the disk cannot read it ({e}); \
             restore the data directory, or rebuild this node from the other replicas",
            path.display()
        ))),
    }
}

/// Size of the pieces [`read_readable`] reads a file in, and of those it retries a failed
/// piece in to find where the unreadable part starts.
const READ_PIECE: usize = 1 << 20;
const READ_SECTOR: usize = 4096;

/// Where a file stopped being readable: the offset (a multiple of 4 KiB) and the read's
/// error (`EIO`: a media error).
type Unreadable = Option<(u64, io::Error)>;

/// The bytes of the file at `path` up to the first that the disk cannot read, and where it
/// stopped, if it did. Errors: the file cannot be opened or sized.
fn read_readable(path: &Path) -> io::Result<(Vec<u8>, Unreadable)> {
    let f = File::open(path)?;
    let len = f.metadata()?.len() as usize;
    let mut bytes = vec![0u8; len];
    let mut at = 0;
    while at < len {
        let piece = (len - at).min(READ_PIECE);
        let Err(e) = read_full(&f, &mut bytes[at..at + piece], at as u64) else {
            at += piece;
            continue;
        };
        // Find the first unreadable sector of the piece.
        let mut err = e;
        let mut sub = at;
        while sub < at + piece {
            let n = (at + piece - sub).min(READ_SECTOR);
            match read_full(&f, &mut bytes[sub..sub + n], sub as u64) {
                Ok(()) => sub += n,
                Err(e) => {
                    err = e;
                    break;
                }
            }
        }
        bytes.truncate(sub);
        return Ok((bytes, Some((sub as u64, err))));
    }
    Ok((bytes, None))
}

/// Fills `buf` from offset `at` of `f`; zeros where the file ends early (it shrank).
fn read_full(f: &File, buf: &mut [u8], at: u64) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match f.read_at(&mut buf[done..], at + done as u64) {
            Ok(0) => {
                buf[done..].fill(0);
                break;
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// [`replay`] of segments `ids` with a gap in their numbering (`first` and `last`: indexes
/// in `ids` just after the first and the last gap; see `Wal::open` for the two readings).
fn replay_across_gap(
    dir: &Path,
    ids: &[u64],
    first: usize,
    last: usize,
    opts: &WalOptions,
) -> Result<Replayed, StoreError> {
    // Reappeared deleted segments: deletion needs a durable newer checkpoint, so the log
    // after them goes on with an intact one.
    let reappeared = if starts_with_checkpoint(dir, ids[last])? {
        replay(dir, &ids[last..], opts)
    } else {
        Err(StoreError::corrupt(format!(
            "{} after a gap in the WAL's segments has no intact checkpoint",
            seg_path(dir, ids[last]).display()
        )))
    };
    let err = match reappeared {
        Ok(mut r) => {
            for &id in &ids[..last] {
                tracing::warn!(segment = %seg_path(dir, id).display(),
                    "deleting a WAL segment that was deleted before and reappeared \
                     (power loss before the directory was synced)");
            }
            r.dropped.splice(0..0, ids[..last].iter().copied());
            return Ok(r);
        }
        Err(e) => e,
    };
    // Segments of a round that never synced: the segments it created mid-round have no
    // mark. A mark after the gap means acknowledged writes: refuse.
    if synced_after(dir, &[], 0, &ids[first..], &[])?.is_some() {
        return Err(err);
    }
    let mut r = replay(dir, &ids[..first], opts).map_err(|_| err)?;
    for &id in &ids[first..] {
        tracing::warn!(segment = %seg_path(dir, id).display(),
            "deleting a WAL segment of a round that never synced (the segment created \
             before it is missing)");
    }
    r.dropped.extend_from_slice(&ids[first..]);
    Ok(r)
}

/// Replay the segments `ids` (consecutive) into a fresh [`State`] without changing any file.
/// Errors: contradictory records, corruption (a bad record a later round's mark follows,
/// unless `opts.truncate_at` names it), or a group that does not hold every entry the log
/// declares live ([`State::check_ranges`]); I/O as `Flush`.
///
/// A last segment without a mark holds one round's writes (a round's mark goes in the segment
/// current when it starts); if the log only holds together without it — its checkpoint
/// declares entries the crashed round wrote into the previous segment and lost — it is
/// dropped like a torn tail.
fn replay(dir: &Path, ids: &[u64], opts: &WalOptions) -> Result<Replayed, StoreError> {
    let (replayed, ranges) = replay_once(dir, ids, opts)?;
    let Err(e) = ranges else {
        return Ok(replayed);
    };
    let last = replayed.torn.map_or(ids.last().copied(), |t| Some(t.0));
    let end = last.and_then(|l| ids.iter().position(|&i| i == l));
    match end {
        Some(end) if end > 0 && synced_after(dir, &[], 0, &ids[end..=end], &[])?.is_none() => {
            tracing::warn!(segment = %seg_path(dir, ids[end]).display(),
                "dropping the last WAL segment: written by a round that never synced, its \
                 checkpoint declares entries that round lost");
            drop(replayed);
            let mut r = replay(dir, &ids[..end], opts)?;
            r.dropped.extend_from_slice(&ids[end..]);
            Ok(r)
        }
        _ => Err(e),
    }
}

/// One pass of [`replay`]; the range check's verdict is returned beside what it replayed.
fn replay_once(
    dir: &Path,
    ids: &[u64],
    opts: &WalOptions,
) -> Result<(Replayed, Result<(), StoreError>), StoreError> {
    let mut st = State::empty();
    st.replaying = true;
    // Nonces of the marks replayed so far (one per incarnation of the WAL).
    let mut nonces: Vec<u64> = Vec::new();
    for (n, &id) in ids.iter().enumerate() {
        let path = seg_path(dir, id);
        let (bytes, unreadable) =
            read_readable(&path).map_err(|e| StoreError::Flush(on_file("read", &path, e)))?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| StoreError::Flush(on_file("open", &path, e)))?;
        st.segs.insert(
            id,
            Seg {
                file: Arc::new(file),
                written: 0,
                live: 0,
            },
        );
        st.current = id;
        let mut at = 0;
        loop {
            let parsed = record::parse(&bytes, at);
            if let (Some((bad, e)), Ok(None) | Err(())) = (&unreadable, &parsed) {
                // The readable part ends here, and what the disk cannot read may hold
                // synced records: corruption, not a torn tail (issue 32 item 4).
                if opts.truncate_at != Some((id, at as u64)) {
                    return Err(StoreError::corrupt(format!(
                        "WAL segment {} is corrupt at offset {at}: the disk cannot read it \
                         from offset {bad} on ({e}), and what it holds from there may be \
                         acknowledged writes. Restore the data directory, or rebuild this \
                         node from the other replicas, or cut the log there (drops every \
                         record from that offset on) by starting once with: \
                         --wal-truncate-at {}:{at}",
                        path.display(),
                        seg_file_name(id),
                    )));
                }
                tracing::warn!(segment = %path.display(), offset = at, unreadable_from = bad,
                    error = %e, "unreadable WAL segment: cutting the log here at the \
                    operator's request (--wal-truncate-at); every record from here on is dropped");
                st.segs.get_mut(&id).expect("inserted above").written = at as u64;
                let ranges = st.check_ranges();
                let torn = Some((id, at as u64));
                let dropped = ids[n + 1..].to_vec();
                return Ok((Replayed { st, torn, dropped }, ranges));
            }
            match parsed {
                Ok(None) => break,
                Ok(Some(r)) if at > 0 || r.kind == Kind::Checkpoint => {
                    if let Some((_, nonce)) = record::mark_of(&r) {
                        if !nonces.contains(&nonce) {
                            nonces.push(nonce);
                        }
                    }
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
                    let evidence = synced_after(dir, &bytes, at, &ids[n + 1..], &nonces)?;
                    // The unwritten rest of the last segment, preallocated (`state::preallocate`).
                    let zeros = n + 1 == ids.len() && bytes[at..].iter().all(|&b| b == 0);
                    match evidence {
                        Some(mark) if opts.truncate_at != Some((id, at as u64)) => {
                            return Err(StoreError::corrupt(format!(
                                "WAL segment {} is corrupt at offset {at}: a damaged record \
                                 that was synced (a later sync round's mark follows it, at \
                                 {mark}); recovering past it would silently drop \
                                 acknowledged writes. Restore the data directory, or rebuild \
                                 this node from the other replicas, or cut the log there \
                                 (drops every record from that offset on) by starting once \
                                 with: --wal-truncate-at {}:{at}",
                                path.display(),
                                seg_file_name(id),
                            )));
                        }
                        Some(mark) => tracing::warn!(segment = %path.display(), offset = at,
                            %mark, "corrupt WAL record: cutting the log here at the operator's \
                            request (--wal-truncate-at); every record from here on is dropped"),
                        None if zeros => tracing::debug!(segment = %path.display(),
                            offset = at, len = bytes.len(),
                            "the log ends here (the rest of the segment was preallocated)"),
                        None => tracing::warn!(segment = %path.display(), offset = at,
                            len = bytes.len(),
                            "torn WAL record: the log ends here (unacknowledged writes)"),
                    }
                    st.segs.get_mut(&id).expect("inserted above").written = at as u64;
                    let ranges = st.check_ranges();
                    let torn = Some((id, at as u64));
                    let dropped = ids[n + 1..].to_vec();
                    return Ok((Replayed { st, torn, dropped }, ranges));
                }
            }
        }
        st.segs.get_mut(&id).expect("inserted above").written = at as u64;
    }
    let ranges = st.check_ranges();
    let replayed = Replayed {
        st,
        torn: None,
        dropped: Vec::new(),
    };
    Ok((replayed, ranges))
}

/// Where a sync round later than the one that wrote the bad record at `at` of `bytes` left its
/// [`Kind::Mark`] (`"<file>:<offset>"`), if anywhere: further in the same segment (found byte by
/// byte, marks of a replayed nonce only; not when `at` is the segment's checkpoint, which a
/// round starting the segment writes before its mark), or in a later segment (`later` ids,
/// read record by record up to their first bad one). A round's writes start only after the
/// previous round's `fdatasync` returned, so such a mark proves the bad record was synced.
///
/// Errors: reading a later segment, as [`read_segment`] (an unreadable one is corruption).
fn synced_after(
    dir: &Path,
    bytes: &[u8],
    at: usize,
    later: &[u64],
    nonces: &[u64],
) -> Result<Option<String>, StoreError> {
    // Past the last non-zero byte (a preallocated segment's unwritten rest) only a mark whose
    // own last bytes are zeros can start.
    let end = bytes.iter().rposition(|&b| b != 0).map_or(0, |p| p + 1);
    let bytes = &bytes[..bytes
        .len()
        .min(end + record::HEADER_BYTES + record::MARK_PAYLOAD_BYTES)];
    let here = if at == 0 {
        None
    } else {
        record::find_mark(bytes, at + 1, nonces)
    };
    if let Some((off, ordinal)) = here {
        return Ok(Some(format!("offset {off}, round {ordinal}")));
    }
    for &id in later {
        let later_bytes = read_segment(dir, id)?;
        let mut pos = 0;
        while let Ok(Some(r)) = record::parse(&later_bytes, pos) {
            if let Some((ordinal, _)) = record::mark_of(&r) {
                return Ok(Some(format!(
                    "{} offset {pos}, round {ordinal}",
                    seg_file_name(id)
                )));
            }
            pos = r.next;
        }
    }
    Ok(None)
}

/// The file name of segment `id` (`<id:020>.wal`).
pub fn seg_file_name(id: u64) -> String {
    format!("{id:020}.wal")
}

/// Parse an operator's `--wal-truncate-at` value, `<segment file name or id>:<offset>`, into
/// `(segment id, offset)`. Errors: a description of what is malformed.
pub fn parse_truncate_at(s: &str) -> Result<(u64, u64), String> {
    let (seg, off) = s.rsplit_once(':').ok_or_else(|| {
        format!("{s:?}: expected SEGMENT:OFFSET, e.g. 00000000000000000003.wal:4096")
    })?;
    let seg = seg.rsplit('/').next().unwrap_or(seg);
    let id = seg_id(seg)
        .or_else(|| seg.parse().ok())
        .ok_or_else(|| format!("{seg:?} is not a WAL segment name or id"))?;
    let off = off
        .parse()
        .map_err(|_| format!("{off:?} is not a byte offset"))?;
    Ok((id, off))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    static FAILURES: AtomicUsize = AtomicUsize::new(0);

    fn count_failure(_: &io::Error) {
        FAILURES.fetch_add(1, Ordering::SeqCst);
    }

    /// A WAL whose directory vanished can neither make a new segment durable nor create one:
    /// each failure reaches `on_failure` (the broker's fail-stop) before the error is
    /// returned, and a failed sync takes no more appends.
    #[test]
    fn io_failures_reach_the_failure_hook_and_poison_the_wal() {
        let opts = WalOptions {
            segment_bytes: 4096,
            on_failure: count_failure,
            ..WalOptions::default()
        };
        // A sync that must fsync the directory of a segment created since the last sync.
        let dir = tempfile::tempdir().unwrap();
        let wal = Wal::open(&dir.path().join("wal"), opts).unwrap();
        wal.append(1, vec![(1, vec![7; 100]), (2, vec![7; 5000])])
            .unwrap();
        wal.sync().unwrap();
        wal.append(1, vec![(3, vec![7; 10])]).unwrap(); // rolls into a new segment
        std::fs::remove_dir_all(dir.path().join("wal")).unwrap();
        assert_eq!(FAILURES.load(Ordering::SeqCst), 0);
        assert!(
            wal.sync().is_err(),
            "the new segment's directory is gone: the sync must fail"
        );
        assert_eq!(FAILURES.load(Ordering::SeqCst), 1);
        assert!(
            wal.append(1, vec![(4, vec![7; 10])]).is_err(),
            "a failed WAL takes no appends"
        );

        // A segment that cannot be created.
        let dir = tempfile::tempdir().unwrap();
        let wal = Wal::open(&dir.path().join("wal"), opts).unwrap();
        wal.append(1, vec![(1, vec![7; 5000])]).unwrap();
        wal.sync().unwrap();
        std::fs::remove_dir_all(dir.path().join("wal")).unwrap();
        assert!(
            wal.append(1, vec![(2, vec![7; 10])]).is_err(),
            "no directory to roll into"
        );
        assert_eq!(FAILURES.load(Ordering::SeqCst), 2);
    }

    fn held(wal: &Wal, group: GroupId) -> Vec<u8> {
        wal.read(group, 0, u64::MAX)
            .unwrap()
            .iter()
            .map(|d| d[0])
            .collect()
    }

    fn segment_files(dir: &Path) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "wal"))
            .collect();
        v.sort();
        v
    }

    /// Offset just past the last intact record of segment file `path` (its preallocated rest
    /// reads as zeros).
    fn records_end(path: &Path) -> u64 {
        let bytes = fs::read(path).unwrap();
        let mut at = 0;
        while let Ok(Some(r)) = record::parse(&bytes, at) {
            at = r.next;
        }
        at as u64
    }

    fn damage(path: &Path, at: u64, bytes: &[u8]) {
        let f = OpenOptions::new().write(true).open(path).unwrap();
        f.write_all_at(bytes, at).unwrap();
    }

    /// Issue 11 item 1: a flipped byte in a record that later sync rounds follow is corruption:
    /// the open fails naming the segment file and offset, nothing is cut; the operator's
    /// explicit truncate at that spot opens it holding exactly the records before it, and
    /// later opens need nothing more.
    #[test]
    fn a_damaged_synced_record_is_corruption_and_only_an_explicit_truncate_cuts_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wal");
        {
            let wal = Wal::open(&path, WalOptions::default()).unwrap();
            for i in 1..=8u64 {
                wal.append(1, vec![(i, vec![i as u8; 300])]).unwrap();
                wal.sync().unwrap();
            }
        }
        let seg = segment_files(&path)
            .into_iter()
            .find(|p| fs::metadata(p).unwrap().len() > 2000)
            .expect("the segment holding the entries");
        let before = fs::read(&seg).unwrap();
        // A byte inside entry 4's payload (each entry is 300 bytes of its own index).
        let at = before
            .windows(300)
            .position(|w| w.iter().all(|&b| b == 4))
            .unwrap()
            + 150;
        damage(&seg, at as u64, &[0x55]);

        let err = match Wal::open(&path, WalOptions::default()) {
            Ok(_) => panic!("a corrupt synced record must not open as a torn tail"),
            Err(e) => e.to_string(),
        };
        let name = seg.file_name().unwrap().to_str().unwrap();
        assert!(err.contains(name), "{err}");
        let marker = "corrupt at offset ";
        let off: u64 = err[err.find(marker).unwrap() + marker.len()..]
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!(
            err.contains(&format!("--wal-truncate-at {name}:{off}")),
            "{err}"
        );
        assert_eq!(
            fs::read(&seg).unwrap().len(),
            before.len(),
            "nothing was cut"
        );
        let segments = segment_files(&path).len();

        // A truncate elsewhere is not this corruption's repair.
        let wrong = WalOptions {
            truncate_at: Some((seg_id(name).unwrap(), off + 1)),
            ..WalOptions::default()
        };
        assert!(Wal::open(&path, wrong).is_err());
        assert_eq!(segment_files(&path).len(), segments, "nothing was deleted");

        let repair = WalOptions {
            truncate_at: Some(parse_truncate_at(&format!("{name}:{off}")).unwrap()),
            ..WalOptions::default()
        };
        let wal = Wal::open(&path, repair).expect("the operator's truncate opens the log");
        assert_eq!(
            held(&wal, 1),
            vec![1, 2, 3],
            "entries before the damaged record"
        );
        wal.append(1, vec![(4, vec![40; 10])]).unwrap();
        wal.sync().unwrap();
        drop(wal);
        let wal = Wal::open(&path, WalOptions::default()).expect("repaired for good");
        assert_eq!(held(&wal, 1), vec![1, 2, 3, 40]);
    }

    /// A big payload is written from its own buffer (only its header is copied into the
    /// pending bytes), between small records framed before and after it in the same round;
    /// the log reads back and reopens the same, across a roll.
    #[test]
    fn big_payloads_written_from_their_own_buffer_read_back_and_replay() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wal");
        let opts = WalOptions {
            segment_bytes: 512 << 10,
            ..WalOptions::default()
        };
        let big = |i: u64| {
            let mut v = vec![i as u8; state::SHARED_PAYLOAD_BYTES + 3];
            v[1] = 0xEE;
            v
        };
        let wal = Wal::open(&path, opts).unwrap();
        let mut want = Vec::new();
        let mut big_unsynced = false;
        for i in 1..=12u64 {
            let data = if i % 3 == 0 {
                big(i)
            } else {
                vec![i as u8; 100]
            };
            want.push(data.clone());
            wal.append(1, vec![(i, data)]).unwrap();
            big_unsynced |= i % 3 == 0;
            let shared = wal.lock().pending.iter().any(|c| c.shared.is_some());
            assert_eq!(
                shared, big_unsynced,
                "entry {i}: a big payload waits uncopied"
            );
            if i % 2 == 0 {
                big_unsynced = false;
                wal.sync().unwrap();
            }
        }
        wal.sync().unwrap();
        let read = |wal: &Wal| -> Vec<Vec<u8>> {
            wal.read(1, 0, u64::MAX)
                .unwrap()
                .iter()
                .map(|b| b.to_vec())
                .collect()
        };
        assert_eq!(read(&wal), want);
        assert!(segment_files(&path).len() >= 2, "rolled");
        drop(wal);
        let wal = Wal::open(&path, opts).unwrap();
        assert_eq!(read(&wal), want, "replayed from disk");
    }

    /// Under memory pressure every group's read cache is dropped down to the budget (entries
    /// already written only), reads then come from the segments, and the budget holds for
    /// later appends until it is set back.
    #[test]
    fn caches_shrink_to_a_budget_and_reads_go_to_disk() {
        let dir = tempfile::tempdir().unwrap();
        let wal = Wal::open(&dir.path().join("wal"), WalOptions::default()).unwrap();
        for g in [1u64, 2] {
            for i in 1..=4u64 {
                wal.append(g, vec![(i, vec![g as u8; 1000])]).unwrap();
            }
        }
        let cached =
            |wal: &Wal| -> usize { wal.lock().groups.values().map(|g| g.cached_bytes()).sum() };
        assert!(cached(&wal) >= 8000);
        wal.sync().unwrap();
        let dropped = wal.shrink_caches(Some(0));
        assert!(dropped >= 8000, "dropped {dropped}");
        assert_eq!(cached(&wal), 0);
        for g in [1u64, 2] {
            let read = wal.read(g, 0, u64::MAX).unwrap();
            assert_eq!(read.len(), 4);
            assert!(
                read.iter().all(|b| b.len() == 1000 && b[0] == g as u8),
                "from the segment"
            );
        }
        // Budget 0 holds: an append's written predecessors are dropped as it comes in.
        wal.append(1, vec![(5, vec![1; 1000])]).unwrap();
        wal.sync().unwrap();
        wal.append(1, vec![(6, vec![1; 1000])]).unwrap();
        assert!(cached(&wal) <= 2000);
        // Back to the configured budget: nothing written is dropped any more.
        assert_eq!(wal.shrink_caches(None), 0);
        wal.sync().unwrap();
        wal.append(1, vec![(7, vec![1; 1000])]).unwrap();
        assert!(cached(&wal) >= 1000);
    }

    /// Segments are preallocated (a sync then overwrites blocks the file owns); a finished
    /// segment is cut to its records, and a log whose last segment ends in preallocated zeros
    /// reopens whole, that segment cut too.
    #[test]
    fn segments_are_preallocated_and_cut_to_their_records_when_finished() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wal");
        let opts = WalOptions {
            segment_bytes: 64 << 10,
            ..WalOptions::default()
        };
        let wal = Wal::open(&path, opts).unwrap();
        for i in 1..=20u64 {
            wal.append(1, vec![(i, vec![i as u8; 10_000])]).unwrap();
            wal.sync().unwrap();
        }
        let files = segment_files(&path);
        assert!(files.len() >= 3, "{files:?}");
        let (last, finished) = files.split_last().unwrap();
        let len = fs::metadata(last).unwrap().len();
        // Half a runway (a segment's worth at most) or more of zeros ahead of the records.
        assert!(len >= records_end(last) + (32 << 10), "preallocated: {len}");
        for f in finished {
            assert_eq!(fs::metadata(f).unwrap().len(), records_end(f), "{f:?} cut");
        }
        drop(wal);
        let wal = Wal::open(&path, opts).expect("a preallocated tail is no torn record");
        assert_eq!(held(&wal, 1), (1..=20).collect::<Vec<u8>>());
        assert_eq!(
            fs::metadata(last).unwrap().len(),
            records_end(last),
            "cut at reopen"
        );
    }

    /// A crash mid-round may persist the round's later pages but not its first ones: that is a
    /// torn tail (no later round's mark follows), cut without an error.
    #[test]
    fn a_torn_last_round_is_cut_even_when_its_later_pages_persisted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wal");
        let (seg, round_start) = {
            let wal = Wal::open(&path, WalOptions::default()).unwrap();
            for i in 1..=3u64 {
                wal.append(1, vec![(i, vec![i as u8; 300])]).unwrap();
                wal.sync().unwrap();
            }
            let seg = segment_files(&path).pop().unwrap();
            let round_start = records_end(&seg);
            wal.append(1, (4..=6u64).map(|i| (i, vec![i as u8; 300])).collect())
                .unwrap();
            wal.sync().unwrap();
            (seg, round_start)
        };
        // The last round's mark and first entry header never reached the disk.
        damage(&seg, round_start, &[0; 40]);
        let wal = Wal::open(&path, WalOptions::default()).expect("a torn tail opens");
        assert_eq!(held(&wal, 1), vec![1, 2, 3]);
    }

    /// A round that starts a segment writes the segment's checkpoint before its mark: a damaged
    /// checkpoint followed only by its own round's mark is a torn tail, not corruption.
    #[test]
    fn a_torn_checkpoint_before_its_rounds_mark_is_a_tail() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wal");
        let opts = WalOptions {
            segment_bytes: 4096,
            ..WalOptions::default()
        };
        {
            let wal = Wal::open(&path, opts).unwrap();
            wal.append(1, (1..=3u64).map(|i| (i, vec![i as u8; 1500])).collect())
                .unwrap();
            wal.sync().unwrap();
            let segments = segment_files(&path).len();
            wal.append(1, vec![(4, vec![4; 100])]).unwrap();
            wal.sync().unwrap();
            assert_eq!(segment_files(&path).len(), segments + 1, "the round rolled");
        }
        let newest = segment_files(&path).pop().unwrap();
        damage(&newest, 10, &[0xFF; 4]);
        let wal = Wal::open(&path, opts).expect("a torn tail opens");
        assert_eq!(held(&wal, 1), vec![1, 2, 3]);
    }

    /// A missing segment that held live entries is corruption, not a resurrected leftover:
    /// recovery refuses instead of starting without them.
    #[test]
    fn a_missing_segment_with_live_entries_fails_the_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wal");
        let opts = WalOptions {
            segment_bytes: 4096,
            ..WalOptions::default()
        };
        {
            let wal = Wal::open(&path, opts).unwrap();
            wal.append(2, vec![(1, vec![2; 100])]).unwrap(); // stays live in the first segment
            for i in 1..=7u64 {
                wal.append(1, vec![(i, vec![1; 1500])]).unwrap();
                wal.sync().unwrap();
            }
        }
        let files = segment_files(&path);
        assert_eq!(files.len(), 3, "{files:?}");
        fs::remove_file(&files[1]).unwrap();
        let err = match Wal::open(&path, opts) {
            Ok(_) => panic!("opened without group 2's live entry"),
            Err(e) => e.to_string(),
        };
        assert!(
            err.contains("declares entries") && err.contains("missing"),
            "{err}"
        );
    }

    /// Found by the fault suite (a node that restarted after a rolling restart refused to open:
    /// "append of index 109164 to a log holding [106242, 106602)"): a dead segment between two
    /// live ones was deleted; on replay the older one's dead entries of the same group were
    /// held again, the checkpoint after the hole still listed the deleted entries, and the
    /// next entry came before the purge that removed them all.
    #[test]
    fn a_dead_segment_behind_a_live_one_is_kept_so_recovery_sees_no_hole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wal");
        let opts = WalOptions {
            segment_bytes: 4096,
            ..WalOptions::default()
        };
        let e = |n: usize| vec![n as u8; 1500];
        {
            let wal = Wal::open(&path, opts).unwrap();
            // Segment A: group 1 entries 1-2 and group 2's entry 1 (keeps A alive).
            wal.append(1, vec![(1, e(1)), (2, e(2))]).unwrap();
            wal.append(2, vec![(1, e(9))]).unwrap();
            // Segment B: group 1 entries 3-5.
            wal.append(1, vec![(3, e(3)), (4, e(4)), (5, e(5))])
                .unwrap();
            // Segment C: its checkpoint lists group 1 as [1, 6); then entry 6, then the purge.
            wal.append(1, vec![(6, e(6))]).unwrap();
            wal.purge(1, 5, b"log-id-5").unwrap();
            wal.sync().unwrap();
            wal.append(1, vec![(7, e(7))]).unwrap();
            wal.sync().unwrap();
        }
        let wal = Wal::open(&path, opts).expect("the WAL reopens");
        // Entry n's bytes are all n: the first byte names the entry.
        let held: Vec<u8> = wal.read(1, 1, 7).unwrap().iter().map(|d| d[0]).collect();
        assert_eq!(
            held,
            vec![6, 7],
            "group 1 holds what it held before the restart"
        );
        let held2: Vec<u8> = wal.read(2, 1, 1).unwrap().iter().map(|d| d[0]).collect();
        assert_eq!(held2, vec![9]);
    }
}
