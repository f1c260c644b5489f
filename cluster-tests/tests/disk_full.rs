//! A node whose disk fills up stops (fail-stop) instead of staying up with
//! dead Raft groups. Found by the fault suite's `disk-full` nemesis: the node
//! kept serving AMQP after its WAL sync failed with ENOSPC, its meta group
//! was dead, so it confirmed publishes to queues declared since as
//! unroutable — confirmed and lost. Needs root (it mounts a tmpfs as node 3's
//! data directory), as the fault suite does; CI runs as root.

use cluster_tests::{
    cluster::{distinct_free_ports, retry, wait_for, Cluster, Placement},
    confirm_channel, connect, consume_n, durable,
    faults::nemesis::Disk,
    open_consumer, publish_confirmed, quorum_args,
};
use lapin::{options::BasicAckOptions, BasicProperties};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_disk_fills_stops_and_loses_no_confirmed_message() -> anyhow::Result<()> {
    cluster_tests::bounded(Duration::from_secs(240), async {
        let root = tempfile::Builder::new()
            .prefix("quorumq-diskfull-")
            .tempdir()?;
        let disk = Disk::mount(3, &root.path().join("data").join("node-3"), 64 << 20)
            .map_err(|e| e.context("this test mounts a tmpfs and needs root"))?;
        let places = distinct_free_ports(6)?
            .chunks(2)
            .map(|p| Placement::loopback(p[0], p[1]))
            .collect();
        let cluster = Cluster::start_placed(root, places).await?;

        let c1 = connect(&cluster.uri(1)).await?;
        let ch1 = confirm_channel(&c1).await?;
        retry(Duration::from_secs(30), "declare q1", || async {
            ch1.queue_declare("disk.q1".into(), durable(), quorum_args(&[]))
                .await?;
            anyhow::Ok(())
        })
        .await?;
        cluster
            .wait_queue_leader(1, "disk.q1", Duration::from_secs(30))
            .await?;

        // Fill node 3's disk and publish through node 3 until it stops. 32 KiB bodies: the
        // WAL writes into the zeros it preallocated (up to 8 MiB) before it needs new space.
        let written = disk.fill();
        assert!(written > 0, "the filler wrote nothing");
        let mut confirmed = Vec::new();
        if let Ok(c3) = connect(&cluster.uri(3)).await {
            if let Ok(ch3) = confirm_channel(&c3).await {
                for i in 0..1000u32 {
                    let body = format!("full-{i}-{}", "x".repeat(32 << 10));
                    let sent = tokio::time::timeout(
                        Duration::from_secs(5),
                        publish_confirmed(
                            &ch3,
                            "",
                            "disk.q1",
                            body.as_bytes(),
                            BasicProperties::default().with_delivery_mode(2),
                        ),
                    )
                    .await;
                    match sent {
                        Ok(Ok(())) => confirmed.push(body),
                        _ => break,
                    }
                }
            }
        }
        wait_for(
            Duration::from_secs(30),
            "node 3 to stop on its full disk",
            || async { cluster.pid(3).is_none() },
        )
        .await?;

        // Free the disk, bring node 3 back; a queue declared after the failure must take
        // publishes through node 3 for real.
        disk.clear();
        cluster.restart(3).await?;
        retry(Duration::from_secs(30), "declare q2", || async {
            ch1.queue_declare("disk.q2".into(), durable(), quorum_args(&[]))
                .await?;
            anyhow::Ok(())
        })
        .await?;
        let uri3 = cluster.uri(3);
        let c3 = retry(Duration::from_secs(30), "connect to node 3", || {
            connect(&uri3)
        })
        .await?;
        let ch3 = confirm_channel(&c3).await?;
        let mut after = Vec::new();
        for i in 0..50u32 {
            let body = format!("after-{i}");
            retry(Duration::from_secs(30), "publish through node 3", || {
                publish_confirmed(
                    &ch3,
                    "",
                    "disk.q2",
                    body.as_bytes(),
                    BasicProperties::default().with_delivery_mode(2),
                )
            })
            .await?;
            after.push(body);
        }

        for (q, want) in [("disk.q1", &confirmed), ("disk.q2", &after)] {
            let (_ch, mut consumer) = open_consumer(&c1, q, 1000).await?;
            let got = consume_n(&mut consumer, want.len(), Duration::from_secs(60)).await?;
            let mut bodies = Vec::new();
            for d in &got {
                bodies.push(String::from_utf8_lossy(&d.data).into_owned());
                d.ack(BasicAckOptions::default()).await?;
            }
            bodies.sort();
            let mut want = want.clone();
            want.sort();
            assert_eq!(bodies, want, "every message confirmed on {q} is delivered");
        }
        for id in cluster.ids() {
            cluster.kill9(id);
        }
        drop(disk);
        anyhow::Ok(())
    })
    .await
}
