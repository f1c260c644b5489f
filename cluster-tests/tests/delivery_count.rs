//! `x-delivery-count` as RabbitMQ 3.10.8 sets it (checked with pika against
//! it): quorum queues (declared quorum, or durable untyped, which quorumq
//! makes quorum) carry it on every basic.get and on redeliveries; queues
//! that behave as classic queues (declared `x-queue-type: classic`, and
//! exclusive or non-durable ones) never carry it (issue 14, compatibility).

use cluster_tests::*;
use lapin::{
    options::{BasicGetOptions, BasicNackOptions, QueueDeclareOptions, QueueDeleteOptions},
    types::{AMQPValue, FieldTable},
    BasicProperties, Channel,
};
use std::time::Duration;

const T: Duration = TEST_TIMEOUT;

/// The `x-delivery-count` of the next basic.get (None: no such header).
async fn get_count(ch: &Channel, q: &str, requeue: bool) -> anyhow::Result<Option<AMQPValue>> {
    let msg = ch
        .basic_get(q.into(), BasicGetOptions { no_ack: false })
        .await?
        .ok_or_else(|| anyhow::anyhow!("queue {q} is empty"))?;
    let count = msg
        .delivery
        .properties
        .headers()
        .as_ref()
        .and_then(|h| h.inner().get("x-delivery-count").cloned());
    msg.delivery
        .nack(BasicNackOptions {
            multiple: false,
            requeue,
        })
        .await?;
    Ok(count)
}

/// Publishes one message to `q`, then gets it twice (requeued in between).
async fn counts_of(
    ch: &Channel,
    q: &str,
) -> anyhow::Result<(Option<AMQPValue>, Option<AMQPValue>)> {
    publish_confirmed(ch, "", q, b"m", BasicProperties::default()).await?;
    let first = get_count(ch, q, true).await?;
    let second = get_count(ch, q, false).await?;
    Ok((first, second))
}

#[tokio::test]
async fn only_quorum_queues_count_deliveries() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let ch = confirm_channel(&conn).await?;
        let long = |n| Some(AMQPValue::LongLongInt(n));

        let quorum = unique("dc.quorum");
        ch.queue_declare(quorum.as_str().into(), durable(), quorum_args(&[]))
            .await?;
        assert_eq!(counts_of(&ch, &quorum).await?, (long(0), long(1)));

        let untyped = unique("dc.untyped");
        ch.queue_declare(untyped.as_str().into(), durable(), FieldTable::default())
            .await?;
        assert_eq!(counts_of(&ch, &untyped).await?, (long(0), long(1)));

        let classic = unique("dc.classic");
        let args = table(&[("x-queue-type", s("classic"))]);
        ch.queue_declare(classic.as_str().into(), durable(), args)
            .await?;
        assert_eq!(counts_of(&ch, &classic).await?, (None, None));

        let transient = unique("dc.transient");
        ch.queue_declare(
            transient.as_str().into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await?;
        assert_eq!(counts_of(&ch, &transient).await?, (None, None));

        let exclusive = ch
            .queue_declare(
                "".into(),
                QueueDeclareOptions {
                    exclusive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await?;
        assert_eq!(
            counts_of(&ch, exclusive.name().as_str()).await?,
            (None, None)
        );

        for q in [&quorum, &untyped, &classic, &transient] {
            ch.queue_delete(q.as_str().into(), QueueDeleteOptions::default())
                .await?;
        }
        Ok(())
    })
    .await
}

/// `--default-queue-type classic` (RabbitMQ's vhost `default_queue_type`): an untyped durable
/// queue behaves as a classic queue (no `x-delivery-count`, classic arguments only, classic
/// queue.delete conditions); a queue declared quorum is still one.
#[tokio::test]
async fn default_queue_type_classic_makes_untyped_durable_queues_classic() -> anyhow::Result<()> {
    bounded(T, async {
        let mut broker = Broker::start().await?;
        if broker.is_external() {
            println!("{TEST_URI_ENV} is set; this test restarts quorumq with a flag, returning early");
            return Ok(());
        }
        broker.restart_with(&["--default-queue-type", "classic"]).await?;
        let conn = connect(broker.uri()).await?;
        let ch = confirm_channel(&conn).await?;
        let long = |n| Some(AMQPValue::LongLongInt(n));

        let untyped = unique("dqt.untyped");
        ch.queue_declare(untyped.as_str().into(), durable(), FieldTable::default())
            .await?;
        assert_eq!(counts_of(&ch, &untyped).await?, (None, None));
        // Redeclared untyped: equivalent.
        ch.queue_declare(untyped.as_str().into(), durable(), FieldTable::default())
            .await?;

        let quorum = unique("dqt.quorum");
        ch.queue_declare(quorum.as_str().into(), durable(), quorum_args(&[]))
            .await?;
        assert_eq!(counts_of(&ch, &quorum).await?, (long(0), long(1)));

        // A quorum-only argument on an untyped declare is refused as on a classic queue.
        let bad = unique("dqt.limit");
        let mut args = FieldTable::default();
        args.insert("x-delivery-limit".into(), AMQPValue::LongInt(3));
        let err = expect_amqp_error(
            conn.create_channel()
                .await?
                .queue_declare(bad.as_str().into(), durable(), args)
                .await,
        );
        assert_eq!(
            err,
            (
                406,
                format!("PRECONDITION_FAILED - invalid arg 'x-delivery-limit' for queue '{bad}' in vhost '/' of queue type rabbit_classic_queue")
            )
        );

        // queue.delete if-empty on the untyped queue: classic semantics, not 540.
        publish_confirmed(&ch, "", &untyped, b"x", BasicProperties::default()).await?;
        let err = expect_amqp_error(
            conn.create_channel()
                .await?
                .queue_delete(
                    untyped.as_str().into(),
                    QueueDeleteOptions {
                        if_empty: true,
                        ..Default::default()
                    },
                )
                .await,
        );
        assert_eq!(err.0, 406);

        // list_queues shows the type clients see.
        let admin = broker.admin_addr().expect("spawned");
        let out = dlx::run(
            dlx::quorumqctl(&admin, &["list_queues", "--formatter", "json"]),
            dlx::CTL_TIMEOUT,
        )
        .await?;
        let rows: serde_json::Value = serde_json::from_str(&out)?;
        let type_of = |q: &str| {
            rows.as_array()
                .and_then(|rs| rs.iter().find(|r| r["name"] == q))
                .map(|r| r["type"].clone())
        };
        assert_eq!(type_of(&untyped), Some("classic".into()), "{out}");
        assert_eq!(type_of(&quorum), Some("quorum".into()), "{out}");

        // The flag is checked: an unknown type refuses to start.
        let refused = broker.restart_with(&["--default-queue-type", "stream"]).await;
        assert!(refused.is_err(), "an unknown default queue type must not start");
        assert!(broker.log_tail(4000).contains("expected 'quorum' or 'classic'"));
        Ok(())
    })
    .await
}
