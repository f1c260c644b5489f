//! sled tree names and keys of snapshots as earlier versions stored them (read when a group has
//! no snapshot file yet; snapshots now live in `snapshots/<gid>.snap`, see `snapshot.rs`); per
//! Raft group `gid` one tree:
//!
//! | tree        | key              | value                                  |
//! |-------------|------------------|----------------------------------------|
//! | `snap/<gid>`| `meta`, `data`   | codec(`SnapshotMeta`), snapshot bytes  |
//!
//! `<gid>` is the decimal group id. (Logs, votes and committed ids live in the WAL.)

use crate::GroupId;

/// `snap` key of the current snapshot's `SnapshotMeta`.
pub const SNAP_META: &[u8] = b"meta";
/// `snap` key of the current snapshot's bytes.
pub const SNAP_DATA: &[u8] = b"data";

const SNAP_PREFIX: &str = "snap/";

/// Name of the snapshot tree of `group`: `snap/<gid>`.
pub fn snap_tree(group: GroupId) -> String {
    format!("{SNAP_PREFIX}{group}")
}

/// The group a tree belongs to, if `name` is a snapshot tree name.
pub fn group_of_tree(name: &[u8]) -> Option<GroupId> {
    std::str::from_utf8(name)
        .ok()?
        .strip_prefix(SNAP_PREFIX)?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        assert_eq!(snap_tree(42), "snap/42");
        assert_eq!(group_of_tree(b"snap/42"), Some(42));
        assert_eq!(
            group_of_tree(snap_tree(u64::MAX).as_bytes()),
            Some(u64::MAX)
        );
        assert_eq!(group_of_tree(b"__sled__default"), None);
        assert_eq!(group_of_tree(b"log/7"), None);
        assert_eq!(group_of_tree(b"snap/x"), None);
    }
}
