//! The meta leader tells its followers of a commit while their appends are
//! still in flight.
//!
//! openraft 0.9 replicates to each follower with one append in flight, and
//! tells a follower of a commit only with the append after it. A node that
//! forwarded a meta write (a queue declare through a follower of the meta
//! group) waits until its own replica applied the entry; its append held the
//! entry, but the commit reached it only one more round trip after that
//! append's answer, because the leader committed on the other follower's
//! answer (issue 31: ~0.5 ms of a declare's ~4 ms with 8 channels, p90
//! 1.5 ms).
//!
//! So the leader, once a meta write committed, also sends each follower an
//! entry-less append off the replication stream ([`CommitUpdates`]): the
//! leader's vote, the last log id the follower confirmed as
//! `prev_log_id`, and the new commit. A follower commits at most what it
//! accepted from this leader (openraft 0.9 `FollowingHandler::commit_entries`:
//! the least of the leader's commit and its `accepted`), which includes the
//! entries of the append still in flight once it received them; an older
//! `prev_log_id` never lowers `accepted` or its commit index. A follower
//! that does not hold the entry yet commits what it holds, and learns the
//! rest from the next append, as before.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use openraft::raft::AppendEntriesRequest;
use openraft::{LogId, Vote};

use super::commit_updates::CommitUpdates;
use super::types::{NodeId, TypeConfig};

/// Where each follower of the meta group stands for its leader on this node:
/// what it confirmed in which vote, and its commit-update sender.
#[derive(Default)]
pub struct CommitHints {
    followers: Mutex<HashMap<NodeId, Follower>>,
}

/// One follower as its replication stream last saw it.
struct Follower {
    vote: Vote<NodeId>,
    confirmed: LogId<NodeId>,
    updates: Arc<CommitUpdates>,
}

impl CommitHints {
    /// Records that `target` confirmed the log up to `confirmed` to the
    /// leader of `vote`; `updates` sends it entry-less appends.
    pub fn note(
        &self,
        target: NodeId,
        vote: Vote<NodeId>,
        confirmed: LogId<NodeId>,
        updates: Arc<CommitUpdates>,
    ) {
        if let Ok(mut f) = self.followers.lock() {
            f.insert(
                target,
                Follower {
                    vote,
                    confirmed,
                    updates,
                },
            );
        }
    }

    /// Tells every follower recorded under the leader's current `vote`
    /// that the log is committed up to `commit`, off its replication stream
    /// (a newer hint replaces one not sent yet). Followers recorded under
    /// another vote (a former leadership) are forgotten.
    pub fn push(&self, vote: &Vote<NodeId>, commit: LogId<NodeId>) {
        let Ok(mut followers) = self.followers.lock() else {
            return;
        };
        followers.retain(|_, f| f.vote == *vote);
        let mut queued = 0;
        for f in followers.values() {
            if f.confirmed.index < commit.index {
                f.updates.push(AppendEntriesRequest::<TypeConfig> {
                    vote: *vote,
                    prev_log_id: Some(f.confirmed),
                    leader_commit: Some(commit),
                    entries: Vec::new(),
                });
                queued += 1;
            }
        }
        crate::metrics::COUNTERS.commit_hints_queued(queued);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::raft::AppendEntriesResponse;
    use tokio::sync::mpsc;

    fn log_id(term: u64, index: u64) -> LogId<NodeId> {
        LogId::new(openraft::CommittedLeaderId::new(term, 1), index)
    }

    /// A follower behind the commit gets a hint from what it confirmed; one
    /// at the commit gets none; one recorded under a former vote is dropped.
    #[tokio::test]
    async fn hints_go_to_followers_behind_the_commit_of_this_leadership() -> anyhow::Result<()> {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let sender = |node: NodeId| {
            let tx = tx.clone();
            Arc::new(CommitUpdates::start(move |req| {
                let _ = tx.send((node, req));
                async { Some(AppendEntriesResponse::Success) }
            }))
        };
        let hints = CommitHints::default();
        let now = Vote::new_committed(3, 1);
        hints.note(2, now, log_id(3, 10), sender(2));
        hints.note(3, now, log_id(3, 12), sender(3));
        hints.note(4, Vote::new_committed(2, 4), log_id(2, 9), sender(4));
        hints.push(&now, log_id(3, 12));
        let (node, req) = tokio::time::timeout(std::time::Duration::from_secs(5), rx.recv())
            .await?
            .ok_or_else(|| anyhow::anyhow!("no hint sent"))?;
        assert_eq!(node, 2);
        assert_eq!(req.prev_log_id, Some(log_id(3, 10)));
        assert_eq!(req.leader_commit, Some(log_id(3, 12)));
        assert_eq!(req.vote, now);
        assert!(req.entries.is_empty());
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        assert!(
            rx.try_recv().is_err(),
            "node 3 is at the commit; node 4 is of a former vote"
        );
        assert_eq!(hints.followers.lock().map(|f| f.len()).unwrap_or(0), 2);
        Ok(())
    }
}
