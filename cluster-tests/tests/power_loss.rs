//! Simulated power loss under a real broker (issue 11 item 4): quorumq runs with its data
//! directory on `powerfs` (`src/bin/powerfs.rs`: a FUSE file system with a volatile write
//! cache — data not `fsync`ed is lost or torn per 512-byte sector at the crash, a file
//! created since its directory's last `fsync` may vanish) while a publisher with confirms, a
//! consumer that acks most messages and rejects every fourth (dead-lettered at-least-once to
//! a second queue of at most 200 messages, so most dead letters wait held in the first) and
//! bodies of 0.25–16 KiB (spilled to body segments past the per-queue memory budget;
//! snapshots every `--snapshot-interval` entries) run. At a random moment
//! the machine "loses power": powerfs drops what was not synced and answers EIO from then
//! on, the broker is killed, the file system remounted and the broker restarted on what
//! the "disk" kept.
//!
//! After each restart: every confirmed message is in its queue or (rejected ones) in the
//! dead-letter queue — except messages whose ack the consumer sent, which may or may not
//! be there (duplicates counted) — and nothing that was never published appears. A
//! restart that refuses must say why (the test fails either way: this model has no media
//! errors, so a refusal would be a torn write mistaken for corruption).
//!
//! `POWER_LOSS_CRASHES` (default 8) crash points, `POWER_LOSS_SEED` (default: time) for the
//! crash moments and powerfs's sector choices. Needs root (FUSE mount), as CI runs.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use cluster_tests::faults::rng::Rng;
use cluster_tests::powerfs::PowerFs;
use cluster_tests::*;
use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, BasicRejectOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::BasicProperties;

/// What one crash cycle's clients saw.
#[derive(Default)]
struct Seen {
    /// Publishes the broker confirmed (basic.ack).
    confirmed: HashSet<u64>,
    /// Every id published (confirmed or not).
    published: HashSet<u64>,
    /// Ids the consumer acked (may or may not survive: the ack needs no confirm).
    acked: HashSet<u64>,
}

fn body(id: u64) -> Vec<u8> {
    let len = 256 + (id.wrapping_mul(0x9e37_79b9) % (16 * 1024 - 256)) as usize;
    let mut b = vec![(id % 251) as u8; len];
    b[..8].copy_from_slice(&id.to_be_bytes());
    b
}

fn id_of(data: &[u8]) -> anyhow::Result<u64> {
    anyhow::ensure!(data.len() >= 8, "short body ({} bytes)", data.len());
    let id = u64::from_be_bytes(data[..8].try_into()?);
    anyhow::ensure!(data == body(id).as_slice(), "body of {id} damaged");
    Ok(id)
}

fn rejected(id: u64) -> bool {
    id.is_multiple_of(4)
}

fn queue_args(dlq: &str) -> FieldTable {
    quorum_args(&[
        ("x-dead-letter-exchange", s("")),
        ("x-dead-letter-routing-key", s(dlq)),
        ("x-dead-letter-strategy", s("at-least-once")),
        ("x-overflow", s("reject-publish")),
    ])
}

/// The dead-letter queue holds at most 200 messages and refuses more (reject-publish): past
/// that, at-least-once dead letters stay held in the source queue until it has room, so
/// crashes hit held dead letters too. The drain after a restart makes room.
fn dlq_args() -> FieldTable {
    quorum_args(&[
        ("x-max-length", AMQPValue::LongInt(200)),
        ("x-overflow", s("reject-publish")),
    ])
}

async fn declare(ch: &lapin::Channel, q: &str, args: FieldTable) -> anyhow::Result<()> {
    ch.queue_declare(q.into(), durable(), args).await?;
    Ok(())
}

/// Publishes ids `base..` with confirms (window 128) until aborted.
async fn publisher(
    uri: String,
    q: String,
    base: u64,
    seen: Arc<Mutex<Seen>>,
) -> anyhow::Result<()> {
    let conn = connect(&uri).await?;
    let ch = confirm_channel(&conn).await?;
    let mut window = std::collections::VecDeque::new();
    for id in base.. {
        seen.lock().unwrap().published.insert(id);
        let pc = ch
            .basic_publish(
                "".into(),
                q.as_str().into(),
                BasicPublishOptions::default(),
                &body(id),
                BasicProperties::default().with_delivery_mode(2),
            )
            .await?;
        window.push_back((id, pc));
        if window.len() >= 128 {
            let Some((id, pc)) = window.pop_front() else {
                continue;
            };
            if pc.await?.is_ack() {
                seen.lock().unwrap().confirmed.insert(id);
            }
        }
    }
    Ok(())
}

/// Consumes `q`, rejecting (dead-lettering) every fourth id and acking the rest.
async fn consumer(uri: String, q: String, seen: Arc<Mutex<Seen>>) -> anyhow::Result<()> {
    let conn = connect(&uri).await?;
    let (_ch, mut c) = open_consumer(&conn, &q, 64).await?;
    while let Some(d) = c.next().await {
        let d = d?;
        let id = id_of(&d.data)?;
        if rejected(id) {
            d.reject(BasicRejectOptions { requeue: false }).await?;
        } else {
            seen.lock().unwrap().acked.insert(id);
            d.ack(BasicAckOptions::default()).await?;
        }
    }
    Ok(())
}

/// Drains `q` and `dlq` after a restart until every id in `must` came back (then 300 ms
/// more for stragglers) or 30 s passed; returns each id's delivery count.
async fn drain(
    uri: &str,
    q: &str,
    dlq: &str,
    must: &HashSet<u64>,
) -> anyhow::Result<HashMap<u64, u32>> {
    let conn = connect(uri).await?;
    let ch = conn.create_channel().await?;
    ch.basic_qos(500, BasicQosOptions::default()).await?;
    declare(&ch, dlq, dlq_args()).await?;
    declare(&ch, q, queue_args(dlq)).await?;
    let mut streams = Vec::new();
    for name in [q, dlq] {
        streams.push(
            ch.basic_consume(
                name.into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?,
        );
    }
    let mut all = futures::stream::select_all(streams);
    let mut counts: HashMap<u64, u32> = HashMap::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let done = must.iter().all(|id| counts.contains_key(id));
        let limit = if done {
            tokio::time::Instant::now() + Duration::from_millis(300)
        } else {
            deadline
        };
        match tokio::time::timeout_at(limit, all.next()).await {
            Err(_) => break,
            Ok(None) => bail!("a drain consumer ended"),
            Ok(Some(d)) => {
                let d = d?;
                *counts.entry(id_of(&d.data)?).or_default() += 1;
                d.ack(BasicAckOptions::default()).await?;
            }
        }
    }
    for name in [q, dlq] {
        ch.queue_delete(name.into(), Default::default()).await?;
    }
    close_connection(&conn).await?;
    Ok(counts)
}

#[derive(Default, Debug)]
struct Totals {
    crashes: u64,
    confirmed: u64,
    lost: u64,
    unexpected: u64,
    duplicates: u64,
    /// Confirmed messages the consumer rejected (dead-lettered) or left in the queue.
    must_survive: u64,
    /// Of those, rejected ones (dead-lettered at-least-once, or still in the queue).
    rejected: u64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirmed_and_dead_lettered_messages_survive_power_loss() -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions.
    anyhow::ensure!(
        unsafe { libc::geteuid() } == 0,
        "this test mounts a FUSE file system and needs root"
    );
    let crashes: u64 = std::env::var("POWER_LOSS_CRASHES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8);
    let seed: u64 = std::env::var("POWER_LOSS_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64 % 1_000_000)
                .unwrap_or(1)
        });
    println!("power loss: {crashes} crash points, POWER_LOSS_SEED={seed}");
    let mut rng = Rng::new(seed);

    let mut broker = Broker::spawn().await?;
    broker.kill9();
    let data = broker.data_dir().context("spawned")?;
    std::fs::remove_dir_all(&data)?;
    std::fs::create_dir_all(&data)?;
    let disk = tempfile::Builder::new().prefix("quorumq-disk-").tempdir()?;
    let fs_log = disk.path().join("powerfs.log");
    let backing = disk.path().join("platters");
    std::fs::create_dir_all(&backing)?;
    // Snapshots and body spills within a cycle's few thousand commands.
    let args = ["--snapshot-interval", "512"];

    let mut totals = Totals::default();
    let mut pending: Option<(String, String, Seen)> = None;
    let started = Instant::now();
    for cycle in 0..=crashes {
        let mut fs = PowerFs::mount(
            env!("CARGO_BIN_EXE_powerfs"),
            &backing,
            &data,
            &["--seed".into(), seed.wrapping_add(cycle).to_string()],
            &fs_log,
        )?;
        if let Err(e) = broker.restart_with(&args).await {
            keep_logs(&broker, &fs_log, seed);
            bail!(
                "restart after crash {cycle} (seed {seed}) failed: {e:#}\n{}",
                broker.log_tail(4000)
            );
        }
        if let Some((q, dlq, seen)) = pending.take() {
            let must: HashSet<u64> = seen
                .confirmed
                .iter()
                .copied()
                .filter(|id| rejected(*id) || !seen.acked.contains(id))
                .collect();
            let counts = drain(broker.uri(), &q, &dlq, &must).await;
            let counts = match counts {
                Ok(c) => c,
                Err(e) => bail!(
                    "drain after crash {cycle}: {e:#}\n{}",
                    broker.log_tail(4000)
                ),
            };
            let lost: Vec<u64> = must
                .iter()
                .copied()
                .filter(|id| !counts.contains_key(id))
                .collect();
            let unexpected: Vec<u64> = counts
                .keys()
                .copied()
                .filter(|id| !seen.published.contains(id))
                .collect();
            totals.confirmed += seen.confirmed.len() as u64;
            totals.must_survive += must.len() as u64;
            totals.rejected += must.iter().filter(|id| rejected(**id)).count() as u64;
            totals.lost += lost.len() as u64;
            totals.unexpected += unexpected.len() as u64;
            totals.duplicates += counts.values().map(|&n| u64::from(n - 1)).sum::<u64>()
                + counts
                    .keys()
                    .filter(|id| !rejected(**id) && seen.acked.contains(id))
                    .count() as u64;
            if !lost.is_empty() || !unexpected.is_empty() {
                let mut lost = lost;
                lost.sort_unstable();
                keep_logs(&broker, &fs_log, seed);
                bail!(
                    "crash {cycle} (seed {seed}): {} confirmed lost (first {:?}), {} unexpected {:?}\n{}",
                    lost.len(),
                    &lost[..lost.len().min(20)],
                    unexpected.len(),
                    &unexpected[..unexpected.len().min(20)],
                    broker.log_tail(4000)
                );
            }
        }
        if cycle == crashes {
            break;
        }

        // A cycle's workload, then the power loss at a random moment.
        let q = unique("pl.q");
        let dlq = format!("{q}.dlq");
        {
            let conn = connect(broker.uri()).await?;
            let ch = conn.create_channel().await?;
            declare(&ch, &dlq, dlq_args()).await?;
            declare(&ch, &q, queue_args(&dlq)).await?;
            close_connection(&conn).await?;
        }
        let seen = Arc::new(Mutex::new(Seen::default()));
        let base = cycle << 32;
        let p = tokio::spawn(publisher(
            broker.uri().to_owned(),
            q.clone(),
            base,
            seen.clone(),
        ));
        let c = tokio::spawn(consumer(broker.uri().to_owned(), q.clone(), seen.clone()));
        let at = Duration::from_millis(rng.range(100, 1599));
        tokio::time::sleep(at).await;
        fs.crash();
        broker.kill9();
        p.abort();
        c.abort();
        let _ = p.await;
        let _ = c.await;
        fs.unmount();
        let seen = std::mem::take(&mut *seen.lock().unwrap());
        let (files, bytes) = disk_usage(&backing);
        println!(
            "crash {cycle} at {at:?}: {} published, {} confirmed, {} acked; disk {files} files, {} KiB",
            seen.published.len(),
            seen.confirmed.len(),
            seen.acked.len(),
            bytes / 1024
        );
        totals.crashes += 1;
        pending = Some((q, dlq, seen));
    }
    broker.kill9();
    println!(
        "power loss: {totals:?} in {:.0?} (seed {seed}); powerfs log {}",
        started.elapsed(),
        fs_log.display()
    );
    anyhow::ensure!(
        totals.confirmed > 0,
        "no publish was confirmed in any cycle"
    );
    Ok(())
}

/// Files under `dir` (recursively) and their total size in bytes.
fn disk_usage(dir: &Path) -> (u64, u64) {
    let mut total = (0, 0);
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let Ok(m) = e.metadata() else { continue };
        if m.is_dir() {
            let (f, b) = disk_usage(&e.path());
            total = (total.0 + f, total.1 + b);
        } else {
            total = (total.0 + 1, total.1 + m.len());
        }
    }
    total
}

/// Copies the broker's and powerfs's logs of a failed run to the temporary directory.
fn keep_logs(broker: &Broker, fs_log: &Path, seed: u64) {
    let dir = std::env::temp_dir();
    if let Some(p) = broker.log_path() {
        let to = dir.join(format!("quorumq-power-loss-{seed}.log"));
        if std::fs::copy(&p, &to).is_ok() {
            eprintln!("broker log kept: {}", to.display());
        }
    }
    let _ = std::fs::copy(
        fs_log,
        dir.join(format!("quorumq-power-loss-{seed}.powerfs.log")),
    );
    if let Some(platters) = fs_log.parent().map(|d| d.join("platters")) {
        let to = dir.join(format!("quorumq-power-loss-{seed}.platters"));
        let _ = Command::new("cp")
            .arg("-a")
            .arg(&platters)
            .arg(&to)
            .status();
        eprintln!("disk image kept: {}", to.display());
    }
}
