//! Deliveries this channel settled recently, so that a new queue leader's
//! re-sends of them, and a deposed leader's late originals, are dropped. A new leader re-sends every message still
//! checked out in its state (`QueueMachine::leader_effects`); one the client
//! already acked, whose `Settle` was not yet committed when the leader
//! changed, would otherwise reach the client again as a fresh delivery
//! (`redelivered` false): a duplicate RabbitMQ does not produce (issue 29
//! item 4: the fault suite's consumer-side duplicates). Likewise a deposed
//! leader's original delivery, held up by a partition, can arrive after the
//! new leader's re-send was acked. The settlement itself is retried until a
//! leader commits it (`QueueHandle::keep_proposing`).
//!
//! Keyed by (consumer, message id, delivery count): a message that was
//! returned (nack/reject requeue) and delivered again carries a higher
//! delivery count, so its later re-sends are not mistaken for the settled
//! delivery. Bounded by age and count: re-sends follow a leader change
//! within about a second.

use std::collections::{HashSet, VecDeque};
use std::time::{Duration, Instant};

use crate::queue::types::{ConsumerId, MsgId};

/// How long a settled delivery is remembered.
const KEEP: Duration = Duration::from_secs(10);
/// At most this many are remembered per channel (the oldest go first).
const MAX: usize = 16_384;

/// A settled delivery: consumer (or basic.get slot), message id in its
/// queue, delivery count when it was delivered.
pub(super) type SettledKey = (ConsumerId, MsgId, u32);

/// The settled deliveries of the last [`KEEP`], at most [`MAX`].
#[derive(Default)]
pub(super) struct RecentSettles {
    order: VecDeque<(Instant, SettledKey)>,
    keys: HashSet<SettledKey>,
}

impl RecentSettles {
    /// Remembers `key` as settled now.
    pub fn insert(&mut self, key: SettledKey) {
        let now = Instant::now();
        self.expire(now);
        if self.keys.insert(key) {
            self.order.push_back((now, key));
        }
        while self.order.len() > MAX {
            if let Some((_, k)) = self.order.pop_front() {
                self.keys.remove(&k);
            }
        }
    }

    /// Whether `key` was settled within [`KEEP`].
    pub fn contains(&mut self, key: &SettledKey) -> bool {
        self.expire(Instant::now());
        self.keys.contains(key)
    }

    /// Forgets what was settled more than [`KEEP`] before `now`.
    fn expire(&mut self, now: Instant) {
        while let Some((t, k)) = self.order.front() {
            if now.duration_since(*t) < KEEP {
                break;
            }
            self.keys.remove(k);
            self.order.pop_front();
        }
        if self.order.is_empty() && self.keys.capacity() > 64 {
            self.keys = HashSet::new();
            self.order = VecDeque::new();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(msg: MsgId, count: u32) -> SettledKey {
        (
            ConsumerId {
                node: 1,
                epoch: 1,
                seq: 1,
            },
            msg,
            count,
        )
    }

    #[test]
    fn a_settled_delivery_is_remembered_with_its_delivery_count() {
        let mut r = RecentSettles::default();
        r.insert(key(7, 0));
        assert!(r.contains(&key(7, 0)));
        assert!(!r.contains(&key(7, 1)), "delivered again after a return");
        assert!(!r.contains(&key(8, 0)));
    }

    #[test]
    fn the_oldest_go_beyond_the_bound() {
        let mut r = RecentSettles::default();
        for m in 0..(MAX as u64 + 10) {
            r.insert(key(m, 0));
        }
        assert!(!r.contains(&key(0, 0)));
        assert!(!r.contains(&key(9, 0)));
        assert!(r.contains(&key(10, 0)));
        assert!(r.contains(&key(MAX as u64 + 9, 0)));
        assert_eq!(r.keys.len(), MAX);
    }
}
