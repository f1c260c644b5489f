//! `Enqueue`: ids, StoreBody, expiry fixed at enqueue (spec §2.4).

use super::super::machine::QueueMachine;
use super::super::types::*;
use super::helpers::*;

#[test]
fn enqueue_assigns_increasing_ids_and_stores_each_body() {
    let mut q = QueueMachine::default();
    let (o, e) = enqueue(&mut q, 10, vec![msg("a"), msg("bb")]);
    assert_eq!(o, vec![EnqueueOutcome::Accepted; 2]);
    assert_eq!(
        e,
        vec![
            Effect::StoreBody {
                id: 0,
                payload: bytes::Bytes::from_static(b"a")
            },
            Effect::StoreBody {
                id: 1,
                payload: bytes::Bytes::from_static(b"bb")
            },
        ]
    );
    let (_, e) = enqueue(&mut q, 11, vec![msg("c")]);
    assert_eq!(stored(&e), vec![2]);
    assert_eq!(q.next_msg_id(), 3);
}

#[test]
fn enqueue_without_consumers_keeps_messages_ready_in_order() {
    let mut q = QueueMachine::default();
    enqueue(&mut q, 1, vec![msg("a"), msg("bcd"), msg("ef")]);
    assert_eq!(q.ready_count(), 3);
    assert_eq!(q.ready_bytes(), 6);
    assert_eq!(q.unacked_count(), 0);
    assert_eq!(q.ready_ids(), vec![0, 1, 2]);
}

#[test]
fn enqueue_of_nothing_replies_empty() {
    let mut q = QueueMachine::default();
    let (o, e) = enqueue(&mut q, 1, vec![]);
    assert!(o.is_empty());
    assert!(e.is_empty());
}

#[test]
fn expiry_is_now_plus_queue_ttl() {
    let mut q = QueueMachine::new(QueueConfig {
        message_ttl_ms: Some(1000),
        ..QueueConfig::default()
    });
    let (_, e) = enqueue(&mut q, 5000, vec![msg("a")]);
    assert_eq!(q.next_expiry_ms(), Some(6000));
    assert_eq!(timers(&e), vec![6000]);
}

#[test]
fn expiry_is_now_plus_message_ttl() {
    let mut q = QueueMachine::default();
    enqueue(&mut q, 5000, vec![msg_ttl("a", 250)]);
    assert_eq!(q.next_expiry_ms(), Some(5250));
}

#[test]
fn expiry_uses_the_smaller_of_queue_and_message_ttl() {
    let mut q = QueueMachine::new(QueueConfig {
        message_ttl_ms: Some(1000),
        ..QueueConfig::default()
    });
    enqueue(&mut q, 0, vec![msg_ttl("a", 300)]);
    assert_eq!(q.next_expiry_ms(), Some(300));
    let mut q = QueueMachine::new(QueueConfig {
        message_ttl_ms: Some(100),
        ..QueueConfig::default()
    });
    enqueue(&mut q, 0, vec![msg_ttl("a", 300)]);
    assert_eq!(q.next_expiry_ms(), Some(100));
}

#[test]
fn ttl_zero_gives_now_plus_one() {
    let mut q = QueueMachine::default();
    enqueue(&mut q, 700, vec![msg_ttl("a", 0)]);
    assert_eq!(q.next_expiry_ms(), Some(701));
    // Survives a command in the same millisecond, dies at now + 1.
    tick(&mut q, 700);
    assert_eq!(q.ready_count(), 1);
    let e = tick(&mut q, 701);
    assert_eq!(q.ready_count(), 0);
    assert_eq!(dropped(&e), vec![0]);
}

#[test]
fn no_ttl_means_no_expiry() {
    let mut q = QueueMachine::default();
    let (_, e) = enqueue(&mut q, 1, vec![msg("a")]);
    assert_eq!(q.next_expiry_ms(), None);
    assert!(timers(&e).is_empty());
    tick(&mut q, u64::MAX);
    assert_eq!(q.ready_count(), 1);
}

#[test]
fn huge_ttl_saturates_without_overflow() {
    let mut q = QueueMachine::default();
    enqueue(&mut q, u64::MAX - 5, vec![msg_ttl("a", u64::MAX)]);
    assert_eq!(q.next_expiry_ms(), Some(u64::MAX - 1));
}

#[test]
fn enqueue_delivers_to_a_waiting_consumer_in_the_same_command() {
    let mut q = QueueMachine::default();
    checkout(&mut q, 0, cid(1), 0);
    let (_, e) = enqueue(&mut q, 1, vec![msg("a")]);
    assert_eq!(
        e,
        vec![
            Effect::StoreBody {
                id: 0,
                payload: bytes::Bytes::from_static(b"a")
            },
            Effect::Deliver {
                consumer: cid(1),
                delivery: Delivery {
                    id: 0,
                    delivery_count: 0,
                    payload: None,
                    resend: false
                }
            },
        ]
    );
    assert_eq!(q.unacked_count(), 1);
    assert_eq!(q.ready_count(), 0);
}
