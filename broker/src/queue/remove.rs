//! `Remove`: an operator takes ready messages out of the queue by id after
//! copying them elsewhere (`quorumqctl redrive`, RabbitMQ's "move messages",
//! SQS `StartMessageMoveTask`). Not a dead-lettering: nothing is counted or
//! forwarded, the bodies are just dropped.

use std::collections::BTreeSet;

use super::machine::QueueMachine;
use super::types::{Effect, MsgId};

impl QueueMachine {
    /// Removes the messages of `ids` that are ready now (delayed, checked-out
    /// and held messages, and unknown ids, stay as they are; duplicates count
    /// once) and emits `DropBody` for each in delivery order. Does not renew
    /// the x-expires lease (an operator's action, as purge). Returns the count.
    pub(super) fn remove_ready(&mut self, ids: &[MsgId], effects: &mut Vec<Effect>) -> u64 {
        let wanted: BTreeSet<MsgId> = ids.iter().copied().collect();
        let removed = self.ready.remove_ids(&wanted);
        for m in &removed {
            effects.push(Effect::DropBody { id: m.id });
        }
        removed.len() as u64
    }
}
