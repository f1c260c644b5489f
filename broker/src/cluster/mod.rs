//! Everything between nodes: the openraft type configuration, the node
//! table and its channels, the group-tagged Raft transport (client and
//! server; small RPCs multiplexed on one stream per peer, `frames`), finding and forwarding to leaders (`route`, the meta group's
//! `meta_group`), deliveries to remote consumers, the failure detector and
//! the elections it starts, placing and bootstrapping groups (`placement`,
//! `bootstrap`), membership changes, and per-group Raft settings.

pub mod bootstrap;
pub mod catch_up;
pub mod commit_hints;
pub mod commit_updates;
pub mod deliveries;
pub mod detector;
pub mod drain;
pub mod elections;
pub mod forward;
pub mod frames;
pub mod groups;
pub mod in_flight;
pub mod join;
pub mod log_limit;
pub mod membership;
pub mod meta_group;
pub mod peers;
pub mod placement;
pub mod pre_vote;
pub mod quiet_runtime;
pub mod route;
pub mod secret;
pub mod server;
pub mod status;
pub mod transport;
pub mod types;

use openraft::{Config, SnapshotPolicy};

/// openraft's default settings, made once: `Config::default` parses an empty
/// command line with clap, which cost every new queue group ~2 % of a
/// declare's CPU (issue 31).
fn openraft_defaults() -> Config {
    static DEFAULTS: std::sync::OnceLock<Config> = std::sync::OnceLock::new();
    DEFAULTS.get_or_init(Config::default).clone()
}

/// A queue group's leader lease (ms): a follower that took an append from
/// its leader this recently refuses to vote for another candidate (openraft
/// 0.9 uses `election_timeout_max`). It bounds how soon a busy queue can
/// elect after its leader's node dies, so it is as short as openraft allows
/// above `heartbeat_interval` (which is also the append-entries timeout).
pub const LEADER_LEASE_MS: u64 = 110;

/// Default of the node setting `snapshot_interval`: a queue group snapshots every 4096 log
/// entries (Ra's default `snapshot_interval`).
pub const DEFAULT_SNAPSHOT_INTERVAL: u64 = 4096;

/// Raft settings of a queue group (`cluster_name` = group id, so openraft's
/// spans name the group). Queue groups are quiescent: no heartbeats and no
/// election timer (a node-level failure detector starts elections, see
/// [`elections`]); openraft's tick task, which would still wake every 1.5 ×
/// `heartbeat_interval` to send the group nothing (`enable_tick: false`:
/// ticks only drive elections and heartbeats, both off), sleeps an hour at a
/// time when the group is created through [`quiet_runtime::quiescent`]; and
/// `election_timeout_max` is the leader lease ([`LEADER_LEASE_MS`]).
// openraft's own error type; called once per group start, so its size does not matter.
#[allow(clippy::result_large_err)]
pub fn raft_config(group: u64, snapshot_interval: u64) -> Result<Config, openraft::ConfigError> {
    Config {
        cluster_name: format!("group-{group}"),
        heartbeat_interval: 100,
        election_timeout_min: 101,
        election_timeout_max: LEADER_LEASE_MS,
        enable_tick: false,
        enable_heartbeat: false,
        enable_elect: false,
        // A snapshot holds only the queue's compact index, so taking one
        // every few thousand entries keeps the log (which carries bodies) short.
        snapshot_policy: SnapshotPolicy::LogsSinceLast(snapshot_interval.max(1)),
        max_in_snapshot_log_to_keep: 256,
        purge_batch_size: 256,
        max_payload_entries: 64,
        // Do not replicate to a member more than this many entries behind by
        // log: send it the snapshot (with bodies) instead.
        replication_lag_threshold: 5000,
        ..openraft_defaults()
    }
    .validate()
}

/// Raft settings of the meta group: ordinary heartbeats and elections.
#[allow(clippy::result_large_err)]
pub fn meta_raft_config() -> Result<Config, openraft::ConfigError> {
    Config {
        cluster_name: "meta".into(),
        heartbeat_interval: 100,
        election_timeout_min: 400,
        election_timeout_max: 800,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(4096),
        max_in_snapshot_log_to_keep: 256,
        purge_batch_size: 256,
        max_payload_entries: 64,
        ..openraft_defaults()
    }
    .validate()
}
