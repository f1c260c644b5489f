//! The fault suite's history: every client operation, fault and heal with its
//! time since the run started, kept in memory for the checker and written as
//! one JSON line per record (`{"t_ms":12,"op":"publish","id":7,"node":2}`).

use anyhow::Context;
use serde::{Deserialize, Serialize};
use std::{
    fs::File,
    io::{BufWriter, Write},
    path::Path,
    sync::Mutex,
    time::Instant,
};

/// What a consumer did with a delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    /// basic.ack.
    Ack,
    /// basic.reject, requeue = false (dead-letters it, reason `rejected`).
    Reject,
    /// basic.nack, requeue = true (counts toward `x-delivery-limit`).
    Requeue,
    /// The settle failed (the channel or connection was gone).
    Failed,
}

/// The first `x-death` entry of a dead-lettered delivery (RabbitMQ dlx.md).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Death {
    /// `reason`: rejected, expired, maxlen or delivery_limit.
    pub reason: String,
    /// `count`: times dead-lettered from that queue for that reason.
    pub count: i64,
    /// `queue`: the queue it was dead-lettered from.
    pub queue: String,
}

/// One operation or event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum Op {
    /// basic.publish of message `id` through `node`.
    Publish { id: u64, node: u64 },
    /// The broker confirmed `id` (basic.ack).
    Confirmed { id: u64, node: u64 },
    /// The broker refused `id` (basic.nack).
    Nacked { id: u64, node: u64 },
    /// No confirm: the connection failed or the confirm timed out.
    Unknown { id: u64, node: u64, error: String },
    /// A delivery of `id` from `queue` through `node`, and what the consumer did.
    Delivered {
        id: u64,
        node: u64,
        queue: String,
        redelivered: bool,
        action: Action,
        death: Option<Death>,
    },
    /// A fault began (`kind` as in `--nemesis`, the nodes it hit, details).
    Fault {
        kind: String,
        targets: Vec<u64>,
        detail: String,
    },
    /// The fault of `kind` was healed.
    Healed { kind: String },
}

/// An [`Op`] at `t_ms` milliseconds since the run started.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// Milliseconds since the history was created.
    pub t_ms: u64,
    /// What happened.
    #[serde(flatten)]
    pub op: Op,
}

/// A history being written by many client tasks at once.
pub struct History {
    start: Instant,
    records: Mutex<Vec<Record>>,
    file: Mutex<BufWriter<File>>,
}

impl History {
    /// A history writing its JSON lines to `path` (created or truncated).
    ///
    /// Errors: the file could not be created.
    pub fn create(path: &Path) -> anyhow::Result<History> {
        let file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
        Ok(History {
            start: Instant::now(),
            records: Mutex::new(Vec::new()),
            file: Mutex::new(BufWriter::new(file)),
        })
    }

    /// Milliseconds since the history was created.
    pub fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    /// Records `op` now.
    pub fn log(&self, op: Op) {
        let rec = Record {
            t_ms: self.now_ms(),
            op,
        };
        if let Ok(line) = serde_json::to_string(&rec) {
            let mut f = self.file.lock().unwrap_or_else(|p| p.into_inner());
            // A failed history write must not stop the run; the in-memory copy is what is checked.
            let _ = writeln!(f, "{line}");
        }
        self.records
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(rec);
    }

    /// Every record so far, in the order they were logged.
    pub fn records(&self) -> Vec<Record> {
        self.records
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Writes buffered lines to the file.
    ///
    /// Errors: the write failed.
    pub fn flush(&self) -> anyhow::Result<()> {
        self.file
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .flush()
            .context("flushing the history")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_one_json_line_each_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.jsonl");
        let h = History::create(&path).unwrap();
        h.log(Op::Publish { id: 7, node: 2 });
        h.log(Op::Delivered {
            id: 7,
            node: 1,
            queue: "q".into(),
            redelivered: false,
            action: Action::Ack,
            death: Some(Death {
                reason: "rejected".into(),
                count: 1,
                queue: "src".into(),
            }),
        });
        h.flush().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(
            lines[0].contains(r#""op":"publish","id":7,"node":2"#),
            "{}",
            lines[0]
        );
        let back: Vec<Record> = lines
            .iter()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(back, h.records());
    }
}
