//! The composition root of a node: storage, the cluster plumbing (peers,
//! failure detector, transport services, elections), the meta group, and
//! the node's queues ([`Queues`]); the lookups the AMQP front end and the
//! management API call, most of them handed on to [`Queues`].

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use amq_protocol::types::FieldTable;
use raft_log::{NodeStore, StoreOptions};
use tokio::sync::watch;

use crate::amqp::error::ProtocolError;
use crate::cluster::bootstrap::initialize;
use crate::cluster::deliveries::RemoteDeliveries;
use crate::cluster::detector::Detector;
use crate::cluster::forward::Forwarder;
use crate::cluster::groups::GroupTable;
use crate::cluster::join;
use crate::cluster::meta_group::MetaGroup;
use crate::cluster::peers::Peers;
use crate::cluster::secret::ClusterSecret;
use crate::cluster::server::ClusterServices;
use crate::cluster::status::{self, ClusterStatus, QueueStatus};
use crate::cluster::transport::Network;
use crate::cluster::types::{Origin, Raft, TypeConfig, META_GROUP};
use crate::cluster::{elections, meta_raft_config};
use crate::config::Config;
use crate::consumers::ConsumerRegistry;
pub use crate::error::NodeError;
use crate::meta::command::{MetaCommand, MetaReply};
use crate::meta::host::MetaHost;
use crate::meta::{QueueDeclare, QueueRecord};
use crate::queue::handle::QueueHandle;
use crate::queue::registry::{Queues, QueuesParts};
use crate::queue::replica::MetaReplica;
use crate::queue::types::QueueConfig;

/// sled page cache (bytes); sled holds only snapshots and node records.
const CACHE_BYTES: u64 = 16 * 1024 * 1024;
/// How often the log read caches are dropped while the memory alarm is raised.
const SHRINK_EVERY: Duration = Duration::from_millis(100);

/// How long a starting node waits for its meta replica to apply what the
/// meta leader committed while it was away, before it serves clients.
const START_CATCH_UP_FOR: Duration = Duration::from_secs(30);

/// How long a starting node waits to see any other node up (their beats come
/// every 100 ms) before it takes itself for alone and serves without a meta
/// catch-up.
const PEER_GRACE: Duration = Duration::from_secs(1);

/// A running node.
pub struct Broker {
    config: Config,
    store: NodeStore,
    meta: Arc<MetaGroup>,
    meta_changed: watch::Sender<u64>,
    /// Bumped when a vhost or user is deleted (or a meta snapshot installed): open
    /// connections check theirs ([`Broker::subscribe_revocations`]).
    access_revoked: watch::Sender<u64>,
    /// The node's queues: handles, groups, placement, membership following.
    queues: Arc<Queues>,
    next_connection: AtomicU64,
    peers: Arc<Peers>,
    detector: Arc<Detector>,
    /// Memory and disk alarms (publishers blocked while raised).
    alarms: Arc<crate::alarms::Alarms>,
    /// Open client connections here and on the peers (connection limits).
    connections: Arc<crate::connections::Connections>,
    /// This node's live connections, channels and consumers (management API).
    tracking: Arc<crate::tracking::Tracking>,
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
        if config.wal_segment_bytes < crate::config::MIN_WAL_SEGMENT_BYTES {
            return Err(NodeError::Config(format!(
                "wal_segment_bytes {} is below the minimum of {} bytes",
                config.wal_segment_bytes,
                crate::config::MIN_WAL_SEGMENT_BYTES
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
                segment_bytes: config.wal_segment_bytes,
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
        let groups = Arc::new(GroupTable::default());
        consumers.set_remote(RemoteDeliveries::new(
            peers.clone(),
            detector.clone(),
            groups.clone(),
        ));

        let meta_changed = watch::Sender::new(0);
        let access_revoked = watch::Sender::new(0);
        let sm = store.state_machine::<TypeConfig, MetaHost>(
            META_GROUP,
            MetaHost::new()
                .with_notifier(meta_changed.clone())
                .with_revocation_notifier(access_revoked.clone()),
        )?;
        let meta_host = sm.machine();
        let log = store.log_store::<TypeConfig>(META_GROUP)?;
        let meta_hints = Arc::new(crate::cluster::commit_hints::CommitHints::default());
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
                seed: None,
                hints: Some(meta_hints.clone()),
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
            seen_calls: Default::default(),
            queues: Default::default(),
            meta_hints: meta_hints.clone(),
        };
        let meta = Arc::new(MetaGroup::new(
            me,
            meta_raft,
            meta_host,
            forwarder.clone(),
            meta_hints.clone(),
        ));
        let queues = Queues::new(QueuesParts {
            origin,
            bodies_root: dir.join("bodies"),
            snapshot_interval: config.snapshot_interval,
            store: store.clone(),
            meta: meta.clone(),
            consumers,
            peers: peers.clone(),
            groups,
            detector: detector.clone(),
            forwarder,
        });
        let _ = services.queues.set(Arc::downgrade(&queues));
        let broker = Arc::new(Broker {
            config,
            store,
            meta,
            meta_changed,
            access_revoked,
            queues,
            next_connection: AtomicU64::new(first_connection_id(me, epoch)),
            peers,
            detector,
            alarms,
            connections,
            tracking: crate::tracking::Tracking::new(),
        });
        Ok((broker, services))
    }

    /// While this node's memory alarm is raised, the groups' log read caches (up to 8 MiB
    /// each, trimmed otherwise only when the group appends) keep nothing already written:
    /// dropped at once and again every [`SHRINK_EVERY`], then back to their budget when the
    /// alarm clears. A node drained of a flood into many queues kept them in memory and its
    /// alarm never cleared.
    fn spawn_log_cache_shrinker(self: &Arc<Self>) {
        let me = Arc::downgrade(self);
        let mut alarms = self.alarms.subscribe();
        tokio::spawn(async move {
            let mut shrunk = false;
            loop {
                let Some(node) = me.upgrade() else { return };
                let pressure = node.alarms.local().memory;
                if pressure {
                    let dropped = node.store.set_log_cache_budget(Some(0));
                    if dropped > 0 {
                        tracing::debug!(dropped, "memory alarm: log read caches dropped");
                    }
                } else if shrunk {
                    node.store.set_log_cache_budget(None);
                }
                shrunk = pressure;
                drop(node);
                if pressure {
                    tokio::time::sleep(SHRINK_EVERY).await;
                } else if alarms.changed().await.is_err() {
                    return;
                }
            }
        });
    }

    /// Starts the failure detector, elections and the topology reconciler,
    /// and waits (up to 30 s) for a meta leader; a single node elects itself
    /// at once. Call once the cluster listener serves [`Broker::open`]'s
    /// services.
    pub async fn start(self: &Arc<Self>) -> Result<(), NodeError> {
        self.join_if_needed().await?;
        self.alarms.spawn_monitor(self.config.data_dir.clone());
        self.spawn_log_cache_shrinker();
        self.detector.spawn();
        elections::spawn(
            self.node_id(),
            Arc::downgrade(self.queues.groups()),
            self.detector.clone(),
            self.peers.clone(),
        );
        let single = self.peers.others().is_empty();
        if single && self.meta.raft().current_leader().await != Some(self.node_id()) {
            // A single voter would wait a whole election timeout.
            let _ = self.meta.raft().trigger().elect().await;
        }
        let waited = self
            .meta
            .raft()
            .wait(Some(Duration::from_secs(if single { 30 } else { 10 })))
            .metrics(|m| m.current_leader.is_some(), "meta leader elected")
            .await;
        if waited.is_err() {
            tracing::warn!("no meta leader yet (waiting for a majority of the cluster's nodes); serving anyway");
        } else {
            // A node back from a stop must not serve what it missed as absent
            // (a publish to a queue declared meanwhile confirmed as unroutable).
            // Alone (the others still down: a whole-cluster restart, one node
            // at a time) there is nobody to catch up with.
            if !single && !self.sees_a_peer(PEER_GRACE).await {
                tracing::warn!(
                    "no other node seen up in {PEER_GRACE:?}: serving without a meta catch-up"
                );
            } else if !self.meta.catch_up_within(START_CATCH_UP_FOR).await {
                tracing::warn!("meta replica not caught up with the leader in {START_CATCH_UP_FOR:?}; serving anyway");
            }
        }
        self.queues.drop_own_local_queues().await;
        self.reconcile().await;
        tokio::spawn(reconciler(Arc::downgrade(self)));
        tokio::spawn(crate::liveness::run(Arc::downgrade(&self.queues)));
        tokio::spawn(crate::transient_queues::run(Arc::downgrade(&self.queues)));
        tokio::spawn(membership_watch(Arc::downgrade(self)));
        if let Some(old) = self.config.replaces {
            tokio::spawn(crate::cluster::membership::replace(
                Arc::downgrade(&self.queues),
                old,
            ));
        }
        Ok(())
    }

    /// Waits up to `grace` for the failure detector to see another node up.
    async fn sees_a_peer(&self, grace: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + grace;
        loop {
            if self
                .peers
                .others()
                .iter()
                .any(|n| self.detector.is_alive(*n))
            {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
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
    /// for a new quorum queue ([`Queues::place`]), and the vhost's default queue type
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
            self.queues.place(&arguments)
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

    /// This node's live connections, channels and consumers (management API).
    pub fn tracking(&self) -> &Arc<crate::tracking::Tracking> {
        &self.tracking
    }

    /// Connection counts of this node and its peers (connection limits).
    pub fn connections(&self) -> &Arc<crate::connections::Connections> {
        &self.connections
    }

    /// The node-level failure detector.
    pub fn detector(&self) -> &Arc<Detector> {
        &self.detector
    }

    /// The meta group's Raft handle (cluster membership, topology).
    pub fn meta_raft(&self) -> &Raft {
        self.meta.raft()
    }

    /// The cluster's nodes and their gRPC channels.
    pub fn peers(&self) -> &Arc<Peers> {
        &self.peers
    }

    /// The node's configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The consumer table.
    pub fn consumers(&self) -> &Arc<ConsumerRegistry> {
        self.queues.consumers()
    }

    /// The node's queues (handles, groups, placement, membership following).
    pub fn queues(&self) -> &Arc<Queues> {
        &self.queues
    }

    /// A fresh connection id, unique cluster-wide and across boots
    /// ([`first_connection_id`]).
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
        self.meta.with_topology(f)
    }

    /// `find` on the local replica's topology, again after a meta catch-up
    /// when it finds nothing ([`MetaGroup::find`]): an object created through
    /// another node a moment ago is found, as an AMQP lookup finds it.
    pub async fn find_in_topology<R>(
        &self,
        find: impl Fn(&crate::meta::Topology) -> Option<R>,
    ) -> Option<R> {
        self.meta.find(find).await
    }

    /// Proposes a topology change to the meta group ([`MetaGroup::write`]):
    /// on this node when it leads, else forwarded to the leader; returns once
    /// the local replica applied it too (so this node's routing sees its own
    /// writes).
    ///
    /// Errors: 541 INTERNAL_ERROR when no meta leader answered in 30 s.
    pub async fn meta_write(&self, cmd: MetaCommand) -> Result<MetaReply, ProtocolError> {
        self.meta.write(cmd).await
    }

    /// Signals a topology change or a queue regaining room, so held
    /// dead letters are retried at once (not after the fallback timer).
    pub fn topology_changed(&self) {
        self.queues.topology_changed()
    }

    /// Subscribes to revocations: the value moves each time this node's meta replica
    /// deletes a vhost or a user, or installs a meta snapshot.
    pub fn subscribe_revocations(&self) -> watch::Receiver<u64> {
        self.access_revoked.subscribe()
    }

    /// Subscribes to [`Broker::topology_changed`] signals.
    pub fn subscribe_events(&self) -> watch::Receiver<u64> {
        self.queues.subscribe_events()
    }

    /// The record and handle of queue `name`.
    pub fn queue(&self, vhost: &str, name: &str) -> Option<(QueueRecord, Arc<QueueHandle>)> {
        self.queues.queue(vhost, name)
    }

    /// Handle by group id.
    pub fn queue_by_group(&self, group: u64) -> Option<Arc<QueueHandle>> {
        self.queues.queue_by_group(group)
    }

    /// All queue handles on this node.
    pub fn queue_handles(&self) -> Vec<Arc<QueueHandle>> {
        self.queues.queue_handles()
    }

    /// Routes a publish that arrived at meta catch-up stamp `arrived`
    /// ([`Broker::meta_stamp`]): target queue handles, in the topology's
    /// order, after a meta catch-up when nothing routes here
    /// ([`Queues::route`]).
    ///
    /// Errors: 404 NOT_FOUND for an unknown exchange.
    pub async fn route(
        &self,
        vhost: &str,
        exchange: &str,
        routing_keys: &[String],
        headers: Option<&FieldTable>,
        arrived: u64,
    ) -> Result<Vec<Arc<QueueHandle>>, ProtocolError> {
        self.queues
            .route(vhost, exchange, routing_keys, headers, arrived)
            .await
    }

    /// The meta catch-up stamp of a request that has arrived by now
    /// ([`crate::cluster::catch_up::CatchUp::stamp`]).
    pub fn meta_stamp(&self) -> u64 {
        self.meta.catch_up_stamp()
    }

    /// The record of queue `name` for a client that may have declared it
    /// through another node ([`Queues::find_record`]).
    pub async fn find_record(&self, vhost: &str, name: &str) -> Option<QueueRecord> {
        self.queues.find_record(vhost, name).await
    }

    /// The record and handle of queue `name` for a client that may have
    /// declared it through another node ([`Queues::find_queue`]).
    pub async fn find_queue(
        &self,
        vhost: &str,
        name: &str,
    ) -> Option<(QueueRecord, Arc<QueueHandle>)> {
        self.queues.find_queue(vhost, name).await
    }

    /// Effective configuration of a queue (arguments + policy).
    pub fn effective_config(&self, vhost: &str, name: &str) -> QueueConfig {
        self.queues.effective_config(vhost, name)
    }

    /// The reference to a declared queue ([`Queues::ensure_queue`]).
    pub async fn ensure_queue(
        self: &Arc<Self>,
        rec: &QueueRecord,
    ) -> Result<Arc<QueueHandle>, ProtocolError> {
        self.queues.ensure_queue(rec).await
    }

    /// Deletes a queue: the meta record, then the group and its storage
    /// (other nodes drop theirs when they apply the deletion).
    pub async fn delete_queue(
        &self,
        vhost: &str,
        name: &str,
    ) -> Result<Option<QueueRecord>, ProtocolError> {
        self.queues.delete_queue(vhost, name).await
    }

    /// Deletes an auto-delete queue once its last consumer is gone.
    pub async fn maybe_auto_delete(&self, handle: &Arc<QueueHandle>) {
        self.queues.maybe_auto_delete(handle).await
    }

    /// Brings the node in line with the topology: fixes the cluster id,
    /// then every queue ([`Queues::reconcile`]).
    async fn reconcile(&self) {
        let cluster_id = self.with_topology(|t| t.cluster_id()).unwrap_or_default();
        self.adopt_cluster_id(cluster_id).await;
        // A full pass covers whatever changed before it.
        let _ = self.meta.take_queue_changes();
        self.queues.reconcile().await;
    }

    /// [`Broker::reconcile`] after meta changes: only the queues they
    /// changed ([`Queues::reconcile_queues`]), or all after a snapshot.
    async fn reconcile_changed(&self) {
        let cluster_id = self.with_topology(|t| t.cluster_id()).unwrap_or_default();
        self.adopt_cluster_id(cluster_id).await;
        let changes = self.meta.take_queue_changes();
        if changes.full {
            self.queues.reconcile().await;
        } else if !changes.queues.is_empty() {
            self.queues.reconcile_queues(&changes.queues).await;
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
            .meta
            .raft()
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

    /// Takes the cluster id `in_meta` of the topology (0: none yet; the
    /// meta leader sets one), unless this node's data belongs to another.
    async fn adopt_cluster_id(&self, in_meta: u64) {
        if in_meta == 0 {
            if self.meta.raft().metrics().borrow().current_leader == Some(self.node_id()) {
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
    /// then the policies' effect on this node's queues ([`Queues::refresh_configs`]).
    ///
    /// Errors: the change's AMQP error (its code and RabbitMQ's text), or 541 when no meta
    /// leader answered.
    pub async fn operator_write(&self, cmd: MetaCommand) -> Result<MetaReply, ProtocolError> {
        match self.meta_write(cmd).await? {
            MetaReply::Error(e) => Err(e.into()),
            reply => {
                self.queues.refresh_configs().await;
                Ok(reply)
            }
        }
    }

    /// The cluster as this node sees it (nodes, liveness, meta leader).
    pub fn cluster_status(&self) -> ClusterStatus {
        status::cluster_status(&self.peers, self.meta.raft(), &self.detector)
    }

    /// Placement (leader, members, online members) and counts of a queue.
    pub async fn queue_status(&self, rec: &QueueRecord) -> QueueStatus {
        self.queues.queue_status(rec).await
    }

    /// Quorum queues this node leads, and quorum queue replicas it holds
    /// (counts; `quorumqctl status` and `cluster_status`).
    pub fn leaders_and_replicas(&self) -> (u64, u64) {
        self.queues.leaders_and_replicas()
    }

    /// Why this node does not serve clients now (None: it does): stopping,
    /// draining, or no meta leader known (no quorum reachable, or not yet
    /// joined). The readiness probe (`crate::http`).
    pub fn not_serving(&self) -> Option<&'static str> {
        if self.is_stopping() {
            Some("stopping")
        } else if self.detector.is_draining() {
            Some("draining")
        } else if self.meta.raft().metrics().borrow().current_leader.is_none() {
            Some("no meta leader (no quorum reachable, or not joined yet)")
        } else {
            None
        }
    }

    /// True once shutdown began.
    pub fn is_stopping(&self) -> bool {
        self.queues.is_stopping()
    }

    /// Graceful stop: Raft groups shut down, storage flushed.
    pub async fn shutdown(&self) {
        self.queues.shutdown().await;
        let _ = self.meta.raft().shutdown().await;
        if let Err(e) = self.store.flush().await {
            tracing::warn!(error = %e, "final flush failed");
        }
    }
}

/// Re-reconciles the queues each meta change touched after it, and every
/// queue every 10 s (retrying a replica that failed to open).
async fn reconciler(broker: std::sync::Weak<Broker>) {
    let Some(mut changed) = broker.upgrade().map(|b| b.meta_changed.subscribe()) else {
        return;
    };
    let every = Duration::from_secs(10);
    let mut last_full = tokio::time::Instant::now();
    loop {
        tokio::select! {
            r = changed.changed() => if r.is_err() { return },
            _ = tokio::time::sleep(every) => {}
        };
        // A full pass at least every 10 s, also while changes keep coming.
        let full = last_full.elapsed() >= every;
        if full {
            last_full = tokio::time::Instant::now();
        }
        let Some(b) = broker.upgrade() else { return };
        if b.is_stopping() {
            return;
        }
        if full {
            b.reconcile().await;
        } else {
            b.reconcile_changed().await;
        }
    }
}

/// Learns node addresses from the meta membership (nodes admitted by
/// `--join` carry theirs) and remembers every known peer address in sled,
/// so a restarted node finds its peers by itself.
async fn membership_watch(broker: std::sync::Weak<Broker>) {
    let Some(mut metrics) = broker.upgrade().map(|b| b.meta.raft().metrics()) else {
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

/// The first connection id of node `node` in boot `epoch`: the node's low 16
/// bits, then the epoch's low 16 bits, then a 32-bit count from 1. Ids are
/// unique cluster-wide and across boots, because the meta group records an
/// exclusive queue's owner by connection id: with a count from 1 on every
/// node, closing connection 1 on node 2 deleted node 1's exclusive queues of
/// its connection 1, and node 2's connection 1 passed their exclusive-access
/// checks. (Node ids 65,536 apart would share ids: node ids are small.)
fn first_connection_id(node: u64, epoch: u32) -> u64 {
    ((node & 0xFFFF) << 48) | (u64::from(epoch & 0xFFFF) << 32) | 1
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
