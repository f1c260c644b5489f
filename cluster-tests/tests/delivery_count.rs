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
