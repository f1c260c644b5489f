//! Deliveries this channel saw lately, kept for a while to drop second
//! copies that a leader change can produce (issue 29 item 4: the fault
//! suite's consumer-side duplicates). Two sets of this shape live on a channel:
//!
//! - **settled**: deliveries the client acked, nacked or rejected. A new
//!   queue leader re-sends every message still checked out in its state
//!   (`QueueMachine::leader_effects`); one whose `Settle` was not yet
//!   committed when the leader changed would otherwise reach the client again
//!   as a fresh delivery (`redelivered` false), a duplicate RabbitMQ does not
//!   produce. Likewise a deposed leader's original delivery, held up by a
//!   partition, can arrive after the new leader's re-send was acked. The
//!   settlement itself is retried until a leader commits it
//!   (`QueueHandle::keep_proposing`).
//! - **re-sent**: a new leader's re-sends the channel passed on. A deposed
//!   leader's original of the same delivery, arriving after the re-send
//!   (before or after it is settled), is the same delivery a second time.
//!
//! Keyed by (consumer, message id, delivery count): a message that was
//! returned (nack/reject requeue) and delivered again carries a higher
//! delivery count, so its later deliveries are not mistaken for the one
//! remembered. Bounded by age and count: re-sends and late originals follow a
//! leader change within seconds.

use std::collections::{HashSet, VecDeque};
use std::time::{Duration, Instant};

use crate::queue::types::{ConsumerId, MsgId};

/// How long a delivery is remembered. 10 s was too short: across a slow link
/// (256 kbit/s, 20 % loss) a consumer's ack took longer than that to commit,
/// a leader change then re-sent the delivery 19 s after the first, and it
/// reached the client as a fresh second copy (fault suite, 2026-11-27, seed
/// 9127: 20 of them). [`MAX`] still bounds the memory of a busy channel.
const KEEP: Duration = Duration::from_secs(60);
/// At most this many are remembered per channel (the oldest go first).
const MAX: usize = 16_384;

/// A delivery: consumer (or basic.get slot), message id in its queue,
/// delivery count when it was delivered.
pub(super) type DeliveryKey = (ConsumerId, MsgId, u32);

/// The deliveries remembered in the last [`KEEP`], at most [`MAX`].
#[derive(Default)]
pub(super) struct RecentDeliveries {
    order: VecDeque<(Instant, DeliveryKey)>,
    keys: HashSet<DeliveryKey>,
}

impl RecentDeliveries {
    /// Remembers `key` now.
    pub fn insert(&mut self, key: DeliveryKey) {
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

    /// Whether `key` was remembered within [`KEEP`]. Answers from an empty
    /// set without reading the clock (the common case for re-sends).
    pub fn contains(&mut self, key: &DeliveryKey) -> bool {
        if self.keys.is_empty() {
            return false;
        }
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

    fn key(msg: MsgId, count: u32) -> DeliveryKey {
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
        let mut r = RecentDeliveries::default();
        r.insert(key(7, 0));
        assert!(r.contains(&key(7, 0)));
        assert!(!r.contains(&key(7, 1)), "delivered again after a return");
        assert!(!r.contains(&key(8, 0)));
    }

    #[test]
    fn the_oldest_go_beyond_the_bound() {
        let mut r = RecentDeliveries::default();
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
