//! At-least-once dead-lettering under faults (issue: "At-least-once under
//! faults"). A consumer rejects every message of an at-least-once source
//! queue while the broker is `kill -9`ed twice mid-stream; afterwards every
//! confirmed message must be in the dead-letter target (duplicates allowed
//! and counted, loss = 0). And a target full with reject-publish holds the
//! dead letters in the source until a consumer drains it: nothing is lost.
//! Both need a spawned quorumq (kill/restart); with QUORUMQ_TEST_URI set the
//! first returns early, the second runs against the external broker too.

use cluster_tests::*;
use futures::StreamExt;
use lapin::{
    options::{
        BasicAckOptions, BasicConsumeOptions, BasicQosOptions, BasicRejectOptions,
        QueueDeclareOptions,
    },
    types::{AMQPValue, FieldTable},
    BasicProperties, Channel, Connection,
};
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

const N: u32 = 20_000;

/// Declares DLX `dlx` (fanout) → `target`, and `source` dead-lettering
/// at-least-once into `dlx`. `target_limit` caps the target with
/// reject-publish.
async fn declare_topology(
    ch: &Channel,
    source: &str,
    dlx: &str,
    target: &str,
    target_limit: Option<i64>,
) -> anyhow::Result<()> {
    dlx::fanout(ch, dlx).await?;
    let mut targs = vec![("x-overflow", s("reject-publish"))];
    if let Some(l) = target_limit {
        targs.push(("x-max-length", AMQPValue::LongLongInt(l)));
    }
    ch.queue_declare(target.into(), durable(), quorum_args(&targs))
        .await?;
    dlx::bind(ch, target, dlx, "").await?;
    ch.queue_declare(
        source.into(),
        durable(),
        quorum_args(&[
            ("x-dead-letter-exchange", s(dlx)),
            ("x-dead-letter-strategy", s("at-least-once")),
            ("x-overflow", s("reject-publish")),
        ]),
    )
    .await?;
    Ok(())
}

/// Publishes ids 0..n (u32 BE) with confirms (window 512); returns the confirmed ids.
async fn publish_ids(ch: &Channel, q: &str, n: u32) -> anyhow::Result<HashSet<u32>> {
    let mut confirmed = HashSet::new();
    let mut window = Vec::new();
    for i in 0..n {
        let pc = ch
            .basic_publish(
                "".into(),
                q.into(),
                Default::default(),
                &i.to_be_bytes(),
                BasicProperties::default(),
            )
            .await?;
        window.push((i, pc));
        if window.len() == 512 || i + 1 == n {
            for (id, pc) in window.drain(..) {
                if pc.await?.is_ack() {
                    confirmed.insert(id);
                }
            }
        }
    }
    Ok(confirmed)
}

fn id_of(data: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(data.get(..4)?.try_into().ok()?))
}

/// One connection that rejects (requeue=false) everything from `source` and
/// collects (and acks) everything from `target` until `want` distinct ids
/// arrived or `stop_after_rejects` rejections happened. Returns the number
/// of rejections made. Connection errors end the phase (the broker died).
async fn run_phase(
    uri: &str,
    source: &str,
    target: &str,
    want: &HashSet<u32>,
    seen: &mut HashMap<u32, u32>,
    stop_after_rejects: Option<u64>,
    limit: Duration,
) -> anyhow::Result<u64> {
    let conn: Connection = connect(uri).await?;
    let rch = conn.create_channel().await?;
    rch.basic_qos(500, BasicQosOptions::default()).await?;
    let cch = conn.create_channel().await?;
    cch.basic_qos(1000, BasicQosOptions::default()).await?;
    let mut rejecter = rch
        .basic_consume(
            source.into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let mut collector = cch
        .basic_consume(
            target.into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let deadline = Instant::now() + limit;
    let mut rejects = 0u64;
    loop {
        if want.iter().all(|id| seen.contains_key(id)) {
            break;
        }
        if stop_after_rejects.is_some_and(|n| rejects >= n) || Instant::now() > deadline {
            break;
        }
        tokio::select! {
            d = rejecter.next() => match d {
                Some(Ok(d)) => {
                    if d.reject(BasicRejectOptions { requeue: false }).await.is_err() { break; }
                    rejects += 1;
                }
                _ => break,
            },
            d = collector.next() => match d {
                Some(Ok(d)) => {
                    if let Some(id) = id_of(&d.data) {
                        *seen.entry(id).or_default() += 1;
                    }
                    if d.ack(BasicAckOptions::default()).await.is_err() { break; }
                }
                _ => break,
            },
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
    }
    drop(rejecter);
    drop(collector);
    if stop_after_rejects.is_none() {
        let _ = close_connection(&conn).await;
    }
    Ok(rejects)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_least_once_survives_two_kill9_mid_stream() -> anyhow::Result<()> {
    bounded(Duration::from_secs(300), async {
        let mut broker = Broker::start().await?;
        if broker.is_external() {
            println!(
                "{TEST_URI_ENV} is set; this test kills and restarts quorumq, returning early"
            );
            return Ok(());
        }
        let (source, dlx, target) = (
            unique("alo.fault.src"),
            unique("alo.fault.dlx"),
            unique("alo.fault.dlq"),
        );
        let confirmed = {
            let conn = connect(broker.uri()).await?;
            let ch = confirm_channel(&conn).await?;
            declare_topology(&ch, &source, &dlx, &target, None).await?;
            let c = publish_ids(&ch, &source, N).await?;
            close_connection(&conn).await?;
            c
        };
        assert_eq!(confirmed.len(), N as usize, "every publish confirmed");
        let mut seen: HashMap<u32, u32> = HashMap::new();
        for kill in 1..=2 {
            let rejects = run_phase(
                broker.uri(),
                &source,
                &target,
                &confirmed,
                &mut seen,
                Some(6_000),
                Duration::from_secs(60),
            )
            .await?;
            println!(
                "phase {kill}: {rejects} rejected, {} distinct ids in the target so far; kill -9",
                seen.len()
            );
            broker.kill9();
            broker.restart().await?;
        }
        run_phase(
            broker.uri(),
            &source,
            &target,
            &confirmed,
            &mut seen,
            None,
            Duration::from_secs(120),
        )
        .await?;
        let missing: Vec<u32> = confirmed
            .iter()
            .filter(|id| !seen.contains_key(id))
            .copied()
            .collect();
        let duplicates: u32 = seen.values().map(|n| n.saturating_sub(1)).sum();
        println!(
            "dead-lettered {} distinct of {N}, duplicates {duplicates}, lost {}",
            seen.len(),
            missing.len()
        );
        assert!(
            missing.is_empty(),
            "{} confirmed messages never reached the DLX target, e.g. {:?}",
            missing.len(),
            &missing[..missing.len().min(10)]
        );
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_dead_letters_move_when_a_full_target_drains() -> anyhow::Result<()> {
    bounded(Duration::from_secs(120), async {
        let broker = Broker::start().await?;
        let (source, dlx, target) = (unique("alo.full.src"), unique("alo.full.dlx"), unique("alo.full.dlq"));
        const M: u32 = 200;
        let conn = connect(broker.uri()).await?;
        let ch = confirm_channel(&conn).await?;
        declare_topology(&ch, &source, &dlx, &target, Some(10)).await?;
        let confirmed = publish_ids(&ch, &source, M).await?;
        assert_eq!(confirmed.len(), M as usize);
        // Reject everything: the target takes ~11, the rest stay held.
        let rch = conn.create_channel().await?;
        rch.basic_qos(100, BasicQosOptions::default()).await?;
        let mut rejecter = rch.basic_consume(source.as_str().into(), "".into(), BasicConsumeOptions::default(), FieldTable::default()).await?;
        for _ in 0..M {
            let d = tokio::time::timeout(Duration::from_secs(10), rejecter.next()).await?.expect("delivery")?;
            d.reject(BasicRejectOptions { requeue: false }).await?;
        }
        let ready = ch.queue_declare(target.as_str().into(), QueueDeclareOptions { passive: true, ..durable() }, FieldTable::default()).await?;
        assert!(ready.message_count() <= 12, "target over its limit: {}", ready.message_count());
        // Drain the target: held messages flow in as room appears.
        let cch = conn.create_channel().await?;
        cch.basic_qos(50, BasicQosOptions::default()).await?;
        let mut collector = cch.basic_consume(target.as_str().into(), "".into(), BasicConsumeOptions::default(), FieldTable::default()).await?;
        let mut seen: HashMap<u32, u32> = HashMap::new();
        let mut max_gap = Duration::ZERO;
        let mut last = Instant::now();
        while !confirmed.iter().all(|id| seen.contains_key(id)) {
            let d = tokio::time::timeout(Duration::from_secs(30), collector.next()).await?.expect("delivery")?;
            max_gap = max_gap.max(last.elapsed());
            last = Instant::now();
            if let Some(id) = id_of(&d.data) {
                *seen.entry(id).or_default() += 1;
            }
            d.ack(BasicAckOptions::default()).await?;
        }
        let duplicates: u32 = seen.values().map(|n| n.saturating_sub(1)).sum();
        // Informational (timing is a benchmark concern, not an assertion).
        println!("all {M} delivered after draining; duplicates {duplicates}; longest gap between arrivals {max_gap:?}");
        drop(collector);
        drop(rejecter);
        for q in [&source, &target] {
            ch.queue_delete(q.as_str().into(), Default::default()).await?;
        }
        ch.exchange_delete(dlx.as_str().into(), Default::default()).await?;
        close_connection(&conn).await?;
        Ok(())
    })
    .await
}
