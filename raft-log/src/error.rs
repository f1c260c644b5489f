//! `StoreError`: everything that can go wrong inside `raft-log`, and its mapping onto openraft's
//! `StorageError` (which shuts the Raft group down, openraft `storage_error.rs`: "An application
//! returning this error will shutdown the Openraft node immediately").

use openraft::{ErrorSubject, ErrorVerb, NodeId, StorageError, StorageIOError};

/// Errors of the Raft storage (write-ahead log, snapshot files, sled node records).
///
/// Inside openraft trait methods these are converted with [`StoreError::into_storage`] into
/// `StorageError::IO` carrying the subject (vote, logs, snapshot, state machine) and the verb
/// (read, write, delete) of the failed operation.
#[derive(thiserror::Error, Debug)]
pub enum StoreError {
    /// sled reported an error (I/O, corruption detected by sled, unsupported operation).
    #[error("sled: {0}")]
    Sled(#[from] sled::Error),

    /// A value could not be encoded with the bincode 2 standard config (see [`crate::codec`]).
    #[error("encode: {0}")]
    Encode(#[from] bincode::error::EncodeError),

    /// Bytes read from disk or received in a snapshot could not be decoded.
    #[error("decode: {0}")]
    Decode(#[from] bincode::error::DecodeError),

    /// Bytes decoded but violate an invariant (bad key length, trailing bytes, snapshot header
    /// disagreeing with its `SnapshotMeta`, …).
    #[error("corrupt data: {0}")]
    Corrupt(String),

    /// A write or sync failed: the WAL's `fdatasync`, a snapshot file's write, `fsync` or
    /// rename, or sled's files' `fsync`.
    #[error("flush failed: {0}")]
    Flush(#[source] std::io::Error),

    /// The flusher thread is gone (it panicked, or could not be started); nothing can be made
    /// durable any more.
    #[error("flusher stopped")]
    FlusherStopped,

    /// An entry larger than a WAL record can hold ([`crate::MAX_ENTRY_BYTES`]); nothing was
    /// written.
    #[error("entry too large: {0}")]
    TooLarge(String),

    /// The store is still in use (e.g. `NodeStore::close` timed out waiting for handles).
    #[error("store busy: {0}")]
    Busy(String),

    /// A [`crate::Machine`] failed to serialize or restore itself, or its lock was poisoned by a
    /// panic inside `apply`.
    #[error("state machine: {0}")]
    Machine(String),
}

impl StoreError {
    /// Build a [`StoreError::Machine`] from any message; for `Machine::snapshot`/`restore` impls.
    pub fn machine(msg: impl ToString) -> Self {
        StoreError::Machine(msg.to_string())
    }

    /// Build a [`StoreError::Corrupt`] from any message.
    pub fn corrupt(msg: impl ToString) -> Self {
        StoreError::Corrupt(msg.to_string())
    }

    /// Convert into openraft's `StorageError::IO` with the given subject and verb.
    pub fn into_storage<NID: NodeId>(
        self,
        subject: ErrorSubject<NID>,
        verb: ErrorVerb,
    ) -> StorageError<NID> {
        StorageIOError::new(subject, verb, &self).into()
    }
}

/// `result.sto(subject, verb)`: map a `StoreError` result into an openraft `StorageError` result.
/// (openraft's `StorageError` is large; the trait methods must return it, so allow it here.)
#[allow(clippy::result_large_err)]
pub(crate) trait StoreResultExt<T> {
    fn sto<NID: NodeId>(
        self,
        subject: ErrorSubject<NID>,
        verb: ErrorVerb,
    ) -> Result<T, StorageError<NID>>;
}

#[allow(clippy::result_large_err)]
impl<T, E: Into<StoreError>> StoreResultExt<T> for Result<T, E> {
    fn sto<NID: NodeId>(
        self,
        subject: ErrorSubject<NID>,
        verb: ErrorVerb,
    ) -> Result<T, StorageError<NID>> {
        self.map_err(|e| e.into().into_storage(subject, verb))
    }
}
