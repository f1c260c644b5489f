//! `Cancel`, `ConsumerDown`, `NodeRestarted` (spec §2.3, §10.8, §10.9).

use super::super::machine::QueueMachine;
use super::super::types::*;
use super::helpers::*;
use crate::queue::SeenNode;

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

fn on(node: u64, epoch: u32, seq: u32) -> ConsumerId {
    ConsumerId { node, epoch, seq }
}

fn node_down(q: &mut QueueMachine, now_ms: u64, node: u64) -> Vec<Effect> {
    run(q, QueueCommand::NodeDown { now_ms, node }).1
}

fn node_up(q: &mut QueueMachine, now_ms: u64, node: u64, epoch: u32) -> Vec<Effect> {
    run(
        q,
        QueueCommand::NodeUp {
            now_ms,
            node,
            epoch,
        },
    )
    .1
}

/// rabbit_fifo 3.10 `{down, Pid, noconnection}`: the node's consumers are
/// suspected and what they hold goes to the live consumers, redelivered.
#[test]
fn node_down_returns_its_consumers_messages_to_live_consumers_counted() {
    let mut q = QueueMachine::default();
    let (gone, live) = (on(2, 1, 1), on(3, 1, 1));
    checkout(&mut q, 0, gone, 2);
    enqueue_n(&mut q, 1, 2);
    assert_eq!(q.checked_out(gone).collect::<Vec<_>>(), vec![0, 1]);
    checkout(&mut q, 2, live, 0);
    let e = node_down(&mut q, 3, 2);
    assert_eq!(delivered(&e), vec![(live, 0, 1), (live, 1, 1)]);
    assert_eq!(q.checked_out(gone).count(), 0);
    // Still attached (its channel may come back), but nothing is pushed to it.
    assert_eq!(q.consumer_count(), 2);
    let e = enqueue_n(&mut q, 4, 3);
    assert_eq!(
        delivered(&e).iter().map(|d| d.0).collect::<Vec<_>>(),
        vec![live, live, live]
    );
}

#[test]
fn node_down_drops_get_slots_and_cancelled_consumers_of_that_node() {
    let mut q = QueueMachine::default();
    let (slot, cancelled, other) = (on(2, 1, 1), on(2, 1, 2), on(3, 1, 1));
    enqueue_n(&mut q, 0, 3);
    get(&mut q, 1, slot, false);
    checkout(&mut q, 2, cancelled, 1);
    cancel(&mut q, 3, cancelled);
    checkout(&mut q, 4, other, 1);
    assert_eq!(q.unacked_count(), 3);
    node_down(&mut q, 5, 2);
    assert_eq!(q.unacked_count(), 1);
    assert_eq!(q.ready_count(), 2);
    assert!(q.consumer_nodes().iter().all(|n| n.node == 3));
}

#[test]
fn node_down_twice_and_for_a_node_without_consumers_changes_nothing() {
    let mut q = QueueMachine::default();
    checkout(&mut q, 0, on(2, 1, 1), 1);
    enqueue_n(&mut q, 1, 2);
    assert!(node_down(&mut q, 2, 9).is_empty());
    node_down(&mut q, 3, 2);
    let before = q.clone();
    assert!(node_down(&mut q, 4, 2).is_empty());
    assert_eq!(q, before);
}

#[test]
fn node_down_counts_toward_the_delivery_limit() {
    let mut q = QueueMachine::new(QueueConfig {
        delivery_limit: Some(0),
        ..amo()
    });
    checkout(&mut q, 0, on(2, 1, 1), 0);
    enqueue_n(&mut q, 1, 1);
    let e = node_down(&mut q, 2, 2);
    assert_eq!(
        dead_lettered(&e),
        vec![(0, DeadLetterReason::DeliveryLimit)]
    );
}

/// rabbit_fifo `{nodeup, Node}`: the suspected consumers of that boot
/// take pushes again; earlier boots' records are gone for good.
#[test]
fn node_up_resumes_the_same_boot_and_drops_earlier_ones() {
    let mut q = QueueMachine::default();
    let (old, current) = (on(2, 1, 1), on(2, 2, 1));
    checkout(&mut q, 0, old, 1);
    checkout(&mut q, 1, current, 1);
    node_down(&mut q, 2, 2);
    assert!(delivered(&enqueue_n(&mut q, 3, 2)).is_empty());
    let e = node_up(&mut q, 4, 2, 2);
    assert_eq!(delivered(&e), vec![(current, 0, 0)]);
    assert_eq!(q.consumer_count(), 1);
    assert!(q.consumer_ids().iter().all(|c| *c != old));
    assert_eq!(q.ready_count(), 1);
}

#[test]
fn node_up_of_a_restarted_node_returns_its_old_boots_messages() {
    let mut q = QueueMachine::default();
    let (old, live) = (on(2, 1, 1), on(3, 1, 1));
    checkout(&mut q, 0, old, 0);
    enqueue_n(&mut q, 1, 2);
    checkout(&mut q, 2, live, 0);
    let e = node_up(&mut q, 3, 2, 2);
    assert_eq!(delivered(&e), vec![(live, 0, 1), (live, 1, 1)]);
    assert_eq!(q.consumer_count(), 1);
}

/// Single active consumer: a suspected active consumer gives way to the next.
#[test]
fn single_active_consumer_moves_off_a_suspected_node() {
    let mut q = QueueMachine::new(QueueConfig {
        single_active_consumer: true,
        ..amo()
    });
    let (first, second) = (on(2, 1, 1), on(3, 1, 1));
    checkout(&mut q, 0, first, 0);
    checkout(&mut q, 1, second, 0);
    enqueue_n(&mut q, 2, 1);
    let e = node_down(&mut q, 3, 2);
    assert_eq!(delivered(&e), vec![(second, 0, 1)]);
    node_up(&mut q, 4, 2, 1);
    let e = enqueue_n(&mut q, 5, 1);
    assert_eq!(delivered(&e), vec![(first, 1, 0)]);
}

/// The leader's sweep (`crate::liveness`) proposes from these summaries.
#[test]
fn consumer_nodes_tell_the_sweep_what_to_propose() {
    let mut q = QueueMachine::default();
    checkout(&mut q, 0, on(2, 1, 1), 0);
    checkout(&mut q, 0, on(2, 2, 1), 0);
    checkout(&mut q, 0, on(3, 4, 1), 0);
    let nodes = q.consumer_nodes();
    assert_eq!(nodes.len(), 2);
    let n2 = nodes[0];
    assert_eq!((n2.node, n2.oldest_epoch, n2.newest_epoch), (2, 1, 2));
    let is_up = |c: Option<QueueCommand>, want: Option<(u64, u32)>| match (c, want) {
        (Some(QueueCommand::NodeUp { node, epoch, .. }), Some(w)) => assert_eq!((node, epoch), w),
        (None, None) => {}
        (c, w) => panic!("{c:?} where NodeUp {w:?} was expected"),
    };
    // Node 2 runs boot 2: its boot-1 record is stale.
    is_up(n2.command(SeenNode::Up { epoch: 2 }, 9), Some((2, 2)));
    // Node 3 in boot 4 agrees with its records; no verdict without the detector.
    is_up(nodes[1].command(SeenNode::Up { epoch: 4 }, 9), None);
    is_up(nodes[1].command(SeenNode::Unknown, 9), None);
    assert!(matches!(
        nodes[1].command(SeenNode::Down, 9),
        Some(QueueCommand::NodeDown { node: 3, .. })
    ));
    // Once suspected, down again proposes nothing; up resumes.
    node_down(&mut q, 1, 3);
    let n3 = q.consumer_nodes()[1];
    assert!(n3.suspected && !n3.unsuspected);
    assert_eq!(n3.command(SeenNode::Down, 9), None);
    is_up(n3.command(SeenNode::Up { epoch: 4 }, 9), Some((3, 4)));
}
