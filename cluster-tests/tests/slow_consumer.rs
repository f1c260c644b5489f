//! A consumer that stops reading its socket (issue 14 item 5): it must not stall the other
//! consumers of the queue or the publishers, and when it goes away the messages it held
//! return to the live consumer — nothing lost.

use cluster_tests::raw::{self, RawConn};
use cluster_tests::*;
use futures::StreamExt;
use lapin::{options::BasicAckOptions, BasicProperties};
use std::{collections::BTreeSet, time::Duration};

const N: u32 = 600;
/// 50 held deliveries of this size (6.4 MB) fill the stuck socket's kernel buffers: its
/// connection's writer is really blocked.
const SIZE: usize = 128 << 10;

#[tokio::test]
async fn a_consumer_that_stops_reading_stalls_nobody_and_loses_nothing() -> anyhow::Result<()> {
    bounded(Duration::from_secs(180), async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let ch = confirm_channel(&conn).await?;
        let q = unique("slow.consumer");
        ch.queue_declare(q.as_str().into(), durable(), quorum_args(&[]))
            .await?;

        // The stuck consumer: prefetch 50, never reads after consuming. (Without a prefetch
        // limit a consumer is offered every ready message, here as on RabbitMQ.)
        let mut stuck = RawConn::handshake(broker.uri()).await?;
        stuck
            .send_method(1, raw::Args::method(20, 10).shortstr(""))
            .await?;
        stuck
            .send_method(1, raw::Args::method(60, 10).u32(0).u16(50).u8(0))
            .await?;
        let consume = raw::Args::method(60, 20)
            .u16(0)
            .shortstr(&q)
            .shortstr("stuck")
            .u8(0)
            .empty_table();
        stuck.send_method(1, consume).await?;
        tokio::time::sleep(Duration::from_millis(300)).await;

        // The live consumer, prefetch 100, acking.
        let live = connect(broker.uri()).await?;
        let (_lch, mut consumer) = open_consumer(&live, &q, 100).await?;

        // Publishing is not held back by the stuck consumer.
        let mut body = vec![0u8; SIZE];
        for i in 0..N {
            body[..4].copy_from_slice(&i.to_be_bytes());
            publish_confirmed(&ch, "", &q, &body, BasicProperties::default()).await?;
        }

        // The live consumer gets everything but what the stuck one holds.
        let mut seen = BTreeSet::new();
        let take = |seen: &mut BTreeSet<u32>, d: lapin::message::Delivery| {
            seen.insert(u32::from_be_bytes(d.data[..4].try_into().expect("4 bytes")));
            d
        };
        while seen.len() < (N - 50) as usize {
            let d = tokio::time::timeout(Duration::from_secs(20), consumer.next())
                .await
                .map_err(|_| anyhow::anyhow!("live consumer stalled after {}", seen.len()))?
                .ok_or_else(|| anyhow::anyhow!("consumer ended"))??;
            take(&mut seen, d).ack(BasicAckOptions::default()).await?;
        }

        // The stuck client goes away: what it held comes back to the live consumer.
        drop(stuck);
        while seen.len() < N as usize {
            let d = tokio::time::timeout(Duration::from_secs(30), consumer.next())
                .await
                .map_err(|_| anyhow::anyhow!("{} of {N} after the stuck client left", seen.len()))?
                .ok_or_else(|| anyhow::anyhow!("consumer ended"))??;
            take(&mut seen, d).ack(BasicAckOptions::default()).await?;
        }
        assert_eq!(
            seen,
            (0..N).collect(),
            "every message delivered to the live consumer"
        );
        Ok(())
    })
    .await
}
