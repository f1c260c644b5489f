//! basic.publish into the queue (rabbit_fifo 3.10 `enqueue` + `evaluate_limit`).

use super::machine::QueueMachine;
use super::message::{expiry_at, Msg};
use super::types::{DeadLetterReason, Effect, EnqueueMsg, EnqueueOutcome, Overflow};

impl QueueMachine {
    /// Enqueue each message in turn, exactly as if each were its own command:
    /// refused while publishers are blocked (reject-publish, spec §2.5),
    /// otherwise given the next id, stored (`StoreBody`), appended to the main
    /// queue with its expiry fixed now (spec §2.4), offered to consumers, and
    /// then the limits are evaluated (so the message that goes over the limit
    /// is accepted, the next one is refused; spec §10.5). Each message comes
    /// with its message priority, kept as `min(priority, x-max-priority)`,
    /// or 0 in a queue without `x-max-priority`. With `reject-publish-dlx` a
    /// refused message is also stored and dead-lettered with reason `maxlen`
    /// (held, at-least-once, when the strategy says so).
    pub(super) fn enqueue(
        &mut self,
        now_ms: u64,
        msgs: impl ExactSizeIterator<Item = (EnqueueMsg, u8)>,
        effects: &mut Vec<Effect>,
    ) -> Vec<EnqueueOutcome> {
        let mut outcomes = Vec::with_capacity(msgs.len());
        for (m, priority) in msgs {
            if self.blocked && self.config.overflow != Overflow::RejectPublishDlx {
                outcomes.push(EnqueueOutcome::Rejected);
                continue;
            }
            let id = self.next_id;
            self.next_id += 1;
            let expiry = expiry_at(now_ms, self.config.message_ttl_ms, m.ttl_ms);
            effects.push(Effect::StoreBody {
                id,
                payload: m.payload,
            });
            let priority = self.config.max_priority.map_or(0, |max| priority.min(max));
            let msg = Msg::new(id, expiry, m.body_size, priority);
            if self.blocked {
                self.dead_letter(msg, DeadLetterReason::Maxlen, effects);
                outcomes.push(EnqueueOutcome::Rejected);
                continue;
            }
            self.ready.push_back(msg);
            outcomes.push(EnqueueOutcome::Accepted);
            self.deliver(now_ms, effects);
            self.evaluate_limits(effects);
        }
        outcomes
    }
}
