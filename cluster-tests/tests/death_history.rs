//! Death headers as RabbitMQ 4.x writes them, from the broker's own death
//! history (issue 28 item 1; spec §3.4-3.5 and §4; RabbitMQ 4.0.1 release
//! notes: x-death; celery/celery#9867):
//!
//! * `x-last-death-{reason,queue,exchange}` on every dead letter, updated at
//!   each death, `x-first-death-*` unchanged;
//! * a client-supplied `x-death` / `x-first-death-*` / `x-last-death-*` is
//!   delivered untouched until the broker dead-letters the message, is then
//!   replaced by the broker's history, and never makes a cycle: the Celery 5.5
//!   retry through kombu's native delayed delivery (a message republished with
//!   the `x-death` of an earlier pass through the delay queues) is delivered
//!   instead of being held forever;
//! * a cycle the broker made itself (two queues expiring into each other) is
//!   still detected: held (at-least-once) or dropped (at-most-once).
//!
//! The 4.x behaviours are quorumq's deliberate difference from RabbitMQ 3.10.8
//! (README, "Deliberate differences"): against an external broker
//! (`QUORUMQ_TEST_URI`) only the cycle test runs, which 3.10.8 passes too.

use cluster_tests::dlx::*;
// longstr values are `ls` here (`s` is also the strategy's name in the suites).
use cluster_tests::s as ls;
use cluster_tests::*;
use lapin::{
    options::{BasicAckOptions, BasicRejectOptions, ExchangeBindOptions, QueueDeleteOptions},
    types::{AMQPValue, FieldTable},
    BasicProperties, Channel, ExchangeKind,
};
use std::time::Duration;

const T: Duration = Duration::from_secs(90);
/// How long a dead letter may take to arrive (TTLs here are ≤ 400 ms).
const ARRIVAL: Duration = Duration::from_secs(15);

/// Declares a durable queue with `args`.
async fn declare(ch: &Channel, q: &str, args: &[(&str, AMQPValue)]) -> anyhow::Result<()> {
    ch.queue_declare(q.into(), durable(), table(args)).await?;
    Ok(())
}

/// Declares a durable exchange of `kind`.
async fn exchange(ch: &Channel, x: &str, kind: ExchangeKind) -> anyhow::Result<()> {
    ch.exchange_declare(
        x.into(),
        kind,
        lapin::options::ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await?;
    Ok(())
}

/// Source-queue arguments of `strategy` plus `extra`.
fn source_args<'a>(s: Strategy, extra: &[(&'a str, AMQPValue)]) -> Vec<(&'a str, AMQPValue)> {
    let mut v: Vec<(&'a str, AMQPValue)> = s.queue_args();
    v.extend_from_slice(extra);
    v
}

/// Deletes `queues`, ignoring errors (cleanup after a passed test).
async fn delete_all(ch: &Channel, queues: &[&str]) {
    for q in queues {
        let _ = ch
            .queue_delete((*q).into(), QueueDeleteOptions::default())
            .await;
    }
}

#[track_caller]
fn assert_header(d: &lapin::message::Delivery, key: &str, want: &str) {
    assert_eq!(header(d, key), Some(&s(want)), "header {key}");
}

/// Q1 -reject-> DLX `dlx1` -> Q2 -reject-> DLX "" (DLRK Q3) -> Q3: after each
/// death `x-last-death-*` names that death (exchange = the one the message was
/// published to before it), `x-first-death-*` the first.
async fn last_death_headers_follow_each_death(strategy: Strategy) -> anyhow::Result<()> {
    let broker = Broker::start().await?;
    if broker.is_external() {
        return Ok(()); // x-last-death-* is 3.13+; 3.10.8 does not write it.
    }
    let conn = connect(broker.uri()).await?;
    let ch = confirm_channel(&conn).await?;
    let q1 = unique("death_last_q1");
    let q2 = unique("death_last_q2");
    let q3 = unique("death_last_q3");
    let dlx1 = unique("death_last_dlx1");
    exchange(&ch, &dlx1, ExchangeKind::Direct).await?;
    declare(
        &ch,
        &q1,
        &source_args(strategy, &[("x-dead-letter-exchange", ls(&dlx1))]),
    )
    .await?;
    declare(
        &ch,
        &q2,
        &source_args(
            strategy,
            &[
                ("x-dead-letter-exchange", ls("")),
                ("x-dead-letter-routing-key", ls(&q3)),
            ],
        ),
    )
    .await?;
    declare(&ch, &q3, &[]).await?;
    bind(&ch, &q2, &dlx1, &q1).await?;

    publish(&ch, &q1, &["m"]).await?;
    let d = consume(&ch, &q1, &["m"]).await?.remove(0);
    ch.basic_reject(d.delivery_tag, BasicRejectOptions { requeue: false })
        .await?;
    let d = get_eventually(&ch, &q2, "m", ARRIVAL).await?;
    for (k, v) in [
        ("x-first-death-reason", "rejected"),
        ("x-first-death-queue", q1.as_str()),
        ("x-first-death-exchange", ""),
        ("x-last-death-reason", "rejected"),
        ("x-last-death-queue", q1.as_str()),
        ("x-last-death-exchange", ""),
    ] {
        assert_header(&d, k, v);
    }
    assert_eq!(x_death(&d).len(), 1);

    ch.basic_reject(d.delivery_tag, BasicRejectOptions { requeue: false })
        .await?;
    let d = get_eventually(&ch, &q3, "m", ARRIVAL).await?;
    for (k, v) in [
        ("x-first-death-reason", "rejected"),
        ("x-first-death-queue", q1.as_str()),
        ("x-first-death-exchange", ""),
        ("x-last-death-reason", "rejected"),
        ("x-last-death-queue", q2.as_str()),
        ("x-last-death-exchange", dlx1.as_str()),
    ] {
        assert_header(&d, k, v);
    }
    let deaths = x_death(&d);
    assert_eq!(deaths.len(), 2, "x-death: {deaths:?}");
    assert_eq!(field(&deaths[0], "queue"), Some(&s(&q2)));
    assert_eq!(field(&deaths[0], "exchange"), Some(&s(&dlx1)));
    assert_eq!(field(&deaths[1], "queue"), Some(&s(&q1)));
    ch.basic_ack(d.delivery_tag, BasicAckOptions::default())
        .await?;
    wait_for_messages(&broker, &q1, [0, 0, 0]).await?;
    wait_for_messages(&broker, &q2, [0, 0, 0]).await?;
    delete_all(&ch, &[&q1, &q2, &q3]).await;
    ch.exchange_delete(dlx1.as_str().into(), Default::default())
        .await?;
    close_connection(&conn).await
}

/// Death headers a client publishes are delivered as it sent them, byte for
/// value, while the broker has not dead-lettered the message.
async fn client_death_headers_are_delivered_untouched() -> anyhow::Result<()> {
    let broker = Broker::start().await?;
    if broker.is_external() {
        return Ok(());
    }
    let conn = connect(broker.uri()).await?;
    let ch = confirm_channel(&conn).await?;
    let q = unique("death_untouched");
    declare(&ch, &q, &[("x-queue-type", ls("quorum"))]).await?;
    let headers = forged_history("delay_0");
    publish_props(
        &ch,
        &q,
        &["m"],
        BasicProperties::default().with_headers(headers.clone()),
    )
    .await?;
    let d = consume(&ch, &q, &["m"]).await?.remove(0);
    for (k, v) in headers.inner() {
        assert_eq!(header(&d, k.as_str()), Some(v), "header {k}");
    }
    delete_all(&ch, &[&q]).await;
    close_connection(&conn).await
}

/// A death history as a client would publish it: one `expired` death from
/// `queue` with count 7, and x-first/last-death-* naming it.
fn forged_history(queue: &str) -> FieldTable {
    let entry = table(&[
        ("count", long(7)),
        ("reason", ls("expired")),
        ("queue", ls(queue)),
        ("time", AMQPValue::Timestamp(1_700_000_000)),
        ("exchange", ls("celery_delayed_0")),
        ("routing-keys", ls_array(&["1.1.task"])),
    ]);
    let mut deaths = lapin::types::FieldArray::default();
    deaths.push(AMQPValue::FieldTable(entry));
    let mut h = table(&[
        ("x-first-death-reason", ls("expired")),
        ("x-first-death-queue", ls(queue)),
        ("x-first-death-exchange", ls("celery_delayed_0")),
        ("x-last-death-reason", ls("expired")),
        ("x-last-death-queue", ls(queue)),
        ("x-last-death-exchange", ls("celery_delayed_0")),
        ("app", ls("celery")),
    ]);
    h.insert("x-death".into(), AMQPValue::FieldArray(deaths));
    h
}

/// kombu's native delayed delivery (`kombu/transport/native_delayed_delivery.py`)
/// cut to two levels: routing key `<bit 1>.<bit 0>.task`; exchange `x1` routes
/// bit 1 = 1 to `delay_1` (TTL 2 units, DLX `x0`) and bit 1 = 0 on to `x0`;
/// `x0` routes bit 0 = 1 to `delay_0` (TTL 1 unit, DLX `xd`) and bit 0 = 0 on
/// to `xd`; `xd` routes `#.task` to the work queue. Delay queues are
/// at-least-once quorum queues, as kombu declares them.
///
/// A 3-unit delay (`1.1.task`) passes delay_1 then delay_0. Celery's second
/// `self.retry(countdown=3)` republishes the delivered message, `x-death` of
/// the first pass included; RabbitMQ 3.10.8 (and quorumq before issue 28)
/// read that `x-death` as a cycle into delay_0 and held the retry forever.
async fn celery_retry_through_delay_queues_is_delivered() -> anyhow::Result<()> {
    let broker = Broker::start().await?;
    if broker.is_external() {
        return Ok(()); // 3.10.8 holds the retry: the behaviour this test rules out.
    }
    let conn = connect(broker.uri()).await?;
    let ch = confirm_channel(&conn).await?;
    let x1 = unique("celery_delayed_1");
    let x0 = unique("celery_delayed_0");
    let xd = unique("celery_delivery");
    let delay_1 = x1.clone();
    let delay_0 = x0.clone();
    let work = unique("celery_work");
    for x in [&x1, &x0, &xd] {
        exchange(&ch, x, ExchangeKind::Topic).await?;
    }
    declare(&ch, &delay_1, &delay_args(&x0, 400)).await?;
    declare(&ch, &delay_0, &delay_args(&xd, 200)).await?;
    declare(&ch, &work, &[("x-queue-type", ls("quorum"))]).await?;
    bind(&ch, &delay_1, &x1, "1.#").await?;
    bind(&ch, &delay_0, &x0, "*.1.#").await?;
    bind(&ch, &work, &xd, "#.task").await?;
    for (src, dst, key) in [(&x1, &x0, "0.#"), (&x0, &xd, "*.0.#")] {
        ch.exchange_bind(
            dst.as_str().into(),
            src.as_str().into(),
            key.into(),
            ExchangeBindOptions::default(),
            FieldTable::default(),
        )
        .await?;
    }

    // First pass: delay_1 -> delay_0 -> work.
    let app = table(&[("app", ls("celery"))]);
    publish_confirmed(
        &ch,
        &x1,
        "1.1.task",
        b"retry 1",
        BasicProperties::default().with_headers(app),
    )
    .await?;
    let first = get_eventually(&ch, &work, "retry 1", ARRIVAL).await?;
    let deaths = x_death(&first);
    assert_eq!(deaths.len(), 2, "x-death after the first pass: {deaths:?}");
    assert_eq!(field(&deaths[0], "queue"), Some(&s(&delay_0)));
    assert_eq!(field(&deaths[1], "queue"), Some(&s(&delay_1)));
    ch.basic_ack(first.delivery_tag, BasicAckOptions::default())
        .await?;

    // The retry: the same headers, x-death of the first pass included.
    let headers = first
        .properties
        .headers()
        .clone()
        .expect("first pass headers");
    publish_confirmed(
        &ch,
        &x1,
        "1.1.task",
        b"retry 2",
        BasicProperties::default().with_headers(headers),
    )
    .await?;
    let second = get_eventually(&ch, &work, "retry 2", ARRIVAL).await?;
    // (Checked after the retry, so that a broker that holds it fails on that.)
    assert_header(&first, "x-first-death-queue", &delay_1);
    assert_header(&first, "x-last-death-queue", &delay_0);
    assert_header(&first, "x-last-death-exchange", &x0);
    let deaths = x_death(&second);
    assert_eq!(deaths.len(), 2, "x-death after the retry: {deaths:?}");
    for (d, q) in deaths.iter().zip([&delay_0, &delay_1]) {
        assert_eq!(field(d, "queue"), Some(&s(q)));
        assert_eq!(
            field(d, "count"),
            Some(&long(1)),
            "a fresh history: the client's x-death is not continued"
        );
    }
    assert_header(&second, "x-first-death-queue", &delay_1);
    assert_header(&second, "x-last-death-queue", &delay_0);
    assert_header(&second, "app", "celery");
    ch.basic_ack(second.delivery_tag, BasicAckOptions::default())
        .await?;

    // A message published with a made-up history naming delay_0 goes through too.
    publish_confirmed(
        &ch,
        &x1,
        "1.1.task",
        b"forged",
        BasicProperties::default().with_headers(forged_history(&delay_0)),
    )
    .await?;
    let third = get_eventually(&ch, &work, "forged", ARRIVAL).await?;
    let deaths = x_death(&third);
    assert_eq!(deaths.len(), 2, "x-death of the forged one: {deaths:?}");
    assert_eq!(field(&deaths[0], "count"), Some(&long(1)));
    assert_eq!(field(&deaths[1], "count"), Some(&long(1)));
    assert_header(&third, "x-first-death-exchange", &x1);
    ch.basic_ack(third.delivery_tag, BasicAckOptions::default())
        .await?;

    wait_for_messages(&broker, &delay_1, [0, 0, 0]).await?;
    wait_for_messages(&broker, &delay_0, [0, 0, 0]).await?;
    delete_all(&ch, &[&delay_1, &delay_0, &work]).await;
    for x in [&x1, &x0, &xd] {
        ch.exchange_delete(x.as_str().into(), Default::default())
            .await?;
    }
    close_connection(&conn).await
}

/// A -expired-> B -expired-> A (DLX "", DLRKs naming each other): when B
/// expires the message towards A, the broker's history holds (B, expired),
/// (A, expired): a cycle. At-least-once holds it in B, at-most-once drops it
/// (a message still looping would always be in A or B). Also on RabbitMQ
/// 3.10.8.
async fn broker_made_expiry_cycle_is_detected(s: Strategy) -> anyhow::Result<()> {
    let broker = Broker::start().await?;
    let conn = connect(broker.uri()).await?;
    let ch = confirm_channel(&conn).await?;
    let a = unique("death_cycle_a");
    let b = unique("death_cycle_b");
    declare(&ch, &a, &expiring_into(s, &b)).await?;
    declare(&ch, &b, &expiring_into(s, &a)).await?;
    publish(&ch, &a, &["m"]).await?;
    let (held_in_b, empty) = match s {
        Strategy::AtLeastOnce => ([1, 0, 0], [0, 0, 0]),
        Strategy::AtMostOnce => ([0, 0, 0], [0, 0, 0]),
    };
    if s == Strategy::AtMostOnce {
        // Let it pass A (100 ms) and B (100 ms) first: B holds it for a moment.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    wait_for_messages(&broker, &b, held_in_b).await?;
    wait_for_messages(&broker, &a, empty).await?;
    consistently_messages(&broker, &b, held_in_b, Duration::from_secs(2)).await?;
    consistently_messages(&broker, &a, empty, Duration::from_millis(600)).await?;
    delete_all(&ch, &[&a, &b]).await;
    close_connection(&conn).await
}

/// The delay-queue self-loop of a single queue (DLX "", no DLRK): the first
/// expiry already names the queue itself.
async fn self_expiry_cycle_is_detected(s: Strategy) -> anyhow::Result<()> {
    let broker = Broker::start().await?;
    let conn = connect(broker.uri()).await?;
    let ch = confirm_channel(&conn).await?;
    let q = unique("death_self_cycle");
    declare(
        &ch,
        &q,
        &source_args(
            s,
            &[
                ("x-message-ttl", long(100)),
                ("x-dead-letter-exchange", ls("")),
            ],
        ),
    )
    .await?;
    publish(&ch, &q, &["m"]).await?;
    let want = match s {
        Strategy::AtLeastOnce => [1, 0, 0],
        Strategy::AtMostOnce => [0, 0, 0],
    };
    wait_for_messages(&broker, &q, want).await?;
    consistently_messages(&broker, &q, want, Duration::from_secs(2)).await?;
    delete_all(&ch, &[&q]).await;
    close_connection(&conn).await
}

/// A kombu delay queue: at-least-once, TTL `ttl_ms`, dead-lettering to `dlx`.
fn delay_args(dlx: &str, ttl_ms: i64) -> Vec<(&'static str, AMQPValue)> {
    source_args(
        Strategy::AtLeastOnce,
        &[
            ("x-message-ttl", long(ttl_ms)),
            ("x-dead-letter-exchange", ls(dlx)),
        ],
    )
}

/// A source queue of `s` whose messages expire after 100 ms into queue `q`.
fn expiring_into(s: Strategy, q: &str) -> Vec<(&'static str, AMQPValue)> {
    source_args(
        s,
        &[
            ("x-message-ttl", long(100)),
            ("x-dead-letter-exchange", ls("")),
            ("x-dead-letter-routing-key", ls(q)),
        ],
    )
}

#[tokio::test]
async fn last_death_headers_at_most_once() -> anyhow::Result<()> {
    bounded(
        T,
        last_death_headers_follow_each_death(Strategy::AtMostOnce),
    )
    .await
}

#[tokio::test]
async fn last_death_headers_at_least_once() -> anyhow::Result<()> {
    bounded(
        T,
        last_death_headers_follow_each_death(Strategy::AtLeastOnce),
    )
    .await
}

#[tokio::test]
async fn client_death_headers_untouched() -> anyhow::Result<()> {
    bounded(T, client_death_headers_are_delivered_untouched()).await
}

#[tokio::test]
async fn celery_retry_delivered() -> anyhow::Result<()> {
    bounded(T, celery_retry_through_delay_queues_is_delivered()).await
}

#[tokio::test]
async fn expiry_cycle_at_least_once() -> anyhow::Result<()> {
    bounded(
        T,
        broker_made_expiry_cycle_is_detected(Strategy::AtLeastOnce),
    )
    .await
}

#[tokio::test]
async fn expiry_cycle_at_most_once() -> anyhow::Result<()> {
    bounded(
        T,
        broker_made_expiry_cycle_is_detected(Strategy::AtMostOnce),
    )
    .await
}

#[tokio::test]
async fn self_expiry_cycle_at_least_once() -> anyhow::Result<()> {
    bounded(T, self_expiry_cycle_is_detected(Strategy::AtLeastOnce)).await
}

#[tokio::test]
async fn self_expiry_cycle_at_most_once() -> anyhow::Result<()> {
    bounded(T, self_expiry_cycle_is_detected(Strategy::AtMostOnce)).await
}
