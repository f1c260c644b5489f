//! Many queues while a member lags (issue 31 item 2): 3 nodes, node 3
//! SIGSTOPped while node 1 declares [`QUEUES`] quorum queues (3 replicas
//! each), then SIGCONTinued. Node 3 opens its replicas late, and node 1 had
//! replicated to groups node 3 had not opened: before issue 31 every failed
//! append was logged (a line or three per group per retry; 23.6 million
//! lines at 10,000 queues). Asserts that no node logged more than
//! [`MAX_PER_SECOND`] lines about one condition in any second (repeated lines
//! are rate-limited and summarised, `cluster/log_limit.rs`), and that every
//! queue ends with a leader and all three members holding a replica.

use std::time::Duration;

use cluster_tests::cluster::{declare_durable, wait_until_some, Cluster};
use cluster_tests::{connect, quorum_args};
use serde_json::Value;

/// Queues declared (a debug build declares a few hundred in seconds).
const QUEUES: usize = 300;

/// Most lines one node may log about one condition in one second
/// (`log_limit::BURST` per window; a window is a second from its first line,
/// so two of them can share one calendar second, plus a summary).
const MAX_PER_SECOND: usize = 11;

/// A log line without its ANSI colours.
fn plain(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The condition (level, target and message with numbers blanked) logged
/// most often within one second of `lines` (tracing's format: time, level,
/// target, message), that second and the count.
fn busiest_condition(lines: &[&str]) -> (String, String, usize) {
    let mut counts: std::collections::HashMap<(String, String), usize> = Default::default();
    for line in lines {
        let line = plain(line);
        let mut words = line.split_whitespace();
        let (Some(time), Some(level), Some(target)) = (words.next(), words.next(), words.next())
        else {
            continue;
        };
        // The limiter's own summaries (one per callsite per 5 s) are not a condition.
        if time.len() < 19 || !time.starts_with("20") || target == "log_limit:" {
            continue;
        }
        let message: String = words
            .take(4)
            .collect::<Vec<_>>()
            .join(" ")
            .chars()
            .map(|c| if c.is_ascii_digit() { '#' } else { c })
            .collect();
        let key = (
            format!("{level} {target} {message}"),
            time[..19].to_string(),
        );
        *counts.entry(key).or_default() += 1;
    }
    counts
        .into_iter()
        .max_by_key(|(_, n)| *n)
        .map(|((c, s), n)| (c, s, n))
        .unwrap_or_default()
}

/// Lines in node `id`'s log so far.
fn log_lines(cluster: &Cluster, id: u64) -> anyhow::Result<usize> {
    let text = std::fs::read(cluster.root().join(format!("node-{id}.log")))?;
    Ok(text.iter().filter(|b| **b == b'\n').count())
}

/// (leaders, replicas) of each node, as `cluster_status` through node `via` reports them.
async fn placement(cluster: &Cluster, via: u64) -> anyhow::Result<Vec<(u64, u64, u64)>> {
    let out = cluster
        .ctl(via, &["cluster_status", "--formatter", "json"])
        .await?;
    let v: Value = serde_json::from_str(&out)?;
    let nodes = v["nodes"]
        .as_array()
        .ok_or_else(|| anyhow::anyhow!("no nodes in {out}"))?;
    Ok(nodes
        .iter()
        .map(|n| {
            (
                n["id"].as_u64().unwrap_or(0),
                n["leaders"].as_u64().unwrap_or(0),
                n["replicas"].as_u64().unwrap_or(0),
            )
        })
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_member_is_waited_for_quietly_and_opens_every_replica() -> anyhow::Result<()> {
    let cluster = Cluster::start(3).await?;
    let conn = connect(&cluster.uri(1)).await?;
    let ch = conn.create_channel().await?;
    // The meta group has a leader once the first declare succeeds.
    declare_durable(&ch, "many.warmup", quorum_args(&[])).await?;
    let before: Vec<usize> = (1..=3)
        .map(|id| log_lines(&cluster, id))
        .collect::<anyhow::Result<_>>()?;

    cluster.sigstop(3)?;
    for i in 0..QUEUES {
        declare_durable(&ch, &format!("many.{i}"), quorum_args(&[])).await?;
    }
    // Node 1 keeps appending to groups node 3 holds but does not answer for.
    tokio::time::sleep(Duration::from_secs(3)).await;
    cluster.sigcont(3)?;

    let total = QUEUES as u64 + 1;
    let settled = wait_until_some(
        Duration::from_secs(90),
        "every queue led, and every node holding every replica",
        || async {
            let p = placement(&cluster, 1).await?;
            let leaders: u64 = p.iter().map(|(_, l, _)| l).sum();
            let full = p.len() == 3 && p.iter().all(|(_, _, r)| *r == total);
            Ok((leaders == total && full).then_some(p))
        },
    )
    .await?;
    eprintln!("placement (node, leaders, replicas): {settled:?}");
    // Node 2 lists every queue with a leader and three members.
    let listed = wait_until_some(
        Duration::from_secs(60),
        "node 2 listing every queue with a leader and three members",
        || async {
            let out = cluster
                .ctl(2, &["list_queues", "--formatter", "json"])
                .await?;
            let queues: Vec<Value> = serde_json::from_str(&out)?;
            let led = queues
                .iter()
                .filter(|q| {
                    q["leader"].as_u64().is_some()
                        && q["members"].as_array().map(Vec::len) == Some(3)
                })
                .count();
            Ok((queues.len() == QUEUES + 1 && led == queues.len()).then_some(led))
        },
    )
    .await?;
    eprintln!("node 2 lists {listed} queues, each with a leader and three members");
    // A few more seconds for whatever retries are still under way.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for id in 1..=3 {
        let text = std::fs::read_to_string(cluster.root().join(format!("node-{id}.log")))?;
        let lines: Vec<&str> = text.lines().skip(before[id as usize - 1]).collect();
        let (condition, second, n) = busiest_condition(&lines);
        eprintln!(
            "node {id}: {} log lines during {QUEUES} declares with node 3 lagging; at most {n} \
             in one second about one condition ({condition} at {second})",
            lines.len()
        );
        assert!(
            n <= MAX_PER_SECOND,
            "node {id} logged {n} lines in second {second} about '{condition}' (at most \
             {MAX_PER_SECOND}: a repeated condition is rate-limited)\n{}",
            cluster.log_tail(id, 3000)
        );
    }
    Ok(())
}
