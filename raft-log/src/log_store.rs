//! `LogStore<C>`: openraft `RaftLogReader` + `RaftLogStorage` for one group over the node-wide
//! [`Wal`](crate::wal).
//!
//! Durability (openraft 0.9.25 `storage/v2.rs` contract, architecture-anchors §1.3):
//! - `append` buffers the entries in the WAL (readable at once), then hands `LogFlushed` to the
//!   node-wide [`Flusher`]; it fires only after a WAL sync that started after the append.
//!   Exception, opted into with [`LogStore::ack_own_entries`]: a leader's own entries are
//!   reported flushed at once and their durability is tracked by the group's [`DurableIndex`]
//!   instead (see [`crate::durable`] for why that is safe).
//! - `save_vote` and `truncate` wait for a sync before returning.
//! - `purge` records the purge point and drops the entries in one WAL record. No sync: losing a
//!   purge only brings back entries that a durable snapshot already covers.
//! - `save_committed` is a plain record (advisory); it becomes durable with the next sync and is
//!   ordered after the log records it refers to.
//! - All methods take `&mut self` and openraft calls them from one task, so records of a group
//!   reach the WAL in call order; truncate removes a suffix and purge a prefix, never leaving a
//!   hole.

use std::fmt::Debug;
use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::{
    Entry, ErrorSubject, ErrorVerb, LogId, OptionalSend, RaftTypeConfig, StorageError, Vote,
};

use crate::durable::DurableIndex;
use crate::error::StoreResultExt;
use crate::node_store::Holders;
use crate::wal::Wal;
use crate::{codec, Flusher, GroupId, StoreError};

/// The Raft log, vote and committed id of one group. Obtain with `NodeStore::log_store`; pass to
/// `openraft::Raft::new`. Clones share the same state (the clone is also the `LogReader`).
pub struct LogStore<C: RaftTypeConfig> {
    group: GroupId,
    wal: Arc<Wal>,
    flusher: Flusher,
    /// Keeps [`crate::NodeStore::close`] waiting while this store lives.
    holders: Holders,
    durable: DurableIndex<C::NodeId>,
    /// This node's id when its own entries (as leader) are acknowledged before the sync.
    own_acks: Option<C::NodeId>,
    /// The vote as last saved (openraft calls `save_vote` and `append` on one instance).
    vote: Option<Vote<C::NodeId>>,
    _c: PhantomData<fn() -> C>,
}

impl<C: RaftTypeConfig> Clone for LogStore<C> {
    fn clone(&self) -> Self {
        LogStore {
            group: self.group,
            wal: self.wal.clone(),
            flusher: self.flusher.clone(),
            holders: self.holders.clone(),
            durable: self.durable.clone(),
            own_acks: self.own_acks.clone(),
            vote: self.vote.clone(),
            _c: PhantomData,
        }
    }
}

type NodeIdOf<C> = <C as RaftTypeConfig>::NodeId;
/// First and last log id of an append.
type Span<C> = (LogId<NodeIdOf<C>>, LogId<NodeIdOf<C>>);

impl<C> LogStore<C>
where
    C: RaftTypeConfig<Entry = Entry<C>>,
{
    pub(crate) fn new(
        group: GroupId,
        wal: Arc<Wal>,
        flusher: Flusher,
        holders: Holders,
    ) -> Result<Self, StoreError> {
        let mut store = LogStore {
            group,
            wal,
            flusher,
            holders,
            durable: DurableIndex::new(None),
            own_acks: None,
            vote: None,
            _c: PhantomData,
        };
        // Everything recovered from the WAL counts as durable.
        store.durable = DurableIndex::new(store.last_log_id()?).with_flusher(&store.flusher);
        store.vote = store
            .wal
            .meta(group)
            .vote
            .map(|b| codec::decode(&b))
            .transpose()?;
        Ok(store)
    }

    /// Acknowledge this node's own entries (written while it leads, `me` = its node id) as
    /// flushed as soon as they are written, so openraft replicates them while the local sync
    /// runs (Raft thesis §10.2.1). Only safe together with
    /// [`crate::GroupStateMachine::apply_when_durable`] on the group's state machine and a
    /// transport that caps the commit index it sends with [`DurableIndex::cap`].
    pub fn ack_own_entries(mut self, me: C::NodeId) -> Self {
        self.own_acks = Some(me);
        self
    }

    /// How far this group's log is durable on this node.
    pub fn durable(&self) -> DurableIndex<C::NodeId> {
        self.durable.clone()
    }

    /// True when `first` was written by this node as the leader of its current vote.
    fn is_own(&self, first: &LogId<C::NodeId>) -> bool {
        match (&self.own_acks, &self.vote) {
            (Some(me), Some(vote)) => {
                vote.is_committed()
                    && vote.leader_id() == &first.leader_id
                    && first.leader_id.voted_for().as_ref() == Some(me)
            }
            _ => false,
        }
    }

    /// The group this store belongs to.
    pub fn group(&self) -> GroupId {
        self.group
    }

    /// Append `entries` and wait until they are durable (the same write path as openraft's
    /// `append`, but awaiting the node-wide sync instead of a `LogFlushed` callback, which only
    /// openraft can construct). For tools, tests and offline repair; a running `Raft` must be
    /// the only writer of its group.
    ///
    /// Errors: [`StoreError::Encode`], [`StoreError::Corrupt`] (indexes leave a hole), WAL and
    /// flush errors.
    pub async fn append_durable<I: IntoIterator<Item = Entry<C>>>(
        &mut self,
        entries: I,
    ) -> Result<(), StoreError> {
        let written = self.write_entries(entries)?;
        self.flusher.flush().await?;
        if let Some((_, last)) = written {
            self.durable.advance(last);
        }
        Ok(())
    }

    /// Writes a group's first state before a `Raft` runs it: `vote`, then `entries` (a new
    /// group's membership entry), as openraft's `save_vote` and `append` would, but without
    /// waiting for a sync: they become durable with the node's next WAL sync (await
    /// [`Flusher::flush`] for that), and `durable` follows. For a group every member starts
    /// from the same derivable state (a queue's members, its preferred leader's first term),
    /// where state lost to a crash before the sync is written again the same way.
    ///
    /// Errors: [`StoreError::Encode`], WAL and flusher errors.
    pub fn seed<I: IntoIterator<Item = Entry<C>>>(
        &mut self,
        vote: &Vote<C::NodeId>,
        entries: I,
    ) -> Result<(), StoreError> {
        self.wal.set_vote(self.group, &codec::encode(vote)?)?;
        self.vote = Some(vote.clone());
        if let Some((_, last)) = self.write_entries(entries)? {
            let on_flushed = self.durable.on_flushed(last);
            self.flusher.submit(Box::new(move |r| on_flushed(&r)))?;
        }
        Ok(())
    }

    /// Number of entries currently held.
    pub fn len(&self) -> usize {
        self.wal.len(self.group)
    }

    /// `true` if the log holds no entries.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn write_entries<I: IntoIterator<Item = Entry<C>>>(
        &self,
        entries: I,
    ) -> Result<Option<Span<C>>, StoreError> {
        let mut ids = None;
        let encoded = entries
            .into_iter()
            .map(|e| {
                let first = ids.take().map_or_else(|| e.log_id.clone(), |(f, _)| f);
                ids = Some((first, e.log_id.clone()));
                Ok((e.log_id.index, codec::encode(&e)?))
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        // Framing a big entry into the WAL's buffer copies it (and its CRC reads it).
        if encoded.iter().map(|(_, b)| b.len()).sum::<usize>() >= codec::HEAVY_BYTES {
            codec::off_worker(|| self.wal.append(self.group, encoded))?;
        } else {
            self.wal.append(self.group, encoded)?;
        }
        Ok(ids)
    }

    fn read_range<RB: RangeBounds<u64>>(&self, range: RB) -> Result<Vec<Entry<C>>, StoreError> {
        let Some((start, end)) = index_bounds(&range) else {
            return Ok(Vec::new());
        };
        let raw = self.wal.read(self.group, start, end)?;
        let mut out = Vec::with_capacity(raw.len());
        for (i, bytes) in raw.iter().enumerate() {
            let entry: Entry<C> = codec::decode_shared(bytes)?;
            if let Some(prev) = out.last().map(|e: &Entry<C>| e.log_id.index) {
                if entry.log_id.index != prev + 1 {
                    return Err(StoreError::corrupt(format!(
                        "group {} entry {} follows {prev} (read #{i})",
                        self.group, entry.log_id.index
                    )));
                }
            }
            out.push(entry);
        }
        Ok(out)
    }

    fn last_log_id(&self) -> Result<Option<LogId<NodeIdOf<C>>>, StoreError> {
        match self.wal.last(self.group)? {
            Some(bytes) => Ok(Some(codec::decode::<Entry<C>>(&bytes)?.log_id)),
            None => Ok(None),
        }
    }
}

/// Translate a `u64` index range into inclusive `(start, end)`; `None` if it is empty.
fn index_bounds<RB: RangeBounds<u64>>(range: &RB) -> Option<(u64, u64)> {
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
    (start <= end).then_some((start, end))
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
        let purged = self.wal.meta(self.group).purged;
        let last_purged_log_id: Option<LogId<C::NodeId>> = purged
            .map(|b| codec::decode(&b))
            .transpose()
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
        codec::encode(vote)
            .and_then(|b| self.wal.set_vote(self.group, &b))
            .sto(ErrorSubject::Vote, ErrorVerb::Write)?;
        self.vote = Some(vote.clone());
        self.flusher
            .flush()
            .await
            .sto(ErrorSubject::Vote, ErrorVerb::Write)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<C::NodeId>>, StorageError<C::NodeId>> {
        let vote = self.wal.meta(self.group).vote;
        vote.map(|b| codec::decode(&b))
            .transpose()
            .sto(ErrorSubject::Vote, ErrorVerb::Read)
    }

    async fn save_committed(
        &mut self,
        committed: Option<LogId<C::NodeId>>,
    ) -> Result<(), StorageError<C::NodeId>> {
        codec::encode(&committed)
            .and_then(|b| self.wal.set_committed(self.group, &b))
            .sto(ErrorSubject::Store, ErrorVerb::Write)
    }

    async fn read_committed(
        &mut self,
    ) -> Result<Option<LogId<C::NodeId>>, StorageError<C::NodeId>> {
        let committed = self.wal.meta(self.group).committed;
        let decoded: Option<Option<LogId<C::NodeId>>> = committed
            .map(|b| codec::decode(&b))
            .transpose()
            .sto(ErrorSubject::Store, ErrorVerb::Read)?;
        Ok(decoded.flatten())
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
        let written = self
            .write_entries(entries)
            .sto(ErrorSubject::Logs, ErrorVerb::Write)?;
        let Some((first, last)) = written else {
            callback.log_io_completed(Ok(()));
            return Ok(());
        };
        let group = self.group;
        let index = last.index;
        tracing::trace!(target: "timeline", ev = "wal_append", group, last = index);
        let on_flushed = self.durable.on_flushed(last);
        let mark = move |r: &Result<(), std::io::Error>| {
            tracing::trace!(target: "timeline", ev = "wal_flushed", group, last = index);
            on_flushed(r)
        };
        let cb: crate::FlushCallback = if self.is_own(&first) {
            // The leader's own entries: replicate now, apply once `durable` covers them.
            callback.log_io_completed(Ok(()));
            if self.durable.defer(index) {
                return Ok(());
            }
            Box::new(move |r| mark(&r))
        } else {
            Box::new(move |r| {
                mark(&r);
                callback.log_io_completed(r)
            })
        };
        self.flusher
            .submit(cb)
            .sto(ErrorSubject::Logs, ErrorVerb::Write)
    }

    async fn truncate(&mut self, log_id: LogId<C::NodeId>) -> Result<(), StorageError<C::NodeId>> {
        tracing::debug!(group = self.group, %log_id, "truncate log from");
        let subject = || ErrorSubject::Log(log_id.clone());
        self.wal
            .truncate(self.group, log_id.index)
            .sto(subject(), ErrorVerb::Delete)?;
        self.durable.truncate(log_id.index);
        self.flusher.flush().await.sto(subject(), ErrorVerb::Delete)
    }

    async fn purge(&mut self, log_id: LogId<C::NodeId>) -> Result<(), StorageError<C::NodeId>> {
        tracing::debug!(group = self.group, %log_id, "purge log up to");
        let subject = || ErrorSubject::Log(log_id.clone());
        codec::encode(&log_id)
            .and_then(|b| self.wal.purge(self.group, log_id.index, &b))
            .sto(subject(), ErrorVerb::Delete)
    }
}

#[cfg(test)]
mod tests {
    use std::ops::Bound;

    use openraft::storage::RaftLogStorage;
    use openraft::{CommittedLeaderId, LeaderId, LogId, Vote};

    use super::index_bounds;
    use crate::NodeStore;

    openraft::declare_raft_types!(
        Tc:
            D = u64,
            R = u64,
            NodeId = u64,
            Node = openraft::BasicNode,
            Entry = openraft::Entry<Tc>,
            SnapshotData = std::io::Cursor<Vec<u8>>,
    );

    fn by(term: u64, node: u64, index: u64) -> LogId<u64> {
        LogId::new(CommittedLeaderId::new(term, node), index)
    }

    fn committed(term: u64, node: u64) -> Vote<u64> {
        let mut v = Vote::new(term, node);
        v.commit();
        v
    }

    /// Early acknowledgement is only for entries this node wrote as the leader of its vote:
    /// a follower must sync before it acknowledges (its acknowledgement counts toward commit).
    #[tokio::test]
    async fn only_the_leaders_own_entries_are_acknowledged_early() {
        let dir = tempfile::TempDir::new().unwrap();
        let ns = NodeStore::open(dir.path(), 1 << 20).unwrap();
        let mut plain = ns.log_store::<Tc>(7).unwrap();
        let mut log = ns.log_store::<Tc>(7).unwrap().ack_own_entries(1);
        assert!(!log.is_own(&by(1, 1, 1)), "no vote yet");

        log.save_vote(&Vote::new(3, 1)).await.unwrap();
        assert!(
            !log.is_own(&by(3, 1, 1)),
            "a candidate's vote is not a leader's"
        );

        log.save_vote(&committed(3, 1)).await.unwrap();
        assert!(log.is_own(&by(3, 1, 5)), "leading in term 3: own entries");
        assert!(
            !log.is_own(&by(2, 1, 5)),
            "entries of an earlier term of this node"
        );
        plain.save_vote(&committed(3, 1)).await.unwrap();
        assert!(!plain.is_own(&by(3, 1, 5)), "not opted in");

        log.save_vote(&committed(4, 2)).await.unwrap();
        assert!(!log.is_own(&by(4, 2, 6)), "following node 2");
        assert!(
            !log.is_own(&by(3, 1, 6)),
            "own old entries resent to a follower"
        );
        assert_eq!(LeaderId::new(4, 2), *committed(4, 2).leader_id());
    }

    /// A seeded group reads back its vote and entries at once, and they become durable with
    /// the next sync: a store reopened after it holds them.
    #[tokio::test]
    async fn a_seeded_state_is_readable_at_once_and_durable_after_the_next_sync() {
        use openraft::storage::RaftLogReader;
        use openraft::{Entry, EntryPayload};
        let dir = tempfile::TempDir::new().unwrap();
        let entry = || Entry::<Tc> {
            log_id: LogId::default(),
            payload: EntryPayload::Normal(9),
        };
        {
            let ns = NodeStore::open(dir.path(), 1 << 20).unwrap();
            let mut log = ns.log_store::<Tc>(3).unwrap();
            log.seed(&committed(1, 2), [entry()]).unwrap();
            assert_eq!(log.read_vote().await.unwrap(), Some(committed(1, 2)));
            let state = log.get_log_state().await.unwrap();
            assert_eq!(state.last_log_id, Some(LogId::default()));
            ns.flusher().flush().await.unwrap();
            assert_eq!(
                log.durable().last(),
                Some(LogId::default()),
                "the sync covered it"
            );
            drop(log);
            ns.close(std::time::Duration::from_secs(5)).await.unwrap();
        }
        let ns = NodeStore::open(dir.path(), 1 << 20).unwrap();
        let mut log = ns.log_store::<Tc>(3).unwrap();
        assert_eq!(log.read_vote().await.unwrap(), Some(committed(1, 2)));
        let entries = log.try_get_log_entries(0..1).await.unwrap();
        assert_eq!(entries.len(), 1);
        assert!(matches!(entries[0].payload, EntryPayload::Normal(9)));
    }

    #[test]
    fn empty_and_edge_ranges() {
        assert_eq!(index_bounds(&(5..5)), None);
        assert_eq!(
            index_bounds(&(Bound::Included(6), Bound::Included(5))),
            None
        );
        assert_eq!(index_bounds(&(..0)), None);
        assert_eq!(index_bounds(&(0..)), Some((0, u64::MAX)));
        assert_eq!(index_bounds(&(3..=7)), Some((3, 7)));
        assert_eq!(
            index_bounds(&(u64::MAX..=u64::MAX)),
            Some((u64::MAX, u64::MAX))
        );
    }
}
