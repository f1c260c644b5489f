//! Data types of the quorum-queue state machine: commands in, replies and
//! effects out. Serde-encoded into the Raft log (bincode 2), so every type here
//! is part of the on-disk format: add variants, never change old ones.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// Id of a message inside one queue: assigned by the machine from a counter
/// at enqueue (deterministic), unique for the queue's lifetime, increasing.
pub type MsgId = u64;

/// A consumer (or a channel's basic.get slot) attached to a queue.
/// `node` = node id the channel lives on, `epoch` = that node's boot counter
/// (a restarted node has a higher epoch, so consumers of older epochs are
/// known dead), `seq` = node-local counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ConsumerId {
    pub node: u64,
    pub epoch: u32,
    pub seq: u32,
}

/// One message offered to the queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnqueueMsg {
    /// Opaque encoded message (exchange, routing keys, properties, body); the
    /// machine never looks inside, it hands it back in `Effect::StoreBody`.
    /// Decoded from the WAL or an append as a slice of that buffer (no copy
    /// of a big body; `raft_log::codec::shared_bytes`).
    #[serde(with = "raft_log::codec::shared_bytes")]
    pub payload: Bytes,
    /// Body size in bytes, counted toward `max_length_bytes` (RabbitMQ 3.x: body bytes).
    pub body_size: u32,
    /// Per-message TTL in ms from the `expiration` property, already parsed.
    pub ttl_ms: Option<u64>,
}

/// One message offered to a queue together with its message priority (the
/// `priority` basic property; 0 when absent). The queue keeps it under
/// `min(priority, x-max-priority)`, or 0 when it has no `x-max-priority`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrioritizedMsg {
    pub msg: EnqueueMsg,
    pub priority: u8,
}

/// Overflow behaviour (`x-overflow`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum Overflow {
    /// Dead-letter (`maxlen`) from the head until within the limits.
    #[default]
    DropHead,
    /// Over the limit, refuse publishes (basic.nack) until at or below 80 %.
    RejectPublish,
    /// As `RejectPublish`, and each refused publish is also dead-lettered
    /// with reason `maxlen` (RabbitMQ's classic-queue `reject-publish-dlx`;
    /// 3.10.8 quorum queues map it to drop-head, rabbitmq-server#16673).
    RejectPublishDlx,
}

impl Overflow {
    /// Refuses publishes over the limit (`reject-publish` or `reject-publish-dlx`).
    pub fn rejects_publish(self) -> bool {
        matches!(self, Overflow::RejectPublish | Overflow::RejectPublishDlx)
    }
}

/// Effective dead-letter strategy (spec §5.1): `AtLeastOnce` only when the
/// caller resolved `x-dead-letter-strategy=at-least-once` with overflow
/// `reject-publish`; otherwise `AtMostOnce`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum DeadLetterStrategy {
    #[default]
    AtMostOnce,
    AtLeastOnce,
}

/// Where dead-lettered messages go.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetterTarget {
    /// Exchange name; "" = default exchange.
    pub exchange: String,
    /// `x-dead-letter-routing-key`; None = use the message's own routing keys.
    pub routing_key: Option<String>,
}

/// Effective queue configuration (arguments merged with policy by the caller).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct QueueConfig {
    /// None = dead-lettering disabled: such messages are just dropped.
    pub dead_letter: Option<DeadLetterTarget>,
    pub strategy: DeadLetterStrategy,
    pub overflow: Overflow,
    /// Max ready (+ held dead-letter) messages; None = unlimited.
    pub max_length: Option<u64>,
    /// Max ready (+ held) body bytes; None = unlimited.
    pub max_length_bytes: Option<u64>,
    /// Queue message TTL (ms), `x-message-ttl`.
    pub message_ttl_ms: Option<u64>,
    /// `x-delivery-limit`; None = unlimited (RabbitMQ 3.10 default).
    pub delivery_limit: Option<i64>,
    /// Queue TTL (ms), `x-expires`.
    pub expires_ms: Option<u64>,
    /// `x-single-active-consumer`: only the oldest active consumer gets
    /// deliveries; the next one takes over when it leaves.
    pub single_active_consumer: bool,
    /// `x-max-priority`: message priorities 0..=max are delivered strictly
    /// highest first (FIFO within one); None = one FIFO (RabbitMQ 4.3
    /// quorum queues allow 1–32; classic queues 1–255).
    pub max_priority: Option<u8>,
    /// Delayed retry (RabbitMQ 4.3 `x-delayed-retry-*`, policy
    /// `delayed-retry-*`): which returns wait before the message is ready again.
    pub delayed_retry: DelayedRetry,
    /// Consumer timeout of the queue, ms (`x-consumer-timeout` argument or
    /// policy `consumer-timeout`, the smaller of both); None = the node's
    /// `consumer_timeout` setting applies (the channel passes it per consumer).
    pub consumer_timeout_ms: Option<u64>,
}

/// Which returns delayed retry delays (RabbitMQ 4.3 `x-delayed-retry-type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum DelayedRetryType {
    /// No delay: a returned message is ready at once (the default).
    #[default]
    Disabled,
    /// Every return is delayed.
    All,
    /// Returns by basic.reject / basic.nack with requeue.
    Failed,
    /// Returns caused by the consumer going away (channel or connection
    /// closed, consumer timeout, node down).
    Returned,
}

/// Delayed retry settings: a returned message of the given kind is ready
/// again `min(min_ms × n, max_ms)` ms later, n = its delivery count after
/// the return (RabbitMQ 4.3, rabbitmq-server PR 13885).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct DelayedRetry {
    pub kind: DelayedRetryType,
    /// `x-delayed-retry-min`, ms.
    pub min_ms: u64,
    /// `x-delayed-retry-max`, ms.
    pub max_ms: u64,
}

/// The shape `QueueConfig` had up to snapshot format 0, as old `UpdateConfig`
/// log entries carry it. Frozen: never change it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct QueueConfigV0 {
    pub dead_letter: Option<DeadLetterTarget>,
    pub strategy: DeadLetterStrategy,
    pub overflow: Overflow,
    pub max_length: Option<u64>,
    pub max_length_bytes: Option<u64>,
    pub message_ttl_ms: Option<u64>,
    pub delivery_limit: Option<i64>,
    pub expires_ms: Option<u64>,
    pub single_active_consumer: bool,
}

impl From<QueueConfigV0> for QueueConfig {
    fn from(c: QueueConfigV0) -> Self {
        QueueConfig {
            dead_letter: c.dead_letter,
            strategy: c.strategy,
            overflow: c.overflow,
            max_length: c.max_length,
            max_length_bytes: c.max_length_bytes,
            message_ttl_ms: c.message_ttl_ms,
            delivery_limit: c.delivery_limit,
            expires_ms: c.expires_ms,
            single_active_consumer: c.single_active_consumer,
            ..QueueConfig::default()
        }
    }
}

/// A consumer's options (`Subscribe`): basic.consume's prefetch and no-ack
/// and its arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ConsumerSpec {
    /// Max messages checked out at once; 0 = unlimited (basic.qos).
    pub prefetch: u32,
    /// Settle on delivery.
    pub no_ack: bool,
    /// `x-priority` (RabbitMQ consumer priorities; default 0, higher first).
    pub priority: i32,
    /// Consumer timeout in ms for this consumer's deliveries, as the channel
    /// resolved it (`x-consumer-timeout` argument, else the queue's, else
    /// the node's `consumer_timeout`); None = no timeout.
    pub timeout_ms: Option<u64>,
}

/// Why a message was dead-lettered (x-death `reason`, spec §2.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DeadLetterReason {
    Rejected,
    Expired,
    Maxlen,
    DeliveryLimit,
}

impl DeadLetterReason {
    /// The reason as written in x-death (`rejected`, `expired`, `maxlen`, `delivery_limit`).
    pub fn as_str(self) -> &'static str {
        match self {
            DeadLetterReason::Rejected => "rejected",
            DeadLetterReason::Expired => "expired",
            DeadLetterReason::Maxlen => "maxlen",
            DeadLetterReason::DeliveryLimit => "delivery_limit",
        }
    }
}

/// Commands applied through Raft. Time (`now_ms`, ms since the Unix epoch)
/// is stamped by the proposer; the machine never reads a clock.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum QueueCommand {
    /// basic.publish of one or more messages (a batch of publishes).
    Enqueue { now_ms: u64, msgs: Vec<EnqueueMsg> },
    /// basic.consume: attach a consumer. `prefetch` 0 = unlimited; `no_ack`
    /// = settle on delivery.
    Checkout {
        now_ms: u64,
        consumer: ConsumerId,
        prefetch: u32,
        no_ack: bool,
    },
    /// basic.cancel: stop delivering; its unacked messages stay checked out
    /// to it and can still be settled/returned/discarded (spec §2.3, §10).
    Cancel { now_ms: u64, consumer: ConsumerId },
    /// Channel/connection closed or crashed: return every checked-out message
    /// (delivery count +1, maybe delivery_limit) and remove the consumer.
    ConsumerDown { now_ms: u64, consumer: ConsumerId },
    /// Node `node` restarted with boot `epoch`: every consumer of that node
    /// with an older epoch is down (as `ConsumerDown`).
    NodeRestarted { now_ms: u64, node: u64, epoch: u32 },
    /// basic.ack: remove these checked-out messages.
    Settle {
        now_ms: u64,
        consumer: ConsumerId,
        ids: Vec<MsgId>,
    },
    /// basic.nack/reject requeue=true, basic.recover: make them ready again.
    Return {
        now_ms: u64,
        consumer: ConsumerId,
        ids: Vec<MsgId>,
    },
    /// basic.nack/reject requeue=false: dead-letter with reason `rejected`.
    Discard {
        now_ms: u64,
        consumer: ConsumerId,
        ids: Vec<MsgId>,
    },
    /// basic.get: take the next ready message for `consumer` (the channel's
    /// get slot); `no_ack` settles it at once.
    Dequeue {
        now_ms: u64,
        consumer: ConsumerId,
        no_ack: bool,
    },
    /// queue.purge: drop every ready message (not dead-lettered, spec §2.1).
    Purge { now_ms: u64 },
    /// Periodic leader tick: expire messages at the head, check x-expires.
    Tick { now_ms: u64 },
    /// Arguments/policy changed: new effective configuration, in the shape
    /// of snapshot format 0 (old log entries; new proposals use `Configure`).
    UpdateConfig { now_ms: u64, config: QueueConfigV0 },
    /// At-least-once: these held dead-letter messages were committed by all
    /// their targets; remove them (rabbit_fifo_dlx `settle`).
    DeadLetterSettled { now_ms: u64, ids: Vec<MsgId> },
    /// Several commands applied in order as one Raft entry (group commit).
    Batch(Vec<QueueCommand>),
    /// `cmd` as proposed by `proposer`'s `seq`-th proposal to this queue. A
    /// proposal whose reply was lost (leader change, dropped connection) is
    /// resent with the same `seq`; the machine applies a proposer's sequences
    /// strictly in order, each once (rabbit_fifo 3.10 enqueuer `next_seqno`):
    /// at or below the last applied one is a resend (`Resent`, not applied
    /// again), above the next one is out of sequence (`OutOfSequence`, not
    /// applied: an earlier proposal is missing from the log, and the proposer
    /// resends this one after it). Without the second rule a proposal that
    /// a leader refused while later ones were accepted was answered as a
    /// resend and never applied (a confirmed publish lost; fault suite).
    Deduped {
        proposer: ProposerId,
        seq: u64,
        cmd: Box<QueueCommand>,
    },
    /// The leader's failure detector lost node `node` (killed, paused or
    /// partitioned away): its consumers are suspected down — they get no
    /// pushes, and every message checked out to them (and to its basic.get
    /// slots and cancelled consumers) is returned, counted (delivery count
    /// +1, maybe `delivery_limit`). rabbit_fifo 3.10 `{down, Pid,
    /// noconnection}`: mark suspected, `return_all`.
    NodeDown { now_ms: u64, node: u64 },
    /// Node `node` is reachable again in boot `epoch`: its suspected
    /// consumers of that boot take pushes again (rabbit_fifo `{nodeup,
    /// Node}`); its consumers of earlier boots are down (as `NodeRestarted`).
    NodeUp { now_ms: u64, node: u64, epoch: u32 },
    /// Arguments/policy changed: new effective configuration (supersedes
    /// `UpdateConfig`).
    Configure { now_ms: u64, config: QueueConfig },
    /// basic.consume with its options (supersedes `Checkout`): attach a
    /// consumer or update it and re-activate it.
    Subscribe {
        now_ms: u64,
        consumer: ConsumerId,
        spec: ConsumerSpec,
    },
    /// basic.publish of messages that carry a message priority, for a queue
    /// with `x-max-priority` (otherwise as `Enqueue`, which stays the form
    /// of every message without one; build with [`QueueCommand::enqueue`]).
    EnqueuePrioritized {
        now_ms: u64,
        msgs: Vec<PrioritizedMsg>,
    },
    /// Operator redrive (`quorumqctl redrive`, as RabbitMQ's "move messages"
    /// and SQS `StartMessageMoveTask`): remove these messages if they are
    /// still ready, after their copies were committed in their destination.
    /// Ids not ready (checked out, held, delayed, gone, unknown) are left
    /// alone. Nothing is dead-lettered; each removed body is dropped
    /// (`DropBody`, in delivery order). Replies `Removed(n)`.
    Remove { now_ms: u64, ids: Vec<MsgId> },
    /// Messages another queue (`source`) forwards at-least-once and may send
    /// again — dead letters from the at-least-once worker, or any move
    /// between queues that resends until the destination commits — enqueued
    /// effectively once: the machine keeps a replicated de-duplication
    /// window per source (`dedup.rs`) and answers a message whose (`source`,
    /// id) is in it `Accepted` without enqueueing it again. Reply:
    /// `Enqueued`, one outcome per message, as `EnqueuePrioritized`.
    ///
    /// `source` is the source queue's Raft group id (fresh per queue
    /// incarnation, never reused), each id that queue's own message id.
    /// `settled_below` (the *floor*) says every id below it the source ever
    /// forwarded is settled there: the window forgets them, and a copy of
    /// one is answered `Accepted` without being enqueued (a stale resend).
    /// `floor_version` orders floors of one source (it grows whenever the
    /// floor may go down): a higher one replaces the floor, an equal one
    /// raises it, a lower one (a sender that read the source's state before
    /// a newer one did: a deposed leader's worker) is ignored. The window is bounded
    /// (`dedup::MAX_IDS_PER_SOURCE`, `dedup::MAX_IDS`; past them its lowest
    /// ids are forgotten: at-least-once again for them), and a source that
    /// sent nothing for `dedup::SOURCE_IDLE_MS` is forgotten (a deleted
    /// queue). A sender that cannot name a floor passes 0 and 0 (never
    /// prunes; only the bounds apply). Added for issue 29 item 4; old
    /// binaries cannot decode it (upgrade every node first).
    EnqueueDeadLetters {
        now_ms: u64,
        source: u64,
        settled_below: MsgId,
        floor_version: u64,
        msgs: Vec<(MsgId, PrioritizedMsg)>,
    },
}

impl QueueCommand {
    /// basic.publish of `msgs`: `EnqueuePrioritized` when some message has a
    /// priority above 0, else the plain `Enqueue` (the log entry every
    /// version reads; priority 0 and no priority are the same).
    pub fn enqueue(now_ms: u64, msgs: Vec<PrioritizedMsg>) -> QueueCommand {
        if msgs.iter().any(|m| m.priority > 0) {
            QueueCommand::EnqueuePrioritized { now_ms, msgs }
        } else {
            QueueCommand::Enqueue {
                now_ms,
                msgs: msgs.into_iter().map(|m| m.msg).collect(),
            }
        }
    }

    /// The command's time; None for `Batch` and `Deduped` (their commands
    /// carry it).
    pub fn now_ms(&self) -> Option<u64> {
        use QueueCommand as C;
        match self {
            C::Enqueue { now_ms, .. }
            | C::EnqueuePrioritized { now_ms, .. }
            | C::EnqueueDeadLetters { now_ms, .. }
            | C::Checkout { now_ms, .. }
            | C::Cancel { now_ms, .. }
            | C::ConsumerDown { now_ms, .. }
            | C::NodeRestarted { now_ms, .. }
            | C::Settle { now_ms, .. }
            | C::Return { now_ms, .. }
            | C::Discard { now_ms, .. }
            | C::Dequeue { now_ms, .. }
            | C::Purge { now_ms }
            | C::Tick { now_ms }
            | C::UpdateConfig { now_ms, .. }
            | C::DeadLetterSettled { now_ms, .. }
            | C::NodeDown { now_ms, .. }
            | C::NodeUp { now_ms, .. }
            | C::Configure { now_ms, .. }
            | C::Subscribe { now_ms, .. }
            | C::Remove { now_ms, .. } => Some(*now_ms),
            C::Batch(_) | C::Deduped { .. } => None,
        }
    }

    /// The latest time among the command and the commands it wraps
    /// (`Batch`, `Deduped`), ms; None for an empty batch.
    pub fn latest_now_ms(&self) -> Option<u64> {
        match self {
            QueueCommand::Batch(cmds) => cmds.iter().filter_map(QueueCommand::latest_now_ms).max(),
            QueueCommand::Deduped { cmd, .. } => cmd.latest_now_ms(),
            c => c.now_ms(),
        }
    }

    /// Message bytes the command carries (encoded publishes), to bound a
    /// folded Raft entry by size; other commands count 0.
    pub fn payload_bytes(&self) -> usize {
        match self {
            QueueCommand::Enqueue { msgs, .. } => msgs.iter().map(|m| m.payload.len()).sum(),
            QueueCommand::EnqueuePrioritized { msgs, .. } => {
                msgs.iter().map(|m| m.msg.payload.len()).sum()
            }
            QueueCommand::EnqueueDeadLetters { msgs, .. } => {
                msgs.iter().map(|(_, m)| m.msg.payload.len()).sum()
            }
            QueueCommand::Batch(cmds) => cmds.iter().map(QueueCommand::payload_bytes).sum(),
            QueueCommand::Deduped { cmd, .. } => cmd.payload_bytes(),
            _ => 0,
        }
    }
}

/// Who proposes to a queue: one proposer per (node, boot epoch) and queue,
/// the node's queue reference (cluster issue §6: publishing node, channel
/// epoch, sequence).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ProposerId {
    pub node: u64,
    pub epoch: u32,
}

/// Outcome for one message of an `Enqueue`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EnqueueOutcome {
    /// Stored (and committed, once the reply is seen).
    Accepted,
    /// Refused: overflow `reject-publish` and the queue is over its limit.
    /// The publisher gets basic.nack in confirm mode.
    Rejected,
}

/// A message handed to a consumer or to basic.get.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivery {
    pub id: MsgId,
    /// Returns so far (RabbitMQ 3.10 `delivery_count`); redelivered = count > 0.
    pub delivery_count: u32,
    /// Filled by the host (not the machine) with the stored payload.
    #[serde(with = "raft_log::codec::shared_bytes_opt")]
    pub payload: Option<Bytes>,
    /// A new leader re-issues this delivery (`QueueMachine::leader_effects`):
    /// the consumer's channel may already hold it.
    pub resend: bool,
}

/// Reply to a command (one per command; `Batch` gives `Batch`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub enum QueueReply {
    #[default]
    Ok,
    Enqueued(Vec<EnqueueOutcome>),
    /// basic.get: the message and the number of ready messages left.
    Dequeued(Option<(Delivery, u64)>),
    /// Number of messages purged.
    Purged(u64),
    Batch(Vec<QueueReply>),
    /// A `Deduped` resend of a proposal already applied: nothing was done
    /// again. The proposer answers its callers as if the first copy's reply
    /// had arrived (messages accepted; see `QueueReply::for_resend`).
    Resent,
    /// A `Deduped` proposal that skipped a sequence number of its proposer:
    /// nothing was done; the proposer resends it once the earlier one is in.
    OutOfSequence,
    /// `Remove`: the number of ready messages removed.
    Removed(u64),
}

impl QueueReply {
    /// The reply a caller gets when its proposal turned out to be a resend of
    /// one already applied (its first reply was lost): `Enqueued` with every
    /// message accepted (the first copy was applied; a reject-publish refusal
    /// of that copy cannot be recovered and is reported as accepted),
    /// `Dequeued(None)` for a basic.get (the message taken then is returned
    /// when the channel's get slot goes down), `Ok` otherwise.
    pub fn for_resend(cmd: &QueueCommand) -> QueueReply {
        match cmd {
            QueueCommand::Enqueue { msgs, .. } => {
                QueueReply::Enqueued(vec![EnqueueOutcome::Accepted; msgs.len()])
            }
            QueueCommand::EnqueuePrioritized { msgs, .. } => {
                QueueReply::Enqueued(vec![EnqueueOutcome::Accepted; msgs.len()])
            }
            QueueCommand::EnqueueDeadLetters { msgs, .. } => {
                QueueReply::Enqueued(vec![EnqueueOutcome::Accepted; msgs.len()])
            }
            QueueCommand::Dequeue { .. } => QueueReply::Dequeued(None),
            QueueCommand::Purge { .. } => QueueReply::Purged(0),
            QueueCommand::Remove { .. } => QueueReply::Removed(0),
            QueueCommand::Batch(cmds) => {
                QueueReply::Batch(cmds.iter().map(QueueReply::for_resend).collect())
            }
            QueueCommand::Deduped { cmd, .. } => QueueReply::for_resend(cmd),
            _ => QueueReply::Ok,
        }
    }
}

/// Side effects, as data. `StoreBody`/`DropBody` are carried out by every
/// replica (they maintain the body store); the rest only by the leader.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Effect {
    /// Persist the payload of a newly enqueued message under `id`.
    StoreBody { id: MsgId, payload: Bytes },
    /// The message is gone for good: delete its payload. Always emitted after
    /// any effect that still needs the payload (Deliver, DeadLetter).
    DropBody { id: MsgId },
    /// Send message `id` to `consumer`.
    Deliver {
        consumer: ConsumerId,
        delivery: Delivery,
    },
    /// At-most-once: publish the rewritten message to `target` now (leader),
    /// then the message is dropped (a `DropBody` follows).
    DeadLetter {
        id: MsgId,
        reason: DeadLetterReason,
        target: DeadLetterTarget,
    },
    /// A message was dead-lettered for `reason`; `strategy` is how (None: the queue has no
    /// dead-letter exchange, so it was dropped). Only counted (metrics); the effects that
    /// move or drop it follow.
    DeadLettered {
        reason: DeadLetterReason,
        strategy: Option<DeadLetterStrategy>,
    },
    /// At-least-once: the message was moved into the dead-letter area; the
    /// leader's worker must forward it and then propose `DeadLetterSettled`.
    DeadLetterHeld { id: MsgId, reason: DeadLetterReason },
    /// The queue went over its limit with reject-publish (publishers blocked)
    /// or fell to <= 80 % again (unblocked).
    PublishersBlocked(bool),
    /// x-expires elapsed with no consumers and no basic.get: delete the queue
    /// (its messages are NOT dead-lettered, spec §2.4).
    QueueExpired,
    /// The leader should propose a `Tick` at `at_ms` (one timer per queue):
    /// the head of the ready queue expires then (spec §2.4), the earliest
    /// delayed-retry message is due, or the next consumer timeout deadline
    /// is, whichever is first.
    ExpiryTimer { at_ms: u64 },
    /// `consumer` held a delivery unsettled past its consumer timeout
    /// (`timeout_ms`): its messages were returned and it was removed. Its
    /// channel sends basic.cancel (consumer_cancel_notify) or closes with 406
    /// (RabbitMQ 4.3); it answers with `Cancel` or `ConsumerDown`, until then
    /// a new leader re-sends this.
    ConsumerTimedOut {
        consumer: ConsumerId,
        timeout_ms: u64,
    },
}
