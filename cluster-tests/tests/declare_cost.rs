//! What a new quorum queue costs its members in write-ahead-log syncs
//! (issue 31 item 1: declares on three nodes are bound by CPU, and each
//! `fdatasync` costs a VM exit). Three nodes; [`QUEUES`] quorum queues
//! declared one after another through node 1; every node's WAL syncs
//! (`quorumq_wal_fsync_seconds_count`) counted from before the first declare
//! until every replica applied its group's first entries.
//!
//! A new queue needs two syncs per node: the meta entry that records it and
//! the seed of its replica (`cluster::bootstrap::seed_new_group`). Before the
//! seed held the leader's blank entry, openraft appended that entry when the
//! preferred leader started, and every follower appended and synced it: a
//! third sync per node per queue.
//!
//! Declares through the followers of the meta group reach its leader as
//! frames (`cluster::frames::PROPOSE`), and the leader hints followers whose
//! append is in flight of each commit (`cluster::commit_hints`): both are
//! counted in `/metrics` and checked here, since neither changes an outcome
//! a client sees, only how soon.

use std::collections::HashMap;
use std::time::Duration;

use cluster_tests::cluster::{declare_durable, wait_for, Cluster};
use cluster_tests::*;
use lapin::options::{BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions};
use lapin::BasicProperties;

/// Queues declared (a debug build declares a few hundred a second).
const QUEUES: usize = 100;

/// Most WAL syncs a node may make per declared queue: two, and some slack
/// for rounds the meta group or a late replica make on their own.
const MAX_SYNCS_PER_QUEUE: f64 = 2.5;

/// The body of `GET http://addr/path` (the Prometheus endpoints need no login).
fn get(addr: &str, path: &str) -> anyhow::Result<String> {
    let out = std::process::Command::new("curl")
        .args(["-s", "-S", "--max-time", "30"])
        .arg(format!("http://{addr}{path}"))
        .output()?;
    anyhow::ensure!(out.status.success(), "curl {path} failed");
    Ok(String::from_utf8(out.stdout)?)
}

/// The value of the unlabelled series `name` in a Prometheus text scrape.
fn value(scrape: &str, name: &str) -> Option<f64> {
    scrape.lines().find_map(|line| {
        let (series, v) = line.split_once(' ')?;
        (series == name).then(|| v.trim().parse().ok())?
    })
}

/// The sum of series `name` with label `label` (e.g. `via="frame"`), or of
/// the unlabelled `name`, in a Prometheus text scrape (0 when absent).
fn sum(scrape: &str, name: &str, label: Option<&str>) -> f64 {
    scrape
        .lines()
        .filter_map(|line| {
            let (series, v) = line.split_once(' ')?;
            let matches = match label {
                Some(l) => series.starts_with(&format!("{name}{{")) && series.contains(l),
                None => series == name,
            };
            matches.then(|| v.trim().parse::<f64>().ok())?
        })
        .fold(0.0, |a, b| a + b)
}

/// Three nodes, each restarted with an HTTP listener: the cluster and the
/// listeners' addresses, by node.
async fn cluster_with_http() -> anyhow::Result<(Cluster, Vec<String>)> {
    let cluster = Cluster::start(3).await?;
    let mut http = Vec::new();
    for id in 1..=3 {
        let addr = format!("127.0.0.1:{}", free_port()?);
        cluster.restart_with(id, &["--http-listen", &addr]).await?;
        http.push(addr);
    }
    Ok((cluster, http))
}

/// WAL sync rounds node `addr` made since it started.
fn syncs(addr: &str) -> anyhow::Result<f64> {
    let scrape = get(addr, "/metrics")?;
    value(&scrape, "quorumq_wal_fsync_seconds_count")
        .ok_or_else(|| anyhow::anyhow!("no WAL sync count on {addr}"))
}

/// Queues (named `prefix…`) whose replica on node `addr` applied log index 1
/// or later (the blank entry of their leader's first term).
fn applied_first_term(addr: &str, prefix: &str) -> anyhow::Result<usize> {
    let scrape = get(addr, "/metrics/per-object")?;
    let mut applied: HashMap<&str, f64> = HashMap::new();
    for line in scrape.lines() {
        let Some(rest) = line.strip_prefix("rabbitmq_raft_log_last_applied_index{") else {
            continue;
        };
        let Some((labels, v)) = rest.split_once("} ") else {
            continue;
        };
        let Some(queue) = labels
            .split("queue=\"")
            .nth(1)
            .and_then(|q| q.split('"').next())
        else {
            continue;
        };
        if queue.starts_with(prefix) {
            applied.insert(queue, v.trim().parse().unwrap_or(0.0));
        }
    }
    Ok(applied.values().filter(|v| **v >= 1.0).count())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_quorum_queue_costs_each_node_two_wal_syncs() -> anyhow::Result<()> {
    bounded(Duration::from_secs(300), async {
        let (cluster, http) = cluster_with_http().await?;
        let conn = cluster.ready_connection(1, "cost-warmup").await?;
        let ch = conn.create_channel().await?;
        // Every node up and its meta replica current: the warm-up queue's
        // replicas applied their first term.
        wait_for(
            Duration::from_secs(30),
            "the warm-up queue's replicas",
            || {
                let http = http.clone();
                async move {
                    http.iter()
                        .all(|a| applied_first_term(a, "cost-warmup").ok() == Some(1))
                }
            },
        )
        .await?;
        let before: Vec<f64> = http.iter().map(|a| syncs(a)).collect::<Result<_, _>>()?;
        for i in 0..QUEUES {
            declare_durable(&ch, &format!("cost-{i}"), quorum_args(&[])).await?;
        }
        // Counted once every replica holds its queue's first term: a sync
        // made for a declare later would only be counted against it.
        wait_for(Duration::from_secs(60), "every replica applied", || {
            let http = http.clone();
            async move {
                http.iter()
                    .all(|a| applied_first_term(a, "cost-").ok() == Some(QUEUES + 1))
            }
        })
        .await?;
        let after: Vec<f64> = http.iter().map(|a| syncs(a)).collect::<Result<_, _>>()?;
        for (node, (b, a)) in before.iter().zip(&after).enumerate() {
            let per_queue = (a - b) / QUEUES as f64;
            println!(
                "node {}: {} WAL syncs, {per_queue:.2} per queue",
                node + 1,
                a - b
            );
            assert!(
                per_queue <= MAX_SYNCS_PER_QUEUE,
                "node {} made {per_queue:.2} WAL syncs per declared queue",
                node + 1
            );
        }
        // The queues work: published through node 2, read through node 3.
        let pub_conn = connect(&cluster.uri(2)).await?;
        let pch = pub_conn.create_channel().await?;
        pch.confirm_select(ConfirmSelectOptions::default()).await?;
        let get_conn = connect(&cluster.uri(3)).await?;
        let gch = get_conn.create_channel().await?;
        for i in [0, QUEUES / 2, QUEUES - 1] {
            let q = format!("cost-{i}");
            let confirm = pch
                .basic_publish(
                    "".into(),
                    q.as_str().into(),
                    BasicPublishOptions::default(),
                    q.as_bytes(),
                    BasicProperties::default(),
                )
                .await?
                .await?;
            assert!(confirm.is_ack(), "publish to {q} confirmed");
            let got = gch
                .basic_get(q.as_str().into(), BasicGetOptions { no_ack: true })
                .await?
                .ok_or_else(|| anyhow::anyhow!("{q} is empty"))?;
            assert_eq!(got.delivery.data, q.as_bytes());
        }
        Ok(())
    })
    .await
}

/// Queue declares through every node: those through the meta group's
/// followers are forwarded as frames, never as unary calls, and the meta
/// leader queues commit hints for the follower still answering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_declares_go_as_frames_and_commits_are_hinted() -> anyhow::Result<()> {
    bounded(Duration::from_secs(300), async {
        let (cluster, http) = cluster_with_http().await?;
        const PER_NODE: usize = 30;
        for id in 1..=3 {
            let conn = cluster.ready_connection(id, "hint-warmup").await?;
            let ch = conn.create_channel().await?;
            for i in 0..PER_NODE {
                declare_durable(&ch, &format!("hint-{id}-{i}"), quorum_args(&[])).await?;
            }
        }
        let scrapes: Vec<String> = http
            .iter()
            .map(|a| get(a, "/metrics"))
            .collect::<Result<_, _>>()?;
        let total = |name: &str, label: Option<&str>| -> f64 {
            scrapes
                .iter()
                .map(|s| sum(s, name, label))
                .fold(0.0, |a, b| a + b)
        };
        let frames = total("quorumq_meta_writes_forwarded_total", Some("via=\"frame\""));
        let calls = total("quorumq_meta_writes_forwarded_total", Some("via=\"call\""));
        let hints = total("quorumq_meta_commit_hints_total", None);
        println!("forwarded meta writes: {frames} frames, {calls} calls; commit hints: {hints}");
        // Two of the three nodes follow the meta group: their declares (and
        // the warm-up declares) are forwarded.
        assert!(
            frames >= (2 * PER_NODE) as f64,
            "{frames} meta writes forwarded as frames"
        );
        assert_eq!(calls, 0.0, "no meta write forwarded as a unary call");
        assert!(hints > 0.0, "the meta leader queued no commit hint");
        Ok(())
    })
    .await
}
