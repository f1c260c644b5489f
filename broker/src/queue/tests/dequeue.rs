//! `Dequeue` (basic.get) and `Purge`.

use super::super::machine::QueueMachine;
use super::super::types::*;
use super::helpers::*;

#[test]
fn dequeue_on_empty_queue_returns_none() {
    let mut q = QueueMachine::default();
    let (d, e) = get(&mut q, 1, cid(1), false);
    assert_eq!(d, None);
    assert!(e.is_empty());
    assert_eq!(q.unacked_count(), 0);
}

#[test]
fn dequeue_takes_the_head_and_reports_ready_left() {
    let mut q = QueueMachine::default();
    enqueue_n(&mut q, 0, 3);
    let (d, e) = get(&mut q, 1, cid(1), false);
    assert_eq!(
        d,
        Some((
            Delivery {
                id: 0,
                delivery_count: 0,
                payload: None,
                resend: false
            },
            2
        ))
    );
    assert!(e.is_empty());
    assert_eq!(q.unacked_count(), 1);
    assert_eq!(q.consumer_count(), 0);
}

#[test]
fn dequeue_no_ack_drops_the_body() {
    let mut q = QueueMachine::default();
    enqueue_n(&mut q, 0, 1);
    let (d, e) = get(&mut q, 1, cid(1), true);
    assert_eq!(
        d,
        Some((
            Delivery {
                id: 0,
                delivery_count: 0,
                payload: None,
                resend: false
            },
            0
        ))
    );
    assert_eq!(e, vec![Effect::DropBody { id: 0 }]);
    assert_eq!(q.unacked_count(), 0);
    assert!(q.live_ids().is_empty());
}

#[test]
fn dequeued_message_can_be_settled_returned_or_discarded() {
    let mut q = QueueMachine::new(amo());
    enqueue_n(&mut q, 0, 3);
    for _ in 0..3 {
        get(&mut q, 1, cid(1), false);
    }
    assert_eq!(
        settle(&mut q, 2, cid(1), &[0]),
        vec![Effect::DropBody { id: 0 }]
    );
    assert_eq!(
        dead_lettered(&discard(&mut q, 3, cid(1), &[1])),
        vec![(1, DeadLetterReason::Rejected)]
    );
    ret(&mut q, 4, cid(1), &[2]);
    assert_eq!(q.ready_ids(), vec![2]);
    assert_eq!(q.unacked_count(), 0);
}

#[test]
fn get_slot_never_receives_pushes() {
    let mut q = QueueMachine::default();
    enqueue_n(&mut q, 0, 1);
    get(&mut q, 1, cid(1), false);
    let e = enqueue_n(&mut q, 2, 2);
    assert!(delivered(&e).is_empty());
    assert_eq!(q.ready_count(), 2);
}

#[test]
fn dequeue_expires_the_head_first() {
    let mut q = QueueMachine::new(amo());
    enqueue(
        &mut q,
        0,
        vec![msg_ttl("a", 10), msg_ttl("b", 10), msg("c")],
    );
    let (d, e) = get(&mut q, 10, cid(1), false);
    let x = DeadLetterReason::Expired;
    assert_eq!(dead_lettered(&e), vec![(0, x), (1, x)]);
    assert_eq!(d.map(|(d, left)| (d.id, left)), Some((2, 0)));
}

#[test]
fn dequeue_answers_empty_when_everything_ready_expired() {
    let mut q = QueueMachine::default();
    enqueue(&mut q, 0, vec![msg_ttl("a", 10)]);
    let (d, e) = get(&mut q, 10, cid(1), false);
    assert_eq!(d, None);
    assert_eq!(
        e,
        vec![
            Effect::DeadLettered {
                reason: DeadLetterReason::Expired,
                strategy: None
            },
            Effect::DropBody { id: 0 }
        ]
    );
}

#[test]
fn dequeue_takes_returns_first() {
    let mut q = QueueMachine::new(QueueConfig {
        delivery_limit: Some(3),
        ..QueueConfig::default()
    });
    enqueue_n(&mut q, 0, 2);
    get(&mut q, 1, cid(1), false);
    get(&mut q, 1, cid(1), false);
    ret(&mut q, 2, cid(1), &[1]);
    let (d, _) = get(&mut q, 3, cid(2), false);
    assert_eq!(
        d,
        Some((
            Delivery {
                id: 1,
                delivery_count: 1,
                payload: None,
                resend: false
            },
            0
        ))
    );
}

#[test]
fn dequeue_on_behalf_of_an_active_consumer_adds_to_its_unacked() {
    let mut q = QueueMachine::default();
    checkout(&mut q, 0, cid(1), 2);
    run(
        &mut q,
        QueueCommand::Cancel {
            now_ms: 0,
            consumer: cid(1),
        },
    );
    enqueue_n(&mut q, 1, 1);
    get(&mut q, 2, cid(1), false);
    assert_eq!(q.checked_out(cid(1)).collect::<Vec<_>>(), vec![0]);
}

#[test]
fn purge_drops_ready_messages_only() {
    let mut q = QueueMachine::new(QueueConfig {
        delivery_limit: Some(5),
        ..amo()
    });
    enqueue_n(&mut q, 0, 4);
    get(&mut q, 1, cid(1), false);
    get(&mut q, 1, cid(1), false);
    ret(&mut q, 2, cid(1), &[1]);
    // Ready: 1 (returns), 2, 3. Checked out: 0.
    let (r, e) = run(&mut q, QueueCommand::Purge { now_ms: 3 });
    assert_eq!(r, QueueReply::Purged(3));
    assert_eq!(
        e,
        vec![
            Effect::DropBody { id: 1 },
            Effect::DropBody { id: 2 },
            Effect::DropBody { id: 3 }
        ]
    );
    assert!(dead_lettered(&e).is_empty());
    assert_eq!(q.ready_count(), 0);
    assert_eq!(q.ready_bytes(), 0);
    assert_eq!(q.unacked_count(), 1);
}

#[test]
fn purge_of_empty_queue_is_zero() {
    let mut q = QueueMachine::default();
    assert_eq!(
        run(&mut q, QueueCommand::Purge { now_ms: 0 }),
        (QueueReply::Purged(0), vec![])
    );
}

#[test]
fn purge_keeps_held_dead_letters() {
    let mut q = QueueMachine::new(alo());
    enqueue_n(&mut q, 0, 2);
    get(&mut q, 1, cid(1), false);
    discard(&mut q, 2, cid(1), &[0]);
    let (r, _) = run(&mut q, QueueCommand::Purge { now_ms: 3 });
    assert_eq!(r, QueueReply::Purged(1));
    assert_eq!(q.held_count(), 1);
}
