//! Resource alarms (issue 14 item 4), as RabbitMQ's: a publisher is blocked
//! (`connection.blocked`, its socket no longer read) while free disk space is under the
//! limit or memory is over the high watermark; consumers keep draining; when the alarm
//! clears the publisher gets `connection.unblocked` and everything it published is
//! confirmed and delivered. Before, a full disk stopped the node (fail-stop).
//!
//! The disk test mounts a tmpfs as the data directory and needs root (CI runs as root).

use cluster_tests::*;
use futures::StreamExt;
use lapin::{
    options::{BasicAckOptions, BasicPublishOptions},
    BasicProperties, Channel, Connection, PublisherConfirm,
};
use std::{collections::BTreeSet, io::Write, time::Duration};

/// Waits until `conn` was told it is blocked (`true`) or unblocked (`false`).
async fn wait_blocked(conn: &Connection, blocked: bool, limit: Duration) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + limit;
    while conn.status().blocked() != blocked {
        if tokio::time::Instant::now() > deadline {
            anyhow::bail!("connection.blocked = {blocked} not seen within {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

async fn publish(ch: &Channel, q: &str, i: u32, size: usize) -> anyhow::Result<PublisherConfirm> {
    let mut body = i.to_be_bytes().to_vec();
    body.resize(size, 7);
    Ok(ch
        .basic_publish(
            "".into(),
            q.into(),
            BasicPublishOptions::default(),
            &body,
            BasicProperties::default().with_delivery_mode(2),
        )
        .await?)
}

/// Consumes until `ids` distinct messages arrived (acking each); returns them.
async fn drain(conn: &Connection, q: &str, ids: usize) -> anyhow::Result<BTreeSet<u32>> {
    let (_ch, mut consumer) = open_consumer(conn, q, 200).await?;
    let mut seen = BTreeSet::new();
    while seen.len() < ids {
        let d = tokio::time::timeout(Duration::from_secs(30), consumer.next())
            .await
            .map_err(|_| anyhow::anyhow!("drained {} of {ids}", seen.len()))?
            .ok_or_else(|| anyhow::anyhow!("consumer ended"))??;
        seen.insert(u32::from_be_bytes(d.data[..4].try_into()?));
        d.ack(BasicAckOptions::default()).await?;
    }
    Ok(seen)
}

/// The two tests run one after the other: the flood test's memory depends on the CPU it gets
/// (its alarm stayed up after the drain in a full run, with the disk test beside it).
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test]
async fn a_disk_alarm_blocks_publishers_while_consumers_drain_and_nothing_is_lost(
) -> anyhow::Result<()> {
    let _one_at_a_time = ONE_AT_A_TIME.lock().await;
    bounded(Duration::from_secs(180), async {
        let mut broker = Broker::start().await?;
        if broker.is_external() {
            println!(
                "{TEST_URI_ENV} is set; this test mounts quorumq's data directory, returning early"
            );
            return Ok(());
        }
        broker.kill9();
        let data = broker.data_dir().expect("spawned");
        let disk = faults::nemesis::Disk::mount(1, &data, 128 << 20)
            .map_err(|e| e.context("this test mounts a tmpfs and needs root"))?;
        // Alarm under 64 MiB free.
        broker
            .restart_with(&["--disk-free-limit", "67108864"])
            .await?;

        let publisher = connect(broker.uri()).await?;
        let ch = confirm_channel(&publisher).await?;
        let q = unique("alarm.disk");
        ch.queue_declare(q.as_str().into(), durable(), quorum_args(&[]))
            .await?;
        for i in 0..20 {
            assert!(publish(&ch, &q, i, 1024).await?.await?.is_ack());
        }

        // Leave 32 MiB free: the disk alarm rises within a second or two.
        let free = free_bytes(&data)?;
        let filler = data.join("filler");
        let mut f = std::fs::File::create(&filler)?;
        let chunk = vec![0u8; 1 << 20];
        for _ in 0..(free.saturating_sub(32 << 20) >> 20) {
            f.write_all(&chunk)?;
        }
        f.sync_all()?;
        drop(f);

        // The next publish blocks the connection; later ones are not read.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (pch, pq) = (ch.clone(), q.clone());
        let publishing = tokio::spawn(async move {
            let mut pending = Vec::new();
            for i in 20..40 {
                pending.push(publish(&pch, &pq, i, 1024).await?);
            }
            let mut acked = 0;
            for c in pending {
                acked += usize::from(c.await?.is_ack());
            }
            anyhow::Ok(acked)
        });
        wait_blocked(&publisher, true, Duration::from_secs(10)).await?;

        // A consumer on another connection drains what was confirmed.
        let consumer = connect(broker.uri()).await?;
        let first = drain(&consumer, &q, 20).await?;
        assert_eq!(first, (0..20).collect(), "consumers drain under the alarm");
        assert!(
            publisher.status().blocked(),
            "still blocked while the disk is low"
        );
        assert!(!publishing.is_finished(), "publishes held while blocked");

        // Space comes back: unblocked, every publish confirmed and delivered.
        std::fs::remove_file(&filler)?;
        wait_blocked(&publisher, false, Duration::from_secs(10)).await?;
        let acked = tokio::time::timeout(Duration::from_secs(30), publishing).await???;
        assert_eq!(acked, 20, "every publish made under the alarm confirmed");
        let rest = drain(&consumer, &q, 20).await?;
        assert_eq!(rest, (20..40).collect(), "nothing lost");
        drop(disk);
        Ok(())
    })
    .await
}

/// Free bytes on the filesystem of `dir` (statvfs via `df`, to keep the test dependency-free).
fn free_bytes(dir: &std::path::Path) -> anyhow::Result<u64> {
    let out = std::process::Command::new("df")
        .args(["--output=avail", "-B1"])
        .arg(dir)
        .output()?;
    let text = String::from_utf8(out.stdout)?;
    Ok(text
        .lines()
        .nth(1)
        .ok_or_else(|| anyhow::anyhow!("df printed {text}"))?
        .trim()
        .parse()?)
}

/// Resident memory of process `pid`, bytes.
fn rss_of(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .ok_or_else(|| anyhow::anyhow!("no VmRSS"))?
        .parse()?;
    Ok(kib * 1024)
}

#[tokio::test]
async fn a_memory_alarm_blocks_a_flooding_publisher_until_a_consumer_drains() -> anyhow::Result<()>
{
    const N: u32 = 3000;
    const SIZE: usize = 64 << 10;
    let _one_at_a_time = ONE_AT_A_TIME.lock().await;
    bounded(Duration::from_secs(240), async {
        let mut broker = Broker::start().await?;
        if broker.is_external() {
            println!("{TEST_URI_ENV} is set; this test sets quorumq's watermark, returning early");
            return Ok(());
        }
        let q = unique("alarm.memory");
        {
            let conn = connect(broker.uri()).await?;
            let ch = conn.create_channel().await?;
            ch.queue_declare(q.as_str().into(), durable(), quorum_args(&[]))
                .await?;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let idle = rss_of(broker.pid().expect("running"))?;
        // The flood (3,000 × 64 KiB) takes a node from ~50 MB to 120–150 MB, and a drained
        // node does not fall far from there (the alarm must clear after the drain): idle + 80
        // MiB was missed by half the floods (2026-11-27), idle + 56 or less never cleared
        // after some drains. Memory left after a drain is the open problem (README).
        let limit = idle + (72 << 20);
        broker
            .restart_with(&["--vm-memory-high-watermark-bytes", &limit.to_string()])
            .await?;
        let pid = broker.pid().expect("running");

        let publisher = connect(broker.uri()).await?;
        let ch = confirm_channel(&publisher).await?;
        let pq = q.clone();
        let flood = tokio::spawn(async move {
            let mut pending = Vec::new();
            for i in 0..N {
                pending.push(publish(&ch, &pq, i, SIZE).await?);
                if pending.len() >= 64 {
                    for c in pending.drain(..) {
                        anyhow::ensure!(c.await?.is_ack(), "nacked");
                    }
                }
            }
            for c in pending {
                anyhow::ensure!(c.await?.is_ack(), "nacked");
            }
            anyhow::Ok(())
        });
        // No consumer yet: memory grows until the alarm blocks the publisher.
        let mut peak = 0;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while !publisher.status().blocked() {
            anyhow::ensure!(
                !flood.is_finished(),
                "published everything without an alarm (idle {idle}, peak {peak}, limit {limit})"
            );
            anyhow::ensure!(tokio::time::Instant::now() < deadline, "never blocked");
            peak = peak.max(rss_of(pid)?);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for _ in 0..20 {
            peak = peak.max(rss_of(pid)?);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        println!("idle {idle} B, watermark {limit} B, peak while flooding {peak} B");
        // The monitor reacts within 100 ms and a publisher is blocked at its next publish;
        // what it had in flight still lands (measured overshoot 20-45 MB at ~100 MB/s).
        assert!(
            peak < limit + (64 << 20),
            "memory kept growing past the watermark: peak {peak}, limit {limit}"
        );

        // A consumer drains; the publisher is released (as often as needed) and finishes.
        let consumer = connect(broker.uri()).await?;
        let got = drain(&consumer, &q, N as usize).await?;
        assert_eq!(got, (0..N).collect(), "nothing lost");
        tokio::time::timeout(Duration::from_secs(60), flood).await???;
        wait_blocked(&publisher, false, Duration::from_secs(10)).await?;
        Ok(())
    })
    .await
}
