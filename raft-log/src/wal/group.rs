//! `GroupLog`: the in-memory index of one group's part of the WAL — where each log entry lives
//! (segment, offset, length), the recently appended entries' bytes, and the group's vote,
//! committed id and last purged id (all as encoded bytes; `LogStore` decodes them).
//!
//! Pure bookkeeping, no I/O: every removal of an entry is reported through `on_remove(segment)`
//! so the WAL can count live entries per segment file and delete files nobody needs.

use std::collections::VecDeque;

/// One entry's encoded bytes, shared between the read cache and readers (`Bytes` over the
/// encoder's buffer, without a copy; decoded entries may hold slices of it, see
/// [`crate::codec::decode_shared`]).
pub(crate) type EntryBytes = bytes::Bytes;

/// Where one log entry's encoded bytes live, plus the bytes themselves while cached.
#[derive(Debug, Clone)]
pub(crate) struct Slot {
    /// Segment file id.
    pub seg: u64,
    /// Offset of the entry's bytes in the segment, in bytes.
    pub at: u64,
    /// Length of the entry's bytes.
    pub len: u32,
    /// The bytes, while they are in the read cache.
    pub data: Option<EntryBytes>,
}

/// One group's log index and metadata.
#[derive(Debug, Default)]
pub(crate) struct GroupLog {
    /// Log index of `slots[0]` (or of the next append while `slots` is empty).
    first: u64,
    slots: VecDeque<Slot>,
    /// No slot below this index holds cached bytes (eviction cursor).
    cached_from: u64,
    /// Sum of the cached bytes.
    cached_bytes: usize,
    /// codec(`Vote`).
    pub vote: Option<Vec<u8>>,
    /// codec(`Option<LogId>`).
    pub committed: Option<Vec<u8>>,
    /// codec(`LogId`) of the last purged entry.
    pub purged: Option<Vec<u8>>,
}

impl GroupLog {
    /// Index of the first entry held.
    pub fn first(&self) -> u64 {
        self.first
    }

    /// One past the last entry held.
    pub fn next(&self) -> u64 {
        self.first + self.slots.len() as u64
    }

    /// Number of entries held.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// `true` if the group has neither entries nor metadata (it would not survive a restart).
    pub fn is_blank(&self) -> bool {
        self.slots.is_empty()
            && self.vote.is_none()
            && self.committed.is_none()
            && self.purged.is_none()
    }

    /// The slot of `index`, if held.
    pub fn get(&self, index: u64) -> Option<&Slot> {
        let pos = index.checked_sub(self.first)?;
        self.slots.get(usize::try_from(pos).ok()?)
    }

    /// Iterate the slots (with their indexes) in index order.
    pub fn slots(&self) -> impl Iterator<Item = (u64, &Slot)> {
        (self.first..).zip(self.slots.iter())
    }

    /// Store the entry `index` at `slot`, replacing any entries `>= index` (a later write of an
    /// index wins, as openraft's truncate-then-append). Errors (with a message) if `index` would
    /// leave a hole after the last entry or lies below the first one while entries are held.
    pub fn put(
        &mut self,
        index: u64,
        slot: Slot,
        on_remove: &mut impl FnMut(u64),
    ) -> Result<(), String> {
        self.can_put(index)?;
        if self.slots.is_empty() {
            self.first = index;
        } else if index < self.next() {
            self.truncate_from(index, on_remove);
        }
        if let Some(d) = &slot.data {
            self.cached_bytes += d.len();
        }
        self.slots.push_back(slot);
        Ok(())
    }

    /// Recovery only, before [`GroupLog::put`] of a replayed entry: an entry below the held
    /// range overwrote (Raft truncation) entries that lived in segments deleted since. A segment
    /// is deleted only once no live entry points into it, so those entries are dead by the end
    /// of the log; drop what is held so the entry starts the range, as the live log's
    /// truncation of everything from `index` on did. (Found by the simulated power-loss test:
    /// an overwrite, then a roll whose compaction rewrote the group and freed the oldest
    /// segment, left a log that reopened with "append of index 2 to a log holding [4, 8)".)
    pub fn rebase_for_replay(&mut self, index: u64, on_remove: &mut impl FnMut(u64)) {
        if !self.slots.is_empty() && index < self.first {
            self.clear(on_remove);
        }
    }

    /// Whether [`GroupLog::put`] of `index` would be accepted (see there).
    pub fn can_put(&self, index: u64) -> Result<(), String> {
        if !self.slots.is_empty() && (index > self.next() || index < self.first) {
            return Err(format!(
                "append of index {index} to a log holding [{}, {})",
                self.first,
                self.next()
            ));
        }
        Ok(())
    }

    /// Remove the entries `>= index`.
    pub fn truncate_from(&mut self, index: u64, on_remove: &mut impl FnMut(u64)) {
        while self.next() > index.max(self.first) {
            let s = self.slots.pop_back().expect("next() > first means a slot");
            self.forget(&s, on_remove);
        }
        self.cached_from = self.cached_from.min(self.next());
    }

    /// Remove the entries `<= index`; the next append after an emptied log goes to `index + 1`.
    pub fn purge_to(&mut self, index: u64, on_remove: &mut impl FnMut(u64)) {
        while self.first <= index {
            match self.slots.pop_front() {
                Some(s) => self.forget(&s, on_remove),
                None => {
                    self.first = index + 1;
                    break;
                }
            }
            self.first += 1;
        }
    }

    /// Remove every entry.
    pub fn clear(&mut self, on_remove: &mut impl FnMut(u64)) {
        let next = self.next();
        self.truncate_from(self.first, on_remove);
        self.first = next;
    }

    /// Drop cached bytes, oldest first, until at most `budget` bytes are cached. Stops at the
    /// first entry for which `on_disk(slot)` is false (its bytes are the only copy until the WAL
    /// writes them).
    pub fn evict(&mut self, budget: usize, on_disk: impl Fn(&Slot) -> bool) {
        self.cached_from = self.cached_from.max(self.first);
        while self.cached_bytes > budget {
            let Some(pos) = self.cached_from.checked_sub(self.first) else {
                break;
            };
            let Some(slot) = self.slots.get_mut(pos as usize) else {
                break;
            };
            if let Some(d) = &slot.data {
                if !on_disk(slot) {
                    break;
                }
                self.cached_bytes -= d.len();
                slot.data = None;
            }
            self.cached_from += 1;
        }
    }

    /// Bytes currently cached.
    pub fn cached_bytes(&self) -> usize {
        self.cached_bytes
    }

    fn forget(&mut self, s: &Slot, on_remove: &mut impl FnMut(u64)) {
        if let Some(d) = &s.data {
            self.cached_bytes -= d.len();
        }
        on_remove(s.seg);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(seg: u64, n: usize) -> Slot {
        Slot {
            seg,
            at: 0,
            len: n as u32,
            data: Some(bytes::Bytes::from(vec![0u8; n])),
        }
    }

    fn indexes(g: &GroupLog) -> Vec<u64> {
        g.slots().map(|(i, _)| i).collect()
    }

    #[test]
    fn put_truncate_purge_keep_a_contiguous_range() {
        let mut removed = Vec::new();
        let mut g = GroupLog::default();
        for i in 5..10 {
            g.put(i, slot(i, 1), &mut |s| removed.push(s)).unwrap();
        }
        assert_eq!((g.first(), g.next()), (5, 10));
        assert!(
            g.put(12, slot(0, 1), &mut |s| removed.push(s)).is_err(),
            "hole"
        );
        assert!(
            g.put(4, slot(0, 1), &mut |s| removed.push(s)).is_err(),
            "below first"
        );
        g.put(8, slot(100, 1), &mut |s| removed.push(s)).unwrap(); // overwrite 8, drop 9
        assert_eq!(indexes(&g), vec![5, 6, 7, 8]);
        assert_eq!(g.get(8).unwrap().seg, 100);
        g.purge_to(6, &mut |s| removed.push(s));
        assert_eq!(indexes(&g), vec![7, 8]);
        g.truncate_from(8, &mut |s| removed.push(s));
        assert_eq!(indexes(&g), vec![7]);
        g.purge_to(20, &mut |s| removed.push(s));
        assert_eq!((g.first(), g.next(), g.len()), (21, 21, 0));
        g.put(21, slot(1, 1), &mut |s| removed.push(s)).unwrap();
        assert_eq!(indexes(&g), vec![21]);
        g.clear(&mut |s| removed.push(s));
        assert_eq!((g.len(), g.next()), (0, 22));
        removed.sort();
        assert_eq!(removed, vec![1, 5, 6, 7, 8, 9, 100]);
        assert_eq!(g.cached_bytes(), 0);
    }

    #[test]
    fn eviction_is_oldest_first_and_never_passes_unwritten_bytes() {
        let mut rm = |_| {};
        let mut g = GroupLog::default();
        for i in 0..10 {
            g.put(i, slot(i, 100), &mut rm).unwrap();
        }
        g.evict(550, |s| s.seg < 3);
        assert_eq!(g.cached_bytes(), 700, "stops at the first unwritten entry");
        g.evict(550, |_| true);
        assert_eq!(g.cached_bytes(), 500);
        assert!(g.get(4).unwrap().data.is_none());
        assert!(g.get(5).unwrap().data.is_some());
        g.purge_to(6, &mut rm);
        assert_eq!(g.cached_bytes(), 300);
        g.truncate_from(9, &mut rm);
        assert_eq!(g.cached_bytes(), 200);
        g.evict(0, |_| true);
        assert_eq!(g.cached_bytes(), 0);
    }
}
