//! Settlement: ack / nack / reject (single and multiple, requeue or not),
//! redelivered flag, basic.get and get-empty, prefetch, basic.recover.
//! All on quorum queues.

use cluster_tests::*;
use lapin::{
    options::{
        BasicAckOptions, BasicConsumeOptions, BasicGetOptions, BasicNackOptions, BasicQosOptions,
        BasicRecoverOptions, BasicRejectOptions, QueueDeclareOptions, QueueDeleteOptions,
    },
    types::{AMQPValue, FieldTable},
    BasicProperties, Channel,
};
use std::time::Duration;

const T: Duration = TEST_TIMEOUT;
const WAIT: Duration = Duration::from_secs(10);

async fn queue_with(ch: &Channel, prefix: &str, n: usize) -> anyhow::Result<String> {
    let name = unique(prefix);
    ch.queue_declare(
        name.as_str().into(),
        QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
        quorum_args(&[]),
    )
    .await?;
    for i in 0..n {
        ch.basic_publish(
            "".into(),
            name.as_str().into(),
            Default::default(),
            format!("m{i}").as_bytes(),
            BasicProperties::default(),
        )
        .await?;
    }
    assert!(ch.wait_for_confirms().await?.is_empty());
    Ok(name)
}

fn body(d: &lapin::message::Delivery) -> String {
    String::from_utf8_lossy(&d.data).into_owned()
}

async fn ready_count(ch: &Channel, q: &str) -> anyhow::Result<u32> {
    Ok(ch
        .queue_declare(
            q.into(),
            QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await?
        .message_count())
}

#[tokio::test]
async fn nack_requeue_sets_redelivered() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let ch = confirm_channel(&conn).await?;
        let q = queue_with(&ch, "q.nack", 1).await?;
        let cch = conn.create_channel().await?;
        let mut c = cch
            .basic_consume(
                q.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        let first = consume_n(&mut c, 1, WAIT).await?.remove(0);
        assert!(!first.redelivered);
        first
            .nack(BasicNackOptions {
                requeue: true,
                multiple: false,
            })
            .await?;
        let second = consume_n(&mut c, 1, WAIT).await?.remove(0);
        assert!(second.redelivered);
        assert_eq!(body(&second), "m0");
        assert_ne!(
            second.delivery_tag, first.delivery_tag,
            "a redelivery gets a new delivery tag"
        );
        // quorum queues count deliveries
        let count = second
            .properties
            .headers()
            .as_ref()
            .and_then(|h| h.inner().get("x-delivery-count").cloned());
        assert_eq!(count, Some(AMQPValue::LongLongInt(1)));
        second.reject(BasicRejectOptions { requeue: true }).await?;
        let third = consume_n(&mut c, 1, WAIT).await?.remove(0);
        assert!(third.redelivered);
        third.ack(BasicAckOptions::default()).await?;
        assert_eq!(ready_count(&ch, &q).await?, 0);
        ch.queue_delete(q.as_str().into(), QueueDeleteOptions::default())
            .await?;
        Ok(())
    })
    .await
}

#[tokio::test]
async fn basic_get_and_get_empty() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let ch = confirm_channel(&conn).await?;
        let q = queue_with(&ch, "q.get", 3).await?;
        let g = ch
            .basic_get(q.as_str().into(), BasicGetOptions::default())
            .await?
            .expect("get-ok");
        assert_eq!(
            (body(&g.delivery), g.message_count, g.delivery.redelivered),
            ("m0".into(), 2, false)
        );
        g.delivery.ack(BasicAckOptions::default()).await?;
        let g = ch
            .basic_get(q.as_str().into(), BasicGetOptions { no_ack: true })
            .await?
            .expect("get-ok");
        assert_eq!((body(&g.delivery), g.message_count), ("m1".into(), 1));
        let g = ch
            .basic_get(q.as_str().into(), BasicGetOptions::default())
            .await?
            .expect("get-ok");
        assert_eq!((body(&g.delivery), g.message_count), ("m2".into(), 0));
        // unacked: the queue is empty for get, and a reject requeues it
        assert!(
            ch.basic_get(q.as_str().into(), BasicGetOptions::default())
                .await?
                .is_none(),
            "get-empty"
        );
        g.delivery
            .reject(BasicRejectOptions { requeue: true })
            .await?;
        let again = ch
            .basic_get(q.as_str().into(), BasicGetOptions::default())
            .await?
            .expect("requeued");
        assert_eq!(body(&again.delivery), "m2");
        assert!(again.delivery.redelivered);
        again.delivery.ack(BasicAckOptions::default()).await?;
        assert!(
            ch.basic_get(q.as_str().into(), BasicGetOptions::default())
                .await?
                .is_none(),
            "get-empty"
        );
        ch.queue_delete(q.as_str().into(), QueueDeleteOptions::default())
            .await?;
        Ok(())
    })
    .await
}

#[tokio::test]
async fn ack_multiple_then_close_requeues_the_rest() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let ch = confirm_channel(&conn).await?;
        let q = queue_with(&ch, "q.ackmulti", 5).await?;
        let cch = conn.create_channel().await?;
        let mut c = cch
            .basic_consume(
                q.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        let ds = consume_n(&mut c, 5, WAIT).await?;
        cch.basic_ack(ds[2].delivery_tag, BasicAckOptions { multiple: true })
            .await?;
        cch.close(200, "OK".into()).await?;
        let cch = conn.create_channel().await?;
        let mut c = cch
            .basic_consume(
                q.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        let rest = consume_n(&mut c, 2, WAIT).await?;
        let mut bodies: Vec<_> = rest.iter().map(body).collect();
        bodies.sort();
        assert_eq!(bodies, ["m3", "m4"]);
        assert!(rest.iter().all(|d| d.redelivered));
        expect_no_delivery(&mut c, Duration::from_millis(300)).await?;
        ch.queue_delete(q.as_str().into(), QueueDeleteOptions::default())
            .await?;
        Ok(())
    })
    .await
}

#[tokio::test]
async fn nack_multiple_and_reject_without_requeue_discard() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let ch = confirm_channel(&conn).await?;
        let q = queue_with(&ch, "q.discard", 6).await?;
        let cch = conn.create_channel().await?;
        let mut c = cch
            .basic_consume(
                q.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        let ds = consume_n(&mut c, 6, WAIT).await?;
        // nack 1..=3 requeue=false (multiple), reject 4 requeue=false, nack 5..=6 requeue=true (multiple)
        cch.basic_nack(
            ds[2].delivery_tag,
            BasicNackOptions {
                multiple: true,
                requeue: false,
            },
        )
        .await?;
        ds[3].reject(BasicRejectOptions { requeue: false }).await?;
        cch.basic_nack(
            ds[5].delivery_tag,
            BasicNackOptions {
                multiple: true,
                requeue: true,
            },
        )
        .await?;
        let back = consume_n(&mut c, 2, WAIT).await?;
        let mut bodies: Vec<_> = back.iter().map(body).collect();
        bodies.sort();
        assert_eq!(bodies, ["m4", "m5"]);
        for d in &back {
            d.ack(BasicAckOptions::default()).await?;
        }
        expect_no_delivery(&mut c, Duration::from_millis(300)).await?;
        assert_eq!(ready_count(&ch, &q).await?, 0);
        ch.queue_delete(q.as_str().into(), QueueDeleteOptions::default())
            .await?;
        Ok(())
    })
    .await
}

#[tokio::test]
async fn prefetch_two_is_honoured() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let ch = confirm_channel(&conn).await?;
        let q = queue_with(&ch, "q.prefetch", 6).await?;
        let cch = conn.create_channel().await?;
        cch.basic_qos(2, BasicQosOptions::default()).await?;
        let mut c = cch
            .basic_consume(
                q.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        let first = consume_n(&mut c, 2, WAIT).await?;
        assert_eq!(first.iter().map(body).collect::<Vec<_>>(), ["m0", "m1"]);
        expect_no_delivery(&mut c, Duration::from_millis(500)).await?;
        first[0].ack(BasicAckOptions::default()).await?;
        let next = consume_n(&mut c, 1, WAIT).await?;
        assert_eq!(body(&next[0]), "m2");
        expect_no_delivery(&mut c, Duration::from_millis(500)).await?;
        // ack both outstanding with one multiple ack: two more arrive
        cch.basic_ack(next[0].delivery_tag, BasicAckOptions { multiple: true })
            .await?;
        let more = consume_n(&mut c, 2, WAIT).await?;
        assert_eq!(more.iter().map(body).collect::<Vec<_>>(), ["m3", "m4"]);
        expect_no_delivery(&mut c, Duration::from_millis(500)).await?;
        ch.queue_delete(q.as_str().into(), QueueDeleteOptions::default())
            .await?;
        Ok(())
    })
    .await
}

#[tokio::test]
async fn recover_redelivers_unacked() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let ch = confirm_channel(&conn).await?;
        let q = queue_with(&ch, "q.recover", 3).await?;
        let cch = conn.create_channel().await?;
        let mut c = cch
            .basic_consume(
                q.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        let ds = consume_n(&mut c, 3, WAIT).await?;
        ds[0].ack(BasicAckOptions::default()).await?;
        cch.basic_recover(BasicRecoverOptions { requeue: true })
            .await?;
        let again = consume_n(&mut c, 2, WAIT).await?;
        let mut bodies: Vec<_> = again.iter().map(body).collect();
        bodies.sort();
        assert_eq!(bodies, ["m1", "m2"]);
        assert!(again.iter().all(|d| d.redelivered));
        for d in &again {
            d.ack(BasicAckOptions::default()).await?;
        }
        expect_no_delivery(&mut c, Duration::from_millis(300)).await?;
        ch.queue_delete(q.as_str().into(), QueueDeleteOptions::default())
            .await?;
        Ok(())
    })
    .await
}
