//! Node-local queues (non-durable, auto-delete: RabbitMQ's classic queues,
//! unreplicated here) are served from every node, as RabbitMQ serves a
//! classic queue from any node of its cluster: another node forwards every
//! command to the queue's home node. Before, another node either did not
//! know the queue (404, and a publish through it was confirmed as
//! unroutable and dropped) or, on a re-declare through it, made a second
//! queue of the same name there. A killed node's transient queues are
//! deleted, as RabbitMQ deletes them when a node goes down.

use cluster_tests::{
    cluster::{retry, Cluster},
    confirm_channel, connect, consume_n, expect_amqp_error, open_consumer, publish_confirmed,
};
use futures::StreamExt;
use lapin::{
    options::{BasicAckOptions, BasicCancelOptions, BasicGetOptions, QueueDeclareOptions},
    types::FieldTable,
    BasicProperties,
};
use std::time::Duration;

fn transient() -> QueueDeclareOptions {
    QueueDeclareOptions::default()
}

fn exclusive() -> QueueDeclareOptions {
    QueueDeclareOptions {
        exclusive: true,
        ..QueueDeclareOptions::default()
    }
}

fn passive() -> QueueDeclareOptions {
    QueueDeclareOptions {
        passive: true,
        ..QueueDeclareOptions::default()
    }
}

/// RabbitMQ's first tutorial across nodes: the consumer declares `hello`
/// (non-durable) on node 1, the producer declares it again and publishes on
/// node 2; every message reaches the consumer. Then an auto-delete queue of
/// node 1 consumed from node 3 is deleted when that consumer cancels.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transient_queue_is_one_queue_on_every_node() -> anyhow::Result<()> {
    let cluster = Cluster::start(3).await?;
    let r = cluster_tests::bounded(Duration::from_secs(120), async {
        let c1 = cluster.ready_connection(1, "lq.warmup").await?;
        let c2 = connect(&cluster.uri(2)).await?;
        let c3 = connect(&cluster.uri(3)).await?;
        let ch1 = c1.create_channel().await?;
        ch1.queue_declare("hello".into(), transient(), FieldTable::default())
            .await?;
        let (_cch, mut on1) = open_consumer(&c1, "hello", 100).await?;

        let ch2 = confirm_channel(&c2).await?;
        let ok = ch2
            .queue_declare("hello".into(), transient(), FieldTable::default())
            .await?;
        assert_eq!(ok.consumer_count(), 1, "node 2 sees node 1's consumer");
        const N: usize = 20;
        for i in 0..N {
            publish_confirmed(
                &ch2,
                "",
                "hello",
                format!("m{i}").as_bytes(),
                BasicProperties::default(),
            )
            .await?;
        }
        let got = consume_n(&mut on1, N, Duration::from_secs(20)).await?;
        for d in &got {
            d.ack(BasicAckOptions::default()).await?;
        }
        let mut bodies: Vec<String> = got
            .iter()
            .map(|d| String::from_utf8_lossy(&d.data).into_owned())
            .collect();
        bodies.sort();
        let mut want: Vec<String> = (0..N).map(|i| format!("m{i}")).collect();
        want.sort();
        assert_eq!(bodies, want, "node 1's consumer gets what node 2 published");

        // Auto-delete queue of node 1, consumed on node 3.
        let opts = QueueDeclareOptions {
            auto_delete: true,
            ..QueueDeclareOptions::default()
        };
        ch1.queue_declare("ad".into(), opts, FieldTable::default())
            .await?;
        let (ch3, mut on3) = open_consumer(&c3, "ad", 100).await?;
        let chp = confirm_channel(&c1).await?;
        publish_confirmed(&chp, "", "ad", b"to node 3", BasicProperties::default()).await?;
        let got = consume_n(&mut on3, 1, Duration::from_secs(20)).await?;
        assert_eq!(&got[0].data[..], b"to node 3");
        got[0].ack(BasicAckOptions::default()).await?;
        ch3.basic_cancel(on3.tag().as_str().into(), BasicCancelOptions::default())
            .await?;
        let gone = retry(
            Duration::from_secs(10),
            "the auto-delete queue goes",
            || async {
                let ch = c1.create_channel().await?;
                let r = ch
                    .queue_declare("ad".into(), passive(), FieldTable::default())
                    .await;
                match r {
                    Ok(_) => anyhow::bail!("still there"),
                    Err(e) => anyhow::Ok(e),
                }
            },
        )
        .await?;
        assert_eq!(expect_amqp_error::<()>(Err(gone)).0, 404);
        anyhow::Ok(())
    })
    .await;
    cluster.logs_on_error(r, 8_000)
}

/// A consumer on node 2 of node 1's transient queue holds a message unacked
/// when node 2 is killed: the message returns (redelivered) to a consumer on
/// node 1, as RabbitMQ returns a dead consumer's messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_remote_consumers_messages_return() -> anyhow::Result<()> {
    let cluster = Cluster::start(3).await?;
    let r = cluster_tests::bounded(Duration::from_secs(120), async {
        let c1 = cluster.ready_connection(1, "lq.warmup").await?;
        let ch1 = confirm_channel(&c1).await?;
        ch1.queue_declare("held".into(), transient(), FieldTable::default())
            .await?;
        let c2 = connect(&cluster.uri(2)).await?;
        let (_ch2, mut on2) = open_consumer(&c2, "held", 100).await?;
        publish_confirmed(&ch1, "", "held", b"unacked", BasicProperties::default()).await?;
        let got = consume_n(&mut on2, 1, Duration::from_secs(20)).await?;
        assert_eq!(&got[0].data[..], b"unacked");
        cluster.kill9(2);
        let (_cch, mut on1) = open_consumer(&c1, "held", 100).await?;
        let back = tokio::time::timeout(Duration::from_secs(30), on1.next())
            .await
            .map_err(|_| anyhow::anyhow!("the dead consumer's message did not return in 30 s"))?
            .ok_or_else(|| anyhow::anyhow!("consumer ended"))??;
        assert_eq!(&back.data[..], b"unacked");
        assert!(back.redelivered, "a returned message is redelivered");
        back.ack(BasicAckOptions::default()).await?;
        let ch = c1.create_channel().await?;
        let left = ch
            .basic_get("held".into(), BasicGetOptions::default())
            .await?;
        assert!(left.is_none(), "nothing else in the queue");
        anyhow::Ok(())
    })
    .await;
    cluster.logs_on_error(r, 8_000)
}

/// Dead letters of a quorum queue led on node 2 reach a transient queue of
/// node 1, with either dead-letter strategy (the worker routes them on node
/// 2, which had not opened node 1's queue: before, at-most-once dropped them
/// and at-least-once held them forever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_reach_another_nodes_transient_queue() -> anyhow::Result<()> {
    let cluster = Cluster::start(3).await?;
    let r = cluster_tests::bounded(Duration::from_secs(120), async {
        let c1 = cluster.ready_connection(1, "lq.warmup").await?;
        let c2 = connect(&cluster.uri(2)).await?;
        let ch1 = c1.create_channel().await?;
        ch1.queue_declare("dl.target".into(), transient(), FieldTable::default())
            .await?;
        let ch2 = confirm_channel(&c2).await?;
        for strategy in ["at-most-once", "at-least-once"] {
            let src = format!("dl.src.{strategy}");
            let mut args = cluster_tests::quorum_args(&[
                ("x-dead-letter-exchange", cluster_tests::s("")),
                ("x-dead-letter-routing-key", cluster_tests::s("dl.target")),
                ("x-dead-letter-strategy", cluster_tests::s(strategy)),
                ("x-overflow", cluster_tests::s("reject-publish")),
            ]);
            args.insert("x-message-ttl".into(), lapin::types::AMQPValue::LongInt(50));
            ch2.queue_declare(src.as_str().into(), cluster_tests::durable(), args)
                .await?;
            publish_confirmed(
                &ch2,
                "",
                &src,
                strategy.as_bytes(),
                BasicProperties::default(),
            )
            .await?;
        }
        let (_ch, mut on1) = open_consumer(&c1, "dl.target", 100).await?;
        let got = consume_n(&mut on1, 2, Duration::from_secs(30)).await?;
        let mut bodies: Vec<String> = got
            .iter()
            .map(|d| String::from_utf8_lossy(&d.data).into_owned())
            .collect();
        bodies.sort();
        assert_eq!(
            bodies,
            ["at-least-once", "at-most-once"],
            "both dead letters arrive"
        );
        for d in &got {
            d.ack(BasicAckOptions::default()).await?;
        }
        anyhow::Ok(())
    })
    .await;
    cluster.logs_on_error(r, 8_000)
}

/// Asserts that an exclusive declare of `queue` through `conn` is refused
/// with 405 RESOURCE_LOCKED (another connection owns it): `what` names it.
async fn assert_locked(conn: &lapin::Connection, queue: &str, what: &str) -> anyhow::Result<()> {
    let declared = conn
        .create_channel()
        .await?
        .queue_declare(queue.into(), exclusive(), FieldTable::default())
        .await;
    assert_eq!(expect_amqp_error(declared).0, 405, "{what} is locked");
    Ok(())
}

/// Node 1 holds an exclusive queue (an RPC client's fixed-name reply queue)
/// and a transient queue consumed from node 2. Node 1 is killed: as
/// RabbitMQ's `on_node_down` does, the cluster deletes both. Node 2's
/// consumer is cancelled (basic.cancel), the transient queue is 404 through
/// node 3, and the RPC client, reconnected to node 2, declares its reply
/// queue again there and gets replies in it (before: 405 RESOURCE_LOCKED
/// until node 1 came back). Node 1 back does not touch node 2's new queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_nodes_transient_queues_are_deleted() -> anyhow::Result<()> {
    let cluster = Cluster::start(3).await?;
    let r = cluster_tests::bounded(Duration::from_secs(120), async {
        let c1 = cluster.ready_connection(1, "lq.warmup").await?;
        let ch1 = c1.create_channel().await?;
        ch1.queue_declare("rpc.reply".into(), exclusive(), FieldTable::default())
            .await?;
        ch1.queue_declare("tq".into(), transient(), FieldTable::default())
            .await?;
        let c2 = connect(&cluster.uri(2)).await?;
        let (_cch2, mut on2) = open_consumer(&c2, "tq", 10).await?;
        assert_locked(
            &c2,
            "rpc.reply",
            "node 1's exclusive queue, while node 1 is up",
        )
        .await?;

        cluster.kill9(1);
        match tokio::time::timeout(Duration::from_secs(30), on2.next()).await {
            Ok(None) => {}
            other => anyhow::bail!("node 2's consumer of tq not cancelled in 30 s: {other:?}"),
        }
        let c3 = connect(&cluster.uri(3)).await?;
        let gone = c3
            .create_channel()
            .await?
            .queue_declare("tq".into(), passive(), FieldTable::default())
            .await;
        assert_eq!(expect_amqp_error(gone).0, 404, "tq is gone with node 1");
        let ch2 = c2.create_channel().await?;
        let ok = ch2
            .queue_declare("rpc.reply".into(), exclusive(), FieldTable::default())
            .await?;
        assert_eq!(ok.message_count(), 0, "a new, empty reply queue");
        let (_rch, mut replies) = open_consumer(&c2, "rpc.reply", 10).await?;
        let ch3 = confirm_channel(&c3).await?;
        publish_confirmed(&ch3, "", "rpc.reply", b"reply", BasicProperties::default()).await?;
        let got = consume_n(&mut replies, 1, Duration::from_secs(20)).await?;
        assert_eq!(&got[0].data[..], b"reply");
        got[0].ack(BasicAckOptions::default()).await?;

        cluster.restart(1).await?;
        let c1 = connect(&cluster.uri(1)).await?;
        assert_locked(
            &c1,
            "rpc.reply",
            "node 2's new reply queue, after node 1's return",
        )
        .await?;
        publish_confirmed(&ch3, "", "rpc.reply", b"again", BasicProperties::default()).await?;
        let got = consume_n(&mut replies, 1, Duration::from_secs(20)).await?;
        assert_eq!(&got[0].data[..], b"again");
        anyhow::Ok(())
    })
    .await;
    cluster.logs_on_error(r, 8_000)
}
