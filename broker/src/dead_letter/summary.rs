//! The summary of the dead letters a queue holds, without consuming them
//! (`quorumqctl inspect_dead_letters`, `GET /api/queues/{vhost}/{name}/dead-letters`):
//! messages counted by the reason and source queue of their LAST death,
//! and the oldest and newest such death.
//!
//! Where the last death comes from: the broker's own death history stored
//! with the message ([`crate::message::DeathHistory`]: `x-last-death-*`);
//! a message without one (published by a client, or dead-lettered by an
//! older RabbitMQ) falls back to its first `x-death` entry, the most recent
//! one. A message with neither is counted in `without_death`.
//!
//! Times: the x-death `time` of the record of the last death, which
//! RabbitMQ and quorumq set when the message first died from that queue
//! for that reason (seconds since the Unix epoch); printed as ISO 8601 UTC
//! (`2026-11-26T11:15:27Z`).

use std::collections::BTreeMap;

use amq_protocol::protocol::basic;
use amq_protocol::types::{AMQPValue, FieldTable};
use serde_json::{json, Value};

use crate::message::TrackedMessage;

/// Counts of one queue's dead letters (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeadLetterSummary {
    /// Messages read (ready and unacknowledged).
    pub messages: u64,
    /// Messages per reason of their last death (`rejected`, `expired`,
    /// `maxlen`, `delivery_limit`).
    pub by_reason: BTreeMap<String, u64>,
    /// Messages per queue of their last death.
    pub by_source_queue: BTreeMap<String, u64>,
    /// Earliest last-death time, seconds since the Unix epoch.
    pub oldest_death: Option<u64>,
    /// Latest last-death time, seconds since the Unix epoch.
    pub newest_death: Option<u64>,
    /// Messages with no death at all (never dead-lettered).
    pub without_death: u64,
    /// Messages whose stored body could not be read or decoded.
    pub unreadable: u64,
}

/// The last death of a message: (source queue, reason, time in seconds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastDeath {
    /// Queue the message last died in.
    pub queue: String,
    /// Why (x-death `reason`).
    pub reason: String,
    /// x-death `time` of that death's record (seconds since the epoch), if known.
    pub time_secs: Option<u64>,
}

/// The last death of `msg`: its broker history, else its first `x-death`
/// entry; None for a message that never died.
pub fn last_death(msg: &TrackedMessage) -> Option<LastDeath> {
    if let Some(last) = &msg.deaths.last {
        let time_secs = msg
            .deaths
            .records
            .iter()
            .find(|r| r.queue == last.queue && r.reason == last.reason)
            .map(|r| r.time_secs);
        return Some(LastDeath {
            queue: last.queue.clone(),
            reason: last.reason.as_str().to_string(),
            time_secs,
        });
    }
    let (_, props) = basic::parse_properties(&msg.properties[..]).ok()?;
    let headers = props.headers().as_ref()?;
    first_x_death(headers)
}

/// The first (most recent) table of an `x-death` header.
fn first_x_death(headers: &FieldTable) -> Option<LastDeath> {
    let AMQPValue::FieldArray(arr) = headers.inner().get("x-death")? else {
        return None;
    };
    let AMQPValue::FieldTable(t) = arr.as_slice().first()? else {
        return None;
    };
    let text = |k: &str| match t.inner().get(k) {
        Some(AMQPValue::LongString(s)) => Some(s.to_string()),
        Some(AMQPValue::ShortString(s)) => Some(s.as_str().to_string()),
        _ => None,
    };
    let time_secs = match t.inner().get("time") {
        Some(AMQPValue::Timestamp(s)) => Some(*s),
        Some(AMQPValue::LongLongInt(s)) => u64::try_from(*s).ok(),
        _ => None,
    };
    Some(LastDeath {
        queue: text("queue")?,
        reason: text("reason")?,
        time_secs,
    })
}

impl DeadLetterSummary {
    /// Counts one message (`None`: its body could not be read or decoded).
    pub fn add(&mut self, msg: Option<&TrackedMessage>) {
        self.messages += 1;
        let Some(msg) = msg else {
            self.unreadable += 1;
            return;
        };
        let Some(d) = last_death(msg) else {
            self.without_death += 1;
            return;
        };
        *self.by_reason.entry(d.reason).or_insert(0) += 1;
        *self.by_source_queue.entry(d.queue).or_insert(0) += 1;
        if let Some(t) = d.time_secs {
            self.oldest_death = Some(self.oldest_death.map_or(t, |o| o.min(t)));
            self.newest_death = Some(self.newest_death.map_or(t, |n| n.max(t)));
        }
    }

    /// The JSON report: `{"queue", "vhost", "messages", "by_reason",
    /// "by_source_queue", "oldest_death", "newest_death", "without_death",
    /// "unreadable"}`, times as ISO 8601 UTC strings (null when no message
    /// died). The caller adds `held` for a source queue.
    pub fn to_json(&self, vhost: &str, queue: &str) -> Value {
        json!({
            "queue": queue,
            "vhost": vhost,
            "messages": self.messages,
            "by_reason": self.by_reason,
            "by_source_queue": self.by_source_queue,
            "oldest_death": self.oldest_death.map(iso8601),
            "newest_death": self.newest_death.map(iso8601),
            "without_death": self.without_death,
            "unreadable": self.unreadable,
        })
    }
}

pub use crate::utc::iso8601;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::amqp::codec::encode_properties;
    use crate::message::{Death, StoredMessage};
    use crate::queue::types::DeadLetterReason;
    use amq_protocol::protocol::basic::AMQPProperties;
    use amq_protocol::types::FieldArray;
    use bytes::Bytes;

    fn plain(headers: Option<FieldTable>) -> TrackedMessage {
        let mut p = AMQPProperties::default();
        if let Some(h) = headers {
            p = p.with_headers(h);
        }
        TrackedMessage::from(StoredMessage {
            exchange: String::new(),
            routing_key: "q".into(),
            bcc: Vec::new(),
            properties: encode_properties(&p),
            body: Bytes::from_static(b"x"),
        })
    }

    fn died(m: &mut TrackedMessage, queue: &str, reason: DeadLetterReason, now_secs: u64) {
        m.deaths.record(&Death {
            queue,
            reason,
            exchange: "",
            routing_keys: &[],
            expiration: None,
            now_secs,
        });
    }

    #[test]
    fn counts_by_last_death_of_the_broker_history() {
        let mut s = DeadLetterSummary::default();
        let mut a = plain(None);
        died(&mut a, "q1", DeadLetterReason::Expired, 100);
        died(&mut a, "q2", DeadLetterReason::Rejected, 200);
        let mut b = plain(None);
        died(&mut b, "q1", DeadLetterReason::Maxlen, 50);
        s.add(Some(&a));
        s.add(Some(&b));
        s.add(Some(&plain(None)));
        s.add(None);
        assert_eq!(s.messages, 4);
        assert_eq!(
            s.by_reason,
            BTreeMap::from([("maxlen".into(), 1), ("rejected".into(), 1)])
        );
        assert_eq!(
            s.by_source_queue,
            BTreeMap::from([("q1".into(), 1), ("q2".into(), 1)])
        );
        assert_eq!((s.oldest_death, s.newest_death), (Some(50), Some(200)));
        assert_eq!((s.without_death, s.unreadable), (1, 1));
    }

    #[test]
    fn a_message_without_history_falls_back_to_its_first_x_death() {
        let mut t = FieldTable::default();
        t.insert("queue".into(), AMQPValue::LongString("old".into()));
        t.insert("reason".into(), AMQPValue::LongString("expired".into()));
        t.insert("time".into(), AMQPValue::Timestamp(7));
        let mut older = t.clone();
        older.insert("queue".into(), AMQPValue::LongString("older".into()));
        let mut h = FieldTable::default();
        h.insert(
            "x-death".into(),
            AMQPValue::FieldArray(FieldArray::from(vec![
                AMQPValue::FieldTable(t),
                AMQPValue::FieldTable(older),
            ])),
        );
        let d = last_death(&plain(Some(h))).expect("x-death read");
        assert_eq!(
            d,
            LastDeath {
                queue: "old".into(),
                reason: "expired".into(),
                time_secs: Some(7)
            }
        );
    }
}
