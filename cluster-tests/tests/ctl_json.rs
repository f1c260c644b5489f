//! `quorumqctl --formatter json` against a real single-node quorumq:
//! `list_queues` shows a quorum queue's placement (leader, members, online)
//! and counts, `cluster_status` shows the node running and leading the meta
//! group, and an unknown formatter is refused.
//!
//! Needs `cargo build --bin quorumq --bin quorumqctl` first (quorumqctl is
//! found as `QUORUMQCTL_BIN`, else next to `QUORUMQ_BIN`, else in
//! `target/debug/`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use cluster_tests::*;
use lapin::BasicProperties;
use serde_json::{json, Value};

const T: Duration = TEST_TIMEOUT;

fn quorumqctl_bin() -> PathBuf {
    if let Ok(p) = std::env::var("QUORUMQCTL_BIN") {
        return PathBuf::from(p);
    }
    if let Ok(p) = std::env::var(BIN_ENV) {
        if let Some(dir) = Path::new(&p).parent() {
            return dir.join("quorumqctl");
        }
    }
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../target/debug")
        .join("quorumqctl")
}

/// Runs `quorumqctl --node <admin addr> ARGS` (≤ 30 s), returning its output
/// whatever its exit status.
async fn ctl_output(broker: &Broker, args: &[&str]) -> anyhow::Result<Output> {
    let bin = quorumqctl_bin();
    if !bin.exists() {
        bail!(
            "quorumqctl not found at {} (cargo build --bin quorumqctl)",
            bin.display()
        );
    }
    let node = broker
        .admin_addr()
        .ok_or_else(|| anyhow!("spawned broker without admin address"))?;
    let mut cmd = Command::new(&bin);
    cmd.arg("--node").arg(node).args(args).stdin(Stdio::null());
    let shown = format!("quorumqctl {}", args.join(" "));
    tokio::time::timeout(
        Duration::from_secs(30),
        tokio::task::spawn_blocking(move || cmd.output()),
    )
    .await
    .map_err(|_| anyhow!("`{shown}` timed out"))??
    .with_context(|| format!("running `{shown}`"))
}

/// Runs quorumqctl, requires success and parses its stdout as JSON.
async fn ctl_json(broker: &Broker, args: &[&str]) -> anyhow::Result<Value> {
    let out = ctl_output(broker, args).await?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "quorumqctl {args:?} failed ({}): {stdout}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    serde_json::from_str(&stdout).with_context(|| format!("quorumqctl {args:?} printed {stdout}"))
}

/// `127.0.0.1:PORT` of an `amqp://user:pass@127.0.0.1:PORT/vhost` URI.
fn host_port(uri: &str) -> &str {
    let rest = uri.rsplit('@').next().unwrap_or(uri);
    rest.split('/').next().unwrap_or(rest)
}

#[tokio::test]
async fn list_queues_json_shows_the_quorum_queue_led_by_node_1() {
    bounded(T, async {
        let broker = Broker::spawn().await?;
        let conn = connect(broker.uri()).await?;
        let ch = confirm_channel(&conn).await?;
        let q = unique("ctl-json");
        ch.queue_declare(q.as_str().into(), durable(), quorum_args(&[]))
            .await?;
        for body in [b"one".as_slice(), b"two".as_slice()] {
            publish_confirmed(&ch, "", &q, body, BasicProperties::default()).await?;
        }

        let rows = ctl_json(&broker, &["list_queues", "--formatter", "json"]).await?;
        let rows = rows.as_array().context("list_queues JSON is an array")?;
        let row = rows
            .iter()
            .find(|r| r["name"] == q.as_str())
            .with_context(|| format!("{q} in {rows:?}"))?;
        assert_eq!(
            *row,
            json!({
                "name": q, "vhost": "/", "type": "quorum",
                "leader": 1, "members": [1], "online": [1],
                "messages_ready": 2, "messages_unacknowledged": 0,
                "consumers": 0, "dead_letter_held": 0, "policy": "",
            })
        );

        // The table keeps its columns and appends the placement.
        let table = ctl_output(&broker, &["list_queues"]).await?;
        assert!(table.status.success());
        let table = String::from_utf8_lossy(&table.stdout).into_owned();
        let line = table
            .lines()
            .find(|l| l.starts_with(&format!("{q}\t")))
            .with_context(|| format!("{q} in table {table}"))?;
        assert_eq!(
            line.split('\t').collect::<Vec<_>>(),
            [q.as_str(), "quorum", "2", "0", "0", "0", "", "1", "1", "1"]
        );

        close_connection(&conn).await?;
        Ok::<_, anyhow::Error>(())
    })
    .await
    .expect("list_queues --formatter json");
}

#[tokio::test]
async fn cluster_status_json_shows_node_1_running_and_leading() {
    bounded(T, async {
        let broker = Broker::spawn().await?;
        let admin = broker.admin_addr().context("admin address")?;
        let status = ctl_json(&broker, &["cluster_status", "--formatter", "json"]).await?;
        assert_eq!(
            status,
            json!({
                "nodes": [{
                    "id": 1,
                    "cluster_addr": admin.trim_start_matches("http://"),
                    "amqp_addr": host_port(broker.uri()),
                    "running": true,
                }],
                "running_nodes": [1],
                "meta_leader": 1,
            })
        );
        Ok::<_, anyhow::Error>(())
    })
    .await
    .expect("cluster_status --formatter json");
}

#[tokio::test]
async fn an_unknown_formatter_is_an_error() {
    bounded(T, async {
        let broker = Broker::spawn().await?;
        let out = ctl_output(&broker, &["list_queues", "--formatter", "xml"]).await?;
        assert!(!out.status.success(), "--formatter xml accepted");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("xml"), "{stderr}");
        assert!(
            out.stdout.is_empty(),
            "printed {:?}",
            String::from_utf8_lossy(&out.stdout)
        );
        Ok::<_, anyhow::Error>(())
    })
    .await
    .expect("unknown formatter");
}
