//! The dead-lettered message, as RabbitMQ 3.10 rewrites it (spec §3):
//! exchange := the DLX; routing keys := [DLRK] or the message's keys (publish
//! key + CC + BCC); `CC` removed when a DLRK is set; `expiration` removed and
//! kept as `original-expiration`; an `x-death` entry per (queue, reason) with
//! count increment and move-to-front; `x-first-death-*` set once.

use amq_protocol::protocol::basic::{self, AMQPProperties};
use amq_protocol::types::{AMQPValue, FieldArray, FieldTable};

use crate::amqp::codec::encode_properties;
use crate::message::StoredMessage;
use crate::meta::publish::cc_bcc_keys;
use crate::queue::types::{DeadLetterReason, DeadLetterTarget};

/// One `x-death` entry as read back from a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Death {
    pub queue: String,
    pub reason: String,
}

/// The rewritten message and the keys to route it with.
#[derive(Debug, Clone)]
pub struct DeadLettered {
    /// Message to enqueue into the targets (exchange = the DLX).
    pub message: StoredMessage,
    /// Routing keys for the DLX (the first is `basic.deliver.routing_key`).
    pub routing_keys: Vec<String>,
    /// Death history after this event, most recent first (for cycle checks).
    pub deaths: Vec<Death>,
    /// Headers of the rewritten message (for headers-exchange DLXs).
    pub headers: FieldTable,
}

/// Rewrites `msg`, dead-lettered from queue `queue` for `reason` at
/// `now_secs` (seconds since the epoch, x-death `time`), towards `target`.
pub fn rewrite(
    msg: &StoredMessage,
    queue: &str,
    reason: DeadLetterReason,
    target: &DeadLetterTarget,
    now_secs: u64,
) -> DeadLettered {
    let props = basic::parse_properties(&msg.properties[..])
        .map(|(_, p)| p)
        .unwrap_or_default();
    let mut headers = props.headers().clone().unwrap_or_default();
    let (cc, _) = cc_bcc_keys(Some(&headers)).unwrap_or_default();
    // Keys before this death: publish key + CC (BCC excluded), spec §3.2.
    let mut death_keys = vec![msg.routing_key.clone()];
    death_keys.extend(cc.iter().cloned());
    let routing_keys = match &target.routing_key {
        Some(rk) => vec![rk.clone()],
        None => {
            let mut keys = death_keys.clone();
            keys.extend(msg.bcc.iter().cloned());
            keys
        }
    };
    let expiration = props.expiration().as_ref().map(|e| e.as_str().to_string());
    let reason_s = reason.as_str();

    let mut deaths: Vec<AMQPValue> = match headers.inner().get("x-death") {
        Some(AMQPValue::FieldArray(a)) => a.as_slice().to_vec(),
        _ => Vec::new(),
    };
    let existing = deaths.iter().position(|d| match d {
        AMQPValue::FieldTable(t) => {
            str_field(t, "queue").as_deref() == Some(queue)
                && str_field(t, "reason").as_deref() == Some(reason_s)
        }
        _ => false,
    });
    let entry = match existing {
        Some(i) => {
            let mut t = match deaths.remove(i) {
                AMQPValue::FieldTable(t) => t,
                _ => FieldTable::default(),
            };
            let count = match t.inner().get("count") {
                Some(v) => int_value(v).unwrap_or(0),
                None => 0,
            };
            // The count may come from the client (a republished x-death): it stops at the
            // largest AMQP long-long instead of overflowing (issue 14).
            t.insert(
                "count".into(),
                AMQPValue::LongLongInt(count.saturating_add(1)),
            );
            t
        }
        None => {
            let mut t = FieldTable::default();
            t.insert("count".into(), AMQPValue::LongLongInt(1));
            t.insert("reason".into(), AMQPValue::LongString(reason_s.into()));
            t.insert("queue".into(), AMQPValue::LongString(queue.into()));
            t.insert("time".into(), AMQPValue::Timestamp(now_secs));
            t.insert(
                "exchange".into(),
                AMQPValue::LongString(msg.exchange.as_str().into()),
            );
            let mut keys = FieldArray::default();
            for k in &death_keys {
                keys.push(AMQPValue::LongString(k.as_str().into()));
            }
            t.insert("routing-keys".into(), AMQPValue::FieldArray(keys));
            if let Some(e) = &expiration {
                t.insert(
                    "original-expiration".into(),
                    AMQPValue::LongString(e.as_str().into()),
                );
            }
            t
        }
    };
    let first_death = deaths.is_empty() && existing.is_none();
    deaths.insert(0, AMQPValue::FieldTable(entry));
    let history: Vec<Death> = deaths
        .iter()
        .filter_map(|d| match d {
            AMQPValue::FieldTable(t) => Some(Death {
                queue: str_field(t, "queue")?,
                reason: str_field(t, "reason")?,
            }),
            _ => None,
        })
        .collect();
    let mut array = FieldArray::default();
    for d in deaths {
        array.push(d);
    }
    headers.insert("x-death".into(), AMQPValue::FieldArray(array));
    if first_death && !headers.contains_key("x-first-death-reason") {
        headers.insert(
            "x-first-death-reason".into(),
            AMQPValue::LongString(reason_s.into()),
        );
        headers.insert(
            "x-first-death-queue".into(),
            AMQPValue::LongString(queue.into()),
        );
        headers.insert(
            "x-first-death-exchange".into(),
            AMQPValue::LongString(msg.exchange.as_str().into()),
        );
    }
    if target.routing_key.is_some() {
        remove_key(&mut headers, "CC");
    }
    let new_props = rebuild(&props, headers.clone());
    let message = StoredMessage {
        exchange: target.exchange.clone(),
        routing_key: routing_keys.first().cloned().unwrap_or_default(),
        bcc: if target.routing_key.is_some() {
            Vec::new()
        } else {
            msg.bcc.clone()
        },
        properties: encode_properties(&new_props),
        body: msg.body.clone(),
    };
    DeadLettered {
        message,
        routing_keys,
        deaths: history,
        headers,
    }
}

/// Properties without `expiration`, with `headers` replaced.
fn rebuild(p: &AMQPProperties, headers: FieldTable) -> AMQPProperties {
    let mut n = AMQPProperties::default().with_headers(headers);
    if let Some(v) = p.content_type() {
        n = n.with_content_type(v.clone());
    }
    if let Some(v) = p.content_encoding() {
        n = n.with_content_encoding(v.clone());
    }
    if let Some(v) = p.delivery_mode() {
        n = n.with_delivery_mode(*v);
    }
    if let Some(v) = p.priority() {
        n = n.with_priority(*v);
    }
    if let Some(v) = p.correlation_id() {
        n = n.with_correlation_id(v.clone());
    }
    if let Some(v) = p.reply_to() {
        n = n.with_reply_to(v.clone());
    }
    if let Some(v) = p.message_id() {
        n = n.with_message_id(v.clone());
    }
    if let Some(v) = p.timestamp() {
        n = n.with_timestamp(*v);
    }
    if let Some(v) = p.kind() {
        n = n.with_type(v.clone());
    }
    if let Some(v) = p.user_id() {
        n = n.with_user_id(v.clone());
    }
    if let Some(v) = p.app_id() {
        n = n.with_app_id(v.clone());
    }
    if let Some(v) = p.cluster_id() {
        n = n.with_cluster_id(v.clone());
    }
    n
}

fn remove_key(t: &mut FieldTable, key: &str) {
    let mut n = FieldTable::default();
    for (k, v) in t.inner() {
        if k.as_str() != key {
            n.insert(k.clone(), v.clone());
        }
    }
    *t = n;
}

fn str_field(t: &FieldTable, key: &str) -> Option<String> {
    match t.inner().get(key)? {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_string()),
        _ => None,
    }
}

fn int_value(v: &AMQPValue) -> Option<i64> {
    Some(match v {
        AMQPValue::ShortShortInt(i) => i64::from(*i),
        AMQPValue::ShortShortUInt(i) => i64::from(*i),
        AMQPValue::ShortInt(i) => i64::from(*i),
        AMQPValue::ShortUInt(i) => i64::from(*i),
        AMQPValue::LongInt(i) => i64::from(*i),
        AMQPValue::LongUInt(i) => i64::from(*i),
        AMQPValue::LongLongInt(i) => *i,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn msg(props: AMQPProperties, bcc: Vec<String>) -> StoredMessage {
        StoredMessage {
            exchange: "normal.exchange.test".into(),
            routing_key: "a.normal.routing.key".into(),
            bcc,
            properties: encode_properties(&props),
            body: Bytes::from_static(b"hello"),
        }
    }

    fn target(rk: Option<&str>) -> DeadLetterTarget {
        DeadLetterTarget {
            exchange: "dl.exchange.test".into(),
            routing_key: rk.map(str::to_string),
        }
    }

    fn headers_of(m: &StoredMessage) -> (AMQPProperties, FieldTable) {
        let (_, p) = basic::parse_properties(&m.properties[..]).expect("props");
        let h = p.headers().clone().expect("headers");
        (p, h)
    }

    fn death(h: &FieldTable, i: usize) -> FieldTable {
        match h.inner().get("x-death") {
            Some(AMQPValue::FieldArray(a)) => match &a.as_slice()[i] {
                AMQPValue::FieldTable(t) => t.clone(),
                other => panic!("not a table: {other:?}"),
            },
            other => panic!("no x-death: {other:?}"),
        }
    }

    #[test]
    fn first_death_sets_every_field() {
        let props = AMQPProperties::default()
            .with_expiration("5000".into())
            .with_message_id("m".into());
        let m = msg(props, vec![]);
        let out = rewrite(
            &m,
            "normal.queue.test",
            DeadLetterReason::Expired,
            &target(None),
            1_700_000_000,
        );
        assert_eq!(out.message.exchange, "dl.exchange.test");
        assert_eq!(out.routing_keys, vec!["a.normal.routing.key".to_string()]);
        let (p, h) = headers_of(&out.message);
        assert_eq!(p.expiration(), &None);
        assert_eq!(p.message_id().as_ref().map(|s| s.as_str()), Some("m"));
        let d = death(&h, 0);
        assert_eq!(d.inner().get("count"), Some(&AMQPValue::LongLongInt(1)));
        assert_eq!(
            d.inner().get("reason"),
            Some(&AMQPValue::LongString("expired".into()))
        );
        assert_eq!(
            d.inner().get("queue"),
            Some(&AMQPValue::LongString("normal.queue.test".into()))
        );
        assert_eq!(
            d.inner().get("time"),
            Some(&AMQPValue::Timestamp(1_700_000_000))
        );
        assert_eq!(
            d.inner().get("exchange"),
            Some(&AMQPValue::LongString("normal.exchange.test".into()))
        );
        assert_eq!(
            d.inner().get("original-expiration"),
            Some(&AMQPValue::LongString("5000".into()))
        );
        let mut keys = FieldArray::default();
        keys.push(AMQPValue::LongString("a.normal.routing.key".into()));
        assert_eq!(
            d.inner().get("routing-keys"),
            Some(&AMQPValue::FieldArray(keys))
        );
        assert_eq!(
            h.inner().get("x-first-death-reason"),
            Some(&AMQPValue::LongString("expired".into()))
        );
        assert_eq!(
            h.inner().get("x-first-death-queue"),
            Some(&AMQPValue::LongString("normal.queue.test".into()))
        );
        assert_eq!(
            h.inner().get("x-first-death-exchange"),
            Some(&AMQPValue::LongString("normal.exchange.test".into()))
        );
    }

    #[test]
    fn repeated_death_increments_and_moves_to_front() {
        let m = msg(AMQPProperties::default(), vec![]);
        let a = rewrite(
            &m,
            "q1",
            DeadLetterReason::Rejected,
            &target(Some("q2")),
            10,
        )
        .message;
        let b = rewrite(
            &a,
            "q2",
            DeadLetterReason::Rejected,
            &target(Some("q1")),
            20,
        )
        .message;
        let c = rewrite(
            &b,
            "q1",
            DeadLetterReason::Rejected,
            &target(Some("q2")),
            30,
        );
        let (_, h) = headers_of(&c.message);
        let front = death(&h, 0);
        assert_eq!(
            front.inner().get("queue"),
            Some(&AMQPValue::LongString("q1".into()))
        );
        assert_eq!(front.inner().get("count"), Some(&AMQPValue::LongLongInt(2)));
        assert_eq!(
            front.inner().get("time"),
            Some(&AMQPValue::Timestamp(10)),
            "time keeps the first value"
        );
        assert_eq!(
            death(&h, 1).inner().get("queue"),
            Some(&AMQPValue::LongString("q2".into()))
        );
        assert_eq!(
            h.inner().get("x-first-death-queue"),
            Some(&AMQPValue::LongString("q1".into()))
        );
        assert_eq!(c.deaths.len(), 2);
    }

    #[test]
    fn a_client_supplied_count_at_the_maximum_stays_there() {
        let mut entry = FieldTable::default();
        entry.insert("count".into(), AMQPValue::LongLongInt(i64::MAX));
        entry.insert("reason".into(), AMQPValue::LongString("rejected".into()));
        entry.insert("queue".into(), AMQPValue::LongString("q".into()));
        let mut deaths = FieldArray::default();
        deaths.push(AMQPValue::FieldTable(entry));
        let mut h = FieldTable::default();
        h.insert("x-death".into(), AMQPValue::FieldArray(deaths));
        let m = msg(AMQPProperties::default().with_headers(h), vec![]);
        let out = rewrite(&m, "q", DeadLetterReason::Rejected, &target(None), 1);
        let (_, h) = headers_of(&out.message);
        assert_eq!(
            death(&h, 0).inner().get("count"),
            Some(&AMQPValue::LongLongInt(i64::MAX))
        );
    }

    #[test]
    fn cc_and_bcc_keys() {
        let mut h = FieldTable::default();
        let mut cc = FieldArray::default();
        cc.push(AMQPValue::LongString("cc 1".into()));
        h.insert("CC".into(), AMQPValue::FieldArray(cc));
        let m = msg(
            AMQPProperties::default().with_headers(h),
            vec!["bcc 1".into()],
        );
        let out = rewrite(&m, "q", DeadLetterReason::Rejected, &target(None), 1);
        assert_eq!(
            out.routing_keys,
            vec![
                "a.normal.routing.key".to_string(),
                "cc 1".into(),
                "bcc 1".into()
            ]
        );
        let (_, h) = headers_of(&out.message);
        assert!(h.contains_key("CC"), "CC kept without a DLRK");
        let with_rk = rewrite(&m, "q", DeadLetterReason::Rejected, &target(Some("rk")), 1);
        assert_eq!(with_rk.routing_keys, vec!["rk".to_string()]);
        assert_eq!(with_rk.message.routing_key, "rk");
        let (_, h) = headers_of(&with_rk.message);
        assert!(!h.contains_key("CC"), "3.10 removes CC when a DLRK is set");
        let keys = match death(&h, 0).inner().get("routing-keys") {
            Some(AMQPValue::FieldArray(a)) => a.as_slice().len(),
            _ => 0,
        };
        assert_eq!(keys, 2, "routing-keys has the publish key and CC, not BCC");
    }
}
