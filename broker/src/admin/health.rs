//! Quorum health checks over every quorum queue, as this node sees its
//! members' liveness (failure detector) and leaders:
//! `check_if_node_is_quorum_critical` (RabbitMQ `rabbitmq-queues`,
//! `rabbit_quorum_queue:list_with_minimum_quorum/0`) and
//! `check_for_quorum_queues_without_an_elected_leader` (RabbitMQ 4.1
//! `rabbitmq-diagnostics`, `rabbit_quorum_queue:leader_health_check/2`;
//! HTTP `GET /api/health/checks/quorum-queues-without-elected-leaders/...`).

use std::sync::Arc;

use serde_json::{json, Value};

use crate::meta::{QueueKind, QueueRecord};
use crate::queue::registry::Queues;

/// A queue as RabbitMQ's checks list it (`amqqueue:to_printable/2`):
/// `readable_name` ("queue 'q' in vhost '/'"), `name`, `virtual_host`, `type`.
pub fn printable(rec: &QueueRecord) -> Value {
    json!({
        "readable_name": format!("queue '{}' in vhost '{}'", rec.name, rec.vhost),
        "name": rec.name,
        "virtual_host": rec.vhost,
        "type": "quorum",
    })
}

/// Votes needed for a majority of `members` voters.
fn quorum(members: usize) -> usize {
    members / 2 + 1
}

fn quorum_queues(queues: &Queues) -> Vec<QueueRecord> {
    queues
        .meta()
        .with_topology(|t| {
            t.queues()
                .filter(|q| q.kind == QueueKind::Quorum)
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}

/// The quorum queues `node` is a member of that would lose their majority if
/// it stopped: online members (as this node's failure detector sees them)
/// minus one below the quorum (RabbitMQ: `length(Running) - 1 < QuorumSize`).
pub fn quorum_critical(queues: &Queues, node: u64) -> Vec<Value> {
    let detector = queues.detector();
    quorum_queues(queues)
        .iter()
        .filter(|q| q.members.contains(&node))
        .filter(|q| {
            let online = q.members.iter().filter(|m| detector.is_alive(**m)).count();
            online.saturating_sub(1) < quorum(q.members.len())
        })
        .map(printable)
        .collect()
}

/// The quorum queues matching `pattern` (regex on names) in `vhost` (None:
/// all) that have no elected, reachable leader: no leader known, the leader
/// seen down, or fewer members online than a majority (queue groups send no
/// heartbeats, so a leader that lost its majority would not notice; the
/// failure detector does).
///
/// Errors: `pattern` is not a valid regex.
pub fn without_leader(
    queues: &Arc<Queues>,
    vhost: Option<&str>,
    pattern: &str,
) -> Result<Vec<Value>, String> {
    let re = regex::Regex::new(if pattern.is_empty() { ".*" } else { pattern })
        .map_err(|e| format!("invalid pattern: {e}"))?;
    let detector = queues.detector();
    let me = queues.node_id();
    Ok(quorum_queues(queues)
        .iter()
        .filter(|q| vhost.is_none_or(|v| q.vhost == v) && re.is_match(&q.name))
        .filter(|q| {
            let online = q.members.iter().filter(|m| detector.is_alive(**m)).count();
            let route = queues
                .queue_by_group(q.group_id)
                .and_then(|h| h.route().cloned());
            let leader = route.as_ref().and_then(|r| r.leader());
            let leads = match leader {
                Some(l) if l == me => route
                    .as_ref()
                    .and_then(|r| r.raft())
                    .is_some_and(|raft| raft.metrics().borrow().state.is_leader()),
                Some(l) => detector.is_alive(l),
                None => false,
            };
            !leads || online < quorum(q.members.len())
        })
        .map(printable)
        .collect())
}
