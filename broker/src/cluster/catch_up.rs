//! Bringing this node's meta replica up to the meta leader's commit before
//! it trusts its own view of the topology (a read index, Raft §6.4).
//!
//! A declare-ok promises the new queue on the node that declared it. Another
//! node applies the entry when the leader's next append reaches it, and a
//! node that was down applies everything it missed only after it serves
//! again. RabbitMQ's declare-ok covers every node (its metadata store commits
//! on all of them), so a client that declares through one node and publishes
//! through another expects the queue there. Where this node's view says
//! "no such queue" or "no route", it catches up first and looks again: an
//! unroutable publish confirmed on a stale view would be a confirmed message
//! dropped (the fault suite's `disk_full` run after a restart).
//!
//! Catch-ups are shared: callers that ask while one is running wait for the
//! next, which starts after they asked, so one round serves them all. A
//! round that started after a request arrived serves it too: a channel
//! stamps each batch of frames it reads ([`CatchUp::stamp`]), so a pipelined
//! stream of unroutable publishes costs one round per batch, not one each.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::error::{CheckIsLeaderError, RaftError};
use tokio::sync::{mpsc, oneshot};

use super::forward::{Forwarder, ReadIndex};
use super::types::{Raft, META_GROUP};

/// How long one catch-up may take: the read index from the leader and the
/// local apply up to it. A node that cannot reach the leader in this time
/// answers from its own replica, as before.
pub const CATCH_UP_FOR: Duration = Duration::from_secs(2);

/// Pause between two asks of a catch-up whose leader could not answer.
pub const RETRY_EVERY: Duration = Duration::from_millis(50);

/// The shared catch-up of this node's meta replica: a task that runs one
/// round for every caller waiting when it starts, numbering its rounds so a
/// caller can tell whether a round already run started after its request
/// arrived ([`CatchUp::stamp`]).
pub struct CatchUp {
    asks: mpsc::UnboundedSender<oneshot::Sender<bool>>,
    rounds: Arc<Rounds>,
}

/// The rounds run so far.
#[derive(Default)]
struct Rounds {
    /// Rounds started (a round takes its number, from 1, before it asks the
    /// leader for its read index).
    started: AtomicU64,
    /// The last round that ended: its number, and whether it caught up.
    last: Mutex<(u64, bool)>,
}

impl CatchUp {
    /// Spawns the catch-up task of node `me` over its meta `raft`, reaching
    /// the leader through `forwarder`. The task ends with the last clone of
    /// the returned handle.
    pub fn spawn(me: u64, raft: Raft, forwarder: Arc<Forwarder>) -> Self {
        let (asks, mut rx) = mpsc::unbounded_channel::<oneshot::Sender<bool>>();
        let rounds = Arc::new(Rounds::default());
        let shared = rounds.clone();
        tokio::spawn(async move {
            while let Some(first) = rx.recv().await {
                let mut waiting = vec![first];
                while let Ok(w) = rx.try_recv() {
                    waiting.push(w);
                }
                let n = shared.started.fetch_add(1, Ordering::SeqCst) + 1;
                let done = catch_up(me, &raft, &forwarder, CATCH_UP_FOR).await;
                if let Ok(mut last) = shared.last.lock() {
                    *last = (n, done);
                }
                for w in waiting {
                    let _ = w.send(done);
                }
            }
        });
        CatchUp { asks, rounds }
    }

    /// The number of rounds started so far. Taken once a request has
    /// arrived (e.g. when a channel starts on a batch of frames read from
    /// its socket), every round numbered above it started after the request
    /// arrived, so its read index covers every write committed before.
    pub fn stamp(&self) -> u64 {
        self.rounds.started.load(Ordering::SeqCst)
    }

    /// Returns once a round numbered above `stamp` ended (at once when one
    /// already has): true when the local replica then held every meta write
    /// committed before the request stamped, false when the round gave up
    /// (no leader, unreachable, older leader) — the caller then goes on with
    /// the local view. At most [`CATCH_UP_FOR`] plus the round running.
    pub async fn wait_since(&self, stamp: u64) -> bool {
        if let Ok(last) = self.rounds.last.lock() {
            if last.0 > stamp {
                return last.1;
            }
        }
        let (tx, rx) = oneshot::channel();
        if self.asks.send(tx).is_err() {
            return false;
        }
        rx.await.unwrap_or(false)
    }
}

/// One catch-up of node `me`'s meta replica within `within`: asks the leader
/// (itself, or over `forwarder`) for a read index and waits until the local
/// replica applied it. A leader that cannot answer yet (no leader known, a
/// node just started whose detector has not heard its peers, an election)
/// is asked again every [`RETRY_EVERY`]. False when it could not in time,
/// or the leader is older than the call (see [`CatchUp::wait_since`]).
pub async fn catch_up(me: u64, raft: &Raft, forwarder: &Forwarder, within: Duration) -> bool {
    tokio::time::timeout(within, async {
        let mut hint: Option<u64> = None;
        loop {
            let leader = hint.take().or(raft.metrics().borrow().current_leader);
            let index = match leader {
                None => None,
                Some(l) => {
                    let answer = if l == me {
                        read_index_here(raft).await
                    } else {
                        forwarder.read_index(l, META_GROUP, within).await
                    };
                    match answer {
                        ReadIndex::Index(i) => Some(i),
                        ReadIndex::Leader(h) => {
                            hint = (h != 0 && h != l).then_some(h);
                            None
                        }
                        ReadIndex::Unsupported => return false,
                        ReadIndex::Failed(_) => None,
                    }
                }
            };
            if let Some(index) = index {
                return applied_here(raft, index, None).await;
            }
            if hint.is_none() {
                tokio::time::sleep(RETRY_EVERY).await;
            }
        }
    })
    .await
    .unwrap_or(false)
}

/// Waits until this node's replica of the group `raft` runs applied log
/// index `index`: true once it did, false when `within` (None: no bound)
/// ran out or the group shut down. Behind the meta catch-up, a forwarded
/// meta write's local apply and the cluster service's `WaitApplied`.
pub async fn applied_here(raft: &Raft, index: u64, within: Option<Duration>) -> bool {
    raft.wait(within)
        .applied_index_at_least(Some(index), "log index applied here")
        .await
        .is_ok()
}

/// This node's read index of the group `raft` runs (Raft §6.4): its commit
/// index once a quorum confirmed its leadership, or the leader it knows
/// (0 = none) when it does not lead. Served to other nodes by the cluster
/// service's `ReadIndex`, and used as is when this node leads meta.
pub async fn read_index_here(raft: &Raft) -> ReadIndex {
    match raft.get_read_log_id().await {
        Ok((read, _applied)) => ReadIndex::Index(read.map_or(0, |l| l.index)),
        Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f))) => {
            ReadIndex::Leader(f.leader_id.unwrap_or(0))
        }
        Err(e) => ReadIndex::Failed(e.to_string()),
    }
}
