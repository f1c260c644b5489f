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
/// Groups a sweep of every group visits per second at most between detector
/// changes: with more groups than this, sweeps of every group come further
/// apart than [`IDLE_SWEEP_MS`] (at 50,000 groups every 5 s). A sweep of
/// 40,000 groups every second was 7–11 % of a node's CPU while declaring,
/// and declares slowed from ~690/s to ~370/s between 1 and 50,000 queues
/// (issue 31). A node going down still sweeps every group at once.
const FULL_SWEEP_GROUPS_PER_S: usize = 10_000;
/// A sweep yields to the runtime after this many groups, so that a sweep of
/// tens of thousands does not hold a worker thread for tens of ms.
const SWEEP_YIELD_EVERY: usize = 1024;

/// The longest time between two sweeps of every one of `groups` groups.
fn full_sweep_every(groups: usize) -> Duration {
    let paced = (groups as u64).saturating_mul(1000) / FULL_SWEEP_GROUPS_PER_S as u64;
    Duration::from_millis(paced.max(IDLE_SWEEP_MS))
}
/// Length of a member's first turn (ms); see [`my_turn`].
const RANK_DELAY_MS: u64 = 150;
/// A turn is at most `RANK_DELAY_MS << MAX_TURN_DOUBLINGS` long (2.4 s).
const MAX_TURN_DOUBLINGS: u32 = 4;
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

/// At most this many groups of this node are in a pre-vote round at once. A node that
/// finds thousands of groups leaderless at once (a restart, a peer's death at 10,000
/// queues) asks for them in waves: the sweep takes the next groups as rounds end (issue 31).
const MAX_PRE_VOTES: usize = 256;

/// The groups with a pre-vote round (and maybe a campaign) in flight.
#[derive(Default, Clone)]
struct PreVoteRounds(Arc<std::sync::Mutex<HashSet<u64>>>);

impl PreVoteRounds {
    /// True when `group` may start a round: it has none in flight and fewer than
    /// [`MAX_PRE_VOTES`] are.
    fn admits(&self, group: u64) -> bool {
        self.0
            .lock()
            .is_ok_and(|s| s.len() < MAX_PRE_VOTES && !s.contains(&group))
    }

    /// Marks `group` in flight until the returned guard drops.
    fn start(&self, group: u64) -> RoundGuard {
        if let Ok(mut s) = self.0.lock() {
            s.insert(group);
        }
        RoundGuard {
            set: self.clone(),
            group,
        }
    }
}

/// Ends a group's pre-vote round when dropped.
struct RoundGuard {
    set: PreVoteRounds,
    group: u64,
}

impl Drop for RoundGuard {
    fn drop(&mut self) {
        if let Ok(mut s) = self.set.0.lock() {
            s.remove(&self.group);
        }
    }
}

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
        let pre_votes = PreVoteRounds::default();
        let sweep = Duration::from_millis(SWEEP_MS);
        let mut idle_sweep = full_sweep_every(0);
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
                let all = groups.all();
                idle_sweep = full_sweep_every(all.len());
                all
            } else {
                state
                    .keys()
                    .filter_map(|g| groups.get(*g).map(|r| (*g, r)))
                    .collect()
            };
            let mut seen = HashSet::new();
            for (i, (group, replica)) in visit.into_iter().enumerate() {
                if i > 0 && i % SWEEP_YIELD_EVERY == 0 {
                    tokio::task::yield_now().await;
                }
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
                let reachable = voters.iter().filter(|v| detector.is_alive(**v)).count();
                if reachable < voters.len() / 2 + 1 {
                    // No majority of the voters is up as the detector sees them (a
                    // draining voter still votes): no campaign can win. A node that
                    // lost its peers (a restart whose detector has not reached them
                    // yet, a partition) asks nothing until they are back; their
                    // return is a detector change, which sweeps every group again.
                    continue;
                }
                if !pre_votes.admits(group) {
                    continue;
                }
                live.sort_unstable();
                let rank = live.iter().position(|v| *v == me).unwrap_or(0) as u64;
                let n = live.len().max(1) as u64;
                let elapsed = now.duration_since(start).as_millis() as u64;
                let my_turn = my_turn(elapsed, rank, n);
                let rested = st
                    .last_try
                    .is_none_or(|t| now.duration_since(t) >= Duration::from_millis(RETRY_MS));
                if my_turn && rested {
                    st.last_try = Some(now);
                    let (raft, peers, detector) = (raft.clone(), peers.clone(), detector.clone());
                    let pending = pre_votes.start(group);
                    tokio::spawn(async move {
                        let _pending = pending;
                        let req = PreVoteRequest { candidate: me };
                        let up = |v| detector.is_alive(v);
                        if !pre_vote::ask(&peers, me, group, &voters, up, &req).await {
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

/// Whether the member of `rank` (0-based, among `n` live voters) campaigns `elapsed_ms` after
/// the group's turns started. Turn `k` goes to rank `k mod n`; the turns of the first round
/// last [`RANK_DELAY_MS`], and each later round's are twice as long as the last's, up to
/// [`MAX_TURN_DOUBLINGS`] doublings: a candidate whose vote round is slow (a loaded node)
/// gets the time to finish it before the next member raises the term. Every member computes
/// the same schedule from its own start (within tens of ms of the others').
fn my_turn(elapsed_ms: u64, rank: u64, n: u64) -> bool {
    let n = n.max(1);
    let mut at = 0u64;
    let mut turn = 0u64;
    loop {
        let doublings = (turn / n).min(u64::from(MAX_TURN_DOUBLINGS)) as u32;
        let len = RANK_DELAY_MS << doublings;
        if elapsed_ms < at + len {
            return turn % n == rank;
        }
        at += len;
        turn += 1;
        if doublings == MAX_TURN_DOUBLINGS {
            // Every later turn is `len` long: jump straight to the one holding `elapsed_ms`.
            turn += (elapsed_ms - at) / len;
            return turn % n == rank;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Who campaigns at `t` ms among `n` members.
    fn owner(t: u64, n: u64) -> Vec<u64> {
        (0..n).filter(|r| my_turn(t, *r, n)).collect()
    }

    #[test]
    fn pre_vote_rounds_are_bounded_and_end_with_their_guard() {
        let rounds = PreVoteRounds::default();
        let mut guards: Vec<RoundGuard> =
            (0..MAX_PRE_VOTES as u64).map(|g| rounds.start(g)).collect();
        assert!(!rounds.admits(MAX_PRE_VOTES as u64), "full");
        let first = guards.remove(0);
        drop(guards);
        assert!(!rounds.admits(0), "group 0's round is still in flight");
        assert!(rounds.admits(7), "group 7's ended");
        drop(first);
        assert!(rounds.admits(0));
    }

    #[test]
    fn exactly_one_member_has_each_turn() {
        for n in 1..=5 {
            for t in (0..60_000).step_by(7) {
                assert_eq!(owner(t, n).len(), 1, "n {n} t {t}");
            }
        }
    }

    #[test]
    fn the_first_round_has_short_turns_by_rank() {
        assert_eq!(owner(0, 3), vec![0]);
        assert_eq!(owner(149, 3), vec![0]);
        assert_eq!(owner(150, 3), vec![1]);
        assert_eq!(owner(300, 3), vec![2]);
        // The second round's turns are 300 ms long.
        assert_eq!(owner(450, 3), vec![0]);
        assert_eq!(owner(749, 3), vec![0]);
        assert_eq!(owner(750, 3), vec![1]);
        assert_eq!(owner(1050, 3), vec![2]);
        assert_eq!(owner(1350, 3), vec![0]);
    }

    #[test]
    fn turns_grow_to_the_cap_and_keep_rotating() {
        let cap = RANK_DELAY_MS << MAX_TURN_DOUBLINGS;
        // Rounds 0..=3 take 3 × 150 × (1 + 2 + 4 + 8) ms; every later turn is `cap` long.
        let capped_from = 3 * RANK_DELAY_MS * 15;
        for k in 0..20u64 {
            let t = capped_from + k * cap;
            assert_eq!(owner(t, 3), vec![k % 3], "turn {k} of the capped rounds");
            assert_eq!(owner(t + cap - 1, 3), vec![k % 3]);
        }
        // Hours later the schedule is still computed (no loop over every turn).
        assert_eq!(owner(capped_from + 1_000_000 * cap, 3), vec![1_000_000 % 3]);
    }

    #[test]
    fn sweeps_of_every_group_are_paced_by_the_number_of_groups() {
        assert_eq!(full_sweep_every(0), Duration::from_millis(IDLE_SWEEP_MS));
        assert_eq!(full_sweep_every(10_000), Duration::from_secs(1));
        assert_eq!(full_sweep_every(50_000), Duration::from_secs(5));
    }

    #[test]
    fn a_lone_member_always_has_the_turn() {
        for t in [0, 1, 150, 10_000, u64::MAX / 2] {
            assert!(my_turn(t, 0, 1));
        }
    }
}
