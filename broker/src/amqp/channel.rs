//! Channel methods: exchange/queue/basic/confirm classes. This is where AMQP
//! meets the domain: topology changes go to the meta group, publishes and
//! settlements to queue groups. No queue logic lives here.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use amq_protocol::protocol::basic::{self, AMQPProperties};
use amq_protocol::protocol::{channel, confirm, exchange, queue, tx, AMQPClass};
use amq_protocol::types::{AMQPValue, ShortString};
use bytes::{Bytes, BytesMut};

use super::codec;
use super::confirms::ConfirmTracker;
use super::connection::Conn;
use super::error::ProtocolError;
use crate::consumers::QueueDelivery;
use crate::message::StoredMessage;
use crate::meta::access::Perm;
use crate::meta::command::{MetaCommand, MetaReply};
use crate::meta::publish::{cc_bcc_keys, parse_expiration, strip_bcc};
use crate::meta::{QueueRecord, Topology};
use crate::queue::handle::{PendingReply, QueueHandle};
use crate::queue::types::{
    ConsumerId, EnqueueMsg, EnqueueOutcome, MsgId, QueueCommand, QueueReply,
};

/// Most body bytes reserved when a content header arrives (bytes); larger bodies grow as
/// their frames arrive.
const BODY_RESERVE_BYTES: u64 = 1 << 20;
/// Largest message body accepted (bytes), RabbitMQ 3.10's `max_message_size`.
pub const MAX_MESSAGE_SIZE: u64 = 134_217_728;

type Result<T> = std::result::Result<T, ProtocolError>;

impl ChannelState {
    /// Records an unacked delivery under its delivery tag.
    fn add_unacked(&mut self, tag: u64, u: Unacked) {
        if let Some(ix) = &mut self.unacked_index {
            ix.insert((u.consumer, u.msg));
        }
        self.unacked.insert(tag, u);
    }

    /// Removes (settles) the unacked delivery `tag`.
    fn take_unacked(&mut self, tag: u64) -> Option<Unacked> {
        let u = self.unacked.remove(&tag)?;
        if let Some(ix) = &mut self.unacked_index {
            ix.remove(&(u.consumer, u.msg));
        }
        Some(u)
    }

    /// True when message `msg` is delivered to `consumer` and not yet
    /// settled (builds the index on the first re-sent delivery).
    fn holds_unacked(&mut self, consumer: ConsumerId, msg: MsgId) -> bool {
        let unacked = &self.unacked;
        self.unacked_index
            .get_or_insert_with(|| unacked.values().map(|u| (u.consumer, u.msg)).collect())
            .contains(&(consumer, msg))
    }
}

/// An asynchronous result the connection loop picks up.
pub enum Completion {
    /// A confirm-mode publish finished on every target queue.
    Confirm { channel: u16, seq: u64, ok: bool },
}

struct Publishing {
    publish: basic::Publish,
    header: Option<(AMQPProperties, Bytes, u64)>,
    body: BytesMut,
}

struct Unacked {
    queue: Arc<QueueHandle>,
    consumer: ConsumerId,
    msg: MsgId,
}

struct ConsumerEntry {
    id: ConsumerId,
    queue: Arc<QueueHandle>,
    no_ack: bool,
    exclusive: bool,
    /// basic.cancel seen; the entry goes once queued deliveries are written.
    cancelled: bool,
}

/// State of one open channel.
#[derive(Default)]
pub struct ChannelState {
    /// We sent channel.close and wait for close-ok; frames are ignored.
    closing: bool,
    content: Option<Publishing>,
    confirms: Option<ConfirmTracker>,
    next_tag: u64,
    unacked: BTreeMap<u64, Unacked>,
    consumers: HashMap<String, ConsumerEntry>,
    get_slots: HashMap<u64, (ConsumerId, Arc<QueueHandle>)>,
    prefetch: u16,
    /// Last queue declared on the channel (for empty queue names).
    last_queue: Option<String>,
    /// basic.qos global=true with a limit: quorum queues refuse consumers
    /// on such a channel (spec §1.4).
    global_prefetch: bool,

    /// (consumer, message) of every unacked delivery, built when a new
    /// queue leader re-sends deliveries and dropped when `unacked` changes;
    /// only re-sent deliveries consult it.
    unacked_index: Option<std::collections::HashSet<(ConsumerId, MsgId)>>,

    /// tx.select mode: publishes and settlements held until tx.commit.
    tx: Option<Vec<(Arc<QueueHandle>, QueueCommand)>>,
    /// Cancelled consumers: their unacked messages stay checked out to
    /// them until acked or until the channel closes (spec §2.3).
    cancelled: Vec<(ConsumerId, Arc<QueueHandle>)>,
    /// Counts the channel in `rabbitmq_channels` while it exists.
    _open: crate::metrics::OpenChannel,
}

impl Conn {
    fn chan(&mut self, ch: u16) -> Result<&mut ChannelState> {
        self.channels.get_mut(&ch).ok_or_else(|| {
            ProtocolError::connection(
                504,
                format!("CHANNEL_ERROR - expected 'channel.open' for channel {ch}"),
            )
        })
    }

    /// Sends channel.close and marks the channel closing.
    pub(super) fn close_channel_with(
        &mut self,
        ch: u16,
        code: u16,
        text: String,
        class_id: u16,
        method_id: u16,
    ) {
        if let Some(state) = self.channels.get_mut(&ch) {
            state.closing = true;
            state.content = None;
        }
        tracing::debug!(ch, code, %text, "closing channel");
        self.send(
            ch,
            AMQPClass::Channel(channel::AMQPMethod::Close(channel::Close {
                reply_code: code,
                reply_text: ShortString::from(super::connection::truncate(text)),
                class_id,
                method_id,
            })),
        );
    }

    /// Handles a method on channel `ch` (> 0).
    pub(super) async fn on_channel_method(&mut self, ch: u16, m: AMQPClass) -> Result<()> {
        let (class_id, method_id) = (m.get_amqp_class_id(), m.get_amqp_method_id());
        if let AMQPClass::Channel(cm) = &m {
            match cm {
                channel::AMQPMethod::Open(_) => {
                    if self.channels.contains_key(&ch) {
                        return Err(ProtocolError::connection(
                            504,
                            "CHANNEL_ERROR - second 'channel.open' seen",
                        ));
                    }
                    if ch > self.channel_max {
                        return Err(ProtocolError::connection(
                            530,
                            format!("NOT_ALLOWED - channel number {ch} exceeds channel_max"),
                        ));
                    }
                    self.channels.insert(ch, ChannelState::default());
                    self.send(
                        ch,
                        AMQPClass::Channel(channel::AMQPMethod::OpenOk(channel::OpenOk {})),
                    );
                    return Ok(());
                }
                channel::AMQPMethod::Close(_) => {
                    self.release_channel(ch).await;
                    self.send(
                        ch,
                        AMQPClass::Channel(channel::AMQPMethod::CloseOk(channel::CloseOk {})),
                    );
                    return Ok(());
                }
                channel::AMQPMethod::CloseOk(_) => {
                    self.release_channel(ch).await;
                    return Ok(());
                }
                _ => {}
            }
        }
        let state = self.chan(ch)?;
        if state.closing {
            return Ok(());
        }
        if state.content.is_some() {
            return Err(ProtocolError::unexpected_frame(
                "expected content header for class 60, got non content header frame instead"
                    .to_string(),
            ));
        }
        let r = self.dispatch(ch, m).await;
        match r {
            Err(ProtocolError::Channel { code, text }) => {
                self.close_channel_with(ch, code, text, class_id, method_id);
                Ok(())
            }
            other => other,
        }
    }

    async fn dispatch(&mut self, ch: u16, m: AMQPClass) -> Result<()> {
        match m {
            AMQPClass::Channel(channel::AMQPMethod::Flow(f)) => {
                if !f.active {
                    return Err(ProtocolError::not_implemented("active=false"));
                }
                self.send(
                    ch,
                    AMQPClass::Channel(channel::AMQPMethod::FlowOk(channel::FlowOk {
                        active: f.active,
                    })),
                );
                Ok(())
            }
            AMQPClass::Channel(channel::AMQPMethod::FlowOk(_)) => Ok(()),
            AMQPClass::Exchange(em) => self.on_exchange(ch, em).await,
            AMQPClass::Queue(qm) => self.on_queue(ch, qm).await,
            AMQPClass::Basic(bm) => self.on_basic(ch, bm).await,
            AMQPClass::Confirm(confirm::AMQPMethod::Select(s)) => {
                let state = self.chan(ch)?;
                if state.tx.is_some() {
                    return Err(ProtocolError::precondition(
                        "cannot switch from tx to confirm mode",
                    ));
                }
                if state.confirms.is_none() {
                    state.confirms = Some(ConfirmTracker::default());
                }
                if !s.nowait {
                    self.send(
                        ch,
                        AMQPClass::Confirm(confirm::AMQPMethod::SelectOk(confirm::SelectOk {})),
                    );
                }
                Ok(())
            }
            AMQPClass::Tx(m) => self.on_tx(ch, m).await,

            AMQPClass::Access(_) => Err(ProtocolError::command_invalid(
                "access class is not supported",
            )),
            _ => Err(ProtocolError::command_invalid("unexpected method")),
        }
    }

    /// tx class (AMQP 0-9-1 transactions as RabbitMQ: publishes and
    /// settlements of the channel take effect at tx.commit, in order).
    async fn on_tx(&mut self, ch: u16, m: tx::AMQPMethod) -> Result<()> {
        let state = self.chan(ch)?;
        match m {
            tx::AMQPMethod::Select(_) => {
                if state.confirms.is_some() {
                    return Err(ProtocolError::precondition(
                        "cannot switch from confirm to tx mode",
                    ));
                }
                state.tx.get_or_insert_with(Vec::new);
                self.send(ch, AMQPClass::Tx(tx::AMQPMethod::SelectOk(tx::SelectOk {})));
            }
            tx::AMQPMethod::Commit(_) => {
                let Some(actions) = state.tx.as_mut().map(std::mem::take) else {
                    return Err(ProtocolError::precondition("channel is not transactional"));
                };
                let mut waits = Vec::with_capacity(actions.len());
                for (q, cmd) in actions {
                    waits.push(q.propose(cmd).await);
                }
                for w in waits {
                    if let Ok(Err(e)) = w.await {
                        return Err(ProtocolError::internal(e));
                    }
                }
                self.send(ch, AMQPClass::Tx(tx::AMQPMethod::CommitOk(tx::CommitOk {})));
            }
            tx::AMQPMethod::Rollback(_) => {
                let Some(actions) = state.tx.as_mut() else {
                    return Err(ProtocolError::precondition("channel is not transactional"));
                };
                actions.clear();
                self.send(
                    ch,
                    AMQPClass::Tx(tx::AMQPMethod::RollbackOk(tx::RollbackOk {})),
                );
            }
            _ => return Err(ProtocolError::command_invalid("unexpected tx method")),
        }
        Ok(())
    }

    /// Proposes `cmd` now, or holds it for tx.commit in tx mode.
    async fn submit(
        &mut self,
        ch: u16,
        queue: Arc<QueueHandle>,
        cmd: QueueCommand,
    ) -> Option<PendingReply> {
        if let Some(held) = self.channels.get_mut(&ch).and_then(|s| s.tx.as_mut()) {
            held.push((queue, cmd));
            return None;
        }
        Some(queue.propose(cmd).await)
    }

    /// `rabbit_access_control:check_resource_access` for this connection's user: `perm` on
    /// the `kind` (`queue` / `exchange`) resource `name` in this vhost.
    ///
    /// Errors: 403 ACCESS_REFUSED (a channel error), RabbitMQ 3.10.8's text.
    fn permit(&self, kind: &str, name: &str, perm: Perm) -> Result<()> {
        match self.broker.with_topology(|t| {
            t.access()
                .check_resource(&self.user, &self.vhost, kind, name, perm)
        }) {
            Some(Err(e)) => Err(e.into()),
            _ => Ok(()),
        }
    }

    async fn meta(&mut self, cmd: MetaCommand) -> Result<MetaReply> {
        match self.broker.meta_write(cmd).await? {
            MetaReply::Error(e) => Err(e.into()),
            r => Ok(r),
        }
    }

    async fn on_exchange(&mut self, ch: u16, m: exchange::AMQPMethod) -> Result<()> {
        match m {
            exchange::AMQPMethod::Declare(d) => {
                if !d.passive {
                    self.permit("exchange", d.exchange.as_str(), Perm::Configure)?;
                }
                self.meta(MetaCommand::DeclareExchange {
                    vhost: self.vhost.clone(),
                    name: d.exchange.as_str().into(),
                    kind: d.kind.as_str().into(),
                    passive: d.passive,
                    durable: d.durable,
                    auto_delete: d.auto_delete,
                    internal: d.internal,
                    arguments: d.arguments,
                })
                .await?;
                self.broker.topology_changed();
                if !d.nowait {
                    self.send(
                        ch,
                        AMQPClass::Exchange(exchange::AMQPMethod::DeclareOk(
                            exchange::DeclareOk {},
                        )),
                    );
                }
            }
            exchange::AMQPMethod::Delete(d) => {
                self.permit("exchange", d.exchange.as_str(), Perm::Configure)?;
                self.meta(MetaCommand::DeleteExchange {
                    vhost: self.vhost.clone(),
                    name: d.exchange.as_str().into(),
                    if_unused: d.if_unused,
                })
                .await?;
                if !d.nowait {
                    self.send(
                        ch,
                        AMQPClass::Exchange(exchange::AMQPMethod::DeleteOk(exchange::DeleteOk {})),
                    );
                }
            }
            exchange::AMQPMethod::Bind(b) => {
                self.permit("exchange", b.destination.as_str(), Perm::Write)?;
                self.permit("exchange", b.source.as_str(), Perm::Read)?;
                self.meta(MetaCommand::BindExchange {
                    vhost: self.vhost.clone(),
                    destination: b.destination.as_str().into(),
                    source: b.source.as_str().into(),
                    routing_key: b.routing_key.as_str().into(),
                    arguments: b.arguments,
                })
                .await?;
                self.broker.topology_changed();
                if !b.nowait {
                    self.send(
                        ch,
                        AMQPClass::Exchange(exchange::AMQPMethod::BindOk(exchange::BindOk {})),
                    );
                }
            }
            exchange::AMQPMethod::Unbind(b) => {
                self.permit("exchange", b.destination.as_str(), Perm::Write)?;
                self.permit("exchange", b.source.as_str(), Perm::Read)?;
                self.meta(MetaCommand::UnbindExchange {
                    vhost: self.vhost.clone(),
                    destination: b.destination.as_str().into(),
                    source: b.source.as_str().into(),
                    routing_key: b.routing_key.as_str().into(),
                    arguments: b.arguments,
                })
                .await?;
                if !b.nowait {
                    self.send(
                        ch,
                        AMQPClass::Exchange(exchange::AMQPMethod::UnbindOk(exchange::UnbindOk {})),
                    );
                }
            }

            _ => return Err(ProtocolError::command_invalid("unexpected exchange method")),
        }
        Ok(())
    }

    /// Looks a queue up and checks exclusive ownership (405 RESOURCE_LOCKED).
    fn lookup_queue(&self, name: &str) -> Result<(QueueRecord, Arc<QueueHandle>)> {
        if let Some(r) = self
            .broker
            .with_topology(|t| t.check_exclusive_access(&self.vhost, name, self.id))
        {
            r?;
        }
        self.broker.queue(&self.vhost, name).ok_or_else(|| {
            ProtocolError::not_found(format!("no queue '{name}' in vhost '{}'", self.vhost))
        })
    }

    async fn on_queue(&mut self, ch: u16, m: queue::AMQPMethod) -> Result<()> {
        match m {
            queue::AMQPMethod::Declare(d) => {
                let mut name = d.queue.as_str().to_string();
                let mut declare = self.broker.queue_declare(
                    &self.vhost,
                    &name,
                    d.passive,
                    d.durable,
                    d.exclusive,
                    d.auto_delete,
                    d.arguments,
                    self.id,
                );
                if name.is_empty() && !d.passive {
                    Topology::check_server_named(&declare)?;
                    name = server_name("amq.gen-");
                    declare.name = name.clone();
                    declare.server_named = true;
                } else if name.is_empty() {
                    name = self.default_queue_name(ch, "")?;
                }
                let (_, handle) = if d.passive {
                    self.lookup_queue(&name)?
                } else {
                    // rabbit_channel: configure on the queue; with an x-dead-letter-exchange
                    // argument also read on the queue and write on the DLX (the seed's rule:
                    // no dead-lettering into what one could not publish to). A DLX set by a
                    // policy is not checked, as RabbitMQ 3.10.8 (policies are the operator's).
                    self.permit("queue", &name, Perm::Configure)?;
                    if let Some(dlx) =
                        crate::meta::value::lookup(&declare.arguments, "x-dead-letter-exchange")
                            .and_then(crate::meta::value::as_longstr)
                    {
                        self.permit("queue", &name, Perm::Read)?;
                        self.permit("exchange", &dlx, Perm::Write)?;
                    }
                    let reply = self.meta(MetaCommand::DeclareQueue(declare)).await?;
                    let MetaReply::QueueDeclared { record, .. } = reply else {
                        return Err(ProtocolError::internal("unexpected reply to queue.declare"));
                    };
                    let handle = self.broker.ensure_queue(&record).await?;
                    (record, handle)
                };
                self.chan(ch)?.last_queue = Some(name.clone());
                let (ready, _unacked, consumers) = handle.counts().await;
                if !d.nowait {
                    self.send(
                        ch,
                        AMQPClass::Queue(queue::AMQPMethod::DeclareOk(queue::DeclareOk {
                            queue: name.as_str().into(),
                            message_count: ready as u32,
                            consumer_count: consumers as u32,
                        })),
                    );
                }
            }
            queue::AMQPMethod::Bind(b) => {
                let name = self.default_queue_name(ch, b.queue.as_str())?;
                self.permit("queue", &name, Perm::Write)?;
                self.permit("exchange", b.exchange.as_str(), Perm::Read)?;
                if self.broker.queue(&self.vhost, &name).is_some() {
                    self.lookup_queue(&name)?;
                }
                self.meta(MetaCommand::Bind {
                    vhost: self.vhost.clone(),
                    queue: name,
                    exchange: b.exchange.as_str().into(),
                    routing_key: b.routing_key.as_str().into(),
                    arguments: b.arguments,
                })
                .await?;
                self.broker.topology_changed();
                if !b.nowait {
                    self.send(
                        ch,
                        AMQPClass::Queue(queue::AMQPMethod::BindOk(queue::BindOk {})),
                    );
                }
            }
            queue::AMQPMethod::Unbind(b) => {
                let name = self.default_queue_name(ch, b.queue.as_str())?;
                self.permit("queue", &name, Perm::Write)?;
                self.permit("exchange", b.exchange.as_str(), Perm::Read)?;
                self.meta(MetaCommand::Unbind {
                    vhost: self.vhost.clone(),
                    queue: name,
                    exchange: b.exchange.as_str().into(),
                    routing_key: b.routing_key.as_str().into(),
                    arguments: b.arguments,
                })
                .await?;
                self.send(
                    ch,
                    AMQPClass::Queue(queue::AMQPMethod::UnbindOk(queue::UnbindOk {})),
                );
            }
            queue::AMQPMethod::Purge(p) => {
                let name = self.default_queue_name(ch, p.queue.as_str())?;
                self.permit("queue", &name, Perm::Read)?;
                let (_, handle) = self.lookup_queue(&name)?;
                let reply = handle
                    .call(QueueCommand::Purge {
                        now_ms: crate::now_ms(),
                    })
                    .await
                    .map_err(ProtocolError::internal)?;
                let n = match reply {
                    QueueReply::Purged(n) => n,
                    _ => 0,
                };
                if !p.nowait {
                    self.send(
                        ch,
                        AMQPClass::Queue(queue::AMQPMethod::PurgeOk(queue::PurgeOk {
                            message_count: n as u32,
                        })),
                    );
                }
            }
            queue::AMQPMethod::Delete(d) => {
                let name = self.default_queue_name(ch, d.queue.as_str())?;
                self.permit("queue", &name, Perm::Configure)?;
                let mut count = 0;
                if self.broker.queue(&self.vhost, &name).is_some() {
                    let (_, handle) = self.lookup_queue(&name)?;
                    if handle.refuses_conditional_delete() && (d.if_unused || d.if_empty) {
                        let flag = if d.if_empty { "if-empty" } else { "if-unused" };
                        return Err(ProtocolError::not_implemented(format!(
                            "cannot delete queue '{name}' in vhost '{}'. queue.delete operations with {flag} flag set are not supported by quorum queues",
                            self.vhost
                        )));
                    }
                    let (ready, _unacked, consumers) = handle.counts().await;
                    if d.if_unused && consumers > 0 {
                        return Err(ProtocolError::precondition(format!(
                            "queue '{name}' in vhost '{}' in use",
                            self.vhost
                        )));
                    }
                    // Classic semantics (rabbit_variable_queue:is_empty/1): ready messages
                    // only; unacknowledged ones do not make a queue non-empty.
                    if d.if_empty && ready > 0 {
                        return Err(ProtocolError::precondition(format!(
                            "queue '{name}' in vhost '{}' not empty",
                            self.vhost
                        )));
                    }
                    count = ready;
                    self.broker.delete_queue(&self.vhost, &name).await?;
                }
                if !d.nowait {
                    self.send(
                        ch,
                        AMQPClass::Queue(queue::AMQPMethod::DeleteOk(queue::DeleteOk {
                            message_count: count as u32,
                        })),
                    );
                }
            }
            _ => return Err(ProtocolError::command_invalid("unexpected queue method")),
        }
        Ok(())
    }

    /// An empty queue name means the channel's last declared queue
    /// (AMQP 0-9-1 §1.7.2.1); none yet → 404 as RabbitMQ.
    fn default_queue_name(&self, ch: u16, name: &str) -> Result<String> {
        if !name.is_empty() {
            return Ok(name.to_string());
        }
        self.channels
            .get(&ch)
            .and_then(|s| s.last_queue.clone())
            .ok_or_else(|| ProtocolError::not_found("no previously declared queue"))
    }

    async fn on_basic(&mut self, ch: u16, m: basic::AMQPMethod) -> Result<()> {
        match m {
            basic::AMQPMethod::Qos(q) => {
                let state = self.chan(ch)?;
                if q.global {
                    state.global_prefetch = q.prefetch_count > 0;
                } else {
                    state.prefetch = q.prefetch_count;
                }
                self.send(
                    ch,
                    AMQPClass::Basic(basic::AMQPMethod::QosOk(basic::QosOk {})),
                );
                Ok(())
            }
            basic::AMQPMethod::Publish(p) => {
                self.chan(ch)?.content = Some(Publishing {
                    publish: p,
                    header: None,
                    body: BytesMut::new(),
                });
                Ok(())
            }
            basic::AMQPMethod::Consume(c) => self.on_consume(ch, c).await,
            basic::AMQPMethod::Cancel(c) => self.on_cancel(ch, c).await,
            basic::AMQPMethod::Get(g) => self.on_get(ch, g).await,
            basic::AMQPMethod::Ack(a) => {
                self.settle(ch, a.delivery_tag, a.multiple, Settlement::Ack)
                    .await
            }
            basic::AMQPMethod::Nack(n) => {
                let how = if n.requeue {
                    Settlement::Requeue
                } else {
                    Settlement::Discard
                };
                self.settle(ch, n.delivery_tag, n.multiple, how).await
            }
            basic::AMQPMethod::Reject(r) => {
                let how = if r.requeue {
                    Settlement::Requeue
                } else {
                    Settlement::Discard
                };
                self.settle(ch, r.delivery_tag, false, how).await
            }
            basic::AMQPMethod::Recover(r) => {
                self.recover(ch, r.requeue).await?;
                self.send(
                    ch,
                    AMQPClass::Basic(basic::AMQPMethod::RecoverOk(basic::RecoverOk {})),
                );
                Ok(())
            }
            basic::AMQPMethod::RecoverAsync(r) => self.recover(ch, r.requeue).await,
            _ => Err(ProtocolError::command_invalid("unexpected basic method")),
        }
    }

    async fn recover(&mut self, ch: u16, requeue: bool) -> Result<()> {
        if !requeue {
            return Err(ProtocolError::not_implemented("requeue=false"));
        }
        let state = self.chan(ch)?;
        let all: Vec<u64> = state.unacked.keys().copied().collect();
        let tags = all;
        self.settle_tags(ch, tags, Settlement::Requeue).await
    }

    async fn on_consume(&mut self, ch: u16, c: basic::Consume) -> Result<()> {
        // RabbitMQ 3.12+ rabbit_channel: a new consumer over consumer_max_per_channel is a
        // connection error, checked before the queue is looked up.
        if let Some(max) = self.broker.config().consumer_max_per_channel {
            let state = self.chan(ch)?;
            let active = state.consumers.values().filter(|e| !e.cancelled).count() as u64;
            if active >= max && !state.consumers.contains_key(c.consumer_tag.as_str()) {
                return Err(ProtocolError::connection(
                    530,
                    format!("NOT_ALLOWED - reached maximum ({max}) of consumers per channel"),
                ));
            }
        }
        let name = self.default_queue_name(ch, c.queue.as_str())?;
        self.permit("queue", &name, Perm::Read)?;
        let (_, handle) = self.lookup_queue(&name)?;
        if handle.is_quorum() && self.chan(ch)?.global_prefetch {
            return Err(ProtocolError::not_implemented(format!(
                "queue '{name}' in vhost '{}' does not support global qos",
                self.vhost
            )));
        }
        let tag = if c.consumer_tag.as_str().is_empty() {
            server_name("amq.ctag-")
        } else {
            c.consumer_tag.as_str().to_string()
        };
        let prefetch = {
            let state = self.chan(ch)?;
            if state.consumers.contains_key(&tag) {
                return Err(ProtocolError::connection(
                    530,
                    format!("NOT_ALLOWED - attempt to reuse consumer tag '{tag}'"),
                ));
            }
            state.prefetch
        };
        if !handle.try_add_consumer(c.exclusive) {
            return Err(ProtocolError::channel(
                403,
                format!(
                    "ACCESS_REFUSED - queue '{name}' in vhost '{}' in exclusive use",
                    self.vhost
                ),
            ));
        }
        let id = self
            .broker
            .consumers()
            .register(self.mailbox.clone(), handle.group);
        self.chan(ch)?.consumers.insert(
            tag.clone(),
            ConsumerEntry {
                id,
                queue: handle.clone(),
                no_ack: c.no_ack,
                exclusive: c.exclusive,
                cancelled: false,
            },
        );
        if !c.nowait {
            self.send(
                ch,
                AMQPClass::Basic(basic::AMQPMethod::ConsumeOk(basic::ConsumeOk {
                    consumer_tag: tag.as_str().into(),
                })),
            );
        }
        let reply = handle
            .call(QueueCommand::Checkout {
                now_ms: crate::now_ms(),
                consumer: id,
                prefetch: u32::from(prefetch),
                no_ack: c.no_ack,
            })
            .await;
        if let Err(e) = reply {
            return Err(ProtocolError::internal(e));
        }
        Ok(())
    }

    async fn on_cancel(&mut self, ch: u16, c: basic::Cancel) -> Result<()> {
        let tag = c.consumer_tag.as_str().to_string();
        let entry = self
            .chan(ch)?
            .consumers
            .get(&tag)
            .map(|e| (e.id, e.queue.clone(), e.exclusive));
        if let Some((id, handle, exclusive)) = entry {
            let _ = handle
                .call(QueueCommand::Cancel {
                    now_ms: crate::now_ms(),
                    consumer: id,
                })
                .await;
            handle.remove_consumer(exclusive);
            self.broker.consumers().unregister(id);
            if let Some(e) = self.chan(ch)?.consumers.get_mut(&tag) {
                e.cancelled = true;
            }
            self.broker.maybe_auto_delete(&handle).await;
        }
        if !c.nowait {
            self.deferred.push((
                ch,
                AMQPClass::Basic(basic::AMQPMethod::CancelOk(basic::CancelOk {
                    consumer_tag: tag.as_str().into(),
                })),
            ));
        }
        Ok(())
    }

    async fn on_get(&mut self, ch: u16, g: basic::Get) -> Result<()> {
        let name = self.default_queue_name(ch, g.queue.as_str())?;
        self.permit("queue", &name, Perm::Read)?;
        let (_, handle) = self.lookup_queue(&name)?;
        let sac = handle.is_quorum()
            && self
                .broker
                .effective_config(&self.vhost, &name)
                .single_active_consumer;
        if sac {
            return Err(ProtocolError::channel(
                405,
                format!(
                    "RESOURCE_LOCKED - cannot obtain access to locked queue '{name}' in vhost '{}'. basic.get operations are not supported by quorum queues with single active consumer",
                    self.vhost
                ),
            ));
        }
        let slot = match self.chan(ch)?.get_slots.get(&handle.group) {
            Some((id, _)) => *id,
            None => {
                let id = self
                    .broker
                    .consumers()
                    .register(self.mailbox.clone(), handle.group);
                self.chan(ch)?
                    .get_slots
                    .insert(handle.group, (id, handle.clone()));
                id
            }
        };
        let reply = handle
            .call(QueueCommand::Dequeue {
                now_ms: crate::now_ms(),
                consumer: slot,
                no_ack: g.no_ack,
            })
            .await
            .map_err(ProtocolError::internal)?;
        let counts = handle.counts_deliveries();
        let QueueReply::Dequeued(Some((delivery, left))) = reply else {
            self.send(
                ch,
                AMQPClass::Basic(basic::AMQPMethod::GetEmpty(basic::GetEmpty {})),
            );
            return Ok(());
        };
        let Some(msg) = delivery
            .payload
            .as_deref()
            .and_then(|p| StoredMessage::decode(p).ok())
        else {
            return Err(ProtocolError::internal("stored message is missing"));
        };
        let state = self.chan(ch)?;
        state.next_tag += 1;
        let tag = state.next_tag;
        if !g.no_ack {
            state.add_unacked(
                tag,
                Unacked {
                    queue: handle.clone(),
                    consumer: slot,
                    msg: delivery.id,
                },
            );
        }
        self.send(
            ch,
            AMQPClass::Basic(basic::AMQPMethod::GetOk(basic::GetOk {
                delivery_tag: tag,
                redelivered: delivery.delivery_count > 0,
                exchange: msg.exchange.as_str().into(),
                routing_key: msg.routing_key.as_str().into(),
                message_count: left as u32,
            })),
        );
        crate::metrics::COUNTERS.delivered(delivery.delivery_count > 0);
        // RabbitMQ 3.10 adds x-delivery-count to every basic.get from a quorum
        // queue (spec §2.7), never on a classic queue.
        let props = if counts {
            with_delivery_count(&msg.properties, delivery.delivery_count)
        } else {
            msg.properties.clone()
        };
        codec::write_content(&mut self.out, ch, &props, &msg.body, self.frame_max);
        Ok(())
    }

    /// basic.ack/nack/reject: the tag must be an unacked delivery of this
    /// channel (406 "unknown delivery tag N" otherwise, as rabbit_channel's
    /// collect_acks); `multiple` takes every tag up to it; tag 0 with
    /// `multiple` takes everything.
    async fn settle(&mut self, ch: u16, tag: u64, multiple: bool, how: Settlement) -> Result<()> {
        let state = self.chan(ch)?;
        let tags: Vec<u64> = if multiple && tag == 0 {
            state.unacked.keys().copied().collect()
        } else if !state.unacked.contains_key(&tag) {
            return Err(ProtocolError::precondition(format!(
                "unknown delivery tag {tag}"
            )));
        } else if multiple {
            state.unacked.range(..=tag).map(|(t, _)| *t).collect()
        } else {
            vec![tag]
        };
        self.settle_tags(ch, tags, how).await
    }

    async fn settle_tags(&mut self, ch: u16, tags: Vec<u64>, how: Settlement) -> Result<()> {
        let state = self.chan(ch)?;
        // Group by (queue, consumer), keeping delivery-tag order (spec §2.2).
        let mut groups: Vec<(Arc<QueueHandle>, ConsumerId, Vec<MsgId>)> = Vec::new();
        for t in tags {
            if let Some(u) = state.take_unacked(t) {
                match groups
                    .iter_mut()
                    .find(|(q, c, _)| q.group == u.queue.group && *c == u.consumer)
                {
                    Some(g) => g.2.push(u.msg),
                    None => groups.push((u.queue, u.consumer, vec![u.msg])),
                }
            }
        }
        let now_ms = crate::now_ms();
        if how == Settlement::Ack {
            let n: usize = groups.iter().map(|g| g.2.len()).sum();
            crate::metrics::COUNTERS.acknowledged(n as u64);
        }
        for (queue, consumer, ids) in groups {
            let cmd = match how {
                Settlement::Ack => QueueCommand::Settle {
                    now_ms,
                    consumer,
                    ids,
                },
                Settlement::Requeue => QueueCommand::Return {
                    now_ms,
                    consumer,
                    ids,
                },
                Settlement::Discard => QueueCommand::Discard {
                    now_ms,
                    consumer,
                    ids,
                },
            };
            // Ordered behind earlier commands; not awaited here, but retried
            // in the background if no leader took it.
            if let Some(pending) = self.submit(ch, queue.clone(), cmd.clone()).await {
                tokio::spawn(queue.keep_proposing(cmd, pending));
            }
        }
        Ok(())
    }

    /// Frees a channel: consumers go down (their unacked messages return
    /// to the queue, counted as a delivery attempt, spec §2.3).
    pub(super) async fn release_channel(&mut self, ch: u16) {
        let Some(state) = self.channels.remove(&ch) else {
            return;
        };
        let now_ms = crate::now_ms();
        let mut downs = Vec::new();
        for (_, c) in state.consumers {
            self.broker.consumers().unregister(c.id);
            downs.push((c.id, c.queue.clone()));
            if !c.cancelled {
                c.queue.remove_consumer(c.exclusive);
                self.broker.maybe_auto_delete(&c.queue).await;
            }
        }
        downs.extend(state.cancelled);
        for (_, (id, q)) in state.get_slots {
            self.broker.consumers().unregister(id);
            downs.push((id, q));
        }
        let mut waits = Vec::new();
        for (id, q) in downs {
            waits.push(q.consumer_down(id, now_ms).await);
        }
        for w in waits {
            w.await;
        }
    }

    /// Content header frame of a publish.
    pub(super) async fn on_content_header(
        &mut self,
        ch: u16,
        class_id: u16,
        body_size: u64,
        properties: AMQPProperties,
        raw: Bytes,
    ) -> Result<()> {
        let state = self.chan(ch)?;
        if state.closing {
            return Ok(());
        }
        let Some(p) = state.content.as_mut() else {
            return Err(ProtocolError::unexpected_frame(
                "expected method frame, got non method frame instead",
            ));
        };
        if p.header.is_some() || class_id != 60 {
            return Err(ProtocolError::unexpected_frame(
                "expected content body, got non content body frame instead",
            ));
        }
        if body_size > MAX_MESSAGE_SIZE {
            state.content = None;
            let text = format!(
                "message size {body_size} is larger than configured max size {MAX_MESSAGE_SIZE}"
            );
            self.close_channel_with(ch, 406, format!("PRECONDITION_FAILED - {text}"), 60, 40);
            return Ok(());
        }
        p.header = Some((properties, raw, body_size));
        // The declared size is the client's word: reserve at most one chunk up front and grow
        // as body frames arrive (2,047 channels announcing 128 MiB each must not reserve 256 GiB).
        p.body.reserve(body_size.min(BODY_RESERVE_BYTES) as usize);
        if body_size == 0 {
            return self.finish_publish(ch).await;
        }
        Ok(())
    }

    /// Content body frame of a publish.
    pub(super) async fn on_content_body(&mut self, ch: u16, body: Bytes) -> Result<()> {
        let state = self.chan(ch)?;
        if state.closing {
            return Ok(());
        }
        let Some(p) = state.content.as_mut() else {
            return Err(ProtocolError::unexpected_frame(
                "expected method frame, got non method frame instead",
            ));
        };
        let Some((_, _, size)) = p.header.as_ref() else {
            return Err(ProtocolError::unexpected_frame(
                "expected content header for class 60, got non content header frame instead",
            ));
        };
        let size = *size;
        p.body.extend_from_slice(&body);
        if p.body.len() as u64 > size {
            return Err(ProtocolError::connection(
                501,
                "FRAME_ERROR - content body larger than declared size",
            ));
        }
        if p.body.len() as u64 == size {
            return self.finish_publish(ch).await;
        }
        Ok(())
    }

    async fn finish_publish(&mut self, ch: u16) -> Result<()> {
        let r = self.publish(ch).await;
        if let Err(ProtocolError::Channel { code, text }) = r {
            self.close_channel_with(ch, code, text, 60, 40);
            return Ok(());
        }
        r
    }

    async fn publish(&mut self, ch: u16) -> Result<()> {
        let state = self.chan(ch)?;
        let Some(Publishing {
            publish,
            header: Some((mut props, mut raw, _)),
            body,
        }) = state.content.take()
        else {
            return Ok(());
        };
        let seq = state.confirms.as_mut().map(|c| c.allocate());
        let exchange = publish.exchange.as_str().to_string();
        let routing_key = publish.routing_key.as_str().to_string();
        self.permit("exchange", &exchange, Perm::Write)?;
        if let Some(user) = props.user_id() {
            if user.as_str() != self.user {
                return Err(ProtocolError::precondition(format!(
                    "user_id property set to '{}' but authenticated user was '{}'",
                    user.as_str(),
                    self.user
                )));
            }
        }
        let (cc, bcc) = cc_bcc_keys(props.headers().as_ref())?;
        let ttl_ms = match props.expiration() {
            Some(e) => Some(parse_expiration(e.as_str())?),
            None => None,
        };
        let mut keys = Vec::with_capacity(1 + cc.len() + bcc.len());
        keys.push(routing_key.clone());
        keys.extend(cc.iter().cloned());
        keys.extend(bcc.iter().cloned());
        let targets = self
            .broker
            .route(&self.vhost, &exchange, &keys, props.headers().as_ref())?;
        if !bcc.is_empty() {
            if let Some(mut h) = props.headers().clone() {
                strip_bcc(&mut h);
                props = props.with_headers(h);
                raw = codec::encode_properties(&props);
            }
        }
        let body = body.freeze();
        crate::metrics::COUNTERS.published(!targets.is_empty());
        if targets.is_empty() {
            tracing::debug!(target: "proposals", exchange = %exchange, routing_key = %routing_key, "unroutable publish");
            if publish.mandatory {
                self.send(
                    ch,
                    AMQPClass::Basic(basic::AMQPMethod::Return(basic::Return {
                        reply_code: 312,
                        reply_text: "NO_ROUTE".into(),
                        exchange: exchange.as_str().into(),
                        routing_key: routing_key.as_str().into(),
                    })),
                );
                codec::write_content(&mut self.out, ch, &raw, &body, self.frame_max);
            }
            if let Some(seq) = seq {
                if let Some(c) = self.chan(ch)?.confirms.as_mut() {
                    c.complete(seq, true);
                    crate::metrics::COUNTERS.confirmed(1);
                }
                self.send_confirms(ch);
            }
            return Ok(());
        }
        let body_size = body.len() as u32;
        let stored = StoredMessage {
            exchange,
            routing_key,
            bcc,
            properties: raw,
            body,
        };
        let payload = stored.encode().map_err(ProtocolError::internal)?;
        let now_ms = crate::now_ms();
        let mut waits = Vec::with_capacity(targets.len());
        for q in targets {
            let msg = EnqueueMsg {
                payload: payload.clone(),
                body_size,
                ttl_ms,
            };
            let cmd = QueueCommand::Enqueue {
                now_ms,
                msgs: vec![msg],
            };
            if let Some(w) = self.submit(ch, q, cmd).await {
                waits.push(w);
            }
        }

        if let Some(seq) = seq {
            self.pending.push(Box::pin(async move {
                let mut ok = true;
                for w in waits {
                    match w.await {
                        Ok(Ok(QueueReply::Enqueued(outcomes))) => {
                            ok &= outcomes.iter().all(|o| *o == EnqueueOutcome::Accepted);
                        }
                        _ => ok = false,
                    }
                }
                Completion::Confirm {
                    channel: ch,
                    seq,
                    ok,
                }
            }));
        }
        Ok(())
    }

    fn send_confirms(&mut self, ch: u16) {
        let frames = match self.channels.get_mut(&ch).and_then(|s| s.confirms.as_mut()) {
            Some(c) => c.drain(),
            None => return,
        };
        for (tag, multiple, ack) in frames {
            let m = if ack {
                basic::AMQPMethod::Ack(basic::Ack {
                    delivery_tag: tag,
                    multiple,
                })
            } else {
                basic::AMQPMethod::Nack(basic::Nack {
                    delivery_tag: tag,
                    multiple,
                    requeue: false,
                })
            };
            self.send(ch, AMQPClass::Basic(m));
        }
    }

    /// Confirm-mode publishes completed: `first`, and every other completion
    /// already ready, are recorded before confirms are sent, so a burst goes
    /// out as one `multiple` ack rather than one frame per wake-up. (The
    /// futures complete in any order — `FuturesUnordered` yields a woken
    /// earlier publish after newer, never-polled ones — and the tracker puts
    /// them back in publish order.)
    pub(super) fn on_completions(&mut self, first: Completion) {
        use futures::{FutureExt, StreamExt};
        let mut touched: Vec<u16> = Vec::new();
        let mut next = Some(first);
        while let Some(Completion::Confirm { channel, seq, ok }) = next {
            if let Some(t) = self
                .channels
                .get_mut(&channel)
                .and_then(|s| s.confirms.as_mut())
            {
                t.complete(seq, ok);
                if ok {
                    crate::metrics::COUNTERS.confirmed(1);
                }
            }
            if !touched.contains(&channel) {
                touched.push(channel);
            }
            next = self.pending.next().now_or_never().flatten();
        }
        for ch in touched {
            self.send_confirms(ch);
        }
    }

    /// Forgets consumers cancelled by the client once their queued
    /// deliveries have been written (called after the mailbox is drained).
    pub(super) fn purge_cancelled(&mut self) {
        for s in self.channels.values_mut() {
            let tags: Vec<String> = s
                .consumers
                .iter()
                .filter(|(_, c)| c.cancelled)
                .map(|(t, _)| t.clone())
                .collect();
            for t in tags {
                if let Some(c) = s.consumers.remove(&t) {
                    s.cancelled.push((c.id, c.queue));
                }
            }
        }
    }

    /// A consumer's queue was deleted: drop the consumer and send
    /// basic.cancel (consumer_cancel_notify, as RabbitMQ).
    pub(super) fn on_consumer_cancelled(&mut self, id: ConsumerId) {
        let found = self.channels.iter_mut().find_map(|(ch, s)| {
            let tag = s
                .consumers
                .iter()
                .find(|(_, c)| c.id == id && !c.cancelled)
                .map(|(t, _)| t.clone())?;
            s.consumers.remove(&tag);
            s.unacked.retain(|_, u| u.consumer != id);
            Some((*ch, tag, s.closing))
        });
        if let Some((ch, tag, false)) = found {
            self.send(
                ch,
                AMQPClass::Basic(basic::AMQPMethod::Cancel(basic::Cancel {
                    consumer_tag: tag.as_str().into(),
                    nowait: true,
                })),
            );
        }
    }

    /// A queue handed a message to one of this connection's consumers.
    pub(super) async fn on_delivery(&mut self, d: QueueDelivery) {
        let found = self.channels.iter_mut().find_map(|(ch, s)| {
            if s.closing {
                return None;
            }
            s.consumers
                .iter()
                .find(|(_, c)| c.id == d.consumer)
                .map(|(tag, c)| (*ch, tag.clone(), c.no_ack, c.queue.clone()))
        });
        let Some((ch, tag, no_ack, queue)) = found else {
            tracing::debug!(target: "deliveries", consumer = ?d.consumer, id = d.delivery.id, "dropped: no such consumer on this connection");
            return;
        };
        let counts = queue.counts_deliveries();
        if d.delivery.resend {
            let Some(state) = self.channels.get_mut(&ch) else {
                return;
            };
            if state.holds_unacked(d.consumer, d.delivery.id) {
                // A new leader re-sent a delivery this consumer already has.
                tracing::debug!(target: "deliveries", consumer = ?d.consumer, id = d.delivery.id, "resend of a held delivery dropped");
                return;
            }
        }
        let Some(msg) = d
            .delivery
            .payload
            .as_deref()
            .and_then(|p| StoredMessage::decode(p).ok())
        else {
            tracing::error!(queue = %queue.name, id = d.delivery.id, "delivered message has no stored payload");
            return;
        };
        let Some(state) = self.channels.get_mut(&ch) else {
            return;
        };
        if !d.delivery.resend {
            // The new leader's re-sends are over: regular deliveries follow.
            state.unacked_index = None;
        }
        state.next_tag += 1;
        let dtag = state.next_tag;
        tracing::debug!(target: "deliveries", consumer = ?d.consumer, id = d.delivery.id, dtag, "to client");
        if !no_ack {
            state.add_unacked(
                dtag,
                Unacked {
                    queue,
                    consumer: d.consumer,
                    msg: d.delivery.id,
                },
            );
        }
        self.send(
            ch,
            AMQPClass::Basic(basic::AMQPMethod::Deliver(basic::Deliver {
                consumer_tag: tag.as_str().into(),
                delivery_tag: dtag,
                redelivered: d.delivery.delivery_count > 0,
                exchange: msg.exchange.as_str().into(),
                routing_key: msg.routing_key.as_str().into(),
            })),
        );
        crate::metrics::COUNTERS.delivered(d.delivery.delivery_count > 0);
        if d.delivery.delivery_count > 0 && counts {
            let props = with_delivery_count(&msg.properties, d.delivery.delivery_count);
            codec::write_content(&mut self.out, ch, &props, &msg.body, self.frame_max);
        } else {
            codec::write_content(
                &mut self.out,
                ch,
                &msg.properties,
                &msg.body,
                self.frame_max,
            );
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Settlement {
    Ack,
    Requeue,
    Discard,
}

/// Raw properties with an `x-delivery-count` header (long), spec §2.7.
fn with_delivery_count(raw: &Bytes, count: u32) -> Bytes {
    let Ok((_, props)) = basic::parse_properties(&raw[..]) else {
        return raw.clone();
    };
    let mut headers = props.headers().clone().unwrap_or_default();
    headers.insert(
        "x-delivery-count".into(),
        AMQPValue::LongLongInt(i64::from(count)),
    );
    codec::encode_properties(&props.with_headers(headers))
}

/// A server-generated name: prefix + 22 url-safe random characters, the
/// shape of RabbitMQ's `amq.gen-…` and `amq.ctag-…` names.
pub fn server_name(prefix: &str) -> String {
    use rand::Rng;
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut rng = rand::thread_rng();
    let suffix: String = (0..22)
        .map(|_| ALPHABET[rng.gen_range(0..ALPHABET.len())] as char)
        .collect();
    format!("{prefix}{suffix}")
}
