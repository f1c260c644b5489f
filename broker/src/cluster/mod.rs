//! Raft plumbing shared by all groups: type configuration, the transport,
//! and per-group Raft settings.

pub mod network;
pub mod status;
pub mod types;

use openraft::{Config, SnapshotPolicy};

/// Raft settings for a group (`cluster_name` = group id, so openraft's
/// spans name the group). Single-node elections settle in under a second.
// openraft's own error type; called once per group start, so its size does not matter.
#[allow(clippy::result_large_err)]
pub fn raft_config(group: u64) -> Result<Config, openraft::ConfigError> {
    Config {
        cluster_name: format!("group-{group}"),
        heartbeat_interval: 100,
        election_timeout_min: 300,
        election_timeout_max: 600,
        // A snapshot holds only the queue's compact index, so taking one
        // every 4096 entries keeps the log (which carries bodies) short.
        snapshot_policy: SnapshotPolicy::LogsSinceLast(4096),
        max_in_snapshot_log_to_keep: 256,
        purge_batch_size: 256,
        max_payload_entries: 64,
        ..Default::default()
    }
    .validate()
}
