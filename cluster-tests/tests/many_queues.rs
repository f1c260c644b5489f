//! Many queues while a member lags (issue 31 item 2): 3 nodes, node 3
//! SIGSTOPped while node 1 declares [`QUEUES`] quorum queues (3 replicas
//! each), then SIGCONTinued. Node 3 opens its replicas late, and node 1 had
//! replicated to groups node 3 had not opened: before issue 31 every failed
//! append was logged (a line or three per group per retry; 23.6 million
//! lines at 10,000 queues). Asserts that each node wrote fewer log lines
//! during the run than there are queues (repeated lines are rate-limited
//! and summarised, `cluster/log_limit.rs`), and that every queue ends with a
//! leader and all three members holding a replica.

use std::time::Duration;

use cluster_tests::cluster::{declare_durable, wait_until_some, Cluster};
use cluster_tests::{connect, quorum_args};
use serde_json::Value;

/// Queues declared (a debug build declares a few hundred in seconds).
const QUEUES: usize = 300;

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
    // Node 3 lists every queue with a leader and three members (its replicas
    // learn the leader from its first append after they opened).
    let listed = wait_until_some(
        Duration::from_secs(60),
        "node 3 listing every queue with a leader and three members",
        || async {
            let out = cluster
                .ctl(3, &["list_queues", "--formatter", "json"])
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
    eprintln!("node 3 lists {listed} queues, each with a leader and three members");
    // A few more seconds for whatever retries are still under way.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for id in 1..=3 {
        let written = log_lines(&cluster, id)? - before[id as usize - 1];
        eprintln!("node {id}: {written} log lines during {QUEUES} declares with node 3 lagging");
        assert!(
            written < QUEUES,
            "node {id} wrote {written} log lines for {QUEUES} queues: a repeated condition is \
             logged per group\n{}",
            cluster.log_tail(id, 3000)
        );
    }
    Ok(())
}
