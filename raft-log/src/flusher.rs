//! Node-wide group commit: one thread makes the writes of *all* Raft groups durable with one
//! write-ahead-log sync (`Wal::sync`: write the pending records, then `fdatasync` the segment)
//! and then completes every callback that was waiting for it.
//!
//! Why one flusher: every group appends to the same WAL, so one sync makes every earlier append of
//! every group stable. openraft 0.9 waits for each follower `append`'s `LogFlushed` before doing
//! anything else, so the win is across groups: N groups blocked on their own flush share one
//! physical sync (Ra's WAL, TiKV async-io). (A leader's own entries do not wait: see
//! [`crate::durable`].)
//!
//! Invariant (openraft v2.rs durability contract, pitfall P1): a callback is completed only after a
//! sync that *started after the callback was submitted* has returned. The loop therefore drains
//! the queue first, syncs second, completes the drained callbacks third; callbacks submitted
//! during a sync wait for the next round. Callers write to the WAL *before* they submit.
//!
//! A writer that would wait alone may run a round on its own thread instead
//! ([`Flusher::try_flush_now`], used by [`crate::DurableIndex::make_durable`]); the round lock
//! keeps one round at a time, and the invariant holds the same way (its sync starts after
//! the writer's records were written).
//!
//! It is a dedicated OS thread rather than a tokio task: the sync is blocking work, the thread
//! survives any particular tokio runtime (openraft's test suite uses one runtime per test), and
//! dropping the last handle joins it, so the stores are closed and sled's file lock released
//! deterministically (needed to reopen a data dir in the same process).

use std::io;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::StoreError;

/// A completion run by the flusher thread after the flush that covers it: `Ok(())` once the
/// writes made before [`Flusher::submit`] are durable, `Err` with the flush's I/O error otherwise.
/// Must be quick and must not block (it runs on the flusher thread).
pub type FlushCallback = Box<dyn FnOnce(Result<(), io::Error>) + Send + 'static>;

/// Rounds a paced [`Flusher`] keeps pacing after it last saw concurrent writers.
const PACE_ROUNDS: u32 = 64;
/// Callbacks sharing one flush that make a paced [`Flusher`] pace: a backlog,
/// not the pairs that meet by chance at moderate load (or because the
/// previous round was paced, which kept a moderate load paced for good).
pub const BUSY_BATCH: usize = 16;

/// Counters of a [`Flusher`], monotonically increasing since start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlusherStats {
    /// Number of physical flushes performed (successful or not).
    pub flushes: u64,
    /// Number of callbacks completed; `callbacks / flushes` is the mean group-commit batch size.
    pub callbacks: u64,
    /// Number of flushes that returned an error.
    pub errors: u64,
}

#[derive(Default)]
struct Counters {
    flushes: AtomicU64,
    callbacks: AtomicU64,
    errors: AtomicU64,
}

/// Handle to the node-wide flusher thread. Cheap to clone; the thread stops (and is joined) when
/// the last handle is dropped.
#[derive(Clone)]
pub struct Flusher {
    shared: Arc<Shared>,
}

struct Shared {
    tx: Option<mpsc::Sender<FlushCallback>>,
    thread: Option<JoinHandle<()>>,
    counters: Arc<Counters>,
    busy: BusyHint,
    round: Arc<Round>,
}

/// The flush function, behind the lock that makes one sync round at a time (the thread's or
/// an inline one, see [`Flusher::try_flush_now`]), and whether the thread is pacing.
struct Round {
    flush: std::sync::Mutex<Box<dyn FnMut() -> io::Result<()> + Send>>,
    pacing: AtomicBool,
    /// Work not done yet: callbacks submitted and not completed, plus a running inline round.
    pending: AtomicUsize,
}

/// Lets writers tell a paced [`Flusher`] that they have a backlog (e.g. a proposer that folded
/// several client commands into one Raft entry): the flusher then paces its next rounds, so
/// the backlog grows into larger, fewer writes. Cheap to clone; does not keep the flusher
/// alive.
#[derive(Clone, Default)]
pub struct BusyHint(Arc<AtomicBool>);

impl BusyHint {
    /// Note that work is queueing up behind the flushes.
    pub fn note(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    fn take(&self) -> bool {
        self.0.swap(false, Ordering::Relaxed)
    }
}

impl Flusher {
    /// Start a flusher thread named `name` that calls `flush` once per batch of callbacks.
    ///
    /// `NodeStore::open` passes `Db::flush`; tests pass an instrumented function.
    /// Errors: [`StoreError::Flush`] if the OS refuses to spawn the thread.
    pub fn start<F>(name: &str, flush: F) -> Result<Flusher, StoreError>
    where
        F: FnMut() -> io::Result<()> + Send + 'static,
    {
        Self::start_paced(name, Duration::ZERO, flush)
    }

    /// Like [`Flusher::start`], but while busy (a callback was already waiting when the previous
    /// flush ended) a flush starts no sooner than `min_interval` after the previous one ended:
    /// callbacks arriving meanwhile share it. Under load this trades up to `min_interval` of
    /// commit latency for fewer `fdatasync`s, each of which costs a VM exit and a device flush
    /// (on this project's 2-core VM, ~150 µs of CPU each); a lone writer waiting on each flush
    /// is never delayed.
    ///
    /// Errors: [`StoreError::Flush`] if the OS refuses to spawn the thread.
    pub fn start_paced<F>(
        name: &str,
        min_interval: Duration,
        flush: F,
    ) -> Result<Flusher, StoreError>
    where
        F: FnMut() -> io::Result<()> + Send + 'static,
    {
        let (tx, rx) = mpsc::channel::<FlushCallback>();
        let round = Arc::new(Round {
            flush: std::sync::Mutex::new(Box::new(flush)),
            pacing: AtomicBool::new(false),
            pending: AtomicUsize::new(0),
        });
        let rd = round.clone();
        let counters = Arc::new(Counters::default());
        let c = counters.clone();
        let busy = BusyHint::default();
        let hint = busy.clone();
        let thread = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                // Ends when every Sender (every Flusher handle) is gone.
                let mut last_end: Option<Instant> = None;
                // Rounds left in which to pace. Busy = a flush served BUSY_BATCH or more, or a
                // writer hinted at its backlog: writers produce faster than flushes complete, so
                // a delay collects more per flush. A lone writer waiting on each flush (a
                // publisher waiting for every confirm) never looks busy, and gains nothing.
                let mut pace_rounds = 0u32;
                // A callback submitted during the flush; it opens the next round.
                let mut next: Option<FlushCallback> = None;
                loop {
                    let first = match next.take() {
                        Some(cb) => cb,
                        None => match rx.recv() {
                            Ok(cb) => cb,
                            Err(_) => break,
                        },
                    };
                    if hint.take() {
                        pace_rounds = PACE_ROUNDS;
                    }
                    if let (true, Some(end)) = (pace_rounds > 0, last_end) {
                        let since = end.elapsed();
                        if since < min_interval {
                            std::thread::sleep(min_interval - since);
                        }
                    }
                    let mut batch = vec![first];
                    batch.extend(rx.try_iter());
                    pace_rounds = if batch.len() >= BUSY_BATCH {
                        PACE_ROUNDS
                    } else {
                        pace_rounds.saturating_sub(1)
                    };
                    rd.pacing.store(pace_rounds > 0, Ordering::Relaxed);
                    let res = match rd.flush.lock() {
                        Ok(mut f) => f(),
                        Err(p) => (p.into_inner())(),
                    };
                    last_end = Some(Instant::now());
                    // Anything here was submitted during the flush: it is not covered by this
                    // flush and opens the next round.
                    if let Ok(cb) = rx.try_recv() {
                        next = Some(cb);
                    }
                    c.flushes.fetch_add(1, Ordering::Relaxed);
                    c.callbacks.fetch_add(batch.len() as u64, Ordering::Relaxed);
                    let err = res.err().map(|e| {
                        c.errors.fetch_add(1, Ordering::Relaxed);
                        tracing::error!(error = %e, waiting = batch.len(), "raft-log flush failed");
                        (e.kind(), e.to_string())
                    });
                    let completed = batch.len();
                    for cb in batch {
                        let r = match &err {
                            None => Ok(()),
                            Some((kind, msg)) => Err(io::Error::new(*kind, msg.clone())),
                        };
                        if catch_unwind(AssertUnwindSafe(|| cb(r))).is_err() {
                            tracing::error!("raft-log flush callback panicked");
                        }
                    }
                    rd.pending.fetch_sub(completed, Ordering::Release);
                }
            })
            .map_err(StoreError::Flush)?;
        Ok(Flusher {
            shared: Arc::new(Shared {
                tx: Some(tx),
                thread: Some(thread),
                counters,
                busy,
                round,
            }),
        })
    }

    /// True when no sync round is running or waiting to run and the thread is not pacing: a
    /// write now would be alone in its round. A hint (it may change at once).
    pub fn is_idle(&self) -> bool {
        let round = &self.shared.round;
        round.pending.load(Ordering::Acquire) == 0 && !round.pacing.load(Ordering::Relaxed)
    }

    /// A handle that does not keep the thread alive (see [`WeakFlusher`]).
    pub fn downgrade(&self) -> WeakFlusher {
        WeakFlusher(Arc::downgrade(&self.shared))
    }

    /// Runs a sync round on the calling thread if none is running and the flusher is not
    /// pacing (a backlog is better served by the thread's larger rounds): `Some` with its
    /// result, which covers everything written before this call; `None` otherwise. Callbacks
    /// already submitted still complete on the thread (its next round finds nothing to write
    /// and syncs nothing). Blocks for the sync (~0.1 ms on this project's VM).
    ///
    /// For a lone writer waiting on its own entry: handing the sync to the idle thread costs
    /// two wake-ups of idle CPUs (the thread's, then the writer's when it is done), each
    /// ~20 µs on this project's VM, on top of the sync itself.
    pub fn try_flush_now(&self) -> Option<io::Result<()>> {
        let round = &self.shared.round;
        if round.pacing.load(Ordering::Relaxed) {
            return None;
        }
        let mut f = round.flush.try_lock().ok()?;
        round.pending.fetch_add(1, Ordering::AcqRel);
        let res = f();
        round.pending.fetch_sub(1, Ordering::AcqRel);
        drop(f);
        let c = &self.shared.counters;
        c.flushes.fetch_add(1, Ordering::Relaxed);
        if res.is_err() {
            c.errors.fetch_add(1, Ordering::Relaxed);
        }
        Some(res)
    }

    /// Queue `cb` behind the next flush. Returns at once; `cb` runs on the flusher thread.
    ///
    /// Everything written to the `Db` before this call is covered by the flush that completes
    /// `cb`. Errors: [`StoreError::FlusherStopped`] if the thread is gone (`cb` is dropped
    /// without being called).
    pub fn submit(&self, cb: FlushCallback) -> Result<(), StoreError> {
        let tx = self.shared.tx.as_ref().ok_or(StoreError::FlusherStopped)?;
        let pending = &self.shared.round.pending;
        pending.fetch_add(1, Ordering::AcqRel);
        tx.send(cb).map_err(|_| {
            pending.fetch_sub(1, Ordering::AcqRel);
            StoreError::FlusherStopped
        })
    }

    /// Wait until everything written before this call is durable (shares the flush with every
    /// other waiter of the same round).
    ///
    /// Errors: [`StoreError::Flush`] with the flush's I/O error; [`StoreError::FlusherStopped`].
    pub async fn flush(&self) -> Result<(), StoreError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.submit(Box::new(move |r| {
            let _ = tx.send(r);
        }))?;
        rx.await
            .map_err(|_| StoreError::FlusherStopped)?
            .map_err(StoreError::Flush)
    }

    /// The hint writers use to report a backlog (see [`BusyHint`]).
    pub fn busy_hint(&self) -> BusyHint {
        self.shared.busy.clone()
    }

    /// Snapshot of the counters (for metrics and tests).
    pub fn stats(&self) -> FlusherStats {
        let c = &self.shared.counters;
        FlusherStats {
            flushes: c.flushes.load(Ordering::Relaxed),
            callbacks: c.callbacks.load(Ordering::Relaxed),
            errors: c.errors.load(Ordering::Relaxed),
        }
    }
}

/// A [`Flusher`] handle that does not keep the thread alive: held by marks that outlive
/// their store (a `DurableIndex` clone in a transport), so dropping the store still joins the
/// thread.
#[derive(Clone, Default)]
pub struct WeakFlusher(std::sync::Weak<Shared>);

impl WeakFlusher {
    /// The flusher, if any handle to it is still alive.
    pub fn upgrade(&self) -> Option<Flusher> {
        self.0.upgrade().map(|shared| Flusher { shared })
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Closing the channel ends the loop after the queued callbacks were completed.
        drop(self.tx.take());
        if let Some(thread) = self.thread.take() {
            // A callback may hold the last handle; the thread must not join itself.
            if thread.thread().id() != std::thread::current().id() && thread.join().is_err() {
                tracing::error!("raft-log flusher thread panicked");
            }
        }
    }
}
