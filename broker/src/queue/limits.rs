//! Length limits (spec §2.5, §5.6): `max_length` / `max_length_bytes` over
//! ready + held messages; drop-head dead-letters `maxlen`, reject-publish
//! blocks publishers until the queue is at or below 80 % of every limit
//! (reject-publish-dlx also dead-letters each refused publish, `enqueue`).

use super::machine::QueueMachine;
use super::types::{DeadLetterReason, Effect, Overflow};

/// True when `value > limit` (strictly greater, spec §2.5); no limit is never exceeded.
fn over(limit: Option<u64>, value: u64) -> bool {
    limit.is_some_and(|l| value > l)
}

/// True when `value <= trunc(limit * 0.8)` (rabbit_fifo `is_below/2`); no limit counts as below.
fn below_soft(limit: Option<u64>, value: u64) -> bool {
    limit.is_none_or(|l| u128::from(value) * 5 <= u128::from(l) * 4)
}

impl QueueMachine {
    /// Messages counted toward `max_length`: ready + held + delayed
    /// (checked-out ones never count; 4.3 `messages_ready_plus_delayed`).
    fn limit_count(&self) -> u64 {
        (self.ready.len() + self.held.len() + self.delayed.len()) as u64
    }

    /// Bytes counted toward `max_length_bytes`: ready + held + delayed bodies.
    fn limit_bytes(&self) -> u64 {
        self.ready.bytes() + self.held.bytes() + self.delayed.bytes()
    }

    /// Over either limit (rabbit_fifo `is_over_limit`).
    pub(super) fn is_over_limit(&self) -> bool {
        over(self.config.max_length, self.limit_count())
            || over(self.config.max_length_bytes, self.limit_bytes())
    }

    /// At or below 80 % of every configured limit (rabbit_fifo `is_below_soft_limit`).
    pub(super) fn is_below_soft_limit(&self) -> bool {
        below_soft(self.config.max_length, self.limit_count())
            && below_soft(self.config.max_length_bytes, self.limit_bytes())
    }

    /// After a state change (rabbit_fifo `evaluate_limit`): with drop-head,
    /// dead-letter `maxlen` from the head (returns first; when nothing is
    /// ready, the earliest delayed-retry message) until within the limits;
    /// with reject-publish, block publishers on going over.
    pub(super) fn evaluate_limits(&mut self, effects: &mut Vec<Effect>) {
        match self.config.overflow {
            Overflow::DropHead => {
                while self.is_over_limit() {
                    let Some(msg) = self.ready.pop_head().or_else(|| self.delayed.pop_first())
                    else {
                        break;
                    };
                    self.dead_letter(msg, DeadLetterReason::Maxlen, effects);
                }
            }
            Overflow::RejectPublish | Overflow::RejectPublishDlx => {
                if !self.blocked && self.is_over_limit() {
                    self.blocked = true;
                    effects.push(Effect::PublishersBlocked(true));
                }
            }
        }
    }

    /// Unblock publishers once at or below 80 % of every limit, or when the
    /// overflow is no longer reject-publish (limits removed or changed by
    /// policy; 4.x behaviour, see the design notes in `machine`).
    pub(super) fn maybe_unblock(&mut self, effects: &mut Vec<Effect>) {
        if self.blocked && (!self.config.overflow.rejects_publish() || self.is_below_soft_limit()) {
            self.blocked = false;
            effects.push(Effect::PublishersBlocked(false));
        }
    }
}
