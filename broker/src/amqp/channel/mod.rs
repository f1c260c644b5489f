//! One AMQP channel as a state machine that owns its state. The connection
//! hands a channel its inputs in order — method and content frames, the
//! deliveries and cancellations its consumers receive, the confirms of its
//! publishes — and takes back the frames it wrote. A run of inputs that waits
//! on Raft (a declare, a consume, a close that returns unacked messages) holds
//! only its own channel: the connection goes on reading the socket, writing
//! heartbeats and serving its other channels (`connection.rs`).
//!
//! This is where AMQP meets the domain: topology changes go to the meta group,
//! publishes and settlements to queue groups. No queue logic lives here. The
//! methods are split by AMQP class: `exchange.rs`, `queue.rs`, `publish.rs`
//! (basic.publish, its content, confirm.select and confirms), `consume.rs`
//! (basic.qos/consume/cancel/get and deliveries), `settle.rs`
//! (basic.ack/nack/reject/recover) and `tx.rs`.

mod consume;
mod exchange;
mod publish;
mod queue;
mod recent;
mod session;
mod settle;
mod tx;

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;

use amq_protocol::protocol::{basic, channel, confirm, AMQPClass};

use amq_protocol::types::ShortString;
use futures::future::BoxFuture;
use settle::Settlement;

use super::codec::{self, InFrame};
use super::confirms::ConfirmTracker;
use super::error::ProtocolError;
use super::output::Output;
use crate::consumers::QueueDelivery;
use crate::meta::access::Perm;
use crate::meta::command::{MetaCommand, MetaReply};
use crate::meta::QueueRecord;
use crate::queue::handle::{PendingReply, QueueHandle};
use crate::queue::types::{ConsumerId, MsgId, QueueCommand};

pub use publish::MAX_MESSAGE_SIZE;
pub use session::Session;

type Result<T> = std::result::Result<T, ProtocolError>;

/// One input of a channel, handled in the order the connection received it.
#[derive(Debug)]
// Frames are nearly every input: boxing them would cost an allocation per frame.
#[allow(clippy::large_enum_variant)]
pub enum Input {
    /// A method, content header or content body frame for this channel.
    Frame(InFrame),
    /// Something for the channel from elsewhere in the node.
    Event(Event),
}

/// What reaches a channel from elsewhere in the node; none waits, so an idle
/// channel handles it at once ([`Channel::on_event`]).
#[derive(Debug)]
pub enum Event {
    /// A queue handed a message to one of this channel's consumers.
    Delivery(QueueDelivery),
    /// The queue of one of this channel's consumers is gone: the consumer is
    /// dropped and the client gets basic.cancel (consumer_cancel_notify).
    Cancelled(ConsumerId),
    /// A confirm-mode publish finished on every target queue (`ok`: ack).
    Confirmed { seq: u64, ok: bool },
    /// A queue timed one of this channel's consumers (or basic.get slots)
    /// out: its messages are back in the queue (consumer timeout).
    TimedOut {
        consumer: ConsumerId,
        timeout_ms: u64,
    },
}

/// A connection-level error raised on a channel: the connection answers it
/// with connection.close naming the offending method (`class_id`, `method_id`;
/// 0 for a content frame).
#[derive(Debug)]
pub struct Escalation {
    pub error: ProtocolError,
    pub class_id: u16,
    pub method_id: u16,
}

/// An asynchronous result the connection loop picks up.
pub enum Completion {
    /// A confirm-mode publish finished on every target queue (`channel`:
    /// the channel's [`Channel::key`]).
    Confirm { channel: u64, seq: u64, ok: bool },
}

/// An unsettled delivery (basic.deliver or basic.get-ok without no_ack).
struct Unacked {
    queue: Arc<QueueHandle>,
    consumer: ConsumerId,
    msg: MsgId,
    /// The delivery count it was delivered with.
    count: u32,
}

/// A basic.consume of this channel.
struct ConsumerEntry {
    id: ConsumerId,
    queue: Arc<QueueHandle>,
    no_ack: bool,
    exclusive: bool,
    /// basic.consume's arguments (shown by `/api/consumers`).
    arguments: amq_protocol::types::FieldTable,
    /// basic.cancel seen; the entry goes once queued deliveries are written.
    cancelled: bool,
}

/// One open channel: its state, and the frames it wrote that the connection
/// has not taken yet.
pub struct Channel {
    /// The channel number.
    number: u16,
    /// Connection-unique key of this channel: a number is reused once the
    /// client closed its channel, perhaps while the old one still releases.
    key: u64,
    session: Arc<Session>,
    /// The meta catch-up stamp of the inputs being handled, taken when their
    /// run began (they had all arrived): a publish that routes nowhere
    /// waits for a catch-up round started after it ([`Broker::route`]).
    arrived: u64,
    /// Frames written, for the connection to take ([`Channel::output`]).
    out: Output,
    /// Confirm waits started by publishes, for the connection to poll.
    confirm_waits: Vec<BoxFuture<'static, Completion>>,
    /// Frames to send only after deliveries already queued for this
    /// connection (basic.cancel-ok must follow the consumer's last delivery).
    deferred: Vec<AMQPClass>,
    /// The channel is closed (channel.close or close-ok handled): the
    /// connection forgets it.
    ended: bool,
    /// We sent channel.close and wait for close-ok; frames are ignored.
    closing: bool,
    content: Option<publish::Publishing>,
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
    unacked_index: Option<HashSet<(ConsumerId, MsgId)>>,
    /// tx.select mode: publishes and settlements held until tx.commit.
    tx: Option<Vec<(Arc<QueueHandle>, QueueCommand)>>,
    /// Cancelled consumers: their unacked messages stay checked out to
    /// them until acked or until the channel closes (spec §2.3).
    cancelled: Vec<(ConsumerId, Arc<QueueHandle>)>,
    /// Delivery tags whose messages a consumer timeout took back: a late
    /// ack, nack or reject of one is ignored, not a 406 "unknown delivery
    /// tag" (RabbitMQ 4.3).
    timed_out_tags: HashSet<u64>,
    /// Deliveries settled here lately: a new leader's re-sends of them, and
    /// a deposed leader's late originals, are dropped (`recent.rs`).
    recent_settles: recent::RecentDeliveries,
    /// A new leader's re-sends passed on lately: a deposed leader's late
    /// original of the same delivery is dropped (`recent.rs`).
    recent_resends: recent::RecentDeliveries,
    /// Counts the channel in `rabbitmq_channels` while it exists.
    _open: crate::metrics::OpenChannel,
    /// The channel in the node's tracking (management API), with its statistics.
    tracked: crate::tracking::ChannelGuard,
    /// The consumer tags last published to `tracked`.
    published_tags: Vec<String>,
}

impl Channel {
    /// Channel `number` of the connection `session`, just opened, under the
    /// connection-unique `key` (the connection sends channel.open-ok).
    pub fn new(number: u16, key: u64, session: Arc<Session>) -> Box<Channel> {
        Box::new(Channel {
            number,
            key,
            out: Output::default(),
            confirm_waits: Vec::new(),
            deferred: Vec::new(),
            ended: false,
            closing: false,
            content: None,
            confirms: None,
            next_tag: 0,
            unacked: BTreeMap::new(),
            consumers: HashMap::new(),
            get_slots: HashMap::new(),
            prefetch: 0,
            last_queue: None,
            arrived: 0,
            global_prefetch: false,
            unacked_index: None,
            tx: None,
            cancelled: Vec::new(),
            timed_out_tags: HashSet::new(),
            recent_settles: Default::default(),
            recent_resends: Default::default(),
            _open: Default::default(),
            tracked: session
                .broker
                .tracking()
                .open_channel(session.id, number, key),
            published_tags: Vec::new(),
            session,
        })
    }

    /// Handles `inputs` in order; stops at the first connection-level error
    /// and returns it (the rest are dropped: the connection is closing).
    /// Confirms completed by the inputs are written at the end, as one
    /// `multiple` ack where they allow.
    pub async fn run(
        mut self: Box<Self>,
        inputs: VecDeque<Input>,
    ) -> (Box<Self>, Option<Escalation>) {
        let mut confirmed = false;
        self.arrived = self.session.broker.meta_stamp();
        for input in inputs {
            if self.ended {
                break;
            }
            match input {
                Input::Frame(frame) => {
                    if let Err(e) = self.on_frame(frame).await {
                        return (self, Some(e));
                    }
                }
                Input::Event(Event::Confirmed { seq, ok }) => {
                    self.confirmed(seq, ok);
                    confirmed = true;
                }
                Input::Event(event) => self.on_event(event),
            }
        }
        if confirmed {
            self.send_confirms();
        }
        self.publish_stats();
        (self, None)
    }

    /// Counts one delivery or basic.get answer (and a redelivery).
    pub(super) fn count_delivered(&self, redelivered: bool) {
        let c = self.counts();
        crate::tracking::MessageCounts::add(&c.deliver_get, 1);
        if redelivered {
            crate::tracking::MessageCounts::add(&c.redeliver, 1);
        }
    }

    /// The channel's message counts (management API rates).
    pub(super) fn counts(&self) -> &crate::tracking::MessageCounts {
        &self.tracked.stats.counts
    }

    /// Publishes the channel's state to its tracking entry: unacked count, prefetch,
    /// modes, and its consumers when their tags changed.
    fn publish_stats(&mut self) {
        use std::sync::atomic::Ordering::Relaxed;
        let st = &self.tracked.stats;
        st.unacked.store(self.unacked.len() as u64, Relaxed);
        st.prefetch.store(u32::from(self.prefetch), Relaxed);
        st.global_prefetch.store(
            if self.global_prefetch {
                u32::from(self.prefetch)
            } else {
                0
            },
            Relaxed,
        );
        st.confirm.store(self.confirms.is_some(), Relaxed);
        st.transactional.store(self.tx.is_some(), Relaxed);
        let mut tags: Vec<&String> = self
            .consumers
            .iter()
            .filter(|(_, c)| !c.cancelled)
            .map(|(t, _)| t)
            .collect();
        tags.sort_unstable();
        if tags.len() == self.published_tags.len()
            && tags.iter().zip(&self.published_tags).all(|(a, b)| *a == b)
        {
            return;
        }
        self.published_tags = tags.into_iter().cloned().collect();
        let infos = self
            .published_tags
            .iter()
            .filter_map(|t| self.consumers.get(t).map(|c| (t, c)))
            .map(|(t, c)| crate::tracking::ConsumerInfo {
                tag: t.clone(),
                vhost: c.queue.vhost.clone(),
                queue: c.queue.name.clone(),
                ack_required: !c.no_ack,
                exclusive: c.exclusive,
                prefetch_count: u32::from(self.prefetch),
                arguments: c.arguments.clone(),
            })
            .collect();
        *st.consumers.lock().unwrap_or_else(|p| p.into_inner()) = infos;
    }

    /// Handles a delivery, a cancellation or a confirm at once (none
    /// waits). After confirms, call [`Channel::send_confirms`].
    pub fn on_event(&mut self, event: Event) {
        match event {
            Event::Delivery(d) => self.on_delivery(d),
            Event::Cancelled(id) => self.on_consumer_cancelled(id),
            Event::Confirmed { seq, ok } => self.confirmed(seq, ok),
            Event::TimedOut {
                consumer,
                timeout_ms,
            } => self.on_consumer_timed_out(consumer, timeout_ms),
        }
    }

    /// The channel number.
    pub fn number(&self) -> u16 {
        self.number
    }

    /// The connection-unique key of this channel.
    pub fn key(&self) -> u64 {
        self.key
    }

    /// True once the channel is closed and can be forgotten.
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// The frames written since the last call.
    pub fn output(&mut self) -> &mut Output {
        &mut self.out
    }

    /// The confirm waits started since the last call.
    pub fn take_confirm_waits(&mut self) -> Vec<BoxFuture<'static, Completion>> {
        std::mem::take(&mut self.confirm_waits)
    }

    /// Writes the frames held for after the deliveries queued so far
    /// (basic.cancel-ok), then forgets the consumers those cancelled.
    pub fn flush_deferred(&mut self) {
        for m in std::mem::take(&mut self.deferred) {
            self.send(m);
        }
        let tags: Vec<String> = self
            .consumers
            .iter()
            .filter(|(_, c)| c.cancelled)
            .map(|(t, _)| t.clone())
            .collect();
        for t in tags {
            if let Some(c) = self.consumers.remove(&t) {
                self.cancelled.push((c.id, c.queue));
            }
        }
    }

    fn send(&mut self, method: AMQPClass) {
        codec::write_method(&mut self.out, self.number, method);
    }

    /// Writes a content header and body frames (split at the frame size).
    fn write_content(&mut self, properties: &[u8], body: &bytes::Bytes) {
        codec::write_content(
            &mut self.out,
            self.number,
            properties,
            body,
            self.session.frame_max,
        );
    }

    /// One frame; Err for a connection-level error.
    async fn on_frame(&mut self, frame: InFrame) -> std::result::Result<(), Escalation> {
        let (class_id, method_id) = match &frame {
            InFrame::Method(_, m) => (m.get_amqp_class_id(), m.get_amqp_method_id()),
            _ => (0, 0),
        };
        let r = match frame {
            InFrame::Method(_, m) => self.on_method(m).await,
            InFrame::Header {
                class_id,
                body_size,
                properties,
                raw_properties,
                ..
            } => {
                self.on_content_header(class_id, body_size, properties, raw_properties)
                    .await
            }
            InFrame::Body(_, body) => self.on_content_body(body).await,
            InFrame::Heartbeat(_) => Ok(()),
        };
        r.map_err(|error| Escalation {
            error,
            class_id,
            method_id,
        })
    }

    /// Sends channel.close and marks the channel closing.
    fn close_with(&mut self, code: u16, text: String, class_id: u16, method_id: u16) {
        self.closing = true;
        self.content = None;
        tracing::debug!(ch = self.number, code, %text, "closing channel");
        self.send(AMQPClass::Channel(channel::AMQPMethod::Close(
            channel::Close {
                reply_code: code,
                reply_text: ShortString::from(super::connection::truncate(text)),
                class_id,
                method_id,
            },
        )));
    }

    /// A method frame: channel.close / close-ok end the channel; a channel
    /// error closes the channel; a connection error is returned.
    async fn on_method(&mut self, m: AMQPClass) -> Result<()> {
        let (class_id, method_id) = (m.get_amqp_class_id(), m.get_amqp_method_id());
        match &m {
            AMQPClass::Channel(channel::AMQPMethod::Open(_)) => {
                return Err(ProtocolError::connection(
                    504,
                    "CHANNEL_ERROR - second 'channel.open' seen",
                ));
            }
            AMQPClass::Channel(channel::AMQPMethod::Close(_)) => {
                self.release().await;
                self.send(AMQPClass::Channel(channel::AMQPMethod::CloseOk(
                    channel::CloseOk {},
                )));
                return Ok(());
            }
            AMQPClass::Channel(channel::AMQPMethod::CloseOk(_)) => {
                self.release().await;
                return Ok(());
            }
            _ => {}
        }
        if self.closing {
            return Ok(());
        }
        if self.content.is_some() {
            return Err(ProtocolError::unexpected_frame(
                "expected content header for class 60, got non content header frame instead"
                    .to_string(),
            ));
        }
        match self.dispatch(m).await {
            Err(ProtocolError::Channel { code, text }) => {
                self.close_with(code, text, class_id, method_id);
                Ok(())
            }
            other => other,
        }
    }

    async fn dispatch(&mut self, m: AMQPClass) -> Result<()> {
        match m {
            AMQPClass::Channel(channel::AMQPMethod::Flow(f)) => {
                if !f.active {
                    return Err(ProtocolError::not_implemented("active=false"));
                }
                self.send(AMQPClass::Channel(channel::AMQPMethod::FlowOk(
                    channel::FlowOk { active: f.active },
                )));
                Ok(())
            }
            AMQPClass::Channel(channel::AMQPMethod::FlowOk(_)) => Ok(()),
            AMQPClass::Exchange(em) => self.on_exchange(em).await,
            AMQPClass::Queue(qm) => self.on_queue(qm).await,
            AMQPClass::Basic(bm) => self.on_basic(bm).await,
            AMQPClass::Confirm(confirm::AMQPMethod::Select(s)) => self.on_confirm_select(s),
            AMQPClass::Tx(m) => self.on_tx(m).await,
            AMQPClass::Access(_) => Err(ProtocolError::command_invalid(
                "access class is not supported",
            )),
            _ => Err(ProtocolError::command_invalid("unexpected method")),
        }
    }

    /// The basic class, by method: publish, consume and get, settlements.
    async fn on_basic(&mut self, m: basic::AMQPMethod) -> Result<()> {
        match m {
            basic::AMQPMethod::Qos(q) => {
                if q.global {
                    self.global_prefetch = q.prefetch_count > 0;
                } else {
                    self.prefetch = q.prefetch_count;
                }
                self.send(AMQPClass::Basic(basic::AMQPMethod::QosOk(basic::QosOk {})));
                Ok(())
            }
            basic::AMQPMethod::Publish(p) => {
                self.content = Some(publish::Publishing::new(p));
                Ok(())
            }
            basic::AMQPMethod::Consume(c) => self.on_consume(c).await,
            basic::AMQPMethod::Cancel(c) => self.on_cancel(c).await,
            basic::AMQPMethod::Get(g) => self.on_get(g).await,
            basic::AMQPMethod::Ack(a) => {
                self.settle(a.delivery_tag, a.multiple, Settlement::Ack)
                    .await
            }
            basic::AMQPMethod::Nack(n) => {
                let how = if n.requeue {
                    Settlement::Requeue
                } else {
                    Settlement::Discard
                };
                self.settle(n.delivery_tag, n.multiple, how).await
            }
            basic::AMQPMethod::Reject(r) => {
                let how = if r.requeue {
                    Settlement::Requeue
                } else {
                    Settlement::Discard
                };
                self.settle(r.delivery_tag, false, how).await
            }
            basic::AMQPMethod::Recover(r) => {
                self.recover(r.requeue).await?;
                self.send(AMQPClass::Basic(basic::AMQPMethod::RecoverOk(
                    basic::RecoverOk {},
                )));
                Ok(())
            }
            basic::AMQPMethod::RecoverAsync(r) => self.recover(r.requeue).await,
            _ => Err(ProtocolError::command_invalid("unexpected basic method")),
        }
    }

    /// Proposes `cmd` now, or holds it for tx.commit in tx mode.
    async fn submit(&mut self, queue: Arc<QueueHandle>, cmd: QueueCommand) -> Option<PendingReply> {
        if let Some(held) = self.tx.as_mut() {
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
        let s = &self.session;
        match s.broker.with_topology(|t| {
            t.access()
                .check_resource(&s.user, &s.vhost, kind, name, perm)
        }) {
            Some(Err(e)) => Err(e.into()),
            _ => Ok(()),
        }
    }

    /// A topology change through the meta group; a refusal is the AMQP error
    /// RabbitMQ answers.
    async fn meta(&mut self, cmd: MetaCommand) -> Result<MetaReply> {
        match self.session.broker.meta_write(cmd).await? {
            MetaReply::Error(e) => Err(e.into()),
            r => Ok(r),
        }
    }

    /// Looks a queue up (declared through any node: [`Broker::find_queue`])
    /// and checks exclusive ownership (405 RESOURCE_LOCKED).
    ///
    /// Errors: 404 NOT_FOUND when there is no such queue.
    async fn lookup_queue(&mut self, name: &str) -> Result<(QueueRecord, Arc<QueueHandle>)> {
        self.find_queue(name).await?.ok_or_else(|| {
            ProtocolError::not_found(format!(
                "no queue '{name}' in vhost '{}'",
                self.session.vhost
            ))
        })
    }

    /// [`Channel::lookup_queue`], None when there is no such queue.
    /// `&mut`: the channel is not `Sync`, and the lookup may wait.
    ///
    /// Errors: 405 RESOURCE_LOCKED for another connection's exclusive queue.
    async fn find_queue(&mut self, name: &str) -> Result<Option<(QueueRecord, Arc<QueueHandle>)>> {
        let found = self
            .session
            .broker
            .find_queue(&self.session.vhost, name)
            .await;
        let s = &self.session;
        if found.is_some() {
            if let Some(r) = s
                .broker
                .with_topology(|t| t.check_exclusive_access(&s.vhost, name, s.id))
            {
                r?;
            }
        }
        Ok(found)
    }

    /// An empty queue name means the channel's last declared queue
    /// (AMQP 0-9-1 §1.7.2.1); none yet → 404 as RabbitMQ.
    fn default_queue_name(&self, name: &str) -> Result<String> {
        if !name.is_empty() {
            return Ok(name.to_string());
        }
        self.last_queue
            .clone()
            .ok_or_else(|| ProtocolError::not_found("no previously declared queue"))
    }

    /// Frees the channel: consumers go down (their unacked messages return
    /// to the queue, counted as a delivery attempt, spec §2.3). The channel
    /// has ended afterwards.
    pub async fn release(&mut self) {
        if self.ended {
            return;
        }
        self.ended = true;
        self.content = None;
        let broker = self.session.broker.clone();
        let now_ms = crate::now_ms();
        let mut downs = Vec::new();
        for (_, c) in std::mem::take(&mut self.consumers) {
            self.session.unregister_consumer(c.id);
            downs.push((c.id, c.queue.clone()));
            if !c.cancelled {
                c.queue.remove_consumer(c.exclusive);
                broker.maybe_auto_delete(&c.queue).await;
            }
        }
        downs.extend(std::mem::take(&mut self.cancelled));
        for (_, (id, q)) in std::mem::take(&mut self.get_slots) {
            self.session.unregister_consumer(id);
            downs.push((id, q));
        }
        self.unacked.clear();
        self.unacked_index = None;
        self.timed_out_tags.clear();
        let mut waits = Vec::new();
        for (id, q) in downs {
            waits.push(q.consumer_down(id, now_ms).await);
        }
        for w in waits {
            w.await;
        }
    }
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
