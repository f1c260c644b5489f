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
/// `prefetch` 0: no limit.
async fn drain(
    conn: &Connection,
    q: &str,
    ids: usize,
    prefetch: u16,
) -> anyhow::Result<BTreeSet<u32>> {
    let (_ch, mut consumer) = open_consumer(conn, q, prefetch).await?;
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

/// Publishes messages `0..n` (`size` bytes each, the id in the first 4) round-robin to
/// `queues` on confirm channel `ch`, at most `window` unconfirmed, counting confirms in
/// `confirmed`; fails on a nack.
fn spawn_flood(
    ch: Channel,
    queues: Vec<String>,
    n: u32,
    size: usize,
    window: usize,
    confirmed: std::sync::Arc<std::sync::atomic::AtomicU32>,
) -> tokio::task::JoinHandle<anyhow::Result<()>> {
    tokio::spawn(async move {
        let mut pending = std::collections::VecDeque::new();
        for i in 0..n {
            let q = &queues[i as usize % queues.len()];
            pending.push_back(publish(&ch, q, i, size).await?);
            while pending.len() >= window || (i + 1 == n && !pending.is_empty()) {
                let c = pending.pop_front().expect("not empty");
                anyhow::ensure!(c.await?.is_ack(), "nacked");
                confirmed.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        }
        Ok(())
    })
}

/// Waits until the count of confirms `confirmed` holds still for a second (a blocked
/// publisher's in-flight publishes have landed); returns it.
async fn settled(confirmed: &std::sync::atomic::AtomicU32) -> u32 {
    let now = || confirmed.load(std::sync::atomic::Ordering::SeqCst);
    let mut last = now();
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if now() == last {
            return last;
        }
        last = now();
    }
}

/// quorumqctl / rabbitmqctl calls' time limit.
const CTL: Duration = Duration::from_secs(30);

/// The two tests run one after the other: the memory test measures the node's memory, and
/// an alarm of either would block the other's publisher.
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
        let first = drain(&consumer, &q, 20, 200).await?;
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
        let rest = drain(&consumer, &q, 20, 200).await?;
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

#[tokio::test]
async fn a_memory_alarm_blocks_a_flooding_publisher_until_a_consumer_drains() -> anyhow::Result<()>
{
    const N: u32 = 3000;
    const SIZE: usize = 64 << 10;
    // The alarm is raised once this many are confirmed.
    const BEFORE_ALARM: u32 = 1500;
    let _one_at_a_time = ONE_AT_A_TIME.lock().await;
    bounded(Duration::from_secs(240), async {
        let broker = Broker::start().await?;
        let q = unique("alarm.memory");
        {
            let conn = connect(broker.uri()).await?;
            let ch = conn.create_channel().await?;
            ch.queue_declare(q.as_str().into(), durable(), quorum_args(&[]))
                .await?;
        }
        let publisher = connect(broker.uri()).await?;
        let ch = confirm_channel(&publisher).await?;
        let confirmed = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
        let flood = spawn_flood(ch, vec![q.clone()], N, SIZE, 64, confirmed.clone());
        let confirmed_now = || confirmed.load(std::sync::atomic::Ordering::SeqCst);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while confirmed_now() < BEFORE_ALARM {
            anyhow::ensure!(tokio::time::Instant::now() < deadline, "the flood is stuck");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // RabbitMQ's way to raise the memory alarm at once (rabbitmq.com/docs/memory: "a
        // value of 0 makes the memory alarm go off immediately").
        dlx::run(
            dlx::ctl(&broker, &["set_vm_memory_high_watermark", "0"])?,
            CTL,
        )
        .await?;
        wait_blocked(&publisher, true, Duration::from_secs(10)).await?;
        // What was in flight lands; then nothing more is taken from the publisher.
        let settled = settled(&confirmed).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(
            confirmed_now(),
            settled,
            "a blocked publisher's messages were confirmed"
        );
        assert!(settled < N, "the whole flood was taken under the alarm");

        // Consumers keep going under the alarm: one without a prefetch limit gets everything
        // confirmed (a burst of ~100 MB of deliveries).
        let consumer = connect(broker.uri()).await?;
        let got = drain(&consumer, &q, settled as usize, 0).await?;
        assert_eq!(
            got,
            (0..settled).collect(),
            "the confirmed messages, each once"
        );
        // The alarm clears: the publisher is released and finishes; nothing is lost.
        dlx::run(
            dlx::ctl(&broker, &["set_vm_memory_high_watermark", "0.4"])?,
            CTL,
        )
        .await?;
        wait_blocked(&publisher, false, Duration::from_secs(10)).await?;
        tokio::time::timeout(Duration::from_secs(60), flood).await???;
        let rest = drain(&consumer, &q, (N - settled) as usize, 200).await?;
        assert_eq!(rest, (settled..N).collect(), "nothing lost");
        Ok(())
    })
    .await
}

/// Issue 14's must-show as written: a publisher floods queues with no consumer past an
/// absolute memory watermark. It gets `connection.blocked`, the broker's peak RSS (`VmHWM`,
/// reset when the watermark is set) stays under the limit, and once a consumer drains the
/// queues the alarm clears by itself: the publisher is unblocked and nothing is lost.
///
/// The flood goes to [`QUEUES`] queues so that it is sure to reach the watermark: each
/// quorum queue keeps up to 16 MiB of bodies in memory before it spills them
/// (`queue/bodies.rs`), so the flood can grow memory by far more than the headroom given.
#[tokio::test]
async fn a_memory_flood_is_blocked_before_rss_reaches_the_watermark() -> anyhow::Result<()> {
    const QUEUES: u32 = 8;
    const SIZE: usize = 64 << 10;
    // 400 MiB offered: several times the headroom and the queues' in-memory budgets.
    const N: u32 = 6400;
    const HEADROOM: u64 = 64 << 20;
    let _one_at_a_time = ONE_AT_A_TIME.lock().await;
    bounded(Duration::from_secs(300), async {
        let broker = Broker::start().await?;
        let Some(pid) = broker.pid() else {
            println!(
                "{TEST_URI_ENV} is set; this test reads quorumq's /proc entries, returning early"
            );
            return Ok(());
        };
        let names: Vec<String> = (0..QUEUES)
            .map(|k| unique(&format!("alarm.flood{k}")))
            .collect();
        {
            let conn = connect(broker.uri()).await?;
            let ch = conn.create_channel().await?;
            for q in &names {
                ch.queue_declare(q.as_str().into(), durable(), quorum_args(&[]))
                    .await?;
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let idle = proc_status_bytes(pid, "VmRSS:").ok_or_else(|| anyhow::anyhow!("no VmRSS"))?;
        let limit = idle + HEADROOM;
        dlx::run(
            dlx::ctl(
                &broker,
                &[
                    "set_vm_memory_high_watermark",
                    "absolute",
                    &limit.to_string(),
                ],
            )?,
            CTL,
        )
        .await?;
        // Peak RSS from now on (proc(5): writing 5 to clear_refs resets VmHWM).
        std::fs::write(format!("/proc/{pid}/clear_refs"), "5")?;

        let publisher = connect(broker.uri()).await?;
        let ch = confirm_channel(&publisher).await?;
        let confirmed = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
        let flood = spawn_flood(ch, names.clone(), N, SIZE, 256, confirmed.clone());
        wait_blocked(&publisher, true, Duration::from_secs(120)).await?;
        // What was in flight lands; nothing more is taken.
        let settled = settled(&confirmed).await;
        let peak = proc_status_bytes(pid, "VmHWM:").ok_or_else(|| anyhow::anyhow!("no VmHWM"))?;
        println!(
            "idle {} MiB, limit {} MiB, peak {} MiB, {settled} of {N} confirmed when blocked",
            idle >> 20,
            limit >> 20,
            peak >> 20
        );
        assert!(settled < N, "the whole flood was taken: no alarm");
        let alarm_lines: Vec<String> = broker
            .log_tail(1 << 20)
            .lines()
            .filter(|l| l.contains("memory resource limit alarm"))
            .map(str::to_owned)
            .collect();
        // Issue 14's "broker RSS stays under the limit". Before the 10 ms checks near the
        // watermark, the growth lookahead and the held alarm (`alarms::memory_alarm`) the peak
        // was 27 MiB over it: what the publisher had in flight landed after the alarm.
        assert!(
            peak < limit,
            "peak RSS {peak} B reached the watermark {limit} B (idle {idle} B); {alarm_lines:#?}"
        );

        // A consumer drains everything confirmed; memory falls, the alarm clears by itself.
        let consumer = std::sync::Arc::new(connect(broker.uri()).await?);
        // Message i went to queue i % QUEUES.
        let per_queue = |ids: std::ops::Range<u32>, k: usize| {
            ids.filter(|i| *i as usize % names.len() == k).count()
        };
        let mut got = BTreeSet::new();
        for (k, q) in names.iter().enumerate() {
            got.extend(drain(&consumer, q, per_queue(0..settled, k), 200).await?);
        }
        assert_eq!(
            got,
            (0..settled).collect(),
            "the confirmed messages, each once"
        );
        // The rest is consumed as it comes: the publisher, once unblocked, finishes.
        let mut rest = Vec::new();
        for (k, q) in names.iter().enumerate() {
            let (c, q, count) = (consumer.clone(), q.clone(), per_queue(settled..N, k));
            rest.push(tokio::spawn(async move { drain(&c, &q, count, 200).await }));
        }
        wait_blocked(&publisher, false, Duration::from_secs(30)).await?;
        tokio::time::timeout(Duration::from_secs(120), flood).await???;
        let mut got = BTreeSet::new();
        for r in rest {
            got.extend(r.await??);
        }
        assert_eq!(got, (settled..N).collect(), "nothing lost");
        Ok(())
    })
    .await
}
