//! The message as a queue stores it: what a delivery or a dead-letter
//! publish needs, encoded once at publish time, and the broker's own record
//! of the message's deaths, which a client cannot forge.
//!
//! Encoding (the payload in the Raft log, snapshots and the body store):
//!
//! * v0, a message without broker death history: the bincode encoding of
//!   [`StoredMessage`], byte for byte what quorumq wrote before death
//!   histories existed, so every stored message stays readable (and a node
//!   without death histories still reads everything a client published).
//! * v1, a message the broker dead-lettered: [`ENVELOPE_MARKER`], the
//!   version byte 1, then the bincode encoding of (`StoredMessage`,
//!   [`DeathHistory`]). A v0 encoding starts with the length of the exchange
//!   name as a bincode varint, whose first byte is never 0xFF, so the two
//!   cannot be confused.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::queue::types::DeadLetterReason;

/// First byte of a versioned stored-message envelope (v1 and later). A
/// bincode varint never starts with 0xFF (bincode 2.0.1: reserved
/// discriminant), so no v0 encoding does.
pub const ENVELOPE_MARKER: u8 = 0xFF;

/// Envelope version of (`StoredMessage`, `DeathHistory`).
const ENVELOPE_V1: u8 = 1;

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
    /// Message body; decoded with [`StoredMessage::decode_bytes`] a slice of
    /// the stored payload, not a copy (from 64 KiB up).
    #[serde(with = "raft_log::codec::shared_bytes")]
    pub body: Bytes,
}

impl StoredMessage {
    /// Encodes for the Raft log / body store (bincode 2, see raft_log::codec):
    /// the v0 encoding, a message without broker death history.
    ///
    /// Errors: [`raft_log::StoreError::Encode`] if bincode rejects the value.
    pub fn encode(&self) -> Result<Bytes, raft_log::StoreError> {
        raft_log::codec::encode(self).map(Bytes::from)
    }

    /// Decodes a stored payload of any version (see the module docs),
    /// leaving out the death history; [`TrackedMessage::decode`] keeps it.
    ///
    /// Errors: [`raft_log::StoreError::Decode`] / `Corrupt` on malformed
    /// bytes or an unknown envelope version.
    pub fn decode(bytes: &[u8]) -> Result<StoredMessage, raft_log::StoreError> {
        TrackedMessage::decode(bytes).map(|t| t.message)
    }

    /// [`StoredMessage::decode`] of a shared payload: a big body is a slice
    /// of `bytes` rather than a copy.
    ///
    /// Errors: as [`StoredMessage::decode`].
    pub fn decode_bytes(bytes: &Bytes) -> Result<StoredMessage, raft_log::StoreError> {
        TrackedMessage::decode_bytes(bytes).map(|t| t.message)
    }
}

/// A stored message with the broker's own death history: what the
/// dead-letter rewrite reads and writes. Dereferences to the
/// [`StoredMessage`]; its [`TrackedMessage::encode`] keeps the history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrackedMessage {
    /// The message as it is delivered (for a dead letter: the rewritten one,
    /// whose headers carry x-death & co written from `deaths`).
    pub message: StoredMessage,
    /// Deaths the broker recorded; empty for a message a client published,
    /// whatever `x-death` header it carries (RabbitMQ 4.0.1+).
    pub deaths: DeathHistory,
}

impl From<StoredMessage> for TrackedMessage {
    /// A message without broker death history (as a client published it).
    fn from(message: StoredMessage) -> Self {
        TrackedMessage {
            message,
            deaths: DeathHistory::default(),
        }
    }
}

impl std::ops::Deref for TrackedMessage {
    type Target = StoredMessage;

    fn deref(&self) -> &StoredMessage {
        &self.message
    }
}

impl TrackedMessage {
    /// Encodes for the Raft log / body store: v0 without a death history
    /// (the same bytes as [`StoredMessage::encode`]), v1 with one.
    ///
    /// Errors: [`raft_log::StoreError::Encode`] if bincode rejects the value.
    pub fn encode(&self) -> Result<Bytes, raft_log::StoreError> {
        if self.deaths.is_empty() {
            return self.message.encode();
        }
        let body = raft_log::codec::encode(&(&self.message, &self.deaths))?;
        let mut out = Vec::with_capacity(2 + body.len());
        out.push(ENVELOPE_MARKER);
        out.push(ENVELOPE_V1);
        out.extend_from_slice(&body);
        Ok(Bytes::from(out))
    }

    /// Decodes a payload of any version: v0 (every message stored before
    /// death histories existed, and every message a client published) gets
    /// an empty history.
    ///
    /// Errors: [`raft_log::StoreError::Decode`] / `Corrupt` on malformed
    /// bytes, trailing bytes, or an envelope version this build does not know.
    pub fn decode(bytes: &[u8]) -> Result<TrackedMessage, raft_log::StoreError> {
        Self::decode_bytes(&Bytes::copy_from_slice(bytes))
    }

    /// [`TrackedMessage::decode`] of a shared payload: a big body is a slice
    /// of `bytes` rather than a copy.
    ///
    /// Errors: as [`TrackedMessage::decode`].
    pub fn decode_bytes(bytes: &Bytes) -> Result<TrackedMessage, raft_log::StoreError> {
        match &bytes[..] {
            [ENVELOPE_MARKER, ENVELOPE_V1, ..] => {
                let (message, deaths): (StoredMessage, DeathHistory) =
                    raft_log::codec::decode_shared(&bytes.slice(2..))?;
                Ok(TrackedMessage { message, deaths })
            }
            [ENVELOPE_MARKER, version, ..] => Err(raft_log::StoreError::corrupt(format!(
                "stored message envelope version {version} is unknown to this build"
            ))),
            _ => raft_log::codec::decode_shared::<StoredMessage>(bytes).map(TrackedMessage::from),
        }
    }
}

/// One death as x-first-death-* / x-last-death-* report it (spec §3.5).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeathEvent {
    /// Queue the message was dead-lettered from (no vhost).
    pub queue: String,
    /// Why.
    pub reason: DeadLetterReason,
    /// Exchange the message had been published to just before this death
    /// ("" = default exchange).
    pub exchange: String,
}

/// One (queue, reason) entry of the death history: one `x-death` table
/// (spec §3.4; RabbitMQ 4.x `#death{}` in `mc.hrl`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeathRecord {
    /// Queue the message was dead-lettered from (no vhost).
    pub queue: String,
    /// Why.
    pub reason: DeadLetterReason,
    /// Deaths from this queue for this reason (x-death `count`).
    pub count: u64,
    /// When this (queue, reason) happened the first time, seconds since the
    /// Unix epoch (x-death `time`).
    pub time_secs: u64,
    /// Exchange before the first such death (x-death `exchange`).
    pub exchange: String,
    /// Routing keys (publish key + CC, no BCC) before the first such death.
    pub routing_keys: Vec<String>,
    /// The per-message `expiration` at the first such death, if any.
    pub original_expiration: Option<String>,
}

/// The broker's record of a message's deaths (RabbitMQ 4.x `#deaths{}`
/// annotation, `mc:record_death/4`): one record per (queue, reason), most
/// recently updated first, and the first and last death. It exists only
/// for deaths this broker carried out; a client-supplied `x-death` header
/// never becomes part of it (RabbitMQ 4.0.1 release notes: x-death).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeathHistory {
    /// Records, most recently updated first (the x-death order).
    pub records: Vec<DeathRecord>,
    /// The first death (x-first-death-*); never changes once set.
    pub first: Option<DeathEvent>,
    /// The latest death (x-last-death-*).
    pub last: Option<DeathEvent>,
}

/// A death about to be recorded: where the message was and what it looked
/// like just before it (inputs of [`DeathHistory::record`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Death<'a> {
    /// Source queue.
    pub queue: &'a str,
    /// Why.
    pub reason: DeadLetterReason,
    /// Exchange the message had been published to.
    pub exchange: &'a str,
    /// Routing keys before this death (publish key + CC, no BCC).
    pub routing_keys: &'a [String],
    /// The message's `expiration` property, if it has one.
    pub expiration: Option<&'a str>,
    /// Now, seconds since the Unix epoch.
    pub now_secs: u64,
}

impl DeathHistory {
    /// True if the broker never dead-lettered the message.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Records one death (spec §3.4 update rule, `mc:record_death/4`): the
    /// (queue, reason) record gets `count + 1` (saturating) and moves to the
    /// front, keeping its first-time fields; otherwise a new record with
    /// count 1 is prepended. `first` is set on the first death only, `last`
    /// on every one.
    pub fn record(&mut self, d: &Death<'_>) {
        let event = DeathEvent {
            queue: d.queue.to_string(),
            reason: d.reason,
            exchange: d.exchange.to_string(),
        };
        let existing = self
            .records
            .iter()
            .position(|r| r.queue == d.queue && r.reason == d.reason);
        let record = match existing {
            Some(i) => {
                let mut r = self.records.remove(i);
                r.count = r.count.saturating_add(1);
                r
            }
            None => DeathRecord {
                queue: d.queue.to_string(),
                reason: d.reason,
                count: 1,
                time_secs: d.now_secs,
                exchange: d.exchange.to_string(),
                routing_keys: d.routing_keys.to_vec(),
                original_expiration: d.expiration.map(str::to_string),
            },
        };
        self.records.insert(0, record);
        if self.first.is_none() {
            self.first = Some(event.clone());
        }
        self.last = Some(event);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> StoredMessage {
        StoredMessage {
            exchange: "ex".into(),
            routing_key: "rk".into(),
            bcc: vec!["b".into()],
            properties: Bytes::from_static(&[0, 0]),
            body: Bytes::from_static(b"hi"),
        }
    }

    /// The bytes quorumq wrote for `sample()` before death histories existed
    /// (bincode 2 standard: varint lengths, then the bytes).
    const OLD_ENCODING: &[u8] = &[
        2, b'e', b'x', // exchange
        2, b'r', b'k', // routing_key
        1, 1, b'b', // bcc
        2, 0, 0, // properties
        2, b'h', b'i', // body
    ];

    fn death<'a>(queue: &'a str, reason: DeadLetterReason, now_secs: u64) -> Death<'a> {
        Death {
            queue,
            reason,
            exchange: "",
            routing_keys: &[],
            expiration: None,
            now_secs,
        }
    }

    #[test]
    fn an_old_encoding_decodes_without_history() {
        let t = TrackedMessage::decode(OLD_ENCODING).expect("old encoding");
        assert_eq!(t.message, sample());
        assert!(t.deaths.is_empty());
        assert_eq!(StoredMessage::decode(OLD_ENCODING).expect("old"), sample());
    }

    #[test]
    fn a_message_without_history_keeps_the_old_encoding() {
        assert_eq!(&sample().encode().expect("encode")[..], OLD_ENCODING);
        let t = TrackedMessage::from(sample());
        assert_eq!(&t.encode().expect("encode")[..], OLD_ENCODING);
    }

    #[test]
    fn a_history_round_trips_in_the_v1_envelope() {
        let mut t = TrackedMessage::from(sample());
        t.deaths.record(&Death {
            queue: "q",
            reason: DeadLetterReason::Expired,
            exchange: "ex",
            routing_keys: &["rk".to_string()],
            expiration: Some("5000"),
            now_secs: 7,
        });
        let b = t.encode().expect("encode");
        assert_eq!(&b[..2], &[ENVELOPE_MARKER, ENVELOPE_V1]);
        assert_eq!(TrackedMessage::decode(&b).expect("decode"), t);
        assert_eq!(StoredMessage::decode(&b).expect("decode"), sample());
    }

    #[test]
    fn an_unknown_envelope_version_is_an_error() {
        assert!(matches!(
            TrackedMessage::decode(&[ENVELOPE_MARKER, 9, 0]),
            Err(raft_log::StoreError::Corrupt(_))
        ));
        assert!(TrackedMessage::decode(&[]).is_err());
        assert!(TrackedMessage::decode(&[ENVELOPE_MARKER, ENVELOPE_V1]).is_err());
    }

    #[test]
    fn record_counts_per_queue_and_reason_and_moves_to_front() {
        let mut h = DeathHistory::default();
        h.record(&death("q1", DeadLetterReason::Rejected, 10));
        h.record(&death("q2", DeadLetterReason::Expired, 20));
        h.record(&death("q1", DeadLetterReason::Rejected, 30));
        h.record(&death("q1", DeadLetterReason::Expired, 40));
        let keys: Vec<_> = h
            .records
            .iter()
            .map(|r| (r.queue.as_str(), r.reason, r.count, r.time_secs))
            .collect();
        assert_eq!(
            keys,
            vec![
                ("q1", DeadLetterReason::Expired, 1, 40),
                ("q1", DeadLetterReason::Rejected, 2, 10),
                ("q2", DeadLetterReason::Expired, 1, 20),
            ]
        );
        assert_eq!(h.first.as_ref().map(|e| e.queue.as_str()), Some("q1"));
        assert_eq!(
            h.first.as_ref().map(|e| e.reason),
            Some(DeadLetterReason::Rejected)
        );
        assert_eq!(
            h.last.as_ref().map(|e| e.reason),
            Some(DeadLetterReason::Expired)
        );
    }

    #[test]
    fn a_count_at_the_maximum_stays_there() {
        let mut h = DeathHistory::default();
        h.record(&death("q", DeadLetterReason::Rejected, 1));
        h.records[0].count = u64::MAX;
        h.record(&death("q", DeadLetterReason::Rejected, 2));
        assert_eq!(h.records[0].count, u64::MAX);
    }

    fn reason() -> impl Strategy<Value = DeadLetterReason> {
        prop_oneof![
            Just(DeadLetterReason::Rejected),
            Just(DeadLetterReason::Expired),
            Just(DeadLetterReason::Maxlen),
            Just(DeadLetterReason::DeliveryLimit),
        ]
    }

    proptest! {
        /// Against a naive model (the list of every death): one record per
        /// (queue, reason) with the number of its deaths and the time of its
        /// first one, ordered by the latest death of each key; `first` and
        /// `last` are the first and last deaths; the history round-trips.
        #[test]
        fn record_matches_the_list_of_deaths(
            events in prop::collection::vec((0u8..4, reason()), 1..40)
        ) {
            let names = ["a", "b", "c", "d"];
            let mut h = DeathHistory::default();
            for (i, (q, r)) in events.iter().enumerate() {
                h.record(&death(names[*q as usize], *r, i as u64));
            }
            let mut model: Vec<(&str, DeadLetterReason, u64, u64, usize)> = Vec::new();
            for (i, (q, r)) in events.iter().enumerate() {
                let q = names[*q as usize];
                match model.iter_mut().find(|m| m.0 == q && m.1 == *r) {
                    Some(m) => { m.2 += 1; m.4 = i; }
                    None => model.push((q, *r, 1, i as u64, i)),
                }
            }
            model.sort_by_key(|m| std::cmp::Reverse(m.4));
            let got: Vec<_> = h.records.iter()
                .map(|r| (r.queue.as_str(), r.reason, r.count, r.time_secs))
                .collect();
            let want: Vec<_> = model.iter().map(|m| (m.0, m.1, m.2, m.3)).collect();
            prop_assert_eq!(got, want);
            let (fq, fr) = events[0];
            prop_assert_eq!(h.first.as_ref().map(|e| (e.queue.as_str(), e.reason)),
                Some((names[fq as usize], fr)));
            let (lq, lr) = events[events.len() - 1];
            prop_assert_eq!(h.last.as_ref().map(|e| (e.queue.as_str(), e.reason)),
                Some((names[lq as usize], lr)));
            let t = TrackedMessage { message: sample(), deaths: h };
            let b = t.encode().expect("encode");
            prop_assert_eq!(TrackedMessage::decode(&b).expect("decode"), t);
        }
    }
}
