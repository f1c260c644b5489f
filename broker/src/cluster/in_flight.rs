//! An append still on the wire after openraft stopped waiting for it.
//!
//! openraft 0.9 gives an append its heartbeat interval (100 ms), drops the
//! call when that runs out and sends the same batch again. On a link too slow
//! to carry a batch in 100 ms (256 kbit/s carries 3 KB) every copy was cut
//! off half-sent: replication to that follower never advanced, and a queue
//! whose commit needed it confirmed nothing (the fault suite's `delay`
//! nemesis; `cluster-tests/tests/slow_link.rs`). So the transport runs each
//! append in a task of its own, and a retry that starts where the running
//! call started (same leader vote, same previous log id) waits for that
//! call's reply instead of sending the batch again: each batch crosses the
//! link once, at the link's speed.
//!
//! openraft stamps a reply with the time of the call it answers (its leader
//! lease); a reply taken over by a retry is stamped later than it was sent.
//! quorumq serves no read on that lease (every read goes through the log).

use openraft::raft::AppendEntriesResponse;
use openraft::{LogId, Vote};
use tokio::task::JoinHandle;

use super::types::NodeId;

/// The reply of an append: openraft's response, or the transport's error.
pub type Reply<E> = Result<AppendEntriesResponse<NodeId>, E>;

/// A running append to one follower; dropping it cancels the call.
pub struct InFlight<E> {
    vote: Vote<NodeId>,
    prev: Option<LogId<NodeId>>,
    last: Option<LogId<NodeId>>,
    call: JoinHandle<Reply<E>>,
}

impl<E: Send + 'static> InFlight<E> {
    /// Runs `call`, an append from leader `vote` of the entries after `prev`
    /// up to `last`, in a task of its own.
    pub fn start(
        vote: Vote<NodeId>,
        prev: Option<LogId<NodeId>>,
        last: Option<LogId<NodeId>>,
        call: impl std::future::Future<Output = Reply<E>> + Send + 'static,
    ) -> Self {
        InFlight {
            vote,
            prev,
            last,
            call: tokio::spawn(call),
        }
    }

    /// True when an append from `vote` after `prev` can take this call's
    /// reply: it starts where this call started, for the same leader.
    pub fn answers(&self, vote: &Vote<NodeId>, prev: &Option<LogId<NodeId>>) -> bool {
        self.vote == *vote && self.prev == *prev
    }

    /// Waits up to `ttl` for the reply, as the answer to a retry whose last
    /// entry is `last`: a success up to this call's last entry is a partial
    /// success for a longer retry. `None`: still running. `Some(Err(..))`
    /// with `lost` mapped: the task ended without a reply (it panicked).
    pub async fn wait(
        &mut self,
        ttl: std::time::Duration,
        last: Option<LogId<NodeId>>,
        lost: impl FnOnce(String) -> E,
    ) -> Option<Reply<E>> {
        let reply = match tokio::time::timeout(ttl, &mut self.call).await {
            Err(_) => return None,
            Ok(Err(join)) => return Some(Err(lost(join.to_string()))),
            Ok(Ok(reply)) => reply,
        };
        Some(reply.map(|r| match r {
            AppendEntriesResponse::Success if self.last < last => {
                AppendEntriesResponse::PartialSuccess(self.last)
            }
            AppendEntriesResponse::PartialSuccess(m) if m >= last => AppendEntriesResponse::Success,
            other => other,
        }))
    }
}

impl<E> Drop for InFlight<E> {
    fn drop(&mut self) {
        self.call.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::CommittedLeaderId;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    fn id(term: u64, index: u64) -> Option<LogId<NodeId>> {
        Some(LogId::new(CommittedLeaderId::new(term, 1), index))
    }

    fn vote(term: u64) -> Vote<NodeId> {
        Vote::new_committed(term, 1)
    }

    async fn slow_success(ms: u64) -> Reply<String> {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        Ok(AppendEntriesResponse::Success)
    }

    #[tokio::test]
    async fn only_a_retry_from_the_same_leader_and_start_takes_the_reply() {
        let f = InFlight::start(vote(2), id(2, 10), id(2, 74), slow_success(0));
        assert!(f.answers(&vote(2), &id(2, 10)));
        assert!(!f.answers(&vote(3), &id(2, 10)), "another leader");
        assert!(!f.answers(&vote(2), &id(2, 11)), "another start");
        assert!(!f.answers(&vote(2), &None));
    }

    #[tokio::test]
    async fn a_retry_waits_for_the_running_call_instead_of_sending_again() {
        let mut f = InFlight::start(vote(2), id(2, 10), id(2, 74), slow_success(300));
        // openraft's first two waits run out; the call goes on.
        assert!(f
            .wait(Duration::from_millis(100), id(2, 74), |e| e)
            .await
            .is_none());
        assert!(f
            .wait(Duration::from_millis(100), id(2, 74), |e| e)
            .await
            .is_none());
        let reply = f.wait(Duration::from_secs(5), id(2, 74), |e| e).await;
        assert_eq!(reply, Some(Ok(AppendEntriesResponse::Success)));
    }

    #[tokio::test]
    async fn the_call_runs_on_while_nobody_waits() {
        // openraft drops its wait at its timeout; the call must not stop with
        // it. Twenty 10 ms steps: a call polled only while waited for would
        // still be a few steps in.
        let steps = async {
            for _ in 0..20 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Ok(AppendEntriesResponse::Success)
        };
        let mut f = InFlight::start(vote(2), id(2, 10), id(2, 74), steps);
        assert!(f
            .wait(Duration::from_millis(50), id(2, 74), |e| e)
            .await
            .is_none());
        tokio::time::sleep(Duration::from_millis(400)).await;
        let reply = f.wait(Duration::ZERO, id(2, 74), |e| e).await;
        assert_eq!(
            reply,
            Some(Ok(AppendEntriesResponse::Success)),
            "the reply was ready without another wait"
        );
    }

    #[tokio::test]
    async fn a_longer_retry_gets_a_partial_success_and_a_shorter_one_a_success() {
        let mut f = InFlight::start(vote(2), id(2, 10), id(2, 40), slow_success(0));
        let reply = f.wait(Duration::from_secs(5), id(2, 74), |e| e).await;
        assert_eq!(
            reply,
            Some(Ok(AppendEntriesResponse::PartialSuccess(id(2, 40)))),
            "entries 41..=74 are still to send"
        );
        let partial = async { Ok(AppendEntriesResponse::PartialSuccess(id(2, 30))) };
        let mut f = InFlight::start(vote(2), id(2, 10), id(2, 40), partial);
        let reply = f.wait(Duration::from_secs(5), id(2, 20), |e| e).await;
        assert_eq!(reply, Some(Ok(AppendEntriesResponse::Success)));
        let partial = async { Ok(AppendEntriesResponse::PartialSuccess(id(2, 30))) };
        let mut f = InFlight::start(vote(2), id(2, 10), id(2, 40), partial);
        let reply = f.wait(Duration::from_secs(5), id(2, 40), |e| e).await;
        assert_eq!(
            reply,
            Some(Ok(AppendEntriesResponse::PartialSuccess(id(2, 30))))
        );
    }

    #[tokio::test]
    async fn refusals_and_errors_pass_through() {
        let conflict = async { Ok(AppendEntriesResponse::Conflict) };
        let mut f = InFlight::<String>::start(vote(2), id(2, 10), id(2, 40), conflict);
        let reply = f.wait(Duration::from_secs(5), id(2, 74), |e| e).await;
        assert_eq!(reply, Some(Ok(AppendEntriesResponse::Conflict)));
        let failed = async { Err("unreachable".to_string()) };
        let mut f = InFlight::start(vote(2), id(2, 10), id(2, 40), failed);
        let reply = f.wait(Duration::from_secs(5), id(2, 40), |e| e).await;
        assert_eq!(reply, Some(Err("unreachable".to_string())));
    }

    #[tokio::test]
    async fn dropping_it_cancels_the_call_and_a_panic_is_an_error() {
        let done = Arc::new(AtomicUsize::new(0));
        let d = done.clone();
        let f = InFlight::<String>::start(vote(2), id(2, 10), id(2, 40), async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            d.fetch_add(1, Ordering::SeqCst);
            Ok(AppendEntriesResponse::Success)
        });
        drop(f);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            done.load(Ordering::SeqCst),
            0,
            "the dropped call never finished"
        );
        let mut f = InFlight::<String>::start(vote(2), id(2, 10), id(2, 40), async {
            panic!("append task panicked")
        });
        let reply = f
            .wait(Duration::from_secs(5), id(2, 40), |e| format!("lost: {e}"))
            .await;
        assert!(matches!(reply, Some(Err(e)) if e.starts_with("lost:")));
    }
}
