//! The on-disk form of a queue replica's snapshot: the machine and the
//! location index of its spilled bodies, under a format tag.
//!
//! Format 1 (this one): bincode `(MAGIC, FORMAT, machine, index)`.
//! Format 0 (before the tag): bincode `(machine, index)`, the machine in the
//! shape of `v0` below; it is decoded and upgraded, so a node restarted on
//! a newer binary keeps its queues. A change to the shape of any type inside
//! `QueueMachine` must bump `FORMAT`, freeze the old shape in a `vN` module
//! and add its upgrade here (the Raft log itself only ever gains variants).

use super::machine::QueueMachine;

/// Leads every tagged snapshot; a format-0 snapshot starts with the
/// machine's first field (an `Option` tag, 0 or 1), so it never matches.
const MAGIC: u64 = 0x5151_534e_4150_0000; // "QQSNAP"
/// The format written now.
const FORMAT: u32 = 1;

/// The shape of the machine in format 0. While format 1's machine has the
/// same shape, this is the current type itself.
mod v0 {
    pub(super) type QueueMachine = super::QueueMachine;

    /// Format 0 → current.
    pub(super) fn upgrade(m: QueueMachine) -> super::QueueMachine {
        m
    }
}

/// Encodes `machine` with the body `index` in the current format.
///
/// Errors: bincode encoding (not expected for these types).
pub(super) fn encode(machine: &QueueMachine, index: &[u8]) -> Result<Vec<u8>, raft_log::StoreError> {
    raft_log::codec::encode(&(MAGIC, FORMAT, machine, index))
}

/// Decodes a snapshot of any known format into the current machine and its
/// body index.
///
/// Errors: a tagged snapshot of an unknown (newer) format; bytes that decode
/// as no known format (corrupt).
pub(super) fn decode(data: &[u8]) -> Result<(QueueMachine, Vec<u8>), raft_log::StoreError> {
    if let Ok((magic, format)) = raft_log::codec::decode_prefix::<(u64, u32)>(data).map(|(v, _)| v) {
        if magic == MAGIC {
            if format != FORMAT {
                return Err(raft_log::StoreError::corrupt(format!(
                    "queue snapshot format {format} is newer than this binary's {FORMAT}"
                )));
            }
            let (_, _, machine, index): (u64, u32, QueueMachine, Vec<u8>) =
                raft_log::codec::decode(data)?;
            return Ok((machine, index));
        }
    }
    let (machine, index): (v0::QueueMachine, Vec<u8>) = raft_log::codec::decode(data)?;
    Ok((v0::upgrade(machine), index))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::types::{EnqueueMsg, QueueCommand, QueueConfig};

    fn machine_with_messages() -> QueueMachine {
        let mut m = QueueMachine::new(QueueConfig {
            max_length: Some(10),
            ..QueueConfig::default()
        });
        m.apply(QueueCommand::Enqueue {
            now_ms: 5,
            msgs: vec![EnqueueMsg {
                payload: bytes::Bytes::from_static(b"x"),
                body_size: 1,
                ttl_ms: None,
            }],
        });
        m
    }

    #[test]
    fn current_format_round_trips() {
        let m = machine_with_messages();
        let bytes = encode(&m, b"idx").unwrap();
        let (back, index) = decode(&bytes).unwrap();
        assert_eq!(back, m);
        assert_eq!(index, b"idx");
    }

    #[test]
    fn format_0_snapshots_are_upgraded() {
        let m = machine_with_messages();
        let old = raft_log::codec::encode(&(&m, b"idx".to_vec())).unwrap();
        let (back, index) = decode(&old).unwrap();
        assert_eq!(back, m);
        assert_eq!(index, b"idx");
    }

    #[test]
    fn a_newer_format_is_refused_not_misread() {
        let m = machine_with_messages();
        let newer = raft_log::codec::encode(&(MAGIC, FORMAT + 1, &m, b"".to_vec())).unwrap();
        assert!(decode(&newer).is_err());
    }
}
