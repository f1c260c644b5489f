//! Raft transport between nodes. A single node has no peers, so every
//! call reports the target unreachable; the gRPC transport (one HTTP/2
//! connection per peer, group-tagged RPCs, proto `RaftTransport`) is the
//! cluster issue's work and plugs in here.

use openraft::error::{InstallSnapshotError, RPCError, RaftError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::BasicNode;

use super::types::{NodeId, TypeConfig};

/// Network factory for one group.
#[derive(Clone, Default)]
pub struct Network {
    /// Group the clients created by this factory speak for.
    pub group: u64,
}

/// A client to one peer for one group.
pub struct PeerClient {
    target: NodeId,
    group: u64,
}

#[derive(Debug, thiserror::Error)]
#[error("no transport to node {target} for group {group}: single-node mode")]
struct NoTransport {
    target: NodeId,
    group: u64,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, _node: &BasicNode) -> Self::Network {
        PeerClient {
            target,
            group: self.group,
        }
    }
}

impl PeerClient {
    fn unreachable<E: std::error::Error>(&self) -> RPCError<NodeId, BasicNode, E> {
        RPCError::Unreachable(Unreachable::new(&NoTransport {
            target: self.target,
            group: self.group,
        }))
    }
}

impl RaftNetwork<TypeConfig> for PeerClient {
    async fn append_entries(
        &mut self,
        _rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        Err(self.unreachable())
    }

    async fn install_snapshot(
        &mut self,
        _rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        Err(self.unreachable())
    }

    async fn vote(
        &mut self,
        _rpc: VoteRequest<NodeId>,
        _option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        Err(self.unreachable())
    }
}
