//! Server side of the cluster port: the group-tagged Raft transport
//! (`RaftTransport`: routed by group id to the local replica) and the
//! node-to-node `Cluster` calls (propose on this node's leader, deliveries
//! for local consumers, counts, failure-detector beats).

use std::collections::HashSet;
use std::io::Cursor;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use openraft::error::ClientWriteError;
use openraft::raft::{AppendEntriesRequest, VoteRequest};
use openraft::{Snapshot, SnapshotMeta, Vote};
use quorumq_proto::v1::cluster_server::{Cluster, ClusterServer};
use quorumq_proto::v1::raft_transport_server::{RaftTransport, RaftTransportServer};
use quorumq_proto::v1::{
    AppendChunk, Beat, DeliverChunk, DeliverReply, DeliverRequest, JoinReply, JoinRequest,
    ProposeReply, ProposeRequest, QueryReply, QueryRequest, RaftFrame, RaftReply, RaftRequest,
    ReadIndexReply, ReadIndexRequest, SnapshotChunk, WaitAppliedReply, WaitAppliedRequest,
};
use tonic::{Request, Response, Status, Streaming};

use super::detector::{BeatStream, Detector};
use super::forward::ReadIndex;
use super::groups::{GroupReplica, GroupTable};
use super::peers::{Peers, MAX_MESSAGE_BYTES};
use super::types::{GroupCommand, NodeId, Origin, TypeConfig, META_GROUP};
use crate::consumers::{ConsumerRegistry, QueueDelivery};
use crate::meta::command::MetaCommand;
use crate::queue::types::{ConsumerId, Delivery, QueueCommand};

/// State both services serve from.
#[derive(Clone)]
pub struct ClusterServices {
    /// Node table and cluster id.
    pub peers: Arc<Peers>,
    /// Local replicas by group.
    pub groups: Arc<GroupTable>,
    /// Failure detector (beats).
    pub detector: Arc<Detector>,
    /// Local consumers (deliveries from remote leaders).
    pub consumers: Arc<ConsumerRegistry>,
    /// This node in this boot: proposals made here carry it.
    pub origin: Origin,
    /// `Deliver` calls taken, so a retried one is not delivered twice.
    pub seen_calls: Arc<super::deliveries::SeenCalls>,
    /// This node's queues, set once they exist: `Propose` and `Query` of a
    /// node-local queue whose home is this node are served from its handle.
    pub queues: Arc<std::sync::OnceLock<std::sync::Weak<crate::queue::registry::Queues>>>,
    /// The meta group's followers, for the commit hints sent after a
    /// forwarded meta write ([`super::commit_hints`]).
    pub meta_hints: Arc<super::commit_hints::CommitHints>,
}

impl ClusterServices {
    /// The tonic services, with the message size limit raised.
    pub fn servers(
        self,
    ) -> (
        RaftTransportServer<ClusterServices>,
        ClusterServer<ClusterServices>,
    ) {
        (
            RaftTransportServer::new(self.clone())
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
            ClusterServer::new(self)
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
        )
    }

    fn check_cluster(&self, theirs: u64) -> Result<(), Status> {
        if self.peers.accepts(theirs) {
            Ok(())
        } else {
            tracing::error!(
                theirs,
                ours = self.peers.cluster_id(),
                "refusing a request from a node of another cluster"
            );
            Err(Status::failed_precondition(format!(
                "cluster id mismatch: this node belongs to cluster {:x}, the request to {theirs:x}",
                self.peers.cluster_id()
            )))
        }
    }

    async fn replica(&self, group: u64) -> Result<Arc<dyn GroupReplica>, Status> {
        self.find_replica(group, GroupTable::get).await
    }

    /// The replica of `group` as `find` (a [`GroupTable`] lookup) returns it;
    /// a queue group not open here yet is waited for up to [`OPEN_WAIT`].
    async fn find_replica(
        &self,
        group: u64,
        find: Lookup,
    ) -> Result<Arc<dyn GroupReplica>, Status> {
        let found = match find(&self.groups, group) {
            Some(r) => Some(r),
            None if group != META_GROUP => self.groups.wait_for(group, OPEN_WAIT, find).await,
            None => None,
        };
        found.ok_or_else(|| Status::not_found(format!("group {group} is not open on this node")))
    }
}

impl ClusterServices {
    /// The handle of node-local queue `group` when its home is this node.
    fn local_queue(&self, group: u64) -> Option<Arc<crate::queue::handle::QueueHandle>> {
        if group == META_GROUP {
            return None;
        }
        let queues = self.queues.get()?.upgrade()?;
        queues.queue_by_group(group).filter(|h| h.is_local_here())
    }

    /// One group-tagged Raft RPC: check the cluster id, find the group's
    /// replica with `find`, decode the openraft request, call, encode the
    /// result.
    async fn raft_rpc<Req, Resp, Fut>(
        &self,
        req: Request<RaftRequest>,
        find: Lookup,
        call: impl FnOnce(super::types::Raft, Req) -> Fut,
    ) -> Result<Response<RaftReply>, Status>
    where
        Req: serde::de::DeserializeOwned,
        Resp: serde::Serialize,
        Fut: std::future::Future<Output = Resp>,
    {
        let req = req.into_inner();
        let payload = self
            .raft_call(req.group_id, req.cluster_id, &req.payload, find, call)
            .await?;
        Ok(Response::new(RaftReply {
            payload: payload.into(),
        }))
    }

    /// [`ClusterServices::raft_rpc`] on its parts (a unary call's or a
    /// frame's): the encoded reply.
    async fn raft_call<Req, Resp, Fut>(
        &self,
        group: u64,
        cluster: u64,
        payload: &bytes::Bytes,
        find: Lookup,
        call: impl FnOnce(super::types::Raft, Req) -> Fut,
    ) -> Result<Vec<u8>, Status>
    where
        Req: serde::de::DeserializeOwned,
        Resp: serde::Serialize,
        Fut: std::future::Future<Output = Resp>,
    {
        self.check_cluster(cluster)?;
        let replica = self.find_replica(group, find).await?;
        // A seeded replica answers once its seed is durable (a follower's
        // answer acknowledges the seeded entries: `bootstrap::SeedSync`).
        if let Some(seed) = replica.seed_sync() {
            seed.wait()
                .await
                .map_err(|e| Status::unavailable(e.to_string()))?;
        }
        let r = call(replica.raft().clone(), decode_shared(payload)?).await;
        encode(&r)
    }

    /// A command proposed to group `group_id` through this node (a
    /// `Propose` call's or a [`super::frames::PROPOSE`] frame's): the reply
    /// once committed and applied here, the leader to try instead, or no
    /// group here.
    ///
    /// Errors: FAILED_PRECONDITION for another cluster's call; the command
    /// cannot be decoded.
    async fn propose_here(
        &self,
        group_id: u64,
        cluster_id: u64,
        command: &[u8],
    ) -> Result<ProposeReply, Status> {
        self.check_cluster(cluster_id)?;
        let Some(replica) = self.groups.get(group_id) else {
            if let Some(local) = self.local_queue(group_id) {
                return propose_local(&local, command).await;
            }
            return Ok(ProposeReply {
                no_group: true,
                ..Default::default()
            });
        };
        if group_id != META_GROUP && self.detector.is_draining() {
            // Draining: this node appends no more as a queue leader, so the
            // leadership can move (cluster::drain); the proposer retries
            // until another member leads.
            return Ok(ProposeReply::default());
        }
        let cmd = if group_id == META_GROUP {
            GroupCommand::Meta(decode::<MetaCommand>(command)?)
        } else {
            GroupCommand::Queue {
                origin: self.origin,
                cmd: decode::<QueueCommand>(command)?,
            }
        };
        let reply = match replica.raft().client_write(cmd).await {
            Ok(resp) => {
                if group_id == META_GROUP {
                    // The forwarding node returns once it applied the entry.
                    super::meta_group::announce_commit(
                        replica.raft(),
                        &self.meta_hints,
                        resp.log_id,
                    )
                    .await;
                }
                ProposeReply {
                    reply: encode(&resp.data)?.into(),
                    log_index: resp.log_id.index,
                    ..Default::default()
                }
            }
            Err(openraft::error::RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
                ProposeReply {
                    leader_hint: f.leader_id.unwrap_or(0),
                    ..Default::default()
                }
            }
            Err(e) => ProposeReply {
                error: e.to_string(),
                ..Default::default()
            },
        };
        Ok(reply)
    }

    /// One frame of a [`RaftTransport::frames`] stream: its reply (same id
    /// and kind), with the encoded result or the refusal.
    async fn answer_frame(&self, f: RaftFrame) -> RaftFrame {
        let r = match f.kind {
            super::frames::APPEND => {
                self.raft_call(
                    f.group_id,
                    f.cluster_id,
                    &f.payload,
                    GroupTable::get_for_append,
                    append,
                )
                .await
            }
            super::frames::VOTE => {
                self.raft_call(
                    f.group_id,
                    f.cluster_id,
                    &f.payload,
                    GroupTable::get,
                    |raft, rpc: VoteRequest<NodeId>| async move { raft.vote(rpc).await },
                )
                .await
            }
            super::frames::PROPOSE => self
                .propose_here(f.group_id, f.cluster_id, &f.payload)
                .await
                .map(|r| prost::Message::encode_to_vec(&r)),
            other => Err(Status::invalid_argument(format!(
                "unknown frame kind {other}"
            ))),
        };
        super::frames::reply(f.id, f.kind, r)
    }
}

/// An AppendEntries handed to the group's Raft (a unary call's or a frame's),
/// traced on the `timeline` target.
async fn append(
    raft: super::types::Raft,
    rpc: AppendEntriesRequest<TypeConfig>,
) -> Result<openraft::raft::AppendEntriesResponse<NodeId>, openraft::error::RaftError<NodeId>> {
    let last = rpc.entries.last().map_or(0, |e| e.log_id.index);
    let n = rpc.entries.len();
    tracing::trace!(target: "timeline", ev = "ae_recv", last, n);
    let r = raft.append_entries(rpc).await;
    tracing::trace!(target: "timeline", ev = "ae_resp", last, n);
    r
}

/// How long a Raft RPC for a queue group not open on this node waits for it
/// to open: less than the leader's append timeout (openraft's
/// `heartbeat_interval`, 100 ms), so the leader hears "not open" rather than
/// a timeout, and backs off (`transport`).
const OPEN_WAIT: Duration = Duration::from_millis(80);

/// Longest a `WaitApplied` call waits, whatever its caller asks.
const WAIT_APPLIED_AT_MOST: Duration = Duration::from_secs(5);

/// Streams a peer may reset before the cluster server accepted them, on one
/// connection, before the server closes it (hyper's `max_pending_accept_reset_streams`,
/// 20 by default: its guard against HTTP/2 rapid reset, CVE-2023-44487). A
/// peer cancels every Raft RPC that outlives its timeout (100 ms appends,
/// 101 ms votes), and on a loaded node thousands of groups time out at once:
/// past 20 the connection every group shares was closed ("Some resource has
/// been exhausted"), every group's RPCs failed, and declares stalled for
/// seconds (issue 31). The cluster port takes only nodes of the cluster.
pub const MAX_PENDING_ACCEPT_RESETS: usize = 100_000;

/// How an RPC finds its group's replica in the [`GroupTable`].
type Lookup = fn(&GroupTable, u64) -> Option<Arc<dyn GroupReplica>>;

fn decode<T: serde::de::DeserializeOwned>(b: &[u8]) -> Result<T, Status> {
    raft_log::codec::decode(b)
        .map_err(|e| Status::invalid_argument(format!("undecodable request: {e}")))
}

/// [`decode`], with big byte fields as slices of `b` (`raft_log::codec::decode_shared`).
fn decode_shared<T: serde::de::DeserializeOwned>(b: &bytes::Bytes) -> Result<T, Status> {
    raft_log::codec::decode_shared(b)
        .map_err(|e| Status::invalid_argument(format!("undecodable request: {e}")))
}

fn encode<T: serde::Serialize>(v: &T) -> Result<Vec<u8>, Status> {
    raft_log::codec::encode(v).map_err(|e| Status::internal(e.to_string()))
}

#[tonic::async_trait]
impl RaftTransport for ClusterServices {
    async fn append_entries(
        &self,
        req: Request<RaftRequest>,
    ) -> Result<Response<RaftReply>, Status> {
        // Noting the leader's contact: elections wait out its lease.
        self.raft_rpc(req, GroupTable::get_for_append, append).await
    }

    async fn append_entries_stream(
        &self,
        req: Request<Streaming<AppendChunk>>,
    ) -> Result<Response<RaftReply>, Status> {
        let mut stream = req.into_inner();
        let first = first_chunk(&mut stream, "append").await?;
        self.check_cluster(first.cluster_id)?;
        let total = announced(first.total_bytes, "append")?;
        // The one copy of the append this node makes: its entries are decoded
        // as slices of this buffer.
        let payload = assemble(total, first.data, stream.map(|c| c.map(|c| c.data))).await?;
        let req = RaftRequest {
            group_id: first.group_id,
            payload,
            cluster_id: first.cluster_id,
        };
        self.append_entries(Request::new(req)).await
    }

    async fn vote(&self, req: Request<RaftRequest>) -> Result<Response<RaftReply>, Status> {
        self.raft_rpc(
            req,
            GroupTable::get,
            |raft, rpc: VoteRequest<NodeId>| async move { raft.vote(rpc).await },
        )
        .await
    }

    type FramesStream = super::frames::ReplyStream;

    async fn frames(
        &self,
        req: Request<Streaming<RaftFrame>>,
    ) -> Result<Response<Self::FramesStream>, Status> {
        let mut inbound = req.into_inner();
        let (tx, replies) = super::frames::reply_channel();
        let services = self.clone();
        tokio::spawn(async move {
            // Each frame on its own task: an append waits for its group to
            // open or for a sync, and must not hold up the others.
            while let Some(Ok(frame)) = inbound.next().await {
                let (services, tx) = (services.clone(), tx.clone());
                tokio::spawn(async move {
                    let _ = tx.send(services.answer_frame(frame).await);
                });
            }
        });
        Ok(Response::new(replies))
    }

    async fn pre_vote(&self, req: Request<RaftRequest>) -> Result<Response<RaftReply>, Status> {
        let req = req.into_inner();
        self.check_cluster(req.cluster_id)?;
        let rpc: super::pre_vote::PreVoteRequest = decode(&req.payload)?;
        let granted = super::pre_vote::answer(
            self.peers.me(),
            &self.groups,
            &self.detector,
            req.group_id,
            &rpc,
        );
        Ok(Response::new(RaftReply {
            payload: encode(&granted)?.into(),
        }))
    }

    async fn install_snapshot(
        &self,
        req: Request<Streaming<SnapshotChunk>>,
    ) -> Result<Response<RaftReply>, Status> {
        let mut stream = req.into_inner();
        let mut header: Option<(Vote<NodeId>, SnapshotMeta<NodeId, openraft::BasicNode>)> = None;
        let mut replica: Option<Arc<dyn GroupReplica>> = None;
        let mut data = Vec::new();
        let mut received = HashSet::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk?;
            if replica.is_none() {
                self.check_cluster(chunk.cluster_id)?;
                replica = Some(self.replica(chunk.group_id).await?);
            }
            if !chunk.header.is_empty() {
                header = Some(decode(&chunk.header)?);
            }
            data.extend_from_slice(&chunk.data);
            if !chunk.bodies.is_empty() {
                let bodies: Vec<_> = chunk.body_ids.into_iter().zip(chunk.bodies).collect();
                received.extend(bodies.iter().map(|(id, _)| *id));
                if let Some(r) = &replica {
                    r.write_bodies(bodies).map_err(Status::internal)?;
                }
            }
        }
        let (Some(replica), Some((vote, meta))) = (replica, header) else {
            return Err(Status::invalid_argument("snapshot stream without a header"));
        };
        let result: Result<openraft::raft::SnapshotResponse<NodeId>, String> =
            match replica.finish_snapshot(data, &received) {
                Err(e) => Err(e),
                Ok(data) => replica
                    .raft()
                    .install_full_snapshot(
                        vote,
                        Snapshot {
                            meta,
                            snapshot: Box::new(Cursor::new(data)),
                        },
                    )
                    .await
                    .map_err(|e| e.to_string()),
            };
        Ok(Response::new(RaftReply {
            payload: encode(&result)?.into(),
        }))
    }
}

/// A command another node forwarded to a node-local queue of this node
/// (`QueueHandle::local_elsewhere` there), applied on its handle: the reply
/// as a forwarded proposal's, at log index 0 (a local queue has no log).
async fn propose_local(
    local: &crate::queue::handle::QueueHandle,
    command: &[u8],
) -> Result<ProposeReply, Status> {
    let cmd = decode::<QueueCommand>(command)?;
    Ok(match local.call(cmd).await {
        Ok(r) => ProposeReply {
            reply: encode(&super::types::GroupReply::Queue(r))?.into(),
            ..Default::default()
        },
        Err(e) => ProposeReply {
            error: e.to_string(),
            ..Default::default()
        },
    })
}

#[tonic::async_trait]
impl Cluster for ClusterServices {
    async fn propose(
        &self,
        req: Request<ProposeRequest>,
    ) -> Result<Response<ProposeReply>, Status> {
        let req = req.into_inner();
        self.propose_here(req.group_id, req.cluster_id, &req.command)
            .await
            .map(Response::new)
    }

    async fn deliver(
        &self,
        req: Request<DeliverRequest>,
    ) -> Result<Response<DeliverReply>, Status> {
        let req = req.into_inner();
        let wire: Vec<(u64, ConsumerId, Delivery)> = decode_shared(&req.deliveries)?;
        let timed_out: Vec<(u64, ConsumerId, u64)> = if req.timed_out.is_empty() {
            Vec::new()
        } else {
            decode(&req.timed_out)?
        };
        if !self.seen_calls.take(req.from_node, req.outbox, req.batch) {
            tracing::debug!(target: "deliveries", from = req.from_node, batch = req.batch, "a Deliver call taken before, sent again: dropped");
            return Ok(Response::new(DeliverReply::default()));
        }
        let mut gone = Vec::new();
        for (group, consumer, delivery) in wire {
            if !self.consumers.deliver(QueueDelivery {
                consumer,
                group,
                delivery,
            }) {
                gone.push(consumer);
            }
        }
        for (group, consumer, timeout_ms) in timed_out {
            self.consumers.timed_out(group, consumer, timeout_ms);
        }
        if !gone.is_empty() {
            tracing::debug!(target: "deliveries", gone = ?gone, "deliveries for consumers that are gone");
        }
        Ok(Response::new(DeliverReply {
            gone: encode(&gone)?.into(),
        }))
    }

    async fn deliver_stream(
        &self,
        req: Request<Streaming<DeliverChunk>>,
    ) -> Result<Response<DeliverReply>, Status> {
        let mut stream = req.into_inner();
        let first = first_chunk(&mut stream, "deliver").await?;
        let total = announced(first.total_bytes, "deliver")?;
        // The deliveries' bodies are decoded as slices of this one buffer.
        let deliveries = assemble(total, first.data, stream.map(|c| c.map(|c| c.data))).await?;
        self.deliver(Request::new(DeliverRequest {
            deliveries,
            from_node: first.from_node,
            timed_out: first.timed_out,
            outbox: first.outbox,
            batch: first.batch,
        }))
        .await
    }

    async fn query(&self, req: Request<QueryRequest>) -> Result<Response<QueryReply>, Status> {
        let group = req.into_inner().group_id;
        let c = match self.groups.get(group) {
            Some(replica) => replica.counts(),
            None => match self.local_queue(group).and_then(|h| h.local_status()) {
                Some(status) => status,
                None => return Ok(Response::new(QueryReply::default())),
            },
        };
        Ok(Response::new(QueryReply {
            found: true,
            messages_ready: c.messages_ready,
            messages_unacknowledged: c.messages_unacknowledged,
            consumers: c.consumers,
            dead_letter_held: c.dead_letter_held,
            unreadable_bodies: c.unreadable_bodies,
            messages_delayed: c.messages_delayed,
        }))
    }

    async fn read_index(
        &self,
        req: Request<ReadIndexRequest>,
    ) -> Result<Response<ReadIndexReply>, Status> {
        let req = req.into_inner();
        self.check_cluster(req.cluster_id)?;
        let Some(replica) = self.groups.get(req.group_id) else {
            return Ok(Response::new(ReadIndexReply::default()));
        };
        let reply = match super::catch_up::read_index_here(replica.raft()).await {
            ReadIndex::Index(log_index) => ReadIndexReply {
                leader: true,
                log_index,
                leader_hint: 0,
            },
            ReadIndex::Leader(leader_hint) => ReadIndexReply {
                leader_hint,
                ..Default::default()
            },
            ReadIndex::Failed(e) => return Err(Status::unavailable(e)),
            ReadIndex::Unsupported => return Err(Status::unimplemented("read index")),
        };
        Ok(Response::new(reply))
    }

    async fn wait_applied(
        &self,
        req: Request<WaitAppliedRequest>,
    ) -> Result<Response<WaitAppliedReply>, Status> {
        let req = req.into_inner();
        self.check_cluster(req.cluster_id)?;
        let Some(replica) = self.groups.get(req.group_id) else {
            return Ok(Response::new(WaitAppliedReply::default()));
        };
        let within = Duration::from_millis(u64::from(req.timeout_ms)).min(WAIT_APPLIED_AT_MOST);
        let applied =
            super::catch_up::applied_here(replica.raft(), req.log_index, Some(within)).await;
        Ok(Response::new(WaitAppliedReply { applied }))
    }

    type HeartbeatStream = BeatStream;

    async fn heartbeat(
        &self,
        req: Request<Streaming<Beat>>,
    ) -> Result<Response<BeatStream>, Status> {
        Ok(Response::new(self.detector.serve(req.into_inner())))
    }

    async fn join(&self, req: Request<JoinRequest>) -> Result<Response<JoinReply>, Status> {
        let Some(meta) = self.groups.get(META_GROUP) else {
            return Err(Status::unavailable("this node has no meta group yet"));
        };
        Ok(Response::new(
            super::join::admit(meta.raft(), &self.peers, req.into_inner()).await,
        ))
    }
}

/// The first chunk of a streamed call (it carries the call's fields).
///
/// Errors: the stream's; an empty stream (`invalid_argument`).
async fn first_chunk<T>(stream: &mut Streaming<T>, what: &str) -> Result<T, Status> {
    stream
        .next()
        .await
        .ok_or_else(|| Status::invalid_argument(format!("empty {what} stream")))?
}

/// The total length a streamed call announced, in bytes.
///
/// Errors: more than [`super::peers::MAX_MESSAGE_BYTES`] (`invalid_argument`).
fn announced(total_bytes: u64, what: &str) -> Result<usize, Status> {
    usize::try_from(total_bytes)
        .ok()
        .filter(|t| *t <= super::peers::MAX_MESSAGE_BYTES)
        .ok_or_else(|| {
            Status::invalid_argument(format!(
                "streamed {what} of {total_bytes} bytes: at most {} accepted",
                super::peers::MAX_MESSAGE_BYTES
            ))
        })
}

/// Gathers a streamed call's data, `first` then every chunk of `rest`, into one buffer of the
/// announced `total` bytes (allocated once).
///
/// Errors: the stream's; more or fewer bytes than announced (`invalid_argument`).
async fn assemble(
    total: usize,
    first: bytes::Bytes,
    mut rest: impl futures::Stream<Item = Result<bytes::Bytes, Status>> + Unpin,
) -> Result<bytes::Bytes, Status> {
    let mut payload = bytes::BytesMut::with_capacity(total);
    let mut next = Some(first);
    loop {
        let Some(data) = next.take() else { break };
        if payload.len() + data.len() > total {
            return Err(Status::invalid_argument(format!(
                "streamed call longer than the {total} bytes announced"
            )));
        }
        payload.extend_from_slice(&data);
        next = rest.next().await.transpose()?;
    }
    if payload.len() != total {
        return Err(Status::invalid_argument(format!(
            "streamed call ended after {} of {total} bytes",
            payload.len()
        )));
    }
    Ok(payload.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn chunks(
        parts: &[&'static [u8]],
    ) -> impl futures::Stream<Item = Result<Bytes, Status>> + Unpin {
        futures::stream::iter(
            parts
                .iter()
                .map(|p| Ok(Bytes::from_static(p)))
                .collect::<Vec<_>>(),
        )
    }

    #[tokio::test]
    async fn a_streamed_call_is_assembled_in_order() {
        let got = assemble(7, Bytes::from_static(b"ab"), chunks(&[b"cd", b"", b"efg"]))
            .await
            .expect("whole");
        assert_eq!(&got[..], b"abcdefg");
        let head_only = assemble(0, Bytes::new(), chunks(&[])).await.expect("empty");
        assert!(head_only.is_empty());
    }

    #[tokio::test]
    async fn more_or_fewer_bytes_than_announced_are_refused() {
        let long = assemble(3, Bytes::new(), chunks(&[b"ab", b"cd"])).await;
        assert_eq!(
            long.expect_err("too long").code(),
            tonic::Code::InvalidArgument
        );
        let short = assemble(5, Bytes::new(), chunks(&[b"ab"])).await;
        assert_eq!(
            short.expect_err("too short").code(),
            tonic::Code::InvalidArgument
        );
        let failing = futures::stream::iter(vec![
            Ok(Bytes::from_static(b"a")),
            Err(Status::aborted("gone")),
        ]);
        let broken = assemble(5, Bytes::new(), failing).await;
        assert_eq!(
            broken.expect_err("stream error").code(),
            tonic::Code::Aborted
        );
    }

    #[test]
    fn an_announced_length_past_the_message_limit_is_refused() {
        assert!(announced(1 << 20, "deliver").is_ok());
        let too_big = (super::super::peers::MAX_MESSAGE_BYTES as u64) + 1;
        assert_eq!(
            announced(too_big, "deliver").expect_err("too big").code(),
            tonic::Code::InvalidArgument
        );
    }
}
