//! exchange.declare / delete / bind for direct, fanout, topic and headers;
//! passive declares, durability, inequivalent redeclares (406) and routing.
//! Reply texts are RabbitMQ 3.10.8's, asserted verbatim.

use cluster_tests::*;
use lapin::{
    options::{
        BasicGetOptions, BasicPublishOptions, ExchangeBindOptions, ExchangeDeclareOptions,
        ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
    },
    types::{AMQPValue, FieldTable},
    BasicProperties, Channel, ExchangeKind,
};
use std::time::Duration;

const T: Duration = TEST_TIMEOUT;

fn kinds() -> Vec<(ExchangeKind, &'static str)> {
    vec![
        (ExchangeKind::Direct, "direct"),
        (ExchangeKind::Fanout, "fanout"),
        (ExchangeKind::Topic, "topic"),
        (ExchangeKind::Headers, "headers"),
    ]
}

async fn declare(ch: &Channel, name: &str, kind: ExchangeKind, durable: bool) -> lapin::Result<()> {
    ch.exchange_declare(
        name.into(),
        kind,
        ExchangeDeclareOptions {
            durable,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
}

async fn passive(ch: &Channel, name: &str, kind: ExchangeKind) -> lapin::Result<()> {
    ch.exchange_declare(
        name.into(),
        kind,
        ExchangeDeclareOptions {
            passive: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
}

async fn delete(ch: &Channel, name: &str) -> lapin::Result<()> {
    ch.exchange_delete(name.into(), ExchangeDeleteOptions::default())
        .await
}

/// A server-named exclusive queue bound to `ex` with `key`/`args`.
async fn bound_queue(
    ch: &Channel,
    ex: &str,
    key: &str,
    args: FieldTable,
) -> anyhow::Result<String> {
    let q = ch
        .queue_declare(
            "".into(),
            QueueDeclareOptions {
                exclusive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await?;
    ch.queue_bind(
        q.name().clone(),
        ex.into(),
        key.into(),
        QueueBindOptions::default(),
        args,
    )
    .await?;
    Ok(q.name().to_string())
}

/// Drains `q` with basic.get (no-ack) and returns the bodies.
async fn drain(ch: &Channel, q: &str) -> anyhow::Result<Vec<String>> {
    let mut out = Vec::new();
    while let Some(m) = ch
        .basic_get(q.into(), BasicGetOptions { no_ack: true })
        .await?
    {
        out.push(String::from_utf8(m.delivery.data.clone())?);
    }
    Ok(out)
}

#[tokio::test]
async fn declare_passive_delete_every_kind() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let ch = conn.create_channel().await?;
        for durable in [false, true] {
            for (kind, label) in kinds() {
                let name = unique(&format!("ex.{label}"));
                declare(&ch, &name, kind.clone(), durable).await?;
                // same declare again is a no-op
                declare(&ch, &name, kind.clone(), durable).await?;
                passive(&ch, &name, kind.clone()).await?;
                delete(&ch, &name).await?;
                let ch2 = conn.create_channel().await?;
                let err = expect_amqp_error(passive(&ch2, &name, kind).await);
                assert_eq!(
                    err,
                    (
                        404,
                        format!("NOT_FOUND - no exchange '{name}' in vhost '/'")
                    )
                );
            }
        }
        close_connection(&conn).await?;
        Ok(())
    })
    .await
}

#[tokio::test]
async fn passive_declare_of_missing_exchange_is_404() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let ch = conn.create_channel().await?;
        let name = unique("ex.missing");
        let err = expect_amqp_error(passive(&ch, &name, ExchangeKind::Direct).await);
        assert_eq!(
            err,
            (
                404,
                format!("NOT_FOUND - no exchange '{name}' in vhost '/'")
            )
        );
        assert!(!ch.status().connected(), "a 404 closes the channel");
        // the connection survives a channel error
        let ch2 = conn.create_channel().await?;
        passive(&ch2, "amq.direct", ExchangeKind::Direct).await?;
        Ok(())
    })
    .await
}

#[tokio::test]
async fn inequivalent_redeclare_is_406() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let name = unique("ex.ineq");
        let ch = conn.create_channel().await?;
        declare(&ch, &name, ExchangeKind::Direct, true).await?;

        let ch = conn.create_channel().await?;
        let err = expect_amqp_error(declare(&ch, &name, ExchangeKind::Fanout, true).await);
        assert_eq!(
            err,
            (406, format!("PRECONDITION_FAILED - inequivalent arg 'type' for exchange '{name}' in vhost '/': received 'fanout' but current is 'direct'"))
        );

        let ch = conn.create_channel().await?;
        let err = expect_amqp_error(declare(&ch, &name, ExchangeKind::Direct, false).await);
        assert_eq!(
            err,
            (406, format!("PRECONDITION_FAILED - inequivalent arg 'durable' for exchange '{name}' in vhost '/': received 'false' but current is 'true'"))
        );

        // passive ignores the type and flags
        let ch = conn.create_channel().await?;
        passive(&ch, &name, ExchangeKind::Topic).await?;
        delete(&ch, &name).await?;
        Ok(())
    })
    .await
}

#[tokio::test]
async fn reserved_amq_prefix_is_403() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let ch = conn.create_channel().await?;
        let err =
            expect_amqp_error(declare(&ch, "amq.ct-reserved", ExchangeKind::Direct, false).await);
        assert_eq!(
            err,
            (
                403,
                "ACCESS_REFUSED - exchange name 'amq.ct-reserved' contains reserved prefix 'amq.*'"
                    .into()
            )
        );
        // the predeclared ones answer a passive declare
        let ch = conn.create_channel().await?;
        for (n, k) in [
            ("amq.direct", ExchangeKind::Direct),
            ("amq.fanout", ExchangeKind::Fanout),
            ("amq.topic", ExchangeKind::Topic),
            ("amq.headers", ExchangeKind::Headers),
            ("amq.match", ExchangeKind::Headers),
        ] {
            passive(&ch, n, k).await?;
        }
        Ok(())
    })
    .await
}

#[tokio::test]
async fn delete_if_unused_and_missing() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let ch = conn.create_channel().await?;
        let name = unique("ex.inuse");
        declare(&ch, &name, ExchangeKind::Direct, false).await?;
        let q = bound_queue(&ch, &name, "k", FieldTable::default()).await?;
        let err = expect_amqp_error(
            ch.exchange_delete(
                name.as_str().into(),
                ExchangeDeleteOptions {
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
                format!("PRECONDITION_FAILED - exchange '{name}' in vhost '/' in use")
            )
        );
        let ch = conn.create_channel().await?;
        ch.queue_unbind(
            q.as_str().into(),
            name.as_str().into(),
            "k".into(),
            FieldTable::default(),
        )
        .await?;
        ch.exchange_delete(
            name.as_str().into(),
            ExchangeDeleteOptions {
                if_unused: true,
                ..Default::default()
            },
        )
        .await?;
        // deleting a missing exchange is not an error in RabbitMQ 3.10
        delete(&ch, &name).await?;
        assert!(ch.status().connected());
        Ok(())
    })
    .await
}

#[tokio::test]
async fn routing_direct_fanout_topic_headers() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let ch = confirm_channel(&conn).await?;
        let none = FieldTable::default();

        let direct = unique("ex.r.direct");
        declare(&ch, &direct, ExchangeKind::Direct, false).await?;
        let qa = bound_queue(&ch, &direct, "a", none.clone()).await?;
        let qb = bound_queue(&ch, &direct, "b", none.clone()).await?;
        for k in ["a", "b", "b", "c"] {
            ch.basic_publish(
                direct.as_str().into(),
                k.into(),
                BasicPublishOptions::default(),
                k.as_bytes(),
                BasicProperties::default(),
            )
            .await?;
        }

        let fanout = unique("ex.r.fanout");
        declare(&ch, &fanout, ExchangeKind::Fanout, false).await?;
        let f1 = bound_queue(&ch, &fanout, "ignored", none.clone()).await?;
        let f2 = bound_queue(&ch, &fanout, "", none.clone()).await?;
        ch.basic_publish(
            fanout.as_str().into(),
            "whatever".into(),
            BasicPublishOptions::default(),
            b"f",
            BasicProperties::default(),
        )
        .await?;

        let topic = unique("ex.r.topic");
        declare(&ch, &topic, ExchangeKind::Topic, false).await?;
        let t_star = bound_queue(&ch, &topic, "*.normal.routing.key", none.clone()).await?;
        let t_hash = bound_queue(&ch, &topic, "#.key", none.clone()).await?;
        let t_exact = bound_queue(&ch, &topic, "a.b", none.clone()).await?;
        for k in [
            "prefix.normal.routing.key",
            "x.y.normal.routing.key",
            "key",
            "a.b",
            "a.b.c",
        ] {
            ch.basic_publish(
                topic.as_str().into(),
                k.into(),
                BasicPublishOptions::default(),
                k.as_bytes(),
                BasicProperties::default(),
            )
            .await?;
        }

        let headers = unique("ex.r.headers");
        declare(&ch, &headers, ExchangeKind::Headers, false).await?;
        let h_all = bound_queue(
            &ch,
            &headers,
            "",
            table(&[
                ("x-match", s("all")),
                ("color", s("red")),
                ("size", AMQPValue::LongInt(3)),
            ]),
        )
        .await?;
        let h_any = bound_queue(
            &ch,
            &headers,
            "",
            table(&[
                ("x-match", s("any")),
                ("color", s("red")),
                ("size", AMQPValue::LongInt(3)),
            ]),
        )
        .await?;
        for (body, hdrs) in [
            (
                "both",
                table(&[("color", s("red")), ("size", AMQPValue::LongInt(3))]),
            ),
            ("color", table(&[("color", s("red"))])),
            ("neither", table(&[("color", s("blue"))])),
        ] {
            ch.basic_publish(
                headers.as_str().into(),
                "".into(),
                BasicPublishOptions::default(),
                body.as_bytes(),
                BasicProperties::default().with_headers(hdrs),
            )
            .await?;
        }
        assert!(ch.wait_for_confirms().await?.is_empty());

        assert_eq!(drain(&ch, &qa).await?, ["a"]);
        assert_eq!(drain(&ch, &qb).await?, ["b", "b"]);
        assert_eq!(drain(&ch, &f1).await?, ["f"]);
        assert_eq!(drain(&ch, &f2).await?, ["f"]);
        assert_eq!(drain(&ch, &t_star).await?, ["prefix.normal.routing.key"]);
        assert_eq!(
            drain(&ch, &t_hash).await?,
            ["prefix.normal.routing.key", "x.y.normal.routing.key", "key"]
        );
        assert_eq!(drain(&ch, &t_exact).await?, ["a.b"]);
        assert_eq!(drain(&ch, &h_all).await?, ["both"]);
        assert_eq!(drain(&ch, &h_any).await?, ["both", "color"]);
        for e in [&direct, &fanout, &topic, &headers] {
            delete(&ch, e).await?;
        }
        Ok(())
    })
    .await
}

#[tokio::test]
async fn exchange_to_exchange_binding() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let ch = confirm_channel(&conn).await?;
        let src = unique("ex.e2e.src");
        let dst = unique("ex.e2e.dst");
        declare(&ch, &src, ExchangeKind::Topic, false).await?;
        declare(&ch, &dst, ExchangeKind::Fanout, false).await?;
        ch.exchange_bind(
            dst.as_str().into(),
            src.as_str().into(),
            "a.*".into(),
            ExchangeBindOptions::default(),
            FieldTable::default(),
        )
        .await?;
        let q = bound_queue(&ch, &dst, "", FieldTable::default()).await?;
        publish_confirmed(&ch, &src, "a.x", b"1", BasicProperties::default()).await?;
        publish_confirmed(&ch, &src, "b.x", b"2", BasicProperties::default()).await?;
        assert_eq!(drain(&ch, &q).await?, ["1"]);
        ch.exchange_unbind(
            dst.as_str().into(),
            src.as_str().into(),
            "a.*".into(),
            Default::default(),
            FieldTable::default(),
        )
        .await?;
        publish_confirmed(&ch, &src, "a.x", b"3", BasicProperties::default()).await?;
        assert!(drain(&ch, &q).await?.is_empty());
        ch.queue_delete(q.as_str().into(), QueueDeleteOptions::default())
            .await?;
        delete(&ch, &src).await?;
        delete(&ch, &dst).await?;
        Ok(())
    })
    .await
}
