//! Client side of the node-to-node `Cluster` calls a queue reference makes
//! when the leader is elsewhere: propose a command on the node that leads a
//! group, read a queue's counts from a replica.

use std::sync::Arc;
use std::time::Duration;

use super::secret::PeerChannel;
use bytes::Bytes;
use quorumq_proto::v1::cluster_client::ClusterClient;
use quorumq_proto::v1::{
    ProposeReply, ProposeRequest, QueryRequest, ReadIndexRequest, WaitAppliedRequest,
};

use super::detector::Detector;
use super::peers::{Peers, MAX_MESSAGE_BYTES};
use super::status::QueueStatus;
use super::types::{GroupReply, META_GROUP};

/// Outcome of one forwarded proposal.
#[derive(Debug)]
pub enum Forwarded {
    /// Committed and applied on the leader: its reply and log index.
    Reply(GroupReply, u64),
    /// The node is not the leader; it names the one it knows (0 = none).
    Leader(u64),
    /// The node does not run the group (not a member, or not opened yet).
    NoGroup,
    /// Unreachable, timed out, went down, or the write failed there; the
    /// proposal may or may not have been applied (resend it: proposals are
    /// de-duplicated).
    Failed(String),
}

/// Outcome of one read-index call ([`Forwarder::read_index`]).
#[derive(Debug, PartialEq, Eq)]
pub enum ReadIndex {
    /// The node leads the group and confirmed it with a quorum: its commit
    /// index (log index) at the time of the call.
    Index(u64),
    /// The node does not lead the group; it names the one it knows (0 = none).
    Leader(u64),
    /// The node is older than the call (UNIMPLEMENTED).
    Unsupported,
    /// Unreachable, timed out, or no quorum there.
    Failed(String),
}

/// What `node`'s answer `r` to a proposal says ([`Forwarder::propose`]).
fn outcome(node: u64, r: ProposeReply) -> Forwarded {
    if r.no_group {
        Forwarded::NoGroup
    } else if !r.reply.is_empty() {
        match raft_log::codec::decode::<GroupReply>(&r.reply) {
            Ok(g) => Forwarded::Reply(g, r.log_index),
            Err(e) => Forwarded::Failed(format!("node {node}: bad reply: {e}")),
        }
    } else if r.error.is_empty() {
        Forwarded::Leader(r.leader_hint)
    } else {
        Forwarded::Failed(format!("node {node}: {}", r.error))
    }
}

/// Forwarding client over the shared peer channels.
pub struct Forwarder {
    peers: Arc<Peers>,
    detector: Arc<Detector>,
}

impl Forwarder {
    /// A forwarder over `peers`, giving up on a node as soon as `detector`
    /// sees it down.
    pub fn new(peers: Arc<Peers>, detector: Arc<Detector>) -> Arc<Self> {
        Arc::new(Forwarder { peers, detector })
    }

    /// The failure detector (liveness of leaders and members).
    pub fn detector(&self) -> &Arc<Detector> {
        &self.detector
    }

    /// This node's id.
    pub fn me(&self) -> u64 {
        self.peers.me()
    }

    fn client(&self, node: u64) -> Option<ClusterClient<PeerChannel>> {
        Some(
            ClusterClient::new(self.peers.channel(node)?)
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
        )
    }

    /// Proposes `command` (bincode of the group's command: `MetaCommand`
    /// for group 0, `QueueCommand` otherwise) on `node`, waiting at most
    /// `timeout` and no longer than `node` is seen alive.
    ///
    /// A meta write goes as a frame on the node's frame link
    /// ([`super::frames::PROPOSE`]); a node too old for it (INVALID_ARGUMENT:
    /// an unknown frame kind) gets the unary `Propose` call, as other groups'
    /// proposals (they may carry message bodies).
    pub async fn propose(
        &self,
        node: u64,
        group: u64,
        command: Bytes,
        timeout: Duration,
    ) -> Forwarded {
        if group == META_GROUP
            && command.len() <= super::frames::MAX_FRAME_PAYLOAD
            && self.peers.frames().supported(node)
        {
            let frames = self.peers.frames();
            let call = frames.call(
                &self.peers,
                node,
                group,
                super::frames::PROPOSE,
                command.clone(),
            );
            let reply = tokio::select! {
                r = tokio::time::timeout(timeout, call) => r,
                _ = self.detector.wait_down(node) => {
                    return Forwarded::Failed(format!("node {node} is down"));
                }
            };
            match reply {
                Err(_) => {
                    return Forwarded::Failed(format!("node {node}: no reply within {timeout:?}"))
                }
                Ok(Ok(bytes)) => {
                    crate::metrics::COUNTERS.meta_write_forwarded("frame");
                    return match <ProposeReply as prost::Message>::decode(bytes) {
                        Ok(r) => outcome(node, r),
                        Err(e) => Forwarded::Failed(format!("node {node}: bad reply: {e}")),
                    };
                }
                // An older node: no such frame kind there, the call below.
                Ok(Err(status)) if status.code() == tonic::Code::InvalidArgument => {}
                Ok(Err(status)) => return Forwarded::Failed(format!("node {node}: {status}")),
            }
        }
        let Some(mut client) = self.client(node) else {
            return Forwarded::Failed(format!("no address for node {node}"));
        };
        let req = ProposeRequest {
            group_id: group,
            command,
            cluster_id: self.peers.cluster_id(),
        };
        let call = tokio::time::timeout(timeout, client.propose(req));
        let reply = tokio::select! {
            r = call => r,
            _ = self.detector.wait_down(node) => {
                return Forwarded::Failed(format!("node {node} is down"));
            }
        };
        match reply {
            Err(_) => Forwarded::Failed(format!("node {node}: no reply within {timeout:?}")),
            Ok(Err(status)) => Forwarded::Failed(format!("node {node}: {status}")),
            Ok(Ok(r)) => {
                if group == META_GROUP {
                    crate::metrics::COUNTERS.meta_write_forwarded("call");
                }
                outcome(node, r.into_inner())
            }
        }
    }

    /// A read index of `group` from `node` (Raft §6.4: what a replica must
    /// have applied to reflect every write committed before the call),
    /// waiting at most `timeout` and no longer than `node` is seen alive.
    pub async fn read_index(&self, node: u64, group: u64, timeout: Duration) -> ReadIndex {
        let Some(mut client) = self.client(node) else {
            return ReadIndex::Failed(format!("no address for node {node}"));
        };
        let req = ReadIndexRequest {
            group_id: group,
            cluster_id: self.peers.cluster_id(),
        };
        let call = tokio::time::timeout(timeout, client.read_index(req));
        let reply = tokio::select! {
            r = call => r,
            _ = self.detector.wait_down(node) => {
                return ReadIndex::Failed(format!("node {node} is down"));
            }
        };
        match reply {
            Err(_) => ReadIndex::Failed(format!("node {node}: no reply within {timeout:?}")),
            Ok(Err(status)) if status.code() == tonic::Code::Unimplemented => {
                ReadIndex::Unsupported
            }
            Ok(Err(status)) => ReadIndex::Failed(format!("node {node}: {status}")),
            Ok(Ok(r)) => {
                let r = r.into_inner();
                if r.leader {
                    ReadIndex::Index(r.log_index)
                } else {
                    ReadIndex::Leader(r.leader_hint)
                }
            }
        }
    }

    /// Waits until `node`'s replica of `group` applied log index `index`:
    /// true once it did, or when `node` is too old to tell (UNIMPLEMENTED);
    /// false when `within` ran out, `node` was seen down, or it holds no
    /// replica of `group`.
    pub async fn wait_applied(&self, node: u64, group: u64, index: u64, within: Duration) -> bool {
        let Some(mut client) = self.client(node) else {
            return false;
        };
        let req = WaitAppliedRequest {
            group_id: group,
            log_index: index,
            cluster_id: self.peers.cluster_id(),
            timeout_ms: u32::try_from(within.as_millis()).unwrap_or(u32::MAX),
        };
        // A little more than the node's own wait, for the round trip.
        let call = tokio::time::timeout(
            within + Duration::from_millis(200),
            client.wait_applied(req),
        );
        let reply = tokio::select! {
            r = call => r,
            _ = self.detector.wait_down(node) => return false,
        };
        match reply {
            Ok(Ok(r)) => r.into_inner().applied,
            Ok(Err(status)) => status.code() == tonic::Code::Unimplemented,
            Err(_) => false,
        }
    }

    /// Counts of `group` as the replica on `node` sees them.
    pub async fn query(&self, node: u64, group: u64) -> Option<QueueStatus> {
        let mut client = self.client(node)?;
        let r = tokio::time::timeout(
            Duration::from_secs(2),
            client.query(QueryRequest { group_id: group }),
        )
        .await
        .ok()?
        .ok()?
        .into_inner();
        r.found.then(|| QueueStatus {
            messages_ready: r.messages_ready,
            messages_unacknowledged: r.messages_unacknowledged,
            consumers: r.consumers,
            dead_letter_held: r.dead_letter_held,
            unreadable_bodies: r.unreadable_bodies,
            messages_delayed: r.messages_delayed,
            ..QueueStatus::default()
        })
    }
}
