//! Joining a running cluster (`--join HOST:PORT`): a fresh node asks any
//! member to admit it; the meta leader adds it to the meta group as a
//! learner (its address in the membership, so every node learns it), waits
//! until it has caught up, and promotes it to voter while the meta group has
//! fewer than [`MAX_META_VOTERS`] voters. A member that is not the leader
//! forwards the request to the leader.
//!
//! Node addresses learned from the meta membership or a join reply are kept
//! in the node's sled (`node/peer/<id>`), so a restarted node finds its
//! peers without `--peers` or `--join`.

use std::collections::BTreeSet;
use std::time::Duration;

use openraft::{BasicNode, ChangeMembers};
use quorumq_proto::v1::{cluster_client::ClusterClient, JoinPeer, JoinReply, JoinRequest};

use super::peers::Peers;
use super::types::Raft;

/// The meta group keeps at most this many voters; later nodes stay learners
/// (they still hold the whole meta state).
pub const MAX_META_VOTERS: usize = 5;
/// Bound on admitting one node (learner catch-up and promotion).
const ADMIT_TIMEOUT: Duration = Duration::from_secs(30);

fn refused(error: String, permanent: bool, peers: &Peers) -> JoinReply {
    JoinReply {
        accepted: false,
        error,
        cluster_id: peers.cluster_id(),
        peers: Vec::new(),
        permanent,
    }
}

/// Admits the node of `req` (leader side), or forwards the request to the
/// meta leader. Refuses, permanently, a node id that is already a member at
/// another address; a node already admitted at the same address is
/// accepted again (it may have crashed before it saw the reply).
pub async fn admit(meta: &Raft, peers: &Peers, req: JoinRequest) -> JoinReply {
    if req.node_id == 0 || req.cluster_addr.is_empty() {
        return refused(
            "a joining node needs a node id > 0 and a cluster address".into(),
            true,
            peers,
        );
    }
    let metrics = meta.metrics().borrow().clone();
    let me = peers.me();
    match metrics.current_leader {
        Some(leader) if leader == me => {}
        Some(leader) => return forward(peers, leader, req).await,
        None => return refused("the meta group has no leader yet".into(), false, peers),
    }
    let membership = metrics.membership_config.membership().clone();
    let id = req.node_id;
    if let Some(node) = membership.get_node(&id) {
        let known = peers.addr(id).unwrap_or_default();
        let same =
            node.addr == req.cluster_addr || (node.addr.is_empty() && known == req.cluster_addr);
        if !same {
            let at = if node.addr.is_empty() {
                known
            } else {
                node.addr.clone()
            };
            return refused(
                format!("node id {id} is already a member at {at}; start this node with another --node-id"),
                true,
                peers,
            );
        }
    }
    peers.set_addr(id, &req.cluster_addr);
    let admitted = tokio::time::timeout(ADMIT_TIMEOUT, async {
        if membership.get_node(&id).is_none() {
            meta.add_learner(id, BasicNode::new(&req.cluster_addr), true)
                .await
                .map_err(|e| format!("adding node {id} as a learner: {e}"))?;
        }
        let voters = meta
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .voter_ids()
            .count();
        if !super::membership::is_voter(meta, id) && voters < MAX_META_VOTERS {
            meta.change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])), false)
                .await
                .map_err(|e| format!("promoting node {id} to voter: {e}"))?;
        }
        Ok::<(), String>(())
    })
    .await
    .unwrap_or_else(|_| {
        Err(format!(
            "admitting node {id} took longer than {ADMIT_TIMEOUT:?}"
        ))
    });
    if let Err(e) = admitted {
        tracing::warn!(node = id, error = %e, "join not completed");
        return refused(e, false, peers);
    }
    tracing::info!(node = id, addr = %req.cluster_addr, "node joined the cluster");
    JoinReply {
        accepted: true,
        error: String::new(),
        cluster_id: peers.cluster_id(),
        peers: peers
            .all()
            .into_iter()
            .map(|(node_id, cluster_addr)| JoinPeer {
                node_id,
                cluster_addr,
            })
            .collect(),
        permanent: false,
    }
}

async fn forward(peers: &Peers, leader: u64, req: JoinRequest) -> JoinReply {
    let Some(ch) = peers.channel(leader) else {
        return refused(
            format!("the meta leader, node {leader}, has no known address"),
            false,
            peers,
        );
    };
    match ClusterClient::new(ch).join(req).await {
        Ok(r) => r.into_inner(),
        Err(e) => refused(
            format!("forwarding to the meta leader, node {leader}: {e}"),
            false,
            peers,
        ),
    }
}

/// Joiner side: one Join call to `addr` (`host:port`), ≤ 35 s.
///
/// Errors: the address is invalid or the call failed (a refusal is a reply).
pub async fn ask(
    addr: &str,
    peers: &super::peers::Peers,
    req: JoinRequest,
) -> Result<JoinReply, String> {
    let ch = peers
        .endpoint(addr)
        .map_err(|e| format!("--join {addr}: {e}"))?
        .connect_timeout(Duration::from_secs(2))
        .timeout(ADMIT_TIMEOUT + Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| format!("connecting to {addr}: {e}"))?;
    ClusterClient::new(peers.secret().attach(ch))
        .join(req)
        .await
        .map(|r| r.into_inner())
        .map_err(|e| format!("join via {addr}: {e}"))
}

/// sled key of a remembered peer address.
fn key(id: u64) -> String {
    format!("node/peer/{id:020}")
}

/// Persists node `id`'s cluster address (flushed by the caller's next sled flush).
///
/// Errors: sled.
pub fn remember(db: &sled::Db, id: u64, addr: &str) -> sled::Result<()> {
    if db.get(key(id))?.as_deref() != Some(addr.as_bytes()) {
        db.insert(key(id), addr.as_bytes())?;
    }
    Ok(())
}

/// Every remembered peer address.
pub fn remembered(db: &sled::Db) -> Vec<(u64, String)> {
    db.scan_prefix("node/peer/")
        .filter_map(Result::ok)
        .filter_map(|(k, v)| {
            let id = std::str::from_utf8(&k)
                .ok()?
                .strip_prefix("node/peer/")?
                .parse()
                .ok()?;
            Some((id, String::from_utf8(v.to_vec()).ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembered_addresses_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::Config::new()
            .path(dir.path())
            .temporary(true)
            .open()
            .unwrap();
        remember(&db, 2, "10.0.0.2:5680").unwrap();
        remember(&db, 11, "10.0.0.11:5680").unwrap();
        remember(&db, 2, "10.0.0.22:5680").unwrap();
        let mut got = remembered(&db);
        got.sort();
        assert_eq!(
            got,
            vec![
                (2, "10.0.0.22:5680".to_string()),
                (11, "10.0.0.11:5680".to_string())
            ]
        );
    }
}
