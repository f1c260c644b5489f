//! A queue leader cut off by a real partition (network namespaces, iptables)
//! while writes it proposed are in flight, behind which the majority writes
//! past a snapshot: on heal the old leader installs the snapshot. openraft
//! 0.9 never answered the writes that snapshot replaced, and the node's
//! proposer waited for them for good: no confirm, settle or consumer change
//! through that node again (found by the fault suite; 20 messages stayed
//! unacknowledged). Needs root, as the fault suite does; CI runs as root.

use cluster_tests::{
    cluster::retry, confirm_channel, connect, faults::net::Net, publish_confirmed,
};
use lapin::{options::BasicPublishOptions, BasicProperties};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_leader_answers_its_writes_after_a_snapshot_install() -> anyhow::Result<()> {
    cluster_tests::bounded(Duration::from_secs(300), async {
        let (net, cluster) = Net::start_cluster(3, "quorumq-partition-").await?;
        let q = "part.q";
        let (_c1, ch1) = cluster.quorum_queue_led_by(1, q).await?;

        // Writes in flight on node 1 when it is cut off.
        let mut pending = Vec::new();
        for i in 0..50u32 {
            let body = format!("cut-{i}");
            pending.push(
                ch1.basic_publish(
                    "".into(),
                    q.into(),
                    BasicPublishOptions::default(),
                    body.as_bytes(),
                    BasicProperties::default(),
                )
                .await?,
            );
        }
        net.block(1, 2)?;
        net.block(1, 3)?;
        // The majority elects a leader and writes past a snapshot (every 4,096 entries).
        let c2 = connect(&cluster.uri(2)).await?;
        let ch2 = confirm_channel(&c2).await?;
        for i in 0..5000u32 {
            let body = format!("maj-{i}");
            retry(Duration::from_secs(30), "publish through node 2", || {
                publish_confirmed(&ch2, "", q, body.as_bytes(), BasicProperties::default())
            })
            .await?;
        }
        net.heal()?;

        // Node 1 answers its cut-off writes (confirmed or not) and takes new ones.
        for p in pending {
            tokio::time::timeout(Duration::from_secs(60), p)
                .await
                .map_err(|_| anyhow::anyhow!("a write in flight on node 1 was never answered"))??;
        }
        tokio::time::timeout(
            Duration::from_secs(60),
            publish_confirmed(&ch1, "", q, b"after", BasicProperties::default()),
        )
        .await
        .map_err(|_| anyhow::anyhow!("node 1 takes no new write after the heal"))??;
        for id in cluster.ids() {
            cluster.kill9(id);
        }
        anyhow::Ok(())
    })
    .await
}
