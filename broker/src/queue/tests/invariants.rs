//! Structural invariants of a `QueueMachine`, checked after every command in tests.

use std::collections::BTreeSet;

use super::super::dead_letter::Handler;
use super::super::machine::QueueMachine;
use super::super::types::{MsgId, Overflow};

impl QueueMachine {
    /// Every message id in the state (ready, checked out, held), with its location.
    pub(crate) fn live_ids(&self) -> Vec<MsgId> {
        let mut ids: Vec<MsgId> = self.ready.iter().map(|m| m.id).collect();
        for (_, c) in self.consumers.iter() {
            ids.extend(c.checked_out.keys().copied());
        }
        ids.extend(self.held.iter().map(|h| h.id));
        ids.extend(self.delayed.iter().map(|(_, m)| m.id));
        ids
    }

    /// Delayed (ready-at, id) in release order.
    pub(crate) fn delayed_entries(&self) -> Vec<(u64, MsgId)> {
        self.delayed.iter().map(|(at, m)| (at, m.id)).collect()
    }

    /// Ready ids in delivery order.
    pub(crate) fn ready_ids(&self) -> Vec<MsgId> {
        self.ready.iter().map(|m| m.id).collect()
    }

    /// Check every structural invariant; Err describes the first broken one.
    pub(crate) fn check_invariants(&self) -> Result<(), String> {
        self.ready.check()?;
        self.consumers.check()?;
        self.held.check()?;
        self.delayed.check()?;
        self.dedup.check()?;
        let ids = self.live_ids();
        let set: BTreeSet<MsgId> = ids.iter().copied().collect();
        if set.len() != ids.len() {
            return Err(format!("a message is in two places: {ids:?}"));
        }
        if let Some(max) = set.last() {
            if *max >= self.next_id {
                return Err(format!("id {max} >= next_id {}", self.next_id));
            }
        }
        if Handler::of(&self.config) != Handler::AtLeastOnce && self.held.len() > 0 {
            return Err("held messages without at-least-once".into());
        }
        if self.blocked && !self.config.overflow.rejects_publish() {
            return Err("blocked without reject-publish".into());
        }
        if self.config.overflow == Overflow::DropHead && self.is_over_limit() {
            return Err("drop-head queue over its limit".into());
        }
        // The armed timer serves the next instant: it is at or before it.
        if let Some(next) = self.next_timer_ms() {
            if self.timer_at.is_none_or(|t| t > next) {
                return Err(format!(
                    "timer {:?} later than the next timer instant {next}",
                    self.timer_at
                ));
            }
        }
        for (id, c) in self.consumers.iter() {
            if c.active && !c.no_ack && c.prefetch > 0 && c.checked_out.len() > c.prefetch as usize
            {
                // Only possible if a basic.get used a consumer's own id or
                // prefetch was lowered; tests never do either.
                return Err(format!("consumer {id:?} over prefetch"));
            }
        }
        Ok(())
    }
}

impl QueueMachine {
    /// Ids of every consumer record (active, cancelled, get slots), in order.
    pub(crate) fn consumer_ids(&self) -> Vec<super::super::types::ConsumerId> {
        self.consumers.iter().map(|(id, _)| *id).collect()
    }
}
