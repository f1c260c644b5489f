//! Commit-index updates off the replication path.
//!
//! openraft 0.9 replicates to each follower with one RPC in flight, and
//! every advance of the leader's commit index queues an entry-less
//! AppendEntries (a "heartbeat" carrying only `leader_commit`) on that same
//! stream. At moderate load every other RPC was such an update, and the next
//! entries waited behind it: on this 2-core machine one loopback RPC costs
//! ~0.4 ms, so a publish at 1k msg/s waited ~1.2 ms before its entries were
//! even sent (issue 9's timeline, `timeline` trace target).
//!
//! An update whose `prev_log_id` is the follower's confirmed matching log id
//! carries nothing but the commit index, so the transport answers it at once
//! and sends it here: one task per follower and replication session sends
//! the newest pending update, one at a time (older ones are superseded).
//! Safe to reorder with later entries of the same leader: a follower accepts
//! an append whose `prev_log_id` it holds or has committed, commits at most
//! what it accepted from this leader, and never moves its commit index back
//! (openraft 0.9 `FollowingHandler::commit_entries`, `update_committed`).
//! What the follower answers is kept: a higher vote or a conflict is handed
//! to the replication stream on its next call (see [`CommitUpdates::take_refusal`]).

use std::sync::{Arc, Mutex};

use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse};
use tokio::sync::watch;

use super::types::{NodeId, TypeConfig};

/// Sends one follower's commit-index updates in the background.
pub struct CommitUpdates {
    pending: watch::Sender<Option<AppendEntriesRequest<TypeConfig>>>,
    refusal: Arc<Mutex<Option<AppendEntriesResponse<NodeId>>>>,
}

impl CommitUpdates {
    /// Starts the sender task; `send` makes one real RPC and returns the
    /// follower's answer (None when the RPC failed: the next entries carry
    /// the commit index anyway). The task ends when this value is dropped.
    pub fn start<F, Fut>(send: F) -> Self
    where
        F: Fn(AppendEntriesRequest<TypeConfig>) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Option<AppendEntriesResponse<NodeId>>> + Send,
    {
        let (pending, mut rx) = watch::channel(None);
        let refusal = Arc::new(Mutex::new(None));
        let seen = refusal.clone();
        tokio::spawn(async move {
            while rx.changed().await.is_ok() {
                let Some(update) = rx.borrow_and_update().clone() else {
                    continue;
                };
                // Boxed: the task of an idle group then holds a pointer, not
                // a whole gRPC call's state (idle queues must stay cheap).
                match Box::pin(send(update)).await {
                    Some(r @ AppendEntriesResponse::HigherVote(_))
                    | Some(r @ AppendEntriesResponse::Conflict) => {
                        if let Ok(mut s) = seen.lock() {
                            *s = Some(r);
                        }
                    }
                    _ => {}
                }
            }
        });
        CommitUpdates { pending, refusal }
    }

    /// Queues `update` (entry-less), replacing any update not yet sent.
    pub fn push(&self, update: AppendEntriesRequest<TypeConfig>) {
        self.pending.send_replace(Some(update));
    }

    /// A higher vote or conflict a background update met, once: the
    /// replication stream must see it (step down, or probe the follower's
    /// log again).
    pub fn take_refusal(&self) -> Option<AppendEntriesResponse<NodeId>> {
        self.refusal.lock().ok().and_then(|mut r| r.take())
    }
}
