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

use bytes::Bytes;
use openraft::error::{
    Fatal, InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, ReplicationClosed,
    StreamingError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    SnapshotResponse, VoteRequest, VoteResponse,
};
use openraft::{BasicNode, Snapshot, Vote};
use quorumq_proto::v1::raft_transport_client::RaftTransportClient;
use quorumq_proto::v1::{RaftRequest, SnapshotChunk};
use tonic::transport::Channel;

use super::groups::GroupTable;
use super::peers::{Peers, MAX_MESSAGE_BYTES};
use super::types::{NodeId, TypeConfig};

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
}

/// A client to one peer for one group.
pub struct PeerClient {
    target: NodeId,
    net: Network,
}

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
        }
    }
}

impl PeerClient {
    fn client(&self) -> Result<RaftTransportClient<Channel>, TransportError> {
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
        F: FnOnce(RaftTransportClient<Channel>, RaftRequest) -> Fut,
        Fut: Future<Output = Result<tonic::Response<quorumq_proto::v1::RaftReply>, tonic::Status>>,
    {
        let req = self
            .request(rpc)
            .map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let client = self
            .client()
            .map_err(|e| RPCError::Unreachable(Unreachable::new(&e)))?;
        let reply = match tokio::time::timeout(ttl, call(client, req)).await {
            Err(_) => {
                let e = TransportError::Timeout {
                    node: self.target,
                    after: ttl,
                };
                return Err(RPCError::Unreachable(Unreachable::new(&e)));
            }
            Ok(Err(status)) => return Err(status_error(self.target, status)),
            Ok(Ok(r)) => r.into_inner(),
        };
        let decoded: Result<Resp, RaftError<NodeId, E>> = raft_log::codec::decode(&reply.payload)
            .map_err(|e| {
            RPCError::Network(NetworkError::new(&TransportError::Decode {
                node: self.target,
                text: e.to_string(),
            }))
        })?;
        decoded.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
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
        let stream = tokio_stream_from(rx);
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

/// A receiver as a `Stream` (tonic's client-streaming argument).
fn tokio_stream_from<T: Send + 'static>(
    rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures::Stream<Item = T> + Send + 'static {
    futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|v| (v, rx)) })
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
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        self.unary(&rpc, option.hard_ttl(), |mut c, r| async move {
            c.append_entries(r).await
        })
        .await
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
        // A restarted peer should be caught up soon after it is back.
        openraft::network::Backoff::new(std::iter::repeat(Duration::from_millis(200)))
    }
}
