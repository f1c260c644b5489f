//! Time-driven behaviour (spec §2.4): head-only message expiry, the expiry
//! timer for the leader, and the queue TTL (`x-expires`).

use super::machine::QueueMachine;
use super::types::{DeadLetterReason, Effect};

impl QueueMachine {
    /// Release the delayed-retry messages due at `now_ms` into the returns
    /// queue, then dead-letter `expired` every expired message at the head
    /// (returns first), stopping at the first unexpired one: a message
    /// behind an unexpired one never expires early (spec §2.4, rabbit_fifo
    /// 3.10 `expire_msgs`; 4.3 `expire_shallow` promotes delayed messages
    /// first). With message priorities the head of every priority expires so
    /// (RabbitMQ's classic priority queue `dropwhile` per priority), highest
    /// priority first.
    pub(super) fn expire_head(&mut self, now_ms: u64, effects: &mut Vec<Effect>) {
        self.release_delayed(now_ms);
        while let Some(msg) = self.ready.pop_head_where(|m| m.is_expired(now_ms)) {
            self.dead_letter(msg, DeadLetterReason::Expired, effects);
        }
    }

    /// Renew the `x-expires` lease (basic.get, a consumer leaving, config update).
    pub(super) fn touch(&mut self, now_ms: u64) {
        self.last_active = Some(now_ms);
        self.expired_notified = false;
    }

    /// On a tick: emit `QueueExpired` once when `now > last_active + expires`
    /// and the queue has no consumer record (rabbit_fifo 3.10 `is_expired`:
    /// every consumer that is not down counts, including cancelled ones still
    /// holding messages and basic.get slots with unacked messages).
    pub(super) fn check_queue_expires(&mut self, now_ms: u64, effects: &mut Vec<Effect>) {
        let (Some(expires), Some(last)) = (self.config.expires_ms, self.last_active) else {
            return;
        };
        if !self.expired_notified
            && self.consumers.record_count() == 0
            && now_ms > last.saturating_add(expires)
        {
            self.expired_notified = true;
            effects.push(Effect::QueueExpired);
        }
    }

    /// Emit `ExpiryTimer` for the next timer ([`QueueMachine::next_timer_ms`]:
    /// head expiry, earliest delayed release or consumer timeout deadline)
    /// when the leader's armed timer would not serve it: when it is earlier
    /// than the one last emitted (`timer_at`), when none was emitted, or when
    /// the last one is due by `now_ms` (its `Tick` may have been lost); and
    /// always (if there is one) when `force` (a tick, so a timer that fired
    /// early is re-armed). A next timer *later* than the armed one is not
    /// emitted: the armed one fires first, and its `Tick` re-arms at the new
    /// instant. This keeps a busy queue from emitting on every command (with
    /// a consumer timeout the deadline moves with every ack; with a TTL the
    /// head's expiry with every delivery).
    pub(super) fn emit_expiry_timer(
        &mut self,
        force: bool,
        now_ms: Option<u64>,
        effects: &mut Vec<Effect>,
    ) {
        let next = self.next_timer_ms();
        let due = match (next, self.timer_at) {
            (Some(n), Some(t)) => n < t || (n != t && now_ms.is_some_and(|now| t <= now)),
            (Some(_), None) => true,
            (None, _) => false,
        };
        if force || due {
            if let Some(at_ms) = next {
                effects.push(Effect::ExpiryTimer { at_ms });
            }
            self.timer_at = next;
        }
    }

    /// The instant the leader's timer must be armed at or before: the next
    /// timer, or the last one emitted if that is earlier (a later next timer
    /// was not emitted, see [`QueueMachine::emit_expiry_timer`]). A new
    /// leader arms its timer at this.
    pub(super) fn armed_timer_ms(&self) -> Option<u64> {
        match (self.next_timer_ms(), self.timer_at) {
            (Some(n), Some(t)) => Some(n.min(t)),
            (n, _) => n,
        }
    }
}
