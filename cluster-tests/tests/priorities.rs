//! Consumer priorities (`x-priority` on basic.consume) and message
//! priorities (`x-max-priority` queues, the `priority` property), issue 28
//! items 4 and 5: pushes go to the highest consumer priority with prefetch
//! to spare, round-robin among equals; a priority queue delivers strictly
//! highest message priority first, FIFO within one, on quorum queues (1-32,
//! a RabbitMQ 4.3-style difference), classic-declared and exclusive queues
//! (1-255), across a restart and a leader kill.

use cluster_tests::cluster::{self, Cluster};
use cluster_tests::*;
use lapin::{
    options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions, QueueDeclareOptions},
    types::{AMQPValue, FieldTable},
    BasicProperties, Channel, Connection, Consumer,
};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(20);

/// A consumer on its own channel with basic.qos `prefetch` and `x-priority`
/// `priority` (None: no argument).
async fn consumer(
    conn: &Connection,
    q: &str,
    prefetch: u16,
    priority: Option<i32>,
) -> anyhow::Result<(Channel, Consumer)> {
    let ch = conn.create_channel().await?;
    ch.basic_qos(prefetch, BasicQosOptions::default()).await?;
    let args = match priority {
        Some(p) => table(&[("x-priority", AMQPValue::LongInt(p))]),
        None => FieldTable::default(),
    };
    let c = ch
        .basic_consume(q.into(), "".into(), BasicConsumeOptions::default(), args)
        .await?;
    Ok((ch, c))
}

/// Message `seq` published with priority property `prio` (None: none);
/// the body is `[prio or 0, seq hi, seq lo]`.
async fn publish_prio(ch: &Channel, q: &str, seq: u16, prio: Option<u8>) -> anyhow::Result<()> {
    let mut props = BasicProperties::default();
    if let Some(p) = prio {
        props = props.with_priority(p);
    }
    let body = [prio.unwrap_or(0), (seq >> 8) as u8, seq as u8];
    publish_confirmed(ch, "", q, &body, props).await
}

/// The priorities used by the ordering tests: a mix with repeats, some
/// without the property, some above `max` (kept as `max`).
fn mixed_priorities(max: u8, n: u16) -> Vec<Option<u8>> {
    (0..n)
        .map(|i| match i % 7 {
            0 => None,
            6 => Some(max.saturating_add(3)),
            _ => Some(((u32::from(i) * 37) % (u32::from(max) + 1)) as u8),
        })
        .collect()
}

/// The publish sequence numbers of `prios` in the order a queue with
/// `x-max-priority` `max` delivers them: by priority (clamped to `max`, none
/// = 0), highest first, publish order within one.
fn expected_order(prios: &[Option<u8>], max: u8) -> Vec<u16> {
    let mut order: Vec<(u8, u16)> = prios
        .iter()
        .enumerate()
        .map(|(seq, p)| (p.unwrap_or(0).min(max), seq as u16))
        .collect();
    order.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    order.into_iter().map(|(_, seq)| seq).collect()
}

/// The publish sequence numbers of deliveries (see [`publish_prio`]).
fn seqs(got: &[lapin::message::Delivery]) -> Vec<u16> {
    got.iter()
        .map(|d| u16::from(d.data[1]) << 8 | u16::from(d.data[2]))
        .collect()
}

/// Publishes `prios` in order, then consumes everything and checks the
/// order: strictly by priority (clamped to `max`), highest first, and in
/// publish order within one priority.
async fn check_priority_order(
    conn: &Connection,
    pub_ch: &Channel,
    q: &str,
    max: u8,
    prios: &[Option<u8>],
) -> anyhow::Result<()> {
    for (seq, p) in prios.iter().enumerate() {
        publish_prio(pub_ch, q, seq as u16, *p).await?;
    }
    let (ch, mut c) = consumer(conn, q, 1000, None).await?;
    let got = consume_n(&mut c, prios.len(), WAIT).await?;
    assert_eq!(
        seqs(&got),
        expected_order(prios, max),
        "delivery order of {q}"
    );
    for d in &got {
        d.ack(BasicAckOptions::default()).await?;
    }
    ch.close(200, "bye".into()).await?;
    Ok(())
}

/// (a) Every message goes to the priority-10 consumer while it has prefetch
/// to spare; the priority-0 consumer gets nothing.
#[tokio::test]
async fn higher_consumer_priority_takes_every_message() -> anyhow::Result<()> {
    bounded(Duration::from_secs(60), async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let ch = confirm_channel(&conn).await?;
        let q = unique("prio.cons");
        ch.queue_declare(q.as_str().into(), durable(), quorum_args(&[]))
            .await?;
        let (_low_ch, mut low) = consumer(&conn, &q, 100, Some(0)).await?;
        let (_high_ch, mut high) = consumer(&conn, &q, 100, Some(10)).await?;
        for i in 0..50 {
            publish_prio(&ch, &q, i, None).await?;
        }
        let got = consume_n(&mut high, 50, WAIT).await?;
        let seqs: Vec<u16> = got.iter().map(|d| u16::from(d.data[2])).collect();
        assert_eq!(seqs, (0..50).collect::<Vec<_>>());
        expect_no_delivery(&mut low, Duration::from_millis(500)).await?;
        close_connection(&conn).await
    })
    .await
}

/// (b) The priority-10 consumer has prefetch 1 and does not ack: the
/// priority-0 consumer gets the other 49. Round-robin holds among equal
/// priorities: two priority-5 consumers share the pushes.
#[tokio::test]
async fn lower_priority_gets_what_higher_prefetch_cannot_take() -> anyhow::Result<()> {
    bounded(Duration::from_secs(60), async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let ch = confirm_channel(&conn).await?;
        let q = unique("prio.spill");
        ch.queue_declare(q.as_str().into(), durable(), quorum_args(&[]))
            .await?;
        let (_high_ch, mut high) = consumer(&conn, &q, 1, Some(10)).await?;
        let (_low_ch, mut low) = consumer(&conn, &q, 100, Some(0)).await?;
        for i in 0..50 {
            publish_prio(&ch, &q, i, None).await?;
        }
        let first = consume_n(&mut high, 1, WAIT).await?;
        assert_eq!(first[0].data[2], 0, "the first message goes to priority 10");
        let rest = consume_n(&mut low, 49, WAIT).await?;
        let seqs: Vec<u16> = rest.iter().map(|d| u16::from(d.data[2])).collect();
        assert_eq!(seqs, (1..50).collect::<Vec<_>>());
        expect_no_delivery(&mut high, Duration::from_millis(300)).await?;

        // Equal priorities share: two priority-5 consumers, 20 messages.
        let q2 = unique("prio.rr");
        ch.queue_declare(q2.as_str().into(), durable(), quorum_args(&[]))
            .await?;
        let (_a_ch, mut a) = consumer(&conn, &q2, 100, Some(5)).await?;
        let (_b_ch, mut b) = consumer(&conn, &q2, 100, Some(5)).await?;
        let (_z_ch, mut z) = consumer(&conn, &q2, 100, Some(-1)).await?;
        for i in 0..20 {
            publish_prio(&ch, &q2, i, None).await?;
        }
        let got_a = consume_n(&mut a, 10, WAIT).await?;
        let got_b = consume_n(&mut b, 10, WAIT).await?;
        assert_eq!(got_a.len() + got_b.len(), 20);
        expect_no_delivery(&mut z, Duration::from_millis(300)).await?;
        close_connection(&conn).await
    })
    .await
}

/// (c) A quorum queue with `x-max-priority` 10 delivers strictly by
/// priority, FIFO within one; a priority above 10 counts as 10, none as 0.
#[tokio::test]
async fn quorum_priority_queue_delivers_highest_first() -> anyhow::Result<()> {
    bounded(Duration::from_secs(60), async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let ch = confirm_channel(&conn).await?;
        let q = unique("prio.qq");
        ch.queue_declare(
            q.as_str().into(),
            durable(),
            quorum_args(&[("x-max-priority", AMQPValue::ShortShortUInt(10))]),
        )
        .await?;
        check_priority_order(&conn, &ch, &q, 10, &mixed_priorities(10, 80)).await?;
        close_connection(&conn).await
    })
    .await
}

/// (d) A classic-declared durable queue and an exclusive queue take
/// `x-max-priority` 255 and deliver by priority.
#[tokio::test]
async fn classic_and_exclusive_priority_queues_deliver_highest_first() -> anyhow::Result<()> {
    bounded(Duration::from_secs(60), async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let ch = confirm_channel(&conn).await?;
        let classic = unique("prio.classic");
        ch.queue_declare(
            classic.as_str().into(),
            durable(),
            table(&[
                ("x-queue-type", s("classic")),
                ("x-max-priority", AMQPValue::LongInt(255)),
            ]),
        )
        .await?;
        check_priority_order(&conn, &ch, &classic, 255, &mixed_priorities(255, 60)).await?;
        let exclusive = unique("prio.excl");
        ch.queue_declare(
            exclusive.as_str().into(),
            QueueDeclareOptions {
                exclusive: true,
                ..Default::default()
            },
            table(&[("x-max-priority", AMQPValue::LongInt(200))]),
        )
        .await?;
        check_priority_order(&conn, &ch, &exclusive, 200, &mixed_priorities(200, 60)).await?;
        close_connection(&conn).await
    })
    .await
}

/// (e) `x-max-priority` 33 on a quorum queue is refused with 406; so is a
/// non-integer `x-priority` on basic.consume (RabbitMQ 3.10.8 text).
#[tokio::test]
async fn out_of_range_and_mistyped_priorities_are_refused() -> anyhow::Result<()> {
    bounded(Duration::from_secs(60), async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let ch = conn.create_channel().await?;
        let q = unique("prio.bad");
        let err = expect_amqp_error(
            ch.queue_declare(
                q.as_str().into(),
                durable(),
                quorum_args(&[("x-max-priority", AMQPValue::LongInt(33))]),
            )
            .await,
        );
        assert_eq!(
            err,
            (
                406,
                format!(
                    "PRECONDITION_FAILED - invalid arg 'x-max-priority' for queue '{q}' in vhost '/': {{max_value_exceeded,33}}"
                )
            )
        );
        let ch = conn.create_channel().await?;
        ch.queue_declare(
            q.as_str().into(),
            durable(),
            quorum_args(&[("x-max-priority", AMQPValue::LongInt(32))]),
        )
        .await?;
        let err = expect_amqp_error(
            ch.basic_consume(
                q.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                table(&[("x-priority", s("high"))]),
            )
            .await,
        );
        assert_eq!(
            err,
            (
                406,
                format!(
                    "PRECONDITION_FAILED - invalid arg 'x-priority' for queue '{q}' in vhost '/': \"expected integer, got longstr\""
                )
            )
        );
        close_connection(&conn).await
    })
    .await
}

/// (f) Single active consumer: a consumer of higher priority that
/// subscribes takes the new pushes; the one it replaces keeps (and can
/// still ack) what it holds.
#[tokio::test]
async fn single_active_consumer_hands_over_to_higher_priority() -> anyhow::Result<()> {
    bounded(Duration::from_secs(60), async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let ch = confirm_channel(&conn).await?;
        let q = unique("prio.sac");
        ch.queue_declare(
            q.as_str().into(),
            durable(),
            quorum_args(&[("x-single-active-consumer", AMQPValue::Boolean(true))]),
        )
        .await?;
        let (_low_ch, mut low) = consumer(&conn, &q, 100, None).await?;
        let (_mid_ch, mut mid) = consumer(&conn, &q, 100, Some(-5)).await?;
        for i in 0..3 {
            publish_prio(&ch, &q, i, None).await?;
        }
        let held = consume_n(&mut low, 3, WAIT).await?;
        expect_no_delivery(&mut mid, Duration::from_millis(300)).await?;
        let (_high_ch, mut high) = consumer(&conn, &q, 100, Some(5)).await?;
        for i in 3..6 {
            publish_prio(&ch, &q, i, None).await?;
        }
        let got = consume_n(&mut high, 3, WAIT).await?;
        let seqs: Vec<u8> = got.iter().map(|d| d.data[2]).collect();
        assert_eq!(seqs, vec![3, 4, 5]);
        expect_no_delivery(&mut low, Duration::from_millis(300)).await?;
        expect_no_delivery(&mut mid, Duration::from_millis(10)).await?;
        for d in held.iter().chain(got.iter()) {
            d.ack(BasicAckOptions::default()).await?;
        }
        close_connection(&conn).await
    })
    .await
}

/// (g) Priorities survive a restart: the order after `kill -9` and
/// recovery is the order before.
#[tokio::test]
async fn priority_order_survives_a_restart() -> anyhow::Result<()> {
    bounded(Duration::from_secs(90), async {
        let mut broker = Broker::start().await?;
        if broker.is_external() {
            return Ok(());
        }
        let q = unique("prio.restart");
        let prios = mixed_priorities(5, 40);
        {
            let conn = connect(broker.uri()).await?;
            let ch = confirm_channel(&conn).await?;
            ch.queue_declare(
                q.as_str().into(),
                durable(),
                quorum_args(&[("x-max-priority", AMQPValue::LongInt(5))]),
            )
            .await?;
            for (seq, p) in prios.iter().enumerate() {
                publish_prio(&ch, &q, seq as u16, *p).await?;
            }
            close_connection(&conn).await?;
        }
        broker.restart().await?;
        let conn = connect(broker.uri()).await?;
        let (_cch, mut c) = cluster::retry(WAIT, "consume after restart", || async {
            consumer(&conn, &q, 1000, None).await
        })
        .await?;
        let got = consume_n(&mut c, prios.len(), WAIT).await?;
        assert_eq!(seqs(&got), expected_order(&prios, 5), "order after restart");
        close_connection(&conn).await
    })
    .await
}

/// Three nodes: the priority order holds after the queue's leader is
/// killed and another member takes over.
#[tokio::test]
async fn priority_order_survives_a_leader_kill() -> anyhow::Result<()> {
    bounded(Duration::from_secs(150), async {
        let c = Cluster::start(3).await?;
        let q = unique("prio.failover");
        let conn1 = connect(&c.uri(1)).await?;
        let ch1 = confirm_channel(&conn1).await?;
        cluster::declare_durable(
            &ch1,
            &q,
            quorum_args(&[("x-max-priority", AMQPValue::LongInt(8))]),
        )
        .await?;
        let leader = c.wait_queue_leader(1, &q, Duration::from_secs(30)).await?;
        let client = c.ids().find(|id| *id != leader).expect("three nodes");
        close_connection(&conn1).await?;
        let conn = connect(&c.uri(client)).await?;
        let ch = confirm_channel(&conn).await?;
        let prios = mixed_priorities(8, 60);
        for (seq, p) in prios.iter().enumerate() {
            publish_prio(&ch, &q, seq as u16, *p).await?;
        }
        c.kill9(leader);
        let now = c
            .wait_queue_leader(client, &q, Duration::from_secs(30))
            .await?;
        assert_ne!(now, leader);
        let (_cch, mut cons) = cluster::retry(WAIT, "consume after failover", || async {
            consumer(&conn, &q, 1000, None).await
        })
        .await?;
        let got = consume_n(&mut cons, prios.len(), Duration::from_secs(30)).await?;
        assert_eq!(
            seqs(&got),
            expected_order(&prios, 8),
            "order after the leader kill"
        );
        close_connection(&conn).await
    })
    .await
}
