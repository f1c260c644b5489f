//! Looking into a queue without consuming: `peek` (rabbitmq-queues peek) and
//! `inspect_dead_letters` (the dead letters it holds, by reason and source).

use anyhow::bail;
use quorumq_proto::v1::{JsonReply, QueueReadRequest};
use serde_json::{json, Value};

use crate::output::{banner, cell, emit, to_json, Formatter};
use crate::Client;

/// Asks the node for `what` of `queue`; prints a failure as RabbitMQ does
/// (JSON: `{"result":"error","message"}` on stdout) and exits non-zero.
async fn read(
    c: &mut Client,
    f: Formatter,
    vhost: &str,
    queue: &str,
    what: &str,
    position: u64,
) -> anyhow::Result<Value> {
    let r: JsonReply = c
        .queue_read(QueueReadRequest {
            vhost: vhost.to_string(),
            queue: queue.to_string(),
            what: what.to_string(),
            position,
            forwarded: false,
        })
        .await?
        .into_inner();
    if !r.ok {
        if f == Formatter::Json {
            emit(&format!(
                "{}\n",
                to_json(&json!({"result": "error", "message": r.error}))
            ));
            std::process::exit(1);
        }
        bail!("{}", r.error);
    }
    Ok(serde_json::from_str(&r.json)?)
}

/// `peek [--vhost V] QUEUE POSITION`: the ready message at 1-based POSITION in
/// delivery order, left in place. JSON: one item of the management API's
/// `POST /api/queues/{vhost}/{name}/get` reply; table: `key<TAB>value` lines
/// (properties as `properties.NAME`).
///
/// Errors (non-zero exit): POSITION below 1 ("position value must be a positive
/// integer"), no message there ("Target queue does not have a message at that
/// position"), no such queue, no leader.
pub async fn peek(
    c: &mut Client,
    f: Formatter,
    vhost: &str,
    queue: &str,
    position: i64,
) -> anyhow::Result<()> {
    let position = match u64::try_from(position) {
        Ok(p) if p >= 1 => p,
        _ => bail!("position value must be a positive integer"),
    };
    banner(
        f,
        &format!("Peeking at quorum queue {queue} at position {position} in vhost {vhost} ...\n"),
    );
    let v = read(c, f, vhost, queue, "peek", position).await?;
    match f {
        Formatter::Json => emit(&format!("{}\n", to_json(&v))),
        Formatter::Table => {
            let mut out = String::from("keys\tvalues\n");
            if let Value::Object(m) = &v {
                for (k, val) in m {
                    match (k.as_str(), val) {
                        ("properties", Value::Object(p)) => {
                            for (pk, pv) in p {
                                out += &format!("properties.{pk}\t{}\n", table_value(pv));
                            }
                        }
                        _ => out += &format!("{k}\t{}\n", table_value(val)),
                    }
                }
            }
            emit(&out);
        }
    }
    Ok(())
}

fn table_value(v: &Value) -> String {
    match v {
        Value::Object(_) => v.to_string(),
        v => cell(v),
    }
}

/// `inspect_dead_letters [--vhost V] QUEUE`: the messages QUEUE holds counted
/// by the reason and source queue of their last death, the oldest and newest
/// such death (ISO 8601 UTC), and the at-least-once dead letters it holds
/// as a source queue by why they are held. JSON: the node's document as is.
///
/// Errors: no such queue, no leader.
pub async fn inspect(c: &mut Client, f: Formatter, vhost: &str, queue: &str) -> anyhow::Result<()> {
    banner(
        f,
        &format!("Inspecting dead letters of queue {queue} in vhost {vhost} ...\n"),
    );
    let v = read(c, f, vhost, queue, "dead_letters", 0).await?;
    match f {
        Formatter::Json => emit(&format!("{}\n", to_json(&v))),
        Formatter::Table => emit(&inspect_table(&v)),
    }
    Ok(())
}

/// The table layout of an inspect document: `key<TAB>value` lines, maps as
/// `by_reason.REASON<TAB>n`.
fn inspect_table(v: &Value) -> String {
    let mut out = String::from("keys\tvalues\n");
    let put = |prefix: &str, v: &Value, out: &mut String| match v {
        Value::Object(m) => {
            for (k, n) in m {
                *out += &format!("{prefix}.{k}\t{}\n", table_value(n));
            }
        }
        v => *out += &format!("{prefix}\t{}\n", cell(v)),
    };
    for key in [
        "queue",
        "vhost",
        "messages",
        "by_reason",
        "by_source_queue",
        "oldest_death",
        "newest_death",
        "without_death",
        "unreadable",
    ] {
        put(key, &v[key], &mut out);
    }
    put("held.messages", &v["held"]["messages"], &mut out);
    put("held.by_reason", &v["held"]["by_reason"], &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::testing::cells;

    #[test]
    fn inspect_table_flattens_the_maps() {
        let v = json!({"queue": "dlq", "vhost": "/", "messages": 3,
            "by_reason": {"expired": 1, "rejected": 2}, "by_source_queue": {"a": 3},
            "oldest_death": "2026-11-26T11:15:27Z", "newest_death": null,
            "without_death": 0, "unreadable": 0,
            "held": {"messages": 2, "by_reason": {"target_full": 2}}});
        let text = inspect_table(&v);
        let rows = cells(&text);
        assert!(rows.contains(&vec!["by_reason.rejected", "2"]));
        assert!(rows.contains(&vec!["by_source_queue.a", "3"]));
        assert!(rows.contains(&vec!["newest_death", ""]));
        assert!(rows.contains(&vec!["held.by_reason.target_full", "2"]));
    }
}
