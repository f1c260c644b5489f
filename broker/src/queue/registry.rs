//! The queues of a node: the table of queue references, the Raft groups
//! behind them, their storage and the consumer table; opening, following
//! membership changes, reconciling with the topology, placing, routing and
//! deleting queues; the lookups the front ends call. The node (`crate::node`)
//! composes it.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};

use amq_protocol::types::FieldTable;
use futures::future::BoxFuture;
use raft_log::NodeStore;
use tokio::sync::watch;

use super::bodies::{MemBodies, SegmentBodies, MEMORY_BUDGET};
use super::handle::QueueHandle;
use super::host::{QueueContext, QueueHost};
use super::replica::QueueReplica;
use super::runtime;
use super::services::QueueServices;
use super::types::{QueueCommand, QueueConfig};
use super::QueueMachine;
use crate::amqp::error::ProtocolError;
use crate::cluster::detector::Detector;
use crate::cluster::forward::Forwarder;
use crate::cluster::groups::GroupTable;
use crate::cluster::meta_group::MetaGroup;
use crate::cluster::peers::Peers;
use crate::cluster::route::Route;
use crate::cluster::status::QueueStatus;
use crate::cluster::transport::Network;
use crate::cluster::types::{Origin, Raft, TypeConfig};
use crate::cluster::{bootstrap, placement, raft_config};
use crate::consumers::ConsumerRegistry;
use crate::error::NodeError;
use crate::meta::command::{MetaCommand, MetaReply};
use crate::meta::{QueueKind, QueueRecord, QueueType};

/// Which of `NodeRestarted` and `Configure` this node (`me`) proposes when it
/// opens its replica of a queue with `members`: both when the replica held
/// state here before (a restart: consumers of this node's earlier boots are
/// gone, spec §2.3, and policy changes made meanwhile apply). A replica new
/// here (`fresh`: no log, no vote) proposes no `NodeRestarted` (it never
/// held an entry, so consumers of an earlier boot of this node, only if the
/// group ran without it, are left to the leader's liveness pass, `NodeUp`
/// for records of an older epoch, `crate::liveness`), and `Configure` only
/// on the preferred leader (the first member): always for a group started
/// by election; for one seeded as new (`seeded`, `bootstrap::seed_new_group`)
/// only when the queue's effective `config` differs from the `initial` one
/// every replica starts from ([`initial_config`]: a policy applies), or has
/// an `x-expires` lease to start. Every member proposing both cost a new
/// queue six replicated entries (issue 31); a seeded queue without a policy
/// or lease costs none. Later policy changes send their own `Configure`
/// ([`Queues::refresh_configs`]).
fn replica_calls(
    fresh: bool,
    seeded: bool,
    config: &QueueConfig,
    initial: &QueueConfig,
    members: &[u64],
    me: u64,
) -> (bool, bool) {
    if !fresh {
        return (true, true);
    }
    let preferred = members.first() == Some(&me);
    let needed = !seeded || config != initial || config.expires_ms.is_some();
    (false, preferred && needed)
}

/// The configuration a replica of `rec` starts its state machine with, on
/// every node alike: its declare arguments alone (no policy). What policies
/// add comes through the log (`Configure`), so replaying the log from its
/// first entry gives the same state on any member, whenever it opened its
/// replica (a policy may have changed in between).
fn initial_config(rec: &QueueRecord) -> QueueConfig {
    crate::meta::effective::effective_config(&rec.vhost, &rec.name, &rec.arguments, None).0
}

/// A replica [`Queues::open_replica`] opened.
struct OpenedReplica {
    raft: Raft,
    host: Arc<Mutex<QueueHost>>,
    /// openraft restores the replica as leader from its vote
    /// ([`bootstrap::restores_as_leader`]).
    restored_leader: bool,
    /// The replica held nothing here ([`bootstrap::is_fresh`]).
    fresh: bool,
    /// It was seeded as a new group ([`bootstrap::seed_new_group`]): it has
    /// its leader, and needs no initialization.
    seeded: bool,
}

/// What [`Queues::new`] is made of: this node's shared plumbing.
pub struct QueuesParts {
    /// This node and its boot epoch (proposals are tagged with it).
    pub origin: Origin,
    /// Root of the body segment directories (`<data_dir>/node-<id>/bodies`).
    pub bodies_root: PathBuf,
    /// A queue group snapshots every this many log entries.
    pub snapshot_interval: u64,
    /// The node's storage (Raft logs, snapshots).
    pub store: NodeStore,
    /// The meta group (topology reads and writes).
    pub meta: Arc<MetaGroup>,
    /// The consumer table.
    pub consumers: Arc<ConsumerRegistry>,
    /// The cluster's nodes and their channels.
    pub peers: Arc<Peers>,
    /// The transport's table of groups served here.
    pub groups: Arc<GroupTable>,
    /// The node-level failure detector.
    pub detector: Arc<Detector>,
    /// Forwarding to group leaders on other nodes.
    pub forwarder: Arc<Forwarder>,
}

/// The queues of this node (see the module docs).
pub struct Queues {
    origin: Origin,
    bodies_root: PathBuf,
    snapshot_interval: u64,
    store: NodeStore,
    meta: Arc<MetaGroup>,
    handles: RwLock<HashMap<u64, Arc<QueueHandle>>>,
    consumers: Arc<ConsumerRegistry>,
    /// Serializes opening, membership changes and dropping, group by group.
    group_locks: super::group_locks::GroupLocks,
    /// Bumped on every event a held dead letter may be waiting for:
    /// exchange/binding/queue changes, a queue unblocking publishers.
    events: watch::Sender<u64>,
    stopping: AtomicBool,
    peers: Arc<Peers>,
    groups: Arc<GroupTable>,
    detector: Arc<Detector>,
    forwarder: Arc<Forwarder>,
    /// This table itself, for the tasks it starts from `&self`.
    weak_self: Weak<Queues>,
}

impl Queues {
    /// No queues yet: [`Queues::reconcile`] opens those of the topology.
    pub fn new(parts: QueuesParts) -> Arc<Queues> {
        Arc::new_cyclic(|weak_self| Queues {
            origin: parts.origin,
            bodies_root: parts.bodies_root,
            snapshot_interval: parts.snapshot_interval,
            store: parts.store,
            meta: parts.meta,
            handles: RwLock::new(HashMap::new()),
            consumers: parts.consumers,
            group_locks: Default::default(),
            events: watch::Sender::new(0),
            stopping: AtomicBool::new(false),
            peers: parts.peers,
            groups: parts.groups,
            detector: parts.detector,
            forwarder: parts.forwarder,
            weak_self: weak_self.clone(),
        })
    }

    /// This node's id.
    pub fn node_id(&self) -> u64 {
        self.origin.node
    }

    /// The meta group (topology reads, writes to its leader).
    pub fn meta(&self) -> &Arc<MetaGroup> {
        &self.meta
    }

    /// The node-level failure detector.
    pub fn detector(&self) -> &Arc<Detector> {
        &self.detector
    }

    /// The cluster's nodes and their gRPC channels.
    pub fn peers(&self) -> &Arc<Peers> {
        &self.peers
    }

    /// The transport's table of the groups served here.
    pub fn groups(&self) -> &Arc<GroupTable> {
        &self.groups
    }

    /// The consumer table.
    pub fn consumers(&self) -> &Arc<ConsumerRegistry> {
        &self.consumers
    }

    /// What the queue runtimes and dead-letter workers may call back.
    fn services(self: &Arc<Self>) -> Weak<dyn QueueServices> {
        let weak: Weak<Queues> = Arc::downgrade(self);
        weak
    }

    /// Signals a topology change or a queue regaining room, so held
    /// dead letters are retried at once (not after the fallback timer).
    pub fn topology_changed(&self) {
        self.events.send_modify(|g| *g = g.wrapping_add(1));
    }

    /// Subscribes to [`Queues::topology_changed`] signals.
    pub fn subscribe_events(&self) -> watch::Receiver<u64> {
        self.events.subscribe()
    }

    /// True once shutdown began.
    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    /// Stops every queue group (node stopping): later proposals fail.
    pub async fn shutdown(&self) {
        self.stopping.store(true, Ordering::Release);
        for h in self.queue_handles() {
            h.shutdown().await;
        }
    }

    /// The record and handle of queue `name`, as this node sees it now.
    pub fn queue(&self, vhost: &str, name: &str) -> Option<(QueueRecord, Arc<QueueHandle>)> {
        let rec = self
            .meta
            .with_topology(|t| t.queue(vhost, name).cloned())??;
        let handle = self.handles.read().ok()?.get(&rec.group_id).cloned()?;
        Some((rec, handle))
    }

    /// The record of queue `name` for a client that may have declared it
    /// through another node: a queue this node's replica does not know yet
    /// is looked up again after a meta catch-up ([`MetaGroup::find`]).
    /// None: no such queue (RabbitMQ: 404 NOT_FOUND).
    pub async fn find_record(&self, vhost: &str, name: &str) -> Option<QueueRecord> {
        self.meta.find(|t| t.queue(vhost, name).cloned()).await
    }

    /// The record and handle of queue `name` for a client that may have
    /// declared it through another node ([`Queues::find_record`]); a handle
    /// the reconciler has not opened yet is opened now
    /// ([`Queues::ensure_queue`]). None: no such queue.
    pub async fn find_queue(
        self: &Arc<Self>,
        vhost: &str,
        name: &str,
    ) -> Option<(QueueRecord, Arc<QueueHandle>)> {
        if let Some(found) = self.queue(vhost, name) {
            return Some(found);
        }
        let rec = self.find_record(vhost, name).await?;
        let handle = self.ensure_queue(&rec).await.ok()?;
        Some((rec, handle))
    }

    /// Handle by group id.
    pub fn queue_by_group(&self, group: u64) -> Option<Arc<QueueHandle>> {
        self.handles.read().ok()?.get(&group).cloned()
    }

    /// All queue handles on this node.
    pub fn queue_handles(&self) -> Vec<Arc<QueueHandle>> {
        self.handles
            .read()
            .map(|q| q.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Routes a publish that arrived at meta catch-up stamp `arrived`
    /// ([`MetaGroup::catch_up_stamp`]): target queue handles, in the
    /// topology's order.
    ///
    /// The publisher may have declared its queue, exchange or binding through
    /// another node: when nothing routes or the exchange is unknown here, the
    /// meta replica catches up ([`MetaGroup::catch_up`]) and the publish is
    /// routed again; a routed queue whose handle the reconciler has not
    /// opened yet is opened now. Otherwise a publish confirmed as unroutable
    /// would be a confirmed message dropped.
    ///
    /// Errors: 404 NOT_FOUND for an unknown exchange (after the catch-up).
    pub async fn route(
        self: &Arc<Self>,
        vhost: &str,
        exchange: &str,
        routing_keys: &[String],
        headers: Option<&FieldTable>,
        arrived: u64,
    ) -> Result<Vec<Arc<QueueHandle>>, ProtocolError> {
        let mut routed = self.route_here(vhost, exchange, routing_keys, headers);
        let miss = match &routed {
            Ok((open, unopened)) => open.is_empty() && unopened.is_empty(),
            Err(ProtocolError::Channel { code, .. }) => *code == 404,
            Err(_) => false,
        };
        if miss && self.meta.catch_up(arrived).await {
            routed = self.route_here(vhost, exchange, routing_keys, headers);
        }
        let (mut handles, unopened) = routed?;
        for rec in self.records(vhost, unopened) {
            if let Ok(h) = self.ensure_queue(&rec).await {
                handles.push(h);
            }
        }
        Ok(handles)
    }

    /// Opens this node's handles of `records` (dead-letter targets not
    /// opened yet); true when any opened. Each open signals a topology
    /// change, which retries held dead letters.
    async fn open_records(self: Arc<Self>, records: Vec<QueueRecord>) -> bool {
        let mut any = false;
        for rec in records {
            match self.ensure_queue(&rec).await {
                Ok(_) => any = true,
                Err(e) => {
                    tracing::warn!(queue = %rec.name, error = ?e, "dead-letter target not opened")
                }
            }
        }
        any
    }

    /// The records of queues `names` of `vhost` (those still there).
    fn records(&self, vhost: &str, names: Vec<String>) -> Vec<QueueRecord> {
        if names.is_empty() {
            return Vec::new();
        }
        self.meta
            .with_topology(|t| {
                names
                    .iter()
                    .filter_map(|n| t.queue(vhost, n).cloned())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// [`Queues::route`] on this node's view as it is: the handles of the
    /// queues a publish routes to, in the topology's order, and the names
    /// of those whose handles the reconciler has not opened yet.
    fn route_here(
        &self,
        vhost: &str,
        exchange: &str,
        routing_keys: &[String],
        headers: Option<&FieldTable>,
    ) -> Result<(Vec<Arc<QueueHandle>>, Vec<String>), ProtocolError> {
        let targets = self
            .meta
            .with_topology(|topo| {
                let names = topo.route(vhost, exchange, routing_keys, headers)?;
                Ok::<_, ProtocolError>(
                    names
                        .into_iter()
                        .filter_map(|n| topo.queue(vhost, &n).map(|r| (r.group_id, n)))
                        .collect::<Vec<(u64, String)>>(),
                )
            })
            .ok_or_else(|| ProtocolError::internal("meta lock poisoned"))??;
        let queues = self
            .handles
            .read()
            .map_err(|_| ProtocolError::internal("queue table poisoned"))?;
        let mut open = Vec::with_capacity(targets.len());
        let mut unopened = Vec::new();
        for (group, name) in targets {
            match queues.get(&group) {
                Some(h) => open.push(h.clone()),
                None => unopened.push(name),
            }
        }
        Ok((open, unopened))
    }

    /// Effective configuration of a queue (arguments + policy).
    pub fn effective_config(&self, vhost: &str, name: &str) -> QueueConfig {
        self.meta
            .with_topology(|t| t.effective_config(vhost, name))
            .flatten()
            .map(|(c, warnings, _)| {
                for w in warnings {
                    tracing::warn!(queue = name, "{w}");
                }
                c
            })
            .unwrap_or_default()
    }

    /// Replica placement of a new quorum queue declared on this node
    /// ([`placement::place`]): `x-quorum-initial-group-size` nodes, this
    /// node first.
    pub fn place(&self, arguments: &FieldTable) -> Vec<u64> {
        placement::place(
            self.node_id(),
            arguments,
            &self.peers,
            &self.detector,
            &self.meta,
        )
    }

    /// The reference to a declared queue, opening this node's replica of it
    /// (a member) or a forwarding reference (not a member) if there is none
    /// yet. Waits for neither the group's initialization nor its leader
    /// ([`bootstrap::start_member`]): commands sent to the queue wait for
    /// the leader in its proposer. The reconciler opens the replicas of a
    /// member the same way, one after another (waiting for each group's
    /// leader made a member that fell behind fall further behind, issue 31).
    pub async fn ensure_queue(
        self: &Arc<Self>,
        rec: &QueueRecord,
    ) -> Result<Arc<QueueHandle>, ProtocolError> {
        if let Some(h) = self.queue_by_group(rec.group_id) {
            return Ok(h);
        }
        let handle = {
            let _guard = self.group_locks.lock(rec.group_id).await;
            if let Some(h) = self.queue_by_group(rec.group_id) {
                return Ok(h);
            }
            let handle = self
                .open_queue(rec)
                .await
                .map_err(ProtocolError::internal)?;
            if let Ok(mut q) = self.handles.write() {
                q.insert(rec.group_id, handle.clone());
            }
            handle
        };
        self.topology_changed();
        Ok(handle)
    }

    /// The shared context of queue `rec` on this node, and the receiver of
    /// its leader effects (for its runtime).
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
            node: self.origin.node,
            consumers: self.consumers.clone(),
            effects: tx,
            closed: AtomicBool::new(false),
            closing: tokio::sync::Notify::new(),
            live: AtomicBool::new(false),
            early: Default::default(),
        });
        (ctx, rx)
    }

    /// Directory of a quorum queue's body segments.
    fn bodies_dir(&self, group: u64) -> PathBuf {
        self.bodies_root.join(group.to_string())
    }

    /// Opens this node's replica of quorum queue group `group`: body store,
    /// log, state machine and Raft, and registers it with the transport. A
    /// new replica of a group created just now with `newborn` members is
    /// seeded with its preferred leader's first term
    /// ([`bootstrap::seed_new_group`]); others are not initialized (see the
    /// callers).
    ///
    /// Errors: storage cannot be opened; openraft refuses the config.
    async fn open_replica(
        &self,
        group: u64,
        ctx: &Arc<QueueContext>,
        config: QueueConfig,
        newborn: Option<&[u64]>,
    ) -> Result<OpenedReplica, NodeError> {
        let me = self.origin.node;
        let machine = QueueMachine::new(config);
        let bodies = SegmentBodies::open(&self.bodies_dir(group), MEMORY_BUDGET)?;
        let host = QueueHost::new(machine, Box::new(bodies), ctx.clone());
        // The leader syncs its log while it replicates (raft_log::durable).
        let mut log = self
            .store
            .log_store::<TypeConfig>(group)?
            .ack_own_entries(me);
        let restored_leader = bootstrap::restores_as_leader(&mut log, me).await;
        let fresh = bootstrap::is_fresh(&mut log).await;
        // Nothing waits for the seed's sync here: the replica sends and
        // answers nothing before it (`seed_sync`).
        let (seeded, seed_sync) = match newborn {
            Some(members) if fresh => (
                true,
                Some(Arc::new(bootstrap::seed_new_group(&mut log, members)?)),
            ),
            _ => (false, None),
        };
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
            raft_config(group, self.snapshot_interval)
                .map_err(|e| NodeError::Raft(e.to_string()))?,
        );
        // Ticks stay off in queue groups: their tick task sleeps (issue 31).
        let raft = crate::cluster::quiet_runtime::quiescent(Raft::new(
            me,
            cfg,
            Network {
                group,
                peers: self.peers.clone(),
                groups: self.groups.clone(),
                durable: Some(durable),
                detector: self.detector.clone(),
                seed: seed_sync.clone(),
                hints: None,
            },
            log,
            sm,
        ))
        .await
        .map_err(|e| NodeError::Raft(e.to_string()))?;
        self.groups.insert(
            group,
            Arc::new(QueueReplica {
                raft: raft.clone(),
                host: host.clone(),
                seed_sync,
            }),
        );
        Ok(OpenedReplica {
            raft,
            host,
            restored_leader,
            fresh,
            seeded,
        })
    }

    /// Opens this node's queue for `rec`: its replica (a member of a quorum
    /// queue, bootstrapped by [`bootstrap`]), a forwarding reference (not a
    /// member), or a local queue; starts its runtime.
    ///
    /// Errors: the replica's storage or Raft cannot be opened.
    async fn open_queue(
        self: &Arc<Self>,
        rec: &QueueRecord,
    ) -> Result<Arc<QueueHandle>, NodeError> {
        let me = self.origin.node;
        let (ctx, rx) = self.context(rec);
        let config = self.effective_config(&rec.vhost, &rec.name);
        let max_priority = config.max_priority;
        // Taken by every node (members or not), so the table keeps nothing.
        let newborn = self
            .meta
            .take_newborn(rec.group_id)
            .filter(|first| *first == rec.members);
        // Declared classic, or local (untyped non-durable/exclusive/auto-delete).
        let classic = QueueType::of_args(&rec.arguments) != QueueType::Quorum;
        let declared_quorum = crate::meta::queue_args::declared_quorum(&rec.arguments);
        // No replica here: a forwarding handle, nothing to run but its
        // proposer. For a quorum queue the members' leader answers (the
        // runtime starts if this node becomes a member); for another node's
        // local queue its home node does, from its handle (`cluster::server`).
        let forward_to = match rec.kind {
            QueueKind::Quorum if !rec.members.contains(&me) => Some((rec.members.clone(), false)),
            QueueKind::Local { node } if node != me => Some((vec![node], true)),
            _ => None,
        };
        if let Some((members, elsewhere)) = forward_to {
            let route = Route::new(rec.group_id, None, members, self.forwarder.clone());
            let h =
                QueueHandle::remote(rec.vhost.clone(), rec.name.clone(), ctx, route, self.origin)
                    .classic(classic)
                    .declared_quorum(declared_quorum)
                    .max_priority(max_priority);
            let h = if elsewhere { h.local_elsewhere() } else { h };
            return Ok(Arc::new(h.with_idle_effects(rx)));
        }
        let handle = match rec.kind {
            QueueKind::Quorum => {
                let initial = initial_config(rec);
                let OpenedReplica {
                    raft,
                    host,
                    restored_leader,
                    fresh,
                    seeded,
                } = self
                    .open_replica(rec.group_id, &ctx, initial.clone(), newborn.as_deref())
                    .await?;
                ctx.live.store(true, Ordering::Release);
                // A seeded group has its leader already. Otherwise the preferred
                // leader and a sole member initialize at once, the others after a
                // grace; the preferred leader of a new group then campaigns until a
                // leader is known (see `bootstrap`). Nothing here waits for either.
                if !seeded {
                    bootstrap::start_member(&raft, &rec.members, me, fresh);
                }
                if restored_leader {
                    tokio::spawn(bootstrap::mark_restored_leadership(
                        raft.clone(),
                        self.origin,
                        rec.name.clone(),
                    ));
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
                    .declared_quorum(declared_quorum)
                    .max_priority(max_priority),
                );
                // Consumers of this node's earlier boots are gone (spec §2.3),
                // and policy changes made while the queue was down apply. A
                // replica new here (see `replica_calls`) sends only what a new
                // queue needs.
                let (restarted, configure) =
                    replica_calls(fresh, seeded, &config, &initial, &rec.members, me);
                let h2 = h.clone();
                let epoch = self.origin.epoch;
                tokio::spawn(async move {
                    if restarted {
                        let _ = h2
                            .call(QueueCommand::NodeRestarted {
                                now_ms: crate::now_ms(),
                                node: me,
                                epoch,
                            })
                            .await;
                    }
                    if configure {
                        let _ = h2
                            .call(QueueCommand::Configure {
                                now_ms: crate::now_ms(),
                                config,
                            })
                            .await;
                    }
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
                    .declared_quorum(declared_quorum)
                    .max_priority(max_priority),
                )
            }
        };
        runtime::spawn(self.services(), handle.clone(), rx);
        Ok(handle)
    }

    /// Brings this node's replica of `rec` in line with its member list
    /// (`add_member` / `delete_member` changed it): a new member opens an
    /// empty replica, which the leader then fills (as a learner, then a
    /// voter); a removed one shuts its replica down and deletes its
    /// storage. Channels keep the queue's handle either way: its commands
    /// are forwarded once no replica is here.
    pub async fn follow_membership(self: &Arc<Self>, rec: &QueueRecord, h: &Arc<QueueHandle>) {
        let me = self.node_id();
        let member = rec.members.contains(&me);
        if member == h.has_replica() {
            return;
        }
        let _guard = self.group_locks.lock(rec.group_id).await;
        if member == h.has_replica() || self.queue_by_group(rec.group_id).is_none() {
            return;
        }
        if member {
            match self
                .open_replica(rec.group_id, h.context(), initial_config(rec), None)
                .await
            {
                Ok(OpenedReplica { raft, host, .. }) => {
                    h.context().live.store(true, Ordering::Release);
                    h.set_replica(Some((raft, host)));
                    if let Some(rx) = h.take_idle_effects() {
                        runtime::spawn(self.services(), h.clone(), rx);
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
            .meta
            .write(MetaCommand::DeleteQueue {
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

    /// Shuts down and forgets this node's group `group` (its consumers,
    /// transport registration, and a replica's storage).
    async fn drop_queue_group(&self, group: u64) {
        let _guard = self.group_locks.lock(group).await;
        let handle = self.handles.write().ok().and_then(|mut q| q.remove(&group));
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
        // A queue that never spilled a body has no directory.
        match std::fs::remove_dir_all(self.bodies_dir(group)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                tracing::warn!(group, error = %e, "failed to remove body segments")
            }
            _ => {}
        }
    }

    /// Deletes an auto-delete queue once its last consumer is gone.
    pub async fn maybe_auto_delete(&self, handle: &Arc<QueueHandle>) {
        let auto = self
            .meta
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
    pub async fn drop_own_local_queues(&self) {
        let me = self.node_id();
        let stale: Vec<QueueRecord> = self
            .meta
            .with_topology(|t| {
                t.queues()
                    .filter(|q| matches!(q.kind, QueueKind::Local { node } if node == me))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        for rec in stale {
            let _ = self
                .meta
                .write(MetaCommand::DeleteQueue {
                    vhost: rec.vhost.clone(),
                    name: rec.name.clone(),
                })
                .await;
        }
    }

    /// Brings the node's queues in line with the topology: opens replicas
    /// and references for new quorum queues (a node that was down creates
    /// its replicas now), drops those of deleted queues, updates member
    /// lists (the node fixes the cluster id first). Visits every queue, but
    /// clones only the records that need work (at 10,000 queues this runs
    /// every 10 s, [`Queues::reconcile_queues`] after each meta change).
    pub async fn reconcile(self: &Arc<Self>) {
        let me = self.node_id();
        let handles: HashMap<u64, Arc<QueueHandle>> =
            self.handles.read().map(|q| q.clone()).unwrap_or_default();
        let records: Vec<QueueRecord> = self
            .meta
            .with_topology(|t| {
                t.queues()
                    .filter(|q| {
                        (q.kind == QueueKind::Quorum || q.kind == QueueKind::Local { node: me })
                            && needs_work(q, handles.get(&q.group_id), me)
                    })
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        for rec in &records {
            self.reconcile_one(rec).await;
        }
        // Handles first, then the topology: a handle exists only after its
        // record was applied, so one whose record is missing from the
        // topology read afterwards was deleted (group ids are never reused).
        // Comparing with `records` instead would drop a queue declared while
        // this pass was opening others.
        let handles: Vec<u64> = self.queue_handles().iter().map(|h| h.group).collect();
        let Some(live) = self
            .meta
            .with_topology(|t| t.queues().map(|q| q.group_id).collect::<HashSet<u64>>())
        else {
            return;
        };
        let gone = handles.into_iter().filter(|g| !live.contains(g));
        for g in gone {
            self.drop_queue_group(g).await;
        }
    }

    /// [`Queues::reconcile`] for the queues named in `changed` only ((vhost,
    /// name, group id) of queues created, deleted or given new members since
    /// the last pass, `crate::meta::host::QueueChanges`): a declare costs the
    /// same whatever the number of queues (issue 31).
    pub async fn reconcile_queues(self: &Arc<Self>, changed: &[(String, String, u64)]) {
        let me = self.node_id();
        let mut seen = HashSet::new();
        for (vhost, name, group) in changed {
            if !seen.insert(*group) {
                continue;
            }
            let rec = self
                .meta
                .with_topology(|t| {
                    t.queue(vhost, name)
                        .filter(|r| r.group_id == *group)
                        .cloned()
                })
                .flatten();
            match rec {
                Some(rec)
                    if rec.kind == QueueKind::Quorum
                        || rec.kind == QueueKind::Local { node: me } =>
                {
                    self.reconcile_one(&rec).await
                }
                Some(_) => {}
                None => {
                    if self.queue_by_group(*group).is_some() {
                        self.drop_queue_group(*group).await;
                    }
                }
            }
        }
    }

    /// Brings this node's queue of `rec` (a quorum queue, or a local queue
    /// of this node) in line with it: opens it, or follows its members.
    async fn reconcile_one(self: &Arc<Self>, rec: &QueueRecord) {
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

    /// Applies changed policies: every queue whose effective configuration
    /// changed gets a `Configure` (spec §1.6).
    pub async fn refresh_configs(&self) {
        for h in self.queue_handles() {
            let config = self.effective_config(&h.vhost, &h.name);
            let current = h.read(|host| host.machine().config().clone());
            if current.as_ref() != Some(&config) {
                let _ = h
                    .call(QueueCommand::Configure {
                        now_ms: crate::now_ms(),
                        config,
                    })
                    .await;
            }
        }
        self.topology_changed();
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
}

/// True when this node's queue of `rec` (a quorum queue, or a local queue of
/// node `me`), `handle`, is not in line with it: missing (a quorum queue), a
/// replica where this node is no member or none where it is one, or other
/// members.
fn needs_work(rec: &QueueRecord, handle: Option<&Arc<QueueHandle>>, me: u64) -> bool {
    let Some(h) = handle else {
        return rec.kind == QueueKind::Quorum;
    };
    let members_differ = h.route().is_some_and(|r| r.members() != rec.members);
    let replica_differs =
        rec.kind == QueueKind::Quorum && rec.members.contains(&me) != h.has_replica();
    members_differ || replica_differs
}

impl QueueServices for Queues {
    fn route(
        &self,
        vhost: &str,
        exchange: &str,
        routing_keys: &[String],
        headers: Option<&FieldTable>,
    ) -> Result<Vec<Arc<QueueHandle>>, ProtocolError> {
        // Dead letters route on this node's view as it is: one that finds no
        // queue is held and retried when the topology changes. A target not
        // opened here yet (e.g. another node's classic queue) is opened in
        // the background and the dead letter held until it is (routing it to
        // the other targets alone would settle it without this one); the
        // open signals a topology change, which retries it.
        let (opened, unopened) = self.route_here(vhost, exchange, routing_keys, headers)?;
        if unopened.is_empty() {
            return Ok(opened);
        }
        let unopened = self.records(vhost, unopened);
        if let Some(queues) = self.weak_self.upgrade() {
            tokio::spawn(async move { queues.open_records(unopened).await });
        }
        Ok(Vec::new())
    }

    fn open_routed<'a>(
        &'a self,
        vhost: &'a str,
        exchange: &'a str,
        routing_keys: &'a [String],
        headers: Option<&'a FieldTable>,
    ) -> BoxFuture<'a, bool> {
        Box::pin(async move {
            let Ok((_, unopened)) = self.route_here(vhost, exchange, routing_keys, headers) else {
                return false;
            };
            let unopened = self.records(vhost, unopened);
            match self.weak_self.upgrade() {
                Some(queues) => queues.open_records(unopened).await,
                None => false,
            }
        })
    }

    fn events(&self) -> watch::Receiver<u64> {
        self.subscribe_events()
    }

    fn topology_changed(&self) {
        Queues::topology_changed(self)
    }

    fn delete_queue<'a>(
        &'a self,
        vhost: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<QueueRecord>, ProtocolError>> {
        Box::pin(Queues::delete_queue(self, vhost, name))
    }

    fn is_stopping(&self) -> bool {
        Queues::is_stopping(self)
    }
}

#[cfg(test)]
mod tests {
    use super::replica_calls;
    use crate::queue::types::QueueConfig;

    /// A new queue's replicas propose no `NodeRestarted` and at most one
    /// `Configure` (the preferred leader's); a reopened replica proposes
    /// both.
    #[test]
    fn only_a_new_queues_preferred_leader_configures_it() {
        let members = [2, 1, 3];
        let plain = QueueConfig::default();
        let calls = |fresh, me| replica_calls(fresh, false, &plain, &plain, &members, me);
        assert_eq!(calls(true, 2), (false, true));
        assert_eq!(calls(true, 1), (false, false));
        assert_eq!(calls(true, 3), (false, false));
        for me in members {
            assert_eq!(calls(false, me), (true, true));
        }
    }

    /// A seeded new queue needs a `Configure` only for what its arguments
    /// alone do not give every replica: a policy, or an `x-expires` lease.
    #[test]
    fn a_seeded_queue_is_configured_only_for_a_policy_or_a_lease() {
        let members = [2, 1, 3];
        let initial = QueueConfig::default();
        let with_policy = QueueConfig {
            max_length: Some(10),
            ..QueueConfig::default()
        };
        let leased = QueueConfig {
            expires_ms: Some(60_000),
            ..QueueConfig::default()
        };
        let calls =
            |config: &QueueConfig, me| replica_calls(true, true, config, &initial, &members, me);
        assert_eq!(calls(&initial, 2), (false, false), "arguments alone: none");
        assert_eq!(calls(&with_policy, 2), (false, true));
        assert_eq!(
            calls(&with_policy, 1),
            (false, false),
            "not the preferred leader"
        );
        let leased_args = replica_calls(true, true, &leased, &leased, &members, 2);
        assert_eq!(leased_args, (false, true), "the lease starts with it");
        for me in members {
            let reopened = replica_calls(false, true, &initial, &initial, &members, me);
            assert_eq!(reopened, (true, true));
        }
    }
}
