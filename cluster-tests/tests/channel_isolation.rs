//! A channel that waits on Raft holds only itself (issue 27, item 4). Until
//! the channel became its own state machine, `queue.declare` awaited the meta
//! group inside the connection's read loop: while one channel waited for a
//! commit, the connection's other channels received nothing and no heartbeat
//! was read or written.
//!
//! Here node 1 alone holds a queue (group size 1, so it commits with the other
//! nodes paused); a consumer of it on channel 2 must go on receiving, for
//! longer than two heartbeat intervals, while channel 1 of the same connection
//! waits on a `queue.declare` that the meta group cannot commit (nodes 2 and 3
//! paused with SIGSTOP: no majority).

use std::time::{Duration, Instant};

use cluster_tests::{
    cluster::{declare_durable, Cluster},
    confirm_channel, connect, durable, publish_confirmed, quorum_args,
};
use futures::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::BasicProperties;

/// Heartbeat the consuming connection negotiates (seconds).
const HEARTBEAT_S: u64 = 2;
/// How long the declare is kept waiting while channel 2 consumes.
const STALL: Duration = Duration::from_secs(3 * HEARTBEAT_S);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_waiting_on_the_meta_group_stalls_neither_other_channels_nor_heartbeats(
) -> anyhow::Result<()> {
    cluster_tests::bounded(Duration::from_secs(240), async {
        let cluster = Cluster::start(3).await?;
        let q = "isolation.q";
        let conn = connect(&format!("{}?heartbeat={HEARTBEAT_S}", cluster.uri(1))).await?;
        let ch1 = conn.create_channel().await?;
        let ch2 = conn.create_channel().await?;
        declare_durable(
            &ch2,
            q,
            quorum_args(&[("x-quorum-initial-group-size", AMQPValue::LongInt(1))]),
        )
        .await?;
        assert_eq!(
            cluster
                .wait_queue_leader(1, q, Duration::from_secs(30))
                .await?,
            1,
            "a one-member queue declared on node 1 lives there"
        );
        let mut consumer = ch2
            .basic_consume(
                q.into(),
                "iso".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        // The publisher has a connection of its own.
        let publisher = connect(&cluster.uri(1)).await?;
        let pch = confirm_channel(&publisher).await?;
        publish_confirmed(&pch, "", q, b"before", BasicProperties::default()).await?;
        let d = receive(&mut consumer).await?;
        assert_eq!(d.data, b"before");
        d.ack(BasicAckOptions::default()).await?;

        // No meta majority: channel 1's declare waits.
        cluster.sigstop(2)?;
        cluster.sigstop(3)?;
        let declare = tokio::spawn({
            let ch1 = ch1.clone();
            async move {
                ch1.queue_declare("isolation.waits".into(), durable(), FieldTable::default())
                    .await
            }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!declare.is_finished(), "the declare cannot commit yet");

        let started = Instant::now();
        let mut n = 0;
        while started.elapsed() < STALL {
            let body = format!("during-{n}");
            publish_confirmed(&pch, "", q, body.as_bytes(), BasicProperties::default()).await?;
            let d = receive(&mut consumer)
                .await
                .map_err(|e| e.context(format!("delivery {n} while channel 1 waits")))?;
            assert_eq!(d.data, body.as_bytes());
            d.ack(BasicAckOptions::default()).await?;
            n += 1;
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        assert!(
            !declare.is_finished(),
            "the declare was still waiting while channel 2 received {n} messages"
        );
        assert!(
            conn.status().connected(),
            "heartbeats kept the connection open"
        );

        // The meta group has its majority again: the declare completes.
        cluster.sigcont(2)?;
        cluster.sigcont(3)?;
        let declared = tokio::time::timeout(Duration::from_secs(60), declare).await??;
        let ok = declared?;
        assert_eq!(ok.name().as_str(), "isolation.waits");
        publish_confirmed(&pch, "", q, b"after", BasicProperties::default()).await?;
        let d = receive(&mut consumer).await?;
        assert_eq!(d.data, b"after");
        d.ack(BasicAckOptions::default()).await?;
        assert!(conn.status().connected());
        anyhow::Ok(())
    })
    .await
}

/// The consumer's next delivery, within one heartbeat interval.
async fn receive(consumer: &mut lapin::Consumer) -> anyhow::Result<lapin::message::Delivery> {
    match tokio::time::timeout(Duration::from_secs(HEARTBEAT_S), consumer.next()).await {
        Ok(Some(Ok(d))) => Ok(d),
        Ok(other) => anyhow::bail!("consumer ended: {other:?}"),
        Err(_) => anyhow::bail!("no delivery within {HEARTBEAT_S} s"),
    }
}
