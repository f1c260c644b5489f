//! Consumers on a node the queue leader loses (rabbit_fifo 3.10
//! `noconnection` / `nodeup`): when the leader's node is cut off from a
//! consumer's node by a real partition (network namespaces, iptables), the
//! messages checked out to that consumer return, redelivered with
//! `x-delivery-count` + 1, to a consumer on a node the leader still reaches
//! — without any restart. Before, they stayed checked out until the cut-off
//! node restarted. After the heal the cut-off consumer, still attached
//! (no reconnect), receives new messages again. Needs root, as the fault
//! suite does; CI runs as root.

use cluster_tests::{
    cluster::{retry, Cluster},
    connect, consume_n, expect_no_delivery,
    faults::net::Net,
    open_consumer, publish_confirmed,
};
use futures::StreamExt;
use lapin::{options::BasicAckOptions, types::AMQPValue, BasicProperties};
use std::collections::BTreeSet;
use std::time::Duration;

fn delivery_count(d: &lapin::message::Delivery) -> Option<i64> {
    let headers = d.properties.headers().as_ref()?;
    match headers.inner().get("x-delivery-count")? {
        AMQPValue::LongLongInt(n) => Some(*n),
        AMQPValue::LongInt(n) => Some(i64::from(*n)),
        AMQPValue::LongUInt(n) => Some(i64::from(*n)),
        _ => None,
    }
}

/// Deliveries in flight to a consumer when its node is cut off are returned
/// by the leader (`NodeDown`) and redelivered elsewhere; the leader's node
/// keeps retrying the original `Deliver` call, and after the heal it must not
/// hand the cut-off consumer those originals: they would arrive as second
/// copies not flagged redelivered (the fault suite saw ~20 per partition,
/// one prefetch, before `cluster/deliveries.rs` dropped retried and queued
/// deliveries no longer checked out to their consumer). Not covered: the
/// call already on the wire when the cut came (see the last assertion).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_consumer_gets_no_late_original_of_a_message_returned_meanwhile(
) -> anyhow::Result<()> {
    cluster_tests::bounded(Duration::from_secs(240), async {
        let (net, cluster) = Net::start_cluster(3, "quorumq-late-").await?;
        let q = "late.q";
        let (_c1, ch1) = cluster.quorum_queue_led_by(1, q).await?;
        let c3 = connect(&cluster.uri(3)).await?;
        let (_ch3, mut cut) = open_consumer(&c3, q, 100).await?;
        let c2 = connect(&cluster.uri(2)).await?;
        let (ch2, mut live) = open_consumer(&c2, q, 100).await?;

        // Cut node 3 off, then publish at once: the leader hands about half
        // to node 3's consumer before its failure detector takes node 3 for down.
        net.block(3, 1)?;
        net.block(3, 2)?;
        const N: usize = 20;
        for i in 0..N {
            publish_confirmed(&ch1, "", q, format!("m{i}").as_bytes(), BasicProperties::default()).await?;
        }
        let got = consume_n(&mut live, N, Duration::from_secs(60))
            .await
            .map_err(|e| e.context("the cut-off consumer's messages were not returned to node 2's"))?;
        let returned: BTreeSet<String> = got
            .iter()
            .filter(|d| d.redelivered)
            .map(|d| String::from_utf8_lossy(&d.data).into_owned())
            .collect();
        for d in &got {
            ch2.basic_ack(d.delivery_tag, BasicAckOptions::default()).await?;
        }
        anyhow::ensure!(
            !returned.is_empty(),
            "no delivery was in flight to node 3 when it was cut off (all {N} went to node 2): nothing to check"
        );

        // The Deliver attempt in flight when node 3 was cut off times out
        // after 5 s; the retry, and the calls queued behind it, send only
        // what is still checked out to node 3's consumer.
        tokio::time::sleep(Duration::from_secs(6)).await;
        // Heal. Node 3's consumer may get new deliveries, never an original of a returned one.
        net.heal()?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(8);
        let mut late = Vec::new();
        while let Ok(Some(d)) = tokio::time::timeout_at(deadline, cut.next()).await {
            let d = d?;
            let body = String::from_utf8_lossy(&d.data).into_owned();
            if returned.contains(&body) {
                late.push((body, d.redelivered));
            }
            d.acker.ack(BasicAckOptions::default()).await?;
        }
        // The first call to node 3 was on the wire when it was cut off: its
        // bytes (one delivery: the publishes were one at a time) arrive at
        // the heal all the same, whatever its sender does since. Every later
        // call was filtered against the leader's state.
        assert!(
            late.len() <= 1,
            "{} returned and redelivered messages reached the cut-off consumer again after the heal (at most the one on the wire may): {late:?}",
            late.len()
        );
        eprintln!(
            "{} of {N} were in flight to node 3 and returned; {} of them arrived there after the heal",
            returned.len(),
            late.len()
        );
        for id in cluster.ids() {
            cluster.kill9(id);
        }
        anyhow::Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_consumers_messages_go_to_live_consumers_and_it_resumes_after_the_heal(
) -> anyhow::Result<()> {
    cluster_tests::bounded(Duration::from_secs(240), async {
        let (net, cluster) = Net::start_cluster(3, "quorumq-liveness-").await?;
        let q = "liveness.q";
        let (_c1, ch1) = cluster.quorum_queue_led_by(1, q).await?;

        // Node 3's consumer takes 10 messages and holds them.
        let c3 = connect(&cluster.uri(3)).await?;
        let (_ch3, mut held) = open_consumer(&c3, q, 10).await?;
        for i in 0..10u32 {
            publish_confirmed(&ch1, "", q, format!("m{i}").as_bytes(), BasicProperties::default()).await?;
        }
        let first = consume_n(&mut held, 10, Duration::from_secs(30)).await?;
        assert!(first.iter().all(|d| !d.redelivered));

        // A consumer on node 2 waits; node 3 is cut off from both other nodes
        // (clients still reach every node).
        let c2 = connect(&cluster.uri(2)).await?;
        let (ch2, mut live) = open_consumer(&c2, q, 100).await?;
        expect_no_delivery(&mut live, Duration::from_millis(300)).await?;
        net.block(3, 1)?;
        net.block(3, 2)?;

        // The leader sees node 3 down and returns its 10 messages to node 2's consumer.
        let back = consume_n(&mut live, 10, Duration::from_secs(30))
            .await
            .map_err(|e| e.context("messages checked out to the cut-off node's consumer were not redelivered"))?;
        let bodies: BTreeSet<String> = back.iter().map(|d| String::from_utf8_lossy(&d.data).into_owned()).collect();
        let want: BTreeSet<String> = (0..10).map(|i| format!("m{i}")).collect();
        assert_eq!(bodies, want);
        for d in &back {
            assert!(d.redelivered, "a returned message is redelivered");
            assert_eq!(delivery_count(d), Some(1), "one delivery attempt counted");
            ch2.basic_ack(d.delivery_tag, BasicAckOptions::default()).await?;
        }

        // Heal: node 3's consumer (never reconnected) acks what it held
        // (already settled through node 2: ignored) and takes new messages.
        net.heal()?;
        for d in &first {
            d.acker.ack(BasicAckOptions::default()).await?;
        }
        // Publish until node 3's consumer gets one; every message published
        // after the heal must arrive (duplicates counted).
        let mut seen: BTreeSet<String> = BTreeSet::new();
        let mut duplicates = 0;
        let mut on_3 = 0;
        let mut n = 0u32;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let want_more = on_3 == 0;
            if want_more {
                anyhow::ensure!(tokio::time::Instant::now() < deadline, "node 3's consumer received nothing after the heal");
                publish_confirmed(&ch1, "", q, format!("after{n}").as_bytes(), BasicProperties::default()).await?;
                n += 1;
            } else if seen.len() == n as usize {
                break;
            }
            let wait = if want_more { Duration::from_millis(500) } else { Duration::from_secs(10) };
            let (d, from_3) = tokio::select! {
                Some(d) = held.next() => (d?, true),
                Some(d) = live.next() => (d?, false),
                _ = tokio::time::sleep(wait) => {
                    anyhow::ensure!(want_more, "{} of {n} messages published after the heal arrived", seen.len());
                    continue;
                }
            };
            d.acker.ack(BasicAckOptions::default()).await?;
            if from_3 {
                on_3 += 1;
            }
            if !seen.insert(String::from_utf8_lossy(&d.data).into_owned()) {
                duplicates += 1;
            }
        }
        // A leader change after the heal (node 3 saw its leader gone and
        // campaigned) re-sends checked-out deliveries; one whose ack was in
        // flight arrives again (at-least-once).
        eprintln!("after the heal: {n} published, {duplicates} delivered twice");
        let view = retry(Duration::from_secs(10), "queue drained", || async {
            let v = cluster.queue_view(1, q).await?;
            anyhow::ensure!(v.messages_ready == 0 && v.messages_unacknowledged == 0, "{v:?}");
            Ok(v)
        })
        .await?;
        assert_eq!(view.messages_ready + view.messages_unacknowledged, 0);
        for id in cluster.ids() {
            cluster.kill9(id);
        }
        anyhow::Ok(())
    })
    .await
}

/// A consumer's node killed and kept down: its checked-out messages return
/// to a consumer on a live node (before, they waited for that node's
/// restart; after a rolling restart in the fault suite they stayed checked
/// out for good when the restart's own `NodeRestarted` was lost).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_consumers_messages_go_to_live_consumers_while_its_node_stays_down(
) -> anyhow::Result<()> {
    cluster_tests::bounded(Duration::from_secs(180), async {
        let cluster = Cluster::start(3).await?;
        let q = "liveness.killed";
        let (_c1, ch1) = cluster.quorum_queue_led_by(1, q).await?;
        let c3 = connect(&cluster.uri(3)).await?;
        let (_ch3, mut held) = open_consumer(&c3, q, 5).await?;
        for i in 0..5u32 {
            publish_confirmed(
                &ch1,
                "",
                q,
                format!("k{i}").as_bytes(),
                BasicProperties::default(),
            )
            .await?;
        }
        consume_n(&mut held, 5, Duration::from_secs(30)).await?;
        let c2 = connect(&cluster.uri(2)).await?;
        let (_ch2, mut live) = open_consumer(&c2, q, 100).await?;
        cluster.kill9(3);
        let back = consume_n(&mut live, 5, Duration::from_secs(30))
            .await
            .map_err(|e| {
                e.context("messages of the killed node's consumer were not redelivered")
            })?;
        for d in &back {
            assert!(d.redelivered);
            assert_eq!(delivery_count(d), Some(1));
            d.acker.ack(BasicAckOptions::default()).await?;
        }
        let view = retry(Duration::from_secs(10), "queue drained", || async {
            let v = cluster.queue_view(1, q).await?;
            anyhow::ensure!(
                v.messages_ready == 0 && v.messages_unacknowledged == 0,
                "{v:?}"
            );
            Ok(v)
        })
        .await?;
        assert_eq!(view.messages_unacknowledged, 0);
        anyhow::Ok(())
    })
    .await
}
