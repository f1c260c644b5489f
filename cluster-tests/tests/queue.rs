//! queue.declare (quorum, passive, server-named, argument validation),
//! bind/unbind, purge, delete with if-unused/if-empty.
//! Reply texts are RabbitMQ 3.10.8's, asserted verbatim.

use cluster_tests::*;
use lapin::{
    options::{
        BasicConsumeOptions, BasicPublishOptions, QueueBindOptions, QueueDeclareOptions,
        QueueDeleteOptions, QueuePurgeOptions,
    },
    types::{AMQPValue, FieldTable},
    BasicProperties, Channel, Connection,
};
use std::time::Duration;

const T: Duration = TEST_TIMEOUT;

async fn declare_quorum(
    ch: &Channel,
    name: &str,
    extra: &[(&str, AMQPValue)],
) -> lapin::Result<lapin::Queue> {
    ch.queue_declare(name.into(), durable(), quorum_args(extra))
        .await
}

/// Declares `name` as a quorum queue with `args` on a fresh channel and returns the 406 text.
async fn declare_error(
    conn: &Connection,
    name: &str,
    opts: QueueDeclareOptions,
    args: FieldTable,
) -> (u16, String) {
    let ch = conn.create_channel().await.expect("channel");
    expect_amqp_error(ch.queue_declare(name.into(), opts, args).await)
}

async fn cleanup(conn: &Connection, queues: &[&str]) -> anyhow::Result<()> {
    let ch = conn.create_channel().await?;
    for q in queues {
        ch.queue_delete((*q).into(), QueueDeleteOptions::default())
            .await?;
    }
    Ok(())
}

#[tokio::test]
async fn declare_quorum_queue_and_passive() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let ch = confirm_channel(&conn).await?;
        let name = unique("q.quorum");
        let q = declare_quorum(&ch, &name, &[]).await?;
        assert_eq!(q.name().as_str(), name);
        assert_eq!((q.message_count(), q.consumer_count()), (0, 0));
        for i in 0..3 {
            publish_confirmed(
                &ch,
                "",
                &name,
                format!("m{i}").as_bytes(),
                BasicProperties::default(),
            )
            .await?;
        }
        // redeclare with the same arguments reports the counts
        let q = declare_quorum(&ch, &name, &[]).await?;
        assert_eq!(q.message_count(), 3);
        let _c = ch
            .basic_consume(
                name.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        let ch2 = conn.create_channel().await?;
        let p = ch2
            .queue_declare(
                name.as_str().into(),
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await?;
        assert_eq!(p.consumer_count(), 1);
        cleanup(&conn, &[&name]).await
    })
    .await
}

#[tokio::test]
async fn passive_declare_of_missing_queue_is_404() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let name = unique("q.missing");
        let err = declare_error(
            &conn,
            &name,
            QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await;
        assert_eq!(
            err,
            (404, format!("NOT_FOUND - no queue '{name}' in vhost '/'"))
        );
        Ok(())
    })
    .await
}

#[tokio::test]
async fn server_named_exclusive_queue() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let ch = conn.create_channel().await?;
        let q = ch.queue_declare("".into(), QueueDeclareOptions { exclusive: true, ..Default::default() }, FieldTable::default()).await?;
        let name = q.name().to_string();
        assert!(name.starts_with("amq.gen-"), "{name}");
        assert!(name.len() > "amq.gen-".len() + 10, "{name}");
        let q2 = ch.queue_declare("".into(), QueueDeclareOptions { exclusive: true, ..Default::default() }, FieldTable::default()).await?;
        assert_ne!(q2.name().as_str(), name);

        // another connection may not touch it
        let other = connect(broker.uri()).await?;
        let err = declare_error(&other, &name, QueueDeclareOptions { passive: true, ..Default::default() }, FieldTable::default()).await;
        assert_eq!(
            err,
            (405, format!("RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{name}' in vhost '/'. It could be originally declared on another connection or the exclusive property value does not match that of the original declaration."))
        );
        // it disappears with its connection
        close_connection(&conn).await?;
        let err = declare_error(&other, &name, QueueDeclareOptions { passive: true, ..Default::default() }, FieldTable::default()).await;
        assert_eq!(err, (404, format!("NOT_FOUND - no queue '{name}' in vhost '/'")));
        Ok(())
    })
    .await
}

#[tokio::test]
async fn quorum_property_errors_are_406() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let name = unique("q.prop");
        let cases = [
            (QueueDeclareOptions { durable: true, exclusive: true, ..Default::default() }, "exclusive-owner"),
            (QueueDeclareOptions { durable: true, auto_delete: true, ..Default::default() }, "auto-delete"),
            (QueueDeclareOptions::default(), "non-durable"),
        ];
        for (opts, prop) in cases {
            let err = declare_error(&conn, &name, opts, quorum_args(&[])).await;
            assert_eq!(err, (406, format!("PRECONDITION_FAILED - invalid property '{prop}' for queue '{name}' in vhost '/'")));
        }
        let err = declare_error(&conn, "", durable(), quorum_args(&[])).await;
        assert_eq!(err.0, 406, "{}", err.1);
        assert!(err.1.starts_with("PRECONDITION_FAILED - "), "{}", err.1);
        assert!(err.1.contains("server-named queue"), "{}", err.1);
        Ok(())
    })
    .await
}

#[tokio::test]
async fn quorum_argument_validation_is_406() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let name = unique("q.args");
        let p = |rest: &str| format!("PRECONDITION_FAILED - invalid arg {rest}");
        let cases: Vec<(Vec<(&str, AMQPValue)>, String)> = vec![
            (vec![("x-max-length", AMQPValue::LongInt(-5))], p(&format!("'x-max-length' for queue '{name}' in vhost '/': {{value_negative,-5}}"))),
            (vec![("x-max-length", s("ten"))], p(&format!("'x-max-length' for queue '{name}' in vhost '/': \"expected integer, got longstr\""))),
            (vec![("x-max-length-bytes", AMQPValue::LongLongInt(-1))], p(&format!("'x-max-length-bytes' for queue '{name}' in vhost '/': {{value_negative,-1}}"))),
            (vec![("x-message-ttl", AMQPValue::LongInt(-1))], p(&format!("'x-message-ttl' for queue '{name}' in vhost '/': {{value_negative,-1}}"))),
            (vec![("x-expires", AMQPValue::LongInt(0))], p(&format!("'x-expires' for queue '{name}' in vhost '/': {{value_zero,0}}"))),
            (vec![("x-queue-mode", s("lazy"))], p(&format!("'x-queue-mode' for queue '{name}' in vhost '/' of queue type rabbit_quorum_queue"))),
            // 1-32 is accepted (RabbitMQ 4.3-style; a deliberate difference from 3.10.8).
            (vec![("x-max-priority", AMQPValue::LongInt(33))], p(&format!("'x-max-priority' for queue '{name}' in vhost '/': {{max_value_exceeded,33}}"))),
            (vec![("x-overflow", s("sideways"))], p(&format!("'x-overflow' for queue '{name}' in vhost '/': invalid_overflow"))),
            (vec![("x-dead-letter-routing-key", s("rk"))], p(&format!("'x-dead-letter-routing-key' for queue '{name}' in vhost '/': routing_key_but_no_dlx_defined"))),
            (vec![("x-dead-letter-strategy", s("sometimes"))], p(&format!("'x-dead-letter-strategy' for queue '{name}' in vhost '/': invalid_dlx_strategy"))),
            (vec![("x-single-active-consumer", s("yes"))], p(&format!("'x-single-active-consumer' for queue '{name}' in vhost '/': {{unacceptable_type,longstr}}"))),
        ];
        for (args, text) in cases {
            let err = declare_error(&conn, &name, durable(), quorum_args(&args)).await;
            assert_eq!(err, (406, text), "args {args:?}");
        }
        let err = declare_error(&conn, &name, durable(), table(&[("x-queue-type", s("fake-queue-type"))])).await;
        assert_eq!(err, (406, p(&format!("'x-queue-type' for queue '{name}' in vhost '/': \"unsupported queue type 'fake-queue-type'\""))));
        // none of these created the queue
        let err = declare_error(&conn, &name, QueueDeclareOptions { passive: true, ..Default::default() }, FieldTable::default()).await;
        assert_eq!(err.0, 404);
        Ok(())
    })
    .await
}

#[tokio::test]
async fn inequivalent_queue_redeclare_is_406() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let name = unique("q.ineq");
        let ch = conn.create_channel().await?;
        declare_quorum(&ch, &name, &[("x-max-length", AMQPValue::LongInt(10))]).await?;
        // integer types compare by value
        declare_quorum(&ch, &name, &[("x-max-length", AMQPValue::ShortShortInt(10))]).await?;
        let pre = "PRECONDITION_FAILED - inequivalent arg";
        let err = declare_error(&conn, &name, durable(), quorum_args(&[("x-max-length", AMQPValue::LongInt(11))])).await;
        assert_eq!(err, (406, format!("{pre} 'x-max-length' for queue '{name}' in vhost '/': received '11' but current is '10'")));
        let err = declare_error(&conn, &name, durable(), quorum_args(&[])).await;
        assert_eq!(err, (406, format!("{pre} 'x-max-length' for queue '{name}' in vhost '/': received none but current is the value '10' of type 'signedint'")));
        if broker.is_external() {
            let err = declare_error(&conn, &name, durable(), table(&[("x-max-length", AMQPValue::LongInt(10))])).await;
            assert_eq!(err, (406, format!("{pre} 'x-queue-type' for queue '{name}' in vhost '/': received none but current is the value 'quorum' of type 'longstr'")));
        } else {
            // Deliberate difference (README): on quorumq a durable queue's
            // default type is quorum, so omitting x-queue-type is equivalent.
            let ch = conn.create_channel().await?;
            ch.queue_declare(name.as_str().into(), durable(), table(&[("x-max-length", AMQPValue::LongInt(10))])).await?;
        }

        let err = declare_error(&conn, &name, QueueDeclareOptions::default(), quorum_args(&[("x-max-length", AMQPValue::LongInt(10))])).await;
        assert_eq!(err, (406, format!("{pre} 'durable' for queue '{name}' in vhost '/': received 'false' but current is 'true'")));
        cleanup(&conn, &[&name]).await
    })
    .await
}

#[tokio::test]
async fn reserved_amq_queue_name_is_403() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let err = declare_error(&conn, "amq.ct-queue", durable(), quorum_args(&[])).await;
        assert_eq!(
            err,
            (
                403,
                "ACCESS_REFUSED - queue name 'amq.ct-queue' contains reserved prefix 'amq.*'"
                    .into()
            )
        );
        Ok(())
    })
    .await
}

#[tokio::test]
async fn bind_unbind_routes_and_unroutes() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let ch = confirm_channel(&conn).await?;
        let q = unique("q.bind");
        declare_quorum(&ch, &q, &[]).await?;
        ch.queue_bind(
            q.as_str().into(),
            "amq.direct".into(),
            q.as_str().into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await?;
        // binding twice is idempotent
        ch.queue_bind(
            q.as_str().into(),
            "amq.direct".into(),
            q.as_str().into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await?;
        let mandatory = BasicPublishOptions {
            mandatory: true,
            ..Default::default()
        };
        let c = ch
            .basic_publish(
                "amq.direct".into(),
                q.as_str().into(),
                mandatory,
                b"routed",
                BasicProperties::default(),
            )
            .await?
            .await?;
        assert!(c.is_ack());
        assert!(c.take_message().is_none(), "routed message returned");
        ch.queue_unbind(
            q.as_str().into(),
            "amq.direct".into(),
            q.as_str().into(),
            FieldTable::default(),
        )
        .await?;
        let c = ch
            .basic_publish(
                "amq.direct".into(),
                q.as_str().into(),
                mandatory,
                b"unrouted",
                BasicProperties::default(),
            )
            .await?
            .await?;
        assert!(c.is_ack());
        let ret = c
            .take_message()
            .expect("unrouted mandatory message returned");
        assert_eq!((ret.reply_code, ret.reply_text.as_str()), (312, "NO_ROUTE"));
        let q2 = ch
            .queue_declare(q.as_str().into(), durable(), quorum_args(&[]))
            .await?;
        assert_eq!(q2.message_count(), 1);

        // unbinding something that was never bound is fine in 3.10
        ch.queue_unbind(
            q.as_str().into(),
            "amq.direct".into(),
            "never-bound".into(),
            FieldTable::default(),
        )
        .await?;

        let missing_ex = unique("ex.missing");
        let ch2 = conn.create_channel().await?;
        let err = expect_amqp_error(
            ch2.queue_bind(
                q.as_str().into(),
                missing_ex.as_str().into(),
                "k".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await,
        );
        assert_eq!(
            err,
            (
                404,
                format!("NOT_FOUND - no exchange '{missing_ex}' in vhost '/'")
            )
        );
        let missing_q = unique("q.missing");
        let ch3 = conn.create_channel().await?;
        let err = expect_amqp_error(
            ch3.queue_bind(
                missing_q.as_str().into(),
                "amq.direct".into(),
                "k".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await,
        );
        assert_eq!(
            err,
            (
                404,
                format!("NOT_FOUND - no queue '{missing_q}' in vhost '/'")
            )
        );
        let ch4 = conn.create_channel().await?;
        let err = expect_amqp_error(
            ch4.queue_bind(
                q.as_str().into(),
                "".into(),
                "k".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await,
        );
        assert_eq!(
            err,
            (
                403,
                "ACCESS_REFUSED - operation not permitted on the default exchange".to_string()
            )
        );
        cleanup(&conn, &[&q]).await
    })
    .await
}

#[tokio::test]
async fn purge_returns_count() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let ch = confirm_channel(&conn).await?;
        let q = unique("q.purge");
        declare_quorum(&ch, &q, &[]).await?;
        for i in 0..7 {
            ch.basic_publish(
                "".into(),
                q.as_str().into(),
                Default::default(),
                format!("{i}").as_bytes(),
                BasicProperties::default(),
            )
            .await?;
        }
        assert!(ch.wait_for_confirms().await?.is_empty());
        assert_eq!(
            ch.queue_purge(q.as_str().into(), QueuePurgeOptions::default())
                .await?,
            7
        );
        assert_eq!(
            ch.queue_purge(q.as_str().into(), QueuePurgeOptions::default())
                .await?,
            0
        );
        assert_eq!(declare_quorum(&ch, &q, &[]).await?.message_count(), 0);
        let missing = unique("q.missing");
        let err = expect_amqp_error(
            ch.queue_purge(missing.as_str().into(), QueuePurgeOptions::default())
                .await,
        );
        assert_eq!(
            err,
            (
                404,
                format!("NOT_FOUND - no queue '{missing}' in vhost '/'")
            )
        );
        cleanup(&conn, &[&q]).await
    })
    .await
}

#[tokio::test]
async fn delete_if_unused_if_empty_quorum_is_540() -> anyhow::Result<()> {
    // RabbitMQ 3.10: queue.delete with if-unused or if-empty on a quorum queue
    // is a connection error, 540 NOT_IMPLEMENTED.
    bounded(T, async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let ch = confirm_channel(&conn).await?;
        let q = unique("q.delete");
        declare_quorum(&ch, &q, &[]).await?;
        publish_confirmed(&ch, "", &q, b"x", BasicProperties::default()).await?;
        publish_confirmed(&ch, "", &q, b"y", BasicProperties::default()).await?;
        for (flag, opts) in [
            ("if-empty", QueueDeleteOptions { if_empty: true, ..Default::default() }),
            ("if-unused", QueueDeleteOptions { if_unused: true, ..Default::default() }),
        ] {
            let conn2 = connect(broker.uri()).await?;
            let ch2 = conn2.create_channel().await?;
            let err = expect_amqp_error(ch2.queue_delete(q.as_str().into(), opts).await);
            assert_eq!(err, (540, format!("NOT_IMPLEMENTED - cannot delete queue '{q}' in vhost '/'. queue.delete operations with {flag} flag set are not supported by quorum queues")));
        }
        // a plain delete reports the message count; a missing queue gives delete-ok 0
        assert_eq!(ch.queue_delete(q.as_str().into(), QueueDeleteOptions::default()).await?, 2);
        assert_eq!(ch.queue_delete(q.as_str().into(), QueueDeleteOptions::default()).await?, 0);
        Ok(())
    })
    .await
}

#[tokio::test]
async fn delete_if_unused_classic_queue() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let ch = conn.create_channel().await?;
        let q = unique("q.classic.unused");
        ch.queue_declare(
            q.as_str().into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await?;
        let consumer_ch = conn.create_channel().await?;
        let _c = consumer_ch
            .basic_consume(
                q.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        let ch2 = conn.create_channel().await?;
        let err = expect_amqp_error(
            ch2.queue_delete(
                q.as_str().into(),
                QueueDeleteOptions {
                    if_unused: true,
                    ..Default::default()
                },
            )
            .await,
        );
        assert_eq!(
            err,
            (
                406,
                format!("PRECONDITION_FAILED - queue '{q}' in vhost '/' in use")
            )
        );
        consumer_ch.close(200, "OK".into()).await?;
        assert_eq!(
            ch.queue_delete(
                q.as_str().into(),
                QueueDeleteOptions {
                    if_unused: true,
                    ..Default::default()
                }
            )
            .await?,
            0
        );
        Ok(())
    })
    .await
}

#[tokio::test]
async fn delete_if_empty_classic_queue() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let ch = confirm_channel(&conn).await?;
        let q = unique("q.classic.delete");
        ch.queue_declare(
            q.as_str().into(),
            QueueDeclareOptions {
                auto_delete: false,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await?;
        publish_confirmed(&ch, "", &q, b"x", BasicProperties::default()).await?;
        let ch2 = conn.create_channel().await?;
        let err = expect_amqp_error(
            ch2.queue_delete(
                q.as_str().into(),
                QueueDeleteOptions {
                    if_empty: true,
                    ..Default::default()
                },
            )
            .await,
        );
        assert_eq!(
            err,
            (
                406,
                format!("PRECONDITION_FAILED - queue '{q}' in vhost '/' not empty")
            )
        );
        assert_eq!(
            ch.queue_purge(q.as_str().into(), QueuePurgeOptions::default())
                .await?,
            1
        );
        assert_eq!(
            ch.queue_delete(
                q.as_str().into(),
                QueueDeleteOptions {
                    if_empty: true,
                    ..Default::default()
                }
            )
            .await?,
            0
        );
        Ok(())
    })
    .await
}

/// A queue deleted while a channel holds an unacked basic.get from it:
/// closing that channel's connection (which returns the message to a queue
/// that no longer exists) finishes at once. Regression: the proposer kept
/// re-sending the get slot's `ConsumerDown` to the deleted group for its
/// whole 60 s retry window, so connection.close-ok took a minute.
#[tokio::test]
async fn closing_after_the_queue_of_an_unacked_get_was_deleted_does_not_hang() -> anyhow::Result<()>
{
    bounded(T, async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let ch = conn.create_channel().await?;
        let name = unique("q.deleted-under-get");
        declare_quorum(&ch, &name, &[]).await?;
        ch.basic_publish(
            "".into(),
            name.as_str().into(),
            BasicPublishOptions::default(),
            b"m",
            BasicProperties::default(),
        )
        .await?;
        let got = ch
            .basic_get(
                name.as_str().into(),
                lapin::options::BasicGetOptions::default(),
            )
            .await?;
        assert!(got.is_some(), "the published message");
        ch.queue_delete(name.as_str().into(), QueueDeleteOptions::default())
            .await?;
        tokio::time::timeout(Duration::from_secs(10), close_connection(&conn))
            .await
            .map_err(|_| anyhow::anyhow!("connection.close took over 10 s"))??;
        Ok(())
    })
    .await
}

/// A durable queue declared without a type (classic on RabbitMQ 3.10.8, quorum here) or
/// declared `x-queue-type: classic` takes queue.delete's if-empty and if-unused as a classic
/// queue does (issue 14 item 6), instead of the 540 quorum queues get: if-empty counts ready
/// messages only (unacknowledged ones do not keep the queue), if-unused counts consumers.
#[tokio::test]
async fn delete_if_empty_if_unused_on_untyped_and_classic_durable_queues() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let ch = confirm_channel(&conn).await?;
        let if_empty = QueueDeleteOptions {
            if_empty: true,
            ..Default::default()
        };
        let if_unused = QueueDeleteOptions {
            if_unused: true,
            ..Default::default()
        };
        let mut classic = FieldTable::default();
        classic.insert(
            "x-queue-type".into(),
            AMQPValue::LongString("classic".into()),
        );
        for (what, args) in [("untyped", FieldTable::default()), ("classic", classic)] {
            let q = unique(&format!("q.delete.{what}"));
            ch.queue_declare(q.as_str().into(), durable(), args).await?;
            publish_confirmed(&ch, "", &q, b"x", BasicProperties::default()).await?;
            publish_confirmed(&ch, "", &q, b"y", BasicProperties::default()).await?;

            let ch2 = conn.create_channel().await?;
            let err = expect_amqp_error(ch2.queue_delete(q.as_str().into(), if_empty).await);
            assert_eq!(
                err,
                (
                    406,
                    format!("PRECONDITION_FAILED - queue '{q}' in vhost '/' not empty")
                ),
                "{what}"
            );

            // Both messages delivered, not acknowledged: no longer ready.
            let (_cch, mut consumer) = open_consumer(&conn, &q, 10).await?;
            let got = consume_n(&mut consumer, 2, Duration::from_secs(10)).await?;
            assert_eq!(got.len(), 2);
            let ch3 = conn.create_channel().await?;
            let err = expect_amqp_error(ch3.queue_delete(q.as_str().into(), if_unused).await);
            assert_eq!(
                err,
                (
                    406,
                    format!("PRECONDITION_FAILED - queue '{q}' in vhost '/' in use")
                ),
                "{what}"
            );
            let ch4 = conn.create_channel().await?;
            assert_eq!(
                ch4.queue_delete(q.as_str().into(), if_empty).await?,
                0,
                "{what}: only unacknowledged messages left, so empty"
            );
            let passive = QueueDeclareOptions {
                passive: true,
                ..Default::default()
            };
            let err = expect_amqp_error(
                conn.create_channel()
                    .await?
                    .queue_declare(q.as_str().into(), passive, FieldTable::default())
                    .await,
            );
            assert_eq!(err.0, 404, "{what}: deleted");
        }
        Ok(())
    })
    .await
}
