//! The composition root of a node: storage, the meta group, queue groups,
//! the consumer table, and the lookups the AMQP front end calls.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use amq_protocol::types::FieldTable;
use openraft::BasicNode;
use raft_log::{NodeStore, StoreOptions};
use tokio::sync::watch;

use crate::amqp::error::ProtocolError;
use crate::cluster::network::Network;
use crate::cluster::raft_config;
use crate::cluster::types::{GroupCommand, GroupReply, Origin, Raft, TypeConfig, META_GROUP};
use crate::config::Config;
use crate::consumers::ConsumerRegistry;
use crate::meta::command::{MetaCommand, MetaReply};
use crate::meta::host::MetaHost;
use crate::meta::{QueueKind, QueueRecord};
use crate::queue::bodies::{MemBodies, SegmentBodies, MEMORY_BUDGET};
use crate::queue::handle::QueueHandle;
use crate::queue::host::{QueueContext, QueueHost};
use crate::queue::runtime;
use crate::queue::types::{QueueCommand, QueueConfig};
use crate::queue::QueueMachine;

/// sled page cache (bytes); sled holds only snapshots and node records.
const CACHE_BYTES: u64 = 16 * 1024 * 1024;

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
}

/// A running node.
pub struct Broker {
    config: Config,
    store: NodeStore,
    origin: Origin,
    meta_raft: Raft,
    meta: Arc<Mutex<MetaHost>>,
    queues: RwLock<HashMap<u64, Arc<QueueHandle>>>,
    consumers: Arc<ConsumerRegistry>,
    next_connection: AtomicU64,
    /// Serializes group creation and deletion.
    groups_lock: tokio::sync::Mutex<()>,
    /// Bumped on every event a held dead letter may be waiting for:
    /// exchange/binding/queue changes, a queue unblocking publishers.
    events: watch::Sender<u64>,
    stopping: AtomicBool,
}

impl Broker {
    /// Opens storage under `config.data_dir`, starts the meta group and
    /// every queue group found in the topology.
    pub async fn start(config: Config) -> Result<Arc<Broker>, NodeError> {
        let dir: PathBuf = config.data_dir.join(format!("node-{}", config.node_id));
        std::fs::create_dir_all(&dir)?;
        let store = NodeStore::open_with(
            &dir.join("raft"),
            StoreOptions {
                sled_cache_bytes: CACHE_BYTES,
                min_sync_interval: std::time::Duration::from_micros(config.sync_interval_us),
                ..StoreOptions::default()
            },
        )?;
        let epoch = next_epoch(store.db())?;
        let origin = Origin {
            node: config.node_id,
            epoch,
        };
        let consumers = ConsumerRegistry::new(config.node_id, epoch);
        let sm = store.state_machine::<TypeConfig, MetaHost>(META_GROUP, MetaHost::new())?;
        let meta = sm.machine();
        let log = store.log_store::<TypeConfig>(META_GROUP)?;
        let raft_cfg =
            Arc::new(raft_config(META_GROUP).map_err(|e| NodeError::Raft(e.to_string()))?);
        let meta_raft = Raft::new(
            config.node_id,
            raft_cfg,
            Network { group: META_GROUP },
            log,
            sm,
        )
        .await
        .map_err(|e| NodeError::Raft(e.to_string()))?;
        initialize_single(&meta_raft, config.node_id, &config.cluster_listen).await?;
        let broker = Arc::new(Broker {
            config,
            store,
            origin,
            meta_raft,
            meta,
            queues: RwLock::new(HashMap::new()),
            consumers,
            next_connection: AtomicU64::new(1),
            groups_lock: tokio::sync::Mutex::new(()),
            events: watch::Sender::new(0),
            stopping: AtomicBool::new(false),
        });
        broker.wait_leader(&broker.meta_raft).await?;
        broker.restore_queues().await?;
        Ok(broker)
    }

    /// This node's id.
    pub fn node_id(&self) -> u64 {
        self.config.node_id
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

    /// Reads the topology of the local replica.
    pub fn with_topology<R>(&self, f: impl FnOnce(&crate::meta::Topology) -> R) -> Option<R> {
        self.meta.lock().ok().map(|m| f(m.topology()))
    }

    async fn wait_leader(&self, raft: &Raft) -> Result<(), NodeError> {
        let id = self.config.node_id;
        // A restarted single-voter group would wait a whole election
        // timeout; ask for the election at once.
        if raft.current_leader().await != Some(id) {
            let _ = raft.trigger().elect().await;
        }
        raft.wait(Some(Duration::from_secs(30)))
            .metrics(|m| m.current_leader == Some(id), "leader elected")
            .await
            .map(|_| ())
            .map_err(|e| NodeError::Raft(e.to_string()))
    }

    /// Proposes a topology change to the meta group.
    pub async fn meta_write(&self, cmd: MetaCommand) -> Result<MetaReply, ProtocolError> {
        match self.meta_raft.client_write(GroupCommand::Meta(cmd)).await {
            Ok(resp) => match resp.data {
                GroupReply::Meta(r) => Ok(r),
                _ => Err(ProtocolError::internal("unexpected meta reply")),
            },
            Err(e) => Err(ProtocolError::internal(format!("meta group: {e}"))),
        }
    }

    /// Signals a topology change or a queue regaining room, so held
    /// dead letters are retried at once (not after the fallback timer).
    pub fn topology_changed(&self) {
        self.events.send_modify(|g| *g = g.wrapping_add(1));
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

    /// Opens the group of a declared queue if this node doesn't run it yet.
    pub async fn ensure_queue(
        self: &Arc<Self>,
        rec: &QueueRecord,
    ) -> Result<Arc<QueueHandle>, ProtocolError> {
        if let Some(h) = self.queue_by_group(rec.group_id) {
            return Ok(h);
        }
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
        self.topology_changed();
        Ok(handle)
    }

    async fn open_queue(
        self: &Arc<Self>,
        rec: &QueueRecord,
    ) -> Result<Arc<QueueHandle>, NodeError> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let ctx = Arc::new(QueueContext {
            group: rec.group_id,
            node: self.config.node_id,
            consumers: self.consumers.clone(),
            effects: tx,
            closed: AtomicBool::new(false),
        });

        let config = self.effective_config(&rec.vhost, &rec.name);
        let machine = QueueMachine::new(config.clone());
        let handle = match rec.kind {
            QueueKind::Quorum => {
                let bodies = SegmentBodies::open(&self.bodies_dir(rec.group_id), MEMORY_BUDGET)?;
                let host = QueueHost::new(machine, Box::new(bodies), ctx.clone());
                let sm = self
                    .store
                    .state_machine::<TypeConfig, QueueHost>(rec.group_id, host)?;
                let host = sm.machine();
                if let Ok(mut h) = host.lock() {
                    h.finish_open();
                }
                let log = self.store.log_store::<TypeConfig>(rec.group_id)?;

                let cfg = Arc::new(
                    raft_config(rec.group_id).map_err(|e| NodeError::Raft(e.to_string()))?,
                );
                let raft = Raft::new(
                    self.config.node_id,
                    cfg,
                    Network {
                        group: rec.group_id,
                    },
                    log,
                    sm,
                )
                .await
                .map_err(|e| NodeError::Raft(e.to_string()))?;
                initialize_single(&raft, self.config.node_id, &self.config.cluster_listen).await?;
                self.wait_leader(&raft).await?;
                let h = Arc::new(QueueHandle::raft(
                    rec.vhost.clone(),
                    rec.name.clone(),
                    raft,
                    host,
                    ctx,
                    self.origin,
                    self.store.flusher().busy_hint(),
                ));
                // Consumers of this node's earlier boots are gone (spec §2.3).
                let _ = h
                    .call(QueueCommand::NodeRestarted {
                        now_ms: crate::now_ms(),
                        node: self.config.node_id,
                        epoch: self.origin.epoch,
                    })
                    .await;
                // Adopt policy changes made while the queue was down.
                let _ = h
                    .call(QueueCommand::UpdateConfig {
                        now_ms: crate::now_ms(),
                        config,
                    })
                    .await;
                h
            }
            QueueKind::Local { .. } => {
                let host = QueueHost::new(machine, Box::new(MemBodies::default()), ctx.clone());
                Arc::new(QueueHandle::local(
                    rec.vhost.clone(),
                    rec.name.clone(),
                    Arc::new(Mutex::new(host)),
                    ctx,
                ))
            }
        };
        runtime::spawn(Arc::downgrade(self), handle.clone(), rx);
        Ok(handle)
    }

    /// Deletes a queue: the meta record, then the group and its storage.
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
            h.shutdown().await;
            if h.is_quorum() {
                if let Err(e) = self.store.drop_group(group) {
                    tracing::warn!(group, error = %e, "failed to drop group storage");
                }
                if let Err(e) = std::fs::remove_dir_all(self.bodies_dir(group)) {
                    tracing::warn!(group, error = %e, "failed to remove body segments");
                }
            }
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

    /// Opens every quorum queue of the topology; local queues of an earlier
    /// boot are gone with it (they are not durable), so their records go.
    async fn restore_queues(self: &Arc<Self>) -> Result<(), NodeError> {
        let records: Vec<QueueRecord> = self
            .with_topology(|t| t.queues().cloned().collect())
            .unwrap_or_default();
        for rec in records {
            match rec.kind {
                QueueKind::Quorum => {
                    if let Err(e) = self.ensure_queue(&rec).await {
                        tracing::error!(queue = %rec.name, error = ?e, "failed to open queue");
                    }
                }
                QueueKind::Local { .. } => {
                    let _ = self
                        .meta_write(MetaCommand::DeleteQueue {
                            vhost: rec.vhost.clone(),
                            name: rec.name.clone(),
                        })
                        .await;
                }
            }
        }
        Ok(())
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
    pub fn cluster_status(&self) -> crate::cluster::status::ClusterStatus {
        use crate::cluster::status::{ClusterStatus, NodeStatus};
        ClusterStatus {
            nodes: vec![NodeStatus {
                id: self.config.node_id,
                cluster_addr: self.config.advertised(),
                amqp_addr: self.config.amqp_advertised(),
                running: true,
            }],
            meta_leader: Some(self.config.node_id),
        }
    }

    /// Placement (leader, members, online members) and counts of a queue.
    pub async fn queue_status(&self, rec: &QueueRecord) -> crate::cluster::status::QueueStatus {
        let mut st = crate::cluster::status::QueueStatus::default();
        if let Some(h) = self.queue_by_group(rec.group_id) {
            if let Some((r, u, c, held)) = h.read(|host| {
                let m = host.machine();
                (m.ready_count(), m.unacked_count(), m.consumer_count(), m.held_count())
            }) {
                st.messages_ready = r;
                st.messages_unacknowledged = u;
                st.consumers = c;
                st.dead_letter_held = held;
            }
            st.leader = Some(self.config.node_id);
            st.members = vec![self.config.node_id];
            st.online = vec![self.config.node_id];
        }
        st
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

/// Initializes a fresh group with this node as its only voter; a group
/// that already has state keeps it.
async fn initialize_single(raft: &Raft, node: u64, addr: &str) -> Result<(), NodeError> {
    if raft
        .is_initialized()
        .await
        .map_err(|e| NodeError::Raft(e.to_string()))?
    {
        return Ok(());
    }
    let mut members = BTreeMap::new();
    members.insert(node, BasicNode::new(addr));
    match raft.initialize(members).await {
        Ok(()) => Ok(()),
        Err(openraft::error::RaftError::APIError(
            openraft::error::InitializeError::NotAllowed(_),
        )) => Ok(()),
        Err(e) => Err(NodeError::Raft(e.to_string())),
    }
}

/// Increments and persists the node's boot epoch.
fn next_epoch(db: &sled::Db) -> Result<u32, NodeError> {
    let prev = db
        .get("node/epoch")?
        .and_then(|v| <[u8; 4]>::try_from(v.as_ref()).ok())
        .map(u32::from_be_bytes)
        .unwrap_or(0);
    let epoch = prev.wrapping_add(1);
    db.insert("node/epoch", &epoch.to_be_bytes())?;
    db.flush()?;
    Ok(epoch)
}
