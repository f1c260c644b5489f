//! Read-only views of the queue for the broker (stats, declare-ok, timers).

use super::machine::QueueMachine;
use super::types::{ConsumerId, DeadLetterReason, MsgId, QueueConfig};

/// The consumer records of one node in a queue ([`QueueMachine::consumer_nodes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeConsumers {
    /// The node the records' channels live on.
    pub node: u64,
    /// Oldest boot epoch among them (below the node's current one: stale).
    pub oldest_epoch: u32,
    /// Newest boot epoch among them.
    pub newest_epoch: u32,
    /// Some record is not suspected down (pushes go to it).
    pub unsuspected: bool,
    /// Some record is suspected down (`NodeDown` applied, no `NodeUp` yet).
    pub suspected: bool,
}

impl NodeConsumers {
    /// The liveness command the leader should propose for this node, given
    /// what its failure detector says of it (None: the records agree).
    /// `Up(epoch)`: earlier boots are down and suspected records resume
    /// (`NodeUp`); `Down`: records not yet suspected are (`NodeDown`).
    pub fn command(&self, seen: SeenNode, now_ms: u64) -> Option<super::types::QueueCommand> {
        use super::types::QueueCommand;
        match seen {
            SeenNode::Up { epoch } if self.oldest_epoch < epoch || self.suspected => {
                Some(QueueCommand::NodeUp {
                    now_ms,
                    node: self.node,
                    epoch,
                })
            }
            SeenNode::Down if self.unsuspected => Some(QueueCommand::NodeDown {
                now_ms,
                node: self.node,
            }),
            _ => None,
        }
    }
}

/// A node as the leader's failure detector sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeenNode {
    /// Answering beats, in boot `epoch`.
    Up { epoch: u32 },
    /// Seen down (its stream closed or it went silent).
    Down,
    /// Not heard from yet since this node started: no verdict.
    Unknown,
}

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

    /// The floor the at-least-once worker sends with its dead letters
    /// (`QueueCommand::EnqueueDeadLetters`): `(settled_below,
    /// floor_version)` = the lowest held message id (the next message id if
    /// none is held) and the number of messages ever held. Every id below
    /// `settled_below` that was ever forwarded is settled: it is not held
    /// and never will be again. The version grows with every new hold, so a
    /// floor read later that could be lower carries a higher version.
    pub fn dead_letter_floor(&self) -> (MsgId, u64) {
        (
            self.held.min_id().unwrap_or(self.next_id),
            self.held.holds(),
        )
    }

    /// Source message ids this queue remembers to de-duplicate forwarded
    /// dead letters (`EnqueueDeadLetters`), and the number of sources.
    pub fn dedup_window(&self) -> (u64, usize) {
        (self.dedup.len(), self.dedup.sources())
    }

    /// The ready message at 1-based `position` in delivery order (returns
    /// first, then the main queue), with its delivery count (returns so far,
    /// `redelivered` = count > 0): what `quorumqctl peek` shows (RabbitMQ
    /// `rabbit_fifo:query_peek/2`). None when `position` is 0 or past the
    /// last ready message (RabbitMQ `no_message_at_pos`). Checked-out
    /// messages are not counted, as in RabbitMQ. O(position).
    pub fn ready_at(&self, position: u64) -> Option<(MsgId, u32)> {
        let skip = usize::try_from(position.checked_sub(1)?).ok()?;
        self.ready
            .iter()
            .nth(skip)
            .map(|m| (m.id, m.delivery_count()))
    }

    /// The ids of the ready messages in delivery order (returns first, then
    /// the main queue; highest priority first), at most `limit`: where a
    /// redrive walks the queue once. Checked-out, held and delayed messages
    /// are not ready. O(limit).
    pub fn ready_message_ids(&self, limit: usize) -> Vec<MsgId> {
        self.ready.iter().take(limit).map(|m| m.id).collect()
    }

    /// The messages the queue holds for consumers — ready ones in delivery
    /// order, then those checked out (unacked), by consumer — without the
    /// held dead letters: what `inspect_dead_letters` reads.
    pub fn queued_message_ids(&self) -> Vec<MsgId> {
        let mut ids: Vec<MsgId> = self.ready.iter().map(|m| m.id).collect();
        for (_, c) in self.consumers.iter() {
            ids.extend(c.checked_out.keys().copied());
        }
        ids
    }

    /// True when message `id` is checked out to some consumer or basic.get
    /// slot (delivered, not yet settled). O(consumers).
    pub fn is_checked_out(&self, id: MsgId) -> bool {
        self.consumers
            .iter()
            .any(|(_, c)| c.checked_out.contains_key(&id))
    }

    /// True when message `id` is checked out to `consumer` with delivery
    /// count `count`: a delivery of it made with that count is still due
    /// (not settled, not returned since — a return raises the count).
    /// O(log n).
    pub fn is_checked_out_to(&self, consumer: ConsumerId, id: MsgId, count: u32) -> bool {
        self.consumers
            .get(&consumer)
            .and_then(|c| c.checked_out.get(&id))
            .is_some_and(|m| m.delivery_count() == count)
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

    /// When the next message at a head expires, ms since the Unix epoch
    /// (the head: returns first; spec §2.4; with message priorities the
    /// earliest over the heads of every priority). None if no head has a
    /// TTL or nothing is ready. A new leader arms its timer from this.
    pub fn next_expiry_ms(&self) -> Option<u64> {
        self.ready.next_head_expiry_ms()
    }

    /// When the leader must next propose a `Tick`: the earliest of the
    /// head's expiry ([`QueueMachine::next_expiry_ms`]), the earliest
    /// delayed-retry release and the next consumer timeout deadline. A new
    /// leader arms its timer at this or at the last one emitted, if earlier
    /// (`leader_effects`).
    pub fn next_timer_ms(&self) -> Option<u64> {
        [
            self.next_expiry_ms(),
            self.delayed.next_ready_at(),
            self.next_timeout_ms(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Delayed-retry messages waiting to be ready again, count
    /// (`messages_delayed`, RabbitMQ 4.3). Not part of `ready_count`;
    /// counted toward `max_length`.
    pub fn delayed_count(&self) -> u64 {
        self.delayed.len() as u64
    }

    /// Body bytes of the delayed messages (counted toward `max_length_bytes`).
    pub fn delayed_bytes(&self) -> u64 {
        self.delayed.bytes()
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
    /// letters, delayed), in no particular order: the bodies a snapshot of the queue
    /// needs on another node.
    pub fn all_message_ids(&self) -> Vec<MsgId> {
        let mut ids: Vec<MsgId> = self.ready.iter().map(|m| m.id).collect();
        for (_, c) in self.consumers.iter() {
            ids.extend(c.checked_out.keys().copied());
        }
        ids.extend(self.held.iter().map(|h| h.id));
        ids.extend(self.delayed.iter().map(|(_, m)| m.id));
        ids
    }

    /// The nodes this queue's consumer records (consumers, cancelled ones
    /// holding messages, basic.get slots) live on, one summary per node in
    /// node order: what the leader's consumer-liveness sweep compares with
    /// its failure detector (`NodeDown` / `NodeUp`).
    pub fn consumer_nodes(&self) -> Vec<NodeConsumers> {
        let mut out: Vec<NodeConsumers> = Vec::new();
        for (id, c) in self.consumers.iter() {
            let s = match out.last_mut() {
                Some(s) if s.node == id.node => s,
                _ => {
                    out.push(NodeConsumers {
                        node: id.node,
                        oldest_epoch: id.epoch,
                        newest_epoch: id.epoch,
                        unsuspected: false,
                        suspected: false,
                    });
                    out.last_mut().expect("just pushed")
                }
            };
            s.oldest_epoch = s.oldest_epoch.min(id.epoch);
            s.newest_epoch = s.newest_epoch.max(id.epoch);
            if c.suspected {
                s.suspected = true;
            } else {
                s.unsuspected = true;
            }
        }
        out
    }
}
