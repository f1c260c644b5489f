//! The composition root of a node: storage, the cluster plumbing (peers,
//! failure detector, transport services, elections), the meta group, the
//! queue replicas and references, the consumer table, and the lookups the
//! AMQP front end calls.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use amq_protocol::types::FieldTable;
use openraft::BasicNode;
use raft_log::{NodeStore, StoreOptions};
use tokio::sync::watch;

use crate::amqp::error::ProtocolError;
use crate::cluster::deliveries::RemoteDeliveries;
use crate::cluster::detector::Detector;
use crate::cluster::forward::{Forwarded, Forwarder};
use crate::cluster::groups::GroupTable;
use crate::cluster::join;
use crate::cluster::peers::Peers;
use crate::cluster::secret::ClusterSecret;
use crate::cluster::server::ClusterServices;
use crate::cluster::status::{ClusterStatus, NodeStatus, QueueStatus};
use crate::cluster::transport::Network;
use crate::cluster::types::{GroupCommand, GroupReply, Origin, Raft, TypeConfig, META_GROUP};
use crate::cluster::{elections, meta_raft_config, raft_config};
use crate::config::Config;
use crate::consumers::ConsumerRegistry;
use crate::meta::command::{MetaCommand, MetaReply};
use crate::meta::host::MetaHost;
use crate::meta::{QueueDeclare, QueueKind, QueueRecord, QueueType};
use crate::queue::bodies::{MemBodies, SegmentBodies, MEMORY_BUDGET};
use crate::cluster::route::Route;
use crate::queue::handle::QueueHandle;
use crate::queue::host::{QueueContext, QueueHost};
use crate::queue::replica::{MetaReplica, QueueReplica};
use crate::queue::runtime;
use crate::queue::types::{QueueCommand, QueueConfig};
use crate::queue::QueueMachine;

/// sled page cache (bytes); sled holds only snapshots and node records.
const CACHE_BYTES: u64 = 16 * 1024 * 1024;
/// Default `x-quorum-initial-group-size` (RabbitMQ: 3, capped at the cluster size).
const DEFAULT_GROUP_SIZE: u64 = 3;
/// How long a meta write waits for a leader (elections, forwarding).
const META_WRITE_FOR: Duration = Duration::from_secs(30);
/// A new queue's preferred leader campaigns this many times, this often,
/// until a leader is known (about the election sweep's grace for new
/// replicas, cluster::elections).
const PREFERRED_CAMPAIGNS: u32 = 20;
const PREFERRED_CAMPAIGN_EVERY: Duration = Duration::from_millis(50);
/// How long a new queue's other members wait for the preferred leader's
/// first append before initializing the group themselves.
const UNINITIALIZED_GRACE: Duration = Duration::from_secs(2);

/// Errors starting a node.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("storage: {0}")]
    Store(#[from] raft_log::StoreError),
    #[error("sled: {0}")]
    Sled(#[from] sled::Error),
    #[error("raft: {0}")]
    Raft(String),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error("config: {0}")]
    Config(String),
}

/// A running node.
pub struct Broker {
    config: Config,
    store: NodeStore,
    origin: Origin,
    meta_raft: Raft,
    meta: Arc<Mutex<MetaHost>>,
    meta_changed: watch::Sender<u64>,
    /// Bumped when a vhost or user is deleted (or a meta snapshot installed): open
    /// connections check theirs ([`Broker::subscribe_revocations`]).
    access_revoked: watch::Sender<u64>,
    queues: RwLock<HashMap<u64, Arc<QueueHandle>>>,
    consumers: Arc<ConsumerRegistry>,
    next_connection: AtomicU64,
    /// Serializes group creation and deletion.
    groups_lock: tokio::sync::Mutex<()>,
    /// Bumped on every event a held dead letter may be waiting for:
    /// exchange/binding/queue changes, a queue unblocking publishers.
    events: watch::Sender<u64>,
    stopping: AtomicBool,
    peers: Arc<Peers>,
    groups: Arc<GroupTable>,
    detector: Arc<Detector>,
    forwarder: Arc<Forwarder>,
    /// Memory and disk alarms (publishers blocked while raised).
    alarms: Arc<crate::alarms::Alarms>,
    /// Open client connections here and on the peers (connection limits).
    connections: Arc<crate::connections::Connections>,
}

impl Broker {
    /// Opens storage under `config.data_dir`, the meta group (formed from
    /// `config.peers` on first start) and the cluster plumbing. Returns the
    /// node and the services the cluster listener must serve before the
    /// node can elect leaders; then call [`Broker::start`].
    pub async fn open(config: Config) -> Result<(Arc<Broker>, ClusterServices), NodeError> {
        let peers_cfg = config.parsed_peers().map_err(NodeError::Config)?;
        let me = config.node_id;
        if !peers_cfg.is_empty() && !peers_cfg.iter().any(|p| p.id == me) {
            return Err(NodeError::Config(format!(
                "--peers does not list this node's id {me}"
            )));
        }
        let dir: PathBuf = config.data_dir.join(format!("node-{me}"));
        std::fs::create_dir_all(&dir)?;
        let raft_dir = dir.join("raft");
        let store = NodeStore::open_with(
            &raft_dir,
            StoreOptions {
                sled_cache_bytes: CACHE_BYTES,
                min_sync_interval: std::time::Duration::from_micros(config.sync_interval_us),
                wal_truncate_at: config.wal_truncate_at,
                on_wal_sync: |d| crate::metrics::COUNTERS.wal_synced(d),
                ..StoreOptions::default()
            },
        )
        .map_err(|e| rebuild_hint(e, &config, &raft_dir, peers_cfg.len()))?;
        let epoch = next_epoch(&store)?;
        let origin = Origin { node: me, epoch };
        let cluster_id = store
            .db()
            .get("node/cluster_id")?
            .and_then(|v| <[u8; 8]>::try_from(v.as_ref()).ok())
            .map(u64::from_be_bytes)
            .unwrap_or(0);
        let secret_file = ClusterSecret::path(config.cluster_secret_file.as_deref());
        let secret = ClusterSecret::load_or_create(&secret_file)
            .map_err(|e| NodeError::Config(e.to_string()))?;
        let cluster_tls = config
            .cluster_client_tls()
            .map_err(|e| NodeError::Config(e.to_string()))?;
        let peers = Arc::new(
            Peers::new(me, cluster_id)
                .bind_outgoing_to(&config.cluster_listen)
                .with_secret(secret)
                .with_tls(cluster_tls),
        );
        peers.set_addr(me, &config.advertised());
        // Addresses learned when this node joined or from the meta membership;
        // the static list below wins where both name a node.
        for (id, addr) in join::remembered(store.db()) {
            if id != me {
                peers.set_addr(id, &addr);
            }
        }
        for p in &peers_cfg {
            if p.id != me {
                peers.set_addr(p.id, &p.addr);
            }
        }
        let alarms =
            crate::alarms::Alarms::new(config.memory_limit_bytes(), config.disk_free_limit_bytes);
        let connections = crate::connections::Connections::new();
        let detector = Detector::new(
            me,
            epoch,
            config.amqp_advertised(),
            config.advertised(),
            peers.clone(),
            alarms.clone(),
            connections.clone(),
        );
        let forwarder = Forwarder::new(peers.clone(), detector.clone());
        let consumers = ConsumerRegistry::new(me, epoch);
        consumers.set_remote(RemoteDeliveries::new(peers.clone(), detector.clone()));
        let groups = Arc::new(GroupTable::default());

        let meta_changed = watch::Sender::new(0);
        let access_revoked = watch::Sender::new(0);
        let sm = store.state_machine::<TypeConfig, MetaHost>(
            META_GROUP,
            MetaHost::new()
                .with_notifier(meta_changed.clone())
                .with_revocation_notifier(access_revoked.clone()),
        )?;
        let meta = sm.machine();
        let log = store.log_store::<TypeConfig>(META_GROUP)?;
        let raft_cfg = Arc::new(meta_raft_config().map_err(|e| NodeError::Raft(e.to_string()))?);
        let meta_raft = Raft::new(
            me,
            raft_cfg,
            Network {
                group: META_GROUP,
                peers: peers.clone(),
                groups: groups.clone(),
                durable: None,
                detector: detector.clone(),
            },
            log,
            sm,
        )
        .await
        .map_err(|e| NodeError::Raft(e.to_string()))?;
        groups.insert(
            META_GROUP,
            Arc::new(MetaReplica {
                raft: meta_raft.clone(),
            }),
        );
        // Formation: every node of the static list initializes the meta group
        // with the same voters (at most 5, lowest ids), so any majority of
        // them forms the cluster. A restarted node keeps its state.
        // A node started with --join (and no --peers) waits to be admitted
        // instead (see `Broker::join_if_needed`).
        let mut voters: Vec<u64> = peers_cfg.iter().map(|p| p.id).collect();
        if voters.is_empty() && config.join.is_none() {
            voters.push(me);
        }
        voters.truncate(join::MAX_META_VOTERS);
        if voters.contains(&me) {
            initialize(&meta_raft, &voters).await?;
        }
        let services = ClusterServices {
            peers: peers.clone(),
            groups: groups.clone(),
            detector: detector.clone(),
            consumers: consumers.clone(),
            origin,
        };
        let broker = Arc::new(Broker {
            config,
            store,
            origin,
            meta_raft,
            meta,
            meta_changed,
            access_revoked,
            queues: RwLock::new(HashMap::new()),
            consumers,
            next_connection: AtomicU64::new(1),
            groups_lock: tokio::sync::Mutex::new(()),
            events: watch::Sender::new(0),
            stopping: AtomicBool::new(false),
            peers,
            groups,
            detector,
            forwarder,
            alarms,
            connections,
        });
        Ok((broker, services))
    }

    /// Starts the failure detector, elections and the topology reconciler,
    /// and waits (up to 30 s) for a meta leader; a single node elects itself
    /// at once. Call once the cluster listener serves [`Broker::open`]'s
    /// services.
    pub async fn start(self: &Arc<Self>) -> Result<(), NodeError> {
        self.join_if_needed().await?;
        self.alarms.spawn_monitor(self.config.data_dir.clone());
        self.detector.spawn();
        elections::spawn(
            self.node_id(),
            Arc::downgrade(&self.groups),
            self.detector.clone(),
        );
        let single = self.peers.others().is_empty();
        if single && self.meta_raft.current_leader().await != Some(self.node_id()) {
            // A single voter would wait a whole election timeout.
            let _ = self.meta_raft.trigger().elect().await;
        }
        let waited = self
            .meta_raft
            .wait(Some(Duration::from_secs(if single { 30 } else { 10 })))
            .metrics(|m| m.current_leader.is_some(), "meta leader elected")
            .await;
        if waited.is_err() {
            tracing::warn!("no meta leader yet (waiting for a majority of the cluster's nodes); serving anyway");
        }
        self.drop_own_local_queues().await;
        self.reconcile().await;
        tokio::spawn(reconciler(Arc::downgrade(self)));
        tokio::spawn(crate::liveness::run(Arc::downgrade(self)));
        tokio::spawn(membership_watch(Arc::downgrade(self)));
        if let Some(old) = self.config.replaces {
            tokio::spawn(crate::cluster::membership::replace(
                Arc::downgrade(self),
                old,
            ));
        }
        Ok(())
    }

    /// This node's id.
    pub fn node_id(&self) -> u64 {
        self.config.node_id
    }

    /// True when durable queues declared without `x-queue-type` in `vhost` are classic: the
    /// vhost's default queue type (`add_vhost --default-queue-type`), else this node's
    /// `default_queue_type`.
    pub fn classic_by_default(&self, vhost: &str) -> bool {
        match self
            .with_topology(|t| t.vhost_settings(vhost).default_queue_type)
            .flatten()
        {
            Some(t) => t == "classic",
            None => self.config.classic_by_default().unwrap_or(false),
        }
    }

    /// A queue.declare through this node (AMQP or the management API): replica placement
    /// for a new quorum queue ([`Broker::place`]), and the vhost's default queue type
    /// written into the arguments when they name none (so every replica applies the same
    /// type). The caller sets `server_named` and checks permissions.
    #[allow(clippy::too_many_arguments)]
    pub fn queue_declare(
        &self,
        vhost: &str,
        name: &str,
        passive: bool,
        durable: bool,
        exclusive: bool,
        auto_delete: bool,
        mut arguments: FieldTable,
        connection: u64,
    ) -> QueueDeclare {
        let members = if durable && !exclusive && !auto_delete && !passive {
            self.place(&arguments)
        } else {
            Vec::new()
        };
        if !passive
            && self.classic_by_default(vhost)
            && crate::meta::value::lookup(&arguments, "x-queue-type").is_none()
        {
            arguments.insert(
                "x-queue-type".into(),
                amq_protocol::types::AMQPValue::LongString("classic".into()),
            );
        }
        QueueDeclare {
            vhost: vhost.to_owned(),
            name: name.to_owned(),
            passive,
            durable,
            exclusive,
            auto_delete,
            arguments,
            node: self.node_id(),
            connection,
            server_named: false,
            members,
        }
    }

    /// The node's memory and disk alarms.
    pub fn alarms(&self) -> &Arc<crate::alarms::Alarms> {
        &self.alarms
    }

    /// Open client connections of this node and its peers (connection limits).
    pub fn connections(&self) -> &Arc<crate::connections::Connections> {
        &self.connections
    }

    /// The node-level failure detector.
    pub fn detector(&self) -> &Arc<Detector> {
        &self.detector
    }

    /// The meta group's Raft handle (cluster membership, topology).
    pub fn meta_raft(&self) -> &Raft {
        &self.meta_raft
    }

    /// The cluster's nodes and their gRPC channels.
    pub fn peers(&self) -> &Arc<Peers> {
        &self.peers
    }

    /// Directory of a quorum queue's body segments.
    fn bodies_dir(&self, group: u64) -> PathBuf {
        self.config
            .data_dir
            .join(format!("node-{}", self.config.node_id))
            .join("bodies")
            .join(group.to_string())
    }

    /// The node's configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The consumer table.
    pub fn consumers(&self) -> &Arc<ConsumerRegistry> {
        &self.consumers
    }

    /// A fresh connection id.
    pub fn next_connection_id(&self) -> u64 {
        self.next_connection.fetch_add(1, Ordering::Relaxed)
    }

    /// The limits of `vhost` (`set_vhost_limits`) in the local meta replica; empty when
    /// none are set.
    pub fn vhost_limits(&self, vhost: &str) -> crate::meta::VhostLimits {
        self.with_topology(|t| t.vhost_limits(vhost))
            .unwrap_or_default()
    }

    /// True when `user` exists (EXTERNAL logins: the TLS certificate stands for the
    /// password).
    pub fn user_exists(&self, user: &str) -> bool {
        self.with_topology(|t| t.access().user(user).is_some())
            .unwrap_or(false)
    }

    /// True when `user` exists and `password` matches its hash (RabbitMQ's internal
    /// authentication backend).
    pub fn password_ok(&self, user: &str, password: &[u8]) -> bool {
        self.with_topology(|t| {
            t.access()
                .user(user)
                .is_some_and(|u| crate::meta::access::password_matches(&u.password_hash, password))
        })
        .unwrap_or(false)
    }

    /// Reads the topology of the local replica.
    pub fn with_topology<R>(&self, f: impl FnOnce(&crate::meta::Topology) -> R) -> Option<R> {
        self.meta.lock().ok().map(|m| f(m.topology()))
    }

    /// Proposes a topology change to the meta group: on this node when it
    /// leads, else forwarded to the leader; returns once the local replica
    /// applied it too (so this node's routing sees its own writes).
    ///
    /// Errors: 541 INTERNAL_ERROR when no meta leader answered in 30 s.
    pub async fn meta_write(&self, cmd: MetaCommand) -> Result<MetaReply, ProtocolError> {
        let started = std::time::Instant::now();
        let me = self.node_id();
        let mut last = String::from("no meta leader");
        while started.elapsed() < META_WRITE_FOR {
            let leader = self.meta_raft.metrics().borrow().current_leader;
            match leader {
                Some(l) if l == me => {
                    match self
                        .meta_raft
                        .client_write(GroupCommand::Meta(cmd.clone()))
                        .await
                    {
                        Ok(resp) => {
                            return match resp.data {
                                GroupReply::Meta(r) => Ok(r),
                                _ => Err(ProtocolError::internal("unexpected meta reply")),
                            }
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
                            self.await_meta_applied(index).await;
                            return Ok(r);
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

    /// Waits (≤ 5 s) until the local meta replica applied log index
    /// `index` (a write this node forwarded), so its routing sees it.
    async fn await_meta_applied(&self, index: u64) {
        let _ = self
            .meta_raft
            .wait(Some(Duration::from_secs(5)))
            .applied_index_at_least(Some(index), "forwarded meta write applied locally")
            .await;
    }

    /// Signals a topology change or a queue regaining room, so held
    /// dead letters are retried at once (not after the fallback timer).
    pub fn topology_changed(&self) {
        self.events.send_modify(|g| *g = g.wrapping_add(1));
    }

    /// Subscribes to revocations: the value moves each time this node's meta replica
    /// deletes a vhost or a user, or installs a meta snapshot.
    pub fn subscribe_revocations(&self) -> watch::Receiver<u64> {
        self.access_revoked.subscribe()
    }

    /// Subscribes to [`Broker::topology_changed`] signals.
    pub fn subscribe_events(&self) -> watch::Receiver<u64> {
        self.events.subscribe()
    }

    /// The record and handle of queue `name`.
    pub fn queue(&self, vhost: &str, name: &str) -> Option<(QueueRecord, Arc<QueueHandle>)> {
        let rec = self.with_topology(|t| t.queue(vhost, name).cloned())??;
        let handle = self.queues.read().ok()?.get(&rec.group_id).cloned()?;
        Some((rec, handle))
    }

    /// Handle by group id.
    pub fn queue_by_group(&self, group: u64) -> Option<Arc<QueueHandle>> {
        self.queues.read().ok()?.get(&group).cloned()
    }

    /// All queue handles on this node.
    pub fn queue_handles(&self) -> Vec<Arc<QueueHandle>> {
        self.queues
            .read()
            .map(|q| q.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Routes a publish: target queue handles, in the topology's order.
    pub fn route(
        &self,
        vhost: &str,
        exchange: &str,
        routing_keys: &[String],
        headers: Option<&FieldTable>,
    ) -> Result<Vec<Arc<QueueHandle>>, ProtocolError> {
        let names = {
            let meta = self
                .meta
                .lock()
                .map_err(|_| ProtocolError::internal("meta lock poisoned"))?;
            let topo = meta.topology();
            let names = topo.route(vhost, exchange, routing_keys, headers)?;
            names
                .into_iter()
                .filter_map(|n| topo.queue(vhost, &n).map(|r| r.group_id))
                .collect::<Vec<u64>>()
        };
        let queues = self
            .queues
            .read()
            .map_err(|_| ProtocolError::internal("queue table poisoned"))?;
        Ok(names
            .iter()
            .filter_map(|g| queues.get(g).cloned())
            .collect())
    }

    /// Effective configuration of a queue (arguments + policy).
    pub fn effective_config(&self, vhost: &str, name: &str) -> QueueConfig {
        self.with_topology(|t| t.effective_config(vhost, name))
            .flatten()
            .map(|(c, warnings, _)| {
                for w in warnings {
                    tracing::warn!(queue = name, "{w}");
                }
                c
            })
            .unwrap_or_default()
    }

    /// Replica placement of a new quorum queue declared on this node:
    /// `x-quorum-initial-group-size` nodes (default 3, capped at the
    /// cluster size), this node first (its preferred leader, RabbitMQ's
    /// `client-local` leader locator), then the nodes holding the fewest
    /// replicas, live ones before down ones, lower ids first.
    pub fn place(&self, arguments: &FieldTable) -> Vec<u64> {
        let size = match arguments.inner().get("x-quorum-initial-group-size") {
            Some(v) => crate::meta::value::as_integer(v)
                .and_then(|n| u64::try_from(n).ok())
                .unwrap_or(DEFAULT_GROUP_SIZE),
            None => DEFAULT_GROUP_SIZE,
        };
        let me = self.node_id();
        let mut nodes: Vec<u64> = self.peers.all().into_iter().map(|(id, _)| id).collect();
        if !nodes.contains(&me) {
            nodes.push(me);
        }
        let size = (size.max(1) as usize).min(nodes.len());
        let mut load: HashMap<u64, usize> = HashMap::new();
        self.with_topology(|t| {
            for q in t.queues() {
                for m in &q.members {
                    *load.entry(*m).or_default() += 1;
                }
            }
        });
        let mut others: Vec<u64> = nodes.into_iter().filter(|n| *n != me).collect();
        others.sort_by_key(|n| {
            (
                !self.detector.is_alive(*n),
                load.get(n).copied().unwrap_or(0),
                *n,
            )
        });
        let mut members = vec![me];
        members.extend(others.into_iter().take(size - 1));
        members
    }

    /// The reference to a declared queue, opening this node's replica of it
    /// (a member) or a forwarding reference (not a member) if there is none
    /// yet. The declaring node waits (≤ 5 s) for the new group's leader.
    pub async fn ensure_queue(
        self: &Arc<Self>,
        rec: &QueueRecord,
    ) -> Result<Arc<QueueHandle>, ProtocolError> {
        if let Some(h) = self.queue_by_group(rec.group_id) {
            return Ok(h);
        }
        let handle = {
            let _guard = self.groups_lock.lock().await;
            if let Some(h) = self.queue_by_group(rec.group_id) {
                return Ok(h);
            }
            let handle = self
                .open_queue(rec)
                .await
                .map_err(ProtocolError::internal)?;
            if let Ok(mut q) = self.queues.write() {
                q.insert(rec.group_id, handle.clone());
            }
            handle
        };
        self.topology_changed();
        if let Some(route) = handle.route() {
            route.wait_leader(Duration::from_secs(5)).await;
        }
        Ok(handle)
    }

    fn context(
        &self,
        rec: &QueueRecord,
    ) -> (
        Arc<QueueContext>,
        tokio::sync::mpsc::UnboundedReceiver<crate::queue::host::LeaderEffect>,
    ) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let ctx = Arc::new(QueueContext {
            group: rec.group_id,
            vhost: rec.vhost.clone(),
            name: rec.name.clone(),
            node: self.config.node_id,
            consumers: self.consumers.clone(),
            effects: tx,
            closed: AtomicBool::new(false),
            closing: tokio::sync::Notify::new(),
            live: AtomicBool::new(false),
            early: Default::default(),
        });
        (ctx, rx)
    }

    /// Opens this node's replica of quorum queue group `group`: body store,
    /// log, state machine and Raft (not initialized: see the callers), and
    /// registers it with the transport.
    /// Returns the Raft handle, the host, and whether openraft restores the
    /// replica as leader from its vote ([`restores_as_leader`]).
    ///
    /// Errors: storage cannot be opened; openraft refuses the config.
    async fn open_replica(
        &self,
        group: u64,
        ctx: &Arc<QueueContext>,
        config: QueueConfig,
    ) -> Result<(Raft, Arc<Mutex<QueueHost>>, bool), NodeError> {
        let me = self.config.node_id;
        let machine = QueueMachine::new(config);
        let bodies = SegmentBodies::open(&self.bodies_dir(group), MEMORY_BUDGET)?;
        let host = QueueHost::new(machine, Box::new(bodies), ctx.clone());
        // The leader syncs its log while it replicates (raft_log::durable).
        let mut log = self
            .store
            .log_store::<TypeConfig>(group)?
            .ack_own_entries(me);
        let restored_leader = restores_as_leader(&mut log, me).await;
        let durable = log.durable();
        let sm = self
            .store
            .state_machine::<TypeConfig, QueueHost>(group, host)?
            .apply_when_durable(durable.clone());
        let host = sm.machine();
        if let Ok(mut h) = host.lock() {
            h.finish_open();
        }
        let cfg = Arc::new(
            raft_config(group, self.config.snapshot_interval)
                .map_err(|e| NodeError::Raft(e.to_string()))?,
        );
        let raft = Raft::new(
            me,
            cfg,
            Network {
                group,
                peers: self.peers.clone(),
                groups: self.groups.clone(),
                durable: Some(durable),
                detector: self.detector.clone(),
            },
            log,
            sm,
        )
        .await
        .map_err(|e| NodeError::Raft(e.to_string()))?;
        self.groups.insert(
            group,
            Arc::new(QueueReplica {
                raft: raft.clone(),
                host: host.clone(),
            }),
        );
        Ok((raft, host, restored_leader))
    }

    async fn open_queue(
        self: &Arc<Self>,
        rec: &QueueRecord,
    ) -> Result<Arc<QueueHandle>, NodeError> {
        let me = self.config.node_id;
        let (ctx, rx) = self.context(rec);
        let config = self.effective_config(&rec.vhost, &rec.name);
        // Declared classic, or local (untyped non-durable/exclusive/auto-delete).
        let classic = QueueType::of_args(&rec.arguments) != QueueType::Quorum;
        let declared_quorum = crate::meta::queue_args::declared_quorum(&rec.arguments);
        let handle = match rec.kind {
            QueueKind::Quorum if !rec.members.contains(&me) => {
                let route = Route::new(
                    rec.group_id,
                    None,
                    rec.members.clone(),
                    self.forwarder.clone(),
                );
                // No replica here: nothing to run but the forwarding proposer
                // (the runtime starts if this node becomes a member).
                return Ok(Arc::new(
                    QueueHandle::remote(
                        rec.vhost.clone(),
                        rec.name.clone(),
                        ctx,
                        route,
                        self.origin,
                    )
                    .classic(classic)
                    .declared_quorum(declared_quorum)
                    .with_idle_effects(rx),
                ));
            }
            QueueKind::Quorum => {
                let (raft, host, restored_leader) = self
                    .open_replica(rec.group_id, &ctx, config.clone())
                    .await?;
                ctx.live.store(true, Ordering::Release);
                // openraft's initialize campaigns at once. Only the preferred
                // leader (first member) and sole members initialize now; the
                // others take the membership from the leader's first append,
                // or initialize themselves (and campaign) after a grace if
                // none came (the preferred leader died before it could lead).
                let preferred = rec.members.first() == Some(&me);
                if preferred || rec.members == [me] {
                    initialize(&raft, &rec.members).await?;
                } else {
                    let (raft, members) = (raft.clone(), rec.members.clone());
                    tokio::spawn(async move {
                        tokio::time::sleep(UNINITIALIZED_GRACE).await;
                        if let Err(e) = initialize(&raft, &members).await {
                            tracing::warn!(error = %e, "initializing a queue replica failed");
                        }
                    });
                }
                if restored_leader {
                    tokio::spawn(mark_restored_leadership(
                        raft.clone(),
                        self.origin,
                        rec.name.clone(),
                    ));
                }
                // In a new group the preferred leader (first member) campaigns
                // until a leader is known (the other members open their
                // replicas when they apply the queue record, a little later);
                // the election sweep takes over after its grace. A group with a
                // term is reopening (restart): its leader may be alive, and a
                // campaign from a replica that missed entries would only
                // depose it (openraft 0.9 has no pre-vote); a sole member
                // campaigns all the same.
                let fresh = raft.metrics().borrow().current_term == 0;
                let sole = rec.members == [me];
                if (fresh || sole) && rec.members.first() == Some(&me) {
                    let raft = raft.clone();
                    tokio::spawn(async move {
                        // The first campaign was openraft's initialize (new
                        // group) or is the first one here (sole member).
                        if !fresh {
                            let _ = raft.trigger().elect().await;
                        }
                        for _ in 0..PREFERRED_CAMPAIGNS {
                            tokio::time::sleep(PREFERRED_CAMPAIGN_EVERY).await;
                            if raft.current_leader().await.is_some() {
                                return;
                            }
                            let _ = raft.trigger().elect().await;
                        }
                    });
                }
                let route = Route::new(
                    rec.group_id,
                    Some(raft),
                    rec.members.clone(),
                    self.forwarder.clone(),
                );
                let h = Arc::new(
                    QueueHandle::replica(
                        rec.vhost.clone(),
                        rec.name.clone(),
                        host,
                        ctx,
                        route,
                        self.origin,
                        self.store.flusher().busy_hint(),
                    )
                    .classic(classic)
                    .declared_quorum(declared_quorum),
                );
                // Consumers of this node's earlier boots are gone (spec §2.3),
                // and policy changes made while the queue was down apply.
                let h2 = h.clone();
                let epoch = self.origin.epoch;
                tokio::spawn(async move {
                    let _ = h2
                        .call(QueueCommand::NodeRestarted {
                            now_ms: crate::now_ms(),
                            node: me,
                            epoch,
                        })
                        .await;
                    let _ = h2
                        .call(QueueCommand::UpdateConfig {
                            now_ms: crate::now_ms(),
                            config,
                        })
                        .await;
                });
                h
            }
            QueueKind::Local { .. } => {
                let machine = QueueMachine::new(config);
                let host = QueueHost::new(machine, Box::new(MemBodies::default()), ctx.clone());
                ctx.live.store(true, Ordering::Release);
                Arc::new(
                    QueueHandle::local(
                        rec.vhost.clone(),
                        rec.name.clone(),
                        Arc::new(Mutex::new(host)),
                        ctx,
                    )
                    .classic(classic)
                    .declared_quorum(declared_quorum),
                )
            }
        };
        runtime::spawn(Arc::downgrade(self), handle.clone(), rx);
        Ok(handle)
    }

    /// Brings this node's replica of `rec` in line with its member list
    /// (`add_member` / `delete_member` changed it): a new member opens an
    /// empty replica, which the leader then fills (as a learner, then a
    /// voter); a removed one shuts its replica down and deletes its
    /// storage. Channels keep the queue's handle either way: its commands
    /// are forwarded once no replica is here.
    async fn follow_membership(self: &Arc<Self>, rec: &QueueRecord, h: &Arc<QueueHandle>) {
        let me = self.node_id();
        let member = rec.members.contains(&me);
        if member == h.has_replica() {
            return;
        }
        let _guard = self.groups_lock.lock().await;
        if member == h.has_replica() || self.queue_by_group(rec.group_id).is_none() {
            return;
        }
        if member {
            let config = self.effective_config(&rec.vhost, &rec.name);
            match self.open_replica(rec.group_id, h.context(), config).await {
                Ok((raft, host, _)) => {
                    h.context().live.store(true, Ordering::Release);
                    h.set_replica(Some((raft, host)));
                    if let Some(rx) = h.take_idle_effects() {
                        runtime::spawn(Arc::downgrade(self), h.clone(), rx);
                    }
                    tracing::info!(queue = %rec.name, "this node became a member of the queue: replica opened");
                }
                Err(e) => {
                    tracing::error!(queue = %rec.name, error = %e, "opening the replica of a new member failed")
                }
            }
        } else {
            self.groups.remove(rec.group_id);
            let raft = h.set_replica(None);
            h.context().live.store(false, Ordering::Release);
            if let Some(raft) = raft {
                if let Err(e) = raft.shutdown().await {
                    tracing::warn!(queue = %rec.name, error = %e, "raft shutdown failed");
                }
            }
            self.delete_replica_storage(rec.group_id);
            tracing::info!(queue = %rec.name, "this node is no longer a member of the queue: replica removed");
        }
    }

    /// Deletes a queue: the meta record, then the group and its storage
    /// (other nodes drop theirs when they apply the deletion).
    pub async fn delete_queue(
        &self,
        vhost: &str,
        name: &str,
    ) -> Result<Option<QueueRecord>, ProtocolError> {
        let reply = self
            .meta_write(MetaCommand::DeleteQueue {
                vhost: vhost.into(),
                name: name.into(),
            })
            .await?;
        let MetaReply::QueueDeleted(rec) = reply else {
            return Ok(None);
        };
        if let Some(rec) = &rec {
            self.drop_queue_group(rec.group_id).await;
        }
        Ok(rec)
    }

    async fn drop_queue_group(&self, group: u64) {
        let _guard = self.groups_lock.lock().await;
        let handle = self.queues.write().ok().and_then(|mut q| q.remove(&group));
        if let Some(h) = handle {
            self.consumers.cancel_group(group);
            self.groups.remove(group);
            h.shutdown().await;
            if h.is_quorum() && h.has_replica() {
                self.delete_replica_storage(group);
            }
        }
    }

    /// Deletes a shut-down replica's log, snapshot and body segments.
    fn delete_replica_storage(&self, group: u64) {
        if let Err(e) = self.store.drop_group(group) {
            tracing::warn!(group, error = %e, "failed to drop group storage");
        }
        if let Err(e) = std::fs::remove_dir_all(self.bodies_dir(group)) {
            tracing::warn!(group, error = %e, "failed to remove body segments");
        }
    }

    /// Deletes an auto-delete queue once its last consumer is gone.
    pub async fn maybe_auto_delete(&self, handle: &Arc<QueueHandle>) {
        let auto = self
            .with_topology(|t| {
                t.queue(&handle.vhost, &handle.name)
                    .map(|r| r.auto_delete && r.group_id == handle.group)
            })
            .flatten()
            .unwrap_or(false);
        if auto && handle.unused_after_consumers() {
            if let Err(e) = self.delete_queue(&handle.vhost, &handle.name).await {
                tracing::warn!(queue = %handle.name, error = ?e, "auto-delete failed");
            }
        }
    }

    /// Local (non-replicated) queues this node held in an earlier boot are
    /// gone with it: their records go.
    async fn drop_own_local_queues(&self) {
        let me = self.node_id();
        let stale: Vec<QueueRecord> = self
            .with_topology(|t| {
                t.queues()
                    .filter(|q| matches!(q.kind, QueueKind::Local { node } if node == me))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        for rec in stale {
            let _ = self
                .meta_write(MetaCommand::DeleteQueue {
                    vhost: rec.vhost.clone(),
                    name: rec.name.clone(),
                })
                .await;
        }
    }

    /// Brings the node's queues in line with the topology: opens replicas
    /// and references for new quorum queues (a node that was down creates
    /// its replicas now), drops those of deleted queues, updates member
    /// lists, fixes the cluster id.
    async fn reconcile(self: &Arc<Self>) {
        let me = self.node_id();
        let (records, cluster_id) = self
            .with_topology(|t| {
                let recs: Vec<QueueRecord> = t
                    .queues()
                    .filter(|q| {
                        q.kind == QueueKind::Quorum || q.kind == QueueKind::Local { node: me }
                    })
                    .cloned()
                    .collect();
                (recs, t.cluster_id())
            })
            .unwrap_or_default();
        self.adopt_cluster_id(cluster_id).await;
        for rec in &records {
            match self.queue_by_group(rec.group_id) {
                Some(h) => {
                    if let Some(r) = h.route() {
                        r.update_members(&rec.members);
                    }
                    if rec.kind == QueueKind::Quorum {
                        self.follow_membership(rec, &h).await;
                    }
                }
                None if rec.kind == QueueKind::Quorum => {
                    if let Err(e) = self.ensure_queue(rec).await {
                        tracing::error!(queue = %rec.name, error = ?e, "failed to open queue");
                    }
                }
                None => {}
            }
        }
        // Handles first, then the topology: a handle exists only after its
        // record was applied, so one whose record is missing from the
        // topology read afterwards was deleted (group ids are never reused).
        // Comparing with `records` instead would drop a queue declared while
        // this pass was opening others.
        let handles: Vec<u64> = self.queue_handles().iter().map(|h| h.group).collect();
        let Some(live) =
            self.with_topology(|t| t.queues().map(|q| q.group_id).collect::<HashSet<u64>>())
        else {
            return;
        };
        let gone = handles.into_iter().filter(|g| !live.contains(g));
        for g in gone {
            self.drop_queue_group(g).await;
        }
    }

    /// Learns (or, as meta leader, fixes) the cluster id.
    /// With `--join` and no meta state yet: asks the node at the join
    /// address to admit this one (retried every second for up to 120 s while
    /// the cluster has no meta leader or is unreachable), then takes the
    /// peer addresses and cluster id of the reply. A node that already has
    /// meta state (a restart) does nothing.
    ///
    /// Errors: refused for good (e.g. the node id is taken), or not admitted in time.
    async fn join_if_needed(&self) -> Result<(), NodeError> {
        let Some(via) = self.config.join.clone() else {
            return Ok(());
        };
        let initialized = self
            .meta_raft
            .is_initialized()
            .await
            .map_err(|e| NodeError::Raft(e.to_string()))?;
        if initialized {
            return Ok(());
        }
        let me = self.node_id();
        let req = quorumq_proto::v1::JoinRequest {
            node_id: me,
            cluster_addr: self.config.advertised(),
            amqp_addr: self.config.amqp_advertised(),
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
        loop {
            let last = match join::ask(&via, &self.peers, req.clone()).await {
                Ok(r) if r.accepted => {
                    for p in &r.peers {
                        if p.node_id != me {
                            self.peers.set_addr(p.node_id, &p.cluster_addr);
                            join::remember(self.store.db(), p.node_id, &p.cluster_addr)?;
                        }
                    }
                    self.store.sync_sled_async().await?;
                    self.adopt_cluster_id(r.cluster_id).await;
                    tracing::info!(via = %via, peers = r.peers.len(), "admitted to the cluster");
                    return Ok(());
                }
                Ok(r) if r.permanent => {
                    return Err(NodeError::Config(format!(
                        "joining via {via} was refused: {}",
                        r.error
                    )))
                }
                Ok(r) => r.error,
                Err(e) => e,
            };
            if tokio::time::Instant::now() > deadline {
                return Err(NodeError::Config(format!(
                    "could not join via {via} within 120 s: {last}"
                )));
            }
            tracing::warn!(via = %via, error = %last, "not admitted yet; retrying");
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    async fn adopt_cluster_id(&self, in_meta: u64) {
        if in_meta == 0 {
            if self.meta_raft.metrics().borrow().current_leader == Some(self.node_id()) {
                let id = rand::random::<u64>() | 1;
                let _ = self.meta_write(MetaCommand::SetClusterId(id)).await;
            }
            return;
        }
        let known = self.peers.cluster_id();
        if known == in_meta {
            return;
        }
        if known != 0 {
            tracing::error!(
                ours = known,
                meta = in_meta,
                "this node's data belongs to another cluster"
            );
            return;
        }
        self.peers.set_cluster_id(in_meta);
        let db = self.store.db();
        if db.insert("node/cluster_id", &in_meta.to_be_bytes()).is_ok() {
            if let Err(e) = self.store.sync_sled_async().await {
                tracing::warn!(error = %e, "could not sync the cluster id");
            }
        }
        tracing::info!(cluster_id = format!("{in_meta:016x}"), "joined cluster");
    }

    /// An operator's topology change (quorumqctl, the management API): [`Broker::meta_write`],
    /// then the policies' effect on this node's queues ([`Broker::refresh_configs`]).
    ///
    /// Errors: the change's AMQP error (its code and RabbitMQ's text), or 541 when no meta
    /// leader answered.
    pub async fn operator_write(&self, cmd: MetaCommand) -> Result<MetaReply, ProtocolError> {
        match self.meta_write(cmd).await? {
            MetaReply::Error(e) => Err(e.into()),
            reply => {
                self.refresh_configs().await;
                Ok(reply)
            }
        }
    }

    /// Applies changed policies: every queue whose effective configuration
    /// changed gets an `UpdateConfig` (spec §1.6).
    pub async fn refresh_configs(&self) {
        for h in self.queue_handles() {
            let config = self.effective_config(&h.vhost, &h.name);
            let current = h.read(|host| host.machine().config().clone());
            if current.as_ref() != Some(&config) {
                let _ = h
                    .call(QueueCommand::UpdateConfig {
                        now_ms: crate::now_ms(),
                        config,
                    })
                    .await;
            }
        }
        self.topology_changed();
    }

    /// The cluster as this node sees it (nodes, liveness, meta leader).
    pub fn cluster_status(&self) -> ClusterStatus {
        // The meta group's members (a forgotten node is not one), with the
        // addresses known here; every known address while the membership
        // is not known yet.
        let known: BTreeMap<u64, String> = self.peers.all().into_iter().collect();
        let metrics = self.meta_raft.metrics().borrow().clone();
        let mut ids: BTreeMap<u64, String> = metrics
            .membership_config
            .membership()
            .nodes()
            .map(|(id, _)| (*id, known.get(id).cloned().unwrap_or_default()))
            .collect();
        if ids.is_empty() {
            ids = known;
        }
        ClusterStatus {
            nodes: ids
                .into_iter()
                .map(|(id, addr)| NodeStatus {
                    id,
                    cluster_addr: addr,
                    amqp_addr: self.detector.amqp_addr_of(id).unwrap_or_default(),
                    running: self.detector.is_alive(id),
                })
                .collect(),
            meta_leader: metrics.current_leader,
        }
    }

    /// Placement (leader, members, online members) and counts of a queue.
    pub async fn queue_status(&self, rec: &QueueRecord) -> QueueStatus {
        let mut members = rec.members.clone();
        members.sort_unstable();
        let online = members
            .iter()
            .copied()
            .filter(|m| self.detector.is_alive(*m))
            .collect();
        let Some(h) = self.queue_by_group(rec.group_id) else {
            // Not opened here yet (the reconciler is about to).
            return QueueStatus {
                members,
                online,
                ..QueueStatus::default()
            };
        };
        let (mut st, leader) = match h.route() {
            Some(r) => (r.status(h.local_status()).await, r.leader()),
            None => (h.local_status().unwrap_or_default(), Some(self.node_id())),
        };
        st.online = online;
        st.leader = leader.filter(|l| self.detector.is_alive(*l));
        st.members = members;
        st
    }

    /// Quorum queues this node leads, and quorum queue replicas it holds
    /// (counts; `quorumqctl status` and `cluster_status`).
    pub fn leaders_and_replicas(&self) -> (u64, u64) {
        let me = self.node_id();
        let (mut leaders, mut replicas) = (0, 0);
        for h in self.queue_handles() {
            if let Some(raft) = h.route().and_then(|r| r.raft()) {
                replicas += 1;
                if raft.metrics().borrow().current_leader == Some(me) {
                    leaders += 1;
                }
            }
        }
        (leaders, replicas)
    }

    /// Why this node does not serve clients now (None: it does): stopping,
    /// draining, or no meta leader known (no quorum reachable, or not yet
    /// joined). The readiness probe (`crate::http`).
    pub fn not_serving(&self) -> Option<&'static str> {
        if self.is_stopping() {
            Some("stopping")
        } else if self.detector.is_draining() {
            Some("draining")
        } else if self.meta_raft.metrics().borrow().current_leader.is_none() {
            Some("no meta leader (no quorum reachable, or not joined yet)")
        } else {
            None
        }
    }

    /// True once shutdown began.
    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    /// Graceful stop: Raft groups shut down, storage flushed.
    pub async fn shutdown(&self) {
        self.stopping.store(true, Ordering::Release);
        for h in self.queue_handles() {
            h.shutdown().await;
        }
        let _ = self.meta_raft.shutdown().await;
        if let Err(e) = self.store.flush().await {
            tracing::warn!(error = %e, "final flush failed");
        }
    }
}

/// Re-reconciles after every meta change (and every 10 s, retrying a
/// replica that failed to open).
async fn reconciler(broker: std::sync::Weak<Broker>) {
    let Some(mut changed) = broker.upgrade().map(|b| b.meta_changed.subscribe()) else {
        return;
    };
    loop {
        tokio::select! {
            r = changed.changed() => if r.is_err() { return },
            _ = tokio::time::sleep(Duration::from_secs(10)) => {}
        }
        let Some(b) = broker.upgrade() else { return };
        if b.is_stopping() {
            return;
        }
        b.reconcile().await;
    }
}

/// Learns node addresses from the meta membership (nodes admitted by
/// `--join` carry theirs) and remembers every known peer address in sled,
/// so a restarted node finds its peers by itself.
async fn membership_watch(broker: std::sync::Weak<Broker>) {
    let Some(mut metrics) = broker.upgrade().map(|b| b.meta_raft.metrics()) else {
        return;
    };
    let mut seen = None;
    loop {
        let Some(b) = broker.upgrade() else { return };
        let membership = metrics.borrow_and_update().membership_config.clone();
        if seen.as_ref() != Some(membership.log_id()) {
            seen = Some(*membership.log_id());
            let me = b.node_id();
            for (id, node) in membership.membership().nodes() {
                if *id != me
                    && !node.addr.is_empty()
                    && b.peers.addr(*id).as_deref() != Some(node.addr.as_str())
                {
                    b.peers.set_addr(*id, &node.addr);
                }
            }
            let db = b.store.db();
            for (id, addr) in b.peers.all() {
                if id != me {
                    if let Err(e) = join::remember(db, id, &addr) {
                        tracing::warn!(node = id, error = %e, "could not remember a peer address");
                    }
                }
            }
            if let Err(e) = b.store.sync_sled_async().await {
                tracing::warn!(error = %e, "could not sync peer addresses");
            }
        }
        drop(b);
        if metrics.changed().await.is_err() {
            return;
        }
    }
}

/// Initializes a fresh group with `voters` (every member calls this with
/// the same list, so the first log entry is the same everywhere); a group
/// that already has state keeps it. Node addresses live in [`Peers`], not in
/// the membership, so every member writes an identical entry.
async fn initialize(raft: &Raft, voters: &[u64]) -> Result<(), NodeError> {
    if raft
        .is_initialized()
        .await
        .map_err(|e| NodeError::Raft(e.to_string()))?
    {
        return Ok(());
    }
    let members: BTreeMap<u64, BasicNode> =
        voters.iter().map(|v| (*v, BasicNode::new(""))).collect();
    match raft.initialize(members).await {
        Ok(()) => Ok(()),
        Err(openraft::error::RaftError::APIError(
            openraft::error::InitializeError::NotAllowed(_),
        )) => Ok(()),
        Err(e) => Err(NodeError::Raft(e.to_string())),
    }
}

/// A corrupt store on a node of a multi-node cluster: the other replicas hold every committed
/// entry, so the way back is to rebuild the node from them (issue 11: a member with a corrupt
/// log must not serve). Adds the procedure to the error when this node knows peers (`--peers`,
/// `--join`, or addresses remembered in its sled records); other errors pass unchanged.
fn rebuild_hint(
    e: raft_log::StoreError,
    config: &Config,
    raft_dir: &Path,
    configured_peers: usize,
) -> NodeError {
    if !matches!(e, raft_log::StoreError::Corrupt(_)) {
        return NodeError::Store(e);
    }
    let remembered = sled::Config::new()
        .path(raft_dir.join("sled"))
        .open()
        .map(|db| join::remembered(&db).len())
        .unwrap_or(0);
    if configured_peers <= 1 && config.join.is_none() && remembered == 0 {
        return NodeError::Store(e);
    }
    let me = config.node_id;
    NodeError::Config(format!(
        "storage: {e}\n\nThis node is a member of a cluster: its replicas hold every committed \
         entry, so rebuild it from them rather than truncating (a truncated member may have \
         acknowledged entries it no longer holds): on a running node `quorumqctl \
         forget_cluster_node {me}`; move {} away; start this machine with a new --node-id and \
         --join <a member's cluster address>; then `quorumqctl grow <new id> all` (each queue's \
         leader brings it up to date) — or do all of it with one start: --node-id <new id> \
         --join <a member's cluster address> --replaces {me}.",
        raft_dir.parent().unwrap_or(raft_dir).display()
    ))
}

/// Increments and persists the node's boot epoch, durably (power loss included) before any
/// proposal of this boot: proposals are deduplicated by (node, epoch, sequence), so a boot
/// that reused an epoch would see its first commands taken for the earlier boot's.
fn next_epoch(store: &NodeStore) -> Result<u32, NodeError> {
    let db = store.db();
    let prev = db
        .get("node/epoch")?
        .and_then(|v| <[u8; 4]>::try_from(v.as_ref()).ok())
        .map(u32::from_be_bytes)
        .unwrap_or(0);
    let epoch = prev.wrapping_add(1);
    db.insert("node/epoch", &epoch.to_be_bytes())?;
    store.sync_sled()?;
    Ok(epoch)
}

/// True when openraft will restore this replica as leader at startup: its
/// persisted vote is its own and committed (openraft 0.9
/// `Engine::startup`). Such a leader appends no blank entry in this boot.
async fn restores_as_leader<S>(log: &mut S, me: u64) -> bool
where
    S: openraft::storage::RaftLogStorage<TypeConfig>,
{
    matches!(log.read_vote().await, Ok(Some(v)) if v.is_committed() && v.leader_id().voted_for() == Some(me))
}

/// Appends [`GroupCommand::LeaderRestored`] for a replica restored as
/// leader, so the queue re-issues its leader-only effects (deliveries of
/// checked-out messages, held dead letters, timers) once every entry
/// before it is applied, as a new leader's blank entry does. Gives up when
/// leadership moved (the new leader's blank entry does the same) or after
/// a few failed tries.
async fn mark_restored_leadership(raft: Raft, origin: Origin, queue: String) {
    for _ in 0..10 {
        match raft
            .client_write(GroupCommand::LeaderRestored { origin })
            .await
        {
            Ok(_) => {
                tracing::info!(%queue, "queue leader restored from its vote: re-issued its deliveries and timers");
                return;
            }
            Err(openraft::error::RaftError::APIError(
                openraft::error::ClientWriteError::ForwardToLeader(_),
            )) => return,
            Err(e) => {
                tracing::debug!(%queue, error = %e, "marking a restored leadership failed; retrying");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use openraft::storage::RaftLogStorage;
    use openraft::Vote;

    use super::*;

    /// openraft restores a replica as leader only from its own committed
    /// vote; that is when `LeaderRestored` must be appended.
    #[tokio::test]
    async fn restores_as_leader_only_from_its_own_committed_vote() {
        let dir = tempfile::tempdir().unwrap();
        let store = NodeStore::open(dir.path(), 1 << 20).unwrap();
        let mut log = store.log_store::<TypeConfig>(1).unwrap();
        assert!(!restores_as_leader(&mut log, 2).await, "no vote yet");
        let cases = [
            (Vote::new(3, 2), false),           // own, not granted by a quorum
            (Vote::new_committed(4, 1), false), // another node's leadership
            (Vote::new_committed(5, 2), true),  // own, committed
        ];
        for (vote, restored) in cases {
            log.save_vote(&vote).await.unwrap();
            assert_eq!(restores_as_leader(&mut log, 2).await, restored, "{vote:?}");
        }
    }
}
