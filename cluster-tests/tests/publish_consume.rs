//! basic.publish / basic.consume: mandatory returns, large messages, manual and
//! no-ack consumers, exclusive consumers, consumer tags, cancel, and a full
//! round trip of every message property and header field type.

use cluster_tests::*;
use futures::StreamExt;
use lapin::{
    options::{
        BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicGetOptions,
        BasicPublishOptions, QueueDeclareOptions, QueueDeleteOptions,
    },
    types::{AMQPValue, ByteArray, DecimalValue, FieldArray, FieldTable},
    BasicProperties, Channel,
};
use std::time::Duration;

const T: Duration = TEST_TIMEOUT;

async fn quorum_queue(ch: &Channel, prefix: &str) -> anyhow::Result<String> {
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
    Ok(name)
}

async fn delete_queue(ch: &Channel, q: &str) -> anyhow::Result<()> {
    ch.queue_delete(q.into(), QueueDeleteOptions::default())
        .await?;
    Ok(())
}

#[tokio::test]
async fn mandatory_unroutable_is_returned_312() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let ch = confirm_channel(&conn).await?;
        let key = unique("no.such.queue");
        let props = BasicProperties::default().with_message_id("m-1".into());
        let c = ch
            .basic_publish(
                "".into(),
                key.as_str().into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..Default::default()
                },
                b"lost",
                props.clone(),
            )
            .await?
            .await?;
        // the return comes before the ack, and the message is still acked
        assert!(c.is_ack());
        let ret = c.take_message().expect("basic.return");
        assert_eq!((ret.reply_code, ret.reply_text.as_str()), (312, "NO_ROUTE"));
        assert_eq!(
            (
                ret.delivery.exchange.as_str(),
                ret.delivery.routing_key.as_str()
            ),
            ("", key.as_str())
        );
        assert_eq!(ret.delivery.data, b"lost");
        assert_eq!(ret.delivery.properties, props);
        // without mandatory it is silently dropped (and acked)
        let c = ch
            .basic_publish(
                "".into(),
                key.as_str().into(),
                BasicPublishOptions::default(),
                b"lost",
                BasicProperties::default(),
            )
            .await?
            .await?;
        assert!(c.is_ack() && c.take_message().is_none());
        Ok(())
    })
    .await
}

#[tokio::test]
async fn sixteen_mib_round_trip() -> anyhow::Result<()> {
    bounded(Duration::from_secs(120), async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let ch = confirm_channel(&conn).await?;
        let q = quorum_queue(&ch, "q.big").await?;
        let body: Vec<u8> = (0..16 * 1024 * 1024u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 24) as u8)
            .collect();
        publish_confirmed(&ch, "", &q, &body, BasicProperties::default()).await?;
        let cch = conn.create_channel().await?;
        let mut consumer = cch
            .basic_consume(
                q.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        let d = consume_n(&mut consumer, 1, Duration::from_secs(60))
            .await?
            .remove(0);
        assert_eq!(d.data.len(), body.len());
        assert!(d.data == body, "16 MiB body differs");
        d.ack(BasicAckOptions::default()).await?;
        delete_queue(&ch, &q).await
    })
    .await
}

#[tokio::test]
async fn consume_manual_ack() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let ch = confirm_channel(&conn).await?;
        let q = quorum_queue(&ch, "q.manual").await?;
        for i in 0..5 {
            publish_confirmed(
                &ch,
                "",
                &q,
                format!("m{i}").as_bytes(),
                BasicProperties::default(),
            )
            .await?;
        }
        let cch = conn.create_channel().await?;
        let mut consumer = cch
            .basic_consume(
                q.as_str().into(),
                "manual".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        assert_eq!(consumer.tag().as_str(), "manual");
        let ds = consume_n(&mut consumer, 5, Duration::from_secs(10)).await?;
        let bodies: Vec<_> = ds
            .iter()
            .map(|d| String::from_utf8_lossy(&d.data).into_owned())
            .collect();
        assert_eq!(bodies, ["m0", "m1", "m2", "m3", "m4"]);
        let tags: Vec<_> = ds.iter().map(|d| d.delivery_tag).collect();
        assert_eq!(
            tags,
            [1, 2, 3, 4, 5],
            "delivery tags count from 1 per channel"
        );
        for d in &ds {
            assert!(!d.redelivered);
            assert_eq!(
                (d.exchange.as_str(), d.routing_key.as_str()),
                ("", q.as_str())
            );
            d.ack(BasicAckOptions::default()).await?;
        }
        // acked messages are gone: nothing left after the consumer is cancelled
        cch.basic_cancel("manual".into(), BasicCancelOptions::default())
            .await?;
        cch.close(200, "OK".into()).await?;
        assert!(ch
            .basic_get(q.as_str().into(), BasicGetOptions::default())
            .await?
            .is_none());
        delete_queue(&ch, &q).await
    })
    .await
}

#[tokio::test]
async fn consume_no_ack() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let ch = confirm_channel(&conn).await?;
        let q = quorum_queue(&ch, "q.noack").await?;
        for i in 0..3 {
            publish_confirmed(
                &ch,
                "",
                &q,
                format!("n{i}").as_bytes(),
                BasicProperties::default(),
            )
            .await?;
        }
        let cch = conn.create_channel().await?;
        let mut consumer = cch
            .basic_consume(
                q.as_str().into(),
                "".into(),
                BasicConsumeOptions {
                    no_ack: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await?;
        let ds = consume_n(&mut consumer, 3, Duration::from_secs(10)).await?;
        assert_eq!(
            ds.iter().map(|d| d.data.clone()).collect::<Vec<_>>(),
            [b"n0".to_vec(), b"n1".to_vec(), b"n2".to_vec()]
        );
        // closing the channel does not bring them back
        cch.close(200, "OK".into()).await?;
        assert!(ch
            .basic_get(q.as_str().into(), BasicGetOptions::default())
            .await?
            .is_none());
        delete_queue(&ch, &q).await
    })
    .await
}

#[tokio::test]
async fn server_generated_consumer_tags() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let ch = conn.create_channel().await?;
        let q = quorum_queue(&ch, "q.tags").await?;
        let a = ch
            .basic_consume(
                q.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        let b = ch
            .basic_consume(
                q.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        assert!(a.tag().as_str().starts_with("amq.ctag-"), "{}", a.tag());
        assert!(b.tag().as_str().starts_with("amq.ctag-"), "{}", b.tag());
        assert_ne!(a.tag(), b.tag());
        let p = ch
            .queue_declare(
                q.as_str().into(),
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await?;
        assert_eq!(p.consumer_count(), 2);
        delete_queue(&ch, &q).await
    })
    .await
}

#[tokio::test]
async fn exclusive_consumer_is_403_for_others() -> anyhow::Result<()> {
    // Uses non-durable (classic in RabbitMQ) queues: RabbitMQ 3.10.8 quorum
    // queues silently ignore the exclusive flag of basic.consume (both orders
    // succeed), which is a RabbitMQ quirk, not behaviour to copy.
    bounded(T, async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let ch = conn.create_channel().await?;
        let q = unique("q.excl");
        ch.queue_declare(
            q.as_str().into(),
            QueueDeclareOptions {
                auto_delete: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await?;
        let _excl = ch
            .basic_consume(
                q.as_str().into(),
                "".into(),
                BasicConsumeOptions {
                    exclusive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await?;
        let ch2 = conn.create_channel().await?;
        let err = expect_amqp_error(
            ch2.basic_consume(
                q.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await,
        );
        assert_eq!(
            err,
            (
                403,
                format!("ACCESS_REFUSED - queue '{q}' in vhost '/' in exclusive use")
            )
        );

        // and an exclusive consume is refused while another consumer exists
        let q2 = unique("q.excl2");
        ch.queue_declare(
            q2.as_str().into(),
            QueueDeclareOptions {
                auto_delete: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await?;
        let _plain = ch
            .basic_consume(
                q2.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        let ch3 = conn.create_channel().await?;
        let err = expect_amqp_error(
            ch3.basic_consume(
                q2.as_str().into(),
                "".into(),
                BasicConsumeOptions {
                    exclusive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await,
        );
        assert_eq!(
            err,
            (
                403,
                format!("ACCESS_REFUSED - queue '{q2}' in vhost '/' in exclusive use")
            )
        );
        delete_queue(&ch, &q).await?;
        delete_queue(&ch, &q2).await
    })
    .await
}

#[tokio::test]
async fn cancel_stops_deliveries() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let ch = confirm_channel(&conn).await?;
        let q = quorum_queue(&ch, "q.cancel").await?;
        let cch = conn.create_channel().await?;
        let mut consumer = cch
            .basic_consume(
                q.as_str().into(),
                "to-cancel".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        publish_confirmed(&ch, "", &q, b"before", BasicProperties::default()).await?;
        let d = consume_n(&mut consumer, 1, Duration::from_secs(10))
            .await?
            .remove(0);
        d.ack(BasicAckOptions::default()).await?;
        cch.basic_cancel("to-cancel".into(), BasicCancelOptions::default())
            .await?;
        // the stream ends after cancel-ok
        let end = tokio::time::timeout(Duration::from_secs(10), consumer.next()).await?;
        assert!(end.is_none(), "stream should end after cancel, got {end:?}");
        publish_confirmed(&ch, "", &q, b"after", BasicProperties::default()).await?;
        let got = ch
            .basic_get(q.as_str().into(), BasicGetOptions { no_ack: true })
            .await?
            .expect("message stays in the queue");
        assert_eq!(got.delivery.data, b"after");
        // the server tells a consumer whose queue is deleted (basic.cancel from server)
        let mut c2 = cch
            .basic_consume(
                q.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        delete_queue(&ch, &q).await?;
        let end = tokio::time::timeout(Duration::from_secs(10), c2.next()).await?;
        assert!(
            end.is_none(),
            "server-side cancel should end the stream, got {end:?}"
        );
        Ok(())
    })
    .await
}

/// Every field type lapin can encode that RabbitMQ stores and sends back unchanged.
fn all_field_types() -> FieldTable {
    let mut nested = FieldTable::default();
    nested.insert("inner-str".into(), s("deep"));
    nested.insert("inner-int".into(), AMQPValue::LongLongInt(-42));
    let mut deeper = FieldTable::default();
    deeper.insert("level".into(), AMQPValue::LongInt(3));
    nested.insert("deeper".into(), AMQPValue::FieldTable(deeper));
    let arr = FieldArray::from(vec![
        s("a"),
        AMQPValue::LongInt(1),
        AMQPValue::Boolean(true),
        AMQPValue::FieldArray(FieldArray::from(vec![s("nested-array")])),
        AMQPValue::FieldTable(nested.clone()),
    ]);
    table(&[
        ("bool-t", AMQPValue::Boolean(true)),
        ("bool-f", AMQPValue::Boolean(false)),
        ("i8", AMQPValue::ShortShortInt(-8)),
        ("u8", AMQPValue::ShortShortUInt(200)),
        ("i16", AMQPValue::ShortInt(-1600)),
        ("u16", AMQPValue::ShortUInt(60000)),
        ("i32", AMQPValue::LongInt(-320000)),
        ("u32", AMQPValue::LongUInt(4_000_000_000)),
        ("i64", AMQPValue::LongLongInt(-6_400_000_000_000)),
        ("f32", AMQPValue::Float(1.5)),
        ("f64", AMQPValue::Double(-2.25)),
        (
            "decimal",
            AMQPValue::DecimalValue(DecimalValue {
                scale: 2,
                value: 12345,
            }),
        ),
        ("longstr", s("hello \u{1F600} world")),
        ("empty-str", s("")),
        ("array", AMQPValue::FieldArray(arr)),
        ("empty-array", AMQPValue::FieldArray(FieldArray::default())),
        ("timestamp", AMQPValue::Timestamp(1_700_000_000)),
        ("table", AMQPValue::FieldTable(nested)),
        (
            "bytes",
            AMQPValue::ByteArray(ByteArray::from(vec![0u8, 1, 2, 254, 255])),
        ),
        ("void", AMQPValue::Void),
    ])
}

#[tokio::test]
async fn properties_and_headers_round_trip() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let ch = confirm_channel(&conn).await?;
        let q = quorum_queue(&ch, "q.props").await?;
        let props = BasicProperties::default()
            .with_content_type("application/json".into())
            .with_content_encoding("gzip".into())
            .with_headers(all_field_types())
            .with_delivery_mode(2)
            .with_priority(7)
            .with_correlation_id("corr-1".into())
            .with_reply_to("reply.queue".into())
            .with_expiration("600000".into())
            .with_message_id("msg-1".into())
            .with_timestamp(1_700_000_123)
            .with_type("my.type".into())
            .with_user_id("guest".into())
            .with_app_id("cluster-tests".into())
            .with_cluster_id("cluster-x".into());
        publish_confirmed(&ch, "", &q, b"{}", props.clone()).await?;
        // an empty property set stays empty
        publish_confirmed(&ch, "", &q, b"", BasicProperties::default()).await?;
        let cch = conn.create_channel().await?;
        let mut consumer = cch
            .basic_consume(
                q.as_str().into(),
                "".into(),
                BasicConsumeOptions {
                    no_ack: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await?;
        let ds = consume_n(&mut consumer, 2, Duration::from_secs(10)).await?;
        let got = &ds[0].properties;
        let want_headers = props.headers().clone().unwrap();
        let got_headers = got.headers().clone().expect("headers");
        for (k, v) in want_headers.inner() {
            assert_eq!(got_headers.inner().get(k), Some(v), "header {k}");
        }
        assert_eq!(
            got_headers.inner().len(),
            want_headers.inner().len(),
            "{got_headers:?}"
        );
        assert_eq!(got, &props);
        assert_eq!(ds[0].data, b"{}");
        assert_eq!(ds[1].properties, BasicProperties::default());
        assert!(ds[1].data.is_empty());
        delete_queue(&ch, &q).await
    })
    .await
}
