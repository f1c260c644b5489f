//! `Return` (nack/reject requeue=true): position (spec §2.8) and the
//! delivery limit (spec §6.2), 3.10 semantics.

use super::super::machine::QueueMachine;
use super::super::types::*;
use super::helpers::*;

fn limit(n: i64) -> QueueConfig {
    QueueConfig {
        delivery_limit: Some(n),
        ..amo()
    }
}

#[test]
fn return_without_delivery_limit_goes_to_the_back() {
    let mut q = QueueMachine::default();
    enqueue_n(&mut q, 0, 3);
    get(&mut q, 1, cid(9), false);
    ret(&mut q, 2, cid(9), &[0]);
    assert_eq!(q.ready_ids(), vec![1, 2, 0]);
    assert_eq!(q.unacked_count(), 0);
}

#[test]
fn return_with_delivery_limit_goes_to_the_front_in_return_order() {
    // requeue_multiple_false: redelivered in exactly the order requeued.
    let mut q = QueueMachine::new(limit(3));
    enqueue_n(&mut q, 0, 4);
    get(&mut q, 1, cid(9), false);
    get(&mut q, 1, cid(9), false);
    get(&mut q, 1, cid(9), false);
    ret(&mut q, 2, cid(9), &[2]);
    ret(&mut q, 3, cid(9), &[0, 1]);
    assert_eq!(q.ready_ids(), vec![2, 0, 1, 3]);
}

#[test]
fn return_increments_the_delivery_count() {
    let mut q = QueueMachine::default();
    enqueue_n(&mut q, 0, 1);
    for n in 0..3 {
        let (d, _) = get(&mut q, 1, cid(9), false);
        assert_eq!(d.map(|(d, _)| d.delivery_count), Some(n));
        ret(&mut q, 2, cid(9), &[0]);
    }
}

#[test]
fn delivery_limit_zero_dead_letters_on_the_first_return() {
    let mut q = QueueMachine::new(limit(0));
    enqueue_n(&mut q, 0, 1);
    checkout(&mut q, 1, cid(1), 0);
    let e = ret(&mut q, 2, cid(1), &[0]);
    assert_eq!(
        e,
        vec![
            Effect::DeadLettered {
                reason: DeadLetterReason::DeliveryLimit,
                strategy: Some(DeadLetterStrategy::AtMostOnce)
            },
            Effect::DeadLetter {
                id: 0,
                reason: DeadLetterReason::DeliveryLimit,
                target: target()
            },
            Effect::DropBody { id: 0 },
        ]
    );
    assert!(q.live_ids().is_empty());
}

#[test]
fn delivery_limit_n_allows_n_plus_one_deliveries() {
    let mut q = QueueMachine::new(limit(2));
    enqueue_n(&mut q, 0, 1);
    let mut deliveries = delivered(&checkout(&mut q, 1, cid(1), 1));
    let mut last = Vec::new();
    for t in 2..10 {
        last = ret(&mut q, t, cid(1), &[0]);
        deliveries.extend(delivered(&last));
        if q.live_ids().is_empty() {
            break;
        }
    }
    assert_eq!(
        deliveries,
        vec![(cid(1), 0, 0), (cid(1), 0, 1), (cid(1), 0, 2)]
    );
    assert_eq!(
        dead_lettered(&last),
        vec![(0, DeadLetterReason::DeliveryLimit)]
    );
}

#[test]
fn delivery_limit_without_dead_letter_exchange_drops() {
    let mut q = QueueMachine::new(QueueConfig {
        delivery_limit: Some(0),
        ..QueueConfig::default()
    });
    enqueue_n(&mut q, 0, 1);
    checkout(&mut q, 1, cid(1), 0);
    assert_eq!(
        ret(&mut q, 2, cid(1), &[0]),
        vec![
            Effect::DeadLettered {
                reason: DeadLetterReason::DeliveryLimit,
                strategy: None
            },
            Effect::DropBody { id: 0 }
        ]
    );
}

#[test]
fn negative_delivery_limit_is_unlimited_and_requeues_to_the_back() {
    let mut q = QueueMachine::new(limit(-1));
    enqueue_n(&mut q, 0, 2);
    for t in 0..20 {
        let (d, _) = get(&mut q, t, cid(9), false);
        let id = d.map(|(d, _)| d.id).unwrap_or(99);
        ret(&mut q, t, cid(9), &[id]);
    }
    assert_eq!(q.ready_count(), 2);
    assert_eq!(q.held_count(), 0);
}

#[test]
fn return_of_unknown_ids_is_ignored() {
    let mut q = QueueMachine::new(limit(0));
    enqueue_n(&mut q, 0, 1);
    checkout(&mut q, 1, cid(1), 0);
    assert!(ret(&mut q, 2, cid(2), &[0]).is_empty());
    assert!(ret(&mut q, 2, cid(1), &[5]).is_empty());
    assert_eq!(q.unacked_count(), 1);
}

#[test]
fn lowering_the_delivery_limit_does_not_sweep_ready_messages() {
    let mut q = QueueMachine::new(limit(10));
    enqueue_n(&mut q, 0, 1);
    for t in 0..3 {
        get(&mut q, t, cid(9), false);
        ret(&mut q, t, cid(9), &[0]);
    }
    let e = update(&mut q, 5, limit(1));
    assert!(dead_lettered(&e).is_empty());
    assert_eq!(q.ready_count(), 1);
    // Checked again at its next return: count 4 > 1.
    get(&mut q, 6, cid(9), false);
    let e = ret(&mut q, 7, cid(9), &[0]);
    assert_eq!(
        dead_lettered(&e),
        vec![(0, DeadLetterReason::DeliveryLimit)]
    );
}

#[test]
fn returned_message_keeps_its_expiry() {
    let mut q = QueueMachine::new(QueueConfig {
        delivery_limit: Some(5),
        message_ttl_ms: Some(100),
        ..amo()
    });
    enqueue_n(&mut q, 0, 1);
    checkout(&mut q, 1, cid(1), 0);
    // Unacked messages never expire.
    tick(&mut q, 500);
    assert_eq!(q.unacked_count(), 1);
    run(
        &mut q,
        QueueCommand::Cancel {
            now_ms: 501,
            consumer: cid(1),
        },
    );
    let e = ret(&mut q, 502, cid(1), &[0]);
    assert_eq!(dead_lettered(&e), vec![(0, DeadLetterReason::Expired)]);
}

#[test]
fn returned_message_goes_to_a_waiting_consumer() {
    let mut q = QueueMachine::new(limit(5));
    enqueue_n(&mut q, 0, 1);
    checkout(&mut q, 1, cid(1), 1);
    checkout(&mut q, 1, cid(2), 1);
    let e = ret(&mut q, 2, cid(1), &[0]);
    assert_eq!(delivered(&e), vec![(cid(2), 0, 1)]);
}

/// A delivery is due while its message is checked out to that consumer
/// with that delivery count; a return (count + 1), a settle or a delivery
/// to another consumer ends it (`cluster/deliveries.rs` drops a retried
/// Deliver call's deliveries that are no longer due).
#[test]
fn a_delivery_is_due_until_its_message_is_returned_or_settled() {
    let mut q = QueueMachine::default();
    enqueue_n(&mut q, 0, 2);
    let e = checkout(&mut q, 1, cid(1), 1);
    assert_eq!(delivered(&e), vec![(cid(1), 0, 0)]);
    assert!(q.is_checked_out_to(cid(1), 0, 0));
    assert!(!q.is_checked_out_to(cid(1), 0, 1), "another count");
    assert!(!q.is_checked_out_to(cid(2), 0, 0), "another consumer");
    assert!(!q.is_checked_out_to(cid(1), 1, 0), "not delivered");
    // Returned: the same consumer gets it again, counted.
    let e = ret(&mut q, 2, cid(1), &[0]);
    assert_eq!(delivered(&e), vec![(cid(1), 1, 0)]);
    let e = settle(&mut q, 3, cid(1), &[1]);
    assert_eq!(delivered(&e), vec![(cid(1), 0, 1)]);
    assert!(
        !q.is_checked_out_to(cid(1), 0, 0),
        "the first delivery was returned"
    );
    assert!(q.is_checked_out_to(cid(1), 0, 1));
    assert!(!q.is_checked_out_to(cid(1), 1, 0), "settled");
    settle(&mut q, 4, cid(1), &[0]);
    assert!(!q.is_checked_out_to(cid(1), 0, 1), "settled");
}
