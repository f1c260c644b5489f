//! A queue as the rest of the node sees it — the one seam between the AMQP
//! front end and the cluster: propose commands, read counts. Whether the
//! queue's leader is this node or another is this module's business.
//!
//! Quorum queues propose through one proposer task per queue and node
//! (`super::proposer`: batching, dedupe, resend); where the leader is and
//! how a write reaches it is the route's business (`cluster::route`). Local
//! (non-replicated) queues apply directly under their lock.

use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use raft_log::BusyHint;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::{mpsc, oneshot};

use super::error::QueueError;
use super::host::{LeaderEffect, QueueContext, QueueHost};
use super::proposer::{self, Proposal};
use super::types::{ConsumerId, QueueCommand, QueueReply};
use crate::cluster::route::Route;
use crate::cluster::status::QueueStatus;
use crate::cluster::types::{Origin, Raft};

/// Proposals waiting for the proposer before `propose` applies backpressure.
const QUEUE_DEPTH: usize = 8192;

/// A reply that will arrive once the command is committed and applied.
pub type PendingReply = oneshot::Receiver<Result<QueueReply, QueueError>>;

enum Backend {
    /// Boxed: the channel allocates its slots 32 at a time, and 32 inline
    /// commands cost ~10 KiB per idle queue; 32 boxes cost 256 bytes.
    Raft {
        tx: mpsc::Sender<Box<Proposal>>,
    },
    Local,
}

/// Handle to one queue on this node.
pub struct QueueHandle {
    /// Group id (fresh per queue incarnation).
    pub group: u64,
    /// vhost of the queue.
    pub vhost: String,
    /// Queue name.
    pub name: String,
    /// The local replica (or local queue); swapped as this node becomes or
    /// stops being a member of the queue's group.
    host: RwLock<Option<Arc<Mutex<QueueHost>>>>,
    ctx: Arc<QueueContext>,
    /// A queue without a replica here has no runtime yet: the receiver of
    /// its leader effects waits here until a replica is attached.
    idle_effects: Mutex<Option<UnboundedReceiver<LeaderEffect>>>,
    backend: Backend,
    route: Option<Arc<Route>>,
    usage: Mutex<ConsumerUse>,
    /// Declared classic (or a local queue): deliveries carry no
    /// `x-delivery-count`, as on RabbitMQ's classic queues.
    classic: bool,
    /// Declared `x-queue-type: quorum` by the client: `queue.delete` with if-empty /
    /// if-unused is refused as RabbitMQ 3.10 refuses it on quorum queues.
    declared_quorum: bool,
    /// A node-local queue of another node (its home), reached by forwarding
    /// every command there ([`Self::local_elsewhere`]).
    elsewhere: bool,
    /// `x-max-priority` (an argument, fixed for the queue's life): publishes
    /// carry their message priority only to such a queue.
    max_priority: Option<u8>,
    /// Why the at-least-once worker still holds each held dead letter
    /// (leader-local, not replicated).
    held_reasons: crate::dead_letter::held::HeldReasons,
    /// Message counts through this node (management API `message_stats`).
    pub stats: crate::tracking::MessageCounts,
}

impl QueueHandle {
    /// Marks a queue that behaves as a classic queue toward clients (declared
    /// `x-queue-type: classic`, or local): RabbitMQ adds `x-delivery-count`
    /// only on quorum queues.
    pub fn classic(mut self, classic: bool) -> Self {
        self.classic = classic;
        self
    }

    /// Sets the queue's `x-max-priority` (None: one FIFO).
    pub fn max_priority(mut self, max: Option<u8>) -> Self {
        self.max_priority = max;
        self
    }

    /// The priority a message published with `priority` (the basic
    /// property, 0 when absent) is enqueued with: as given to a queue with
    /// `x-max-priority` (the queue clamps it), else 0 (so the publish stays
    /// the plain `Enqueue` log entry).
    pub fn message_priority(&self, priority: u8) -> u8 {
        if self.max_priority.is_some() {
            priority
        } else {
            0
        }
    }

    /// Marks a queue the client declared as a quorum queue (see [`Self::refuses_conditional_delete`]).
    pub fn declared_quorum(mut self, declared: bool) -> Self {
        self.declared_quorum = declared;
        self
    }

    /// True when `queue.delete` with if-empty or if-unused gets 540 NOT_IMPLEMENTED, as
    /// RabbitMQ 3.10.8 answers it for quorum queues: only for queues the client declared
    /// `x-queue-type: quorum`. Untyped durable queues (quorum here, classic on RabbitMQ) and
    /// classic-declared ones check the condition as a classic queue does.
    pub fn refuses_conditional_delete(&self) -> bool {
        self.declared_quorum
    }

    /// True when deliveries carry `x-delivery-count` (quorum queues).
    pub fn counts_deliveries(&self) -> bool {
        !self.classic
    }

    /// A quorum queue with a replica on this node (`host`, its Raft group in
    /// `route`); spawns its proposer.
    pub fn replica(
        vhost: String,
        name: String,
        host: Arc<Mutex<QueueHost>>,
        ctx: Arc<QueueContext>,
        route: Arc<Route>,
        origin: Origin,
        busy: BusyHint,
    ) -> Self {
        Self::quorum(vhost, name, Some(host), ctx, route, origin, busy)
    }

    /// A quorum queue without a replica on this node: every command is
    /// forwarded to its leader.
    pub fn remote(
        vhost: String,
        name: String,
        ctx: Arc<QueueContext>,
        route: Arc<Route>,
        origin: Origin,
    ) -> Self {
        Self::quorum(vhost, name, None, ctx, route, origin, BusyHint::default())
    }

    fn quorum(
        vhost: String,
        name: String,
        host: Option<Arc<Mutex<QueueHost>>>,
        ctx: Arc<QueueContext>,
        route: Arc<Route>,
        origin: Origin,
        busy: BusyHint,
    ) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE_DEPTH);
        proposer::spawn(route.clone(), ctx.clone(), origin, busy, rx);
        QueueHandle {
            group: ctx.group,
            vhost,
            name,
            host: RwLock::new(host),
            ctx,
            idle_effects: Mutex::new(None),
            backend: Backend::Raft { tx },
            route: Some(route),
            usage: Mutex::default(),
            held_reasons: Default::default(),
            stats: Default::default(),
            classic: false,
            declared_quorum: false,
            elsewhere: false,
            max_priority: None,
        }
    }

    /// A local (non-replicated) queue.
    pub fn local(
        vhost: String,
        name: String,
        host: Arc<Mutex<QueueHost>>,
        ctx: Arc<QueueContext>,
    ) -> Self {
        QueueHandle {
            group: ctx.group,
            vhost,
            name,
            host: RwLock::new(Some(host)),
            ctx,
            idle_effects: Mutex::new(None),
            backend: Backend::Local,
            route: None,
            usage: Mutex::default(),
            held_reasons: Default::default(),
            stats: Default::default(),
            classic: false,
            declared_quorum: false,
            elsewhere: false,
            max_priority: None,
        }
    }

    /// True for a Raft-replicated quorum queue.
    pub fn is_quorum(&self) -> bool {
        matches!(self.backend, Backend::Raft { .. }) && !self.elsewhere
    }

    /// Marks a handle made with [`Self::remote`] for a node-local queue
    /// (non-durable, auto-delete or exclusive) of another node: its
    /// commands go to the queue's home node as a quorum queue's go to its
    /// leader, and it behaves as the classic queue it is (RabbitMQ serves a
    /// classic queue from every node of the cluster).
    pub fn local_elsewhere(mut self) -> Self {
        self.elsewhere = true;
        self
    }

    /// True for a node-local queue whose home is this node.
    pub fn is_local_here(&self) -> bool {
        matches!(self.backend, Backend::Local)
    }

    /// True when this node holds a replica (or the queue is local here).
    pub fn has_replica(&self) -> bool {
        self.host().is_some()
    }

    /// Keeps the leader-effects receiver of a queue without a replica here
    /// until one is attached ([`Self::take_idle_effects`]).
    pub fn with_idle_effects(self, rx: UnboundedReceiver<LeaderEffect>) -> Self {
        if let Ok(mut e) = self.idle_effects.lock() {
            *e = Some(rx);
        }
        self
    }

    /// The receiver kept by [`Self::with_idle_effects`], once: the caller
    /// starts the queue's runtime with it.
    pub fn take_idle_effects(&self) -> Option<UnboundedReceiver<LeaderEffect>> {
        self.idle_effects.lock().ok().and_then(|mut e| e.take())
    }

    /// The local replica (None: no replica on this node).
    fn host(&self) -> Option<Arc<Mutex<QueueHost>>> {
        self.host.read().ok().and_then(|h| h.clone())
    }

    /// Installs (Some) or removes (None) the local replica's host together
    /// with its Raft handle in the route: this node became, or stopped
    /// being, a member of the group. Channels keep this handle throughout:
    /// their commands go to the local replica or are forwarded, whichever
    /// the route holds when they are proposed. Returns the Raft handle
    /// replaced.
    pub fn set_replica(&self, replica: Option<(Raft, Arc<Mutex<QueueHost>>)>) -> Option<Raft> {
        let (raft, host) = match replica {
            Some((r, h)) => (Some(r), Some(h)),
            None => (None, None),
        };
        if let Ok(mut h) = self.host.write() {
            *h = host;
        }
        self.route.as_ref().and_then(|r| r.set_raft(raft))
    }

    /// True when this node leads the queue's group (always for local queues).
    pub fn is_local_leader(&self) -> bool {
        match &self.route {
            Some(r) => r.local_leader().is_some(),
            None => true,
        }
    }

    /// Where the leader is (quorum queues).
    pub fn route(&self) -> Option<&Arc<Route>> {
        self.route.as_ref()
    }

    /// Why the dead-letter worker still holds each held dead letter it
    /// tried (leader-local, see [`crate::dead_letter::held`]).
    pub fn held_reasons(&self) -> &crate::dead_letter::held::HeldReasons {
        &self.held_reasons
    }

    /// The queue's shared context (leader effects, consumers).
    pub fn context(&self) -> &Arc<QueueContext> {
        &self.ctx
    }

    /// Records that consumer `consumer` is gone (its channel closed or it
    /// was cancelled): proposes `ConsumerDown`, so its unacked messages
    /// return to the queue (spec §2.3). The returned future waits for that
    /// write; if it failed because no leader was reachable it is retried in
    /// the background ([`QueueHandle::keep_proposing`]).
    pub async fn consumer_down(
        self: &Arc<Self>,
        consumer: ConsumerId,
        now_ms: u64,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let cmd = QueueCommand::ConsumerDown { now_ms, consumer };
        let pending = self.propose(cmd.clone()).await;
        let q = self.clone();
        async move { q.keep_proposing(cmd, pending).await }
    }

    /// Waits for `pending`, the reply to `cmd` (a settlement or a
    /// `ConsumerDown`, which the queue ignores for messages no longer
    /// checked out to that consumer); if the write failed because no leader
    /// was reachable (a partition, an election), proposes `cmd` again every
    /// second for up to [`SETTLE_RETRY`], in a background task. A lost
    /// settlement left its messages checked out to the consumer forever:
    /// they filled its prefetch and it received nothing more (found by the
    /// fault suite: 20 messages stuck after a partition healed).
    pub async fn keep_proposing(self: Arc<Self>, cmd: QueueCommand, pending: PendingReply) {
        let Ok(Err(QueueError::Raft(e))) = pending.await else {
            return;
        };
        if e == QueueError::Unavailable.to_string() {
            // The proposer reports a shut-down group (queue deleted, node stopping) as text.
            return;
        }
        tracing::warn!(queue = %self.name, error = %e, "settlement not recorded yet; retrying");
        tokio::spawn(async move {
            let deadline = tokio::time::Instant::now() + SETTLE_RETRY;
            while tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_secs(1)).await;
                match self.propose(cmd.clone()).await.await {
                    Ok(Err(QueueError::Raft(_))) => continue,
                    _ => return,
                }
            }
            tracing::error!(queue = %self.name, "settlement still not recorded; its messages return when this node restarts");
        });
    }

    /// Queues a command; commands proposed through one handle are applied in
    /// the order `propose` was called. Waits only for room in the proposer.
    pub async fn propose(&self, cmd: QueueCommand) -> PendingReply {
        let (reply, rx) = oneshot::channel();
        match &self.backend {
            Backend::Raft { tx, .. } => {
                if let Err(mpsc::error::SendError(p)) =
                    tx.send(Box::new(Proposal { cmd, reply })).await
                {
                    let _ = p.reply.send(Err(QueueError::Unavailable));
                }
            }
            Backend::Local => {
                let host = self.host();
                let r = match host.as_ref().map(|h| h.lock()) {
                    Some(Ok(mut h)) => Ok(h.apply(cmd, true)),
                    _ => Err(QueueError::Unavailable),
                };
                let _ = reply.send(r);
            }
        }
        rx
    }

    /// Proposes and waits for the reply.
    pub async fn call(&self, cmd: QueueCommand) -> Result<QueueReply, QueueError> {
        self.propose(cmd)
            .await
            .await
            .unwrap_or(Err(QueueError::Unavailable))
    }

    /// Reads the local replica's machine (None without a local replica).
    pub fn read<R>(&self, f: impl FnOnce(&QueueHost) -> R) -> Option<R> {
        let host = self.host()?;
        let h = host.lock().ok()?;
        Some(f(&h))
    }

    /// Counts of the local replica (None without one).
    pub fn local_status(&self) -> Option<QueueStatus> {
        self.read(QueueHost::status)
    }

    /// Ready, unacked and consumer counts: the leader's (asked over the
    /// network when it is elsewhere), else the local replica's.
    pub async fn counts(&self) -> (u64, u64, u64) {
        let s = match &self.route {
            Some(r) => r.status(self.local_status()).await,
            None => self.local_status().unwrap_or_default(),
        };
        (s.messages_ready, s.messages_unacknowledged, s.consumers)
    }

    /// Stops the group (queue deleted or node stopping).
    pub async fn shutdown(&self) {
        self.ctx.close();
        if let Some(raft) = self.route.as_ref().and_then(|r| r.raft()) {
            if let Err(e) = raft.shutdown().await {
                tracing::warn!(group = self.group, error = %e, "raft shutdown failed");
            }
        }
    }
}

/// How long [`QueueHandle::keep_proposing`] retries a failed settlement or `ConsumerDown`.
pub const SETTLE_RETRY: Duration = Duration::from_secs(600);

/// Node-local consumer bookkeeping of a queue: exclusive consumers
/// (basic.consume exclusive=true) and auto-delete.
#[derive(Debug, Default)]
pub struct ConsumerUse {
    /// Active consumers attached through this node.
    pub count: usize,
    /// One of them is exclusive.
    pub exclusive: bool,
    /// The queue has had a consumer (auto-delete fires only after one).
    pub had_consumer: bool,
}

impl QueueHandle {
    /// Registers a consumer; false if that breaks exclusivity
    /// (403 ACCESS_REFUSED "in exclusive use").
    pub fn try_add_consumer(&self, exclusive: bool) -> bool {
        let Ok(mut u) = self.usage.lock() else {
            return false;
        };
        if u.exclusive || (exclusive && u.count > 0) {
            return false;
        }
        u.count += 1;
        u.exclusive = exclusive;
        u.had_consumer = true;
        true
    }

    /// A consumer left (cancel, channel or connection closed).
    pub fn remove_consumer(&self, exclusive: bool) {
        if let Ok(mut u) = self.usage.lock() {
            u.count = u.count.saturating_sub(1);
            if exclusive {
                u.exclusive = false;
            }
        }
    }

    /// True when an auto-delete queue has lost its last consumer.
    pub fn unused_after_consumers(&self) -> bool {
        self.usage
            .lock()
            .map(|u| u.had_consumer && u.count == 0)
            .unwrap_or(false)
    }
}
