//! Disk errors (issue 32 item 4): a node whose disk starts answering `EIO` stops (fail-stop)
//! without acknowledging anything it did not persist; the other nodes carry on and lose no
//! confirmed message; a WAL segment the disk cannot read at restart is reported like
//! corruption; once the disk is healed the node rejoins and catches up.
//!
//! Node 3 of a 3-node cluster keeps its data directory on `powerfs` (`src/bin/powerfs.rs`, a
//! FUSE layer whose media errors are switched at run time; the other nodes use the plain
//! disk). Confirmed publishers run on queues led by each node, one of them through node 3
//! itself. Then:
//!
//! 1. every `fsync` on node 3's disk fails with `EIO` (writes still land in the cache, whose
//!    dirty pages powerfs then drops, as Linux does after a failed writeback): node 3 exits
//!    within [`EXIT_BOUND`] with status 70 and a log line naming the file and the error; the
//!    leadership of its queue moves; confirms resume on every queue within
//!    [`RESUME_BOUND`]; every confirmed message is consumed from the survivors (lost 0,
//!    duplicates 0);
//! 2. the fsync fault is healed and reads of WAL segments fail instead: node 3 refuses to
//!    start, naming the segment and offset and the `--wal-truncate-at` repair as for a
//!    damaged record (`wal_corruption.rs`), without a panic;
//!    Before that, still failing its fsyncs, node 3 refuses to start naming the file;
//! 3. the disk is healed: node 3 starts and rejoins;
//! 4. writes of node 3's `snapshots/` fail: node 3 stops at its next snapshot (status 70,
//!    naming the file); healed, it rejoins; with node 1 then killed, nodes 2 and 3 (a
//!    majority only with node 3) deliver every message confirmed after its restarts;
//! 5. reads of node 3's WAL fail while it runs: a queue it leads took 10 MiB while node 1
//!    was down, so node 1's return makes it read entries the WAL no longer caches; it stops
//!    (status 70, naming the segment), and healed, every message of that queue is there.
//!
//! Needs root and `/dev/fuse` (it mounts powerfs), as CI has; without them it fails rather
//! than passing having run nothing.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use cluster_tests::cluster::{distinct_free_ports, wait_for, Cluster, Placement};
use cluster_tests::powerfs::PoweredRoot;
use cluster_tests::*;
use lapin::options::{BasicAckOptions, BasicPublishOptions};
use lapin::BasicProperties;

/// Bound on node 3's exit after its fsyncs start failing under load.
const EXIT_BOUND: Duration = Duration::from_secs(15);
/// Bound on the first confirms of every surviving publisher after node 3's exit.
const RESUME_BOUND: Duration = Duration::from_secs(20);
/// Confirms each surviving publisher must get after node 3's exit ("confirms resume").
const RESUMED: usize = 20;

/// What one publisher saw: ids confirmed (basic.ack) and when.
#[derive(Default)]
struct Confirms {
    ids: BTreeSet<u64>,
    at: Vec<Instant>,
}

impl Confirms {
    fn since(&self, t: Instant) -> usize {
        self.at.iter().filter(|&&a| a > t).count()
    }
}

fn body(id: u64) -> Vec<u8> {
    let mut b = vec![(id % 251) as u8; 256];
    b[..8].copy_from_slice(&id.to_be_bytes());
    b
}

fn id_of(data: &[u8]) -> anyhow::Result<u64> {
    ensure!(data.len() >= 8, "short body ({} bytes)", data.len());
    let id = u64::from_be_bytes(data[..8].try_into()?);
    ensure!(data == body(id).as_slice(), "body of {id} damaged");
    Ok(id)
}

/// Publishes ids `base..` to `q` through `uri` with confirms (up to 32 in flight) until
/// `stop`; reconnects after an error unless `once` (a client of the failing node, which
/// stops at its first error). Nacked publishes are not confirmed.
async fn publisher(
    uri: String,
    q: String,
    base: u64,
    once: bool,
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Confirms>>,
) {
    let mut next = base;
    while !stop.load(Ordering::Relaxed) {
        let run = async {
            let conn = connect(&uri).await?;
            let ch = confirm_channel(&conn).await?;
            let mut window = VecDeque::new();
            while !stop.load(Ordering::Relaxed) {
                let id = next;
                next += 1;
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
                while window.len() >= 32 || (stop.load(Ordering::Relaxed) && !window.is_empty()) {
                    let Some((id, pc)) = window.pop_front() else {
                        break;
                    };
                    let confirm = tokio::time::timeout(Duration::from_secs(30), pc)
                        .await
                        .context("no confirm within 30 s")??;
                    if confirm.is_ack() {
                        let mut s = seen.lock().unwrap();
                        s.ids.insert(id);
                        s.at.push(Instant::now());
                    }
                }
            }
            let _ = conn.close(200, "done".into()).await;
            anyhow::Ok(())
        };
        if let Err(e) = run.await {
            if once {
                println!("publisher to {q} via {uri}: {e:#}");
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// Consumes `q` through `uri` (acking) until every id in `must` arrived, then 500 ms more;
/// returns each id's delivery count. Errors: a connection error, or 60 s passed.
async fn drain(uri: &str, q: &str, must: &BTreeSet<u64>) -> anyhow::Result<BTreeMap<u64, u32>> {
    let conn = connect(uri).await?;
    let (_ch, mut consumer) = open_consumer(&conn, q, 500).await?;
    let mut counts: BTreeMap<u64, u32> = BTreeMap::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let done = must.iter().all(|id| counts.contains_key(id));
        let limit = if done {
            tokio::time::Instant::now() + Duration::from_millis(500)
        } else {
            deadline
        };
        match tokio::time::timeout_at(limit, futures::StreamExt::next(&mut consumer)).await {
            Err(_) => break,
            Ok(None) => bail!("the consumer of {q} ended"),
            Ok(Some(d)) => {
                let d = d?;
                *counts.entry(id_of(&d.data)?).or_default() += 1;
                d.ack(BasicAckOptions::default()).await?;
            }
        }
    }
    let _ = conn.close(200, "done".into()).await;
    Ok(counts)
}

/// Drains `q` through node `via` and checks every confirmed id came back, once unless it
/// was published more than once (`republished`), and nothing never published did
/// (`published`); returns the number delivered.
async fn check_queue(
    cluster: &Cluster,
    via: u64,
    q: &str,
    confirmed: &BTreeSet<u64>,
    republished: &BTreeSet<u64>,
    published: &dyn Fn(u64) -> bool,
) -> anyhow::Result<usize> {
    let counts = drain(&cluster.uri(via), q, confirmed).await?;
    let lost: Vec<u64> = confirmed
        .iter()
        .copied()
        .filter(|id| !counts.contains_key(id))
        .collect();
    let dups: Vec<u64> = counts
        .iter()
        .filter(|(id, &n)| n > 1 && !republished.contains(id))
        .map(|(&id, _)| id)
        .collect();
    let unexpected: Vec<u64> = counts
        .keys()
        .copied()
        .filter(|&id| !published(id))
        .collect();
    println!(
        "{q}: {} confirmed, {} delivered, lost {}, duplicates {}, unexpected {}",
        confirmed.len(),
        counts.len(),
        lost.len(),
        dups.len(),
        unexpected.len()
    );
    assert_none(&format!("confirmed messages of {q} lost"), &lost);
    assert_none(&format!("messages of {q} delivered twice"), &dups);
    assert_none(&format!("messages of {q} never published"), &unexpected);
    Ok(counts.len())
}

/// The part of node `id`'s log written since it held `from` bytes.
fn log_since(cluster: &Cluster, id: u64, from: usize) -> String {
    let all = cluster.log_tail(id, u64::MAX);
    all.get(from..).unwrap_or(&all).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_disk_fails_stops_and_the_others_lose_nothing() -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions.
    ensure!(
        unsafe { libc::geteuid() } == 0,
        "this test mounts a FUSE file system (powerfs) and needs root"
    );
    ensure!(
        Path::new("/dev/fuse").exists(),
        "this test mounts a FUSE file system (powerfs) and needs /dev/fuse"
    );
    bounded(Duration::from_secs(240), run()).await
}

async fn run() -> anyhow::Result<()> {
    let started = Instant::now();
    let PoweredRoot {
        root,
        disk: _disk,
        fs,
    } = PoweredRoot::mount(env!("CARGO_BIN_EXE_powerfs"), "quorumq-diskerr-", 3)?;
    let places = distinct_free_ports(6)?
        .chunks(2)
        .map(|p| Placement::loopback(p[0], p[1]))
        .collect();
    let cluster = Arc::new(Cluster::start_placed(root, places).await?);
    // Dropped before the cluster: the mount goes before its directory is removed.
    let mut fs = fs;

    // One queue led by each node.
    let qs: Vec<String> = (1..=3).map(|n| unique(&format!("diskerr.q{n}"))).collect();
    let mut conns = Vec::new();
    for (n, q) in (1..=3u64).zip(&qs) {
        conns.push(cluster.quorum_queue_led_by(n, q).await?);
    }
    drop(conns);
    let q3 = qs[2].clone();

    // Confirmed load: q1 through node 1, q2 through node 2, q3 (led by node 3) through
    // node 1 and through node 3 itself. Ids: publisher number << 32 | sequence.
    let stop = Arc::new(AtomicBool::new(false));
    let plan: [(u64, usize, bool); 4] = [(1, 0, false), (2, 1, false), (1, 2, false), (3, 2, true)];
    let mut seen = Vec::new();
    let mut tasks = Vec::new();
    for (p, &(via, qi, once)) in plan.iter().enumerate() {
        let s = Arc::new(Mutex::new(Confirms::default()));
        seen.push(s.clone());
        tasks.push(tokio::spawn(publisher(
            cluster.uri(via),
            qs[qi].clone(),
            (p as u64 + 1) << 32,
            once,
            stop.clone(),
            s,
        )));
    }
    wait_for(
        Duration::from_secs(30),
        "confirms from every publisher",
        || async { seen.iter().all(|s| s.lock().unwrap().ids.len() >= 100) },
    )
    .await?;

    // 1. Every fsync on node 3's disk fails from now on.
    let log3_before = cluster.log_tail(3, u64::MAX).len();
    let injected = Instant::now();
    fs.switch(".powerfs-eio-fsync")?;
    wait_for(EXIT_BOUND, "node 3 to stop on its failing disk", || async {
        cluster.pid(3).is_none()
    })
    .await?;
    let exited = Instant::now();
    let status = cluster.exit_status(3);
    println!(
        "node 3 exited {:.0?} after the fsync fault: {status:?}",
        exited - injected
    );
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(70),
        "fail-stop exit status"
    );
    let log3 = log_since(&cluster, 3, log3_before);
    let fatal = log3
        .lines()
        .find(|l| l.contains("stopping the process (fail-stop"))
        .with_context(|| format!("no fail-stop line in node 3's log:\n{log3}"))?;
    println!("node 3: {fatal}");
    assert!(
        fatal.contains("os error 5") && fatal.contains("/node-3/"),
        "the fail-stop line names the file and the error: {fatal}"
    );
    assert!(!log3.contains("panicked"), "node 3 panicked:\n{log3}");

    // Its queue's leadership moves, and confirms resume on every queue.
    let leader = cluster
        .wait_queue_leader(1, &q3, Duration::from_secs(30))
        .await?;
    assert_ne!(leader, 3);
    wait_for(
        RESUME_BOUND,
        "confirms to resume on every queue",
        || async {
            seen[..3]
                .iter()
                .all(|s| s.lock().unwrap().since(exited) >= RESUMED)
        },
    )
    .await?;
    let resumed = Instant::now();
    println!(
        "{q3} led by node {leader}; confirms resumed on every queue within {:.0?} of the exit",
        resumed - exited
    );
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await?;
    }
    let confirmed: Vec<BTreeSet<u64>> =
        seen.iter().map(|s| s.lock().unwrap().ids.clone()).collect();
    let by_node3 = confirmed[3].len();
    ensure!(
        by_node3 > 0,
        "node 3 confirmed nothing before its disk failed"
    );
    // Every confirmed message, node 3's confirms included, from the survivors.
    let published_by = |p: &[usize]| {
        let tops: Vec<(u64, u64)> = p
            .iter()
            .map(|&i| {
                let base = (i as u64 + 1) << 32;
                (base, base + (1 << 32))
            })
            .collect();
        move |id: u64| tops.iter().any(|&(lo, hi)| lo <= id && id < hi)
    };
    let mut delivered = 0;
    for (qi, pubs) in [(0usize, vec![0usize]), (1, vec![1]), (2, vec![2, 3])] {
        let want: BTreeSet<u64> = pubs
            .iter()
            .flat_map(|&p| confirmed[p].iter().copied())
            .collect();
        let via = if qi == 1 { 2 } else { 1 };
        let none = BTreeSet::new();
        delivered +=
            check_queue(&cluster, via, &qs[qi], &want, &none, &published_by(&pubs)).await?;
    }
    println!(
        "fail-stop phase: {} confirmed ({by_node3} by node 3), {delivered} delivered, lost 0",
        confirmed.iter().map(|c| c.len()).sum::<usize>()
    );

    // Still failing its fsyncs, node 3 refuses to start, naming what failed.
    let log3_before = cluster.log_tail(3, u64::MAX).len();
    ensure!(
        cluster.restart(3).await.is_err(),
        "node 3 started on a disk whose fsyncs fail"
    );
    let status = cluster.exit_status(3);
    let log3 = log_since(&cluster, 3, log3_before);
    assert!(
        status.is_some_and(|s| !s.success()),
        "refusal exits non-zero: {status:?}"
    );
    assert!(!log3.contains("panicked"), "node 3 panicked:\n{log3}");
    let line = log3
        .lines()
        .find(|l| l.contains("os error 5"))
        .with_context(|| format!("no I/O error in node 3's log:\n{log3}"))?;
    assert!(
        line.contains("/node-3/"),
        "the refusal names the file: {line}"
    );
    println!(
        "node 3 refused to start on failing fsyncs ({status:?}): {}",
        line.trim()
    );

    // 2. Reads of the WAL's segments fail: node 3 refuses to start, like on corruption.
    fs.switch(".powerfs-heal")?;
    fs.switch(".powerfs-eio-read=.wal")?;
    let log3_before = cluster.log_tail(3, u64::MAX).len();
    let refused = cluster.restart(3).await;
    ensure!(
        refused.is_err(),
        "node 3 started on unreadable WAL segments"
    );
    let status = cluster.exit_status(3);
    let log3 = log_since(&cluster, 3, log3_before);
    assert!(
        status.is_some_and(|s| !s.success()),
        "refusal exits non-zero: {status:?}"
    );
    assert!(!log3.contains("panicked"), "node 3 panicked:\n{log3}");
    let line = log3
        .lines()
        .find(|l| l.contains("corrupt at offset"))
        .with_context(|| format!("no corruption error in node 3's log:\n{log3}"))?;
    assert!(
        line.contains(".wal")
            && line.contains("cannot read")
            && line.contains("--wal-truncate-at "),
        "the refusal names the segment, the read error and the repair: {line}"
    );
    println!(
        "node 3 refused to start ({status:?}): {}",
        &line[..line.len().min(400)]
    );

    // 3. Healed: node 3 starts (snapshotting often from now on, for step 4), rejoins and
    // catches up.
    fs.switch(".powerfs-heal")?;
    let healed = Instant::now();
    cluster
        .restart_with(3, &["--snapshot-interval", "64"])
        .await?;
    println!(
        "node 3 restarted on the healed disk in {:.0?}",
        healed.elapsed()
    );
    let conn = connect(&cluster.uri(1)).await?;
    let ch = confirm_channel(&conn).await?;
    // Batch b's i-th message to queue qi: id (b << 32) | (qi << 24) | i.
    let mut after: Vec<BTreeSet<u64>> = vec![BTreeSet::new(); 3];
    // Ids published again after a failed attempt (which may have been enqueued).
    let mut republished = BTreeSet::new();
    for i in 0..100u64 {
        for (qi, q) in qs.iter().enumerate() {
            let id = (9 << 32) | ((qi as u64) << 24) | i;
            retry_publish(&ch, q, id, &mut republished).await?;
            after[qi].insert(id);
        }
    }
    wait_online(&cluster, &qs).await?;

    // 4. Snapshot files cannot be written (the WAL can): node 3 stops at its next snapshot.
    let log3_before = cluster.log_tail(3, u64::MAX).len();
    fs.switch(".powerfs-eio-write=snapshots")?;
    let injected = Instant::now();
    let mut i = 0u64;
    while cluster.pid(3).is_some() {
        ensure!(
            injected.elapsed() < Duration::from_secs(60),
            "node 3 still runs 60 s after its snapshots started failing ({i} publishes per queue)"
        );
        for (qi, q) in qs.iter().enumerate() {
            let id = (10 << 32) | ((qi as u64) << 24) | i;
            retry_publish(&ch, q, id, &mut republished).await?;
            after[qi].insert(id);
        }
        i += 1;
    }
    let _ = conn.close(200, "done".into()).await;
    let status = cluster.exit_status(3);
    println!(
        "node 3 exited {:.0?} after the snapshot write fault ({i} publishes per queue): {status:?}",
        injected.elapsed()
    );
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(70),
        "fail-stop exit status"
    );
    let log3 = log_since(&cluster, 3, log3_before);
    let fatal = log3
        .lines()
        .find(|l| l.contains("stopping the process (fail-stop"))
        .with_context(|| format!("no fail-stop line in node 3's log:\n{log3}"))?;
    println!("node 3: {fatal}");
    assert!(
        fatal.contains("os error 5") && fatal.contains("/node-3/raft/snapshots/"),
        "the fail-stop line names the snapshot file and the error: {fatal}"
    );
    fs.switch(".powerfs-heal")?;
    cluster.restart(3).await?;
    wait_online(&cluster, &qs).await?;

    // Without node 1, every queue needs node 3 for a majority.
    cluster.kill9(1);
    for (qi, q) in qs.iter().enumerate() {
        // Phase 1's unconfirmed publishes may still surface (committed by the new leader).
        let published = |id: u64| {
            (matches!(id >> 32, 9 | 10) && (id >> 24) & 0xff == qi as u64)
                || (1..=4).contains(&(id >> 32))
        };
        check_queue(&cluster, 2, q, &after[qi], &republished, &published).await?;
    }
    println!(
        "node 3 rejoined: {} messages confirmed after its restarts delivered by nodes 2 and 3; \
         run {:.0?}",
        after.iter().map(|a| a.len()).sum::<usize>(),
        started.elapsed()
    );

    // 5. A WAL entry node 3 cannot read back while it runs: a queue it leads takes 10 MiB
    // while node 1 is down (past the WAL's 8 MiB read cache per group); with reads of the
    // WAL failing, node 1's return makes node 3 read the oldest entries from disk.
    let q4 = unique("diskerr.q4");
    let (c4, ch4) = cluster.quorum_queue_led_by(3, &q4).await?;
    let big = |i: u64| {
        let mut b = vec![(i % 251) as u8; 256 << 10];
        b[..8].copy_from_slice(&i.to_be_bytes());
        b
    };
    for i in 0..40u64 {
        publish_confirmed(
            &ch4,
            "",
            &q4,
            &big(i),
            BasicProperties::default().with_delivery_mode(2),
        )
        .await?;
    }
    let _ = c4.close(200, "done".into()).await;
    let log3_before = cluster.log_tail(3, u64::MAX).len();
    fs.switch(".powerfs-eio-read=.wal")?;
    let injected = Instant::now();
    cluster.restart(1).await?;
    wait_for(
        Duration::from_secs(30),
        "node 3 to stop when it cannot read its WAL",
        || async { cluster.pid(3).is_none() },
    )
    .await?;
    let status = cluster.exit_status(3);
    println!(
        "node 3 exited {:.0?} after its WAL reads started failing: {status:?}",
        injected.elapsed()
    );
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(70),
        "fail-stop exit status"
    );
    let log3 = log_since(&cluster, 3, log3_before);
    let fatal = log3
        .lines()
        .find(|l| l.contains("stopping the process (fail-stop"))
        .with_context(|| format!("no fail-stop line in node 3's log:\n{log3}"))?;
    println!("node 3: {fatal}");
    assert!(
        fatal.contains("read of") && fatal.contains(".wal") && fatal.contains("os error 5"),
        "the fail-stop line names the segment and the error: {fatal}"
    );
    fs.switch(".powerfs-heal")?;
    cluster.restart(3).await?;
    let conn = connect(&cluster.uri(2)).await?;
    let got = cluster_tests::cluster::retry(Duration::from_secs(30), "consuming q4", || async {
        let (_ch, mut consumer) = open_consumer(&conn, &q4, 100).await?;
        consume_n(&mut consumer, 40, Duration::from_secs(30)).await
    })
    .await?;
    let mut ids = BTreeSet::new();
    for d in &got {
        let i = u64::from_be_bytes(d.data[..8].try_into()?);
        assert!(d.data == big(i), "body {i} of {q4} damaged");
        ids.insert(i);
    }
    assert_eq!(
        ids,
        (0..40).collect(),
        "every confirmed message of {q4}, once"
    );
    println!("{q4}: 40 confirmed, 40 delivered after node 3's read fail-stop");

    for id in cluster.ids() {
        cluster.kill9(id);
    }
    fs.unmount();
    let fs_log = fs.log_text();
    println!("{}", fs_log.trim_end());
    assert!(
        fs_log.contains("injected errors") && fs_log.contains("fault: fsync answers EIO"),
        "powerfs log: {fs_log}"
    );
    Ok(())
}

/// Waits (≤ 30 s) until node 2 lists node 3 as a running member of every queue in `qs`.
async fn wait_online(cluster: &Cluster, qs: &[String]) -> anyhow::Result<()> {
    for q in qs {
        wait_for(
            Duration::from_secs(30),
            &format!("node 3 online in {q}"),
            || async {
                cluster
                    .queue_view(2, q)
                    .await
                    .is_ok_and(|v| v.online.contains(&3) && v.members.contains(&3))
            },
        )
        .await?;
    }
    Ok(())
}

/// Publishes `id` to `q` and waits for its confirm, publishing it again (≤ 30 s, noted in
/// `republished`) after a failure, e.g. while a leader is being elected.
async fn retry_publish(
    ch: &lapin::Channel,
    q: &str,
    id: u64,
    republished: &mut BTreeSet<u64>,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let sent = publish_confirmed(
            ch,
            "",
            q,
            &body(id),
            BasicProperties::default().with_delivery_mode(2),
        )
        .await;
        match sent {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() > deadline => {
                return Err(e.context(format!("publishing {id} to {q} for 30 s")))
            }
            Err(_) => {
                republished.insert(id);
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    }
}
