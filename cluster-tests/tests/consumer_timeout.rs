//! Consumer timeouts as RabbitMQ 4.3 has them (issue 28 item 3): a delivery
//! left unacknowledged past the consumer's timeout returns the consumer's
//! messages to the queue (redelivered) and cancels the consumer — basic.cancel
//! to a client that announced `consumer_cancel_notify` (lapin does; the channel
//! stays open), channel.close 406 with RabbitMQ's text to one that did not.
//! Sources: the `x-consumer-timeout` basic.consume argument (wins), the queue
//! argument and the `consumer-timeout` policy (the smaller), the node's
//! `--consumer-timeout`. The deadline is replicated state, so a new queue
//! leader honours it. quorumq only (RabbitMQ 3.10.8 always closes the channel).

use cluster_tests::{cluster::Cluster, raw::*, *};
use futures::StreamExt;
use lapin::{
    message::Delivery,
    options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions, QueueDeclareOptions},
    types::{AMQPValue, FieldTable},
    BasicProperties, Channel, Connection, Consumer,
};
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(90);

fn long(v: i64) -> AMQPValue {
    AMQPValue::LongLongInt(v)
}

async fn declare(ch: &Channel, q: &str, extra: &[(&str, AMQPValue)]) -> anyhow::Result<()> {
    ch.queue_declare(q.into(), durable(), quorum_args(extra))
        .await?;
    Ok(())
}

async fn publish(conn: &Connection, q: &str, body: &str) -> anyhow::Result<()> {
    let ch = confirm_channel(conn).await?;
    publish_confirmed(&ch, "", q, body.as_bytes(), BasicProperties::default()).await
}

/// A channel with prefetch 1 and a consumer on `q` with basic.consume `args`.
async fn consume(
    conn: &Connection,
    q: &str,
    args: FieldTable,
) -> anyhow::Result<(Channel, Consumer)> {
    let ch = conn.create_channel().await?;
    ch.basic_qos(1, BasicQosOptions::default()).await?;
    let c = ch
        .basic_consume(q.into(), "".into(), BasicConsumeOptions::default(), args)
        .await?;
    Ok((ch, c))
}

async fn next(consumer: &mut Consumer, limit: Duration) -> anyhow::Result<Delivery> {
    match tokio::time::timeout(limit, consumer.next()).await {
        Ok(Some(Ok(d))) => Ok(d),
        other => anyhow::bail!("no delivery within {limit:?}: {other:?}"),
    }
}

/// Waits for the server's basic.cancel (lapin ends the consumer's stream);
/// returns the time it took from `since`.
async fn cancelled(
    consumer: &mut Consumer,
    since: Instant,
    limit: Duration,
) -> anyhow::Result<Duration> {
    match tokio::time::timeout(limit, consumer.next()).await {
        Ok(None) => Ok(since.elapsed()),
        other => anyhow::bail!("consumer not cancelled within {limit:?}: {other:?}"),
    }
}

/// The deadline of a delivery received at `since` with `timeout`: the
/// cancel must come after it (less the time the delivery took to arrive)
/// and within 1 s after it.
#[track_caller]
fn assert_on_time(took: Duration, timeout: Duration) {
    assert!(
        took + Duration::from_millis(150) >= timeout,
        "cancelled after {took:?}, before the {timeout:?} timeout"
    );
    assert!(
        took <= timeout + Duration::from_millis(1000),
        "cancelled {took:?} after the delivery: more than 1 s after the {timeout:?} timeout"
    );
}

#[tokio::test]
async fn consume_argument_cancels_the_consumer_and_the_message_is_redelivered() -> anyhow::Result<()>
{
    bounded(T, async {
        let broker = Broker::spawn().await?;
        let conn = connect(broker.uri()).await?;
        let q = unique("ct.arg");
        declare(&conn.create_channel().await?, &q, &[]).await?;
        let (ch, mut c1) = consume(&conn, &q, table(&[("x-consumer-timeout", long(1000))])).await?;
        publish(&conn, &q, "m1").await?;
        let d = next(&mut c1, Duration::from_secs(5)).await?;
        let got = Instant::now();
        assert!(!d.redelivered);
        let took = cancelled(&mut c1, got, Duration::from_secs(5)).await?;
        assert_on_time(took, Duration::from_millis(1000));

        // The channel stays open; acking the timed-out delivery is no error
        // (RabbitMQ 4.3 ignores it).
        d.ack(BasicAckOptions::default()).await?;
        assert!(ch.status().connected(), "channel closed after the cancel");
        // The message is back: another consumer on the same channel gets it,
        // redelivered.
        let (_ch2, mut c2) = consume(&conn, &q, FieldTable::default()).await?;
        let d2 = next(&mut c2, Duration::from_secs(5)).await?;
        assert_eq!(d2.data, b"m1");
        assert!(d2.redelivered, "a timed-out delivery is redelivered");
        d2.ack(BasicAckOptions::default()).await?;
        ch.basic_qos(1, BasicQosOptions::default()).await?;
        assert!(ch.status().connected(), "the first channel is still usable");
        // c2 has no timeout argument: the node's 30 min default applies, so
        // an unacked delivery stays.
        publish(&conn, &q, "m2").await?;
        let d3 = next(&mut c2, Duration::from_secs(5)).await?;
        tokio::time::sleep(Duration::from_millis(1500)).await;
        d3.ack(BasicAckOptions::default()).await?;
        expect_no_delivery(&mut c2, Duration::from_millis(300)).await?;
        Ok(())
    })
    .await
}

#[tokio::test]
async fn queue_argument_and_policy_the_smaller_wins_and_the_consume_argument_wins_over_both(
) -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::spawn().await?;
        let conn = connect(broker.uri()).await?;
        let ch = conn.create_channel().await?;
        let prefix = unique("ct.pol");
        let (qa, qp) = (format!("{prefix}.arg"), format!("{prefix}.policy"));
        // qa: argument 1000 < policy 60000; qp: argument 60000 > policy 1000.
        declare(&ch, &qa, &[("x-consumer-timeout", long(1000))]).await?;
        declare(&ch, &qp, &[("x-consumer-timeout", long(60_000))]).await?;
        dlx::set_policy(
            &broker,
            "ct",
            &format!("^{prefix}"),
            r#"{"consumer-timeout": 1000}"#,
        )
        .await?;
        let _ = dlx::run(
            dlx::ctl(
                &broker,
                &[
                    "set_policy",
                    "ct-a",
                    &format!("^{prefix}\\.arg$"),
                    r#"{"consumer-timeout": 60000}"#,
                    "--priority",
                    "1",
                    "--apply-to",
                    "queues",
                ],
            )?,
            Duration::from_secs(30),
        )
        .await?;
        dlx::wait_policy_applied(&broker, &qa, "ct-a").await?;
        dlx::wait_policy_applied(&broker, &qp, "ct").await?;
        for q in [&qa, &qp] {
            let (_ch, mut c) = consume(&conn, q, FieldTable::default()).await?;
            publish(&conn, q, "m").await?;
            let _d = next(&mut c, Duration::from_secs(5)).await?;
            let took = cancelled(&mut c, Instant::now(), Duration::from_secs(5)).await?;
            assert_on_time(took, Duration::from_millis(1000));
        }
        // A consume argument wins over both: 60 s, so no cancel in 2.5 s.
        let (_ch, mut c) =
            consume(&conn, &qp, table(&[("x-consumer-timeout", long(60_000))])).await?;
        let d = next(&mut c, Duration::from_secs(5)).await?;
        assert!(d.redelivered);
        match tokio::time::timeout(Duration::from_millis(2500), c.next()).await {
            Err(_) => {}
            other => anyhow::bail!("consumer with a 60 s timeout ended early: {other:?}"),
        }
        d.ack(BasicAckOptions::default()).await?;
        Ok(())
    })
    .await
}

/// A raw basic.consume (no capabilities announced in client properties).
fn raw_consume(q: &str) -> Args {
    Args::method(60, 20)
        .u16(0)
        .shortstr(q)
        .shortstr("raw")
        .u8(0)
        .empty_table()
}

#[tokio::test]
async fn a_client_without_consumer_cancel_notify_gets_its_channel_closed() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::spawn().await?;
        let conn = connect(broker.uri()).await?;
        let q = unique("ct.raw");
        declare(&conn.create_channel().await?, &q, &[("x-consumer-timeout", long(1000))]).await?;
        let mut raw = RawConn::handshake(broker.uri()).await?;
        let t = Duration::from_secs(5);
        raw.send_method(1, Args::method(20, 10).shortstr("")).await?;
        let open_ok = raw.read_method(t).await?;
        assert_eq!(open_ok.and_then(|f| f.method()), Some((20, 11)));
        raw.send_method(1, raw_consume(&q)).await?;
        let ok = raw.read_method(t).await?;
        assert_eq!(ok.and_then(|f| f.method()), Some((60, 21)));
        publish(&conn, &q, "m").await?;
        let deliver = raw.read_method(t).await?;
        assert_eq!(deliver.and_then(|f| f.method()), Some((60, 60)));
        let got = Instant::now();
        let close = loop {
            let f = raw
                .read_frame(Duration::from_secs(5))
                .await?
                .ok_or_else(|| anyhow::anyhow!("EOF before channel.close"))?;
            if f.method() == Some((20, 40)) {
                break f;
            }
        };
        assert_on_time(got.elapsed(), Duration::from_millis(1000));
        assert_eq!(close.channel, 1);
        assert_eq!(
            close.close_reason(),
            Some((
                406,
                "PRECONDITION_FAILED - delivery acknowledgement on channel 1 timed out. Timeout value used: 1000 ms. This timeout value can be configured, see consumers doc guide to learn more".to_string()
            ))
        );
        raw.send_method(1, Args::method(20, 41)).await?;
        // The message is back in the queue, redelivered.
        let (_ch, mut c) = consume(&conn, &q, table(&[("x-consumer-timeout", long(60_000))])).await?;
        let d = next(&mut c, Duration::from_secs(5)).await?;
        assert!(d.redelivered);
        d.ack(BasicAckOptions::default()).await?;
        Ok(())
    })
    .await
}

#[tokio::test]
async fn the_node_setting_applies_when_nothing_else_does() -> anyhow::Result<()> {
    bounded(T, async {
        let mut broker = Broker::spawn().await?;
        broker.restart_with(&["--consumer-timeout", "1000"]).await?;
        let conn = cluster_tests::cluster::retry(Duration::from_secs(10), "connect", || {
            connect(broker.uri())
        })
        .await?;
        let q = unique("ct.node");
        declare(&conn.create_channel().await?, &q, &[]).await?;
        let (_ch, mut c) = consume(&conn, &q, FieldTable::default()).await?;
        publish(&conn, &q, "m").await?;
        let _d = next(&mut c, Duration::from_secs(5)).await?;
        let took = cancelled(&mut c, Instant::now(), Duration::from_secs(5)).await?;
        assert_on_time(took, Duration::from_millis(1000));
        // A queue argument wins over the node setting.
        let q2 = unique("ct.node.q");
        declare(
            &conn.create_channel().await?,
            &q2,
            &[("x-consumer-timeout", long(60_000))],
        )
        .await?;
        let (_ch2, mut c2) = consume(&conn, &q2, FieldTable::default()).await?;
        publish(&conn, &q2, "m").await?;
        let d = next(&mut c2, Duration::from_secs(5)).await?;
        expect_no_delivery(&mut c2, Duration::from_millis(2500)).await?;
        d.ack(BasicAckOptions::default()).await?;
        let ch = conn.create_channel().await?;
        ch.queue_declare(
            q2.as_str().into(),
            QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await?;
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_timeout_survives_a_leader_kill() -> anyhow::Result<()> {
    bounded(Duration::from_secs(180), async {
        let cluster = Cluster::start(3).await?;
        // A consumer on another node than the leader hears of its timeout
        // through the cluster's delivery channel.
        let remote = "ct.remote";
        let (_c0, ch0) = cluster.quorum_queue_led_by(1, remote).await?;
        let conn3 = connect(&cluster.uri(3)).await?;
        let (ch3, mut c) =
            consume(&conn3, remote, table(&[("x-consumer-timeout", long(1000))])).await?;
        publish_confirmed(&ch0, "", remote, b"r", BasicProperties::default()).await?;
        let _d = next(&mut c, Duration::from_secs(10)).await?;
        let took = cancelled(&mut c, Instant::now(), Duration::from_secs(5)).await?;
        assert_on_time(took, Duration::from_millis(1000));
        assert!(ch3.status().connected());

        let q = "ct.failover";
        let (_c1, ch1) = cluster.quorum_queue_led_by(1, q).await?;
        // The consumer is on node 2; its timeout is 4 s.
        let conn2 = connect(&cluster.uri(2)).await?;
        let (_ch2, mut c) =
            consume(&conn2, q, table(&[("x-consumer-timeout", long(4000))])).await?;
        publish_confirmed(&ch1, "", q, b"m", BasicProperties::default()).await?;
        let _d = next(&mut c, Duration::from_secs(10)).await?;
        let got = Instant::now();
        // Kill the leader after 1 s; nodes 2 and 3 elect a new one, which must
        // time the consumer out at the same deadline.
        tokio::time::sleep(Duration::from_millis(1000)).await;
        cluster.kill9(1);
        let took = cancelled(&mut c, got, Duration::from_secs(15)).await?;
        assert_on_time(took, Duration::from_millis(4000));
        // And the message went back to the queue.
        let (_ch3, mut c3) = consume(&conn2, q, FieldTable::default()).await?;
        let d = next(&mut c3, Duration::from_secs(10)).await?;
        assert!(d.redelivered);
        d.ack(BasicAckOptions::default()).await?;
        Ok(())
    })
    .await
}

#[tokio::test]
async fn an_unacknowledged_basic_get_times_out_by_the_queues_timeout() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::spawn().await?;
        let conn = connect(broker.uri()).await?;
        let q = unique("ct.get");
        declare(&conn.create_channel().await?, &q, &[("x-consumer-timeout", long(1000))]).await?;
        publish(&conn, &q, "m").await?;
        let mut raw = RawConn::handshake(broker.uri()).await?;
        let t = Duration::from_secs(5);
        raw.send_method(3, Args::method(20, 10).shortstr("")).await?;
        assert_eq!(raw.read_method(t).await?.and_then(|f| f.method()), Some((20, 11)));
        raw.send_method(3, Args::method(60, 70).u16(0).shortstr(&q).u8(0))
            .await?;
        assert_eq!(raw.read_method(t).await?.and_then(|f| f.method()), Some((60, 71)));
        let got = Instant::now();
        let close = loop {
            let f = raw
                .read_frame(t)
                .await?
                .ok_or_else(|| anyhow::anyhow!("EOF before channel.close"))?;
            if f.method() == Some((20, 40)) {
                break f;
            }
        };
        assert_on_time(got.elapsed(), Duration::from_millis(1000));
        assert_eq!(
            close.close_reason(),
            Some((
                406,
                "PRECONDITION_FAILED - delivery acknowledgement on channel 3 timed out. Timeout value used: 1000 ms. This timeout value can be configured, see consumers doc guide to learn more".to_string()
            ))
        );
        raw.send_method(3, Args::method(20, 41)).await?;
        let (_ch, mut c) = consume(&conn, &q, table(&[("x-consumer-timeout", long(60_000))])).await?;
        let d = next(&mut c, Duration::from_secs(5)).await?;
        assert!(d.redelivered);
        d.ack(BasicAckOptions::default()).await?;
        Ok(())
    })
    .await
}

#[tokio::test]
async fn a_local_exclusive_queue_times_out_too() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::spawn().await?;
        let conn = connect(broker.uri()).await?;
        let ch = conn.create_channel().await?;
        let q = unique("ct.excl");
        ch.queue_declare(
            q.as_str().into(),
            QueueDeclareOptions {
                exclusive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await?;
        let (_ch, mut c) = consume(&conn, &q, table(&[("x-consumer-timeout", long(1000))])).await?;
        publish(&conn, &q, "m").await?;
        let _d = next(&mut c, Duration::from_secs(5)).await?;
        let took = cancelled(&mut c, Instant::now(), Duration::from_secs(5)).await?;
        assert_on_time(took, Duration::from_millis(1000));
        let (_ch2, mut c2) = consume(&conn, &q, FieldTable::default()).await?;
        let d = next(&mut c2, Duration::from_secs(5)).await?;
        assert!(d.redelivered);
        d.ack(BasicAckOptions::default()).await?;
        Ok(())
    })
    .await
}
