//! Quorum queue health, as rabbitmq-queues / rabbitmq-diagnostics: `quorum_status`,
//! `check_if_node_is_quorum_critical`, `check_for_quorum_queues_without_an_elected_leader`.
//! A failed check prints its queues and exits with 69 (EX_UNAVAILABLE), as RabbitMQ's CLI.

use anyhow::bail;
use quorumq_proto::v1::{
    JsonReply, LeaderlessRequest, QueueReadRequest, QuorumCriticalRequest, StatusRequest,
};
use serde_json::{json, Value};

use crate::output::{banner, emit, listing, to_json, Formatter, Row};
use crate::Client;

/// Exit status of a failed health check (RabbitMQ CLI `:check_failed`, EX_UNAVAILABLE).
pub const CHECK_FAILED: i32 = 69;

/// `quorum_status [--vhost V] QUEUE`: one row per member — node, Raft state, online,
/// term, last log index, last applied, commit index (leader), snapshot index, match
/// index and lag (entries behind the leader's log) and last contact (ms since the
/// answering node last heard from it). JSON: `{"queue","vhost","leader","members":[..]}`.
///
/// Errors: no such queue, not a quorum queue.
pub async fn quorum_status(
    c: &mut Client,
    f: Formatter,
    vhost: &str,
    queue: &str,
) -> anyhow::Result<()> {
    banner(
        f,
        &format!("Status of quorum queue {queue} in vhost {vhost} ...\n"),
    );
    let r = c
        .queue_read(QueueReadRequest {
            vhost: vhost.to_string(),
            queue: queue.to_string(),
            what: "quorum_status".into(),
            position: 0,
            forwarded: false,
        })
        .await?
        .into_inner();
    if !r.ok {
        bail!("{}", r.error);
    }
    let v: Value = serde_json::from_str(&r.json)?;
    const COLUMNS: [&str; 11] = [
        "node",
        "raft_state",
        "online",
        "term",
        "last_log_index",
        "last_applied",
        "commit_index",
        "snapshot_index",
        "match_index",
        "lag",
        "last_contact_ms",
    ];
    match f {
        Formatter::Json => emit(&format!("{}\n", to_json(&v))),
        Formatter::Table => {
            let rows: Vec<Row> = v["members"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|m| Row(COLUMNS.iter().map(|k| (*k, m[*k].clone())).collect()))
                .collect();
            emit(&listing(f, &COLUMNS, &rows));
        }
    }
    Ok(())
}

/// Prints a check's outcome: ok → its message (JSON `{"result":"ok","message"}`);
/// failed → one line per queue (`line(readable_name)`) or JSON
/// `{"result":"error","queues","message"}`, and exit [`CHECK_FAILED`].
fn check_outcome(f: Formatter, r: JsonReply, line: impl Fn(&str) -> String) -> anyhow::Result<()> {
    if r.ok {
        let v: Value = serde_json::from_str(&r.json)?;
        match f {
            Formatter::Json => emit(&format!("{}\n", to_json(&v))),
            Formatter::Table => emit(&format!("{}\n", v["message"].as_str().unwrap_or("ok"))),
        }
        return Ok(());
    }
    let queues: Value = serde_json::from_str(&r.json).unwrap_or(Value::Array(Vec::new()));
    match f {
        Formatter::Json => emit(&format!(
            "{}\n",
            to_json(&json!({"result": "error", "queues": queues, "message": r.error}))
        )),
        Formatter::Table => {
            let mut out = String::new();
            for q in queues.as_array().into_iter().flatten() {
                out += &line(q["readable_name"].as_str().unwrap_or_default());
                out.push('\n');
            }
            if out.is_empty() {
                out = format!("{}\n", r.error);
            }
            emit(&out);
        }
    }
    std::process::exit(CHECK_FAILED);
}

/// `check_if_node_is_quorum_critical [NODE]` (NODE: an id, default the node asked):
/// exit 0 when no quorum queue would lose its majority if NODE stopped, else the
/// queues, one "queue 'q' in vhost '/' would lose quorum if node N is stopped"
/// line each, and exit 69.
///
/// Errors: the call fails.
pub async fn quorum_critical(
    c: &mut Client,
    f: Formatter,
    node: Option<u64>,
) -> anyhow::Result<()> {
    let node = match node {
        Some(n) => n,
        None => c.status(StatusRequest {}).await?.into_inner().node_id,
    };
    banner(
        f,
        &format!("Checking if node {node} is critical for quorum of any quorum queues ...\n"),
    );
    let r = c
        .quorum_critical(QuorumCriticalRequest { node })
        .await?
        .into_inner();
    check_outcome(f, r, |q| {
        format!("{q} would lose quorum if node {node} is stopped")
    })
}

/// `check_for_quorum_queues_without_an_elected_leader [--across-all-vhosts] [PATTERN]`
/// (rabbitmq-diagnostics 4.1): exit 0 when every matching quorum queue has an
/// elected, reachable leader, else the queues, one "... does not have an elected
/// leader replica or the replica was unresponsive" line each, and exit 69.
///
/// Errors: an invalid PATTERN, the call fails.
pub async fn without_leader(
    c: &mut Client,
    f: Formatter,
    vhost: &str,
    across_all_vhosts: bool,
    pattern: &str,
) -> anyhow::Result<()> {
    if across_all_vhosts {
        banner(f, &format!("Checking leader replicas of quorum queues matching '{pattern}' in all vhosts ...\n"));
    } else {
        banner(f, &format!("Checking leader replicas of quorum queues matching '{pattern}' in vhost {vhost} ...\n"));
    }
    let r = c
        .queues_without_leader(LeaderlessRequest {
            vhost: vhost.to_string(),
            across_all_vhosts,
            pattern: pattern.to_string(),
        })
        .await?
        .into_inner();
    check_outcome(f, r, |q| {
        format!("{q} does not have an elected leader replica or the replica was unresponsive")
    })
}
