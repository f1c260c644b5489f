//! `Settle` (basic.ack) and `Discard` (reject/nack requeue=false), spec §2.2.

use super::super::machine::QueueMachine;
use super::super::types::*;
use super::helpers::*;

#[test]
fn settle_drops_the_body_and_forgets_the_message() {
    let mut q = QueueMachine::default();
    enqueue_n(&mut q, 0, 2);
    checkout(&mut q, 1, cid(1), 0);
    let e = settle(&mut q, 2, cid(1), &[1, 0]);
    assert_eq!(
        e,
        vec![Effect::DropBody { id: 1 }, Effect::DropBody { id: 0 }]
    );
    assert_eq!(q.unacked_count(), 0);
    assert!(q.live_ids().is_empty());
}

#[test]
fn settle_of_unknown_ids_is_ignored() {
    let mut q = QueueMachine::default();
    enqueue_n(&mut q, 0, 2);
    checkout(&mut q, 1, cid(1), 1);
    // 1 is ready (not checked out), 42 never existed.
    let e = settle(&mut q, 2, cid(1), &[1, 42]);
    assert!(e.is_empty());
    assert_eq!(q.unacked_count(), 1);
    assert_eq!(q.ready_count(), 1);
}

#[test]
fn settle_twice_settles_once() {
    let mut q = QueueMachine::default();
    enqueue_n(&mut q, 0, 1);
    checkout(&mut q, 1, cid(1), 0);
    assert_eq!(dropped(&settle(&mut q, 2, cid(1), &[0, 0])), vec![0]);
    assert!(settle(&mut q, 3, cid(1), &[0]).is_empty());
}

#[test]
fn settle_by_another_consumer_is_ignored() {
    let mut q = QueueMachine::default();
    enqueue_n(&mut q, 0, 1);
    checkout(&mut q, 1, cid(1), 0);
    assert!(settle(&mut q, 2, cid(2), &[0]).is_empty());
    assert_eq!(q.checked_out(cid(1)).collect::<Vec<_>>(), vec![0]);
}

#[test]
fn discard_without_dead_letter_exchange_drops() {
    let mut q = QueueMachine::default();
    enqueue_n(&mut q, 0, 2);
    checkout(&mut q, 1, cid(1), 0);
    let e = discard(&mut q, 2, cid(1), &[0, 1]);
    assert_eq!(
        e,
        vec![
            Effect::DeadLettered {
                reason: DeadLetterReason::Rejected,
                strategy: None
            },
            Effect::DropBody { id: 0 },
            Effect::DeadLettered {
                reason: DeadLetterReason::Rejected,
                strategy: None
            },
            Effect::DropBody { id: 1 }
        ]
    );
    assert_eq!(q.unacked_count(), 0);
}

#[test]
fn discard_at_most_once_dead_letters_rejected_then_drops() {
    let mut q = QueueMachine::new(amo());
    enqueue_n(&mut q, 0, 1);
    checkout(&mut q, 1, cid(1), 0);
    let e = discard(&mut q, 2, cid(1), &[0]);
    assert_eq!(
        e,
        vec![
            Effect::DeadLettered {
                reason: DeadLetterReason::Rejected,
                strategy: Some(DeadLetterStrategy::AtMostOnce)
            },
            Effect::DeadLetter {
                id: 0,
                reason: DeadLetterReason::Rejected,
                target: target()
            },
            Effect::DropBody { id: 0 },
        ]
    );
}

#[test]
fn discard_keeps_the_order_of_the_ids_given() {
    // dead_letter_nack_requeue_nack_norequeue_basic_get: order P3, P1, P2.
    let mut q = QueueMachine::new(amo());
    enqueue_n(&mut q, 0, 3);
    checkout(&mut q, 1, cid(1), 0);
    let e = discard(&mut q, 2, cid(1), &[2, 0, 1]);
    let r = DeadLetterReason::Rejected;
    assert_eq!(dead_lettered(&e), vec![(2, r), (0, r), (1, r)]);
    assert_eq!(dropped(&e), vec![2, 0, 1]);
}

#[test]
fn discard_of_unknown_ids_is_ignored() {
    let mut q = QueueMachine::new(amo());
    enqueue_n(&mut q, 0, 1);
    assert!(discard(&mut q, 1, cid(1), &[0, 7]).is_empty());
    assert_eq!(q.ready_count(), 1);
}

#[test]
fn discard_frees_prefetch() {
    let mut q = QueueMachine::new(amo());
    enqueue_n(&mut q, 0, 2);
    checkout(&mut q, 1, cid(1), 1);
    let e = discard(&mut q, 2, cid(1), &[0]);
    assert_eq!(delivered_ids(&e), vec![1]);
}

#[test]
fn discard_does_not_count_as_a_return() {
    // delivery_count is about returns only (3.10); a discard dead-letters
    // with reason rejected even with delivery limit 0.
    let mut q = QueueMachine::new(QueueConfig {
        delivery_limit: Some(0),
        ..amo()
    });
    enqueue_n(&mut q, 0, 1);
    checkout(&mut q, 1, cid(1), 0);
    let e = discard(&mut q, 2, cid(1), &[0]);
    assert_eq!(dead_lettered(&e), vec![(0, DeadLetterReason::Rejected)]);
}
