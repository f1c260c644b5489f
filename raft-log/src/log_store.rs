//! `LogStore<C>`: openraft `RaftLogReader` + `RaftLogStorage` for one group over its `log/<gid>` and
//! `meta/<gid>` trees.
//!
//! Durability (openraft 0.9.25 `storage/v2.rs` contract, architecture-anchors §1.3):
//! - `append` writes one atomic sled batch (readable at once), then hands `LogFlushed` to the
//!   node-wide [`Flusher`]; it fires only after a `Db::flush` that started after the write.
//! - `save_vote` and `truncate` wait for a flush before returning.
//! - `purge` writes `last_purged` before deleting `..=index`; both are sled writes of the same
//!   log, so crash recovery (a prefix of that log) never sees entries deleted without
//!   `last_purged` covering them. No flush: losing a purge only brings back entries that a
//!   durable snapshot already covers.
//! - `save_committed` is a plain write (advisory); it becomes durable with the next flush and is
//!   ordered after the log writes it refers to.
//! - All methods take `&mut self` and openraft calls them from one task, so writes hit sled in
//!   call order; truncate removes a suffix and purge a prefix, never leaving a hole.

use std::fmt::Debug;
use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};

use openraft::storage::{LogFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::{
    Entry, ErrorSubject, ErrorVerb, LogId, OptionalSend, RaftTypeConfig, StorageError, Vote,
};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::StoreResultExt;
use crate::{codec, keys, Flusher, GroupId, StoreError};

/// The Raft log, vote and committed id of one group. Obtain with `NodeStore::log_store`; pass to
/// `openraft::Raft::new`. Clones share the same trees (the clone is also the `LogReader`).
pub struct LogStore<C> {
    group: GroupId,
    log: sled::Tree,
    meta: sled::Tree,
    flusher: Flusher,
    _c: PhantomData<fn() -> C>,
}

impl<C> Clone for LogStore<C> {
    fn clone(&self) -> Self {
        LogStore {
            group: self.group,
            log: self.log.clone(),
            meta: self.meta.clone(),
            flusher: self.flusher.clone(),
            _c: PhantomData,
        }
    }
}

type NodeIdOf<C> = <C as RaftTypeConfig>::NodeId;

impl<C> LogStore<C>
where
    C: RaftTypeConfig<Entry = Entry<C>>,
{
    pub(crate) fn new(group: GroupId, log: sled::Tree, meta: sled::Tree, flusher: Flusher) -> Self {
        LogStore {
            group,
            log,
            meta,
            flusher,
            _c: PhantomData,
        }
    }

    /// The group this store belongs to.
    pub fn group(&self) -> GroupId {
        self.group
    }

    /// Append `entries` and wait until they are durable (the same write path as openraft's
    /// `append`, but awaiting the node-wide flush instead of a `LogFlushed` callback, which only
    /// openraft can construct). For tools, tests and offline repair; a running `Raft` must be
    /// the only writer of its group.
    ///
    /// Errors: [`StoreError::Sled`]/[`StoreError::Encode`] on write, flush errors.
    pub async fn append_durable<I: IntoIterator<Item = Entry<C>>>(
        &mut self,
        entries: I,
    ) -> Result<(), StoreError> {
        self.write_entries(entries)?;
        self.flusher.flush().await
    }

    /// Number of entries currently in the log tree (an O(n) scan; for tests and diagnostics).
    pub fn len(&self) -> usize {
        self.log.len()
    }

    /// `true` if the log tree holds no entries.
    pub fn is_empty(&self) -> bool {
        self.log.is_empty()
    }

    fn write_entries<I: IntoIterator<Item = Entry<C>>>(
        &self,
        entries: I,
    ) -> Result<(), StoreError> {
        let mut batch = sled::Batch::default();
        for e in entries {
            batch.insert(&keys::index_key(e.log_id.index), codec::encode(&e)?);
        }
        self.log.apply_batch(batch)?;
        Ok(())
    }

    fn read_meta<T: DeserializeOwned>(&self, key: &[u8]) -> Result<Option<T>, StoreError> {
        match self.meta.get(key)? {
            Some(v) => Ok(Some(codec::decode(&v)?)),
            None => Ok(None),
        }
    }

    fn write_meta<T: Serialize>(&self, key: &[u8], v: &T) -> Result<(), StoreError> {
        self.meta.insert(key, codec::encode(v)?)?;
        Ok(())
    }

    /// Remove every log key in `range` with one atomic batch.
    /// Deletes the entries in `range`, in small batches so sled never
    /// merges pages full of large entries all at once (a single batch over
    /// thousands of batched-publish entries peaked at >100 MiB of heap).
    /// `from_end` deletes highest-first (truncate keeps a prefix), else
    /// lowest-first (purge keeps a suffix): a crash midway leaves no hole.
    fn remove_range(&self, range: KeyRange, from_end: bool) -> Result<(), StoreError> {
        const CHUNK: usize = 32;
        let mut keys = Vec::new();
        for k in self.log.range(range).keys() {
            keys.push(k?);
        }
        if from_end {
            keys.reverse();
        }
        for chunk in keys.chunks(CHUNK) {
            let mut batch = sled::Batch::default();
            for k in chunk {
                batch.remove(k.clone());
            }
            self.log.apply_batch(batch)?;
        }
        Ok(())
    }

    fn read_range<RB: RangeBounds<u64>>(&self, range: RB) -> Result<Vec<Entry<C>>, StoreError> {
        let Some(bounds) = key_bounds(&range) else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for kv in self.log.range(bounds) {
            let (k, v) = kv?;
            let entry: Entry<C> = codec::decode(&v)?;
            let index = keys::parse_index_key(&k)?;
            if entry.log_id.index != index {
                return Err(StoreError::corrupt(format!(
                    "log key {index} holds entry {}",
                    entry.log_id.index
                )));
            }
            out.push(entry);
        }
        Ok(out)
    }

    fn last_log_id(&self) -> Result<Option<LogId<NodeIdOf<C>>>, StoreError> {
        match self.log.last()? {
            Some((_, v)) => Ok(Some(codec::decode::<Entry<C>>(&v)?.log_id)),
            None => Ok(None),
        }
    }
}

/// Inclusive/exclusive bounds over big-endian log keys.
type KeyRange = (Bound<[u8; 8]>, Bound<[u8; 8]>);

/// Translate a `u64` index range into big-endian sled key bounds; `None` if it is empty.
fn key_bounds<RB: RangeBounds<u64>>(range: &RB) -> Option<KeyRange> {
    let start = match range.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s.checked_add(1)?,
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e,
        Bound::Excluded(&e) => e.checked_sub(1)?,
        Bound::Unbounded => u64::MAX,
    };
    (start <= end).then(|| {
        (
            Bound::Included(keys::index_key(start)),
            Bound::Included(keys::index_key(end)),
        )
    })
}

impl<C> RaftLogReader<C> for LogStore<C>
where
    C: RaftTypeConfig<Entry = Entry<C>>,
{
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<C::Entry>, StorageError<C::NodeId>> {
        self.read_range(range)
            .sto(ErrorSubject::Logs, ErrorVerb::Read)
    }
}

impl<C> RaftLogStorage<C> for LogStore<C>
where
    C: RaftTypeConfig<Entry = Entry<C>>,
{
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<C>, StorageError<C::NodeId>> {
        let last_purged_log_id: Option<LogId<C::NodeId>> = self
            .read_meta(keys::LAST_PURGED)
            .sto(ErrorSubject::Logs, ErrorVerb::Read)?;
        let last_log_id = self
            .last_log_id()
            .sto(ErrorSubject::Logs, ErrorVerb::Read)?;
        let last_log_id = last_log_id.or_else(|| last_purged_log_id.clone());
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<C::NodeId>) -> Result<(), StorageError<C::NodeId>> {
        self.write_meta(keys::VOTE, vote)
            .sto(ErrorSubject::Vote, ErrorVerb::Write)?;
        self.flusher
            .flush()
            .await
            .sto(ErrorSubject::Vote, ErrorVerb::Write)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<C::NodeId>>, StorageError<C::NodeId>> {
        self.read_meta(keys::VOTE)
            .sto(ErrorSubject::Vote, ErrorVerb::Read)
    }

    async fn save_committed(
        &mut self,
        committed: Option<LogId<C::NodeId>>,
    ) -> Result<(), StorageError<C::NodeId>> {
        let r = match &committed {
            Some(c) => self.write_meta(keys::COMMITTED, c),
            None => self
                .meta
                .remove(keys::COMMITTED)
                .map(|_| ())
                .map_err(StoreError::from),
        };
        r.sto(ErrorSubject::Store, ErrorVerb::Write)
    }

    async fn read_committed(
        &mut self,
    ) -> Result<Option<LogId<C::NodeId>>, StorageError<C::NodeId>> {
        self.read_meta(keys::COMMITTED)
            .sto(ErrorSubject::Store, ErrorVerb::Read)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<C>,
    ) -> Result<(), StorageError<C::NodeId>>
    where
        I: IntoIterator<Item = C::Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        self.write_entries(entries)
            .sto(ErrorSubject::Logs, ErrorVerb::Write)?;
        self.flusher
            .submit(Box::new(move |r| callback.log_io_completed(r)))
            .sto(ErrorSubject::Logs, ErrorVerb::Write)
    }

    async fn truncate(&mut self, log_id: LogId<C::NodeId>) -> Result<(), StorageError<C::NodeId>> {
        tracing::debug!(group = self.group, %log_id, "truncate log from");
        let subject = || ErrorSubject::Log(log_id.clone());
        let range = (
            Bound::Included(keys::index_key(log_id.index)),
            Bound::Unbounded,
        );
        self.remove_range(range, true)
            .sto(subject(), ErrorVerb::Delete)?;
        self.flusher.flush().await.sto(subject(), ErrorVerb::Delete)
    }

    async fn purge(&mut self, log_id: LogId<C::NodeId>) -> Result<(), StorageError<C::NodeId>> {
        tracing::debug!(group = self.group, %log_id, "purge log up to");
        let subject = || ErrorSubject::Log(log_id.clone());
        self.write_meta(keys::LAST_PURGED, &log_id)
            .sto(subject(), ErrorVerb::Write)?;
        let range = (
            Bound::Unbounded,
            Bound::Included(keys::index_key(log_id.index)),
        );
        self.remove_range(range, false)
            .sto(subject(), ErrorVerb::Delete)
    }
}

#[cfg(test)]
mod tests {
    use std::ops::Bound;

    use super::key_bounds;

    #[test]
    fn empty_and_edge_ranges() {
        assert!(key_bounds(&(5..5)).is_none());
        assert!(key_bounds(&(Bound::Included(6), Bound::Included(5))).is_none());
        assert!(key_bounds(&(..0)).is_none());
        assert!(key_bounds(&(0..)).is_some());
        assert!(key_bounds(&(u64::MAX..=u64::MAX)).is_some());
    }
}
