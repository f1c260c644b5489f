//! Elections for quiescent groups. Queue groups run without openraft's
//! heartbeats and election timers (an idle queue costs nothing); this sweep
//! starts an election in a group whose leader is unknown, seen down by the
//! failure detector, or no longer a voter (it removed itself). Members take
//! turns by rank (the lowest-id live, non-draining voter first, the next one
//! [`RANK_DELAY_MS`] later, ...), so a member whose log
//! is behind (its vote is refused) is followed by the next one instead of
//! every member campaigning at once. The turns start when the dead leader's
//! lease has run out ([`LEADER_LEASE_MS`] after this replica last heard from
//! it): the voters would refuse an earlier campaign. A member campaigns
//! only after a majority of the voters granted it a pre-vote
//! ([`pre_vote`]): a failure detector that lost a live leader's beats (a
//! slow link) must not raise terms and depose it.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::detector::Detector;
use super::groups::{GroupReplica, GroupTable};
use super::peers::Peers;
use super::pre_vote::{self, PreVoteRequest};
use super::types::META_GROUP;
use super::LEADER_LEASE_MS;

/// Sweep interval while some group is leaderless (ms).
const SWEEP_MS: u64 = 100;
/// Sweep interval when the last sweep found every group led (ms); also the
/// longest time between two sweeps of every group (the sweeps in between visit
/// only the groups found leaderless).
const IDLE_SWEEP_MS: u64 = 1000;
/// Delay between two members' turns (ms).
const RANK_DELAY_MS: u64 = 150;
/// A member does not campaign again within this long (ms).
const RETRY_MS: u64 = 250;
/// Added to the lease: the other voters took the dead leader's last append
/// a little after this replica did (ms).
const LEASE_MARGIN_MS: u64 = 15;
/// A replica that has not heard from a leader since it opened does not
/// campaign for this long (ms). A new queue's preferred leader (the
/// declaring node) campaigns by itself meanwhile (`Queues::open_queue`). A
/// reopened replica (every one, when the node starts) gives its leader time
/// to reach it: until the failure detector has reached the peers every
/// leader looks down, and a replica that missed entries would depose a live
/// leader by campaigning (its higher term is refused a vote but still ends
/// the leader's term; openraft 0.9 has no pre-vote).
const NEW_REPLICA_GRACE_MS: u64 = 1000;

#[derive(Default)]
struct Leaderless {
    since: Option<Instant>,
    last_try: Option<Instant>,
}

/// Runs the sweep until `groups` is dropped; pre-votes go through `peers`.
pub fn spawn(me: u64, groups: Weak<GroupTable>, detector: Arc<Detector>, peers: Arc<Peers>) {
    tokio::spawn(async move {
        let mut changes = detector.subscribe();
        let mut state: HashMap<u64, Leaderless> = HashMap::new();
        let sweep = Duration::from_millis(SWEEP_MS);
        let idle_sweep = Duration::from_millis(IDLE_SWEEP_MS);
        // The earliest lease end the last sweep waited for.
        let mut due: Option<Instant> = None;
        // When every group was last visited.
        let mut last_full: Option<Instant> = None;
        loop {
            // Nothing leaderless at the last sweep: a leader's node going down
            // wakes the sweep (`changes`); other losses (a leader removing
            // itself) wait for the slower idle sweep. At 10,000 groups a sweep
            // every 100 ms was a steady cost of an idle node (issue 31).
            let every = if state.is_empty() { idle_sweep } else { sweep };
            let wait = due.map_or(every, |d| d.saturating_duration_since(Instant::now()));
            let detector_changed = tokio::select! {
                _ = changes.changed() => true,
                _ = tokio::time::sleep(wait.min(every)) => false,
            };
            due = None;
            let Some(groups) = groups.upgrade() else {
                return;
            };
            if detector.is_draining() {
                // A draining node leads nothing: the other members campaign.
                continue;
            }
            let now = Instant::now();
            // Every group on a detector change and at least every IDLE_SWEEP_MS;
            // in between only the leaderless ones: while queues are being
            // declared some new group is nearly always leaderless, and a
            // sweep of every group each 100 ms made each declare dearer than
            // the last (issue 31).
            let full =
                detector_changed || last_full.is_none_or(|t| now.duration_since(t) >= idle_sweep);
            let visit: Vec<(u64, Arc<dyn GroupReplica>)> = if full {
                last_full = Some(now);
                groups.all()
            } else {
                state
                    .keys()
                    .filter_map(|g| groups.get(*g).map(|r| (*g, r)))
                    .collect()
            };
            let mut seen = HashSet::new();
            for (group, replica) in visit {
                if group == META_GROUP {
                    continue;
                }
                let raft = replica.raft();
                let metrics = raft.metrics();
                let m = metrics.borrow();
                let leader = m.current_leader;
                let membership = m.membership_config.membership();
                // A leader that removed itself (delete_member, which drops
                // the node from the membership entirely) leads no more once
                // the new membership is in. A map lookup: this runs for every
                // group every sweep, and `voter_ids` builds a set.
                if leader.is_some_and(|l| detector.is_alive(l) && membership.get_node(&l).is_some())
                {
                    continue;
                }
                let voters: Vec<u64> = membership.voter_ids().collect();
                drop(m);
                if !voters.contains(&me) {
                    continue;
                }
                seen.insert(group);
                let st = state.entry(group).or_default();
                let since = *st.since.get_or_insert(now);
                let lease = Duration::from_millis(LEADER_LEASE_MS + LEASE_MARGIN_MS);
                let grace = Duration::from_millis(NEW_REPLICA_GRACE_MS);
                let start = match groups.last_heard(group) {
                    Some(heard) => since.max(heard + lease),
                    None => groups
                        .opened_at(group)
                        .map_or(since, |o| since.max(o + grace)),
                };
                if now < start {
                    due = Some(due.map_or(start, |d| d.min(start)));
                    continue;
                }
                let mut live: Vec<u64> = voters
                    .iter()
                    .copied()
                    .filter(|v| detector.may_lead(*v))
                    .collect();
                live.sort_unstable();
                let rank = live.iter().position(|v| *v == me).unwrap_or(0) as u64;
                // Turns repeat: rank r campaigns at r, r + n, r + 2n, ... delays.
                let n = live.len().max(1) as u64;
                let waited = now.duration_since(start).as_millis() as u64 / RANK_DELAY_MS;
                let my_turn = waited >= rank && (waited - rank).is_multiple_of(n);
                let rested = st
                    .last_try
                    .is_none_or(|t| now.duration_since(t) >= Duration::from_millis(RETRY_MS));
                if my_turn && rested {
                    st.last_try = Some(now);
                    let (raft, peers) = (raft.clone(), peers.clone());
                    tokio::spawn(async move {
                        let req = PreVoteRequest { candidate: me };
                        if !pre_vote::ask(&peers, me, group, &voters, &req).await {
                            tracing::debug!(
                                group,
                                ?leader,
                                rank,
                                "leaderless group: pre-vote refused"
                            );
                            return;
                        }
                        tracing::debug!(group, ?leader, rank, "leaderless group: campaigning");
                        let _ = raft.trigger().elect().await;
                    });
                }
            }
            state.retain(|g, _| seen.contains(g));
        }
    });
}
