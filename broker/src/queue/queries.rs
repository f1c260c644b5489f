//! Read-only views of the queue for the broker (stats, declare-ok, timers).

use super::machine::QueueMachine;
use super::types::{ConsumerId, DeadLetterReason, MsgId, QueueConfig};

impl QueueMachine {
    /// Ready messages (returns + main queue), count. = `messages_ready`,
    /// the `queue.declare-ok` message count (spec §5.6).
    pub fn ready_count(&self) -> u64 {
        self.ready.len() as u64
    }

    /// Body bytes of the ready messages.
    pub fn ready_bytes(&self) -> u64 {
        self.ready.bytes()
    }

    /// Messages checked out to consumers and basic.get slots, not yet
    /// settled, count (= `messages_unacknowledged`).
    pub fn unacked_count(&self) -> u64 {
        self.consumers.unacked()
    }

    /// Active consumers (attached and not cancelled), count.
    pub fn consumer_count(&self) -> u64 {
        self.consumers.active_count()
    }

    /// At-least-once dead letters held until `DeadLetterSettled`, count
    /// (`messages_dlx`, spec §5.6). Counted toward `max_length`.
    pub fn held_count(&self) -> u64 {
        self.held.len() as u64
    }

    /// Body bytes of the held dead letters (`message_bytes_dlx`, spec §5.6).
    /// Counted toward `max_length_bytes`.
    pub fn held_bytes(&self) -> u64 {
        self.held.bytes()
    }

    /// The held dead letters in dead-lettering order, with their reasons:
    /// what the at-least-once worker must forward (a new leader's worker
    /// starts from this list, spec §5.8).
    pub fn held_dead_letters(&self) -> impl Iterator<Item = (MsgId, DeadLetterReason)> + '_ {
        self.held.iter().map(|h| (h.id, h.reason))
    }

    /// Messages checked out to `consumer` (its unacked deliveries), in id order.
    pub fn checked_out(&self, consumer: ConsumerId) -> impl Iterator<Item = MsgId> + '_ {
        self.consumers
            .get(&consumer)
            .into_iter()
            .flat_map(|c| c.checked_out.keys().copied())
    }

    /// The effective configuration in force.
    pub fn config(&self) -> &QueueConfig {
        &self.config
    }

    /// True while reject-publish refuses new messages (spec §2.5); a new
    /// leader uses it to know the current state without the effect history.
    pub fn publishers_blocked(&self) -> bool {
        self.blocked
    }

    /// When the next message to be delivered expires, ms since the Unix
    /// epoch (the head: returns first; spec §2.4). None if it has no TTL or
    /// nothing is ready. A new leader arms its timer from this.
    pub fn next_expiry_ms(&self) -> Option<u64> {
        self.ready.head().and_then(|m| m.expiry_ms())
    }

    /// x-expires: `QueueExpired` was emitted for the current lease (the
    /// broker should delete the queue; a new leader can read this).
    pub fn queue_expired(&self) -> bool {
        self.expired_notified
    }

    /// Id the next accepted message will get (= messages ever accepted).
    pub fn next_msg_id(&self) -> MsgId {
        self.next_id
    }

    /// Every message the queue still owns (ready, checked out, held dead
    /// letters), in no particular order: the bodies a snapshot of the queue
    /// needs on another node.
    pub fn all_message_ids(&self) -> Vec<MsgId> {
        let mut ids: Vec<MsgId> = self.ready.iter().map(|m| m.id).collect();
        for (_, c) in self.consumers.iter() {
            ids.extend(c.checked_out.keys().copied());
        }
        ids.extend(self.held.iter().map(|h| h.id));
        ids
    }

    /// True when a consumer of `node` from a boot before `epoch` is attached
    /// (the leader then proposes `NodeRestarted`).
    pub fn has_consumers_before(&self, node: u64, epoch: u32) -> bool {
        !self.consumers.of_node_before(node, epoch).is_empty()
    }
}
