//! The topology aggregate the meta Raft group's state machine wraps:
//! vhosts with their exchanges, queues, bindings and policies. Every method
//! is deterministic; errors carry RabbitMQ 3.10.8's reply codes and texts.

use std::collections::{BTreeMap, BTreeSet};

use amq_protocol::types::FieldTable;
use serde::{Deserialize, Serialize};

use super::access::Access;
use super::effective;
use super::error::{rs, AmqpError};
use super::exchange::{predeclared, ExchangeKind, ExchangeRecord};
use super::limits::VhostLimits;
use super::policy::{self, Policy, StoredPolicy, Target};
use super::queue::{Binding, QueueDeclare, QueueDeclared, QueueKind, QueueRecord};
use super::queue_args::{
    assert_args_equivalence, augment_declare_args, check_declare_arguments,
    check_exchange_name_arg, check_quorum_properties, QueueType,
};
use super::replica_counts::ReplicaCounts;
use super::routing::{headers_match, topic_matches, validate_headers_binding};
use super::value::{as_longstr, lookup};
use crate::queue::types::QueueConfig;

/// One virtual host.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct VHost {
    exchanges: BTreeMap<String, ExchangeRecord>,
    queues: BTreeMap<String, QueueRecord>,
    /// Bindings by source exchange, in creation order.
    bindings: BTreeMap<String, Vec<Binding>>,
    policies: BTreeMap<String, StoredPolicy>,
}

impl VHost {
    /// Adds a binding under its source exchange; binding twice is a no-op
    /// (RabbitMQ: identity is all fields).
    fn add_binding(&mut self, b: Binding) {
        let bs = self.bindings.entry(b.exchange.clone()).or_default();
        if !bs.contains(&b) {
            bs.push(b);
        }
    }

    fn with_defaults() -> Self {
        let mut v = VHost::default();
        for x in predeclared() {
            v.exchanges.insert(x.name.clone(), x);
        }
        v
    }

    /// Deletes `exchange` if it is auto-delete and has no bindings left
    /// (`rabbit_exchange:maybe_auto_delete/2`).
    fn maybe_auto_delete(&mut self, exchange: &str) {
        let unused = self
            .bindings
            .get(exchange)
            .map(|b| b.is_empty())
            .unwrap_or(true);
        if unused
            && self
                .exchanges
                .get(exchange)
                .map(|x| x.auto_delete)
                .unwrap_or(false)
        {
            self.exchanges.remove(exchange);
            self.bindings.remove(exchange);
        }
    }

    fn exchange_or_404(&self, vhost: &str, name: &str) -> Result<&ExchangeRecord, AmqpError> {
        self.exchanges
            .get(name)
            .ok_or_else(|| AmqpError::not_found(format!("no {}", rs("exchange", name, vhost))))
    }
}

/// The whole topology. `Topology::default()` is empty (no vhost);
/// `Topology::new()` has vhost `/` with the predeclared exchanges.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Topology {
    vhosts: BTreeMap<String, VHost>,
    /// Highest queue group id handed out so far (0 = the meta group).
    last_group_id: u64,
    /// The cluster's id, fixed by the first meta leader (0 = not yet).
    cluster_id: u64,
    /// Per-vhost settings (limits, default queue type), by vhost; vhosts with none are
    /// absent. Last field: snapshots written before it existed decode through
    /// [`Topology::decode_snapshot`].
    settings: BTreeMap<String, VhostSettings>,
    /// Users and permissions. Snapshots written before it existed (and before
    /// `settings`) decode with the default `guest` (all permissions on `/`).
    access: Access,
    /// Replicas per node over every queue record (derived: not in snapshots,
    /// rebuilt by [`Topology::decode_snapshot`]).
    #[serde(skip)]
    replicas: ReplicaCounts,
}

/// A vhost's settings (RabbitMQ's vhost metadata and `vhost-limits` parameter).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VhostSettings {
    /// `set_vhost_limits`.
    pub limits: VhostLimits,
    /// `add_vhost --default-queue-type` (RabbitMQ 3.11+ vhost metadata): the type of a
    /// durable queue declared without `x-queue-type` in this vhost (`quorum` or `classic`);
    /// None = the node's `default_queue_type`.
    pub default_queue_type: Option<String>,
}

impl VhostSettings {
    fn is_empty(&self) -> bool {
        *self == VhostSettings::default()
    }
}

/// The snapshot layout before vhost settings and users (the first three fields).
#[derive(Deserialize)]
struct TopologyBeforeLimits {
    vhosts: BTreeMap<String, VHost>,
    last_group_id: u64,
    cluster_id: u64,
}

fn check_not_default_exchange(name: &str) -> Result<(), AmqpError> {
    if name.is_empty() {
        Err(AmqpError::access_refused(
            "operation not permitted on the default exchange",
        ))
    } else {
        Ok(())
    }
}

/// `rabbit_channel:check_name/2`: `amq.` names only on creation.
fn check_name(kind: &str, name: &str) -> Result<(), AmqpError> {
    if name.starts_with("amq.") {
        Err(AmqpError::access_refused(format!(
            "{kind} name '{name}' contains reserved prefix 'amq.*'"
        )))
    } else {
        Ok(())
    }
}

fn exclusive_locked(vhost: &str, name: &str) -> AmqpError {
    AmqpError::resource_locked(format!(
        "cannot obtain exclusive access to locked {}. It could be originally declared on another connection or the exclusive property value does not match that of the original declaration.",
        rs("queue", name, vhost)
    ))
}

impl Topology {
    /// A topology with vhost `/` and its predeclared exchanges (`""`,
    /// `amq.direct`, `amq.fanout`, `amq.topic`, `amq.headers`, `amq.match`,
    /// `amq.rabbitmq.trace`; all durable), as a fresh RabbitMQ node has.
    pub fn new() -> Self {
        let mut t = Topology::default();
        t.add_vhost("/");
        t.access = Access::with_guest();
        t
    }

    /// Users and permissions.
    pub fn access(&self) -> &Access {
        &self.access
    }

    /// Users and permissions, to change (meta commands only).
    pub fn access_mut(&mut self) -> &mut Access {
        &mut self.access
    }

    /// Creates a vhost with the predeclared exchanges; no-op if it exists.
    pub fn add_vhost(&mut self, name: &str) {
        self.vhosts
            .entry(name.to_owned())
            .or_insert_with(VHost::with_defaults);
    }

    /// Deletes a vhost and everything in it (its settings too); returns its queues (the
    /// caller stops their groups). None if it did not exist.
    pub fn delete_vhost(&mut self, name: &str) -> Option<Vec<QueueRecord>> {
        self.settings.remove(name);
        self.access.forget_vhost(name);
        let queues: Vec<QueueRecord> = self.vhosts.remove(name)?.queues.into_values().collect();
        for q in &queues {
            self.replicas.remove(&q.members);
        }
        Some(queues)
    }

    /// Decodes a meta snapshot ([`raft_log::codec`] bincode), including one written before
    /// vhost limits existed (it has none).
    ///
    /// Errors: bytes that are neither layout.
    pub fn decode_snapshot(data: &[u8]) -> Result<Topology, raft_log::StoreError> {
        let mut t = raft_log::codec::decode::<Topology>(data).or_else(|e| {
            raft_log::codec::decode::<TopologyBeforeLimits>(data)
                .map(|t| Topology {
                    vhosts: t.vhosts,
                    last_group_id: t.last_group_id,
                    cluster_id: t.cluster_id,
                    settings: BTreeMap::new(),
                    access: Access::with_guest(),
                    replicas: ReplicaCounts::default(),
                })
                .map_err(|_| e)
        })?;
        t.replicas = ReplicaCounts::of(t.queues());
        Ok(t)
    }

    /// Queue replicas node `node` holds by the topology: the queue records
    /// naming it a member (placement's load; kept as records change, not counted).
    pub fn replicas_on(&self, node: u64) -> usize {
        self.replicas.get(node)
    }

    /// `rabbitmqctl set_vhost_limits`: replaces the vhost's limits (an empty definition
    /// clears them, as `clear_vhost_limits`).
    ///
    /// Errors: 530 NOT_ALLOWED `vhost … not found` when the vhost does not exist.
    pub fn set_vhost_limits(&mut self, vhost: &str, limits: VhostLimits) -> Result<(), AmqpError> {
        self.vhost(vhost)?;
        self.update_settings(vhost, |s| s.limits = limits);
        Ok(())
    }

    /// The vhost's limits (empty when none are set or the vhost does not exist).
    pub fn vhost_limits(&self, vhost: &str) -> VhostLimits {
        self.settings
            .get(vhost)
            .map(|s| s.limits)
            .unwrap_or_default()
    }

    /// The vhost's settings (default when none are set or the vhost does not exist).
    pub fn vhost_settings(&self, vhost: &str) -> VhostSettings {
        self.settings.get(vhost).cloned().unwrap_or_default()
    }

    /// `rabbitmqctl add_vhost NAME [--default-queue-type T]`: creates the vhost with the
    /// predeclared exchanges; for an existing vhost only a given default queue type is
    /// updated (RabbitMQ 3.10.8 answers an existing vhost with success).
    ///
    /// Errors: 406 for a default queue type other than `quorum` / `classic`.
    pub fn add_vhost_with(
        &mut self,
        name: &str,
        default_queue_type: Option<String>,
    ) -> Result<(), AmqpError> {
        if let Some(t) = &default_queue_type {
            if !matches!(t.as_str(), "quorum" | "classic") {
                return Err(AmqpError::precondition_failed(format!(
                    "default queue type '{t}' is not one of quorum, classic"
                )));
            }
        }
        self.add_vhost(name);
        if default_queue_type.is_some() {
            self.update_settings(name, |s| s.default_queue_type = default_queue_type);
        }
        Ok(())
    }

    fn update_settings(&mut self, vhost: &str, f: impl FnOnce(&mut VhostSettings)) {
        let mut s = self.vhost_settings(vhost);
        f(&mut s);
        if s.is_empty() {
            self.settings.remove(vhost);
        } else {
            self.settings.insert(vhost.to_owned(), s);
        }
    }

    /// True when the vhost exists.
    pub fn has_vhost(&self, name: &str) -> bool {
        self.vhosts.contains_key(name)
    }

    /// `set_permissions`: as [`Access::set_permissions`], for an existing vhost.
    ///
    /// Errors: 530 `vhost … not found`; those of `Access::set_permissions`.
    pub fn set_permissions(
        &mut self,
        user: &str,
        vhost: &str,
        p: super::access::Permission,
    ) -> Result<(), AmqpError> {
        self.vhost(vhost)?;
        self.access.set_permissions(user, vhost, p)
    }

    /// Names of all vhosts, sorted.
    pub fn vhosts(&self) -> impl Iterator<Item = &str> {
        self.vhosts.keys().map(String::as_str)
    }

    fn vhost(&self, vhost: &str) -> Result<&VHost, AmqpError> {
        self.vhosts.get(vhost).ok_or_else(|| vhost_missing(vhost))
    }

    fn vhost_mut(&mut self, vhost: &str) -> Result<&mut VHost, AmqpError> {
        self.vhosts
            .get_mut(vhost)
            .ok_or_else(|| vhost_missing(vhost))
    }

    // ---------------------------------------------------------------- exchanges

    /// exchange.declare (RabbitMQ 3.10.8 `rabbit_channel`, texts observed).
    /// Non-passive order: type (503 `COMMAND_INVALID - unknown exchange type
    /// 'x'`, hard), default exchange (403 `ACCESS_REFUSED - operation not
    /// permitted on the default exchange`), then if it exists equivalence
    /// (406 `inequivalent arg 'type' ...`), else the `amq.` prefix (403
    /// `ACCESS_REFUSED - exchange name 'amq.foo' contains reserved prefix
    /// 'amq.*'`), the `alternate-exchange` type (406) and creation. Passive:
    /// default exchange 403, missing 404 `NOT_FOUND - no exchange 'x' in vhost '/'`.
    /// Redeclaring `amq.direct` equivalently succeeds, as in RabbitMQ.
    #[allow(clippy::too_many_arguments)]
    pub fn declare_exchange(
        &mut self,
        vhost: &str,
        name: &str,
        kind: &str,
        passive: bool,
        durable: bool,
        auto_delete: bool,
        internal: bool,
        arguments: &FieldTable,
    ) -> Result<(), AmqpError> {
        let v = self.vhost_mut(vhost)?;
        if passive {
            check_not_default_exchange(name)?;
            return v.exchange_or_404(vhost, name).map(|_| ());
        }
        let kind = ExchangeKind::parse(kind)?;
        check_not_default_exchange(name)?;
        if let Some(x) = v.exchanges.get(name) {
            return x.assert_equivalence(vhost, kind, durable, auto_delete, internal, arguments);
        }
        check_name("exchange", name)?;
        check_exchange_name_arg(
            arguments,
            "alternate-exchange",
            &rs("exchange", name, vhost),
        )?;
        v.exchanges.insert(
            name.to_owned(),
            ExchangeRecord {
                name: name.to_owned(),
                kind,
                durable,
                auto_delete,
                internal,
                arguments: arguments.clone(),
            },
        );
        Ok(())
    }

    /// exchange.delete: default exchange → 403; `amq.*` → 403
    /// `ACCESS_REFUSED - deletion of system exchange 'amq.direct' in vhost '/'
    /// not allowed` (even if it does not exist); missing → Ok; `if_unused`
    /// with bindings → 406 `PRECONDITION_FAILED - exchange 'x' in vhost '/'
    /// in use`. Removes the exchange's bindings. 3.10.8 observed.
    pub fn delete_exchange(
        &mut self,
        vhost: &str,
        name: &str,
        if_unused: bool,
    ) -> Result<(), AmqpError> {
        check_not_default_exchange(name)?;
        if name.starts_with("amq.") {
            return Err(AmqpError::access_refused(format!(
                "deletion of system {} not allowed",
                rs("exchange", name, vhost)
            )));
        }
        let v = self.vhost_mut(vhost)?;
        if !v.exchanges.contains_key(name) {
            return Ok(());
        }
        let in_use = v.bindings.get(name).map(|b| !b.is_empty()).unwrap_or(false);
        if if_unused && in_use {
            return Err(AmqpError::precondition_failed(format!(
                "{} in use",
                rs("exchange", name, vhost)
            )));
        }
        v.exchanges.remove(name);
        v.bindings.remove(name);
        for bs in v.bindings.values_mut() {
            bs.retain(|b| !(b.to_exchange && b.queue == name));
        }
        Ok(())
    }

    /// exchange.bind: messages routed by `source` that match go on through
    /// `destination`. Missing exchanges → 404 (destination reported first,
    /// as rabbit_binding); the default exchange → 403. Binding twice is a
    /// no-op.
    pub fn bind_exchange(
        &mut self,
        vhost: &str,
        destination: &str,
        source: &str,
        routing_key: &str,
        arguments: &FieldTable,
    ) -> Result<(), AmqpError> {
        check_not_default_exchange(source)?;
        check_not_default_exchange(destination)?;
        let v = self.vhost_mut(vhost)?;
        v.exchange_or_404(vhost, destination)?;
        let x = v.exchange_or_404(vhost, source)?;
        if x.kind == ExchangeKind::Headers {
            validate_headers_binding(arguments)?;
        }
        v.add_binding(Binding {
            exchange: source.to_owned(),
            queue: destination.to_owned(),
            routing_key: routing_key.to_owned(),
            arguments: arguments.clone(),
            to_exchange: true,
        });
        Ok(())
    }

    /// exchange.unbind: removing a missing binding is fine.
    pub fn unbind_exchange(
        &mut self,
        vhost: &str,
        destination: &str,
        source: &str,
        routing_key: &str,
        arguments: &FieldTable,
    ) -> Result<(), AmqpError> {
        check_not_default_exchange(source)?;
        check_not_default_exchange(destination)?;
        let v = self.vhost_mut(vhost)?;
        if let Some(bs) = v.bindings.get_mut(source) {
            bs.retain(|b| {
                !(b.to_exchange
                    && b.queue == destination
                    && b.routing_key == routing_key
                    && &b.arguments == arguments)
            });
        }
        Ok(())
    }

    /// The exchange record, if any.
    pub fn exchange(&self, vhost: &str, name: &str) -> Option<&ExchangeRecord> {
        self.vhosts.get(vhost).and_then(|v| v.exchanges.get(name))
    }

    /// All exchanges of a vhost, by name.
    pub fn exchanges(&self, vhost: &str) -> impl Iterator<Item = &ExchangeRecord> {
        self.vhosts
            .get(vhost)
            .into_iter()
            .flat_map(|v| v.exchanges.values())
    }

    // ------------------------------------------------------------------- queues

    /// RabbitMQ's server-named check, for the caller to run on an empty
    /// queue.declare name before generating `amq.gen-…`: refused for quorum
    /// queues (after quorumq's default-type injection) with 406
    /// `PRECONDITION_FAILED - Cannot declare a server-named queue for type
    /// rabbit_quorum_queue` (spec §1.4; 3.10.8 observed). So an empty-name
    /// declare that is durable, non-exclusive and non-auto-delete is refused.
    pub fn check_server_named(d: &QueueDeclare) -> Result<(), AmqpError> {
        let args = augment_declare_args(&d.arguments, d.durable, d.exclusive, d.auto_delete);
        match lookup(&args, "x-queue-type")
            .and_then(as_longstr)
            .as_deref()
        {
            Some(t @ ("quorum" | "stream")) => Err(AmqpError::precondition_failed(format!(
                "Cannot declare a server-named queue for type rabbit_{t}_queue"
            ))),
            _ => Ok(()),
        }
    }

    /// Validates a queue.declare (spec §1.1-1.5, RabbitMQ 3.10.8 order):
    ///
    /// Passive: missing → 404 `NOT_FOUND - no queue 'q' in vhost '/'`;
    /// exclusive to another connection → 405 RESOURCE_LOCKED; else `Existing`.
    ///
    /// Otherwise: `amq.` prefix → 403 `ACCESS_REFUSED - queue name 'amq.foo'
    /// contains reserved prefix 'amq.*'`; if the queue exists: exclusive
    /// owner must match exactly (405), then durable, auto_delete (406
    /// `inequivalent arg 'durable' ...`), then the type's arguments (406,
    /// `x-queue-type` absent ≡ `quorum` through default-type injection);
    /// else: DLX type (406), argument validation (406, see
    /// `queue_args::check_declare_arguments`), then for quorum queues the
    /// property checks auto-delete, exclusive, non-durable (406).
    ///
    /// New queues: `kind` = Quorum when the queue is durable, non-exclusive
    /// and non-auto-delete (declared `classic` included: quorumq backs it
    /// with a quorum group but keeps the declared type), else Local on
    /// `d.node`. `durable` is stored as `durable && !exclusive` like RabbitMQ.
    /// `group_id` = a fresh id (last + 1); `add_queue` records it.
    /// Declares of `amq.rabbitmq.reply-to*` are treated as passive.
    pub fn check_queue_declare(&self, d: &QueueDeclare) -> Result<QueueDeclared, AmqpError> {
        let v = self.vhost(&d.vhost)?;
        let qrs = rs("queue", &d.name, &d.vhost);
        if d.passive || d.name.starts_with("amq.rabbitmq.reply-to") {
            let q = v
                .queues
                .get(&d.name)
                .ok_or_else(|| AmqpError::not_found(format!("no {qrs}")))?;
            if matches!(q.exclusive_owner, Some(o) if o != d.connection) {
                return Err(exclusive_locked(&d.vhost, &d.name));
            }
            return Ok(QueueDeclared::Existing(q.clone()));
        }
        if d.name.is_empty() {
            Self::check_server_named(d)?;
        }
        if !d.server_named {
            check_name("queue", &d.name)?;
        }
        let args = augment_declare_args(&d.arguments, d.durable, d.exclusive, d.auto_delete);
        let durable = d.durable && !d.exclusive;
        let owner = if d.exclusive {
            Some(d.connection)
        } else {
            None
        };
        if let Some(q) = v.queues.get(&d.name) {
            if q.exclusive_owner != owner {
                return Err(exclusive_locked(&d.vhost, &d.name));
            }
            if q.durable != durable {
                return Err(super::exchange::field_inequivalent(
                    "durable",
                    &qrs,
                    &durable.to_string(),
                    &q.durable.to_string(),
                ));
            }
            if q.auto_delete != d.auto_delete {
                return Err(super::exchange::field_inequivalent(
                    "auto_delete",
                    &qrs,
                    &d.auto_delete.to_string(),
                    &q.auto_delete.to_string(),
                ));
            }
            let qtype = QueueType::of_args(&q.arguments);
            assert_args_equivalence(&q.arguments, &args, &qrs, qtype.queue_arguments())?;
            return Ok(QueueDeclared::Existing(q.clone()));
        }
        // rabbit_channel: the vhost's queue limit holds for new queues only, before the
        // DLX and argument checks (3.10.8 text observed).
        if let Some(max) = self.vhost_limits(&d.vhost).queue_limit() {
            if v.queues.len() as u64 >= max {
                return Err(AmqpError::precondition_failed(format!(
                    "cannot declare queue '{}': queue limit in vhost '{}' ({max}) is reached",
                    d.name, d.vhost
                )));
            }
        }
        check_exchange_name_arg(&args, "x-dead-letter-exchange", &qrs)?;
        let qtype = check_declare_arguments(&args, &qrs)?;
        if qtype == QueueType::Quorum {
            check_quorum_properties(&qrs, d.auto_delete, d.exclusive, durable)?;
        }
        let kind = if durable && !d.exclusive && !d.auto_delete {
            QueueKind::Quorum
        } else {
            QueueKind::Local { node: d.node }
        };
        Ok(QueueDeclared::Create(QueueRecord {
            vhost: d.vhost.clone(),
            name: d.name.clone(),
            durable,
            exclusive_owner: owner,
            auto_delete: d.auto_delete,
            arguments: args,
            kind,
            group_id: self.last_group_id + 1,
            members: if d.members.is_empty() {
                vec![d.node]
            } else {
                d.members.clone()
            },
        }))
    }

    /// Records a queue created by `check_queue_declare` (replacing any record
    /// of the same name) and advances the group id counter past its
    /// `group_id`. The default exchange routes to it by name implicitly.
    /// Creates the vhost if it is missing (the caller checked it).
    pub fn add_queue(&mut self, rec: QueueRecord) {
        self.last_group_id = self.last_group_id.max(rec.group_id);
        self.replicas.add(&rec.members);
        let replaced = self
            .vhosts
            .entry(rec.vhost.clone())
            .or_insert_with(VHost::with_defaults)
            .queues
            .insert(rec.name.clone(), rec);
        if let Some(old) = replaced {
            self.replicas.remove(&old.members);
        }
    }

    /// The cluster id (0 until the first meta leader fixed it).
    pub fn cluster_id(&self) -> u64 {
        self.cluster_id
    }

    /// Fixes the cluster id once; later calls change nothing. Returns the id in force.
    pub fn set_cluster_id(&mut self, id: u64) -> u64 {
        if self.cluster_id == 0 {
            self.cluster_id = id;
        }
        self.cluster_id
    }

    /// The highest group id handed out so far.
    pub fn last_group_id(&self) -> u64 {
        self.last_group_id
    }

    /// The queue record, if any.
    pub fn queue(&self, vhost: &str, name: &str) -> Option<&QueueRecord> {
        self.vhosts.get(vhost).and_then(|v| v.queues.get(name))
    }

    /// Every queue of every vhost, ordered by (vhost, name).
    pub fn queues(&self) -> impl Iterator<Item = &QueueRecord> {
        self.vhosts.values().flat_map(|v| v.queues.values())
    }

    /// Exclusive queues owned by `connection` (delete them when it closes).
    pub fn queues_owned_by(&self, connection: u64) -> Vec<&QueueRecord> {
        self.queues()
            .filter(|q| q.exclusive_owner == Some(connection))
            .collect()
    }

    /// `rabbit_amqqueue:check_exclusive_access/2` (lax): a queue exclusive to
    /// another connection refuses bind, unbind, delete, purge, consume, get
    /// with 405 `RESOURCE_LOCKED - cannot obtain exclusive access to locked
    /// queue 'q' in vhost '/'. It could be ...` (3.10.8 observed). Missing
    /// queue → 404.
    pub fn check_exclusive_access(
        &self,
        vhost: &str,
        queue: &str,
        connection: u64,
    ) -> Result<(), AmqpError> {
        let q = self
            .vhost(vhost)?
            .queues
            .get(queue)
            .ok_or_else(|| AmqpError::not_found(format!("no {}", rs("queue", queue, vhost))))?;
        match q.exclusive_owner {
            Some(o) if o != connection => Err(exclusive_locked(vhost, queue)),
            _ => Ok(()),
        }
    }

    /// Removes a queue and its bindings; auto-delete exchanges left without
    /// bindings are deleted (RabbitMQ `process_deletions`). Returns the record.
    pub fn delete_queue(&mut self, vhost: &str, name: &str) -> Option<QueueRecord> {
        let v = self.vhosts.get_mut(vhost)?;
        let rec = v.queues.remove(name)?;
        self.replicas.remove(&rec.members);
        let mut touched = Vec::new();
        for (x, bs) in v.bindings.iter_mut() {
            let before = bs.len();
            bs.retain(|b| b.to_exchange || b.queue != name);

            if bs.len() != before {
                touched.push(x.clone());
            }
        }
        for x in touched {
            v.maybe_auto_delete(&x);
        }
        Some(rec)
    }

    /// Replaces the member list of queue `name` if its group is still
    /// `group_id` (membership changes, `SetQueueMembers`).
    ///
    /// Errors: 404 NOT_FOUND when no such queue (or a re-declared one).
    pub fn set_queue_members(
        &mut self,
        vhost: &str,
        name: &str,
        group_id: u64,
        members: Vec<u64>,
    ) -> Result<(), AmqpError> {
        match self
            .vhosts
            .get_mut(vhost)
            .and_then(|v| v.queues.get_mut(name))
        {
            Some(q) if q.group_id == group_id => {
                self.replicas.remove(&q.members);
                self.replicas.add(&members);
                q.members = members;
                Ok(())
            }
            _ => Err(AmqpError::not_found(format!(
                "no {}",
                rs("queue", name, vhost)
            ))),
        }
    }

    // ----------------------------------------------------------------- bindings

    /// queue.bind (3.10.8 `binding_action`): default exchange → 403
    /// `ACCESS_REFUSED - operation not permitted on the default exchange`;
    /// missing exchange → 404 `NOT_FOUND - no exchange 'x' in vhost '/'`
    /// (reported first when both are missing), missing queue → 404 `NOT_FOUND
    /// - no queue 'q' in vhost '/'`; headers exchanges validate `x-match`
    /// (406). Binding twice is a no-op. Exclusivity: see
    /// `check_exclusive_access`.
    pub fn bind(
        &mut self,
        vhost: &str,
        queue: &str,
        exchange: &str,
        routing_key: &str,
        arguments: &FieldTable,
    ) -> Result<(), AmqpError> {
        check_not_default_exchange(exchange)?;
        let v = self.vhost_mut(vhost)?;
        let x = v.exchange_or_404(vhost, exchange)?;
        if !v.queues.contains_key(queue) {
            return Err(AmqpError::not_found(format!(
                "no {}",
                rs("queue", queue, vhost)
            )));
        }
        if x.kind == ExchangeKind::Headers {
            validate_headers_binding(arguments)?;
        }
        v.add_binding(Binding {
            exchange: exchange.to_owned(),
            queue: queue.to_owned(),
            routing_key: routing_key.to_owned(),
            arguments: arguments.clone(),
            to_exchange: false,
        });
        Ok(())
    }

    /// queue.unbind: default exchange → 403; a missing exchange, queue or
    /// binding is fine (Ok), as in 3.10.8 (observed). An auto-delete exchange
    /// left without bindings is deleted (observed).
    pub fn unbind(
        &mut self,
        vhost: &str,
        queue: &str,
        exchange: &str,
        routing_key: &str,
        arguments: &FieldTable,
    ) -> Result<(), AmqpError> {
        check_not_default_exchange(exchange)?;
        let v = self.vhost_mut(vhost)?;
        let removed = match v.bindings.get_mut(exchange) {
            Some(bs) => {
                let before = bs.len();
                bs.retain(|b| {
                    !(!b.to_exchange
                        && b.queue == queue
                        && b.routing_key == routing_key
                        && &b.arguments == arguments)
                });
                bs.len() != before
            }
            None => false,
        };
        if removed {
            v.maybe_auto_delete(exchange);
        }
        Ok(())
    }

    /// Bindings whose source is `exchange`, in creation order.
    pub fn bindings(&self, vhost: &str, exchange: &str) -> &[Binding] {
        self.vhosts
            .get(vhost)
            .and_then(|v| v.bindings.get(exchange))
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    // ------------------------------------------------------------------ routing

    /// Routes one publish. `routing_keys` = the publish routing key followed
    /// by the CC and BCC keys (`publish::cc_bcc_keys`); `headers` feed
    /// headers exchanges. Returns existing target queue names, deduplicated,
    /// sorted. The default exchange routes to the queue named by each key.
    /// If nothing matched and the exchange has an alternate exchange
    /// (`alternate-exchange` argument, else policy; argument wins as in
    /// `rabbit_policy:get_arg/3`), routing continues there (cycles stopped).
    /// Errors (3.10.8 observed): missing exchange → 404 `NOT_FOUND - no
    /// exchange 'x' in vhost '/'`; internal → 403 `ACCESS_REFUSED - cannot
    /// publish to internal exchange 'x' in vhost '/'`. Exchange-to-exchange
    /// bindings are not modelled.
    pub fn route(
        &self,
        vhost: &str,
        exchange: &str,
        routing_keys: &[String],
        headers: Option<&FieldTable>,
    ) -> Result<Vec<String>, AmqpError> {
        let v = self.vhost(vhost)?;
        let x = v.exchange_or_404(vhost, exchange)?;
        if x.internal {
            return Err(AmqpError::access_refused(format!(
                "cannot publish to internal {}",
                rs("exchange", exchange, vhost)
            )));
        }
        let mut out = BTreeSet::new();
        let mut visited = BTreeSet::new();
        let mut current = Some(x);
        while let Some(x) = current.take() {
            if !visited.insert(x.name.clone()) {
                break;
            }
            // The exchange and everything reachable through
            // exchange-to-exchange bindings (cycles stopped by `visited`).
            let mut pending = vec![x];
            while let Some(x) = pending.pop() {
                let mut next = Vec::new();
                self.route_one(v, x, routing_keys, headers, &mut out, &mut next);
                for name in next {
                    if let Some(d) = v.exchanges.get(&name) {
                        if visited.insert(name) {
                            pending.push(d);
                        }
                    }
                }
            }
            if out.is_empty() {
                current = self
                    .alternate_exchange(vhost, v, x)
                    .and_then(|ae| v.exchanges.get(&ae));
            }
        }
        Ok(out.into_iter().collect())
    }

    fn route_one(
        &self,
        v: &VHost,
        x: &ExchangeRecord,
        keys: &[String],
        headers: Option<&FieldTable>,
        out: &mut BTreeSet<String>,
        exchanges: &mut Vec<String>,
    ) {
        if x.name.is_empty() {
            out.extend(
                keys.iter()
                    .filter(|k| v.queues.contains_key(k.as_str()))
                    .cloned(),
            );
            return;
        }
        let Some(bs) = v.bindings.get(&x.name) else {
            return;
        };
        for b in bs {
            let hit = match x.kind {
                ExchangeKind::Direct => keys.contains(&b.routing_key),
                ExchangeKind::Fanout => true,
                ExchangeKind::Topic => keys.iter().any(|k| topic_matches(&b.routing_key, k)),
                ExchangeKind::Headers => headers_match(&b.arguments, headers),
            };
            if hit && b.to_exchange {
                exchanges.push(b.queue.clone());
            } else if hit && v.queues.contains_key(&b.queue) {
                out.insert(b.queue.clone());
            }
        }
    }

    fn alternate_exchange(&self, _vhost: &str, v: &VHost, x: &ExchangeRecord) -> Option<String> {
        if let Some(ae) = lookup(&x.arguments, "alternate-exchange").and_then(as_longstr) {
            return Some(ae);
        }
        policy::select(v.policies.values(), Target::Exchange, &x.name)
            .and_then(|p| p.definition.get("alternate-exchange"))
            .and_then(|ae| ae.as_str())
            .map(str::to_owned)
    }

    // ----------------------------------------------------------------- policies

    /// Sets (creates or replaces) a user policy after validating it
    /// (`policy::validate`; `AmqpError::policy_invalid` texts). Missing vhost
    /// → 530 NOT_ALLOWED. Callers recompute `effective_config` of affected
    /// queues afterwards (spec §1.6).
    pub fn set_policy(&mut self, p: Policy) -> Result<(), AmqpError> {
        let regex = policy::validate(&p)?;
        let v = self.vhost_mut(&p.vhost)?;
        v.policies
            .insert(p.name.clone(), StoredPolicy { policy: p, regex });
        Ok(())
    }

    /// Clears a policy. Unknown policy → 404 `NOT_FOUND - Parameter does not
    /// exist` (rabbitmqctl's wording).
    pub fn clear_policy(&mut self, vhost: &str, name: &str) -> Result<(), AmqpError> {
        let v = self.vhost_mut(vhost)?;
        match v.policies.remove(name) {
            Some(_) => Ok(()),
            None => Err(AmqpError::not_found("Parameter does not exist")),
        }
    }

    /// The policies of a vhost, by name.
    pub fn policies(&self, vhost: &str) -> Vec<Policy> {
        self.vhosts
            .get(vhost)
            .map(|v| v.policies.values().map(|p| p.policy.clone()).collect())
            .unwrap_or_default()
    }

    /// The policy in effect for a queue (highest priority among those whose
    /// apply-to, pattern and keys fit the queue's declared type; see
    /// `policy::select`).
    pub fn queue_policy(&self, vhost: &str, queue: &str) -> Option<&Policy> {
        let v = self.vhosts.get(vhost)?;
        let q = v.queues.get(queue)?;
        policy::select(
            v.policies.values(),
            Target::Queue(QueueType::of_args(&q.arguments)),
            queue,
        )
    }

    /// The queue's effective configuration, the warnings RabbitMQ would log
    /// for it, and the name of the applied policy (see
    /// `effective::effective_config` for the precedence rules, spec §1.2,
    /// §5.1). None if the queue does not exist.
    pub fn effective_config(
        &self,
        vhost: &str,
        queue: &str,
    ) -> Option<(QueueConfig, Vec<String>, Option<String>)> {
        let q = self.queue(vhost, queue)?;
        let p = self.queue_policy(vhost, queue);
        let (config, warnings) =
            effective::effective_config(vhost, queue, &q.arguments, p.map(|p| &p.definition));
        Some((config, warnings, p.map(|p| p.name.clone())))
    }
}

/// 530 NOT_ALLOWED, as connection.open answers for an unknown vhost.
fn vhost_missing(vhost: &str) -> AmqpError {
    AmqpError::not_allowed(format!("vhost {vhost} not found"))
}

#[cfg(test)]
mod snapshot_tests {
    use super::*;

    #[test]
    fn limits_survive_a_snapshot_and_old_snapshots_still_decode() {
        let mut topo = Topology::new();
        topo.add_vhost("v");
        topo.set_vhost_limits(
            "/",
            VhostLimits::parse(r#"{"max-connections": 3}"#).unwrap(),
        )
        .unwrap();
        let bytes = raft_log::codec::encode(&topo).unwrap();
        let back = Topology::decode_snapshot(&bytes).unwrap();
        assert_eq!(back.vhost_limits("/").connection_limit(), Some(3));
        // The layout written before vhost limits: the same fields without the last one.
        #[derive(serde::Serialize)]
        struct Before<'a> {
            vhosts: &'a BTreeMap<String, VHost>,
            last_group_id: u64,
            cluster_id: u64,
        }
        let old = raft_log::codec::encode(&Before {
            vhosts: &topo.vhosts,
            last_group_id: topo.last_group_id,
            cluster_id: 9,
        })
        .unwrap();
        let back = Topology::decode_snapshot(&old).unwrap();
        assert_eq!(back.vhosts().collect::<Vec<_>>(), vec!["/", "v"]);
        assert_eq!(back.cluster_id(), 9);
        assert!(back.vhost_limits("/").is_empty());
        assert!(
            back.access().check_vhost_access("guest", "/").is_ok(),
            "guest as before"
        );
        assert!(Topology::decode_snapshot(&old[..old.len() - 1]).is_err());
    }
}
