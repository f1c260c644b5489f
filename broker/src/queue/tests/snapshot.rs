//! Snapshot round trip (bincode 2 serde) and the memory footprint.

use bytes::Bytes;

use super::super::machine::QueueMachine;
use super::super::message::Msg;
use super::super::types::*;
use super::helpers::*;

fn encode(q: &QueueMachine) -> Vec<u8> {
    match bincode::serde::encode_to_vec(q, bincode::config::standard()) {
        Ok(v) => v,
        Err(e) => panic!("encode: {e}"),
    }
}

fn decode(b: &[u8]) -> QueueMachine {
    match bincode::serde::decode_from_slice::<QueueMachine, _>(b, bincode::config::standard()) {
        Ok((q, n)) => {
            assert_eq!(n, b.len());
            q
        }
        Err(e) => panic!("decode: {e}"),
    }
}

/// A machine with something in every part of the state.
fn busy() -> QueueMachine {
    let mut q = QueueMachine::new(QueueConfig {
        delivery_limit: Some(5),
        message_ttl_ms: Some(1000),
        max_length: Some(100),
        expires_ms: Some(9),
        ..alo()
    });
    enqueue_n(&mut q, 0, 10);
    checkout(&mut q, 1, cid(1), 2);
    get(&mut q, 2, cid(2), false);
    get(&mut q, 2, cid(2), false);
    ret(&mut q, 3, cid(2), &[2]);
    discard(&mut q, 4, cid(1), &[0]);
    run(
        &mut q,
        QueueCommand::Cancel {
            now_ms: 5,
            consumer: cid(1),
        },
    );
    q
}

#[test]
fn snapshot_round_trip_gives_an_equal_machine() {
    let q = busy();
    assert!(q.held_count() > 0 && q.unacked_count() > 0 && q.ready_count() > 0);
    let back = decode(&encode(&q));
    assert_eq!(back, q);
}

#[test]
fn restored_machine_behaves_like_the_original() {
    let mut a = busy();
    let mut b = decode(&encode(&a));
    let cmds = vec![
        QueueCommand::Checkout {
            now_ms: 6,
            consumer: cid(3),
            prefetch: 0,
            no_ack: false,
        },
        QueueCommand::DeadLetterSettled {
            now_ms: 7,
            ids: vec![0],
        },
        QueueCommand::Tick { now_ms: 2000 },
    ];
    for c in cmds {
        assert_eq!(a.apply(c.clone()), b.apply(c));
    }
    assert_eq!(a, b);
}

#[test]
fn default_machine_round_trips() {
    let q = QueueMachine::default();
    assert_eq!(decode(&encode(&q)), q);
}

#[test]
fn message_index_is_24_bytes() {
    assert_eq!(std::mem::size_of::<Msg>(), 24);
}

#[test]
fn a_million_ready_messages_are_cheap() {
    let mut q = QueueMachine::new(QueueConfig {
        message_ttl_ms: Some(60_000),
        ..QueueConfig::default()
    });
    let n = 1_000_000u64;
    for chunk in 0..100 {
        let msgs = (0..n / 100)
            .map(|_| EnqueueMsg {
                payload: Bytes::new(),
                body_size: 100,
                ttl_ms: None,
            })
            .collect();
        let (_, e) = q.apply(QueueCommand::Enqueue {
            now_ms: chunk,
            msgs,
        });
        assert_eq!(e.len() as u64, n / 100 + u64::from(chunk == 0));
    }
    assert_eq!(q.ready_count(), n);
    assert_eq!(q.ready_bytes(), n * 100);
    let bytes = encode(&q);
    // Varint encoding: well under the 24-byte in-memory index.
    assert!(
        bytes.len() < (n as usize) * 16,
        "snapshot is {} bytes",
        bytes.len()
    );
    let back = decode(&bytes);
    assert_eq!(back.ready_count(), n);
    let (d, _) = get(&mut q, 100, cid(1), true);
    assert_eq!(d.map(|(d, left)| (d.id, left)), Some((0, n - 1)));
}
