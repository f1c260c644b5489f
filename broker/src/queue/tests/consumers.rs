//! `Cancel`, `ConsumerDown`, `NodeRestarted` (spec §2.3, §10.8, §10.9).

use super::super::machine::QueueMachine;
use super::super::types::*;
use super::helpers::*;

#[test]
fn cancel_stops_deliveries_and_keeps_unacked_checked_out() {
    let mut q = QueueMachine::default();
    enqueue_n(&mut q, 0, 2);
    checkout(&mut q, 1, cid(1), 1);
    let e = cancel(&mut q, 2, cid(1));
    assert!(e.is_empty());
    assert_eq!(q.consumer_count(), 0);
    assert_eq!(q.unacked_count(), 1);
    let e = enqueue_n(&mut q, 3, 1);
    assert!(delivered(&e).is_empty());
    // The unacked message can still be settled; nothing new is pushed.
    let e = settle(&mut q, 4, cid(1), &[0]);
    assert_eq!(e, vec![Effect::DropBody { id: 0 }]);
    assert_eq!(q.ready_count(), 2);
}

#[test]
fn cancelled_consumer_can_still_return_and_discard() {
    let mut q = QueueMachine::new(QueueConfig {
        delivery_limit: Some(5),
        ..amo()
    });
    enqueue_n(&mut q, 0, 2);
    checkout(&mut q, 1, cid(1), 0);
    cancel(&mut q, 2, cid(1));
    ret(&mut q, 3, cid(1), &[0]);
    let e = discard(&mut q, 4, cid(1), &[1]);
    assert_eq!(dead_lettered(&e), vec![(1, DeadLetterReason::Rejected)]);
    assert_eq!(q.ready_ids(), vec![0]);
    assert_eq!(q.unacked_count(), 0);
}

#[test]
fn cancel_of_unknown_or_cancelled_consumer_is_a_no_op() {
    let mut q = QueueMachine::default();
    assert!(cancel(&mut q, 1, cid(1)).is_empty());
    checkout(&mut q, 1, cid(1), 0);
    cancel(&mut q, 2, cid(1));
    assert!(cancel(&mut q, 3, cid(1)).is_empty());
    assert_eq!(q.consumer_count(), 0);
}

#[test]
fn consumer_down_returns_everything_in_id_order_to_the_front_counted() {
    let mut q = QueueMachine::default();
    enqueue_n(&mut q, 0, 4);
    checkout(&mut q, 1, cid(1), 3);
    // Settle the middle one; 0 and 2 remain.
    settle(&mut q, 2, cid(1), &[1]);
    // Now checked out: 0, 2, 3.
    let e = down(&mut q, 3, cid(1));
    assert!(e.is_empty());
    assert_eq!(q.consumer_count(), 0);
    assert_eq!(q.unacked_count(), 0);
    assert_eq!(q.ready_ids(), vec![0, 2, 3]);
    let e = checkout(&mut q, 4, cid(2), 0);
    assert_eq!(
        delivered(&e),
        vec![(cid(2), 0, 1), (cid(2), 2, 1), (cid(2), 3, 1)]
    );
}

#[test]
fn consumer_down_goes_to_the_front_even_without_a_delivery_limit() {
    let mut q = QueueMachine::default();
    enqueue_n(&mut q, 0, 3);
    checkout(&mut q, 1, cid(1), 1);
    down(&mut q, 2, cid(1));
    assert_eq!(q.ready_ids(), vec![0, 1, 2]);
}

#[test]
fn consumer_down_over_the_delivery_limit_dead_letters_in_order() {
    // at_most_once_dead_letter_order_delivery_limit_channel_closed.
    let mut q = QueueMachine::new(QueueConfig {
        delivery_limit: Some(0),
        ..amo()
    });
    enqueue_n(&mut q, 0, 2);
    checkout(&mut q, 1, cid(1), 0);
    let e = down(&mut q, 2, cid(1));
    let r = DeadLetterReason::DeliveryLimit;
    assert_eq!(dead_lettered(&e), vec![(0, r), (1, r)]);
    assert!(q.live_ids().is_empty());
}

#[test]
fn crashing_consumers_drain_a_poison_batch() {
    // subscribe_redelivery_limit_many: limit 1, 5 messages, prefetch 2.
    let mut q = QueueMachine::new(QueueConfig {
        delivery_limit: Some(1),
        ..QueueConfig::default()
    });
    enqueue_n(&mut q, 0, 5);
    let mut totals = Vec::new();
    for n in 0..6 {
        checkout(&mut q, 1, cid(n), 2);
        down(&mut q, 2, cid(n));
        totals.push(q.ready_count());
    }
    assert_eq!(totals, vec![5, 3, 3, 1, 1, 0]);
}

#[test]
fn consumer_down_of_a_cancelled_consumer_returns_its_messages() {
    let mut q = QueueMachine::default();
    enqueue_n(&mut q, 0, 1);
    checkout(&mut q, 1, cid(1), 0);
    cancel(&mut q, 2, cid(1));
    down(&mut q, 3, cid(1));
    assert_eq!(q.ready_ids(), vec![0]);
    assert_eq!(q.unacked_count(), 0);
}

#[test]
fn consumer_down_of_a_get_slot_returns_its_messages() {
    let mut q = QueueMachine::default();
    enqueue_n(&mut q, 0, 2);
    get(&mut q, 1, cid(9), false);
    get(&mut q, 1, cid(9), false);
    down(&mut q, 2, cid(9));
    assert_eq!(q.ready_ids(), vec![0, 1]);
    let (d, _) = get(&mut q, 3, cid(8), true);
    assert_eq!(d.map(|(d, _)| d.delivery_count), Some(1));
}

#[test]
fn consumer_down_of_unknown_consumer_is_ignored() {
    let mut q = QueueMachine::default();
    enqueue_n(&mut q, 0, 1);
    assert!(down(&mut q, 1, cid(5)).is_empty());
    assert_eq!(q.ready_count(), 1);
}

#[test]
fn node_restarted_downs_consumers_of_older_epochs_only() {
    let mut q = QueueMachine::default();
    let old = ConsumerId {
        node: 7,
        epoch: 1,
        seq: 1,
    };
    let current = ConsumerId {
        node: 7,
        epoch: 2,
        seq: 1,
    };
    let other = ConsumerId {
        node: 8,
        epoch: 1,
        seq: 1,
    };
    enqueue_n(&mut q, 0, 3);
    for c in [old, current, other] {
        checkout(&mut q, 1, c, 1);
    }
    let (_, e) = run(
        &mut q,
        QueueCommand::NodeRestarted {
            now_ms: 2,
            node: 7,
            epoch: 2,
        },
    );
    assert!(e.is_empty());
    assert_eq!(q.consumer_count(), 2);
    assert_eq!(q.checked_out(old).count(), 0);
    assert_eq!(q.checked_out(current).count(), 1);
    assert_eq!(q.checked_out(other).count(), 1);
    assert_eq!(q.ready_count(), 1);
}

#[test]
fn node_restarted_counts_returns_toward_the_delivery_limit() {
    let mut q = QueueMachine::new(QueueConfig {
        delivery_limit: Some(0),
        ..amo()
    });
    let c = ConsumerId {
        node: 3,
        epoch: 4,
        seq: 0,
    };
    enqueue_n(&mut q, 0, 1);
    checkout(&mut q, 1, c, 0);
    let (_, e) = run(
        &mut q,
        QueueCommand::NodeRestarted {
            now_ms: 2,
            node: 3,
            epoch: 5,
        },
    );
    assert_eq!(
        dead_lettered(&e),
        vec![(0, DeadLetterReason::DeliveryLimit)]
    );
    assert_eq!(q.consumer_count(), 0);
}
