//! Pre-vote for quiescent queue groups (Raft thesis §9.6; openraft 0.9 has
//! none). Before a member campaigns (`elections`), it asks the other voters
//! whether they would vote for it, without raising its term. It campaigns
//! only with a majority of "yes" (itself included). A campaign that cannot
//! win still raises the candidate's term, and that higher term ends the
//! live leader's term when they next speak: a follower behind a slow link,
//! whose failure detector loses the leader's beats in the queue of that
//! link, deposed its leader over and over (slow-link note: terms past 389).
//!
//! A voter says no when it leads the group itself, or when it hears from
//! the group's leader (an append within the leader lease) and its failure
//! detector sees that leader alive. Logs are not compared (openraft 0.9
//! does not expose a replica's last log id; the real vote compares them). A
//! voter that does not answer in time counts as no. A leader's node that died answers nothing,
//! and the other members stopped hearing from it a lease ago, so a failover
//! costs one extra round trip.

use std::sync::Arc;
use std::time::{Duration, Instant};

use quorumq_proto::v1::raft_transport_client::RaftTransportClient;
use quorumq_proto::v1::RaftRequest;
use serde::{Deserialize, Serialize};

use super::detector::Detector;
use super::groups::GroupTable;
use super::peers::{Peers, MAX_MESSAGE_BYTES};
use super::types::NodeId;
use super::LEADER_LEASE_MS;

/// How long a candidate waits for the pre-vote answers (ms).
pub const PRE_VOTE_TIMEOUT_MS: u64 = 200;

/// A member's question to the other voters of `RaftRequest::group_id`:
/// would you vote for me? Encoded with the Raft codec (bincode 2).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreVoteRequest {
    /// The member that would campaign.
    pub candidate: NodeId,
}

/// What a voter knows when it answers a pre-vote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VoterView {
    /// This voter leads the group.
    pub leads: bool,
    /// It took an append from its leader within the leader lease, and its
    /// failure detector sees that leader alive.
    pub hears_live_leader: bool,
}

/// Whether a voter with `view` would vote for a candidate (pure).
pub fn grant(view: &VoterView) -> bool {
    !view.leads && !view.hears_live_leader
}

/// This node's answer to `req` for `group`: false when the group is not
/// open here.
pub fn answer(
    me: NodeId,
    groups: &GroupTable,
    detector: &Detector,
    group: u64,
    req: &PreVoteRequest,
) -> bool {
    let Some(replica) = groups.get(group) else {
        return false;
    };
    let metrics = replica.raft().metrics();
    let m = metrics.borrow();
    let leader = m.current_leader;
    let lease = Duration::from_millis(LEADER_LEASE_MS);
    let heard = groups
        .last_heard(group)
        .is_some_and(|t| t.elapsed() < lease);
    let view = VoterView {
        leads: leader == Some(me) && m.state.is_leader(),
        hears_live_leader: heard && leader.is_some_and(|l| l != me && detector.is_alive(l)),
    };
    let granted = grant(&view);
    tracing::debug!(group, candidate = req.candidate, granted, ?view, "pre-vote");
    granted
}

/// Asks the voters of `group` but `me` that `reachable` (the failure detector) sees up
/// for a pre-vote and returns whether a majority of `voters` (counting `me`) would vote for
/// `req.candidate`. A voter seen down counts as no without being asked (a dead peer's call
/// would hold the round for the whole timeout); a voter that does not answer within
/// [`PRE_VOTE_TIMEOUT_MS`] counts as no. The round ends as soon as the majority is reached or
/// can no longer be.
pub async fn ask(
    peers: &Arc<Peers>,
    me: NodeId,
    group: u64,
    voters: &[NodeId],
    reachable: impl Fn(NodeId) -> bool,
    req: &PreVoteRequest,
) -> bool {
    use futures::StreamExt;
    let need = voters.len() / 2 + 1;
    let Ok(payload) = raft_log::codec::encode(req) else {
        return false;
    };
    let started = Instant::now();
    let mut asks: futures::stream::FuturesUnordered<_> = voters
        .iter()
        .filter(|v| **v != me && reachable(**v))
        .map(|v| {
            let (peers, payload, v) = (peers.clone(), payload.clone(), *v);
            async move {
                let ch = peers.channel(v)?;
                let mut client = RaftTransportClient::new(ch)
                    .max_decoding_message_size(MAX_MESSAGE_BYTES)
                    .max_encoding_message_size(MAX_MESSAGE_BYTES);
                let rpc = RaftRequest {
                    group_id: group,
                    payload: payload.into(),
                    cluster_id: peers.cluster_id(),
                };
                let timeout = Duration::from_millis(PRE_VOTE_TIMEOUT_MS);
                let reply = tokio::time::timeout(timeout, client.pre_vote(rpc))
                    .await
                    .ok()?
                    .ok()?;
                raft_log::codec::decode::<bool>(&reply.into_inner().payload).ok()
            }
        })
        .collect();
    let mut yes = 1;
    // `asks` holds the voters still to answer.
    while yes < need && yes + asks.len() >= need {
        let Some(answer) = asks.next().await else {
            break;
        };
        if answer == Some(true) {
            yes += 1;
        }
    }
    tracing::debug!(
        group,
        yes,
        need,
        ms = started.elapsed().as_millis() as u64,
        "pre-vote round"
    );
    yes >= need
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(leads: bool, hears_live_leader: bool) -> VoterView {
        VoterView {
            leads,
            hears_live_leader,
        }
    }

    #[test]
    fn a_leader_never_grants() {
        assert!(!grant(&view(true, false)));
    }

    #[test]
    fn a_follower_hearing_a_live_leader_refuses() {
        assert!(!grant(&view(false, true)));
    }

    #[test]
    fn a_follower_that_lost_its_leader_grants() {
        assert!(grant(&view(false, false)));
    }

    #[test]
    fn requests_round_trip_through_the_raft_codec() -> Result<(), raft_log::StoreError> {
        let r = PreVoteRequest { candidate: 7 };
        let b = raft_log::codec::encode(&r)?;
        assert_eq!(raft_log::codec::decode::<PreVoteRequest>(&b)?, r);
        Ok(())
    }
}
