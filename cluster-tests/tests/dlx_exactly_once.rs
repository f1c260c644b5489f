//! Effectively-once at-least-once dead-lettering across a 3-node cluster
//! (issue 29 item 4, must show): 20,000 confirmed messages rejected from a
//! source quorum queue into a target quorum queue while the source's leader
//! node and then the target's leader node are `kill -9`ed and restarted.
//! Every message must be in the target exactly once: lost 0, duplicates 0.
//! A second test kills all three nodes at once (`kill -9`, twice) while the
//! dead letters flow, and asks the same of the restarted cluster.
//!
//! The target is drained only after the faults, once the cluster is stable
//! and the source is empty, so every copy counted is a message the target
//! holds (no consumer redelivery of the target can be counted as a
//! duplicate): its ready count must be 20,000 and its ids distinct. Bodies
//! carry the message's id (decimal text). With QUORUMQ_TEST_URI set this test
//! prints why and returns.

use cluster_tests::cluster::{self, Cluster};
use cluster_tests::*;
use futures::StreamExt;
use lapin::{
    options::{BasicAckOptions, BasicPublishOptions, BasicRejectOptions, QueueDeclareOptions},
    BasicProperties, Channel,
};
use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

/// Messages published and dead-lettered.
const N: u64 = 20_000;
/// Confirms awaited together while publishing.
const WINDOW: usize = 500;
/// Prefetch of the rejecting consumer and of the drain.
const PREFETCH: u16 = 500;
/// Bound on each wait for a leader, a node or a count.
const WAIT: Duration = Duration::from_secs(120);
/// Bound on the whole test.
const LIMIT: Duration = Duration::from_secs(600);

/// Retries `f` on a fresh channel of node `via` until it succeeds (leaders electing).
async fn on_channel<F, Fut>(c: &Cluster, via: u64, what: &str, f: F) -> anyhow::Result<()>
where
    F: Fn(Channel) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    cluster::retry(Duration::from_secs(60), what, || async {
        let conn = connect(&c.uri(via)).await?;
        let ch = conn.create_channel().await?;
        let r = f(ch).await;
        let _ = close_connection(&conn).await;
        r
    })
    .await
}

/// Publishes ids `0..N` to `q` through node `via`, `WINDOW` confirms at a time.
async fn publish_all(c: &Cluster, via: u64, q: &str) -> anyhow::Result<()> {
    let conn = connect(&c.uri(via)).await?;
    let ch = confirm_channel(&conn).await?;
    let ids: Vec<u64> = (0..N).collect();
    for chunk in ids.chunks(WINDOW) {
        let mut confirms = Vec::with_capacity(chunk.len());
        for id in chunk {
            let confirm = ch
                .basic_publish(
                    "".into(),
                    q.into(),
                    BasicPublishOptions::default(),
                    id.to_string().as_bytes(),
                    BasicProperties::default().with_delivery_mode(2),
                )
                .await?;
            confirms.push(confirm);
        }
        for confirm in confirms {
            let c = tokio::time::timeout(WAIT, confirm).await??;
            anyhow::ensure!(c.is_ack(), "a publish to {q} was nacked without a fault");
        }
    }
    close_connection(&conn).await
}

/// Consumes `q` and rejects (requeue = false) every delivery, counting them,
/// through the running nodes in turn (a killed node's connection is replaced),
/// until `stop`.
async fn reject_all(c: Arc<Cluster>, q: String, rejects: Arc<AtomicU64>, stop: Arc<AtomicBool>) {
    let mut node = 1;
    while !stop.load(Ordering::Acquire) {
        node = node % 3 + 1;
        let Some(pid) = c.pid(node) else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        let Ok(Ok(conn)) =
            tokio::time::timeout(Duration::from_secs(10), connect(&c.uri(node))).await
        else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let opened =
            tokio::time::timeout(Duration::from_secs(10), open_consumer(&conn, &q, PREFETCH)).await;
        let Ok(Ok((_ch, mut deliveries))) = opened else {
            let _ = tokio::time::timeout(Duration::from_secs(2), close_connection(&conn)).await;
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        eprintln!("rejecting consumer on node {node}");
        while !stop.load(Ordering::Acquire) {
            let d = match tokio::time::timeout(Duration::from_millis(500), deliveries.next()).await
            {
                // lapin does not always end a consumer's stream when the
                // node at the other end is killed (no delivery, no error,
                // for minutes): a consumer whose node process is gone is.
                Err(_) if c.pid(node) != Some(pid) => {
                    eprintln!(
                        "rejecting consumer on node {node}: its process is gone, lapin's stream is still open (connected: {})",
                        conn.status().connected()
                    );
                    break;
                }
                Err(_) => continue,
                Ok(Some(Ok(d))) => d,
                Ok(end) => {
                    eprintln!("rejecting consumer on node {node} ended: {end:?}");
                    break;
                }
            };
            // A reject in flight when the node is killed can wait forever
            // in lapin, as the stream can (above).
            let rejected = tokio::time::timeout(
                Duration::from_secs(5),
                d.reject(BasicRejectOptions { requeue: false }),
            )
            .await;
            if !matches!(rejected, Ok(Ok(_))) {
                eprintln!("rejecting consumer on node {node}: reject failed: {rejected:?}");
                break;
            }
            rejects.fetch_add(1, Ordering::AcqRel);
        }
        let _ = tokio::time::timeout(Duration::from_secs(2), close_connection(&conn)).await;
    }
}

/// Waits until `rejects` reaches `n`, or `N` if less (every message is rejected at least once).
async fn rejects_reach(rejects: &AtomicU64, n: u64, what: &str) -> anyhow::Result<()> {
    cluster::wait_for(WAIT, what, || async {
        rejects.load(Ordering::Acquire) >= n.min(N)
    })
    .await
}

/// Finds `q`'s leader through a running node, `kill -9`s it, and returns it.
async fn kill_leader(c: &Cluster, q: &str) -> anyhow::Result<u64> {
    let via = c.running()[0];
    let leader = c.wait_queue_leader(via, q, WAIT).await?;
    c.kill9(leader);
    eprintln!("kill -9 node {leader} (leader of {q})");
    Ok(leader)
}

/// Restarts `node` and waits until a running node sees it online for `q`.
async fn restart(c: &Cluster, node: u64, q: &str) -> anyhow::Result<()> {
    c.restart(node).await?;
    let via = *c
        .running()
        .iter()
        .find(|n| **n != node)
        .ok_or_else(|| anyhow::anyhow!("no other running node"))?;
    cluster::wait_for(WAIT, &format!("node {node} online for {q}"), || async {
        c.queue_view(via, q)
            .await
            .is_ok_and(|v| v.online.contains(&node))
    })
    .await?;
    eprintln!("node {node} restarted");
    Ok(())
}

/// Deliveries per id when draining `q` through node `via` (acking), until
/// `N` distinct ids arrived and then 2 s passed without a delivery.
async fn drain(c: &Cluster, via: u64, q: &str) -> anyhow::Result<(HashMap<u64, u32>, u64)> {
    let conn = connect(&c.uri(via)).await?;
    let (_ch, mut deliveries) = open_consumer(&conn, q, PREFETCH).await?;
    let mut counts: HashMap<u64, u32> = HashMap::new();
    let mut unparsable = 0;
    let deadline = Instant::now() + WAIT;
    loop {
        let idle = if counts.len() as u64 >= N {
            Duration::from_secs(2)
        } else {
            deadline.saturating_duration_since(Instant::now())
        };
        let d = match tokio::time::timeout(idle, deliveries.next()).await {
            Err(_) => break,
            Ok(Some(Ok(d))) => d,
            Ok(other) => anyhow::bail!("the drain's consumer ended: {other:?}"),
        };
        match std::str::from_utf8(&d.data)
            .ok()
            .and_then(|s| s.parse().ok())
        {
            Some(id) => *counts.entry(id).or_default() += 1,
            None => unparsable += 1,
        }
        d.ack(BasicAckOptions::default()).await?;
    }
    close_connection(&conn).await?;
    Ok((counts, unparsable))
}

/// Runs `body` on a fresh 3-node cluster within `LIMIT`, printing the nodes'
/// logs when it fails. With QUORUMQ_TEST_URI set, returns at once.
async fn with_cluster<F, Fut>(body: F) -> anyhow::Result<()>
where
    F: FnOnce(Arc<Cluster>, Instant) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    if std::env::var(TEST_URI_ENV).is_ok_and(|v| !v.is_empty()) {
        println!("{TEST_URI_ENV} is set; this test spawns its own quorumq nodes, returning early");
        return Ok(());
    }
    let started = Instant::now();
    let c = Arc::new(Cluster::start(3).await?);
    let result = tokio::time::timeout(LIMIT, body(c.clone(), started)).await;
    match result {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => {
            c.print_logs(6000);
            Err(e)
        }
        Err(_) => {
            c.print_logs(6000);
            anyhow::bail!("not finished within {LIMIT:?}")
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_reach_the_target_exactly_once_across_leader_kills() -> anyhow::Result<()> {
    with_cluster(|c, started| async move {
        let run = DeadLetterRun::start(c.clone(), started).await?;
        let rejects = &run.rejects;

        rejects_reach(rejects, 4_000, "4000 rejects").await?;
        let killed = kill_leader(&c, &run.source).await?;
        let r = rejects.load(Ordering::Acquire);
        rejects_reach(
            rejects,
            r + 4_000,
            "4000 rejects after the source leader's kill",
        )
        .await?;
        restart(&c, killed, &run.source).await?;

        let r = rejects.load(Ordering::Acquire);
        rejects_reach(rejects, r + 2_000, "2000 more rejects").await?;
        let killed = kill_leader(&c, &run.target).await?;
        let r = rejects.load(Ordering::Acquire);
        rejects_reach(
            rejects,
            r + 2_000,
            "2000 rejects after the target leader's kill",
        )
        .await?;
        restart(&c, killed, &run.target).await?;
        run.verify(&c, started).await
    })
    .await
}

/// The whole cluster `kill -9`ed at once, twice, while dead letters flow
/// (issue 29 item 4: "measure duplicates in the whole-cluster kill -9 test").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_reach_the_target_exactly_once_across_whole_cluster_kills(
) -> anyhow::Result<()> {
    with_cluster(|c, started| async move {
        let run = DeadLetterRun::start(c.clone(), started).await?;
        let rejects = &run.rejects;
        for (round, after) in [(1, 4_000), (2, 10_000)] {
            rejects_reach(rejects, after, &format!("{after} rejects")).await?;
            for node in 1..=3 {
                c.kill9(node);
            }
            eprintln!(
                "kill -9 of all three nodes (round {round}) after {} rejects",
                rejects.load(Ordering::Acquire)
            );
            // Every node must start while the others are still down: none
            // waits for a quorum to come up.
            for node in 1..=3 {
                c.restart(node).await?;
            }
            for q in [&run.source, &run.target] {
                c.wait_queue_leader(1, q, WAIT).await?;
            }
            eprintln!("cluster back after {:?}", started.elapsed());
        }
        run.verify(&c, started).await
    })
    .await
}

/// A source queue dead-lettering at-least-once into a target, with `N`
/// confirmed messages in it and a consumer rejecting every delivery.
struct DeadLetterRun {
    source: String,
    target: String,
    /// Rejects made so far (a consumer redelivery is rejected again).
    rejects: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    rejecter: tokio::task::JoinHandle<()>,
}

impl DeadLetterRun {
    /// Declares the target and the source (reject-publish, at-least-once),
    /// publishes ids `0..N` with confirms and starts rejecting.
    async fn start(c: Arc<Cluster>, started: Instant) -> anyhow::Result<Self> {
        let (source, target) = (unique("x1.src"), unique("x1.dlq"));
        on_channel(&c, 1, "declare the target and the source", |ch| {
            let (source, target) = (source.clone(), target.clone());
            async move {
                let durable = QueueDeclareOptions {
                    durable: true,
                    ..QueueDeclareOptions::default()
                };
                ch.queue_declare(target.as_str().into(), durable, quorum_args(&[]))
                    .await?;
                ch.queue_declare(
                    source.as_str().into(),
                    durable,
                    quorum_args(&[
                        ("x-dead-letter-exchange", s("")),
                        ("x-dead-letter-routing-key", s(&target)),
                        ("x-dead-letter-strategy", s("at-least-once")),
                        ("x-overflow", s("reject-publish")),
                    ]),
                )
                .await?;
                Ok(())
            }
        })
        .await?;
        publish_all(&c, 1, &source).await?;
        eprintln!("{N} confirmed into {source} after {:?}", started.elapsed());
        let rejects = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let rejecter = tokio::spawn(reject_all(
            c.clone(),
            source.clone(),
            rejects.clone(),
            stop.clone(),
        ));
        Ok(Self {
            source,
            target,
            rejects,
            stop,
            rejecter,
        })
    }

    /// Waits for the source to empty, stops rejecting, drains the target and
    /// asserts every id there exactly once (lost 0, duplicates 0).
    async fn verify(self, c: &Cluster, started: Instant) -> anyhow::Result<()> {
        let Self {
            source,
            target,
            rejects,
            stop,
            rejecter,
        } = self;
        eprintln!(
            "faults done after {:?}, {} rejects so far",
            started.elapsed(),
            rejects.load(Ordering::Acquire)
        );
        // At-least-once: the source is empty once every dead letter was
        // confirmed by the target.
        let via = c.running()[0];
        cluster::wait_until_some(WAIT, &format!("{source} empty"), || async {
            let v = c.queue_view(via, &source).await?;
            if (
                v.messages_ready,
                v.messages_unacknowledged,
                v.dead_letter_held,
            ) == (0, 0, 0)
            {
                Ok(Some(()))
            } else {
                Err(anyhow::anyhow!("node {via} lists {v:?}"))
            }
        })
        .await?;
        stop.store(true, Ordering::Release);
        let _ = tokio::time::timeout(Duration::from_secs(10), rejecter).await;
        eprintln!(
            "source empty after {:?}, {} rejects (a consumer redelivery is rejected again)",
            started.elapsed(),
            rejects.load(Ordering::Acquire)
        );

        // The target's leader counts what it holds: exactly N.
        let leader = c.wait_queue_leader(via, &target, WAIT).await?;
        let ready = cluster::wait_until_some(WAIT, &format!("{target} settled"), || async {
            let v = c.queue_view(leader, &target).await?;
            if v.messages_ready >= N {
                Ok(Some(v.messages_ready))
            } else {
                Err(anyhow::anyhow!("node {leader} lists {v:?}"))
            }
        })
        .await?;
        let (counts, unparsable) = drain(c, leader, &target).await?;
        let lost: Vec<u64> = (0..N).filter(|id| !counts.contains_key(id)).collect();
        let mut duplicated: Vec<(u64, u32)> = counts
            .iter()
            .filter(|(_, n)| **n > 1)
            .map(|(id, n)| (*id, *n))
            .collect();
        duplicated.sort_unstable();
        let duplicates: u64 = counts.values().map(|n| u64::from(n - 1)).sum();
        eprintln!(
            "target: {ready} ready; drained {} distinct, lost {}, duplicates {duplicates}, unparsable {unparsable}; done after {:?}",
            counts.len(),
            lost.len(),
            started.elapsed()
        );
        assert_none("dead letters lost", &lost);
        assert_none("dead letters in the target more than once", &duplicated);
        assert_eq!(unparsable, 0, "bodies that are not an id");
        assert_eq!(ready, N, "the target holds exactly one copy of each");
        Ok(())
    }
}

/// Polls node `via`'s view of `q` until `ok` holds for it (≤ [`WAIT`]).
async fn view_until(
    c: &Cluster,
    via: u64,
    q: &str,
    what: &str,
    ok: impl Fn(&cluster::QueueView) -> bool,
) -> anyhow::Result<()> {
    cluster::retry(WAIT, what, || async {
        let v = c.queue_view(via, q).await?;
        anyhow::ensure!(ok(&v), "{q} via node {via}: {v:?}");
        Ok(())
    })
    .await
}

/// A source leader paused while it holds dead letters, and resumed after
/// its successor forwarded and settled them, forwards none of them again
/// (issue 32 item 5). Its stale replica still holds them; the target has
/// forgotten their ids (its floor rose past them) and its floor has since
/// dropped below them (an older message, checked out all along, was
/// dead-lettered last), so only the worker can tell: it forwards only what
/// it reads as the leader's latest state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_deposed_source_leader_forwards_no_settled_dead_letter() -> anyhow::Result<()> {
    with_cluster(|c, _| async move {
        let (source, target) = ("dlxstale.s", "dlxstale.t");
        // The target refuses dead letters (max-length 0, reject-publish)
        // until the policy goes: the source holds them.
        c.set_policy(2, "full", "^dlxstale\\.t$", r#"{"max-length":0}"#)
            .await?;
        let c2 = connect(&c.uri(2)).await?;
        let ch2 = confirm_channel(&c2).await?;
        cluster::declare_durable(
            &ch2,
            target,
            quorum_args(&[("x-overflow", s("reject-publish"))]),
        )
        .await?;
        let c1 = connect(&c.uri(1)).await?;
        let ch1 = confirm_channel(&c1).await?;
        let source_args = quorum_args(&[
            ("x-dead-letter-exchange", s("")),
            ("x-dead-letter-routing-key", s(target)),
            ("x-dead-letter-strategy", s("at-least-once")),
            ("x-overflow", s("reject-publish")),
        ]);
        cluster::declare_durable(&ch1, source, source_args).await?;
        assert_eq!(
            c.wait_queue_leader(1, source, WAIT).await?,
            1,
            "node 1 leads the source"
        );
        assert_ne!(
            c.wait_queue_leader(2, target, WAIT).await?,
            1,
            "node 1 does not lead the target"
        );
        let publish = |ch: Channel, id: u64| async move {
            let confirm = ch
                .basic_publish(
                    "".into(),
                    source.into(),
                    BasicPublishOptions::default(),
                    id.to_string().as_bytes(),
                    BasicProperties::default().with_delivery_mode(2),
                )
                .await?
                .await?;
            anyhow::ensure!(confirm.is_ack(), "publish {id} nacked");
            anyhow::Ok(())
        };
        for id in 0..=100 {
            publish(ch1.clone(), id).await?;
        }
        // Message 0 stays checked out to node 3's client; 1..=100 are
        // rejected into the held area.
        let c3 = connect(&c.uri(3)).await?;
        let keeper = c3.create_channel().await?;
        let first = keeper
            .basic_get(source.into(), Default::default())
            .await?
            .ok_or_else(|| anyhow::anyhow!("no message 0"))?;
        anyhow::ensure!(first.delivery.data == b"0", "message 0 comes first");
        let rejecter = c3.create_channel().await?;
        for _ in 1..=100 {
            let m = rejecter
                .basic_get(source.into(), Default::default())
                .await?
                .ok_or_else(|| anyhow::anyhow!("fewer than 100 messages"))?;
            m.delivery
                .reject(BasicRejectOptions { requeue: false })
                .await?;
        }
        // As in RabbitMQ, a queue at its limit rejects only once over it:
        // the target took the first dead letter, the source holds 99.
        view_until(&c, 2, target, "1 in the target", |v| v.messages_ready == 1).await?;
        for via in [1, 2, 3] {
            view_until(&c, via, source, "99 dead letters held", |v| {
                v.dead_letter_held == 99
            })
            .await?;
        }
        c.sigstop(1)?;
        let resumed = async {
            let leader = c.wait_queue_leader(2, source, WAIT).await?;
            eprintln!("node 1 paused; node {leader} leads the source");
            // The target takes them now: the new leader forwards and settles.
            c.ctl(2, &["clear_policy", "full"]).await?;
            view_until(&c, 2, target, "100 in the target", |v| {
                v.messages_ready == 100
            })
            .await?;
            view_until(&c, 2, source, "none held", |v| v.dead_letter_held == 0).await?;
            // One more, forwarded with a floor above 1..=100: the target
            // forgets their ids.
            publish(ch2.clone(), 101).await?;
            let m = rejecter
                .basic_get(source.into(), Default::default())
                .await?
                .ok_or_else(|| anyhow::anyhow!("no message 101"))?;
            m.delivery
                .reject(BasicRejectOptions { requeue: false })
                .await?;
            view_until(&c, 2, target, "101 in the target", |v| {
                v.messages_ready == 101
            })
            .await?;
            // Message 0, older than all: the source's floor drops to it.
            first
                .delivery
                .reject(BasicRejectOptions { requeue: false })
                .await?;
            view_until(&c, 2, target, "102 in the target", |v| {
                v.messages_ready == 102
            })
            .await?;
            anyhow::Ok(())
        }
        .await;
        c.sigcont(1)?;
        resumed?;
        // Node 1's worker wakes on its stale replica (held: 1..=100).
        for _ in 0..20 {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let v = c.queue_view(2, target).await?;
            assert_eq!(
                v.messages_ready, 102,
                "the target holds each dead letter once after node 1 resumed"
            );
        }
        view_until(&c, 1, source, "node 1 follows the new leader", |v| {
            v.leader.is_some_and(|l| l != 1) && v.dead_letter_held == 0
        })
        .await
    })
    .await
}
