//! The dead-lettered message (spec §3): exchange := the DLX; routing keys :=
//! [DLRK] or the message's keys (publish key + CC + BCC); `CC` removed when a
//! DLRK is set and `expiration` removed, as RabbitMQ 3.10 does; the death
//! recorded in the broker's own [`DeathHistory`] (count per queue and reason,
//! move-to-front) and the death headers written from that history as RabbitMQ
//! 4.x writes them: `x-death`, `x-first-death-*` and `x-last-death-*`, which
//! replace any the client supplied (RabbitMQ 4.0.1 release notes: x-death;
//! `mc:record_death/4`, `mc_amqpl:protocol_state/2`).

use amq_protocol::protocol::basic::{self, AMQPProperties};
use amq_protocol::types::{AMQPValue, FieldArray, FieldTable};

use crate::amqp::codec::encode_properties;
use crate::message::{Death, DeathEvent, DeathHistory, DeathRecord, StoredMessage, TrackedMessage};
use crate::meta::publish::cc_bcc_keys;
use crate::queue::types::{DeadLetterReason, DeadLetterTarget};

/// The rewritten message and the keys to route it with.
#[derive(Debug, Clone)]
pub struct DeadLettered {
    /// Message to enqueue into the targets (exchange = the DLX), with the
    /// death history after this event; encode it with
    /// [`TrackedMessage::encode`] (what `.encode()` on this field calls) so
    /// the history is stored with it.
    pub message: TrackedMessage,
    /// Routing keys for the DLX (the first is `basic.deliver.routing_key`).
    pub routing_keys: Vec<String>,
    /// The broker's death records after this event, most recent first (the
    /// current event at the head), for cycle checks (spec §4); a copy of
    /// `message.deaths.records`.
    pub deaths: Vec<DeathRecord>,
    /// Headers of the rewritten message (for headers-exchange DLXs).
    pub headers: FieldTable,
    /// The message's `priority` property (0 when absent): its priority in
    /// a target queue with `x-max-priority`.
    pub priority: u8,
}

/// Rewrites `msg`, dead-lettered from queue `queue` for `reason` at
/// `now_secs` (seconds since the epoch, x-death `time`), towards `target`.
/// The death is added to the broker's history in `msg.deaths`; a
/// client-supplied `x-death` / `x-first-death-*` / `x-last-death-*` header
/// is neither read nor continued, only replaced (RabbitMQ 4.0.1+). Property
/// bytes that do not parse are treated as empty properties.
pub fn rewrite(
    msg: &TrackedMessage,
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

    let mut deaths = msg.deaths.clone();
    deaths.record(&Death {
        queue,
        reason,
        exchange: &msg.exchange,
        routing_keys: &death_keys,
        expiration: expiration.as_deref(),
        now_secs,
    });
    write_death_headers(&mut headers, &deaths);
    if target.routing_key.is_some() {
        remove_key(&mut headers, "CC");
    }
    let new_props = rebuild(&props, headers.clone());
    let records = deaths.records.clone();
    let message = TrackedMessage {
        message: StoredMessage {
            exchange: target.exchange.clone(),
            routing_key: routing_keys.first().cloned().unwrap_or_default(),
            bcc: if target.routing_key.is_some() {
                Vec::new()
            } else {
                msg.bcc.clone()
            },
            properties: encode_properties(&new_props),
            body: msg.body.clone(),
        },
        deaths,
    };
    DeadLettered {
        message,
        routing_keys,
        deaths: records,
        headers,
        priority: props.priority().unwrap_or(0),
    }
}

/// Writes `x-death` (one table per record, most recent first, spec §3.4),
/// `x-first-death-{reason,queue,exchange}` and
/// `x-last-death-{reason,queue,exchange}` (spec §3.5) from the broker's
/// history into `headers`, replacing whatever values the headers held. An
/// empty history leaves `headers` as they are: a message the broker never
/// dead-lettered keeps the death headers its publisher set. `count` is a
/// long-long (`l`), at most `i64::MAX`.
pub fn write_death_headers(headers: &mut FieldTable, deaths: &DeathHistory) {
    if deaths.is_empty() {
        return;
    }
    let mut array = FieldArray::default();
    for r in &deaths.records {
        array.push(AMQPValue::FieldTable(death_table(r)));
    }
    headers.insert("x-death".into(), AMQPValue::FieldArray(array));
    if let Some(first) = &deaths.first {
        insert_event(headers, "x-first-death", first);
    }
    if let Some(last) = &deaths.last {
        insert_event(headers, "x-last-death", last);
    }
}

fn death_table(r: &DeathRecord) -> FieldTable {
    let mut t = FieldTable::default();
    let count = i64::try_from(r.count).unwrap_or(i64::MAX);
    t.insert("count".into(), AMQPValue::LongLongInt(count));
    t.insert(
        "reason".into(),
        AMQPValue::LongString(r.reason.as_str().into()),
    );
    t.insert(
        "queue".into(),
        AMQPValue::LongString(r.queue.as_str().into()),
    );
    t.insert("time".into(), AMQPValue::Timestamp(r.time_secs));
    t.insert(
        "exchange".into(),
        AMQPValue::LongString(r.exchange.as_str().into()),
    );
    let mut keys = FieldArray::default();
    for k in &r.routing_keys {
        keys.push(AMQPValue::LongString(k.as_str().into()));
    }
    t.insert("routing-keys".into(), AMQPValue::FieldArray(keys));
    if let Some(e) = &r.original_expiration {
        t.insert(
            "original-expiration".into(),
            AMQPValue::LongString(e.as_str().into()),
        );
    }
    t
}

fn insert_event(headers: &mut FieldTable, prefix: &str, e: &DeathEvent) {
    headers.insert(
        format!("{prefix}-reason").into(),
        AMQPValue::LongString(e.reason.as_str().into()),
    );
    headers.insert(
        format!("{prefix}-queue").into(),
        AMQPValue::LongString(e.queue.as_str().into()),
    );
    headers.insert(
        format!("{prefix}-exchange").into(),
        AMQPValue::LongString(e.exchange.as_str().into()),
    );
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

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn msg(props: AMQPProperties, bcc: Vec<String>) -> TrackedMessage {
        StoredMessage {
            exchange: "normal.exchange.test".into(),
            routing_key: "a.normal.routing.key".into(),
            bcc,
            properties: encode_properties(&props),
            body: Bytes::from_static(b"hello"),
        }
        .into()
    }

    fn ls(s: &str) -> AMQPValue {
        AMQPValue::LongString(s.into())
    }

    /// A client-made death history: an x-death entry for (`queue`, `reason`)
    /// with `count`, and x-first-death-* / x-last-death-* naming `queue`.
    fn forged_headers(queue: &str, reason: &str, count: i64) -> FieldTable {
        let mut entry = FieldTable::default();
        entry.insert("count".into(), AMQPValue::LongLongInt(count));
        entry.insert("reason".into(), ls(reason));
        entry.insert("queue".into(), ls(queue));
        entry.insert("exchange".into(), ls("forged.exchange"));
        entry.insert("time".into(), AMQPValue::Timestamp(5));
        let mut deaths = FieldArray::default();
        deaths.push(AMQPValue::FieldTable(entry));
        let mut h = FieldTable::default();
        h.insert("x-death".into(), AMQPValue::FieldArray(deaths));
        for prefix in ["x-first-death", "x-last-death"] {
            h.insert(format!("{prefix}-reason").into(), ls(reason));
            h.insert(format!("{prefix}-queue").into(), ls(queue));
            h.insert(format!("{prefix}-exchange").into(), ls("forged.exchange"));
        }
        h
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
    fn last_death_headers_follow_every_death_and_first_stays() {
        let m = msg(AMQPProperties::default(), vec![]);
        let a = rewrite(&m, "q1", DeadLetterReason::Expired, &target(None), 10);
        let (_, h) = headers_of(&a.message);
        for (k, v) in [
            ("x-first-death-reason", "expired"),
            ("x-first-death-queue", "q1"),
            ("x-first-death-exchange", "normal.exchange.test"),
            ("x-last-death-reason", "expired"),
            ("x-last-death-queue", "q1"),
            ("x-last-death-exchange", "normal.exchange.test"),
        ] {
            assert_eq!(h.inner().get(k), Some(&ls(v)), "{k} after the first death");
        }
        let b = rewrite(
            &a.message,
            "q2",
            DeadLetterReason::Rejected,
            &target(None),
            20,
        );
        let (_, h) = headers_of(&b.message);
        for (k, v) in [
            ("x-first-death-reason", "expired"),
            ("x-first-death-queue", "q1"),
            ("x-first-death-exchange", "normal.exchange.test"),
            ("x-last-death-reason", "rejected"),
            ("x-last-death-queue", "q2"),
            ("x-last-death-exchange", "dl.exchange.test"),
        ] {
            assert_eq!(h.inner().get(k), Some(&ls(v)), "{k} after the second death");
        }
        // A repeated (queue, reason) keeps the record's first exchange in x-death,
        // but x-last-death-exchange is the exchange at this death (mc:record_death/4).
        let c = rewrite(
            &b.message,
            "q1",
            DeadLetterReason::Expired,
            &target(None),
            30,
        );
        let (_, h) = headers_of(&c.message);
        assert_eq!(h.inner().get("x-last-death-queue"), Some(&ls("q1")));
        assert_eq!(
            h.inner().get("x-last-death-exchange"),
            Some(&ls("dl.exchange.test"))
        );
        assert_eq!(
            death(&h, 0).inner().get("exchange"),
            Some(&ls("normal.exchange.test"))
        );
        assert_eq!(
            death(&h, 0).inner().get("count"),
            Some(&AMQPValue::LongLongInt(2))
        );
        assert_eq!(h.inner().get("x-first-death-queue"), Some(&ls("q1")));
    }

    #[test]
    fn a_client_supplied_history_is_replaced_not_continued() {
        let forged = forged_headers("q", "rejected", i64::MAX);
        let m = msg(AMQPProperties::default().with_headers(forged), vec![]);
        assert!(
            m.deaths.is_empty(),
            "a published x-death is no broker history"
        );
        let out = rewrite(&m, "q", DeadLetterReason::Rejected, &target(None), 1);
        let (_, h) = headers_of(&out.message);
        let deaths = match h.inner().get("x-death") {
            Some(AMQPValue::FieldArray(a)) => a.as_slice().len(),
            other => panic!("x-death {other:?}"),
        };
        assert_eq!(deaths, 1, "the broker's one death, not the client's entry");
        let d = death(&h, 0);
        assert_eq!(d.inner().get("count"), Some(&AMQPValue::LongLongInt(1)));
        assert_eq!(d.inner().get("exchange"), Some(&ls("normal.exchange.test")));
        assert_eq!(d.inner().get("time"), Some(&AMQPValue::Timestamp(1)));
        assert_eq!(
            h.inner().get("x-first-death-exchange"),
            Some(&ls("normal.exchange.test"))
        );
        assert_eq!(
            h.inner().get("x-last-death-exchange"),
            Some(&ls("normal.exchange.test"))
        );
        assert_eq!(out.deaths.len(), 1);
        assert_eq!(out.deaths[0].count, 1);
    }

    #[test]
    fn a_client_supplied_history_names_no_cycle() {
        // Celery: the retry is published to delay_1 carrying the x-death of an
        // earlier pass through delay_0; delay_1 expires it towards delay_0.
        let forged = forged_headers("delay_0", "expired", 1);
        let m = msg(AMQPProperties::default().with_headers(forged), vec![]);
        let out = rewrite(&m, "delay_1", DeadLetterReason::Expired, &target(None), 1);
        assert!(!crate::dead_letter::cycle::is_cycle(&out.deaths, "delay_0"));
        // The broker's own pass through delay_0 is one.
        let next = rewrite(
            &out.message,
            "delay_0",
            DeadLetterReason::Expired,
            &target(None),
            2,
        );
        assert!(crate::dead_letter::cycle::is_cycle(&next.deaths, "delay_0"));
        assert!(crate::dead_letter::cycle::is_cycle(&next.deaths, "delay_1"));
    }

    #[test]
    fn the_history_survives_the_stored_encoding() {
        let m = msg(AMQPProperties::default(), vec![]);
        let a = rewrite(&m, "q1", DeadLetterReason::Expired, &target(None), 10);
        let stored = a.message.encode().expect("encode");
        let back = TrackedMessage::decode(&stored).expect("decode");
        assert_eq!(back, a.message);
        let b = rewrite(&back, "q1", DeadLetterReason::Expired, &target(None), 20);
        assert_eq!(b.deaths.len(), 1);
        assert_eq!(b.deaths[0].count, 2, "the count continues across a store");
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

    use proptest::prelude::*;

    fn any_value() -> impl Strategy<Value = AMQPValue> {
        prop_oneof![
            any::<i64>().prop_map(AMQPValue::LongLongInt),
            any::<i32>().prop_map(AMQPValue::LongInt),
            "[a-z_]{0,8}".prop_map(|s| ls(&s)),
            any::<u64>().prop_map(AMQPValue::Timestamp),
            any::<bool>().prop_map(AMQPValue::Boolean),
        ]
    }

    proptest! {
        /// Whatever death headers a client supplies (any types, any entries),
        /// the dead-lettered message's headers and history are exactly those of
        /// the same message published without them.
        #[test]
        fn client_death_headers_never_reach_the_history(
            entries in prop::collection::vec(
                prop::collection::vec((prop_oneof![
                    Just("queue"), Just("reason"), Just("count"), Just("exchange"), Just("time")
                ], any_value()), 0..5),
                0..4),
            first in any_value(),
            last in any_value(),
            x_death_not_array in any::<bool>(),
            reason_sel in 0u8..4,
        ) {
            let mut forged = FieldTable::default();
            if x_death_not_array {
                forged.insert("x-death".into(), first.clone());
            } else {
                let mut a = FieldArray::default();
                for e in entries {
                    let mut t = FieldTable::default();
                    for (k, v) in e {
                        t.insert(k.into(), v);
                    }
                    a.push(AMQPValue::FieldTable(t));
                }
                forged.insert("x-death".into(), AMQPValue::FieldArray(a));
            }
            for k in ["x-first-death-reason", "x-first-death-queue", "x-first-death-exchange"] {
                forged.insert(k.into(), first.clone());
            }
            for k in ["x-last-death-reason", "x-last-death-queue", "x-last-death-exchange"] {
                forged.insert(k.into(), last.clone());
            }
            let reason = [
                DeadLetterReason::Rejected,
                DeadLetterReason::Expired,
                DeadLetterReason::Maxlen,
                DeadLetterReason::DeliveryLimit,
            ][reason_sel as usize];
            let with = msg(AMQPProperties::default().with_headers(forged), vec![]);
            let without = msg(AMQPProperties::default().with_headers(FieldTable::default()), vec![]);
            let a = rewrite(&with, "q", reason, &target(None), 7);
            let b = rewrite(&without, "q", reason, &target(None), 7);
            prop_assert_eq!(&a.headers, &b.headers);
            prop_assert_eq!(&a.message.deaths, &b.message.deaths);
            prop_assert_eq!(&a.message.properties, &b.message.properties);
            let again_a = rewrite(&a.message, "q", reason, &target(None), 8);
            let again_b = rewrite(&b.message, "q", reason, &target(None), 8);
            prop_assert_eq!(again_a.headers, again_b.headers);
            prop_assert_eq!(again_a.deaths[0].count, 2);
        }
    }
}
