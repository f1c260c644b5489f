//! How far one group's log is durable on this node, for a leader that writes its log in
//! parallel with replication (Raft thesis §10.2.1).
//!
//! openraft 0.9.25 waits for every `append` to be flushed before its core does anything else
//! (`RaftCore::append_to_log` awaits the `LogFlushed` callback), so a leader spent one
//! `fdatasync` per entry with replication, commits and new client writes all waiting behind
//! it: at a moderate rate the leader's own sync came *before* the followers were even sent
//! the entry. With [`crate::LogStore::ack_own_entries`], a leader's own entries are reported
//! flushed as soon as they are written, and durability is kept here instead:
//!
//! - the state machine applies an entry only once it is durable here
//!   ([`crate::GroupStateMachine::apply_when_durable`]), so nothing is confirmed to a client
//!   (and no effect runs) before the leader's own copy is durable;
//! - the transport tells followers a commit index no further than this mark
//!   ([`DurableIndex::cap`]), so no replica applies an entry before it is durable on the
//!   leader and on the follower(s) whose acknowledgement committed it.
//!
//! openraft may thus consider an entry committed while only the followers hold it durably;
//! if the leader then loses it (power loss), nobody applied it and no client saw a confirm,
//! and Raft may overwrite it like any uncommitted entry.

use openraft::LogId;
use tokio::sync::watch;

use crate::StoreError;

#[derive(Debug, Clone)]
struct Mark<NID: openraft::NodeId> {
    /// Last log id durable on this node (None: nothing yet).
    last: Option<LogId<NID>>,
    /// A sync failed: the mark will not move again.
    failed: bool,
}

/// The last log id of one group that is durable on this node. Cheap to clone; clones share it.
#[derive(Clone)]
pub struct DurableIndex<NID: openraft::NodeId> {
    tx: std::sync::Arc<watch::Sender<Mark<NID>>>,
}

impl<NID: openraft::NodeId> DurableIndex<NID> {
    /// A mark starting at `last` (the last log id recovered from the WAL).
    pub fn new(last: Option<LogId<NID>>) -> Self {
        let (tx, _) = watch::channel(Mark {
            last,
            failed: false,
        });
        DurableIndex {
            tx: std::sync::Arc::new(tx),
        }
    }

    /// The last durable log id.
    pub fn last(&self) -> Option<LogId<NID>> {
        self.tx.borrow().last.clone()
    }

    /// `commit` lowered to the durable mark (log ids of one log order like their indexes).
    pub fn cap(&self, commit: Option<LogId<NID>>) -> Option<LogId<NID>> {
        std::cmp::min(commit, self.last())
    }

    /// A sync covering everything up to `last` completed.
    pub(crate) fn advance(&self, last: LogId<NID>) {
        self.tx.send_if_modified(|m| {
            let newer = m.last.as_ref().is_none_or(|l| l.index < last.index);
            if newer {
                m.last = Some(last);
            }
            newer
        });
    }

    /// The log was truncated to before `index`: entries from `index` on are gone.
    pub(crate) fn truncate(&self, index: u64) {
        self.tx.send_if_modified(|m| {
            let cut = m.last.as_ref().is_some_and(|l| l.index >= index);
            if cut {
                // The entry before `index` was durable (the mark was past it); its log id is
                // not at hand, so the mark drops to nothing until the next sync. Only
                // followers truncate, and their entries are synced before they are acknowledged.
                m.last = None;
            }
            cut
        });
    }

    /// A sync failed: waiters get an error from now on.
    pub(crate) fn fail(&self) {
        self.tx.send_modify(|m| m.failed = true);
    }

    /// Waits until entry `index` is durable.
    ///
    /// Errors: [`StoreError::Flush`] if a sync failed (the entry may never become durable).
    pub async fn wait_for(&self, index: u64) -> Result<(), StoreError> {
        let mut rx = self.tx.subscribe();
        let res = rx
            .wait_for(|m| m.failed || m.last.as_ref().is_some_and(|l| l.index >= index))
            .await
            .map(|m| m.failed);
        match res {
            Ok(false) => Ok(()),
            _ => Err(StoreError::Flush(std::io::Error::other(
                "the write-ahead log failed to sync",
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use openraft::{CommittedLeaderId, LogId};

    use super::DurableIndex;

    fn id(term: u64, index: u64) -> LogId<u64> {
        LogId::new(CommittedLeaderId::new(term, 1), index)
    }

    /// True if `fut` is still pending after a while.
    async fn pending<F: std::future::Future>(fut: F) -> bool {
        tokio::time::timeout(Duration::from_millis(50), fut)
            .await
            .is_err()
    }

    #[tokio::test]
    async fn waiters_wake_only_when_the_mark_covers_them() {
        let d = DurableIndex::new(Some(id(1, 3)));
        assert!(d.wait_for(3).await.is_ok(), "recovered entries are durable");
        assert!(pending(d.wait_for(5)).await);
        let waiter = tokio::spawn({
            let d = d.clone();
            async move { d.wait_for(5).await }
        });
        d.advance(id(1, 4));
        assert!(!waiter.is_finished());
        d.advance(id(1, 6));
        assert!(waiter.await.unwrap().is_ok());
        // An older sync completing late never moves the mark back.
        d.advance(id(1, 5));
        assert_eq!(d.last(), Some(id(1, 6)));
    }

    #[tokio::test]
    async fn a_failed_sync_fails_every_waiter() {
        let d = DurableIndex::<u64>::new(None);
        let waiter = tokio::spawn({
            let d = d.clone();
            async move { d.wait_for(1).await }
        });
        tokio::task::yield_now().await;
        d.fail();
        assert!(waiter.await.unwrap().is_err());
        assert!(d.wait_for(1).await.is_err(), "later waiters fail too");
    }

    #[test]
    fn cap_never_exceeds_the_mark_nor_raises_the_commit() {
        let d = DurableIndex::new(Some(id(2, 10)));
        assert_eq!(d.cap(Some(id(2, 12))), Some(id(2, 10)));
        assert_eq!(d.cap(Some(id(2, 7))), Some(id(2, 7)));
        assert_eq!(d.cap(None), None);
        assert_eq!(DurableIndex::<u64>::new(None).cap(Some(id(1, 1))), None);
    }

    #[tokio::test]
    async fn truncation_below_the_mark_resets_it_until_the_next_sync() {
        let d = DurableIndex::new(Some(id(1, 10)));
        d.truncate(11);
        assert_eq!(
            d.last(),
            Some(id(1, 10)),
            "a cut above the mark changes nothing"
        );
        d.truncate(8);
        assert_eq!(d.last(), None);
        assert!(pending(d.wait_for(7)).await);
        d.advance(id(2, 9));
        assert!(d.wait_for(9).await.is_ok());
    }
}
