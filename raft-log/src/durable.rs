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
//!
//! The leader of a group with no other voter commits its entry as soon as it is written, so
//! its state machine is the first to wait for it. When the node's flusher is idle, such an
//! append is *deferred* ([`DurableIndex::defer`]): not handed to the flusher thread, but
//! synced by the waiting state machine on its own thread ([`DurableIndex::make_durable`]).
//! A lone writer then pays one sync and no thread hand-off on its way to the confirm.

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
    /// Makes entries durable for [`DurableIndex::make_durable`].
    flusher: crate::WeakFlusher,
    /// The group's only voter is this node (see [`DurableIndex::set_solo`]).
    solo: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// 1 + the last index written but not handed to the flusher (0: none), see
    /// [`DurableIndex::defer`].
    deferred: std::sync::Arc<std::sync::atomic::AtomicU64>,
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
            flusher: crate::WeakFlusher::default(),
            solo: Default::default(),
            deferred: Default::default(),
        }
    }

    /// The same mark, making entries durable through `flusher`.
    pub(crate) fn with_flusher(mut self, flusher: &crate::Flusher) -> Self {
        self.flusher = flusher.downgrade();
        self
    }

    /// Records whether this node is the group's only voter (see [`DurableIndex::defer`]).
    pub fn set_solo(&self, solo: bool) {
        self.solo.store(solo, std::sync::atomic::Ordering::Relaxed);
    }

    /// See [`DurableIndex::set_solo`].
    pub fn is_solo(&self) -> bool {
        self.solo.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A solo leader's own append of entries up to `index`, when the flusher is idle: true
    /// if the append need not hand them to the flusher thread, because the state machine,
    /// the first to wait for them (a solo leader commits an entry as soon as it is written),
    /// makes them durable itself ([`DurableIndex::make_durable`]).
    ///
    /// Why: a lone writer (a publisher waiting for each confirm) otherwise pays two wake-ups
    /// of idle CPUs per entry besides the sync, the flusher thread's and then its own
    /// (~20 µs each on this project's VM). Any other group's leader hands its entries to the
    /// flusher as it appends, so the sync runs while they travel to the followers (Raft
    /// thesis §10.2.1); and under load the flusher's shared, paced rounds serve better.
    pub fn defer(&self, index: u64) -> bool {
        let lone = self.is_solo() && self.flusher.upgrade().is_some_and(|f| f.is_idle());
        if lone {
            self.deferred
                .fetch_max(index + 1, std::sync::atomic::Ordering::AcqRel);
        }
        lone
    }

    /// Waits until `last`, already written to the WAL, is durable. Entries an append
    /// deferred ([`DurableIndex::defer`]) are synced here: on the calling thread if no round
    /// is running (see [`crate::Flusher::try_flush_now`]), else by the flusher thread.
    ///
    /// Errors: [`StoreError::Flush`] if a sync failed or the flusher is gone.
    pub async fn make_durable(&self, last: &LogId<NID>) -> Result<(), StoreError> {
        let mark = self.last().map(|l| l.index);
        if mark.is_some_and(|m| m >= last.index) {
            return Ok(());
        }
        let deferred = self.deferred.load(std::sync::atomic::Ordering::Acquire);
        // Some deferred entry is not durable yet: nobody else will sync it.
        let owed = deferred > 0 && mark.is_none_or(|m| deferred - 1 > m);
        if owed {
            let flusher = self.flusher.upgrade();
            match flusher.as_ref().and_then(|f| f.try_flush_now()) {
                // Entries up to the deferred one were written before this sync started.
                Some(Ok(())) if last.index < deferred => {
                    self.advance(last.clone());
                    return Ok(());
                }
                Some(Ok(())) => {}
                Some(Err(_)) => self.fail(),
                None => {
                    let on_flushed = self.on_flushed(last.clone());
                    let queued = flusher
                        .ok_or(StoreError::FlusherStopped)
                        .and_then(|f| f.submit(Box::new(move |r| on_flushed(&r))));
                    if queued.is_err() {
                        self.fail();
                    }
                }
            }
        }
        self.wait_for(last.index).await
    }

    /// The last durable log id.
    pub fn last(&self) -> Option<LogId<NID>> {
        self.tx.borrow().last.clone()
    }

    /// `commit` lowered to the durable mark (log ids of one log order like their indexes).
    pub fn cap(&self, commit: Option<LogId<NID>>) -> Option<LogId<NID>> {
        std::cmp::min(commit, self.last())
    }

    /// What a flush covering everything up to `last` does to the mark: moves it there, or on
    /// failure fails every waiter.
    pub(crate) fn on_flushed(&self, last: LogId<NID>) -> impl FnOnce(&std::io::Result<()>) {
        let mark = self.clone();
        move |r| match r {
            Ok(()) => mark.advance(last),
            Err(_) => mark.fail(),
        }
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

    use std::sync::{Arc, Mutex};

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

    /// A flusher counting its rounds and the threads that ran them.
    fn counting_flusher() -> (crate::Flusher, Arc<Mutex<Vec<std::thread::ThreadId>>>) {
        let rounds = Arc::new(Mutex::new(Vec::new()));
        let r = rounds.clone();
        let flusher = crate::Flusher::start("test-flusher", move || {
            r.lock().unwrap().push(std::thread::current().id());
            Ok(())
        })
        .unwrap();
        (flusher, rounds)
    }

    #[tokio::test]
    async fn a_solo_leaders_deferred_entry_is_synced_by_its_waiter_on_its_own_thread() {
        let (flusher, rounds) = counting_flusher();
        let d = DurableIndex::new(Some(id(1, 4))).with_flusher(&flusher);
        assert!(
            !d.defer(5),
            "not solo: the append hands its entries to the flusher"
        );
        d.set_solo(true);
        assert!(d.defer(5), "solo, flusher idle: deferred");
        assert_eq!(d.last(), Some(id(1, 4)), "deferring makes nothing durable");
        assert!(rounds.lock().unwrap().is_empty());
        d.make_durable(&id(1, 5)).await.unwrap();
        assert_eq!(d.last(), Some(id(1, 5)));
        assert_eq!(*rounds.lock().unwrap(), vec![std::thread::current().id()]);
        // Covered already: no second round.
        d.make_durable(&id(1, 5)).await.unwrap();
        assert_eq!(rounds.lock().unwrap().len(), 1);
    }

    #[tokio::test]
    async fn a_busy_flusher_is_not_bypassed() {
        let (gate_tx, gate_rx) = std::sync::mpsc::channel::<()>();
        let (started_tx, started) = std::sync::mpsc::channel::<()>();
        let flusher = crate::Flusher::start("test-flusher", move || {
            started_tx.send(()).map_err(std::io::Error::other)?;
            gate_rx
                .recv_timeout(Duration::from_secs(10))
                .map_err(std::io::Error::other)
        })
        .unwrap();
        let t = Duration::from_secs(10);
        let d = DurableIndex::new(None).with_flusher(&flusher);
        d.set_solo(true);
        // A round is waiting on the thread.
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        flusher
            .submit(Box::new(move |r| done_tx.send(r.is_ok()).unwrap()))
            .unwrap();
        assert!(!flusher.is_idle());
        assert!(
            !d.defer(1),
            "a pending round: the append hands its entry to the flusher"
        );
        started.recv_timeout(t).unwrap();
        gate_tx.send(()).unwrap();
        assert_eq!(done_rx.recv_timeout(t), Ok(true));
        // The round counts its callbacks done after the last one ran.
        for _ in 0..1000 {
            if flusher.is_idle() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert!(flusher.is_idle());
        // Deferred, but the thread is in a round when the waiter comes: the waiter queues
        // its own callback and is served by the thread's next round.
        assert!(d.defer(2));
        let (busy_tx, busy_rx) = std::sync::mpsc::channel();
        flusher
            .submit(Box::new(move |_| busy_tx.send(()).unwrap()))
            .unwrap();
        started.recv_timeout(t).unwrap();
        let waiter = tokio::spawn({
            let d = d.clone();
            async move { d.make_durable(&id(1, 2)).await }
        });
        assert!(pending(d.wait_for(2)).await, "durable before any round ran");
        gate_tx.send(()).unwrap();
        busy_rx.recv_timeout(t).unwrap();
        started.recv_timeout(t).unwrap();
        gate_tx.send(()).unwrap();
        assert!(waiter.await.unwrap().is_ok());
        assert_eq!(d.last(), Some(id(1, 2)));
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
