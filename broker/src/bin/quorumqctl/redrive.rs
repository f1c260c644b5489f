//! `redrive [--vhost V] QUEUE [--to DEST] [--max N] [--rate MSG_PER_S]`:
//! moves QUEUE's ready messages back to the queue each one last died in (or
//! to DEST), at-least-once (SQS `StartMessageMoveTask`, RabbitMQ's "move
//! messages"). The node that leads QUEUE does the work and streams progress.

use std::io::{IsTerminal, Write};

use anyhow::bail;
use serde_json::{json, Value};

use crate::output::{banner, cell, emit, to_json, Formatter};
use crate::Client;

/// Runs the redrive and prints its summary. While it runs, a progress line
/// goes to stderr when stderr is a terminal. JSON: `{"queue", "vhost",
/// "moved", "by_destination": {queue: n}, "skipped": {reason: n},
/// "elapsed_ms"}`; table: `key<TAB>value` lines (`by_destination.Q`,
/// `skipped.REASON`).
///
/// Errors (non-zero exit; JSON: `{"result":"error","message"}` on stdout):
/// no such queue or destination, a bad `--rate`, no leader, a redrive
/// stopped part-way (the text says how many were moved; nothing is lost).
pub async fn redrive(
    c: &mut Client,
    f: Formatter,
    vhost: &str,
    queue: &str,
    to: Option<String>,
    max: Option<u64>,
    rate: Option<f64>,
) -> anyhow::Result<()> {
    let to_text = to.as_deref().map_or_else(
        || "the queues they died in".to_string(),
        |d| format!("queue {d}"),
    );
    banner(
        f,
        &format!("Redriving messages of queue {queue} in vhost {vhost} to {to_text} ...\n"),
    );
    let opts = quorumq::admin::redrive::Options { to, max, rate };
    let mut stream = c
        .redrive(quorumq::admin::redrive::request(vhost, queue, &opts, false))
        .await?
        .into_inner();
    let tty = std::io::stderr().is_terminal();
    let mut shown = false;
    let result = loop {
        let Some(r) = stream.message().await? else {
            break Err("the node ended the redrive without a summary".to_string());
        };
        if !r.ok {
            break Err(r.error);
        }
        let doc: Value = serde_json::from_str(&r.json)?;
        if doc["done"] == Value::Bool(true) {
            break Ok(doc);
        }
        if tty {
            let skipped: u64 = doc["skipped"]
                .as_object()
                .map(|m| m.values().filter_map(Value::as_u64).sum())
                .unwrap_or(0);
            let mut err = std::io::stderr().lock();
            let _ = write!(
                err,
                "\rmoved {}, skipped {skipped}, {:.1} s",
                doc["moved"],
                doc["elapsed_ms"].as_u64().unwrap_or(0) as f64 / 1000.0
            );
            let _ = err.flush();
            shown = true;
        }
    };
    if shown {
        eprintln!();
    }
    let mut doc = match result {
        Ok(doc) => doc,
        Err(message) => {
            if f == Formatter::Json {
                emit(&format!(
                    "{}\n",
                    to_json(&json!({"result": "error", "message": message}))
                ));
                std::process::exit(1);
            }
            bail!("{message}");
        }
    };
    if let Value::Object(m) = &mut doc {
        m.remove("done");
    }
    match f {
        Formatter::Json => emit(&format!("{}\n", to_json(&doc))),
        Formatter::Table => emit(&summary_table(&doc)),
    }
    Ok(())
}

/// The table layout of a summary: `key<TAB>value` lines, maps flattened.
fn summary_table(v: &Value) -> String {
    let mut out = String::from("keys\tvalues\n");
    for key in [
        "queue",
        "vhost",
        "moved",
        "by_destination",
        "skipped",
        "elapsed_ms",
    ] {
        match &v[key] {
            Value::Object(m) => {
                for (k, n) in m {
                    out += &format!("{key}.{k}\t{}\n", cell(n));
                }
            }
            other => out += &format!("{key}\t{}\n", cell(other)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::testing::cells;

    #[test]
    fn summary_table_flattens_destinations_and_reasons() {
        let v = json!({"queue": "dlq", "vhost": "/", "moved": 3,
            "by_destination": {"a": 1, "b": 2}, "skipped": {"source_queue_not_found": 1},
            "elapsed_ms": 12});
        let text = summary_table(&v);
        let rows = cells(&text);
        assert!(rows.contains(&vec!["moved", "3"]));
        assert!(rows.contains(&vec!["by_destination.b", "2"]));
        assert!(rows.contains(&vec!["skipped.source_queue_not_found", "1"]));
        assert!(rows.contains(&vec!["elapsed_ms", "12"]));
    }
}
