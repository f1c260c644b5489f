//! Reads answered by a queue's leader, for operators: `peek` (RabbitMQ
//! `rabbitmq-queues peek`), `inspect_dead_letters` (the summary of
//! [`crate::dead_letter::summary`] plus the held dead letters of a source
//! queue) and `quorum_status` (RabbitMQ `rabbitmq-queues quorum_status`).
//! A node that does not lead the queue forwards the read to the leader once
//! (admin `QueueRead` with `forwarded`); the HTTP API and quorumqctl share
//! this entry point ([`queue_read`]). Nothing here changes the queue.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use quorumq_proto::v1::{JsonReply, QueueReadRequest};
use serde_json::{json, Value};

use crate::cluster::membership::admin_client;
use crate::dead_letter::summary::DeadLetterSummary;
use crate::message::{StoredMessage, TrackedMessage};
use crate::meta::{QueueKind, QueueRecord};
use crate::queue::handle::QueueHandle;
use crate::queue::registry::Queues;

/// How long a forwarded read, or one member's replica metrics, may take.
const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Bodies read under one lock of the queue by `inspect_dead_letters`.
const BODIES_PER_LOCK: usize = 256;

/// What a [`queue_read`] asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum What {
    /// The ready message at this 1-based position (delivery order).
    Peek(u64),
    /// The dead-letter summary of the queue's messages and held dead letters.
    DeadLetters,
    /// Every member's Raft state, as the leader sees it and as each reports it.
    QuorumStatus,
    /// The asked node's own replica (no forwarding): a piece of `QuorumStatus`.
    Replica,
}

impl What {
    /// From the admin request's `what` and `position`.
    ///
    /// Errors: an unknown `what` (the text of a 400).
    pub fn parse(what: &str, position: u64) -> Result<What, String> {
        Ok(match what {
            "peek" => What::Peek(position),
            "dead_letters" => What::DeadLetters,
            "quorum_status" => What::QuorumStatus,
            "replica" => What::Replica,
            other => return Err(format!("unknown queue read '{other}'")),
        })
    }

    fn name(self) -> &'static str {
        match self {
            What::Peek(_) => "peek",
            What::DeadLetters => "dead_letters",
            What::QuorumStatus => "quorum_status",
            What::Replica => "replica",
        }
    }
}

/// Why a read has no answer: the management API's HTTP status and the text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadError {
    /// 400 (bad position, no message there), 404 (no such queue), 503 (no leader).
    pub status: u16,
    /// The error text (RabbitMQ's where it has one).
    pub text: String,
}

fn err(status: u16, text: impl Into<String>) -> ReadError {
    ReadError {
        status,
        text: text.into(),
    }
}

/// RabbitMQ `rabbitmq-queues peek`'s text for a position past the last ready message.
pub const NO_MESSAGE_AT_POSITION: &str = "Target queue does not have a message at that position";

/// A read's outcome.
pub type ReadResult = Result<Value, ReadError>;

/// The admin reply of `r`.
pub fn to_reply(r: ReadResult) -> JsonReply {
    match r {
        Ok(v) => JsonReply {
            ok: true,
            error: String::new(),
            status: 0,
            json: v.to_string(),
        },
        Err(e) => JsonReply {
            ok: false,
            error: e.text,
            status: u32::from(e.status),
            json: String::new(),
        },
    }
}

/// The outcome carried by an admin reply.
pub fn from_reply(r: JsonReply) -> ReadResult {
    if !r.ok {
        return Err(err(u16::try_from(r.status).unwrap_or(500), r.error));
    }
    serde_json::from_str(&r.json).map_err(|e| err(500, format!("bad JSON reply: {e}")))
}

/// Answers `what` of queue `vhost`/`name` on its leader: here when this node
/// leads it, else forwarded once to the leader (`forwarded`: this node was
/// asked by another, do not forward again). `QuorumStatus` is answered by
/// any node when no leader is elected; `Replica` always by this node.
///
/// Errors: 404 "Target queue was not found in virtual host '{vhost}'"
/// (RabbitMQ's text), 400 for peek position 0 or past the last ready
/// message ([`NO_MESSAGE_AT_POSITION`]), 503 when no leader answers.
pub async fn queue_read(
    queues: &Arc<Queues>,
    vhost: &str,
    name: &str,
    what: What,
    forwarded: bool,
) -> ReadResult {
    if what == What::Peek(0) {
        return Err(err(400, "position value must be a positive integer"));
    }
    let not_found = || {
        err(
            404,
            format!("Target queue was not found in virtual host '{vhost}'"),
        )
    };
    // Declared through another node a moment ago: found after a catch-up.
    let rec = queues
        .find_record(vhost, name)
        .await
        .ok_or_else(not_found)?;
    let me = queues.node_id();
    let handle = queues.queue_by_group(rec.group_id);
    let local = handle.clone().filter(|h| h.has_replica());
    match what {
        What::Replica => return replica(queues, &rec, local.as_ref()),
        What::QuorumStatus if rec.kind != QueueKind::Quorum => {
            return Err(err(400, format!("'{name}' is not a quorum queue")))
        }
        _ => {}
    }
    if let Some(h) = local.as_ref().filter(|h| h.is_local_leader()) {
        return answer(queues, &rec, h, what).await;
    }
    let leader = match rec.kind {
        QueueKind::Local { node } => Some(node),
        QueueKind::Quorum => handle
            .as_ref()
            .and_then(|h| h.route())
            .and_then(|r| r.leader())
            .filter(|l| queues.detector().is_alive(*l)),
    };
    match leader {
        Some(l) if l != me && !forwarded => forward(queues, l, vhost, name, what).await,
        _ if what == What::QuorumStatus => quorum_status(queues, &rec).await,
        _ if forwarded => Err(err(503, "the queue's leader moved; try again")),
        _ => Err(err(
            503,
            format!("queue '{name}' in vhost '{vhost}' has no elected leader"),
        )),
    }
}

/// Asks node `to` (the leader) to answer the read itself.
async fn forward(queues: &Arc<Queues>, to: u64, vhost: &str, name: &str, what: What) -> ReadResult {
    let mut client = admin_client(queues, to).map_err(|e| err(503, e))?;
    let req = QueueReadRequest {
        vhost: vhost.to_string(),
        queue: name.to_string(),
        what: what.name().to_string(),
        position: match what {
            What::Peek(p) => p,
            _ => 0,
        },
        forwarded: true,
    };
    match tokio::time::timeout(READ_TIMEOUT, client.queue_read(req)).await {
        Ok(Ok(r)) => from_reply(r.into_inner()),
        Ok(Err(e)) => Err(err(503, format!("node {to}: {}", e.message()))),
        Err(_) => Err(err(503, format!("node {to} did not answer in time"))),
    }
}

/// The read on this node, which leads the queue.
async fn answer(
    queues: &Arc<Queues>,
    rec: &QueueRecord,
    h: &Arc<QueueHandle>,
    what: What,
) -> ReadResult {
    match what {
        What::Peek(position) => peek(h, position),
        What::DeadLetters => dead_letters(h).await,
        What::QuorumStatus => quorum_status(queues, rec).await,
        What::Replica => replica(queues, rec, Some(h)),
    }
}

fn peek(h: &QueueHandle, position: u64) -> ReadResult {
    let found = h
        .read(|host| {
            let m = host.machine();
            m.ready_at(position)
                .map(|(id, count)| (host.payload(id), count, m.ready_count()))
        })
        .ok_or_else(|| err(503, "the queue's replica is gone; try again"))?;
    let (payload, count, ready) = found.ok_or_else(|| err(400, NO_MESSAGE_AT_POSITION))?;
    let payload = payload.ok_or_else(|| err(500, "the message body could not be read"))?;
    let msg = StoredMessage::decode(&payload)
        .map_err(|e| err(500, format!("the stored message does not decode: {e}")))?;
    Ok(super::peek::message_json(
        &msg,
        count,
        ready.saturating_sub(position),
        h.counts_deliveries(),
    ))
}

/// The summary of the queue's messages (ready and unacknowledged; bodies read
/// [`BODIES_PER_LOCK`] at a time) and of its held dead letters by why they are
/// held (leader-local record, [`crate::dead_letter::held`]).
async fn dead_letters(h: &QueueHandle) -> ReadResult {
    let gone = || err(503, "the queue's replica is gone; try again");
    let (ids, held) = h
        .read(|host| {
            let m = host.machine();
            let held: Vec<_> = m.held_dead_letters().map(|(id, _)| id).collect();
            (m.queued_message_ids(), held)
        })
        .ok_or_else(gone)?;
    let mut summary = DeadLetterSummary::default();
    for chunk in ids.chunks(BODIES_PER_LOCK) {
        let bodies = h
            .read(|host| chunk.iter().map(|id| host.payload(*id)).collect::<Vec<_>>())
            .ok_or_else(gone)?;
        // A body missing now belongs to a message settled since the ids were read.
        for body in bodies.into_iter().flatten() {
            summary.add(TrackedMessage::decode(&body).ok().as_ref());
        }
        tokio::task::yield_now().await;
    }
    let mut v = summary.to_json(&h.vhost, &h.name);
    let by_reason = h.held_reasons().summarise(held.iter().copied());
    v["held"] = json!({"messages": held.len(), "by_reason": by_reason});
    Ok(v)
}

/// Raft state name as rabbitmq-queues quorum_status prints it.
fn role(state: openraft::ServerState) -> &'static str {
    match state {
        openraft::ServerState::Leader => "leader",
        openraft::ServerState::Follower => "follower",
        openraft::ServerState::Candidate => "candidate",
        openraft::ServerState::Learner => "learner",
        openraft::ServerState::Shutdown => "shutdown",
    }
}

/// This node's replica of the queue: Raft state, term, log and apply indexes.
fn replica(queues: &Queues, rec: &QueueRecord, h: Option<&Arc<QueueHandle>>) -> ReadResult {
    let raft = h
        .and_then(|h| h.route())
        .and_then(|r| r.raft())
        .ok_or_else(|| {
            err(
                404,
                format!(
                    "node {} holds no replica of '{}'",
                    queues.node_id(),
                    rec.name
                ),
            )
        })?;
    let m = raft.metrics().borrow().clone();
    Ok(json!({
        "node": queues.node_id(),
        "raft_state": role(m.state),
        "term": m.current_term,
        "last_log_index": m.last_log_index,
        "last_applied": m.last_applied.map(|l| l.index),
        "snapshot_index": m.snapshot.map(|l| l.index),
        "leader": m.current_leader,
    }))
}

/// Every member of the queue: its own replica's state (asked of it, null
/// fields when it does not answer), and from the leader's replication state
/// its match index and lag (entries behind the leader's log), the commit
/// index (the highest index a majority of voters hold) and when the answering
/// node's failure detector last heard from it (`last_contact_ms`, node-level).
async fn quorum_status(queues: &Arc<Queues>, rec: &QueueRecord) -> ReadResult {
    let me = queues.node_id();
    let handle = queues.queue_by_group(rec.group_id);
    let local_raft = handle
        .as_ref()
        .and_then(|h| h.route())
        .and_then(|r| r.raft());
    let metrics = local_raft.as_ref().map(|r| r.metrics().borrow().clone());
    let replication: Option<BTreeMap<u64, Option<u64>>> = metrics.as_ref().and_then(|m| {
        m.replication
            .as_ref()
            .map(|r| r.iter().map(|(n, l)| (*n, l.map(|l| l.index))).collect())
    });
    let leader_last = metrics.as_ref().and_then(|m| m.last_log_index);
    let mut members = rec.members.clone();
    members.sort_unstable();
    // The commit index: the quorum-th highest match index among the voters.
    let commit_index = replication.as_ref().map(|r| {
        let mut idx: Vec<u64> = members
            .iter()
            .map(|m| {
                if *m == me {
                    leader_last
                } else {
                    r.get(m).copied().flatten()
                }
                .unwrap_or(0)
            })
            .collect();
        idx.sort_unstable_by(|a, b| b.cmp(a));
        idx.get(members.len() / 2).copied().unwrap_or(0)
    });
    let asks = members.iter().map(|&m| {
        let queues = queues.clone();
        let handle = handle.clone();
        let rec = rec.clone();
        async move {
            if m == me {
                return replica(&queues, &rec, handle.as_ref()).ok();
            }
            if !queues.detector().is_alive(m) {
                return None;
            }
            forward(&queues, m, &rec.vhost, &rec.name, What::Replica)
                .await
                .ok()
        }
    });
    let own = futures::future::join_all(asks).await;
    let rows: Vec<Value> = members
        .iter()
        .zip(own)
        .map(|(&m, own)| {
            let field = |k: &str| own.as_ref().map_or(Value::Null, |o| o[k].clone());
            let match_index = replication.as_ref().and_then(|r| {
                if m == me {
                    leader_last
                } else {
                    r.get(&m).copied().flatten()
                }
            });
            json!({
                "node": m,
                "raft_state": own.as_ref().map_or(Value::from("noproc"), |o| o["raft_state"].clone()),
                "online": queues.detector().is_alive(m),
                "term": field("term"),
                "last_log_index": field("last_log_index"),
                "last_applied": field("last_applied"),
                "snapshot_index": field("snapshot_index"),
                "commit_index": if field("raft_state") == "leader" { json!(commit_index) } else { Value::Null },
                "match_index": match_index,
                "lag": match (leader_last, match_index) {
                    (Some(l), Some(mi)) => json!(l.saturating_sub(mi)),
                    _ => Value::Null,
                },
                "last_contact_ms": if m == me { Some(0) } else { queues.detector().last_seen_ms(m) },
            })
        })
        .collect();
    let leader = rows
        .iter()
        .find(|r| r["raft_state"] == "leader")
        .map(|r| r["node"].clone())
        .unwrap_or(Value::Null);
    Ok(json!({
        "queue": rec.name,
        "vhost": rec.vhost,
        "leader": leader,
        "members": rows,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_parses_the_admin_names() {
        assert_eq!(What::parse("peek", 3), Ok(What::Peek(3)));
        for w in [What::DeadLetters, What::QuorumStatus, What::Replica] {
            assert_eq!(What::parse(w.name(), 0), Ok(w));
        }
        assert!(What::parse("purge", 0).is_err());
    }

    #[test]
    fn replies_round_trip_documents_and_errors() {
        let v = json!({"payload": "x", "n": 1});
        assert_eq!(from_reply(to_reply(Ok(v.clone()))), Ok(v));
        let e = err(400, NO_MESSAGE_AT_POSITION);
        assert_eq!(from_reply(to_reply(Err(e.clone()))), Err(e));
    }
}
