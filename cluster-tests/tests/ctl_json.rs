//! `quorumqctl --formatter json` against a real single-node quorumq:
//! `list_queues` shows a quorum queue's placement (leader, members, online)
//! and counts, `cluster_status` shows the node running and leading the meta
//! group, and an unknown formatter is refused.
//!
//! Needs `cargo build --bin quorumq --bin quorumqctl` first (quorumqctl is
//! found as `QUORUMQCTL_BIN`, else next to `QUORUMQ_BIN`, else in
//! `target/debug/`).

use std::time::Duration;

use anyhow::Context;
use cluster_tests::*;
use lapin::BasicProperties;
use serde_json::{json, Value};

const T: Duration = TEST_TIMEOUT;

/// `quorumqctl --node <broker's admin addr> ARGS` as a command line.
fn quorumqctl(broker: &Broker, args: &[&str]) -> anyhow::Result<Vec<String>> {
    let admin = broker
        .admin_addr()
        .context("spawned broker without admin address")?;
    Ok(dlx::quorumqctl(&admin, args))
}

/// Runs quorumqctl, requires success and parses its stdout as JSON.
async fn ctl_json(broker: &Broker, args: &[&str]) -> anyhow::Result<Value> {
    let stdout = dlx::run(quorumqctl(broker, args)?, dlx::CTL_TIMEOUT).await?;
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
                "unreadable_bodies": 0, "below_quorum": false,
                "messages_delayed": 0,
            })
        );

        // The table keeps its columns and appends the placement.
        let table = dlx::run(quorumqctl(&broker, &["list_queues"])?, dlx::CTL_TIMEOUT).await?;
        let line = table
            .lines()
            .find(|l| l.starts_with(&format!("{q}\t")))
            .with_context(|| format!("{q} in table {table}"))?;
        assert_eq!(
            line.split('\t').collect::<Vec<_>>(),
            [
                q.as_str(),
                "quorum",
                "2",
                "0",
                "0",
                "0",
                "",
                "1",
                "1",
                "1",
                "0",
                "false",
                "0"
            ]
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
        let mut status = ctl_json(&broker, &["cluster_status", "--formatter", "json"]).await?;
        // Seconds since start: whatever it is, a number.
        let uptime = status["nodes"][0]["uptime_s"].take();
        assert!(uptime.is_u64(), "uptime_s {uptime}");
        assert_eq!(
            status,
            json!({
                "nodes": [{
                    "id": 1,
                    "cluster_addr": admin.trim_start_matches("http://"),
                    "amqp_addr": host_port(broker.uri()),
                    "running": true,
                    "version": env!("CARGO_PKG_VERSION"),
                    "uptime_s": null,
                    "leaders": 0,
                    "replicas": 0,
                    "draining": false,
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
        let cmd = quorumqctl(&broker, &["list_queues", "--formatter", "xml"])?;
        let out = dlx::output(cmd, dlx::CTL_TIMEOUT).await?;
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
