//! Dead-lettering (spec §5): which handler is in effect, and the held area of
//! the at-least-once strategy (RabbitMQ 3.10 `rabbit_fifo_dlx`: `discards`),
//! whose messages stay in the queue until `DeadLetterSettled`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::machine::QueueMachine;
use super::message::Msg;
use super::types::{
    DeadLetterReason, DeadLetterStrategy, DeadLetterTarget, Effect, MsgId, QueueConfig,
};

/// The dead-letter handler in effect (rabbit_quorum_queue `dead_letter_handler/2`, spec §5.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Handler<'a> {
    /// No dead-letter exchange: dead-lettered messages are dropped.
    Disabled,
    /// Publish once, then drop (spec §5.2).
    AtMostOnce(&'a DeadLetterTarget),
    /// Hold until the worker confirms (spec §5.3).
    AtLeastOnce,
}

impl<'a> Handler<'a> {
    /// Resolve the handler from the effective configuration. At-least-once
    /// needs a target *and* overflow reject-publish(-dlx); with drop-head it
    /// falls back to at-most-once (spec §5.1), which also guarantees that
    /// drop-head never has to make room by moving messages into the held area.
    pub fn of(config: &'a QueueConfig) -> Self {
        match &config.dead_letter {
            None => Handler::Disabled,
            Some(_)
                if config.strategy == DeadLetterStrategy::AtLeastOnce
                    && config.overflow.rejects_publish() =>
            {
                Handler::AtLeastOnce
            }
            Some(target) => Handler::AtMostOnce(target),
        }
    }
}

/// One held dead-lettered message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Held {
    pub id: MsgId,
    pub size: u32,
    pub reason: DeadLetterReason,
}

/// Held dead-lettered messages in dead-lettering order, settled in any order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct HeldArea {
    /// By hold sequence number (dead-lettering order).
    entries: BTreeMap<u64, Held>,
    /// Message id to hold sequence number.
    by_id: BTreeMap<MsgId, u64>,
    next_seq: u64,
    /// Sum of sizes, bytes.
    bytes: u64,
}

impl HeldArea {
    /// Hold a message (it keeps its stored payload).
    pub fn push(&mut self, held: Held) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.bytes += u64::from(held.size);
        self.by_id.insert(held.id, seq);
        self.entries.insert(seq, held);
    }

    /// Remove a held message; false if it is not held.
    pub fn settle(&mut self, id: MsgId) -> bool {
        let Some(seq) = self.by_id.remove(&id) else {
            return false;
        };
        if let Some(h) = self.entries.remove(&seq) {
            self.bytes -= u64::from(h.size);
        }
        true
    }

    /// Remove everything, in dead-lettering order.
    pub fn drain(&mut self) -> Vec<Held> {
        self.by_id.clear();
        self.bytes = 0;
        std::mem::take(&mut self.entries).into_values().collect()
    }

    /// Held messages in dead-lettering order.
    pub fn iter(&self) -> impl Iterator<Item = &Held> + '_ {
        self.entries.values()
    }

    /// Lowest held message id, if any.
    pub fn min_id(&self) -> Option<MsgId> {
        self.by_id.keys().next().copied()
    }

    /// Messages ever held (the next hold's sequence number).
    pub fn holds(&self) -> u64 {
        self.next_seq
    }

    /// Number of held messages.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Body bytes of the held messages.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Test-only consistency check of the index and totals.
    #[cfg(test)]
    pub fn check(&self) -> Result<(), String> {
        let sum: u64 = self.entries.values().map(|h| u64::from(h.size)).sum();
        if sum != self.bytes {
            return Err(format!("held bytes {} != sum {}", self.bytes, sum));
        }
        if self.by_id.len() != self.entries.len() {
            return Err("held index size mismatch".into());
        }
        for (id, seq) in &self.by_id {
            if self.entries.get(seq).map(|h| h.id) != Some(*id) {
                return Err(format!("held index broken for {id}"));
            }
        }
        Ok(())
    }
}

impl QueueMachine {
    /// Dead-letter a message that has already left the ready queue or a
    /// consumer: drop it (no DLX), publish-then-drop (at-most-once), or hold
    /// it (at-least-once). Spec §5.2, §5.3.
    pub(super) fn dead_letter(
        &mut self,
        msg: Msg,
        reason: DeadLetterReason,
        effects: &mut Vec<Effect>,
    ) {
        let handler = Handler::of(&self.config);
        effects.push(Effect::DeadLettered {
            reason,
            strategy: match handler {
                Handler::Disabled => None,
                Handler::AtMostOnce(_) => Some(DeadLetterStrategy::AtMostOnce),
                Handler::AtLeastOnce => Some(DeadLetterStrategy::AtLeastOnce),
            },
        });
        match handler {
            Handler::Disabled => effects.push(Effect::DropBody { id: msg.id }),
            Handler::AtMostOnce(target) => {
                effects.push(Effect::DeadLetter {
                    id: msg.id,
                    reason,
                    target: target.clone(),
                });
                effects.push(Effect::DropBody { id: msg.id });
            }
            Handler::AtLeastOnce => {
                self.held.push(Held {
                    id: msg.id,
                    size: msg.size,
                    reason,
                });
                effects.push(Effect::DeadLetterHeld { id: msg.id, reason });
            }
        }
    }

    /// `DeadLetterSettled`: the worker forwarded these; forget them. Unknown
    /// ids are ignored (rabbit_fifo_dlx `settle`).
    pub(super) fn settle_dead_letters(&mut self, ids: Vec<MsgId>, effects: &mut Vec<Effect>) {
        for id in ids {
            if self.held.settle(id) {
                effects.push(Effect::DropBody { id });
            }
        }
    }

    /// Install a new configuration. Leaving at-least-once deletes every held
    /// message (spec §5.7, test `switch_strategy`: "Deleted N dead-lettered
    /// messages"); at-least-once to at-least-once keeps them.
    pub(super) fn replace_config(&mut self, config: QueueConfig, effects: &mut Vec<Effect>) {
        let was_alo = Handler::of(&self.config) == Handler::AtLeastOnce;
        self.config = config;
        if was_alo && Handler::of(&self.config) != Handler::AtLeastOnce {
            for held in self.held.drain() {
                effects.push(Effect::DropBody { id: held.id });
            }
        }
    }
}
