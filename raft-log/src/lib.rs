//! `raft-log`: openraft 0.9.25 storage-v2 (`RaftLogStorage` + `RaftStateMachine`) for many
//! Raft groups in one node (one group per queue incarnation).
//!
//! - [`NodeStore`]: the node's storage: a write-ahead log shared by all groups (`wal/`), one
//!   snapshot file per group (`snapshots/`), a sled `Db` for node-local records (`sled/`), and
//!   the node-wide [`Flusher`] (group commit).
//! - [`LogStore`]: a group's log, vote and committed id, kept in the WAL.
//! - [`GroupStateMachine`]: a group's in-memory [`Machine`] + persisted snapshot (`snapshots/<gid>.snap`).
//! - [`codec`]: the byte format (bincode 2 standard config).
//!
//! Recovery model: the machine is not persisted on every apply; its durable form is the last
//! snapshot plus the committed log tail, which openraft re-applies at `Raft::new`
//! (architecture-anchors §1.5, §2.7). Keep a snapshot policy active (`LogsSinceLast(n)`).

#![warn(missing_docs)]

pub mod codec;
pub mod durable;
mod error;
mod flusher;
pub mod keys;
mod log_store;
mod machine;
mod node_store;
mod snapshot;
mod state_machine;
mod wal;

/// Largest encoded Raft entry the log accepts (bytes); `append` refuses larger ones with
/// [`StoreError::TooLarge`]. Writers must bound their entries below it.
pub const MAX_ENTRY_BYTES: usize = wal::MAX_ENTRY_BYTES;

/// Identifier of one Raft group: a fresh u64 per queue incarnation, never reused (pitfall P9).
pub type GroupId = u64;

pub use durable::DurableIndex;
pub use error::StoreError;
pub use flusher::{BusyHint, FlushCallback, Flusher, FlusherStats, WeakFlusher, BUSY_BATCH};
pub use log_store::LogStore;
pub use machine::{ApplyMeta, Machine};
pub use node_store::{fail_stop, NodeStore, StoreOptions};
pub use snapshot::{SnapshotHeader, SnapshotPayload};
pub use state_machine::{GroupSnapshotBuilder, GroupStateMachine, GroupTypeConfig};
pub use wal::{parse_truncate_at, seg_file_name};

/// Entry points for the fuzz targets (`broker/fuzz`); not an API.
#[doc(hidden)]
pub mod fuzzing {
    /// Splits `data` into three segment files (first byte: split points; 0 puts everything
    /// in the third, after two empty ones), then opens
    /// the WAL over them: recovery must succeed, cut a tail or refuse with an error — never
    /// panic. The files live in a fresh directory under the system temp dir, removed after.
    pub fn recover_segments(data: &[u8]) {
        use std::sync::atomic::{AtomicU64, Ordering};
        static RUN: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "raft-log-fuzz-{}-{}",
            std::process::id(),
            RUN.fetch_add(1, Ordering::Relaxed)
        ));
        if std::fs::create_dir_all(&dir).is_err() {
            return;
        }
        let (cut, rest) = data.split_first().map_or((0, data), |(c, r)| (*c, r));
        let a = (usize::from(cut & 0x0f) * rest.len()) / 16;
        let b = a + (usize::from(cut >> 4) * (rest.len() - a)) / 16;
        for (n, part) in [&rest[..a], &rest[a..b], &rest[b..]]
            .into_iter()
            .enumerate()
        {
            let _ = std::fs::write(dir.join(crate::seg_file_name(n as u64 + 1)), part);
        }
        let opts = crate::wal::WalOptions {
            on_failure: |_| {},
            ..crate::wal::WalOptions::default()
        };
        let _ = crate::wal::Wal::open(&dir, opts);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
