//! `x-single-active-consumer` on a quorum queue: only the first consumer
//! receives; when its channel closes the next one takes over (and gets the
//! returned messages); basic.get is refused with 405 as in RabbitMQ 3.10.8.

use cluster_tests::*;
use lapin::{
    options::{BasicAckOptions, BasicConsumeOptions, BasicGetOptions, BasicQosOptions},
    types::{AMQPValue, FieldTable},
    BasicProperties,
};
use std::time::Duration;

#[tokio::test]
async fn single_active_consumer_takes_over_in_order() -> anyhow::Result<()> {
    bounded(Duration::from_secs(60), async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let ch = confirm_channel(&conn).await?;
        let q = unique("sac.q");
        ch.queue_declare(
            q.as_str().into(),
            durable(),
            quorum_args(&[("x-single-active-consumer", AMQPValue::Boolean(true))]),
        )
        .await?;
        let first_ch = conn.create_channel().await?;
        first_ch.basic_qos(100, BasicQosOptions::default()).await?;
        let mut first = first_ch
            .basic_consume(
                q.as_str().into(),
                "first".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        let second_ch = conn.create_channel().await?;
        let mut second = second_ch
            .basic_consume(
                q.as_str().into(),
                "second".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        for i in 0..5u8 {
            publish_confirmed(&ch, "", &q, &[i], BasicProperties::default()).await?;
        }
        let got = consume_n(&mut first, 5, Duration::from_secs(10)).await?;
        assert_eq!(
            got.iter().map(|d| d.data[0]).collect::<Vec<_>>(),
            vec![0, 1, 2, 3, 4]
        );
        expect_no_delivery(&mut second, Duration::from_millis(500)).await?;
        // basic.get is refused on a single-active-consumer quorum queue.
        let get_ch = conn.create_channel().await?;
        let err = expect_amqp_error(
            get_ch
                .basic_get(q.as_str().into(), BasicGetOptions::default())
                .await,
        );
        assert_eq!(err.0, 405);
        assert_eq!(
            err.1,
            format!(
                "RESOURCE_LOCKED - cannot obtain access to locked queue '{q}' in vhost '/'. \
                 basic.get operations are not supported by quorum queues \
                 with single active consumer"
            )
        );
        // The active consumer's channel closes unacked: the next consumer
        // takes over and receives everything, redelivered.
        first_ch.close(200, "bye".into()).await?;
        let got = consume_n(&mut second, 5, Duration::from_secs(10)).await?;
        let mut ids: Vec<u8> = got.iter().map(|d| d.data[0]).collect();
        ids.sort_unstable();
        assert_eq!(ids, vec![0, 1, 2, 3, 4]);
        assert!(got.iter().all(|d| d.redelivered));
        for d in &got {
            d.ack(BasicAckOptions::default()).await?;
        }
        drop(first);
        ch.queue_delete(q.as_str().into(), Default::default())
            .await?;
        close_connection(&conn).await
    })
    .await
}
