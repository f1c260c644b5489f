//! `Checkout` and the delivery loop: FIFO, prefetch, round-robin, no_ack.

use super::super::machine::QueueMachine;
use super::super::types::*;
use super::helpers::*;

#[test]
fn checkout_delivers_ready_messages_in_fifo_order() {
    let mut q = QueueMachine::default();
    enqueue_n(&mut q, 0, 3);
    let e = checkout(&mut q, 1, cid(1), 0);
    assert_eq!(
        delivered(&e),
        vec![(cid(1), 0, 0), (cid(1), 1, 0), (cid(1), 2, 0)]
    );
    assert_eq!(q.consumer_count(), 1);
    assert_eq!(q.unacked_count(), 3);
    assert_eq!(q.checked_out(cid(1)).collect::<Vec<_>>(), vec![0, 1, 2]);
}

#[test]
fn prefetch_bounds_checked_out_messages() {
    let mut q = QueueMachine::default();
    enqueue_n(&mut q, 0, 5);
    let e = checkout(&mut q, 1, cid(1), 2);
    assert_eq!(delivered_ids(&e), vec![0, 1]);
    assert_eq!(q.ready_count(), 3);
    let e = enqueue_n(&mut q, 2, 1);
    assert!(delivered(&e).is_empty());
}

#[test]
fn settle_frees_prefetch_and_delivers_the_next() {
    let mut q = QueueMachine::default();
    enqueue_n(&mut q, 0, 3);
    checkout(&mut q, 1, cid(1), 1);
    let e = settle(&mut q, 2, cid(1), &[0]);
    assert_eq!(e[0], Effect::DropBody { id: 0 });
    assert_eq!(delivered_ids(&e), vec![1]);
}

#[test]
fn prefetch_zero_is_unlimited() {
    let mut q = QueueMachine::default();
    enqueue_n(&mut q, 0, 1000);
    let e = checkout(&mut q, 1, cid(1), 0);
    assert_eq!(delivered(&e).len(), 1000);
}

#[test]
fn round_robin_between_active_consumers() {
    let mut q = QueueMachine::default();
    checkout(&mut q, 0, cid(1), 0);
    checkout(&mut q, 0, cid(2), 0);
    checkout(&mut q, 0, cid(3), 0);
    let e = enqueue_n(&mut q, 1, 7);
    let to: Vec<u32> = delivered(&e).iter().map(|(c, _, _)| c.seq).collect();
    assert_eq!(to, vec![1, 2, 3, 1, 2, 3, 1]);
}

#[test]
fn round_robin_skips_consumers_without_spare_prefetch() {
    let mut q = QueueMachine::default();
    checkout(&mut q, 0, cid(1), 1);
    checkout(&mut q, 0, cid(2), 3);
    let e = enqueue_n(&mut q, 1, 5);
    let to: Vec<(u32, MsgId)> = delivered(&e)
        .iter()
        .map(|(c, id, _)| (c.seq, *id))
        .collect();
    assert_eq!(to, vec![(1, 0), (2, 1), (2, 2), (2, 3)]);
    assert_eq!(q.ready_count(), 1);
}

#[test]
fn no_ack_consumer_settles_on_delivery() {
    let mut q = QueueMachine::default();
    enqueue_n(&mut q, 0, 2);
    let e = run(
        &mut q,
        QueueCommand::Checkout {
            now_ms: 1,
            consumer: cid(1),
            prefetch: 1,
            no_ack: true,
        },
    )
    .1;
    assert_eq!(
        e,
        vec![
            Effect::Deliver {
                consumer: cid(1),
                delivery: Delivery {
                    id: 0,
                    delivery_count: 0,
                    payload: None,
                    resend: false
                }
            },
            Effect::DropBody { id: 0 },
            Effect::Deliver {
                consumer: cid(1),
                delivery: Delivery {
                    id: 1,
                    delivery_count: 0,
                    payload: None,
                    resend: false
                }
            },
            Effect::DropBody { id: 1 },
        ]
    );
    assert_eq!(q.unacked_count(), 0);
    assert_eq!(q.ready_count(), 0);
    assert_eq!(q.consumer_count(), 1);
}

#[test]
fn checkout_again_updates_prefetch() {
    let mut q = QueueMachine::default();
    enqueue_n(&mut q, 0, 4);
    checkout(&mut q, 1, cid(1), 1);
    let e = checkout(&mut q, 2, cid(1), 3);
    assert_eq!(delivered_ids(&e), vec![1, 2]);
    assert_eq!(q.consumer_count(), 1);
}

#[test]
fn checkout_reactivates_a_cancelled_consumer_keeping_its_messages() {
    let mut q = QueueMachine::default();
    enqueue_n(&mut q, 0, 3);
    checkout(&mut q, 1, cid(1), 1);
    run(
        &mut q,
        QueueCommand::Cancel {
            now_ms: 2,
            consumer: cid(1),
        },
    );
    assert_eq!(q.consumer_count(), 0);
    let e = checkout(&mut q, 3, cid(1), 2);
    assert_eq!(delivered_ids(&e), vec![1]);
    assert_eq!(q.checked_out(cid(1)).collect::<Vec<_>>(), vec![0, 1]);
}

#[test]
fn checkout_with_nothing_ready_delivers_nothing() {
    let mut q = QueueMachine::default();
    let (r, e) = run(
        &mut q,
        QueueCommand::Checkout {
            now_ms: 1,
            consumer: cid(1),
            prefetch: 10,
            no_ack: false,
        },
    );
    assert_eq!(r, QueueReply::Ok);
    assert!(e.is_empty());
}

#[test]
fn delivery_carries_the_delivery_count_of_returned_messages() {
    let mut q = QueueMachine::new(QueueConfig {
        delivery_limit: Some(10),
        ..QueueConfig::default()
    });
    enqueue_n(&mut q, 0, 1);
    checkout(&mut q, 1, cid(1), 1);
    let e = ret(&mut q, 2, cid(1), &[0]);
    assert_eq!(delivered(&e), vec![(cid(1), 0, 1)]);
    let e = ret(&mut q, 3, cid(1), &[0]);
    assert_eq!(delivered(&e), vec![(cid(1), 0, 2)]);
}

#[test]
fn returns_are_delivered_before_the_main_queue() {
    let mut q = QueueMachine::new(QueueConfig {
        delivery_limit: Some(5),
        ..QueueConfig::default()
    });
    enqueue_n(&mut q, 0, 2);
    let (_, _) = get(&mut q, 1, cid(9), false);
    ret(&mut q, 2, cid(9), &[0]);
    enqueue_n(&mut q, 3, 1);
    assert_eq!(q.ready_ids(), vec![0, 1, 2]);
    let e = checkout(&mut q, 4, cid(1), 0);
    assert_eq!(
        delivered(&e),
        vec![(cid(1), 0, 1), (cid(1), 1, 0), (cid(1), 2, 0)]
    );
}

#[test]
fn single_active_consumer_serves_only_the_oldest_until_it_leaves() {
    let mut q = QueueMachine::new(QueueConfig {
        single_active_consumer: true,
        ..Default::default()
    });
    let (a, b) = (cid(1), cid(2));
    checkout(&mut q, 1, a, 0);
    checkout(&mut q, 1, b, 0);
    assert_eq!(
        delivered_to(&enqueue_n(&mut q, 1, 3)),
        vec![a, a, a],
        "only the single active consumer receives"
    );
    assert_eq!(
        delivered_to(&down(&mut q, 2, a)),
        vec![b, b, b],
        "the next consumer takes over, returned messages included"
    );
}
