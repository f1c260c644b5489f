//! Handing ready messages to consumers (rabbit_fifo 3.10 `checkout_one`).

use super::machine::QueueMachine;
use super::types::Effect;

impl QueueMachine {
    /// Push ready messages (returns first, then the main queue) to active
    /// consumers with spare prefetch, one at a time in service-queue order
    /// (round-robin), running the
    /// head-only expiry before each. no_ack consumers settle on delivery
    /// (`Deliver` then `DropBody`). Also expires the head when nobody consumes.
    pub(super) fn deliver(&mut self, now_ms: u64, effects: &mut Vec<Effect>) {
        loop {
            self.expire_head(now_ms, effects);
            if self.ready.is_empty() {
                return;
            }
            let next = if self.config().single_active_consumer {
                self.consumers.single_active_for_push()
            } else {
                self.consumers.next_for_push()
            };
            let Some((consumer, no_ack)) = next else {
                return;
            };
            let Some(msg) = self.ready.pop_head() else {
                return;
            };
            effects.push(Effect::Deliver {
                consumer,
                delivery: msg.delivery(),
            });
            if no_ack {
                effects.push(Effect::DropBody { id: msg.id });
                self.consumers.pushed_no_ack(consumer);
            } else {
                self.consumers.check_out(consumer, msg, now_ms);
            }
        }
    }
}
