//! The Raft transport between nodes (client side): openraft's
//! `RaftNetwork` over the `RaftTransport` gRPC service, one HTTP/2 channel
//! per peer shared by every group ([`Peers`]), every request tagged with its
//! group id. Requests and replies are bincode-2 encoded openraft types.
//! Snapshots are streamed: the snapshot bytes in chunks, then — for queue
//! groups — the message bodies the snapshot indexes, read from the leader's
//! body store a chunk at a time (bounded memory), so the follower receives
//! everything the snapshot's index names (cluster issue §10).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::secret::PeerChannel;
use bytes::Bytes;
use openraft::error::{
    Fatal, InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError, RemoteError,
    ReplicationClosed, StreamingError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    SnapshotResponse, VoteRequest, VoteResponse,
};
use openraft::{BasicNode, LogId, Snapshot, Vote};
use quorumq_proto::v1::raft_transport_client::RaftTransportClient;
use quorumq_proto::v1::{AppendChunk, RaftRequest, SnapshotChunk};

use super::bootstrap::SeedSync;
use super::commit_hints::CommitHints;
use super::commit_updates::CommitUpdates;
use super::detector::Detector;
use super::frames;
use super::groups::GroupTable;
use super::in_flight::InFlight;
use super::peers::{Peers, MAX_MESSAGE_BYTES};
use super::types::{NodeId, TypeConfig, META_GROUP};
use raft_log::DurableIndex;

/// Largest encoded AppendEntries of more than one entry sent (bytes). A larger
/// one is split (openraft's entries hint): a follower holds a received append
/// whole while it writes its entries to its log, so a batch of big bodies
/// (a restarted node catching up on 15, 20 and 100 MiB bodies at once) would
/// be held whole, then again as log records. One entry alone may be larger,
/// up to the message limit.
const MAX_APPEND_BYTES: usize = 16 << 20;

/// An append whose encoding reaches this many bytes is streamed in chunks
/// (`AppendEntriesStream`) instead of sent as one message.
const STREAM_APPEND_BYTES: usize = 1 << 20;

/// Bytes per chunk of a streamed append.
const APPEND_CHUNK_BYTES: usize = 1 << 20;

/// Time limit of one background commit-index update (ms).
const COMMIT_UPDATE_TIMEOUT_MS: u64 = 1000;

/// Bytes of snapshot data or message bodies per streamed chunk.
pub const SNAPSHOT_CHUNK_BYTES: usize = 1 << 20;

/// Network factory of one group: hands openraft a client per target node.
#[derive(Clone)]
pub struct Network {
    /// Group the clients speak for.
    pub group: u64,
    /// The node table (addresses, channels, cluster id).
    pub peers: Arc<Peers>,
    /// Local replicas (the snapshot sender reads bodies through them).
    pub groups: Arc<GroupTable>,
    /// Queue groups: how far the local log is durable. The leader syncs its
    /// own entries while replicating them, so followers are told a commit
    /// index no further than this (`raft_log::durable`).
    pub durable: Option<DurableIndex<NodeId>>,
    /// Node liveness: a timed-out call to a live node is retried at once.
    pub detector: Arc<Detector>,
    /// A replica seeded as a member of a new group: nothing is sent before
    /// its seed is durable (the preferred leader's first append announces
    /// the term-1 leadership the seed's vote holds: `bootstrap::seed_new_group`).
    pub seed: Option<Arc<SeedSync>>,
    /// The meta group: where each follower stands, for the commit hints its
    /// leader sends off the replication stream ([`CommitHints`]).
    pub hints: Option<Arc<CommitHints>>,
}

/// A client to one peer for one group (one per replication session).
pub struct PeerClient {
    target: NodeId,
    net: Network,
    /// The last log id the follower confirmed to this client (None until an
    /// append succeeded, and after a refusal).
    confirmed: Option<LogId<NodeId>>,
    /// Commit-index updates sent off the replication path (started with the
    /// first one): a queue group's held-back commits, the meta group's
    /// commit hints ([`CommitHints`], which shares it).
    commits: Option<Arc<CommitUpdates>>,
    /// The append still running, which a retry may wait for (`in_flight`).
    in_flight: Option<InFlight<AppendError>>,
    /// A copy of this client that sends from other tasks (made at first use).
    sender: Option<Arc<PeerClient>>,
}

/// The error of an append.
type AppendError = RPCError<NodeId, BasicNode, RaftError<NodeId>>;

/// Backoff of a group's replication to a node that is down (ms).
const DOWN_BACKOFF_MS: u64 = 500;

/// Backoff after the `n`th failure in a row to a live node (a member that
/// has not opened the group yet, a refused call): 200, 400, 800, then
/// 1,000 ms.
fn live_backoff(n: u32) -> Duration {
    let shift = n.clamp(1, 4) - 1;
    Duration::from_millis((200u64 << shift).min(1000))
}

/// How long an append may run on when no retry waits for it any more (ms):
/// long enough for a 64-entry batch on a slow link, short enough that a
/// call into a silently dropped connection is given up.
const APPEND_LIMIT_MS: u64 = 10_000;

/// The slowest transfer an append is allowed before it is given up, beyond
/// [`APPEND_LIMIT_MS`] (bytes/s): 256 kbit/s. A 100 MiB message is given
/// 10 s + ~55 min, not 10 s: before, a big entry on a slow or busy link was
/// abandoned and sent again from the start, for ever (re-encoding it each
/// time), while the leader's terms climbed past 300.
const APPEND_MIN_BYTES_PER_S: u64 = 32 * 1024;

#[derive(Debug, thiserror::Error)]
enum TransportError {
    #[error("no address known for node {0}")]
    NoAddress(NodeId),
    #[error("node {node}: {status}")]
    Status { node: NodeId, status: tonic::Status },
    #[error("node {node}: timed out after {after:?}")]
    Timeout { node: NodeId, after: Duration },
    #[error("bad reply from node {node}: {text}")]
    Decode { node: NodeId, text: String },
    #[error("node {node} refused the snapshot: {text}")]
    Refused { node: NodeId, text: String },
    #[error("local snapshot: {0}")]
    Local(String),
    #[error("node {0} is down")]
    Down(NodeId),
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Self::Network {
        if !node.addr.is_empty() && self.peers.addr(target).is_none() {
            self.peers.set_addr(target, &node.addr);
        }
        PeerClient {
            target,
            net: self.clone(),
            confirmed: None,
            commits: None,
            in_flight: None,
            sender: None,
        }
    }
}

impl PeerClient {
    /// Returns once the replica's seed is durable, at once when it has none
    /// or it is ([`Network::seed`]).
    async fn seeded<E: std::error::Error>(&self) -> Result<(), RPCError<NodeId, BasicNode, E>> {
        match &self.net.seed {
            Some(seed) => seed.wait().await.map_err(|e| {
                RPCError::Network(NetworkError::new(&TransportError::Local(e.to_string())))
            }),
            None => Ok(()),
        }
    }

    async fn send_append(
        &self,
        rpc: &AppendEntriesRequest<TypeConfig>,
        ttl: Duration,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        // The entries' big bodies are slices of the log's cached bytes, and
        // stay so in the rope: nothing big is copied per follower here.
        let (pieces, len) = raft_log::codec::encode_rope(rpc).map_err(|e| {
            RPCError::Network(NetworkError::new(&TransportError::Local(e.to_string())))
        })?;
        let n = rpc.entries.len();
        // A big body takes its time on the wire: the call is given up only
        // after the base limit plus its bytes at APPEND_MIN_BYTES_PER_S.
        let ttl = ttl + Duration::from_millis(len as u64 * 1000 / APPEND_MIN_BYTES_PER_S);
        if len > MAX_APPEND_BYTES && n > 1 {
            // openraft retries with at most this many entries.
            return Err(RPCError::PayloadTooLarge(
                PayloadTooLarge::new_entries_hint((n / 2) as u64),
            ));
        }
        let (group_id, cluster_id) = (self.net.group, self.net.peers.cluster_id());
        if len < STREAM_APPEND_BYTES {
            // Usually one piece (no shared field): sent as it is, not copied again.
            let payload = match <[Bytes; 1]>::try_from(pieces) {
                Ok([one]) => one,
                Err(pieces) => pieces.concat().into(),
            };
            if len <= frames::MAX_FRAME_PAYLOAD && self.frames_supported() {
                return self.send_frame(frames::APPEND, payload, ttl).await;
            }
            let req = RaftRequest {
                group_id,
                payload,
                cluster_id,
            };
            return self
                .send_encoded(
                    req,
                    ttl,
                    |mut c, r| async move { c.append_entries(r).await },
                )
                .await;
        }
        // Streamed: tonic copies one chunk at a time into the connection's
        // buffer as HTTP/2 flow control lets it, instead of the whole append.
        let head = AppendChunk {
            group_id,
            cluster_id,
            total_bytes: len as u64,
            data: Bytes::new(),
        };
        let chunks =
            std::iter::once(head).chain(rechunk(pieces, APPEND_CHUNK_BYTES).into_iter().map(
                |data| AppendChunk {
                    data,
                    ..Default::default()
                },
            ));
        let stream = futures::stream::iter(chunks);
        self.send_encoded(stream, ttl, |mut c, r| async move {
            c.append_entries_stream(r).await
        })
        .await
    }

    /// A copy of this client for other tasks (same peer, same group).
    fn sender(&mut self) -> Arc<PeerClient> {
        let (target, net) = (self.target, self.net.clone());
        self.sender
            .get_or_insert_with(|| {
                Arc::new(PeerClient {
                    target,
                    net,
                    confirmed: None,
                    commits: None,
                    in_flight: None,
                    sender: None,
                })
            })
            .clone()
    }

    /// The background sender of this session's commit-index updates.
    fn commit_updates(&mut self) -> &Arc<CommitUpdates> {
        let client = self.sender();
        self.commits.get_or_insert_with(|| {
            Arc::new(CommitUpdates::start(move |update| {
                let client = client.clone();
                async move {
                    if let (Some(d), Some(c)) = (&client.net.durable, &update.leader_commit) {
                        // Never tell a follower to apply what this leader has not synced.
                        d.wait_for(c.index).await.ok()?;
                    }
                    let ttl = Duration::from_millis(COMMIT_UPDATE_TIMEOUT_MS);
                    client.send_append(&update, ttl).await.ok()
                }
            }))
        })
    }

    /// Sends `rpc`, or waits for the running append it retries (`in_flight`),
    /// for up to `ttl`.
    async fn append(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        last: Option<LogId<NodeId>>,
        ttl: Duration,
    ) -> Result<AppendEntriesResponse<NodeId>, AppendError> {
        let detector = &self.net.detector;
        // A peer that only went silent may be behind a slow link (its beats
        // wait behind this very append): its call goes on. One whose stream
        // closed (it restarted, or its process died) gets a new call. The
        // detector is asked only when there is a call to wait for.
        let retry = self
            .in_flight
            .as_ref()
            .is_some_and(|f| f.answers(&rpc.vote, &rpc.prev_log_id))
            && (detector.is_alive(self.target) || detector.is_silent(self.target));
        if !retry {
            // A different batch, or a peer gone: the old call is dropped.
            self.in_flight = None;
        }
        let sender = self.sender();
        let call = self.in_flight.get_or_insert_with(|| {
            let limit = Duration::from_millis(APPEND_LIMIT_MS);
            InFlight::start(rpc.vote, rpc.prev_log_id, last, async move {
                sender.send_append(&rpc, limit).await
            })
        });
        let target = self.target;
        let lost = |text: String| {
            RPCError::Network(NetworkError::new(&TransportError::Local(format!(
                "append to node {target}: {text}"
            ))))
        };
        match call.wait(ttl, last, lost).await {
            Some(reply) => {
                self.in_flight = None;
                reply
            }
            None => {
                let e = TransportError::Timeout {
                    node: target,
                    after: ttl,
                };
                if self.net.detector.is_alive(target) {
                    // Retried at once by openraft; the retry waits for this call.
                    Err(RPCError::Network(NetworkError::new(&e)))
                } else {
                    // openraft backs off; the call goes on meanwhile.
                    Err(RPCError::Unreachable(Unreachable::new(&e)))
                }
            }
        }
    }

    fn client(&self) -> Result<RaftTransportClient<PeerChannel>, TransportError> {
        let ch = self
            .net
            .peers
            .channel(self.target)
            .ok_or(TransportError::NoAddress(self.target))?;
        Ok(RaftTransportClient::new(ch)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES))
    }

    fn request<T: serde::Serialize>(&self, rpc: &T) -> Result<RaftRequest, TransportError> {
        let payload =
            raft_log::codec::encode(rpc).map_err(|e| TransportError::Local(e.to_string()))?;
        Ok(RaftRequest {
            group_id: self.net.group,
            payload: payload.into(),
            cluster_id: self.net.peers.cluster_id(),
        })
    }

    /// Whether calls to this peer go as frames (`cluster::frames`).
    fn frames_supported(&self) -> bool {
        self.net.peers.frames().supported(self.target)
    }

    /// One call as a frame on the peer's frame link: send with `ttl`, decode
    /// `Result<Resp, RaftError<E>>` (as [`PeerClient::send_encoded`]).
    async fn send_frame<Resp, E>(
        &self,
        kind: u32,
        payload: Bytes,
        ttl: Duration,
    ) -> Result<Resp, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>
    where
        Resp: serde::de::DeserializeOwned,
        E: std::error::Error + serde::de::DeserializeOwned,
    {
        let peers = &self.net.peers;
        let call = peers
            .frames()
            .call(peers, self.target, self.net.group, kind, payload);
        match tokio::time::timeout(ttl, call).await {
            Err(_) => Err(self.timed_out(ttl)),
            Ok(Err(status)) => Err(status_error(self.target, status)),
            Ok(Ok(reply)) => self.decode_reply(&reply),
        }
    }

    /// The error of a call given up after `ttl`. openraft backs off 200 ms after
    /// `Unreachable`. A live node that was slow once (a disk stall: syncs on this
    /// 2-core VM stall 100+ ms now and then) gets the call again at once; a node
    /// the detector holds dead is backed off.
    fn timed_out<E: std::error::Error>(&self, ttl: Duration) -> RPCError<NodeId, BasicNode, E> {
        let e = TransportError::Timeout {
            node: self.target,
            after: ttl,
        };
        if self.net.detector.is_alive(self.target) {
            RPCError::Network(NetworkError::new(&e))
        } else {
            RPCError::Unreachable(Unreachable::new(&e))
        }
    }

    /// A reply's payload decoded: `Result<Resp, RaftError<E>>`.
    // openraft's own error type, as every `RaftNetwork` method returns it.
    #[allow(clippy::result_large_err)]
    fn decode_reply<Resp, E>(
        &self,
        payload: &[u8],
    ) -> Result<Resp, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>
    where
        Resp: serde::de::DeserializeOwned,
        E: std::error::Error + serde::de::DeserializeOwned,
    {
        let decoded: Result<Resp, RaftError<NodeId, E>> = raft_log::codec::decode(payload)
            .map_err(|e| {
                RPCError::Network(NetworkError::new(&TransportError::Decode {
                    node: self.target,
                    text: e.to_string(),
                }))
            })?;
        decoded.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }

    /// One unary RPC: encode, send with `ttl`, decode `Result<Resp, RaftError<E>>`.
    async fn unary<Req, Resp, E, F, Fut>(
        &self,
        rpc: &Req,
        ttl: Duration,
        call: F,
    ) -> Result<Resp, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>
    where
        Req: serde::Serialize,
        Resp: serde::de::DeserializeOwned,
        E: std::error::Error + serde::de::DeserializeOwned,
        F: FnOnce(RaftTransportClient<PeerChannel>, RaftRequest) -> Fut,
        Fut: Future<Output = Result<tonic::Response<quorumq_proto::v1::RaftReply>, tonic::Status>>,
    {
        let req = self
            .request(rpc)
            .map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        self.send_encoded(req, ttl, call).await
    }

    /// Sends an encoded request (a [`RaftRequest`], or a stream of chunks) with `ttl` and
    /// decodes `Result<Resp, RaftError<E>>`.
    async fn send_encoded<Req, Resp, E, F, Fut>(
        &self,
        req: Req,
        ttl: Duration,
        call: F,
    ) -> Result<Resp, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>
    where
        Resp: serde::de::DeserializeOwned,
        E: std::error::Error + serde::de::DeserializeOwned,
        F: FnOnce(RaftTransportClient<PeerChannel>, Req) -> Fut,
        Fut: Future<Output = Result<tonic::Response<quorumq_proto::v1::RaftReply>, tonic::Status>>,
    {
        let client = self
            .client()
            .map_err(|e| RPCError::Unreachable(Unreachable::new(&e)))?;
        match tokio::time::timeout(ttl, call(client, req)).await {
            Err(_) => Err(self.timed_out(ttl)),
            Ok(Err(status)) => Err(status_error(self.target, status)),
            Ok(Ok(r)) => self.decode_reply(&r.into_inner().payload),
        }
    }

    /// Streams `snapshot` and the bodies it indexes; the reply is the
    /// follower's vote after installing it.
    async fn stream_snapshot(
        &self,
        vote: Vote<NodeId>,
        snapshot: Snapshot<TypeConfig>,
    ) -> Result<SnapshotResponse<NodeId>, TransportError> {
        let group = self.net.group;
        let cluster_id = self.net.peers.cluster_id();
        let data = snapshot.snapshot.into_inner();
        let header = raft_log::codec::encode(&(&vote, &snapshot.meta))
            .map_err(|e| TransportError::Local(e.to_string()))?;
        let replica = self.net.groups.get(group);
        let ids = match &replica {
            Some(r) => r.snapshot_body_ids(&data).map_err(TransportError::Local)?,
            None => Vec::new(),
        };
        let (tx, rx) = tokio::sync::mpsc::channel::<SnapshotChunk>(2);
        let producer = async move {
            // The header (vote, meta) goes alone first, then the data.
            let header = SnapshotChunk {
                group_id: group,
                cluster_id,
                header: header.into(),
                ..Default::default()
            };
            let data_chunks = data
                .chunks(SNAPSHOT_CHUNK_BYTES)
                .map(|piece| SnapshotChunk {
                    group_id: group,
                    cluster_id,
                    data: Bytes::copy_from_slice(piece),
                    ..Default::default()
                });
            for chunk in std::iter::once(header).chain(data_chunks) {
                if tx.send(chunk).await.is_err() {
                    return;
                }
            }
            let Some(replica) = replica else { return };
            let mut at = 0;
            while at < ids.len() {
                // Read ~one chunk's worth of bodies at a time.
                let mut chunk = SnapshotChunk {
                    group_id: group,
                    cluster_id,
                    ..Default::default()
                };
                let mut bytes = 0;
                while at < ids.len() && bytes < SNAPSHOT_CHUNK_BYTES {
                    let end = (at + 64).min(ids.len());
                    for (id, body) in replica.read_bodies(&ids[at..end]) {
                        if let Some(b) = body {
                            bytes += b.len();
                            chunk.body_ids.push(id);
                            chunk.bodies.push(b);
                        }
                    }
                    at = end;
                }
                if tx.send(chunk).await.is_err() {
                    return;
                }
            }
        };
        let mut client = self.client()?;
        let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
        let (reply, ()) = tokio::join!(client.install_snapshot(stream), producer);
        let reply = reply
            .map_err(|status| TransportError::Status {
                node: self.target,
                status,
            })?
            .into_inner();
        let r: Result<SnapshotResponse<NodeId>, String> = raft_log::codec::decode(&reply.payload)
            .map_err(|e| TransportError::Decode {
            node: self.target,
            text: e.to_string(),
        })?;
        r.map_err(|text| TransportError::Refused {
            node: self.target,
            text,
        })
    }
}

/// `pieces` regrouped into chunks of at most `max` bytes (their concatenation unchanged):
/// runs of small pieces are copied together, big pieces are sliced (no copy).
pub(super) fn rechunk(pieces: Vec<Bytes>, max: usize) -> Vec<Bytes> {
    let max = max.max(1);
    let mut out = Vec::new();
    let mut small = bytes::BytesMut::new();
    for p in pieces {
        if p.len() < max / 4 {
            if small.len() + p.len() > max {
                out.push(small.split().freeze());
            }
            small.extend_from_slice(&p);
            continue;
        }
        if !small.is_empty() {
            out.push(small.split().freeze());
        }
        let mut at = 0;
        while at < p.len() {
            let end = (at + max).min(p.len());
            out.push(p.slice(at..end));
            at = end;
        }
    }
    if !small.is_empty() {
        out.push(small.freeze());
    }
    out
}

/// A gRPC status as an openraft RPC error: connection-level failures are
/// `Unreachable` (openraft backs off), others `Network`.
fn status_error<E: std::error::Error>(
    node: NodeId,
    status: tonic::Status,
) -> RPCError<NodeId, BasicNode, E> {
    let unreachable = matches!(
        status.code(),
        tonic::Code::Unavailable
            | tonic::Code::Unknown
            | tonic::Code::Cancelled
            | tonic::Code::NotFound
    );
    let e = TransportError::Status { node, status };
    if unreachable {
        RPCError::Unreachable(Unreachable::new(&e))
    } else {
        RPCError::Network(NetworkError::new(&e))
    }
}

impl RaftNetwork<TypeConfig> for PeerClient {
    async fn append_entries(
        &mut self,
        mut rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        self.seeded().await?;
        if let Some(refused) = self.commits.as_ref().and_then(|c| c.take_refusal()) {
            self.confirmed = None;
            return Ok(refused);
        }
        let commit_only = rpc.entries.is_empty()
            && rpc.prev_log_id.is_some()
            && rpc.prev_log_id == self.confirmed
            && self.net.group != META_GROUP;
        if commit_only {
            // Sent once the commit index is durable here.
            self.commit_updates().push(rpc);
            return Ok(AppendEntriesResponse::Success);
        }
        if self.net.group != META_GROUP && self.net.detector.is_down(self.target) {
            // The node is down (its connection closed): nothing is sent, and
            // openraft backs off; the node's return is a node-level event
            // for the detector, not a per-group retry (issue 31).
            self.in_flight = None;
            return Err(RPCError::Unreachable(Unreachable::new(
                &TransportError::Down(self.target),
            )));
        }
        let commit = rpc.leader_commit;
        if let Some(d) = &self.net.durable {
            rpc.leader_commit = d.cap(commit);
        }
        let held_back = rpc.leader_commit != commit;
        let vote = rpc.vote;
        let (group, target) = (self.net.group, self.target);
        let last_id = rpc.entries.last().map(|e| e.log_id).or(rpc.prev_log_id);
        let last = last_id.map_or(0, |l| l.index);
        let n = rpc.entries.len();
        tracing::trace!(target: "timeline", ev = "ae_send", group, target, last, n);
        let r = self.append(rpc, last_id, option.hard_ttl()).await;
        tracing::trace!(target: "timeline", ev = "ae_reply", group, target, last, n);
        self.confirmed = match &r {
            Ok(AppendEntriesResponse::Success) => last_id,
            Ok(AppendEntriesResponse::PartialSuccess(m)) => *m,
            _ => None,
        };
        if let (Some(hints), Some(confirmed)) = (self.net.hints.clone(), self.confirmed) {
            let updates = self.commit_updates().clone();
            hints.note(target, vote, confirmed, updates);
        }
        if held_back && self.confirmed.is_some() && self.net.group != META_GROUP {
            // The rest of the commit index follows once it is durable here.
            let prev_log_id = self.confirmed;
            self.commit_updates().push(AppendEntriesRequest {
                vote,
                prev_log_id,
                leader_commit: commit,
                entries: Vec::new(),
            });
        }
        r
    }

    async fn install_snapshot(
        &mut self,
        _rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        // Snapshots go through `full_snapshot` (streamed with their bodies).
        let e = TransportError::Local("chunked install_snapshot is not used".into());
        Err(RPCError::Network(NetworkError::new(&e)))
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        self.seeded().await?;
        if self.frames_supported() {
            let payload = raft_log::codec::encode(&rpc).map_err(|e| {
                RPCError::Network(NetworkError::new(&TransportError::Local(e.to_string())))
            })?;
            return self
                .send_frame(frames::VOTE, payload.into(), option.hard_ttl())
                .await;
        }
        self.unary(&rpc, option.hard_ttl(), |mut c, r| async move {
            c.vote(r).await
        })
        .await
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote<NodeId>,
        snapshot: Snapshot<TypeConfig>,
        cancel: impl Future<Output = ReplicationClosed> + openraft::OptionalSend + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<NodeId>, StreamingError<TypeConfig, Fatal<NodeId>>> {
        tokio::select! {
            closed = cancel => Err(StreamingError::Closed(closed)),
            r = self.stream_snapshot(vote, snapshot) => r.map_err(|e| match e {
                TransportError::NoAddress(_) | TransportError::Status { .. } | TransportError::Timeout { .. } => {
                    StreamingError::Unreachable(Unreachable::new(&e))
                }
                _ => StreamingError::Network(NetworkError::new(&e)),
            }),
        }
    }

    fn backoff(&self) -> openraft::network::Backoff {
        // A restarted peer should be caught up soon after it is back; a
        // member that has not opened the group yet (a live node) is retried
        // less and less often (issue 31: thousands of groups retrying every
        // 200 ms was a storm of appends and log lines).
        let (detector, target) = (self.net.detector.clone(), self.target);
        let mut live_failures = 0u32;
        openraft::network::Backoff::new(std::iter::from_fn(move || {
            if detector.is_alive(target) {
                live_failures = live_failures.saturating_add(1);
                Some(live_backoff(live_failures))
            } else {
                live_failures = 0;
                Some(Duration::from_millis(DOWN_BACKOFF_MS))
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A seeded replica sends nothing before its seed is durable: the
    /// preferred leader's first append announces a term-1 leadership that
    /// only the seed's vote holds (`bootstrap::seed_new_group`).
    #[tokio::test]
    async fn nothing_is_sent_before_the_seed_is_durable() {
        let peers = Arc::new(Peers::new(1, 0));
        let detector = Detector::new(
            1,
            1,
            "127.0.0.1:5672".into(),
            "127.0.0.1:5680".into(),
            peers.clone(),
            crate::alarms::Alarms::new(u64::MAX, 0),
            crate::connections::Connections::new(),
        );
        let net = |seed| Network {
            group: 5,
            peers: peers.clone(),
            groups: Arc::new(GroupTable::default()),
            durable: None,
            detector: detector.clone(),
            seed,
            hints: None,
        };
        let rpc = || AppendEntriesRequest::<TypeConfig> {
            vote: Vote::new_committed(1, 1),
            prev_log_id: None,
            leader_commit: None,
            entries: Vec::new(),
        };
        let option = || RPCOption::new(Duration::from_secs(1));
        // Node 2 has no address: without a seed the append fails at once.
        let mut unseeded = net(None).new_client(2, &BasicNode::default()).await;
        let sent = tokio::time::timeout(
            Duration::from_secs(5),
            unseeded.append_entries(rpc(), option()),
        )
        .await;
        assert!(matches!(sent, Ok(Err(_))), "tried to send: {sent:?}");
        // A seed not yet durable (its mark never moves here): nothing is tried.
        let seed = Arc::new(SeedSync::new(DurableIndex::new(None), 1));
        let mut seeded = net(Some(seed)).new_client(2, &BasicNode::default()).await;
        let held = tokio::time::timeout(
            Duration::from_millis(300),
            seeded.append_entries(rpc(), option()),
        )
        .await;
        assert!(held.is_err(), "sent before the seed was durable: {held:?}");
    }

    #[test]
    fn live_backoff_grows_to_a_second() {
        let ms: Vec<u128> = (1..=6).map(|n| live_backoff(n).as_millis()).collect();
        assert_eq!(ms, [200, 400, 800, 1000, 1000, 1000]);
    }

    #[test]
    fn rechunk_keeps_the_bytes_bounds_chunks_and_slices_big_pieces() {
        let big = Bytes::from((0..2500u32).map(|i| i as u8).collect::<Vec<_>>());
        let pieces = vec![
            Bytes::from_static(b"head"),
            Bytes::from_static(b"len"),
            big.clone(),
            Bytes::from(vec![1u8; 200]),
            Bytes::from(vec![2u8; 200]),
            Bytes::from(vec![3u8; 200]),
            Bytes::from(vec![4u8; 200]),
            Bytes::from(vec![5u8; 200]),
            Bytes::from(vec![6u8; 200]),
        ];
        let whole: Vec<u8> = pieces.iter().flat_map(|p| p.iter().copied()).collect();
        let chunks = rechunk(pieces, 1000);
        let again: Vec<u8> = chunks.iter().flat_map(|p| p.iter().copied()).collect();
        assert_eq!(again, whole);
        assert!(chunks.iter().all(|c| !c.is_empty() && c.len() <= 1000));
        let (lo, hi) = (big.as_ptr() as usize, big.as_ptr() as usize + big.len());
        let sliced = chunks
            .iter()
            .filter(|c| (lo..hi).contains(&(c.as_ptr() as usize)))
            .count();
        assert_eq!(sliced, 3, "the big piece is three slices of itself");
        assert_eq!(chunks.len(), 1 + 3 + 2, "small runs are merged: {chunks:?}");
    }
}
