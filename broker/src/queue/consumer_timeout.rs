//! Consumer timeouts (RabbitMQ 4.3 `x-consumer-timeout`, policy
//! `consumer-timeout`, node `consumer_timeout`): a consumer whose oldest
//! unsettled delivery is older than its timeout loses every message checked
//! out to it (returned as when it goes down: counted toward the delivery
//! limit) and is removed; its channel is told (`Effect::ConsumerTimedOut`).
//!
//! Time comes only from the commands' `now_ms`: each checked-out message
//! carries the `now_ms` of the command that checked it out (replicated
//! state, so a new leader honours the same deadline), and every command
//! checks the deadlines before it applies (`apply_one`; so an ack applied at
//! or after the deadline is too late); the leader's timer
//! (`next_timer_ms`) makes sure a `Tick` arrives at the earliest one.

use super::consumers::Consumer;
use super::machine::QueueMachine;
use super::types::{ConsumerId, Effect};

impl QueueMachine {
    /// The timeout that applies to a record: its own (the channel resolved
    /// the consumer's, queue's and node's settings), else the queue's (a
    /// basic.get slot, which has no basic.consume to carry one).
    fn timeout_of(&self, c: &Consumer) -> Option<u64> {
        c.timeout_ms.or(self.config.consumer_timeout_ms)
    }

    /// The time a record's oldest unsettled delivery times out, ms.
    fn deadline_of(&self, c: &Consumer) -> Option<u64> {
        Some(c.oldest_delivery_ms()?.saturating_add(self.timeout_of(c)?))
    }

    /// The earliest consumer timeout deadline, ms since the Unix epoch.
    pub fn next_timeout_ms(&self) -> Option<u64> {
        self.consumers
            .iter()
            .filter_map(|(_, c)| self.deadline_of(c))
            .min()
    }

    /// Consumers removed by their timeout whose channel has not answered,
    /// with the timeout used.
    pub fn timed_out_consumers(&self) -> impl Iterator<Item = (ConsumerId, u64)> + '_ {
        self.timed_out.iter().map(|(c, t)| (*c, *t))
    }

    /// Every record whose deadline is at or before `now_ms`, in id order:
    /// its messages are returned and it is removed exactly as on
    /// `ConsumerDown` (counted returns, maybe `delivery_limit`), and
    /// `ConsumerTimedOut` tells its channel.
    pub(super) fn time_out_consumers(&mut self, now_ms: u64, effects: &mut Vec<Effect>) {
        let due: Vec<(ConsumerId, u64)> = self
            .consumers
            .iter()
            .filter(|(_, c)| self.deadline_of(c).is_some_and(|at| now_ms >= at))
            .filter_map(|(id, c)| Some((*id, self.timeout_of(c)?)))
            .collect();
        for (consumer, timeout_ms) in due {
            self.consumer_down(now_ms, consumer, effects);
            self.timed_out.insert(consumer, timeout_ms);
            effects.push(Effect::ConsumerTimedOut {
                consumer,
                timeout_ms,
            });
        }
    }

    /// Node `node` is in boot `epoch`: timed-out consumers of its earlier
    /// boots have no channel left to tell.
    pub(super) fn forget_timed_out(&mut self, node: u64, epoch: u32) {
        self.timed_out
            .retain(|c, _| c.node != node || c.epoch >= epoch);
    }
}
