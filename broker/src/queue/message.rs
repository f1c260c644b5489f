//! The compact per-message index the machine keeps instead of the payload
//! (payloads leave at once in `Effect::StoreBody`). 24 bytes per message.

use serde::{Deserialize, Serialize};

use super::types::{Delivery, MsgId};

/// Value of [`Msg::expiry`] meaning "never expires". Keeps the index free of
/// an `Option` tag (24 bytes instead of 32).
pub(super) const NO_EXPIRY: u64 = u64::MAX;

/// One message as the machine knows it: id, expiry, body size, returns so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Msg {
    /// Queue-assigned id (enqueue counter).
    pub id: MsgId,
    /// Absolute expiry in ms since the Unix epoch, or [`NO_EXPIRY`].
    pub expiry: u64,
    /// Body size in bytes (counts toward `max_length_bytes`).
    pub size: u32,
    /// Returns so far (RabbitMQ 3.10 `delivery_count`, spec §2.7).
    pub delivery_count: u32,
}

impl Msg {
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
            delivery_count: self.delivery_count,
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
