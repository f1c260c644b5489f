//! Queue membership changes, as `rabbitmq-queues` makes them: `add_member`,
//! `delete_member`, `grow` and `shrink` (RabbitMQ `rabbit_quorum_queue`
//! `add_member/4`, `delete_member/3`, `grow/4`, `shrink_all/1`).
//!
//! Each is a Raft membership change of the queue's group, run on its leader
//! (a request reaching another node is forwarded there once). Adding a
//! node: the meta record lists it first, so the node opens an empty replica;
//! the leader adds it as a learner, waits until it caught up, then makes it
//! a voter. Removing one: the leader drops it from the voters, then the meta
//! record, so the node deletes its replica. A removed leader stops leading
//! once the new membership is in (`cluster::elections`).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use openraft::{BasicNode, ChangeMembers};
use quorumq_proto::v1::admin_client::AdminClient;
use quorumq_proto::v1::{MemberRequest, MemberResult};

use crate::meta::command::{MetaCommand, MetaReply};
use crate::meta::{QueueKind, QueueRecord};
use crate::queue::registry::Queues;

/// How long a new member may take to catch up before `add_member` gives
/// up (it stays a learner; `delete_member` removes it).
const CATCH_UP_FOR: Duration = Duration::from_secs(120);

/// Which way the membership changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// `add_member` / `grow`.
    Add,
    /// `delete_member` / `shrink`.
    Remove,
}

/// Adds or removes `node` as a member of queue `vhost`/`name`, on the
/// queue's leader (forwarded there unless `forwarded`). The result row
/// says `ok` (with a warning when the queue is left with fewer online
/// members than its quorum) or the error: no such queue, not a quorum
/// queue, unknown node, not a member, the last member, no leader, or the
/// Raft change failing.
pub async fn change_member(
    queues: &Arc<Queues>,
    vhost: &str,
    name: &str,
    node: u64,
    change: Change,
    forwarded: bool,
) -> MemberResult {
    let row = |size: usize, result: Result<String, String>| MemberResult {
        vhost: vhost.to_string(),
        name: name.to_string(),
        size: size as u32,
        ok: result.is_ok(),
        result: result.unwrap_or_else(|e| e),
    };
    let Some((rec, handle)) = queues.queue(vhost, name) else {
        return row(0, Err(format!("no queue '{name}' in vhost '{vhost}'")));
    };
    let size = rec.members.len();
    if rec.kind != QueueKind::Quorum {
        return row(size, Err(format!("'{name}' is not a replicated queue")));
    }
    if !cluster_status(queues).nodes.iter().any(|n| n.id == node) {
        return row(size, Err(format!("node {node} is not a cluster member")));
    }
    let Some(route) = handle.route() else {
        return row(size, Err("the queue has no route".into()));
    };
    let Some(raft) = route.local_leader() else {
        if forwarded {
            return row(size, Err("the queue's leader moved; try again".into()));
        }
        if let Some(leader) = route.leader() {
            return forward(queues, leader, vhost, name, node, change, true)
                .await
                .unwrap_or_else(|e| row(size, Err(e)));
        }
        // A node that is no member of the queue does not follow its leader: a member does
        // (and forwards to it). Members never take this path, so requests cannot circle.
        let me = queues.node_id();
        let mut last = Err("the queue has no leader".to_string());
        if !rec.members.contains(&me) {
            for &member in &rec.members {
                last = forward(queues, member, vhost, name, node, change, false).await;
                if last.is_ok() {
                    break;
                }
            }
        }
        return last.unwrap_or_else(|e| row(size, Err(e)));
    };
    let result = match change {
        Change::Add => add(queues, &raft, &rec, node).await,
        Change::Remove => remove(queues, &raft, &rec, node).await,
    };
    let size = match (&result, change) {
        (Ok(_), Change::Add) if !rec.members.contains(&node) => size + 1,
        (Ok(_), Change::Remove) => size - 1,
        _ => size,
    };
    row(size, result)
}

/// The `change_member` request, asked of node `to`: the queue's leader (`forwarded`), or a
/// member that forwards it to the leader it follows.
async fn forward(
    queues: &Arc<Queues>,
    to: u64,
    vhost: &str,
    name: &str,
    node: u64,
    change: Change,
    forwarded: bool,
) -> Result<MemberResult, String> {
    let mut client = admin_client(queues, to).map_err(|e| format!("node {to}: {e}"))?;
    let req = MemberRequest {
        vhost: vhost.to_string(),
        queue: name.to_string(),
        node,
        forwarded,
    };
    let reply = match change {
        Change::Add => client.add_member(req).await,
        Change::Remove => client.delete_member(req).await,
    };
    reply
        .map(|r| r.into_inner())
        .map_err(|e| format!("node {to}: {}", e.message()))
}

async fn add(
    queues: &Arc<Queues>,
    raft: &crate::cluster::types::Raft,
    rec: &QueueRecord,
    node: u64,
) -> Result<String, String> {
    if rec.members.contains(&node) && is_voter(raft, node) {
        return Ok("ok (already a member)".into());
    }
    let mut members = rec.members.clone();
    if !members.contains(&node) {
        members.push(node);
        set_members(queues, rec, members).await?;
    }
    match tokio::time::timeout(
        CATCH_UP_FOR,
        raft.add_learner(node, BasicNode::new(""), true),
    )
    .await
    {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => return Err(format!("adding node {node} as a learner: {e}")),
        Err(_) => {
            return Err(format!(
                "node {node} did not catch up within {} s (it stays a learner)",
                CATCH_UP_FOR.as_secs()
            ))
        }
    }
    raft.change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([node])), false)
        .await
        .map_err(|e| format!("making node {node} a voter: {e}"))?;
    Ok("ok".into())
}

async fn remove(
    queues: &Arc<Queues>,
    raft: &crate::cluster::types::Raft,
    rec: &QueueRecord,
    node: u64,
) -> Result<String, String> {
    if !rec.members.contains(&node) {
        return Err(format!("node {node} is not a member"));
    }
    if rec.members.len() == 1 {
        return Err("refused: it is the queue's last member".into());
    }
    raft.change_membership(removal(raft, node), false)
        .await
        .map_err(|e| format!("removing node {node}: {e}"))?;
    let members: Vec<u64> = rec.members.iter().copied().filter(|m| *m != node).collect();
    set_members(queues, rec, members.clone()).await?;
    let online = members
        .iter()
        .filter(|m| queues.detector().is_alive(**m))
        .count();
    let quorum = members.len() / 2 + 1;
    Ok(if online < quorum {
        format!(
            "ok (below quorum: {online} of {} members online, {quorum} needed)",
            members.len()
        )
    } else {
        "ok".into()
    })
}

/// The cluster as this node sees it ([`super::status::cluster_status`]).
fn cluster_status(queues: &Queues) -> super::status::ClusterStatus {
    super::status::cluster_status(queues.peers(), queues.meta().raft(), queues.detector())
}

/// The admin API of node `node`, over the shared peer channel.
///
/// Errors: no address is known for the node.
pub(crate) fn admin_client(
    queues: &Queues,
    node: u64,
) -> Result<AdminClient<super::secret::PeerChannel>, String> {
    queues
        .peers()
        .channel(node)
        .map(AdminClient::new)
        .ok_or_else(|| format!("no address for node {node}"))
}

/// The membership change that takes `node` out of `raft`'s group: out of
/// the voters, or out of the learners (one left by an `add_member` or a
/// join that did not finish).
fn removal(raft: &crate::cluster::types::Raft, node: u64) -> ChangeMembers<u64, BasicNode> {
    if is_voter(raft, node) {
        ChangeMembers::RemoveVoters(BTreeSet::from([node]))
    } else {
        ChangeMembers::RemoveNodes(BTreeSet::from([node]))
    }
}

/// True when `node` is a voter of `raft`'s group (not a learner).
pub fn is_voter(raft: &crate::cluster::types::Raft, node: u64) -> bool {
    raft.metrics()
        .borrow()
        .membership_config
        .membership()
        .voter_ids()
        .any(|v| v == node)
}

async fn set_members(
    queues: &Arc<Queues>,
    rec: &QueueRecord,
    members: Vec<u64>,
) -> Result<(), String> {
    match queues
        .meta()
        .write(MetaCommand::SetQueueMembers {
            vhost: rec.vhost.clone(),
            name: rec.name.clone(),
            group_id: rec.group_id,
            members,
        })
        .await
    {
        Ok(MetaReply::Error(e)) => Err(e.text),
        Ok(_) => Ok(()),
        Err(e) => Err(format!("updating the queue record: {e:?}")),
    }
}

/// `grow NODE all|even`: adds `node` to every quorum queue it is not a
/// member of whose vhost and name match the patterns (regexes; empty
/// matches all) — with `even`, only to queues with an even number of
/// members. One row per queue, in vhost then name order.
///
/// Errors: a pattern is not a valid regex; the strategy is neither.
pub async fn grow(
    queues: &Arc<Queues>,
    node: u64,
    strategy: &str,
    vhost_pattern: &str,
    queue_pattern: &str,
) -> Result<Vec<MemberResult>, String> {
    let even = match strategy {
        "all" => false,
        "even" => true,
        s => return Err(format!("strategy must be 'all' or 'even', not '{s}'")),
    };
    let vp = regex::Regex::new(vhost_pattern).map_err(|e| e.to_string())?;
    let qp = regex::Regex::new(queue_pattern).map_err(|e| e.to_string())?;
    let targets = select(queues, |q| {
        !q.members.contains(&node)
            && vp.is_match(&q.vhost)
            && qp.is_match(&q.name)
            && (!even || q.members.len() % 2 == 0)
    });
    let mut out = Vec::new();
    for (vhost, name) in targets {
        out.push(change_member(queues, &vhost, &name, node, Change::Add, false).await);
    }
    Ok(out)
}

/// `shrink NODE`: removes `node` from every quorum queue it is a member
/// of (a queue where it is the last member reports an error). One row per
/// queue, in vhost then name order.
pub async fn shrink(queues: &Arc<Queues>, node: u64) -> Vec<MemberResult> {
    let targets = select(queues, |q| q.members.contains(&node));
    let mut out = Vec::new();
    for (vhost, name) in targets {
        out.push(change_member(queues, &vhost, &name, node, Change::Remove, false).await);
    }
    out
}

/// Replicated queues matching `pred`, as (vhost, name), sorted.
fn select(queues: &Queues, pred: impl Fn(&QueueRecord) -> bool) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = queues
        .meta()
        .with_topology(|t| {
            t.queues()
                .filter(|q| q.kind == QueueKind::Quorum && pred(q))
                .map(|q| (q.vhost.clone(), q.name.clone()))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// How long a leader transfer may take: the target campaigns until it
/// leads (a follower that took an append within the lease refuses votes).
const TRANSFER_FOR: Duration = Duration::from_secs(3);

/// `rebalance quorum`: moves leaders of the matching quorum queues from
/// nodes leading more than their share (total / nodes, rounded up) to the
/// member leading fewest, one transfer at a time (the target campaigns,
/// [`campaign`]). Returns leaders per node afterwards and the moves made
/// (RabbitMQ `rabbit_quorum_queue:rebalance/3`).
///
/// Errors: a pattern is not a valid regex.
pub async fn rebalance(
    queues: &Arc<Queues>,
    vhost_pattern: &str,
    queue_pattern: &str,
) -> Result<(Vec<(u64, u32)>, Vec<String>), String> {
    let vp = regex::Regex::new(vhost_pattern).map_err(|e| e.to_string())?;
    let qp = regex::Regex::new(queue_pattern).map_err(|e| e.to_string())?;
    let mut placed: Vec<(QueueRecord, Option<u64>)> = Vec::new();
    for (vhost, name) in select(queues, |q| vp.is_match(&q.vhost) && qp.is_match(&q.name)) {
        if let Some((rec, h)) = queues.queue(&vhost, &name) {
            let leader = h.route().and_then(|r| r.leader());
            placed.push((rec, leader));
        }
    }
    let mut count: std::collections::BTreeMap<u64, u32> = cluster_status(queues)
        .nodes
        .iter()
        .filter(|n| queues.detector().is_alive(n.id))
        .map(|n| (n.id, 0))
        .collect();
    for (_, l) in &placed {
        if let Some(l) = l {
            *count.entry(*l).or_default() += 1;
        }
    }
    let led = placed.iter().filter(|(_, l)| l.is_some()).count() as u32;
    let share = led.div_ceil(count.len().max(1) as u32);
    let mut moved = Vec::new();
    for (rec, leader) in &placed {
        let Some(from) = *leader else { continue };
        if count.get(&from).copied().unwrap_or(0) <= share {
            continue;
        }
        let Some(to) = rec
            .members
            .iter()
            .copied()
            .filter(|m| *m != from && queues.detector().may_lead(*m))
            .min_by_key(|m| (count.get(m).copied().unwrap_or(0), *m))
        else {
            continue;
        };
        if count.get(&to).copied().unwrap_or(0) + 1 >= count.get(&from).copied().unwrap_or(0) {
            continue;
        }
        match ask_campaign(queues, to, rec.group_id).await {
            Ok(()) => {
                *count.entry(from).or_default() -= 1;
                *count.entry(to).or_default() += 1;
                moved.push(format!(
                    "{} in vhost {}: node {from} -> node {to}",
                    rec.name, rec.vhost
                ));
            }
            Err(e) => {
                tracing::warn!(queue = %rec.name, from, to, error = %e, "leader transfer failed")
            }
        }
    }
    Ok((count.into_iter().collect(), moved))
}

/// Has node `node` campaign in `group` (itself when it is this node).
pub(crate) async fn ask_campaign(
    queues: &Arc<Queues>,
    node: u64,
    group: u64,
) -> Result<(), String> {
    if node == queues.node_id() {
        return campaign(queues, group).await;
    }
    let r = admin_client(queues, node)?
        .campaign(quorumq_proto::v1::CampaignRequest { group_id: group })
        .await
        .map_err(|e| e.message().to_string())?
        .into_inner();
    if r.ok {
        Ok(())
    } else {
        Err(r.error)
    }
}

/// This node campaigns in `group` until it leads (a leader transfer;
/// openraft 0.9 has none of its own), retrying while voters refuse within
/// their lease, for up to [`TRANSFER_FOR`].
///
/// Errors: no replica of the group here, or not the leader in time.
pub async fn campaign(queues: &Arc<Queues>, group: u64) -> Result<(), String> {
    let me = queues.node_id();
    let raft = queues
        .queue_by_group(group)
        .and_then(|h| h.route().and_then(|r| r.raft()))
        .ok_or_else(|| format!("node {me} holds no replica of group {group}"))?;
    if queues.detector().is_draining() {
        return Err(format!("node {me} is draining"));
    }
    let deadline = tokio::time::Instant::now() + TRANSFER_FOR;
    while tokio::time::Instant::now() < deadline {
        if raft.metrics().borrow().current_leader == Some(me) {
            return Ok(());
        }
        let _ = raft.trigger().elect().await;
        // A refusal within the voters' lease: try again once it ran out.
        let _ = raft
            .wait(Some(Duration::from_millis(super::LEADER_LEASE_MS + 40)))
            .metrics(|m| m.current_leader == Some(me), "leading after a campaign")
            .await;
    }
    if raft.metrics().borrow().current_leader == Some(me) {
        Ok(())
    } else {
        Err(format!(
            "node {me} did not win the leadership of group {group}"
        ))
    }
}

/// `--replaces OLD` (issue 11: rebuild a member whose disk died or whose log is corrupt under
/// a new id): forgets `old` ([`forget_node`], retried every second while it is still seen
/// running or there is no meta leader), then adds this node to every queue `old` was a
/// member of; each queue's leader brings the new member up to date (its snapshot with the
/// bodies when the log it needs was purged, else the log; each queue is tried 30 times a
/// second apart). Gives up forgetting after 10 minutes. A node that is no cluster member
/// (already forgotten) is skipped.
pub async fn replace(queues: std::sync::Weak<Queues>, old: u64) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(600);
    let rows = loop {
        let Some(b) = queues.upgrade() else { return };
        if b.is_stopping() {
            return;
        }
        match forget_node(&b, old, false).await {
            Ok(rows) => break rows,
            Err(e) if e.contains("is not a cluster member") => {
                tracing::info!(
                    old,
                    "replaces: node {old} is no cluster member (already forgotten)"
                );
                return;
            }
            Err(e) if tokio::time::Instant::now() > deadline => {
                tracing::error!(old, error = %e, "replaces: could not forget the replaced node; giving up");
                return;
            }
            Err(e) => {
                tracing::info!(old, error = %e, "replaces: forgetting the replaced node; retrying")
            }
        }
        drop(b);
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    };
    let Some(b) = queues.upgrade() else { return };
    let me = b.node_id();
    for row in rows {
        for attempt in 1.. {
            let r = change_member(&b, &row.vhost, &row.name, me, Change::Add, false).await;
            if r.ok || attempt >= 30 || b.is_stopping() {
                tracing::info!(old, vhost = %r.vhost, queue = %r.name, result = %r.result, members = r.size,
                    "replaces: took the replaced node's place");
                break;
            }
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        }
    }
}

/// `forget_cluster_node NODE`: removes a node that is down for good from
/// every queue group it was a member of ([`shrink`]), then from the meta
/// group, on the meta leader (forwarded there unless `forwarded`). A
/// running node is refused, as rabbitmqctl refuses it. Returns the per-queue
/// rows.
///
/// Errors: the node is running, unknown, this node itself, no meta leader,
/// or the meta membership change failed.
pub async fn forget_node(
    queues: &Arc<Queues>,
    node: u64,
    forwarded: bool,
) -> Result<Vec<MemberResult>, String> {
    if node == queues.node_id() {
        return Err(format!("node {node} is the node asked; ask another one"));
    }
    if queues.detector().is_alive(node) {
        return Err(format!("node {node} is running; stop it first"));
    }
    let meta = queues.meta().raft().clone();
    let leader = meta.metrics().borrow().current_leader;
    match leader {
        Some(l) if l == queues.node_id() => {}
        Some(l) if !forwarded => {
            let r = admin_client(queues, l)
                .map_err(|e| format!("the meta leader: {e}"))?
                .forget_cluster_node(quorumq_proto::v1::ForgetRequest {
                    node,
                    forwarded: true,
                })
                .await
                .map_err(|e| format!("the meta leader, node {l}: {}", e.message()))?
                .into_inner();
            return if r.ok { Ok(r.queues) } else { Err(r.error) };
        }
        _ => return Err("the cluster has no meta leader; try again".into()),
    }
    let membership = meta
        .metrics()
        .borrow()
        .membership_config
        .membership()
        .clone();
    if membership.get_node(&node).is_none() {
        return Err(format!("node {node} is not a cluster member"));
    }
    let rows = shrink(queues, node).await;
    meta.change_membership(removal(&meta, node), false)
        .await
        .map_err(|e| format!("removing node {node} from the meta group: {e}"))?;
    Ok(rows)
}
