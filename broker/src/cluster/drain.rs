//! Draining a node (`rabbitmq-upgrade drain`; every graceful stop): its
//! queue leaderships move to other members first, so a rolling restart
//! costs each queue one hand-over of about a leader lease instead of a
//! failure detection and an election.
//!
//! openraft 0.9 has no leader transfer. The draining node stops appending
//! as a leader ([`Detector::set_draining`]: its own proposals and forwarded
//! ones go to other members, who retry until someone else leads); once the
//! voters' leader lease ([`LEADER_LEASE_MS`]) has run out, the most
//! caught-up other live voter campaigns ([`membership::campaign`] on that
//! node) and wins. The draining replica stays a voter (a two-member group
//! still needs its vote) and follows the new leader.
//!
//! [`Detector::set_draining`]: super::detector::Detector::set_draining

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;

use super::membership;
use super::LEADER_LEASE_MS;
use crate::queue::registry::Queues;

/// How many queues hand over at once. With 64, a graceful stop of a node leading 50,000
/// queues handed over 31,500–40,300 of them in its 15 s; with 256, 45,600 (issue 31).
const PARALLEL: usize = 256;

/// Outcome of [`drain`], counts of queues.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct HandOff {
    /// Queues this node led that another member leads now.
    pub moved: u32,
    /// Queues this node led with no other live voter: they stay here (and
    /// are unavailable while this node is stopped, as on RabbitMQ).
    pub kept: u32,
    /// Queues no other member took over in time, with the last error.
    pub failed: Vec<(String, String)>,
}

/// Marks this node draining and moves every queue leadership it holds to
/// another member, giving up on a queue after `within`. The node stays
/// draining (it leads nothing, campaigns for nothing) until [`revive`].
pub async fn drain(queues: &Arc<Queues>, within: Duration) -> HandOff {
    queues.detector().set_draining(true);
    let me = queues.node_id();
    let meta = step_down_from_meta(queues);
    let mut result = HandOff::default();
    let mut led: Vec<(String, u64, crate::cluster::types::Raft)> = Vec::new();
    for h in queues.queue_handles() {
        let Some(raft) = h.route().and_then(|r| r.raft()) else {
            continue;
        };
        let (leads, alone) = {
            let m = raft.metrics();
            let m = m.borrow();
            let alone = !m
                .membership_config
                .membership()
                .voter_ids()
                .any(|v| v != me);
            (m.current_leader == Some(me), alone)
        };
        match (leads, alone) {
            (true, true) => result.kept += 1,
            (true, false) => led.push((h.name.clone(), h.group, raft)),
            _ => {}
        }
    }
    if led.is_empty() {
        meta.await;
        return result;
    }
    // Nothing is appended from now on: the voters' lease runs out.
    tokio::time::sleep(Duration::from_millis(LEADER_LEASE_MS + 15)).await;
    let deadline = tokio::time::Instant::now() + within;
    let outcomes: Vec<(String, Result<bool, String>)> = futures::stream::iter(led)
        .map(|(name, group, raft)| async move {
            let r = hand_off(queues, group, &raft, deadline).await;
            (name, r)
        })
        .buffer_unordered(PARALLEL)
        .collect()
        .await;
    meta.await;
    for (name, r) in outcomes {
        match r {
            Ok(true) => result.moved += 1,
            Ok(false) => result.kept += 1,
            Err(e) => result.failed.push((name, e)),
        }
    }
    tracing::info!(
        moved = result.moved,
        kept = result.kept,
        failed = result.failed.len(),
        "drained: queue leaderships handed over"
    );
    result
}

/// Ends draining: this node may lead and campaign again (leaderships come
/// back through elections or `rebalance`, as after RabbitMQ's `revive`).
pub fn revive(queues: &Queues) {
    queues.detector().set_draining(false);
    let meta = queues.meta().raft().runtime_config();
    meta.heartbeat(true);
    meta.elect(true);
    tracing::info!("revived: leading queues again");
}

/// Moves one group's leadership away from this node: Ok(true) once another
/// member leads, Ok(false) when no other live voter exists.
async fn hand_off(
    queues: &Arc<Queues>,
    group: u64,
    raft: &crate::cluster::types::Raft,
    deadline: tokio::time::Instant,
) -> Result<bool, String> {
    let me = queues.node_id();
    let candidates = {
        let m = raft.metrics().borrow().clone();
        let detector = queues.detector();
        let mut c: Vec<(u64, u64)> = m
            .membership_config
            .membership()
            .voter_ids()
            .filter(|v| *v != me && detector.may_lead(*v))
            .map(|v| {
                let matched = m
                    .replication
                    .as_ref()
                    .and_then(|r| r.get(&v).copied().flatten())
                    .map_or(0, |l| l.index);
                (v, matched)
            })
            .collect();
        // Most caught up first (its vote request carries the longest log);
        // among equals, an order that differs per group, so the queues of a
        // drained node spread over the others.
        c.sort_by_key(|(v, matched)| {
            (
                std::cmp::Reverse(*matched),
                (v ^ group).wrapping_mul(0x9E37_79B9_7F4A_7C15),
            )
        });
        c
    };
    if candidates.is_empty() {
        return Ok(false);
    }
    let mut last_error = String::from("no attempt");
    while tokio::time::Instant::now() < deadline {
        for (node, _) in &candidates {
            if raft
                .metrics()
                .borrow()
                .current_leader
                .is_some_and(|l| l != me)
            {
                return Ok(true);
            }
            match membership::ask_campaign(queues, *node, group).await {
                Ok(()) => {
                    // The new leader's first append reaches this replica.
                    let _ = raft
                        .wait(Some(Duration::from_secs(1)))
                        .metrics(|m| m.current_leader != Some(me), "another leader")
                        .await;
                    return Ok(true);
                }
                Err(e) => last_error = format!("node {node}: {e}"),
            }
        }
    }
    Err(last_error)
}

/// The meta group (openraft's own heartbeats and elections): this node
/// stops campaigning and, if it leads, stops its heartbeats, so the other
/// voters time out and elect one of themselves. Resolves once another node
/// leads (at most [`META_STEP_DOWN_FOR`]; a single node keeps leading).
fn step_down_from_meta(queues: &Arc<Queues>) -> impl std::future::Future<Output = ()> {
    let raft = queues.meta().raft().clone();
    let me = queues.node_id();
    raft.runtime_config().elect(false);
    let leads = raft.metrics().borrow().current_leader == Some(me);
    let others = raft
        .metrics()
        .borrow()
        .membership_config
        .membership()
        .voter_ids()
        .any(|v| v != me);
    async move {
        if !(leads && others) {
            return;
        }
        raft.runtime_config().heartbeat(false);
        let _ = raft
            .wait(Some(META_STEP_DOWN_FOR))
            .metrics(
                |m| m.current_leader.is_some_and(|l| l != me),
                "another meta leader",
            )
            .await;
    }
}

/// Longest a drain waits for the meta group to elect another leader.
const META_STEP_DOWN_FOR: Duration = Duration::from_secs(5);
