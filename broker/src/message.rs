//! The message as a queue stores it: what a delivery or a dead-letter
//! publish needs, encoded once at publish time.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// A published message. `properties` are the raw content-header property
/// bytes (flags + fields) as the client sent them, so they are delivered
/// byte-exact; they are re-encoded only when dead-lettering rewrites them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredMessage {
    /// Exchange the message was published to ("" = default exchange).
    pub exchange: String,
    /// The basic.publish routing key.
    pub routing_key: String,
    /// Routing keys from the `BCC` header, which is stripped before storing
    /// but still counts when dead-lettering without a DLRK (spec §3.2).
    pub bcc: Vec<String>,
    /// Raw content-header property bytes.
    pub properties: Bytes,
    /// Message body.
    pub body: Bytes,
}

impl StoredMessage {
    /// Encodes for the Raft log / body store (bincode 2, see raft_log::codec).
    pub fn encode(&self) -> Result<Bytes, raft_log::StoreError> {
        raft_log::codec::encode(self).map(Bytes::from)
    }

    /// Decodes bytes written by [`StoredMessage::encode`].
    pub fn decode(bytes: &[u8]) -> Result<StoredMessage, raft_log::StoreError> {
        raft_log::codec::decode(bytes)
    }
}
