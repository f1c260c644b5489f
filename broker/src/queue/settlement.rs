//! What happens to checked-out messages: settle (ack), return (requeue),
//! discard (reject requeue=false), and the consumer going away
//! (spec §2.2, §2.3, §2.8, §6.2; rabbit_fifo 3.10).

use super::delayed::ReturnCause;
use super::machine::QueueMachine;
use super::message::Msg;
use super::types::{ConsumerId, DeadLetterReason, Effect, MsgId};

impl QueueMachine {
    /// The delivery limit in effect. A negative limit counts as unlimited:
    /// 3.10 compares literally (any return exceeds -1), which the spec says
    /// not to copy (§6.1); 4.0+ and the docs treat -1 as "disabled".
    fn delivery_limit(&self) -> Option<u32> {
        self.config
            .delivery_limit
            .and_then(|l| u32::try_from(l).ok())
    }

    /// The single path of every counted return (a message leaving a
    /// consumer for the queue): delivery_count +1, then dead-letter
    /// `delivery_limit` if it is now above the limit (§6.2, checked before
    /// any delay), else park it if delayed retry delays a return of this
    /// `cause` (`delayed`), else make it ready again: a `Failed` return with
    /// no delivery limit goes to the main-queue tail (3.10 `#requeue`, spec
    /// §2.8), every other one to the returns queue (served first).
    pub(super) fn return_msg(
        &mut self,
        mut msg: Msg,
        cause: ReturnCause,
        now_ms: u64,
        effects: &mut Vec<Effect>,
    ) {
        msg.count_return();
        let limit = self.delivery_limit();
        if limit.is_some_and(|l| msg.delivery_count() > l) {
            self.dead_letter(msg, DeadLetterReason::DeliveryLimit, effects);
            return;
        }
        let Some(msg) = self.maybe_delay(msg, cause, now_ms) else {
            return;
        };
        if limit.is_none() && cause == ReturnCause::Failed {
            self.ready.push_back(msg);
        } else {
            self.ready.push_return(msg);
        }
    }

    /// basic.ack: forget the messages; ids not checked out to `consumer` are ignored.
    pub(super) fn settle(
        &mut self,
        consumer: ConsumerId,
        ids: Vec<MsgId>,
        effects: &mut Vec<Effect>,
    ) {
        for id in ids {
            if self.consumers.take(consumer, id).is_some() {
                effects.push(Effect::DropBody { id });
            }
        }
        self.consumers.gc(consumer);
    }

    /// nack/reject requeue=true, basic.recover: counted returns in the order
    /// given. No delivery limit: to the back of the main queue (3.10 `#requeue`,
    /// spec §2.8); with a limit: to the returns queue.
    pub(super) fn return_ids(
        &mut self,
        now_ms: u64,
        consumer: ConsumerId,
        ids: Vec<MsgId>,
        effects: &mut Vec<Effect>,
    ) {
        for id in ids {
            if let Some(msg) = self.consumers.take(consumer, id) {
                self.return_msg(msg, ReturnCause::Failed, now_ms, effects);
            }
        }
        self.consumers.gc(consumer);
    }

    /// nack/reject requeue=false: dead-letter `rejected` in the order given (spec §2.2).
    pub(super) fn discard(
        &mut self,
        consumer: ConsumerId,
        ids: Vec<MsgId>,
        effects: &mut Vec<Effect>,
    ) {
        for id in ids {
            if let Some(msg) = self.consumers.take(consumer, id) {
                self.dead_letter(msg, DeadLetterReason::Rejected, effects);
            }
        }
        self.consumers.gc(consumer);
    }

    /// basic.cancel: no more pushes; checked-out messages stay with the
    /// consumer (spec §2.3, §10.9). Renews the x-expires lease.
    pub(super) fn cancel(&mut self, now_ms: u64, consumer: ConsumerId) {
        if self.consumers.cancel(consumer) {
            self.touch(now_ms);
        }
    }

    /// Channel closed or crashed: every checked-out message is returned in id
    /// order to the returns queue, counted (may hit the delivery limit), and
    /// the consumer is removed (spec §2.3, §10.8). Renews the x-expires lease.
    pub(super) fn consumer_down(
        &mut self,
        now_ms: u64,
        consumer: ConsumerId,
        effects: &mut Vec<Effect>,
    ) {
        let Some(rec) = self.consumers.remove(consumer) else {
            return;
        };
        for msg in rec.checked_out.into_values() {
            self.return_msg(msg, ReturnCause::ConsumerGone, now_ms, effects);
        }
        self.touch(now_ms);
    }

    /// Node `node` restarted with boot `epoch`: its consumers of older
    /// epochs are down, handled in consumer-id order.
    pub(super) fn node_restarted(
        &mut self,
        now_ms: u64,
        node: u64,
        epoch: u32,
        effects: &mut Vec<Effect>,
    ) {
        for consumer in self.consumers.of_node_before(node, epoch) {
            self.consumer_down(now_ms, consumer, effects);
        }
    }

    /// Node `node` is down as the leader sees it: every consumer of it is
    /// suspected (no pushes) and everything checked out to its records is
    /// returned in consumer-id, then message-id order, counted; records
    /// that only held messages (cancelled consumers, basic.get slots) go.
    /// rabbit_fifo 3.10 `{down, Pid, noconnection}` + `return_all`. Renews
    /// the x-expires lease when anything changed.
    pub(super) fn node_down(&mut self, now_ms: u64, node: u64, effects: &mut Vec<Effect>) {
        let mut changed = false;
        for consumer in self.consumers.of_node(node) {
            let Some(rec) = self.consumers.get(&consumer) else {
                continue;
            };
            if rec.suspected {
                continue;
            }
            changed = true;
            let ids: Vec<MsgId> = rec.checked_out.keys().copied().collect();
            self.consumers.set_suspected(consumer, true);
            for id in ids {
                if let Some(msg) = self.consumers.take(consumer, id) {
                    self.return_msg(msg, ReturnCause::ConsumerGone, now_ms, effects);
                }
            }
            self.consumers.gc(consumer);
        }
        if changed {
            self.touch(now_ms);
        }
    }

    /// Node `node` is reachable in boot `epoch`: its consumers of earlier
    /// boots are down ([`QueueMachine::node_restarted`]), its suspected
    /// consumers of this boot take pushes again (rabbit_fifo `{nodeup, Node}`).
    pub(super) fn node_up(
        &mut self,
        now_ms: u64,
        node: u64,
        epoch: u32,
        effects: &mut Vec<Effect>,
    ) {
        self.node_restarted(now_ms, node, epoch, effects);
        for consumer in self.consumers.of_node(node) {
            if self.consumers.get(&consumer).is_some_and(|r| r.suspected) {
                self.consumers.set_suspected(consumer, false);
            }
        }
    }
}
