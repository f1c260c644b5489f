//! The `--wal-truncate-at` repair for a WAL segment the disk cannot read
//! (issue 32 item 4; `wal_corruption.rs` covers a damaged record). A single
//! node keeps its data on powerfs (`src/bin/powerfs.rs`), with 1 MiB WAL
//! segments, and takes confirmed publishes across several segments. Then the
//! last segment answers `EIO` on every read:
//!
//! 1. the node refuses to start, naming the segment, the offset and the
//!    repair (`--wal-truncate-at SEGMENT:OFFSET`), without a panic;
//! 2. started once with that repair (the segment still unreadable), it cuts
//!    the log there, says so, and serves: the queue holds the messages of the
//!    earlier segments, in order, each once, and nothing published after the
//!    cut;
//! 3. the disk healed, it starts again without the flag and holds the same.
//!
//! Needs root and `/dev/fuse` (it mounts powerfs), as CI has; without them it
//! fails rather than passing having run nothing.

use std::time::Duration;

use anyhow::{ensure, Context};
use cluster_tests::cluster::{distinct_free_ports, Cluster, Placement};
use cluster_tests::powerfs::{PowerFs, PoweredRoot};
use cluster_tests::*;
use lapin::options::{BasicAckOptions, BasicGetOptions};
use lapin::BasicProperties;

/// Messages published before the fault, 16 KiB each: ~5 segments of 1 MiB.
const MESSAGES: u32 = 300;
const BODY: usize = 16 << 10;

fn body(i: u32) -> Vec<u8> {
    let mut b = format!("m{i:05}-").into_bytes();
    b.resize(BODY, b'x');
    b
}

/// Index `i` of a body published by [`body`].
fn index(data: &[u8]) -> anyhow::Result<u32> {
    let text = std::str::from_utf8(&data[1..6]).context("body prefix")?;
    Ok(text.parse()?)
}

/// The indexes of every message in `q`, taken with basic.get (and acked).
async fn drain(uri: &str, q: &str) -> anyhow::Result<Vec<u32>> {
    let conn = connect(uri).await?;
    let ch = conn.create_channel().await?;
    let mut got = Vec::new();
    while let Some(m) = ch.basic_get(q.into(), BasicGetOptions::default()).await? {
        got.push(index(&m.delivery.data)?);
        m.delivery.ack(BasicAckOptions::default()).await?;
    }
    Ok(got)
}

fn log_since(cluster: &Cluster, from: usize) -> String {
    let all = cluster.log_tail(1, u64::MAX);
    all.get(from..).unwrap_or(&all).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_wal_segment_is_cut_at_the_operators_request() -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions.
    ensure!(
        unsafe { libc::geteuid() } == 0,
        "this test mounts powerfs (FUSE) and needs root"
    );
    bounded(Duration::from_secs(240), run()).await
}

async fn run() -> anyhow::Result<()> {
    let PoweredRoot {
        root,
        disk: _disk,
        fs,
    } = PoweredRoot::mount(env!("CARGO_BIN_EXE_powerfs"), "quorumq-walread-", 1)?;
    let mnt = fs.mnt.clone();
    let ports = distinct_free_ports(2)?;
    let cluster = Cluster::start_placed_with_args(
        root,
        vec![Placement::loopback(ports[0], ports[1])],
        &["--wal-segment-bytes", "1048576"],
    )
    .await?;
    let r = steps(&cluster, &fs, &mnt).await;
    let r = cluster.logs_on_error(r, 6_000);
    for id in cluster.ids() {
        cluster.kill9(id);
    }
    drop(fs);
    r
}

async fn steps(cluster: &Cluster, fs: &PowerFs, mnt: &std::path::Path) -> anyhow::Result<()> {
    let uri = cluster.uri(1);
    let conn = cluster.ready_connection(1, "walread.warmup").await?;
    let ch = confirm_channel(&conn).await?;
    ch.queue_declare("walread.q".into(), durable(), quorum_args(&[]))
        .await?;
    for i in 0..MESSAGES {
        publish_confirmed(
            &ch,
            "",
            "walread.q",
            &body(i),
            BasicProperties::default().with_delivery_mode(2),
        )
        .await?;
    }
    // The connection stays open: the node's stop closes it.
    cluster.stop(1).await?;

    let raft = mnt.join("raft").join("wal");
    let mut segments: Vec<String> = std::fs::read_dir(&raft)
        .with_context(|| format!("listing {}", raft.display()))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".wal"))
        .collect();
    segments.sort();
    ensure!(
        segments.len() >= 3,
        "the publishes should span several 1 MiB segments: {segments:?}"
    );
    let last = segments.last().context("no segment")?.clone();

    // 1. The last segment cannot be read: the node refuses to start.
    fs.switch(&format!(".powerfs-eio-read={last}"))?;
    let before = cluster.log_tail(1, u64::MAX).len();
    ensure!(
        cluster.restart(1).await.is_err(),
        "the node started on an unreadable WAL segment"
    );
    let log = log_since(cluster, before);
    assert!(!log.contains("panicked"), "the node panicked:\n{log}");
    let line = log
        .lines()
        .find(|l| l.contains("corrupt at offset") && l.contains("cannot read"))
        .with_context(|| format!("no refusal naming the unreadable segment:\n{log}"))?;
    let repair = line
        .split("--wal-truncate-at ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .with_context(|| format!("the refusal names no repair: {line}"))?
        .trim_end_matches(|c: char| !c.is_ascii_digit())
        .to_string();
    assert!(
        repair.starts_with(&last),
        "the refusal names the unreadable segment {last}: {repair}"
    );

    // 2. Started once with the repair, the segment still unreadable: it cuts there and serves.
    let before = cluster.log_tail(1, u64::MAX).len();
    cluster
        .restart_with(
            1,
            &[
                "--wal-segment-bytes",
                "1048576",
                "--wal-truncate-at",
                &repair,
            ],
        )
        .await?;
    let log = log_since(cluster, before);
    assert!(
        log.contains("cutting the log here at the operator's request"),
        "the node says it cut the log:\n{log}"
    );
    let kept = drain(&uri, "walread.q").await?;
    let prefix: Vec<u32> = (0..kept.len() as u32).collect();
    assert_eq!(
        kept, prefix,
        "the messages kept are the first ones, in order, each once"
    );
    assert!(
        !kept.is_empty() && (kept.len() as u32) < MESSAGES,
        "the cut drops the last segment's messages and keeps the earlier ones: kept {}",
        kept.len()
    );
    println!(
        "cut at {repair}: {} of {MESSAGES} messages kept (the last of {} segments unreadable)",
        kept.len(),
        segments.len()
    );

    // 3. Healed, it starts again without the flag; what was taken stays taken.
    let conn = connect(&uri).await?;
    let ch = confirm_channel(&conn).await?;
    publish_confirmed(
        &ch,
        "",
        "walread.q",
        &body(MESSAGES),
        BasicProperties::default().with_delivery_mode(2),
    )
    .await?;
    // The connection stays open: the node's stop closes it.
    fs.switch(".powerfs-heal")?;
    cluster
        .restart_with(1, &["--wal-segment-bytes", "1048576"])
        .await?;
    let after = drain(&uri, "walread.q").await?;
    assert_eq!(
        after,
        vec![MESSAGES],
        "after the heal only the message published since is there"
    );
    Ok(())
}
