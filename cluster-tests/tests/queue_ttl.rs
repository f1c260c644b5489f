//! Queue TTL (`x-expires`, spec §2.4): an unused quorum queue is deleted
//! once the lease runs out, and its messages are NOT dead-lettered; a queue
//! with a consumer stays. RabbitMQ checks the lease on its 5 s leader tick,
//! so the waits are bounded polls, not fixed sleeps.

use cluster_tests::*;
use lapin::{
    options::BasicConsumeOptions,
    types::{AMQPValue, FieldTable},
    BasicProperties, Connection,
};
use std::time::{Duration, Instant};

/// Passive declare on a fresh channel (a 404 closes it): Some(ready count) or None on 404.
async fn exists(conn: &Connection, q: &str) -> anyhow::Result<Option<u32>> {
    let ch = conn.create_channel().await?;
    match dlx::passive_ready(&ch, q).await {
        Ok(n) => Ok(Some(n)),
        Err(e)
            if e.downcast_ref::<lapin::Error>()
                .and_then(amqp_error)
                .map(|(c, _)| c)
                == Some(404) =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

#[tokio::test]
async fn unused_queue_expires_without_dead_lettering() -> anyhow::Result<()> {
    bounded(Duration::from_secs(60), async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let ch = confirm_channel(&conn).await?;
        let (q, dlx, dlq) = (unique("ttl.q"), unique("ttl.dlx"), unique("ttl.dlq"));
        dlx::fanout(&ch, &dlx).await?;
        ch.queue_declare(dlq.as_str().into(), durable(), quorum_args(&[]))
            .await?;
        dlx::bind(&ch, &dlq, &dlx, "").await?;
        ch.queue_declare(
            q.as_str().into(),
            durable(),
            quorum_args(&[
                ("x-expires", AMQPValue::LongInt(1000)),
                ("x-dead-letter-exchange", s(&dlx)),
            ]),
        )
        .await?;
        for i in 0..3u8 {
            publish_confirmed(&ch, "", &q, &[i], BasicProperties::default()).await?;
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while exists(&conn, &q).await?.is_some() {
            assert!(
                Instant::now() < deadline,
                "queue {q} with x-expires 1000 ms still exists after 30 s"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert_eq!(
            exists(&conn, &dlq).await?,
            Some(0),
            "queue expiry must not dead-letter its messages"
        );
        ch.queue_delete(dlq.as_str().into(), Default::default())
            .await?;
        ch.exchange_delete(dlx.as_str().into(), Default::default())
            .await?;
        close_connection(&conn).await
    })
    .await
}

#[tokio::test]
async fn queue_with_a_consumer_does_not_expire() -> anyhow::Result<()> {
    bounded(Duration::from_secs(60), async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let ch = conn.create_channel().await?;
        let q = unique("ttl.busy");
        ch.queue_declare(
            q.as_str().into(),
            durable(),
            quorum_args(&[("x-expires", AMQPValue::LongInt(1000))]),
        )
        .await?;
        let _consumer = ch
            .basic_consume(
                q.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        // Well past the lease and past RabbitMQ's 5 s tick.
        tokio::time::sleep(Duration::from_secs(7)).await;
        assert!(
            exists(&conn, &q).await?.is_some(),
            "a queue with a consumer must not expire"
        );
        ch.queue_delete(q.as_str().into(), Default::default())
            .await?;
        close_connection(&conn).await
    })
    .await
}
