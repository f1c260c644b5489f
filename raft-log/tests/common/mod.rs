//! Shared test fixtures: a tiny type config, an append-only `Vec<u64>` machine, a network that
//! never connects (single voter), entry constructors and time bounds.
#![allow(dead_code)]

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{InstallSnapshotError, RPCError, RaftError, Unreachable};
use openraft::network::RPCOption;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{
    BasicNode, CommittedLeaderId, Entry, EntryPayload, LogId, Membership, RaftNetwork,
    RaftNetworkFactory,
};
use raft_log::{
    codec, ApplyMeta, GroupId, GroupStateMachine, LogStore, Machine, NodeStore, StoreError,
};
use serde::{Deserialize, Serialize};

openraft::declare_raft_types!(
    pub Tc:
        D = u64,
        R = u64,
        NodeId = u64,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<Tc>,
        SnapshotData = std::io::Cursor<Vec<u8>>,
);

/// Appends every command; replies with the new length.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VecMachine {
    pub items: Vec<u64>,
}

impl Machine<Tc> for VecMachine {
    fn apply(&mut self, _meta: &ApplyMeta, cmd: u64) -> u64 {
        self.items.push(cmd);
        self.items.len() as u64
    }
    fn snapshot(&mut self) -> Result<Vec<u8>, StoreError> {
        codec::encode(&self.items)
    }
    fn restore(&mut self, data: &[u8]) -> Result<(), StoreError> {
        self.items = codec::decode(data)?;
        Ok(())
    }
}

pub type Sm = GroupStateMachine<Tc, VecMachine>;
pub type Ls = LogStore<Tc>;

/// Upper bound for every async test body.
pub const TEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Run `fut`, failing the test if it takes longer than [`TEST_TIMEOUT`].
pub async fn bounded<F: Future>(fut: F) -> F::Output {
    tokio::time::timeout(TEST_TIMEOUT, fut)
        .await
        .expect("test exceeded its time bound")
}

pub const CACHE: u64 = 16 << 20;

pub fn open(dir: &Path) -> NodeStore {
    NodeStore::open(dir, CACHE).expect("open node store")
}

pub fn stores(ns: &NodeStore, group: GroupId) -> (Ls, Sm) {
    (
        ns.log_store(group).expect("log store"),
        ns.state_machine(group, VecMachine::default())
            .expect("state machine"),
    )
}

pub fn log_id(term: u64, index: u64) -> LogId<u64> {
    LogId::new(CommittedLeaderId::new(term, 0), index)
}

pub fn normal(term: u64, index: u64, cmd: u64) -> Entry<Tc> {
    Entry {
        log_id: log_id(term, index),
        payload: EntryPayload::Normal(cmd),
    }
}

pub fn membership(term: u64, index: u64, voters: &[u64]) -> Entry<Tc> {
    let set = voters.iter().copied().collect();
    Entry {
        log_id: log_id(term, index),
        payload: EntryPayload::Membership(Membership::new(vec![set], None)),
    }
}

/// A network for single-voter groups: every RPC fails as unreachable.
#[derive(Clone, Default)]
pub struct NoNetwork;

fn unreachable() -> Unreachable {
    Unreachable::new(&std::io::Error::other("test network: no peers"))
}

impl RaftNetworkFactory<Tc> for NoNetwork {
    type Network = NoNetwork;
    async fn new_client(&mut self, _target: u64, _node: &BasicNode) -> Self::Network {
        NoNetwork
    }
}

impl RaftNetwork<Tc> for NoNetwork {
    async fn append_entries(
        &mut self,
        _rpc: AppendEntriesRequest<Tc>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        Err(RPCError::Unreachable(unreachable()))
    }
    async fn install_snapshot(
        &mut self,
        _rpc: InstallSnapshotRequest<Tc>,
        _option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<u64>,
        RPCError<u64, BasicNode, RaftError<u64, InstallSnapshotError>>,
    > {
        Err(RPCError::Unreachable(unreachable()))
    }
    async fn vote(
        &mut self,
        _rpc: VoteRequest<u64>,
        _option: RPCOption,
    ) -> Result<VoteResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        Err(RPCError::Unreachable(unreachable()))
    }
}

/// A single-voter Raft group (node id 1) over the sled stores of `group`.
pub struct Node {
    pub raft: openraft::Raft<Tc>,
    pub machine: Arc<std::sync::Mutex<VecMachine>>,
    pub log: Ls,
}

pub fn config(group: GroupId, snapshot_every: u64, keep: u64) -> Arc<openraft::Config> {
    let c = openraft::Config {
        cluster_name: format!("group-{group}"),
        heartbeat_interval: 50,
        election_timeout_min: 150,
        election_timeout_max: 300,
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(snapshot_every),
        max_in_snapshot_log_to_keep: keep,
        purge_batch_size: 1,
        ..Default::default()
    };
    Arc::new(c.validate().expect("valid config"))
}

/// Start (or restart) the group; `Raft::new` replays `(snapshot, committed]` into the machine.
pub async fn start_node(ns: &NodeStore, group: GroupId, cfg: Arc<openraft::Config>) -> Node {
    let (log, sm) = stores(ns, group);
    let machine = sm.machine();
    let raft = openraft::Raft::new(1, cfg, NoNetwork, log.clone(), sm)
        .await
        .expect("Raft::new");
    Node { raft, machine, log }
}

pub async fn wait_leader(node: &Node) {
    node.raft
        .wait(Some(Duration::from_secs(10)))
        .state(openraft::ServerState::Leader, "become leader")
        .await
        .expect("leader");
}

pub fn items(node: &Node) -> Vec<u64> {
    node.machine.lock().expect("machine lock").items.clone()
}

/// Shut the Raft down and close the store so the directory can be reopened in-process.
pub async fn stop(node: Node, ns: NodeStore) {
    node.raft.shutdown().await.expect("shutdown");
    drop(node);
    ns.close(Duration::from_secs(10))
        .await
        .expect("close node store");
}
