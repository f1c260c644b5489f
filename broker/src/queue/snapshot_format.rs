//! The on-disk form of a queue replica's snapshot: the machine and the
//! location index of its spilled bodies, under a format tag.
//!
//! Format 3 (this one): bincode `(MAGIC, FORMAT, machine, index)`.
//! Format 2: the same, the machine in the shape of `v2` below (no
//! de-duplication table of forwarded dead letters).
//! Format 1: the same, the machine in the shape of `old` below (consumer
//! records without consumer priorities or delivery times, no delayed-retry
//! area, no timed-out consumers).
//! Format 0 (before the tag): bincode `(machine, index)`, the machine in the
//! shape of `old` below; both are decoded and upgraded, so a node restarted
//! on a newer binary keeps its queues. A change to the shape of any type inside
//! `QueueMachine` must bump `FORMAT`, freeze the old shape (module `old`, or a new one)
//! and add its upgrade here (the Raft log itself only ever gains variants).

use super::machine::QueueMachine;

/// Leads every tagged snapshot; a format-0 snapshot starts with the
/// machine's first field (an `Option` tag, 0 or 1), so it never matches.
const MAGIC: u64 = 0x5151_534e_4150_0000; // "QQSNAP"
/// The format written now.
const FORMAT: u32 = 3;

/// The shape of the machine in formats 0 (quorumq up to bf9fa0f) and 1
/// (up to 4015f2b), frozen; they differ only in the configuration's shape
/// (`C`: `QueueConfigV0` in format 0, `QueueConfig` in format 1). Against
/// format 2, the consumer records had no consumer priority nor delivery
/// times, and there was no delayed-retry area nor timed-out list.
mod old {
    use std::collections::BTreeMap;

    use serde::Deserialize;

    use super::super::consumers::v1::Consumers;
    use super::super::dead_letter::HeldArea;
    use super::super::messages::ReadyQueue;
    use super::super::types::{ProposerId, QueueConfig, QueueConfigV0};

    /// `QueueMachine` in format 0 (`C` = `QueueConfigV0`) or 1 (`QueueConfig`).
    #[derive(Deserialize)]
    pub(super) struct QueueMachine<C> {
        config: C,
        next_id: u64,
        ready: ReadyQueue,
        consumers: Consumers,
        held: HeldArea,
        blocked: bool,
        last_active: Option<u64>,
        expired_notified: bool,
        timer_at: Option<u64>,
        proposers: BTreeMap<ProposerId, u64>,
    }

    /// Format 0.
    pub(super) type V0 = QueueMachine<QueueConfigV0>;
    /// Format 1.
    pub(super) type V1 = QueueMachine<QueueConfig>;

    /// Format 0 or 1 → current.
    pub(super) fn upgrade<C: Into<QueueConfig>>(m: QueueMachine<C>) -> super::QueueMachine {
        super::QueueMachine {
            config: m.config.into(),
            next_id: m.next_id,
            ready: m.ready,
            consumers: m.consumers.into(),
            held: m.held,
            blocked: m.blocked,
            last_active: m.last_active,
            expired_notified: m.expired_notified,
            timer_at: m.timer_at,
            proposers: m.proposers,
            ..super::QueueMachine::default()
        }
    }

    /// A format-0 machine as it was written (tests: what an old node wrote).
    #[cfg(test)]
    #[derive(serde::Serialize)]
    pub(super) struct Written<'a> {
        pub config: &'a QueueConfigV0,
        pub next_id: u64,
        pub ready: &'a ReadyQueue,
        pub consumers: &'a Consumers,
        pub held: &'a HeldArea,
        pub blocked: bool,
        pub last_active: Option<u64>,
        pub expired_notified: bool,
        pub timer_at: Option<u64>,
        pub proposers: &'a BTreeMap<ProposerId, u64>,
    }
}

/// The shape of the machine in format 2 (quorumq up to 866142d), frozen:
/// format 3 added the de-duplication table (`dedup`).
mod v2 {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Serialize};

    use super::super::consumers::Consumers;
    use super::super::dead_letter::HeldArea;
    use super::super::delayed::DelayedArea;
    use super::super::messages::ReadyQueue;
    use super::super::types::{ConsumerId, ProposerId, QueueConfig};

    /// `QueueMachine` in format 2.
    #[derive(Serialize, Deserialize)]
    pub(super) struct QueueMachine {
        pub config: QueueConfig,
        pub next_id: u64,
        pub ready: ReadyQueue,
        pub consumers: Consumers,
        pub held: HeldArea,
        pub blocked: bool,
        pub last_active: Option<u64>,
        pub expired_notified: bool,
        pub timer_at: Option<u64>,
        pub proposers: BTreeMap<ProposerId, u64>,
        pub delayed: DelayedArea,
        pub timed_out: BTreeMap<ConsumerId, u64>,
    }

    /// Format 2 → current: no source has a de-duplication window yet.
    pub(super) fn upgrade(m: QueueMachine) -> super::QueueMachine {
        super::QueueMachine {
            config: m.config,
            next_id: m.next_id,
            ready: m.ready,
            consumers: m.consumers,
            held: m.held,
            blocked: m.blocked,
            last_active: m.last_active,
            expired_notified: m.expired_notified,
            timer_at: m.timer_at,
            proposers: m.proposers,
            delayed: m.delayed,
            timed_out: m.timed_out,
            ..super::QueueMachine::default()
        }
    }
}

/// Encodes `machine` with the body `index` in the current format.
///
/// Errors: bincode encoding (not expected for these types).
pub(super) fn encode(
    machine: &QueueMachine,
    index: &[u8],
) -> Result<Vec<u8>, raft_log::StoreError> {
    raft_log::codec::encode(&(MAGIC, FORMAT, machine, index))
}

/// Decodes a snapshot of any known format into the current machine and its
/// body index.
///
/// Errors: a tagged snapshot of an unknown (newer) format; bytes that decode
/// as no known format (corrupt).
pub(super) fn decode(data: &[u8]) -> Result<(QueueMachine, Vec<u8>), raft_log::StoreError> {
    if let Ok((magic, format)) = raft_log::codec::decode_prefix::<(u64, u32)>(data).map(|(v, _)| v)
    {
        if magic == MAGIC {
            if format == 1 {
                let (_, _, machine, index): (u64, u32, old::V1, Vec<u8>) =
                    raft_log::codec::decode(data)?;
                return Ok((old::upgrade(machine), index));
            }
            if format == 2 {
                let (_, _, machine, index): (u64, u32, v2::QueueMachine, Vec<u8>) =
                    raft_log::codec::decode(data)?;
                return Ok((v2::upgrade(machine), index));
            }
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
    let (machine, index): (old::V0, Vec<u8>) = raft_log::codec::decode(data)?;
    Ok((old::upgrade(machine), index))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::types::{EnqueueMsg, QueueCommand, QueueConfig, QueueConfigV0};

    use crate::queue::consumers::v1;
    use crate::queue::types::{ConsumerId, ConsumerSpec};

    const C: ConsumerId = ConsumerId {
        node: 1,
        epoch: 1,
        seq: 1,
    };

    /// Two messages, one of them checked out to consumer `C` (prefetch 1).
    fn machine_with_messages() -> QueueMachine {
        let mut m = QueueMachine::new(QueueConfig {
            max_length: Some(10),
            ..QueueConfig::default()
        });
        let msg = EnqueueMsg {
            payload: bytes::Bytes::from_static(b"x"),
            body_size: 1,
            ttl_ms: None,
        };
        m.apply(QueueCommand::Enqueue {
            now_ms: 5,
            msgs: vec![msg.clone(), msg],
        });
        m.apply(QueueCommand::Subscribe {
            now_ms: 6,
            consumer: C,
            spec: ConsumerSpec {
                prefetch: 1,
                ..ConsumerSpec::default()
            },
        });
        m
    }

    /// The consumers of `machine_with_messages` as formats 0 and 1 wrote them.
    fn v1_consumers(m: &QueueMachine) -> v1::Consumers {
        let held = m
            .consumers
            .get(&C)
            .map(|c| c.checked_out.clone())
            .unwrap_or_default();
        assert_eq!(held.len(), 1);
        v1::Consumers {
            records: [(
                C,
                v1::Consumer {
                    prefetch: 1,
                    no_ack: false,
                    active: true,
                    suspected: false,
                    queued: false,
                    checked_out: held,
                },
            )]
            .into(),
            service: Default::default(),
            active: 1,
            unacked: 1,
        }
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
        let config = QueueConfigV0 {
            max_length: Some(10),
            ..QueueConfigV0::default()
        };
        let consumers = v1_consumers(&m);
        let written = old::Written {
            config: &config,
            next_id: m.next_id,
            ready: &m.ready,
            consumers: &consumers,
            held: &m.held,
            blocked: m.blocked,
            last_active: m.last_active,
            expired_notified: m.expired_notified,
            timer_at: m.timer_at,
            proposers: &m.proposers,
        };
        let old = raft_log::codec::encode(&(written, b"idx".to_vec())).unwrap();
        let (back, index) = decode(&old).unwrap();
        assert_eq!(back, as_old_formats_knew(&m));
        assert_eq!(index, b"idx");
    }

    /// `m` as formats 0 and 1 keep it: no delivery times (and no service
    /// lanes a push emptied).
    fn as_old_formats_knew(m: &QueueMachine) -> QueueMachine {
        QueueMachine {
            consumers: m.consumers.without_delivery_times(),
            ..m.clone()
        }
    }

    #[test]
    fn format_1_snapshots_are_upgraded() {
        let m = machine_with_messages();
        let consumers = v1_consumers(&m);
        let written = (
            &m.config,
            m.next_id,
            &m.ready,
            &consumers,
            &m.held,
            m.blocked,
            m.last_active,
            m.expired_notified,
            m.timer_at,
            &m.proposers,
        );
        let old = raft_log::codec::encode(&(MAGIC, 1u32, written, b"idx".to_vec())).unwrap();
        let (back, index) = decode(&old).unwrap();
        assert_eq!(back, as_old_formats_knew(&m));
        assert_eq!(index, b"idx");
    }

    #[test]
    fn format_0_checked_out_messages_have_no_delivery_time() {
        use crate::queue::types::ConsumerId;
        let m = machine_with_messages();
        let c = ConsumerId {
            node: 1,
            epoch: 1,
            seq: 1,
        };
        assert_eq!(m.checked_out(c).count(), 1);
        let consumers = v1_consumers(&m);
        let written = old::Written {
            config: &QueueConfigV0 {
                max_length: Some(10),
                ..QueueConfigV0::default()
            },
            next_id: m.next_id,
            ready: &m.ready,
            consumers: &consumers,
            held: &m.held,
            blocked: m.blocked,
            last_active: m.last_active,
            expired_notified: m.expired_notified,
            timer_at: m.timer_at,
            proposers: &m.proposers,
        };
        let old = raft_log::codec::encode(&(written, b"idx".to_vec())).unwrap();
        let (mut back, _) = decode(&old).unwrap();
        assert_eq!(back.checked_out(c).collect::<Vec<_>>(), vec![0]);
        // A queue timeout set later does not reach a delivery of unknown age.
        let config = QueueConfig {
            max_length: Some(10),
            consumer_timeout_ms: Some(1),
            ..QueueConfig::default()
        };
        back.apply(QueueCommand::Configure { now_ms: 7, config });
        back.apply(QueueCommand::Tick { now_ms: 1_000_000 });
        assert_eq!(back.next_timeout_ms(), None);
        assert_eq!(back.checked_out(c).count(), 1);
        assert!(back.check_invariants().is_ok());
    }

    #[test]
    fn format_2_snapshots_are_upgraded() {
        let m = machine_with_messages();
        let written = v2::QueueMachine {
            config: m.config.clone(),
            next_id: m.next_id,
            ready: m.ready.clone(),
            consumers: m.consumers.clone(),
            held: m.held.clone(),
            blocked: m.blocked,
            last_active: m.last_active,
            expired_notified: m.expired_notified,
            timer_at: m.timer_at,
            proposers: m.proposers.clone(),
            delayed: m.delayed.clone(),
            timed_out: m.timed_out.clone(),
        };
        let old = raft_log::codec::encode(&(MAGIC, 2u32, written, b"idx".to_vec())).unwrap();
        let (mut back, index) = decode(&old).unwrap();
        assert_eq!(back, m);
        assert_eq!(index, b"idx");
        assert_eq!(back.dedup_window(), (0, 0));
        // The upgraded queue de-duplicates from then on.
        let dl = |id| QueueCommand::EnqueueDeadLetters {
            now_ms: 7,
            source: 9,
            settled_below: 0,
            floor_version: 0,
            msgs: vec![(
                id,
                crate::queue::types::PrioritizedMsg {
                    msg: EnqueueMsg {
                        payload: bytes::Bytes::from_static(b"d"),
                        body_size: 1,
                        ttl_ms: None,
                    },
                    priority: 0,
                },
            )],
        };
        back.apply(dl(3));
        back.apply(dl(3));
        assert_eq!(back.ready_count(), 2);
        assert_eq!(back.dedup_window(), (1, 1));
    }

    #[test]
    fn a_window_survives_the_current_format() {
        let mut m = machine_with_messages();
        m.dedup.insert_for_test(4, 10);
        m.dedup.insert_for_test(4, 11);
        let (back, _) = decode(&encode(&m, b"").unwrap()).unwrap();
        assert_eq!(back, m);
        assert!(back.dedup.seen(4, 11));
    }

    #[test]
    fn a_newer_format_is_refused_not_misread() {
        let m = machine_with_messages();
        let newer = raft_log::codec::encode(&(MAGIC, FORMAT + 1, &m, b"".to_vec())).unwrap();
        assert!(decode(&newer).is_err());
    }
}
