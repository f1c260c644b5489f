//! The queue state value and its single entry point, `apply`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::consumers::Consumers;
use super::dead_letter::HeldArea;
use super::dedup::DedupTable;
use super::delayed::DelayedArea;
use super::messages::ReadyQueue;
use super::types::{
    ConsumerId, Delivery, Effect, ProposerId, QueueCommand, QueueConfig, QueueReply,
};

/// The replicated state of one quorum queue (RabbitMQ 3.10 `rabbit_fifo` +
/// `rabbit_fifo_dlx`, spec §2, §5, §6).
///
/// Pure and deterministic: no I/O, clock or randomness; time comes only from
/// the commands' `now_ms`; all collections are ordered, so replaying the same
/// commands on any replica gives the same state and effects. Payloads are
/// never kept: each accepted message leaves at once in `Effect::StoreBody` and
/// the machine keeps a 24-byte index (id, expiry, body size, delivery count
/// and message priority).
///
/// Design choices where the spec is open (see also the method docs):
/// - Negative `delivery_limit` = unlimited (spec §6.1 says not to copy 3.10).
/// - At-least-once is in effect only with a target and overflow
///   reject-publish; otherwise at-most-once (spec §5.1).
/// - `last_active` (x-expires lease) starts at the first command's `now_ms`
///   and is renewed by basic.get, a consumer leaving (cancel, down, node
///   restart) and `Configure` (3.10, spec §1.6); never by publishing.
/// - Publishers are unblocked when the queue is at or below 80 % of every
///   limit, and also when overflow stops being reject-publish or the limits
///   are removed (3.10 has no such step, spec §1.6; a permanent block is worse).
/// - x-expires: `QueueExpired` needs no consumer *record* at all (3.10
///   `is_expired`): a cancelled consumer or a basic.get slot still holding
///   unacked messages keeps the queue alive. Checked on `Tick` only.
/// - `ExpiryTimer` is emitted when the next timer instant — the head's
///   expiry, the earliest delayed-retry release or the next consumer
///   timeout deadline, whichever is first — is earlier than the last one
///   emitted, or that one is due (not on every command, and not when it
///   only moves later: the armed timer fires first and its `Tick` re-arms),
///   and on every `Tick` if there is one; a new leader arms at
///   `armed_timer_ms()` (`leader_effects`).
/// - Delayed retry (4.3): a delayed message is released to the back of the
///   returns queue by the first command at or past its ready-at (before the
///   head expiry runs), so it expires by TTL only once released (as 4.3,
///   which promotes delayed messages before expiring). Delayed messages
///   count toward the length limits; drop-head takes the earliest delayed
///   one when nothing is ready; purge removes them too (4.3 counts them in
///   the purged total).
/// - Unknown ids, unknown consumers, and settles by the wrong consumer are
///   ignored (spec §2.2).
/// - Consumer timeouts (RabbitMQ 4.3, `consumer_timeout.rs`) are checked
///   before every command at its `now_ms`: a consumer whose oldest unsettled
///   delivery is older than its timeout goes down (all its messages
///   returned, counted) and `ConsumerTimedOut` tells its channel; the
///   `ExpiryTimer` is the earlier of the head's expiry and the next deadline.
/// - Priorities (RabbitMQ consumer priorities; `x-max-priority` as RabbitMQ
///   4.3 allows it on quorum queues): pushes go to the highest consumer
///   priority with spare prefetch; ready messages are served strictly by
///   message priority, and head-only expiry and drop-head work per the
///   README's "Priorities" (expiry checks the head of every priority,
///   drop-head takes the next message to be delivered).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueMachine {
    pub(super) config: QueueConfig,
    /// Id of the next accepted message.
    pub(super) next_id: u64,
    pub(super) ready: ReadyQueue,
    pub(super) consumers: Consumers,
    /// At-least-once dead letters not yet confirmed.
    pub(super) held: HeldArea,
    /// Reject-publish: publishers are blocked.
    pub(super) blocked: bool,
    /// x-expires lease start, ms; None before the first command.
    pub(super) last_active: Option<u64>,
    /// `QueueExpired` was emitted for the current lease.
    pub(super) expired_notified: bool,
    /// The last `ExpiryTimer` emitted (None: none pending).
    pub(super) timer_at: Option<u64>,
    /// Last applied `Deduped` sequence per proposer: at or below it is a
    /// resend (skipped), only the next one applies (gaps are refused).
    /// A proposer's entries go when its node restarts (`NodeRestarted`).
    pub(super) proposers: BTreeMap<ProposerId, u64>,
    /// Delayed-retry messages waiting for their ready-at (RabbitMQ 4.3).
    pub(super) delayed: DelayedArea,
    /// Consumers removed by their consumer timeout whose channel has not
    /// answered yet (`Cancel` or `ConsumerDown`), with the timeout used: a
    /// new leader re-sends `ConsumerTimedOut` for them (`consumer_timeout.rs`).
    pub(super) timed_out: BTreeMap<ConsumerId, u64>,
    /// Per source queue, the forwarded message ids already enqueued that the
    /// source may send again (`EnqueueDeadLetters`, `dedup.rs`).
    pub(super) dedup: DedupTable,
}

impl QueueMachine {
    /// An empty queue with the given effective configuration.
    pub fn new(config: QueueConfig) -> Self {
        QueueMachine {
            config,
            ..QueueMachine::default()
        }
    }

    /// Apply one committed command: returns the reply for the caller and the
    /// effects to carry out (`StoreBody`/`DropBody` on every replica, the rest
    /// on the leader only), in order. After every command the machine expires
    /// the head, delivers to consumers, evaluates the limits; at the end it
    /// emits `ExpiryTimer` if the head's expiry changed. `Batch` applies its
    /// commands in order and replies `Batch` with one reply each.
    pub fn apply(&mut self, cmd: QueueCommand) -> (QueueReply, Vec<Effect>) {
        let mut effects = Vec::new();
        let mut tick = false;
        let now_ms = cmd.latest_now_ms();
        let reply = self.apply_one(cmd, &mut effects, &mut tick);
        self.emit_expiry_timer(tick, now_ms, &mut effects);
        (reply, effects)
    }

    fn apply_one(
        &mut self,
        cmd: QueueCommand,
        effects: &mut Vec<Effect>,
        tick: &mut bool,
    ) -> QueueReply {
        use QueueCommand as C;
        if let Some(now_ms) = cmd.now_ms() {
            // Deadlines passed by now win over what this command does (a
            // late ack is too late).
            self.start_lease(now_ms);
            self.time_out_consumers(now_ms, effects);
        }
        let (now, reply) = match cmd {
            C::Batch(cmds) => {
                return QueueReply::Batch(
                    cmds.into_iter()
                        .map(|c| self.apply_one(c, effects, tick))
                        .collect(),
                );
            }
            C::Deduped { proposer, seq, cmd } => {
                let last = self.proposers.get(&proposer).copied().unwrap_or(0);
                if seq <= last {
                    return QueueReply::Resent;
                }
                if seq != last + 1 {
                    return QueueReply::OutOfSequence;
                }
                self.proposers.insert(proposer, seq);
                return self.apply_one(*cmd, effects, tick);
            }
            C::Enqueue { now_ms, msgs } => {
                self.start_lease(now_ms);
                let msgs = msgs.into_iter().map(|m| (m, 0));
                (
                    now_ms,
                    QueueReply::Enqueued(self.enqueue(now_ms, msgs, effects)),
                )
            }
            C::EnqueuePrioritized { now_ms, msgs } => {
                self.start_lease(now_ms);
                let msgs = msgs.into_iter().map(|m| (m.msg, m.priority));
                (
                    now_ms,
                    QueueReply::Enqueued(self.enqueue(now_ms, msgs, effects)),
                )
            }
            C::EnqueueDeadLetters {
                now_ms,
                source,
                settled_below,
                floor_version,
                msgs,
            } => {
                self.start_lease(now_ms);
                let outcomes = self.enqueue_dead_letters(
                    now_ms,
                    source,
                    settled_below,
                    floor_version,
                    msgs,
                    effects,
                );
                (now_ms, QueueReply::Enqueued(outcomes))
            }
            C::Checkout {
                now_ms,
                consumer,
                prefetch,
                no_ack,
            } => {
                self.start_lease(now_ms);
                self.consumers.checkout(consumer, prefetch, no_ack, 0, None);
                (now_ms, QueueReply::Ok)
            }
            C::Cancel { now_ms, consumer } => {
                self.start_lease(now_ms);
                self.timed_out.remove(&consumer);
                self.cancel(now_ms, consumer);
                (now_ms, QueueReply::Ok)
            }
            C::ConsumerDown { now_ms, consumer } => {
                self.start_lease(now_ms);
                self.timed_out.remove(&consumer);
                self.consumer_down(now_ms, consumer, effects);
                (now_ms, QueueReply::Ok)
            }
            C::NodeRestarted {
                now_ms,
                node,
                epoch,
            } => {
                self.start_lease(now_ms);
                self.proposers
                    .retain(|p, _| p.node != node || p.epoch >= epoch);
                self.forget_timed_out(node, epoch);
                self.node_restarted(now_ms, node, epoch, effects);
                (now_ms, QueueReply::Ok)
            }
            C::NodeDown { now_ms, node } => {
                self.start_lease(now_ms);
                self.node_down(now_ms, node, effects);
                (now_ms, QueueReply::Ok)
            }
            C::NodeUp {
                now_ms,
                node,
                epoch,
            } => {
                self.start_lease(now_ms);
                self.proposers
                    .retain(|p, _| p.node != node || p.epoch >= epoch);
                self.forget_timed_out(node, epoch);
                self.node_up(now_ms, node, epoch, effects);
                (now_ms, QueueReply::Ok)
            }
            C::Settle {
                now_ms,
                consumer,
                ids,
            } => {
                self.start_lease(now_ms);
                self.settle(consumer, ids, effects);
                (now_ms, QueueReply::Ok)
            }
            C::Return {
                now_ms,
                consumer,
                ids,
            } => {
                self.start_lease(now_ms);
                self.return_ids(now_ms, consumer, ids, effects);
                (now_ms, QueueReply::Ok)
            }
            C::Discard {
                now_ms,
                consumer,
                ids,
            } => {
                self.start_lease(now_ms);
                self.discard(consumer, ids, effects);
                (now_ms, QueueReply::Ok)
            }
            C::Dequeue {
                now_ms,
                consumer,
                no_ack,
            } => {
                self.start_lease(now_ms);
                (
                    now_ms,
                    QueueReply::Dequeued(self.dequeue(now_ms, consumer, no_ack, effects)),
                )
            }
            C::Purge { now_ms } => {
                self.start_lease(now_ms);
                (now_ms, QueueReply::Purged(self.purge(effects)))
            }
            C::Tick { now_ms } => {
                self.start_lease(now_ms);
                self.dedup.age(now_ms);
                *tick = true;
                self.after_command(now_ms, effects);
                self.check_queue_expires(now_ms, effects);
                return QueueReply::Ok;
            }
            C::UpdateConfig { now_ms, config } => {
                self.start_lease(now_ms);
                self.replace_config(config.into(), effects);
                self.touch(now_ms);
                (now_ms, QueueReply::Ok)
            }
            C::Configure { now_ms, config } => {
                self.start_lease(now_ms);
                self.replace_config(config, effects);
                self.touch(now_ms);
                (now_ms, QueueReply::Ok)
            }
            C::Subscribe {
                now_ms,
                consumer,
                spec,
            } => {
                self.start_lease(now_ms);
                self.timed_out.remove(&consumer);
                self.consumers.checkout(
                    consumer,
                    spec.prefetch,
                    spec.no_ack,
                    spec.priority,
                    spec.timeout_ms,
                );
                (now_ms, QueueReply::Ok)
            }
            C::Remove { now_ms, ids } => {
                self.start_lease(now_ms);
                (
                    now_ms,
                    QueueReply::Removed(self.remove_ready(&ids, effects)),
                )
            }
            C::DeadLetterSettled { now_ms, ids } => {
                self.start_lease(now_ms);
                self.settle_dead_letters(ids, effects);
                (now_ms, QueueReply::Ok)
            }
        };
        self.after_command(now, effects);
        reply
    }

    /// Leader-only effects that re-create what a leader must be doing for
    /// the current state, for a node that just became leader (a former
    /// leader's deliveries may have been lost in flight, and entries it
    /// proposed were applied here without their effects): `Deliver` for
    /// every checked-out message of an active or cancelled consumer (the
    /// consumer's channel drops copies it already holds), `DeadLetterHeld`
    /// for every held dead letter, `PublishersBlocked` if blocked,
    /// `ConsumerTimedOut` for every timed-out consumer whose channel has not
    /// answered, and the next timer (`ExpiryTimer` at the earlier of the
    /// head's expiry and the next consumer deadline, or the last one emitted
    /// if that is earlier). Pure: the state is not changed.
    pub fn leader_effects(&self) -> Vec<Effect> {
        let mut effects = Vec::new();
        for (consumer, c) in self.consumers.iter() {
            for msg in c.checked_out.values() {
                effects.push(Effect::Deliver {
                    consumer: *consumer,
                    delivery: Delivery {
                        resend: true,
                        ..msg.delivery()
                    },
                });
            }
        }
        for h in self.held.iter() {
            effects.push(Effect::DeadLetterHeld {
                id: h.id,
                reason: h.reason,
            });
        }
        if self.blocked {
            effects.push(Effect::PublishersBlocked(true));
        }
        for (consumer, timeout_ms) in &self.timed_out {
            effects.push(Effect::ConsumerTimedOut {
                consumer: *consumer,
                timeout_ms: *timeout_ms,
            });
        }
        if let Some(at_ms) = self.armed_timer_ms() {
            effects.push(Effect::ExpiryTimer { at_ms });
        }
        effects
    }

    /// The x-expires lease starts with the first command the queue sees.
    fn start_lease(&mut self, now_ms: u64) {
        if self.last_active.is_none() {
            self.last_active = Some(now_ms);
        }
    }

    /// Run after every command (rabbit_fifo 3.10 `checkout/4`; consumers
    /// past their deadline were timed out before it): expire the head and
    /// deliver, then apply the limits, then maybe unblock publishers.
    fn after_command(&mut self, now_ms: u64, effects: &mut Vec<Effect>) {
        self.deliver(now_ms, effects);
        self.evaluate_limits(effects);
        self.maybe_unblock(effects);
    }
}
