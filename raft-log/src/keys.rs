//! Tree names and keys. One sled `Db` per node; per Raft group `gid` three trees:
//!
//! | tree        | key                         | value                               |
//! |-------------|-----------------------------|-------------------------------------|
//! | `log/<gid>` | log index, 8 bytes big-endian | codec(`openraft::Entry<C>`)       |
//! | `meta/<gid>`| `vote`, `committed`, `last_purged` | codec(`Vote`), codec(`LogId`)  |
//! | `snap/<gid>`| `meta`, `data`              | codec(`SnapshotMeta`), snapshot bytes |
//!
//! Big-endian index keys sort numerically, so sled range scans are log ranges (sled README,
//! "a note on lexicographic ordering and endianness"). `<gid>` is the decimal group id.

use crate::{GroupId, StoreError};

/// `meta` key of the persisted vote (openraft `save_vote`).
pub const VOTE: &[u8] = b"vote";
/// `meta` key of the persisted committed log id (openraft `save_committed`).
pub const COMMITTED: &[u8] = b"committed";
/// `meta` key of the last purged log id (openraft `purge`).
pub const LAST_PURGED: &[u8] = b"last_purged";
/// `snap` key of the current snapshot's `SnapshotMeta`.
pub const SNAP_META: &[u8] = b"meta";
/// `snap` key of the current snapshot's bytes.
pub const SNAP_DATA: &[u8] = b"data";

const LOG_PREFIX: &str = "log/";
const META_PREFIX: &str = "meta/";
const SNAP_PREFIX: &str = "snap/";

/// Name of the log tree of `group`: `log/<gid>`.
pub fn log_tree(group: GroupId) -> String {
    format!("{LOG_PREFIX}{group}")
}

/// Name of the meta tree of `group`: `meta/<gid>`.
pub fn meta_tree(group: GroupId) -> String {
    format!("{META_PREFIX}{group}")
}

/// Name of the snapshot tree of `group`: `snap/<gid>`.
pub fn snap_tree(group: GroupId) -> String {
    format!("{SNAP_PREFIX}{group}")
}

/// The group a tree belongs to, if `name` is one of our three per-group tree names.
pub fn group_of_tree(name: &[u8]) -> Option<GroupId> {
    let name = std::str::from_utf8(name).ok()?;
    let rest = [LOG_PREFIX, META_PREFIX, SNAP_PREFIX]
        .iter()
        .find_map(|p| name.strip_prefix(p))?;
    rest.parse().ok()
}

/// Log key of `index`: 8 bytes big-endian.
pub fn index_key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

/// Log index of a log-tree key. Errors: [`StoreError::Corrupt`] if the key is not 8 bytes.
pub fn parse_index_key(key: &[u8]) -> Result<u64, StoreError> {
    let b: [u8; 8] = key
        .try_into()
        .map_err(|_| StoreError::corrupt(format!("log key of {} bytes, want 8", key.len())))?;
    Ok(u64::from_be_bytes(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        assert_eq!(log_tree(42), "log/42");
        assert_eq!(group_of_tree(b"log/42"), Some(42));
        assert_eq!(
            group_of_tree(meta_tree(u64::MAX).as_bytes()),
            Some(u64::MAX)
        );
        assert_eq!(group_of_tree(b"snap/7"), Some(7));
        assert_eq!(group_of_tree(b"__sled__default"), None);
        assert_eq!(group_of_tree(b"log/x"), None);
    }

    #[test]
    fn index_keys_sort_numerically() {
        assert!(index_key(255) < index_key(256));
        assert_eq!(parse_index_key(&index_key(99)).unwrap(), 99);
        assert!(parse_index_key(b"short").is_err());
    }
}
