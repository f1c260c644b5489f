//! The compact per-message index the machine keeps instead of the payload
//! (payloads leave at once in `Effect::StoreBody`). 24 bytes per message:
//! the message priority shares a word with the delivery count.

use serde::{Deserialize, Serialize};

use super::types::{Delivery, MsgId};

/// Value of [`Msg::expiry`] meaning "never expires". Keeps the index free of
/// an `Option` tag (24 bytes instead of 32).
pub(super) const NO_EXPIRY: u64 = u64::MAX;

/// Bits of [`Msg::count_prio`] that hold the delivery count; the top 8
/// hold the priority.
const COUNT_BITS: u32 = 24;
/// Largest delivery count a [`Msg`] holds; counting saturates there.
pub(super) const MAX_DELIVERY_COUNT: u32 = (1 << COUNT_BITS) - 1;

/// One message as the machine knows it: id, expiry, body size, returns so
/// far and priority.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Msg {
    /// Queue-assigned id (enqueue counter).
    pub id: MsgId,
    /// Absolute expiry in ms since the Unix epoch, or [`NO_EXPIRY`].
    pub expiry: u64,
    /// Body size in bytes (counts toward `max_length_bytes`).
    pub size: u32,
    /// Low 24 bits: returns so far (RabbitMQ 3.10 `delivery_count`, spec
    /// §2.7), saturating at [`MAX_DELIVERY_COUNT`]; top 8 bits: the message
    /// priority as the queue keeps it (clamped to `x-max-priority`, 0 in a
    /// queue without priorities). Snapshots up to format 1 held the bare
    /// count here, which reads back as priority 0.
    count_prio: u32,
}

impl Msg {
    /// A message just enqueued: delivery count 0.
    pub fn new(id: MsgId, expiry: u64, size: u32, priority: u8) -> Msg {
        Msg {
            id,
            expiry,
            size,
            count_prio: u32::from(priority) << COUNT_BITS,
        }
    }

    /// Returns so far (RabbitMQ 3.10 `delivery_count`).
    pub fn delivery_count(&self) -> u32 {
        self.count_prio & MAX_DELIVERY_COUNT
    }

    /// The message priority the queue keeps it under (0 = lowest).
    pub fn priority(&self) -> u8 {
        (self.count_prio >> COUNT_BITS) as u8
    }

    /// Counts one more return (saturating at [`MAX_DELIVERY_COUNT`]).
    pub fn count_return(&mut self) {
        if self.delivery_count() < MAX_DELIVERY_COUNT {
            self.count_prio += 1;
        }
    }

    /// The expiry timestamp in ms, if the message has a TTL.
    pub fn expiry_ms(&self) -> Option<u64> {
        (self.expiry != NO_EXPIRY).then_some(self.expiry)
    }

    /// Expired when `now >= expiry` (spec §2.4).
    pub fn is_expired(&self, now_ms: u64) -> bool {
        self.expiry != NO_EXPIRY && now_ms >= self.expiry
    }

    /// The delivery as handed to a consumer or basic.get (payload filled by the host).
    pub fn delivery(&self) -> Delivery {
        Delivery {
            id: self.id,
            delivery_count: self.delivery_count(),
            payload: None,
            resend: false,
        }
    }
}

/// Expiry timestamp fixed at enqueue (spec §2.4): `now + min(queue TTL,
/// message TTL)`; a TTL of 0 gives `now + 1` (rabbit_fifo 3.10
/// `update_expiry_header`), so the message survives only the command that
/// enqueued it. No TTL at all gives [`NO_EXPIRY`].
pub(super) fn expiry_at(now_ms: u64, queue_ttl_ms: Option<u64>, msg_ttl_ms: Option<u64>) -> u64 {
    let ttl = match (queue_ttl_ms, msg_ttl_ms) {
        (None, None) => return NO_EXPIRY,
        (Some(q), None) => q,
        (None, Some(m)) => m,
        (Some(q), Some(m)) => q.min(m),
    };
    // Saturate below the sentinel: an absurd TTL still means "expires".
    now_ms.saturating_add(ttl.max(1)).min(NO_EXPIRY - 1)
}
