//! The contract between a group's application state (e.g. the broker's queue) and the storage.

use openraft::RaftTypeConfig;

use crate::{GroupId, StoreError};

/// Raft position of an applied entry, handed to [`Machine::apply`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ApplyMeta {
    /// The Raft group (queue incarnation) the entry belongs to.
    pub group: GroupId,
    /// Log index of the entry (1-based for client entries; 0 is openraft's initial membership).
    pub index: u64,
    /// Term of the leader that proposed the entry.
    pub term: u64,
}

/// What a group's state machine must provide.
///
/// The machine lives in memory only; its durable form is the last snapshot plus the log tail,
/// which openraft re-applies at start (`save_committed` replay, architecture-anchors §1.5). So
/// `apply` must be deterministic: same entries in the same order → same state and replies, on
/// every replica and on every restart. No I/O, clocks or randomness inside (STYLE.md).
pub trait Machine<C: RaftTypeConfig>: Send + Sync + 'static {
    /// Apply one `EntryPayload::Normal` command. Called in log order, exactly once per entry per
    /// process lifetime (again after a restart for entries after the last snapshot).
    fn apply(&mut self, meta: &ApplyMeta, cmd: C::D) -> C::R;

    /// Serialize the whole machine. Called with the machine locked, so the bytes are consistent
    /// with the last applied log id recorded next to them.
    ///
    /// Errors: any [`StoreError`] (use [`StoreError::machine`] for your own); it becomes a fatal
    /// openraft `StorageError` for the group.
    fn snapshot(&mut self) -> Result<Vec<u8>, StoreError>;

    /// Replace the machine's whole state with what `snapshot` produced (possibly on another node).
    ///
    /// Errors: malformed bytes; fatal for the group when it happens inside `install_snapshot`
    /// (pitfall P6), so validate untrusted snapshots before they reach Raft.
    fn restore(&mut self, data: &[u8]) -> Result<(), StoreError>;

    /// A leader's blank entry was applied: the first entry a leader appends when its term
    /// begins (openraft `EntryPayload::Blank`). `leader` proposed it in term `meta.term`; every
    /// entry applied after it (until the next blank) was proposed in that leadership. The queue
    /// uses it to re-issue leader-only effects a former leader may not have carried out.
    /// Default: nothing.
    fn leader_blank(&mut self, meta: &ApplyMeta, leader: C::NodeId) {
        let _ = (meta, leader);
    }
}
