//! Starting a Raft group on this node: a new queue's group seeded with its
//! preferred leader's first term, or initialized with its voters and the
//! campaigns of its preferred leader; and the leadership a replica restores
//! from its vote at startup.

use std::collections::BTreeMap;
use std::time::Duration;

use openraft::BasicNode;

use super::types::{GroupCommand, Origin, Raft, TypeConfig};
use crate::error::NodeError;

/// A new queue's preferred leader campaigns this many times, this often,
/// until a leader is known (about the election sweep's grace for new
/// replicas, cluster::elections).
const PREFERRED_CAMPAIGNS: u32 = 20;
const PREFERRED_CAMPAIGN_EVERY: Duration = Duration::from_millis(50);
/// How long a new queue's other members wait for the preferred leader's
/// first append before initializing the group themselves.
const UNINITIALIZED_GRACE: Duration = Duration::from_secs(2);

/// Initializes a fresh group with `voters` (every member calls this with
/// the same list, so the first log entry is the same everywhere); a group
/// that already has state keeps it. Node addresses live in [`Peers`](super::peers::Peers), not in
/// the membership, so every member writes an identical entry.
pub async fn initialize(raft: &Raft, voters: &[u64]) -> Result<(), NodeError> {
    if raft
        .is_initialized()
        .await
        .map_err(|e| NodeError::Raft(e.to_string()))?
    {
        return Ok(());
    }
    let members: BTreeMap<u64, BasicNode> =
        voters.iter().map(|v| (*v, BasicNode::new(""))).collect();
    match raft.initialize(members).await {
        Ok(()) => Ok(()),
        Err(openraft::error::RaftError::APIError(
            openraft::error::InitializeError::NotAllowed(_),
        )) => Ok(()),
        Err(e) => Err(NodeError::Raft(e.to_string())),
    }
}

/// Initializes this node's replica (`me`) of a queue group with `members`:
/// at once on the preferred leader (first member) and a sole member, after
/// [`UNINITIALIZED_GRACE`] on the others (in a background task).
///
/// Errors: openraft refuses the initialization.
pub async fn initialize_member(raft: &Raft, members: &[u64], me: u64) -> Result<(), NodeError> {
    // openraft's initialize campaigns at once. Only the preferred
    // leader (first member) and sole members initialize now; the
    // others take the membership from the leader's first append,
    // or initialize themselves (and campaign) after a grace if
    // none came (the preferred leader died before it could lead).
    let preferred = members.first() == Some(&me);
    if preferred || members == [me] {
        initialize(raft, members).await?;
    } else {
        let (raft, members) = (raft.clone(), members.to_vec());
        tokio::spawn(async move {
            tokio::time::sleep(UNINITIALIZED_GRACE).await;
            if let Err(e) = initialize(&raft, &members).await {
                tracing::warn!(error = %e, "initializing a queue replica failed");
            }
        });
    }
    Ok(())
}

/// Starts this node's (`me`) replica of a queue group with `members` in a
/// background task: [`initialize_member`], then [`campaign_if_preferred`].
/// Nothing waits for it: a declaring channel answers once the replica is
/// open (RabbitMQ's declare-ok follows the queue record's commit and the
/// start of its members), and a publish or consume right after waits in
/// the proposer for the leader ([`Route::send_until_done`]). Awaiting the
/// initialization (a vote fsync) and the election cost every declare two
/// fsyncs and a vote round trip, serialized behind the group-creation lock
/// (issue 31). `fresh`: the replica had no log and no vote when opened
/// ([`is_fresh`]).
///
/// [`Route::send_until_done`]: super::route::Route::send_until_done
pub fn start_member(raft: &Raft, members: &[u64], me: u64, fresh: bool) {
    let (raft, members) = (raft.clone(), members.to_vec());
    tokio::spawn(async move {
        if let Err(e) = initialize_member(&raft, &members, me).await {
            tracing::warn!(error = %e, "initializing a queue replica failed");
            return;
        }
        campaign_if_preferred(&raft, &members, me, fresh);
    });
}

/// Has this node (`me`), when it is the preferred leader of a queue group
/// with `members`, campaign until a leader is known (in a background task;
/// [`PREFERRED_CAMPAIGNS`] times, every [`PREFERRED_CAMPAIGN_EVERY`]).
/// `fresh`: the group had no log and no vote when this node opened it.
pub fn campaign_if_preferred(raft: &Raft, members: &[u64], me: u64, fresh: bool) {
    // In a new group the preferred leader (first member) campaigns
    // until a leader is known (the other members open their
    // replicas when they apply the queue record, a little later);
    // the election sweep takes over after its grace. A group with a
    // term is reopening (restart): its leader may be alive, and a
    // campaign from a replica that missed entries would only
    // depose it (openraft 0.9 has no pre-vote); a sole member
    // campaigns all the same.
    let sole = members == [me];
    if (fresh || sole) && members.first() == Some(&me) {
        let raft = raft.clone();
        tokio::spawn(async move {
            // The first campaign was openraft's initialize (new
            // group) or is the first one here (sole member).
            if !fresh {
                let _ = raft.trigger().elect().await;
            }
            for _ in 0..PREFERRED_CAMPAIGNS {
                tokio::time::sleep(PREFERRED_CAMPAIGN_EVERY).await;
                if raft.current_leader().await.is_some() {
                    return;
                }
                let _ = raft.trigger().elect().await;
            }
        });
    }
}

/// The term a seeded group starts in ([`seed_new_group`]): its preferred
/// leader's first.
const SEEDED_TERM: u64 = 1;

/// Writes this node's (`me`) replica of a queue group created just now with
/// `members` (preferred leader first) in the state an election of the
/// preferred leader in term 1 would leave it: the membership entry
/// openraft's `initialize` writes (log id 0, the same bytes on every
/// member), the vote of term 1 for the preferred leader, committed, and
/// the blank entry that leader appends first in term 1 (log id 1, the same
/// bytes on every member). openraft then starts the preferred leader as
/// leader (`Engine::startup`: its own committed vote; the blank entry is
/// already its term's first, so `become_leader` appends none) and the
/// others as its followers, with no initialization, no vote round and no
/// entry to replicate: the leader's first append finds every entry in
/// place, and commits the blank entry on its answers (issue 31: the blank
/// entry openraft appended itself cost every member an append and a sync
/// per new queue). Returns the wait for the seed to be durable
/// ([`SeedSync`]; its sync is already requested): the replica's Raft starts
/// at once, but sends and answers nothing before it ends.
///
/// Safe because the term-1 vote is granted by construction, not by a vote:
/// every member of the creation takes it, and only for a group whose
/// creation this node applied and nobody changed since
/// ([`MetaGroup::take_newborn`](super::meta_group::MetaGroup::take_newborn)),
/// opened with nothing stored. The preferred leader leads term 1 at once,
/// but only locally until its seed is durable: it sends no append (nor
/// vote) before (`cluster::transport`), so no member acts on a leadership
/// a crash can take away (were it fresh again, it would start by election,
/// in a later term; with part of the seed, from that part, which no member
/// saw). A follower answers no append before its seed is durable
/// (`cluster::server`): a blank entry the leader commits on its answer is
/// durable on a majority, as an appended one would be. A follower's seed
/// lost to a crash before that is what the leader's first append or a
/// later election gives it again. (The preferred leader used to wait for
/// the sync before its Raft started: one sync more in every declare's
/// reply, issue 31.)
///
/// Errors: the WAL refuses the writes.
pub fn seed_new_group(
    log: &mut raft_log::LogStore<TypeConfig>,
    members: &[u64],
) -> Result<SeedSync, NodeError> {
    let Some(&leader) = members.first() else {
        return Err(NodeError::Raft("a new group needs members".into()));
    };
    let voters: BTreeMap<u64, BasicNode> =
        members.iter().map(|v| (*v, BasicNode::new(""))).collect();
    let first = openraft::Entry::<TypeConfig> {
        log_id: openraft::LogId::default(),
        payload: openraft::EntryPayload::Membership(openraft::Membership::from(voters)),
    };
    let blank = openraft::Entry::<TypeConfig> {
        log_id: openraft::LogId::new(
            openraft::CommittedLeaderId::new(SEEDED_TERM, leader),
            SEEDED_LAST_INDEX,
        ),
        payload: openraft::EntryPayload::Blank,
    };
    let vote = openraft::Vote::new_committed(SEEDED_TERM, leader);
    log.seed(&vote, [first, blank])
        .map_err(|e| NodeError::Raft(e.to_string()))?;
    Ok(SeedSync::new(log.durable(), SEEDED_LAST_INDEX))
}

/// The index of the last entry [`seed_new_group`] writes (its blank entry).
const SEEDED_LAST_INDEX: u64 = 1;

/// A seeded replica's wait for its seed ([`seed_new_group`]) to be durable:
/// before the preferred leader sends its first append (it announces the
/// term-1 leadership the seed's vote holds), and before a follower answers
/// one (its answer acknowledges the seeded entries, and the leader commits
/// on it). Done once; later appends go through openraft's own append, which
/// is durable before it is acknowledged.
pub struct SeedSync {
    durable: raft_log::DurableIndex<u64>,
    last: u64,
    done: std::sync::atomic::AtomicBool,
}

impl SeedSync {
    /// The wait for log index `last` (the seed's last entry) to be durable in
    /// the replica whose durable mark is `durable`.
    pub(crate) fn new(durable: raft_log::DurableIndex<u64>, last: u64) -> Self {
        SeedSync {
            durable,
            last,
            done: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Returns once the seed is durable (at once after the first time).
    ///
    /// Errors: the sync failed (the node stops on a failed sync).
    pub async fn wait(&self) -> Result<(), NodeError> {
        use std::sync::atomic::Ordering;
        if self.done.load(Ordering::Acquire) {
            return Ok(());
        }
        self.durable
            .wait_for(self.last)
            .await
            .map_err(|e| NodeError::Raft(e.to_string()))?;
        self.done.store(true, Ordering::Release);
        Ok(())
    }
}

/// True when this replica holds nothing yet: no vote, no log entry, no
/// snapshot (a new group, or a member that never heard from it).
pub async fn is_fresh<S>(log: &mut S) -> bool
where
    S: openraft::storage::RaftLogStorage<TypeConfig>,
{
    let no_vote = matches!(log.read_vote().await, Ok(None));
    no_vote && matches!(log.get_log_state().await, Ok(s) if s.last_log_id.is_none())
}

/// True when openraft will restore this replica as leader at startup: its
/// persisted vote is its own and committed (openraft 0.9
/// `Engine::startup`). Such a leader appends no blank entry in this boot.
pub async fn restores_as_leader<S>(log: &mut S, me: u64) -> bool
where
    S: openraft::storage::RaftLogStorage<TypeConfig>,
{
    matches!(log.read_vote().await, Ok(Some(v)) if v.is_committed() && v.leader_id().voted_for() == Some(me))
}

/// Appends [`GroupCommand::LeaderRestored`] for a replica restored as
/// leader, so the queue re-issues its leader-only effects (deliveries of
/// checked-out messages, held dead letters, timers) once every entry
/// before it is applied, as a new leader's blank entry does. Gives up when
/// leadership moved (the new leader's blank entry does the same) or after
/// a few failed tries.
pub async fn mark_restored_leadership(raft: Raft, origin: Origin, queue: String) {
    for _ in 0..10 {
        match raft
            .client_write(GroupCommand::LeaderRestored { origin })
            .await
        {
            Ok(_) => {
                tracing::info!(%queue, "queue leader restored from its vote: re-issued its deliveries and timers");
                return;
            }
            Err(openraft::error::RaftError::APIError(
                openraft::error::ClientWriteError::ForwardToLeader(_),
            )) => return,
            Err(e) => {
                tracing::debug!(%queue, error = %e, "marking a restored leadership failed; retrying");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use openraft::storage::RaftLogStorage;
    use openraft::Vote;
    use raft_log::NodeStore;

    use super::*;

    /// openraft restores a replica as leader only from its own committed
    /// vote; that is when `LeaderRestored` must be appended.
    #[tokio::test]
    async fn restores_as_leader_only_from_its_own_committed_vote() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let store = NodeStore::open(dir.path(), 1 << 20)?;
        let mut log = store.log_store::<TypeConfig>(1)?;
        assert!(!restores_as_leader(&mut log, 2).await, "no vote yet");
        let cases = [
            (Vote::new(3, 2), false),           // own, not granted by a quorum
            (Vote::new_committed(4, 1), false), // another node's leadership
            (Vote::new_committed(5, 2), true),  // own, committed
        ];
        for (vote, restored) in cases {
            log.save_vote(&vote).await?;
            assert_eq!(restores_as_leader(&mut log, 2).await, restored, "{vote:?}");
        }
        Ok(())
    }

    /// A seeded group is what openraft's startup restores as led by the
    /// preferred leader: its own committed vote there, the same committed
    /// vote on a follower, and the membership entry at log id 0 on both.
    #[tokio::test]
    async fn a_seeded_group_starts_led_by_its_preferred_leader() -> anyhow::Result<()> {
        use openraft::storage::RaftLogReader;
        let dir = tempfile::tempdir()?;
        let store = NodeStore::open(dir.path(), 1 << 20)?;
        let members = [2, 1, 3];
        for me in [2, 1] {
            // One store per node in a real cluster; one group id each here.
            let mut log = store.log_store::<TypeConfig>(10 + me)?;
            assert!(is_fresh(&mut log).await);
            let seed = seed_new_group(&mut log, &members)?;
            // Every member (the preferred leader before its first send, a
            // follower before its first answer) waits for the seed's sync,
            // which the seed requested: the wait ends once it is durable.
            tokio::time::timeout(Duration::from_secs(5), seed.wait()).await??;
            assert!(
                log.durable().last().is_some_and(|l| l.index >= 1),
                "node {me}: the seed is durable"
            );
            assert!(!is_fresh(&mut log).await, "seeded");
            assert_eq!(restores_as_leader(&mut log, me).await, me == 2, "node {me}");
            assert_eq!(log.read_vote().await?, Some(Vote::new_committed(1, 2)));
            let entries = log.try_get_log_entries(0..3).await?;
            let [first, blank] = entries.as_slice() else {
                anyhow::bail!("two entries expected, got {entries:?}");
            };
            assert_eq!(
                blank.log_id,
                openraft::LogId::new(openraft::CommittedLeaderId::new(1, 2), 1),
                "the blank entry of the preferred leader's term 1"
            );
            assert!(matches!(blank.payload, openraft::EntryPayload::Blank));
            assert_eq!(first.log_id, openraft::LogId::default());
            let openraft::EntryPayload::Membership(m) = &first.payload else {
                anyhow::bail!("not a membership entry: {first:?}");
            };
            let voters: Vec<u64> = m.voter_ids().collect();
            assert_eq!(voters, vec![1, 2, 3]);
        }
        Ok(())
    }

    /// A replica is new only while it has neither a vote nor a log entry.
    #[tokio::test]
    async fn fresh_until_a_vote_or_an_entry() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let store = NodeStore::open(dir.path(), 1 << 20)?;
        let mut log = store.log_store::<TypeConfig>(1)?;
        assert!(is_fresh(&mut log).await, "nothing stored yet");
        log.save_vote(&Vote::new(1, 2)).await?;
        assert!(!is_fresh(&mut log).await, "a vote is state");
        Ok(())
    }
}
