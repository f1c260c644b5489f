//! basic.get and queue.purge (rabbit_fifo 3.10 dequeue / purge).

use super::machine::QueueMachine;
use super::types::{ConsumerId, Delivery, Effect};

impl QueueMachine {
    /// basic.get: expire the head first (spec §2.4), then take the next ready
    /// message (returns first). no_ack: it is gone (`DropBody` after the
    /// reply's delivery); else it is checked out to `consumer` (an inactive
    /// "get slot" record is created if needed). Renews the x-expires lease.
    /// Returns the delivery and the number of ready messages left.
    pub(super) fn dequeue(
        &mut self,
        now_ms: u64,
        consumer: ConsumerId,
        no_ack: bool,
        effects: &mut Vec<Effect>,
    ) -> Option<(Delivery, u64)> {
        self.touch(now_ms);
        self.expire_head(now_ms, effects);
        let msg = self.ready.pop_head()?;
        let delivery = msg.delivery();
        if no_ack {
            effects.push(Effect::DropBody { id: msg.id });
        } else {
            self.consumers.check_out(consumer, msg, now_ms);
        }
        Some((delivery, self.ready.len() as u64))
    }

    /// queue.purge: drop every ready message, not dead-lettered (spec §2.1),
    /// and every delayed-retry message (4.3 purges and counts them);
    /// checked-out and held messages stay (3.10, spec §5.6). Returns the count.
    pub(super) fn purge(&mut self, effects: &mut Vec<Effect>) -> u64 {
        let mut n = 0;
        for msg in self.ready.drain() {
            effects.push(Effect::DropBody { id: msg.id });
            n += 1;
        }
        for msg in self.delayed.drain() {
            effects.push(Effect::DropBody { id: msg.id });
            n += 1;
        }
        n
    }
}
