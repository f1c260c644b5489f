//! Read-only position queries (`ready_at`, `queued_message_ids`): what
//! `quorumqctl peek` and `inspect_dead_letters` read, RabbitMQ
//! `rabbit_fifo:query_peek/2` (rabbit_fifo_SUITE `query_peek_test`).

use super::super::machine::QueueMachine;
use super::super::types::*;
use super::helpers::*;

#[test]
fn ready_at_walks_delivery_order_one_based() {
    let mut q = QueueMachine::default();
    assert_eq!(q.ready_at(1), None, "empty queue: no message at position 1");
    enqueue_n(&mut q, 0, 3);
    assert_eq!(q.ready_at(0), None, "position 0 is no position");
    assert_eq!(q.ready_at(1), Some((0, 0)));
    assert_eq!(q.ready_at(3), Some((2, 0)));
    assert_eq!(q.ready_at(4), None);
    assert_eq!(q.ready_at(u64::MAX), None);
}

#[test]
fn ready_at_serves_returns_first_with_their_delivery_count() {
    let mut q = QueueMachine::new(QueueConfig {
        delivery_limit: Some(5),
        ..amo()
    });
    enqueue_n(&mut q, 0, 3);
    get(&mut q, 1, cid(9), false);
    get(&mut q, 1, cid(9), false);
    ret(&mut q, 2, cid(9), &[1]);
    // Returns are served first (3.10 with a delivery limit); id 0 is checked out.
    assert_eq!(q.ready_at(1), Some((1, 1)));
    assert_eq!(q.ready_at(2), Some((2, 0)));
    assert_eq!(q.ready_at(3), None, "checked-out messages have no position");
}

#[test]
fn peeking_changes_nothing() {
    let mut q = QueueMachine::default();
    enqueue_n(&mut q, 0, 2);
    let before = q.clone();
    let _ = q.ready_at(1);
    let _ = q.queued_message_ids();
    assert_eq!(q, before);
}

#[test]
fn queued_message_ids_lists_ready_then_checked_out_not_held() {
    let mut q = QueueMachine::new(alo());
    enqueue_n(&mut q, 0, 4);
    get(&mut q, 1, cid(9), false); // 0 checked out
    get(&mut q, 1, cid(9), false); // 1 checked out
    discard(&mut q, 2, cid(9), &[1]); // 1 held (at-least-once)
    assert_eq!(q.held_count(), 1);
    assert_eq!(q.queued_message_ids(), vec![2, 3, 0]);
}
