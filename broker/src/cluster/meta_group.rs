//! The meta group as the rest of the node uses it: the local replica's
//! topology to read, and writes proposed to the group's leader (on this
//! node when it leads, else forwarded over gRPC).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::catch_up::{applied_here, CatchUp};
use super::commit_hints::CommitHints;
use super::forward::{Forwarded, Forwarder};
use super::types::{GroupCommand, GroupReply, Raft, META_GROUP};
use crate::amqp::error::ProtocolError;
use crate::meta::command::{MetaCommand, MetaReply};
use crate::meta::host::MetaHost;

/// Has the meta leader tell its followers that the log is committed up to
/// `commit` now, not at its next heartbeat (up to 100 ms later): a follower
/// applies a new queue record (and opens its replica), and a forwarded write
/// returns on its node, only once it knows the entry is committed (issue 31:
/// declares waited for heartbeats). A follower whose append is still in
/// flight hears it off the replication stream ([`CommitHints`]); the
/// heartbeat reaches the others.
pub async fn announce_commit(raft: &Raft, hints: &CommitHints, commit: openraft::LogId<u64>) {
    let vote = raft.metrics().borrow().vote;
    hints.push(&vote, commit);
    let _ = raft.trigger().heartbeat().await;
}

/// How long a meta write waits for a leader (elections, forwarding).
const META_WRITE_FOR: Duration = Duration::from_secs(30);

/// How long a binding change or a deletion waits for one other node to apply it
/// ([`MetaGroup::write`]): a node slower than this is left to catch up.
const APPLIED_EVERYWHERE_FOR: Duration = Duration::from_secs(2);

/// This node's member of the meta group: its Raft handle, its replica's
/// state machine, and the forwarder that reaches the leader.
pub struct MetaGroup {
    me: u64,
    raft: Raft,
    host: Arc<Mutex<MetaHost>>,
    forwarder: Arc<Forwarder>,
    catch_up: CatchUp,
    /// Where the followers stand, for [`announce_commit`].
    hints: Arc<CommitHints>,
}

impl MetaGroup {
    /// This node's (`me`) meta group: its Raft handle, the state machine
    /// `host` it applies to, the `forwarder` to the leader, and the
    /// followers' standing its transport records (`hints`). Spawns the
    /// shared catch-up task ([`CatchUp`]): call within a tokio runtime.
    pub fn new(
        me: u64,
        raft: Raft,
        host: Arc<Mutex<MetaHost>>,
        forwarder: Arc<Forwarder>,
        hints: Arc<CommitHints>,
    ) -> Self {
        let catch_up = CatchUp::spawn(me, raft.clone(), forwarder.clone());
        MetaGroup {
            me,
            raft,
            host,
            forwarder,
            catch_up,
            hints,
        }
    }

    /// The catch-up stamp of a request arriving now ([`CatchUp::stamp`]).
    pub fn catch_up_stamp(&self) -> u64 {
        self.catch_up.stamp()
    }

    /// Brings the local replica up to every meta write committed before the
    /// request stamped `stamp` arrived, sharing rounds with other callers
    /// ([`CatchUp::wait_since`]): for a lookup that found nothing locally.
    /// False when it gave up (≤ 2 s).
    pub async fn catch_up(&self, stamp: u64) -> bool {
        self.catch_up.wait_since(stamp).await
    }

    /// [`MetaGroup::catch_up`] on its own, waiting up to `within` (a node
    /// starting: it may have a long way to go).
    pub async fn catch_up_within(&self, within: Duration) -> bool {
        super::catch_up::catch_up(self.me, &self.raft, &self.forwarder, within).await
    }

    /// The meta group's Raft handle (cluster membership, topology).
    pub fn raft(&self) -> &Raft {
        &self.raft
    }

    /// Reads the topology of the local replica.
    pub fn with_topology<R>(&self, f: impl FnOnce(&crate::meta::Topology) -> R) -> Option<R> {
        self.host.lock().ok().map(|m| f(m.topology()))
    }

    /// `find` on the local replica's topology; when it finds nothing, again
    /// after a catch-up ([`MetaGroup::catch_up`]) stamped before the first
    /// look: an object created through another node a moment ago is found.
    /// None: `find` found nothing either time.
    pub async fn find<R>(&self, find: impl Fn(&crate::meta::Topology) -> Option<R>) -> Option<R> {
        let arrived = self.catch_up_stamp();
        if let Some(found) = self.with_topology(&find).flatten() {
            return Some(found);
        }
        self.catch_up(arrived).await;
        self.with_topology(&find).flatten()
    }

    /// The queue records the local replica changed since the last call
    /// ([`MetaHost::take_queue_changes`]); a full change when the lock is
    /// poisoned.
    pub fn take_queue_changes(&self) -> crate::meta::host::QueueChanges {
        self.host
            .lock()
            .map(|mut h| h.take_queue_changes())
            .unwrap_or_default()
    }

    /// The first members of new quorum queue group `group`, once
    /// ([`MetaHost::take_newborn`]); `None` when the lock is poisoned.
    pub fn take_newborn(&self, group: u64) -> Option<Vec<u64>> {
        self.host.lock().ok()?.take_newborn(group)
    }

    /// Proposes a topology change to the meta group: on this node when it
    /// leads, else forwarded to the leader; returns once the local replica
    /// applied it too (so this node's routing sees its own writes).
    ///
    /// Errors: 541 INTERNAL_ERROR when no meta leader answered in 30 s.
    pub async fn write(&self, cmd: MetaCommand) -> Result<MetaReply, ProtocolError> {
        let started = std::time::Instant::now();
        let me = self.me;
        let mut last = String::from("no meta leader");
        // A leader this node's core named when it refused a write (its
        // metrics can still show this node as leader for a moment).
        let mut hint: Option<u64> = None;
        while started.elapsed() < META_WRITE_FOR {
            let leader = hint.take().or(self.raft.metrics().borrow().current_leader);
            match leader {
                Some(l) if l == me => {
                    match self
                        .raft
                        .client_write(GroupCommand::Meta(cmd.clone()))
                        .await
                    {
                        Ok(resp) => {
                            announce_commit(&self.raft, &self.hints, resp.log_id).await;
                            return match resp.data {
                                GroupReply::Meta(r) => {
                                    Ok(self.settle(&cmd, r, resp.log_id.index).await)
                                }
                                _ => Err(ProtocolError::internal("unexpected meta reply")),
                            };
                        }
                        Err(openraft::error::RaftError::APIError(
                            openraft::error::ClientWriteError::ForwardToLeader(f),
                        )) if f.leader_id.is_some_and(|l| l != me) => {
                            hint = f.leader_id;
                            last = format!("forward to node {:?}", f.leader_id);
                            continue;
                        }
                        Err(e) => last = e.to_string(),
                    }
                }
                Some(l) => {
                    let bytes = raft_log::codec::encode(&cmd).map_err(ProtocolError::internal)?;
                    match self
                        .forwarder
                        .propose(l, META_GROUP, bytes.into(), Duration::from_secs(10))
                        .await
                    {
                        Forwarded::Reply(GroupReply::Meta(r), index) => {
                            self.await_applied(index).await;
                            return Ok(self.settle(&cmd, r, index).await);
                        }
                        Forwarded::Reply(..) => {
                            return Err(ProtocolError::internal("unexpected meta reply"))
                        }
                        other => last = format!("{other:?}"),
                    }
                }
                None => {}
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(ProtocolError::internal(format!("meta group: {last}")))
    }

    /// The reply to `cmd`, committed at log index `index` and applied here,
    /// once every running node applied it too where a stale view would get
    /// it wrong ([`MetaCommand::must_reach_every_node`]; RabbitMQ's metadata
    /// changes commit on every running node before their ok).
    async fn settle(&self, cmd: &MetaCommand, reply: MetaReply, index: u64) -> MetaReply {
        if cmd.must_reach_every_node()
            && !matches!(reply, MetaReply::Error(_) | MetaReply::QueueDeleted(None))
        {
            self.applied_everywhere(index).await;
        }
        reply
    }

    /// Waits until every other member of the meta group applied log index
    /// `index`, each for at most [`APPLIED_EVERYWHERE_FOR`] and no longer
    /// than the failure detector sees it up (Mnesia's `sync_transaction`
    /// waits for the running nodes alike, until `net_ticktime` gives up on
    /// one). A node that does not answer in time is logged and left: it
    /// catches up as any lagging follower does.
    async fn applied_everywhere(&self, index: u64) {
        let others: Vec<u64> = self
            .raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .nodes()
            .map(|(id, _)| *id)
            .filter(|id| *id != self.me)
            .collect();
        let waits = others.iter().map(|node| {
            self.forwarder
                .wait_applied(*node, META_GROUP, index, APPLIED_EVERYWHERE_FOR)
        });
        let applied = futures::future::join_all(waits).await;
        for (node, ok) in others.iter().zip(applied) {
            if !ok {
                tracing::debug!(
                    node,
                    index,
                    "a topology change is not applied on a node yet"
                );
            }
        }
    }

    /// Waits (≤ 5 s) until the local meta replica applied log index
    /// `index` (a write this node forwarded), so its routing sees it.
    async fn await_applied(&self, index: u64) {
        applied_here(&self.raft, index, Some(Duration::from_secs(5))).await;
    }
}
