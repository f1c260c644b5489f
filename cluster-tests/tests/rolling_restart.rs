//! Graceful stops hand queue leaderships over first (issue: cluster
//! operations, item 2): `quorumqctl drain` / `revive` on a live node, and a
//! rolling restart of all three nodes (SIGTERM, start again, one at a time)
//! under a confirmed publish + consume load: nothing confirmed is lost, and
//! the longest confirm gap a publisher on a surviving node sees is printed.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use cluster_tests::cluster::{declare_durable, wait_for, wait_until_some, Cluster};
use cluster_tests::{confirm_channel, connect, open_consumer, publish_confirmed, quorum_args};
use futures::StreamExt;
use lapin::options::BasicAckOptions;
use lapin::BasicProperties;

/// Waits until node `via` lists every queue in `qs` with a live leader other
/// than `not` (None: any) and all three members online.
async fn settled(
    cluster: &Cluster,
    via: u64,
    qs: &[String],
    not: Option<u64>,
) -> anyhow::Result<()> {
    for q in qs {
        wait_until_some(
            Duration::from_secs(60),
            &format!("{q}: a leader (not {not:?}) and 3 members online"),
            || async {
                let v = cluster.queue_view(via, q).await?;
                let ok = v.online.len() == 3
                    && v.leader
                        .is_some_and(|l| Some(l) != not && v.online.contains(&l));
                Ok(ok.then_some(()))
            },
        )
        .await?;
    }
    Ok(())
}

/// `drain` moves every leadership off the node asked, `cluster_status`
/// shows it draining and leading nothing, its clients still publish (their
/// writes go to the new leaders), and after `revive` a `rebalance` gives it
/// leaders again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_hands_leaderships_over_and_revive_ends_it() -> anyhow::Result<()> {
    cluster_tests::bounded(Duration::from_secs(240), async {
        let cluster = Cluster::start(3).await?;
        let c1 = connect(&cluster.uri(1)).await?;
        let ch1 = confirm_channel(&c1).await?;
        let qs: Vec<String> = (0..3).map(|i| format!("drain.q{i}")).collect();
        for q in &qs {
            declare_durable(&ch1, q, quorum_args(&[])).await?;
        }
        settled(&cluster, 1, &qs, None).await?;
        for q in &qs {
            let leader = cluster
                .wait_queue_leader(1, q, Duration::from_secs(30))
                .await?;
            assert_eq!(leader, 1, "{q} is led by the declaring node");
        }

        let out = cluster.ctl(1, &["drain"]).await?;
        eprintln!("$ quorumqctl --node <node 1> drain\n{out}");
        assert!(out.contains("leaderships moved: 3"), "{out}");
        // Node 2 sees the new leader with its first append (a moment after
        // node 1 saw the vote that ended its term).
        for q in &qs {
            wait_until_some(
                Duration::from_secs(10),
                &format!("node 2 sees {q} led by another node than 1"),
                || async {
                    let v = cluster.queue_view(2, q).await?;
                    Ok(v.leader.is_some_and(|l| l != 1).then_some(()))
                },
            )
            .await?;
        }
        let status = cluster
            .ctl(2, &["cluster_status", "--formatter", "json"])
            .await?;
        let status: serde_json::Value = serde_json::from_str(&status)?;
        let node1 = &status["nodes"][0];
        assert_eq!(node1["id"], 1, "{status}");
        assert_eq!(node1["draining"], true, "{status}");
        assert_eq!(node1["leaders"], 0, "{status}");
        assert_eq!(node1["replicas"], 3, "{status}");
        assert!(
            status["meta_leader"].as_u64().is_some_and(|l| l != 1),
            "the meta group is led elsewhere too: {status}"
        );

        // A draining node's clients keep working: their writes are forwarded.
        for q in &qs {
            publish_confirmed(&ch1, "", q, b"while draining", BasicProperties::default()).await?;
        }
        // Nothing leads on node 1 while it drains, even if asked to.
        let out = cluster.ctl(1, &["rebalance", "quorum"]).await?;
        eprintln!("$ quorumqctl rebalance quorum (node 1 draining)\n{out}");
        for q in &qs {
            let v = cluster.queue_view(1, q).await?;
            assert!(v.leader.is_some_and(|l| l != 1), "{q}: {v:?}");
            assert_eq!(v.messages_ready, 1, "{q}: {v:?}");
        }

        let out = cluster.ctl(1, &["revive"]).await?;
        eprintln!("$ quorumqctl --node <node 1> revive\n{out}");
        // Node 2 learns of the revive from node 1's next beat (≤ 100 ms):
        // until then its rebalance leaves node 1 out.
        wait_for(
            Duration::from_secs(30),
            "node 1 leads a queue again",
            || async {
                if let Ok(out) = cluster.ctl(2, &["rebalance", "quorum"]).await {
                    eprintln!("$ quorumqctl rebalance quorum\n{out}");
                }
                let mut led = 0;
                for q in &qs {
                    if cluster
                        .queue_view(2, q)
                        .await
                        .is_ok_and(|v| v.leader == Some(1))
                    {
                        led += 1;
                    }
                }
                led >= 1
            },
        )
        .await?;
        Ok(())
    })
    .await
}

/// What one publisher saw.
struct Published {
    confirmed: BTreeSet<String>,
    /// Longest time between two confirms on one connection.
    longest_gap: Duration,
    /// Connections lost (its node was restarted) and opened again elsewhere.
    reconnects: u32,
}

/// Publishes confirmed messages to `q`, connected to node `home` first and
/// to the next node whenever its connection breaks (the message in flight
/// is published again: at-least-once).
async fn publish_loop(
    uris: Vec<String>,
    home: usize,
    q: String,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<Published> {
    let mut out = Published {
        confirmed: BTreeSet::new(),
        longest_gap: Duration::ZERO,
        reconnects: 0,
    };
    let mut node = home;
    let mut i = 0u64;
    'connections: while !stop.load(Ordering::Relaxed) {
        let ch = match connect(&uris[node]).await {
            Ok(c) => match confirm_channel(&c).await {
                Ok(ch) => (c, ch),
                Err(_) => {
                    node = (node + 1) % uris.len();
                    continue;
                }
            },
            Err(_) => {
                node = (node + 1) % uris.len();
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let mut last = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            let body = format!("{q}-{i}");
            let sent = tokio::time::timeout(
                Duration::from_secs(30),
                publish_confirmed(&ch.1, "", &q, body.as_bytes(), BasicProperties::default()),
            )
            .await;
            match sent {
                Ok(Ok(())) => {
                    out.confirmed.insert(body);
                    out.longest_gap = out.longest_gap.max(last.elapsed());
                    last = Instant::now();
                    i += 1;
                }
                _ => {
                    out.reconnects += 1;
                    node = (node + 1) % uris.len();
                    continue 'connections;
                }
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    Ok(out)
}

/// Consumes `q` (acking), connected to node `home` first and to the next
/// node whenever its connection breaks.
async fn consume_loop(
    uris: Vec<String>,
    home: usize,
    q: String,
    received: Arc<Mutex<BTreeSet<String>>>,
) -> anyhow::Result<()> {
    let mut node = home;
    loop {
        let conn = match tokio::time::timeout(Duration::from_secs(10), connect(&uris[node])).await {
            Ok(Ok(c)) => c,
            other => {
                eprintln!(
                    "consumer of {q}: connecting to node {} failed: {other:?}",
                    node + 1
                );
                node = (node + 1) % uris.len();
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        match tokio::time::timeout(Duration::from_secs(10), open_consumer(&conn, &q, 100)).await {
            Ok(Ok((_ch, mut consumer))) => loop {
                // A stream that stays silent on a dead connection is left too.
                let next = tokio::time::timeout(Duration::from_secs(1), consumer.next()).await;
                let d = match next {
                    Ok(Some(Ok(d))) => d,
                    Ok(_) => break,
                    Err(_) if conn.status().connected() => continue,
                    Err(_) => break,
                };
                if let Ok(mut r) = received.lock() {
                    r.insert(String::from_utf8_lossy(&d.data).into_owned());
                }
                // lapin may never resolve an ack written to a dead connection.
                let acked =
                    tokio::time::timeout(Duration::from_secs(5), d.ack(BasicAckOptions::default()))
                        .await;
                if !matches!(acked, Ok(Ok(_))) {
                    eprintln!(
                        "consumer of {q}: ack on node {} failed: {acked:?}",
                        node + 1
                    );
                    break;
                }
            },
            // basic.consume unanswered would be a broker bug: say so.
            other => eprintln!(
                "consumer of {q}: basic.consume on node {} failed: {:?}",
                node + 1,
                other.map(|r| r.map(|_| ()))
            ),
        }
        node = (node + 1) % uris.len();
    }
}

/// Rolling restart of all three nodes under load. Queue `qK` is led by node
/// K; the publisher to `qK` is connected to another node, so it sees node
/// K's graceful stop only as the hand-over of its queue's leadership.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_restart_under_load_loses_nothing() -> anyhow::Result<()> {
    cluster_tests::bounded(Duration::from_secs(420), async {
        let cluster = Cluster::start(3).await?;
        let uris: Vec<String> = (1..=3).map(|i| cluster.uri(i)).collect();
        let qs: Vec<String> = (1..=3).map(|i| format!("rolling.q{i}")).collect();
        for (i, q) in qs.iter().enumerate() {
            let c = connect(&uris[i]).await?;
            let ch = c.create_channel().await?;
            declare_durable(&ch, q, quorum_args(&[])).await?;
        }
        settled(&cluster, 1, &qs, None).await?;

        let stop = Arc::new(AtomicBool::new(false));
        let received = Arc::new(Mutex::new(BTreeSet::new()));
        let mut publishers = Vec::new();
        let mut consumers = Vec::new();
        for (k, q) in qs.iter().enumerate() {
            // qK (led by node K) gets its publisher on node K+1 and its consumer on node K+2.
            publishers.push(tokio::spawn(publish_loop(
                uris.clone(),
                (k + 1) % 3,
                q.clone(),
                stop.clone(),
            )));
            consumers.push(tokio::spawn(consume_loop(
                uris.clone(),
                (k + 2) % 3,
                q.clone(),
                received.clone(),
            )));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        for node in 1..=3u64 {
            let begun = Instant::now();
            cluster.stop(node).await?;
            eprintln!("node {node} stopped gracefully in {:?}", begun.elapsed());
            // Node K still leads qK when it stops: the stop hands it over.
            let log = strip_ansi(&cluster.log_tail(node, 64 * 1024));
            let drained = log
                .lines()
                .rev()
                .find(|l| l.contains("drained: queue leaderships handed over"))
                .with_context(|| format!("node {node} logged no drain"))?;
            eprintln!("  {drained}");
            assert!(
                drained.contains(" failed=0") && !drained.contains(" moved=0"),
                "node {node} handed its leaderships over: {drained}"
            );
            cluster.restart(node).await?;
            settled(&cluster, node % 3 + 1, &qs, None).await?;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        stop.store(true, Ordering::Relaxed);
        let mut confirmed = BTreeSet::new();
        for (q, p) in qs.iter().zip(publishers) {
            let p = p.await??;
            eprintln!(
                "{q}: {} confirmed, longest confirm gap {:?}, {} reconnects",
                p.confirmed.len(),
                p.longest_gap,
                p.reconnects
            );
            assert!(p.confirmed.len() > 50, "{q}: the publisher kept going");
            confirmed.extend(p.confirmed);
        }
        let settled_all = wait_for(
            Duration::from_secs(60),
            "every confirmed message consumed",
            || async {
                received
                    .lock()
                    .map(|r| confirmed.is_subset(&r))
                    .unwrap_or(false)
            },
        )
        .await;
        if let Err(e) = settled_all {
            for q in &qs {
                eprintln!("{q}: {:?}", cluster.queue_view(1, q).await);
            }
            let r = received.lock().map(|r| r.clone()).unwrap_or_default();
            let lost: Vec<_> = confirmed.difference(&r).take(10).collect();
            return Err(e.context(format!("lost e.g. {lost:?} of {}", confirmed.len())));
        }
        for c in consumers {
            c.abort();
        }
        Ok(())
    })
    .await
}

/// `text` without terminal colour sequences (`ESC [ ... m`).
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}
