//! `GroupStateMachine<C, M>`: openraft `RaftStateMachine` over an in-memory [`Machine`] whose
//! durable form is the persisted snapshot (`snap/<gid>`) plus the log tail.
//!
//! openraft 0.9.25 `storage/v2.rs` allows "persist every snapshot and rebuild the state machine
//! from the last snapshot on start" instead of persisting on every apply; startup then re-applies
//! `(last_applied, committed]` from the log (`storage/helper.rs::get_initial_state`, needs
//! `LogStore::save_committed`). Hence: construction restores from the persisted snapshot,
//! `build_snapshot` and `install_snapshot` persist durably before returning.
//!
//! Locking: `machine` then `applied`, always in that order, never across an `.await`. `apply`
//! holds both for a batch; the snapshot builder (run by openraft in a spawned task, concurrently
//! with `apply`) holds both while serializing, so the bytes and the applied position agree (P7).

use std::io::Cursor;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    Entry, EntryPayload, ErrorSubject, ErrorVerb, LogId, OptionalSend, RaftSnapshotBuilder,
    RaftTypeConfig, SnapshotMeta, StorageError, StoredMembership,
};

use crate::durable::DurableIndex;
use crate::error::StoreResultExt;
use crate::snapshot::{SnapshotPayload, SnapshotStore};
use crate::{ApplyMeta, GroupId, Machine, StoreError};

/// Bounds `raft-log` needs on the openraft type config: the stock entry type and an in-memory
/// snapshot buffer.
pub trait GroupTypeConfig:
    RaftTypeConfig<Entry = Entry<Self>, SnapshotData = Cursor<Vec<u8>>, R: Default>
{
}
impl<C> GroupTypeConfig for C where
    C: RaftTypeConfig<Entry = Entry<C>, SnapshotData = Cursor<Vec<u8>>, R: Default>
{
}

struct Applied<C: RaftTypeConfig> {
    last_applied: Option<LogId<C::NodeId>>,
    last_membership: StoredMembership<C::NodeId, C::Node>,
}

/// The state machine of one group. Obtain with `NodeStore::state_machine`; pass to
/// `openraft::Raft::new`; read application state through [`GroupStateMachine::machine`].
pub struct GroupStateMachine<C: RaftTypeConfig, M> {
    shared: Shared<C, M>,
    /// Entries are applied only once durable here (see [`crate::durable`]).
    durable: Option<DurableIndex<C::NodeId>>,
}

/// State shared by the state machine and its snapshot builders.
struct Shared<C: RaftTypeConfig, M> {
    machine: Arc<Mutex<M>>,
    applied: Arc<Mutex<Applied<C>>>,
    snapshots: SnapshotStore,
}

impl<C: RaftTypeConfig, M> Clone for Shared<C, M> {
    fn clone(&self) -> Self {
        Shared {
            machine: self.machine.clone(),
            applied: self.applied.clone(),
            snapshots: self.snapshots.clone(),
        }
    }
}

/// Tells `durable` whether membership `m` has one voter only, whose leader commits an entry
/// as soon as it is written (see [`DurableIndex::set_solo`]).
fn note_membership<NID: openraft::NodeId, N: openraft::Node>(
    durable: Option<&DurableIndex<NID>>,
    m: &StoredMembership<NID, N>,
) {
    if let Some(d) = durable {
        d.set_solo(m.membership().voter_ids().count() == 1);
    }
}

fn lock<T>(m: &Mutex<T>) -> Result<MutexGuard<'_, T>, StoreError> {
    m.lock()
        .map_err(|_| StoreError::machine("lock poisoned by a panic in Machine::apply/restore"))
}

impl<C: GroupTypeConfig, M: Machine<C>> GroupStateMachine<C, M> {
    /// Wrap `machine`, first restoring it from the group's persisted snapshot if there is one.
    pub(crate) fn open(snapshots: SnapshotStore, mut machine: M) -> Result<Self, StoreError> {
        let mut applied = Applied {
            last_applied: None,
            last_membership: StoredMembership::default(),
        };
        if let Some((meta, data)) = snapshots.load::<C::NodeId, C::Node>()? {
            let payload = SnapshotPayload::<C::NodeId, C::Node>::decode(&data)?;
            payload.check_meta(&meta)?;
            machine.restore(&payload.machine)?;
            tracing::info!(group = snapshots.group(), last_applied = ?meta.last_log_id, "restored state machine from snapshot");
            applied = Applied {
                last_applied: meta.last_log_id,
                last_membership: meta.last_membership,
            };
        }
        let shared = Shared {
            machine: Arc::new(Mutex::new(machine)),
            applied: Arc::new(Mutex::new(applied)),
            snapshots,
        };
        Ok(GroupStateMachine {
            shared,
            durable: None,
        })
    }

    /// Apply an entry only once `durable` (the group's log, see
    /// [`crate::LogStore::durable`]) covers it: required with
    /// [`crate::LogStore::ack_own_entries`], where openraft may commit a leader's entry before
    /// the leader's own copy is synced.
    pub fn apply_when_durable(mut self, durable: DurableIndex<C::NodeId>) -> Self {
        if let Ok(applied) = self.shared.applied.lock() {
            note_membership(Some(&durable), &applied.last_membership);
        }
        self.durable = Some(durable);
        self
    }

    /// The application state. Lock it briefly: `apply` and snapshot builds wait on this lock.
    pub fn machine(&self) -> Arc<Mutex<M>> {
        self.shared.machine.clone()
    }

    /// The group this state machine belongs to.
    pub fn group(&self) -> GroupId {
        self.shared.snapshots.group()
    }

    /// Last log id applied to the machine (or restored from a snapshot).
    ///
    /// Errors: [`StoreError::Machine`] if the lock was poisoned.
    pub fn last_applied(&self) -> Result<Option<LogId<C::NodeId>>, StoreError> {
        Ok(lock(&self.shared.applied)?.last_applied.clone())
    }
}

impl<C: GroupTypeConfig, M: Machine<C>> Shared<C, M> {
    /// Serialize machine + applied position under both locks, then persist durably.
    async fn build(&self) -> Result<Snapshot<C>, StoreError> {
        let payload = {
            let mut machine = lock(&self.machine)?;
            let applied = lock(&self.applied)?;
            SnapshotPayload::<C::NodeId, C::Node> {
                last_applied: applied.last_applied.clone(),
                last_membership: applied.last_membership.clone(),
                machine: machine.snapshot()?,
            }
        };
        let data = payload.encode()?;
        let meta = SnapshotMeta {
            snapshot_id: snapshot_id(self.snapshots.group(), &payload.last_applied),
            last_log_id: payload.last_applied,
            last_membership: payload.last_membership,
        };
        self.snapshots.save(&meta, &data).await?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

/// Unique snapshot id: `<group>-<term>-<index>-<unix ns>`.
fn snapshot_id<NID: openraft::NodeId>(group: GroupId, last: &Option<LogId<NID>>) -> String {
    let ns = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    match last {
        Some(l) => format!("{group}-{}-{}-{ns}", l.leader_id.term, l.index),
        None => format!("{group}-0-none-{ns}"),
    }
}

/// Snapshot builder handed to openraft; shares the machine and applied position with the state
/// machine it came from.
pub struct GroupSnapshotBuilder<C: RaftTypeConfig, M> {
    shared: Shared<C, M>,
}

impl<C: GroupTypeConfig, M: Machine<C>> RaftSnapshotBuilder<C> for GroupSnapshotBuilder<C, M> {
    async fn build_snapshot(&mut self) -> Result<Snapshot<C>, StorageError<C::NodeId>> {
        self.shared
            .build()
            .await
            .sto(ErrorSubject::Snapshot(None), ErrorVerb::Write)
    }
}

impl<C: GroupTypeConfig, M: Machine<C>> RaftStateMachine<C> for GroupStateMachine<C, M> {
    type SnapshotBuilder = GroupSnapshotBuilder<C, M>;

    async fn applied_state(
        &mut self,
    ) -> Result<
        (
            Option<LogId<C::NodeId>>,
            StoredMembership<C::NodeId, C::Node>,
        ),
        StorageError<C::NodeId>,
    > {
        let applied =
            lock(&self.shared.applied).sto(ErrorSubject::StateMachine, ErrorVerb::Read)?;
        Ok((
            applied.last_applied.clone(),
            applied.last_membership.clone(),
        ))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<C::R>, StorageError<C::NodeId>>
    where
        I: IntoIterator<Item = C::Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let group = self.group();
        let entries: Vec<C::Entry> = entries.into_iter().collect();
        if let (Some(durable), Some(last)) = (&self.durable, entries.last()) {
            durable
                .make_durable(&last.log_id)
                .await
                .sto(ErrorSubject::Logs, ErrorVerb::Write)?;
        }
        let mut machine =
            lock(&self.shared.machine).sto(ErrorSubject::StateMachine, ErrorVerb::Write)?;
        let mut applied =
            lock(&self.shared.applied).sto(ErrorSubject::StateMachine, ErrorVerb::Write)?;
        let mut replies = Vec::new();
        for entry in entries {
            let log_id = entry.log_id;
            let reply = match entry.payload {
                EntryPayload::Blank => {
                    let meta = ApplyMeta {
                        group,
                        index: log_id.index,
                        term: log_id.leader_id.term,
                    };
                    machine.leader_blank(&meta, log_id.leader_id.node_id.clone());
                    C::R::default()
                }
                EntryPayload::Normal(cmd) => {
                    tracing::trace!(target: "timeline", ev = "apply", group, index = log_id.index);
                    let meta = ApplyMeta {
                        group,
                        index: log_id.index,
                        term: log_id.leader_id.term,
                    };
                    machine.apply(&meta, cmd)
                }
                EntryPayload::Membership(m) => {
                    applied.last_membership = StoredMembership::new(Some(log_id.clone()), m);
                    note_membership(self.durable.as_ref(), &applied.last_membership);
                    C::R::default()
                }
            };
            applied.last_applied = Some(log_id);
            replies.push(reply);
        }
        Ok(replies)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        GroupSnapshotBuilder {
            shared: self.shared.clone(),
        }
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<Cursor<Vec<u8>>>, StorageError<C::NodeId>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<C::NodeId, C::Node>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<C::NodeId>> {
        let subject = || ErrorSubject::Snapshot(Some(meta.signature()));
        let data = snapshot.into_inner();
        let payload =
            SnapshotPayload::<C::NodeId, C::Node>::decode(&data).sto(subject(), ErrorVerb::Read)?;
        payload.check_meta(meta).sto(subject(), ErrorVerb::Read)?;
        {
            let mut machine = lock(&self.shared.machine).sto(subject(), ErrorVerb::Write)?;
            let mut applied = lock(&self.shared.applied).sto(subject(), ErrorVerb::Write)?;
            machine
                .restore(&payload.machine)
                .sto(subject(), ErrorVerb::Write)?;
            applied.last_applied = meta.last_log_id.clone();
            applied.last_membership = meta.last_membership.clone();
            note_membership(self.durable.as_ref(), &applied.last_membership);
        }
        tracing::info!(group = self.group(), last_log_id = ?meta.last_log_id, "installed snapshot");
        self.shared
            .snapshots
            .save(meta, &data)
            .await
            .sto(subject(), ErrorVerb::Write)?;
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<C>>, StorageError<C::NodeId>> {
        let loaded = self
            .shared
            .snapshots
            .load::<C::NodeId, C::Node>()
            .sto(ErrorSubject::Snapshot(None), ErrorVerb::Read)?;
        Ok(loaded.map(|(meta, data)| Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        }))
    }
}
