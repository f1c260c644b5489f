//! Six bodies of 1–100 MiB (150 MiB) through a 3-node cluster while the
//! queue's leader node is `kill -9`ed (issue 32 item 3): every confirmed body
//! comes back intact, and each node's peak RSS (VmHWM) is printed against the
//! bytes in flight, the figure item 3 bounds (≤ 3×). The bound itself is a
//! benchmark figure (README), not asserted here; run it with a release
//! binary for the README's figures: `QUORUMQ_BIN=target/release/quorumq
//! cargo test -p cluster-tests --test big_bodies -- --nocapture`.

use std::time::Duration;

use cluster_tests::cluster::Cluster;
use cluster_tests::*;
use futures::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::BasicProperties;

/// Body sizes (MiB): 150 MiB in all.
const SIZES_MIB: [usize; 6] = [1, 4, 10, 15, 20, 100];

/// A body of `mib` MiB whose bytes depend on `seed` and position.
fn body(seed: u8, mib: usize) -> Vec<u8> {
    (0..mib << 20)
        .map(|i| ((i as u32).wrapping_mul(2_654_435_761) >> 24) as u8 ^ seed)
        .collect()
}

/// Peak resident set (VmHWM) of process `pid`, in bytes.
fn peak_rss(pid: u32) -> Option<u64> {
    proc_status_bytes(pid, "VmHWM:")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn big_bodies_survive_a_leader_kill_and_peak_memory_is_reported() -> anyhow::Result<()> {
    bounded(Duration::from_secs(600), async {
        let c = Cluster::start(3).await?;
        let q = unique("big.q");
        let (_c1, _ch1) = c.quorum_queue_led_by(1, &q).await?;
        // Publish through node 2 (a follower), so that the leader's kill does
        // not take the client's connection with it.
        let conn = connect(&c.uri(2)).await?;
        let ch = confirm_channel(&conn).await?;
        let total: usize = SIZES_MIB.iter().sum::<usize>() << 20;
        let mut peaks = [0u64; 3];
        let mut note_peaks = |c: &Cluster| {
            for id in 1..=3u64 {
                if let Some(p) = c.pid(id).and_then(peak_rss) {
                    peaks[id as usize - 1] = peaks[id as usize - 1].max(p);
                }
            }
        };
        for (i, mib) in SIZES_MIB.iter().enumerate() {
            if i == 3 {
                note_peaks(&c);
                let leader = c.wait_queue_leader(2, &q, Duration::from_secs(30)).await?;
                c.kill9(leader);
                eprintln!("kill -9 node {leader} (the leader) after 3 bodies");
            }
            let data = body(i as u8, *mib);
            // Retried across the leader change: a publish not confirmed is sent again.
            let mut tries = 0;
            loop {
                tries += 1;
                let confirm = ch
                    .basic_publish(
                        "".into(),
                        q.as_str().into(),
                        BasicPublishOptions::default(),
                        &data,
                        BasicProperties::default()
                            .with_delivery_mode(2)
                            .with_message_id(format!("{i}").into()),
                    )
                    .await?;
                match tokio::time::timeout(Duration::from_secs(120), confirm).await {
                    Ok(Ok(c)) if c.is_ack() => break,
                    other => {
                        anyhow::ensure!(tries < 5, "body {i} ({mib} MiB) not confirmed: {other:?}");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            }
            note_peaks(&c);
            eprintln!("body {i}: {mib} MiB confirmed");
        }
        let mut restarted = Vec::new();
        for id in 1..=3u64 {
            if !c.is_running(id) {
                c.restart(id).await?;
                restarted.push(id);
            }
        }

        // Every body back, intact (a retried publish may be there twice).
        let cch = conn.create_channel().await?;
        cch.basic_qos(1, BasicQosOptions::default()).await?;
        let mut consumer = cch
            .basic_consume(
                q.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        let mut seen = [false; SIZES_MIB.len()];
        while seen.iter().any(|s| !s) {
            let d = tokio::time::timeout(Duration::from_secs(120), consumer.next())
                .await?
                .ok_or_else(|| anyhow::anyhow!("consumer ended"))??;
            let i: usize = d
                .properties
                .message_id()
                .as_ref()
                .and_then(|m| m.as_str().parse().ok())
                .ok_or_else(|| anyhow::anyhow!("a body without its message id"))?;
            anyhow::ensure!(i < SIZES_MIB.len(), "unknown body {i}");
            anyhow::ensure!(
                d.data == body(i as u8, SIZES_MIB[i]),
                "body {i} ({} MiB) differs",
                SIZES_MIB[i]
            );
            seen[i] = true;
            d.ack(BasicAckOptions::default()).await?;
            note_peaks(&c);
        }
        let mib = |b: u64| b as f64 / f64::from(1 << 20);
        eprintln!(
            "bytes in flight {:.0} MiB; peak RSS per node (MiB): {:.0} / {:.0} / {:.0} \
             (× bytes in flight: {:.1} / {:.1} / {:.1}); restarted {restarted:?} (its peak is its \
             larger life's)",
            mib(total as u64),
            mib(peaks[0]),
            mib(peaks[1]),
            mib(peaks[2]),
            peaks[0] as f64 / total as f64,
            peaks[1] as f64 / total as f64,
            peaks[2] as f64 / total as f64,
        );
        assert!(peaks.iter().all(|p| *p > 0), "peak RSS read for every node");
        Ok(())
    })
    .await
}
