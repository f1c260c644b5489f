//! Dead-letter handlers (spec §5.1-§5.3) and the held area (§5.6).

use super::super::machine::QueueMachine;
use super::super::types::*;
use super::helpers::*;

#[test]
fn at_least_once_holds_the_message_instead_of_dropping_it() {
    let mut q = QueueMachine::new(alo());
    enqueue_n(&mut q, 0, 2);
    checkout(&mut q, 1, cid(1), 0);
    let e = discard(&mut q, 2, cid(1), &[1, 0]);
    assert_eq!(
        e,
        vec![
            Effect::DeadLettered {
                reason: DeadLetterReason::Rejected,
                strategy: Some(DeadLetterStrategy::AtLeastOnce)
            },
            Effect::DeadLetterHeld {
                id: 1,
                reason: DeadLetterReason::Rejected
            },
            Effect::DeadLettered {
                reason: DeadLetterReason::Rejected,
                strategy: Some(DeadLetterStrategy::AtLeastOnce)
            },
            Effect::DeadLetterHeld {
                id: 0,
                reason: DeadLetterReason::Rejected
            },
        ]
    );
    // messages=2 total, ready=0, unacked=0 (dead_lettering_SUITE at-least-once).
    assert_eq!(
        (q.ready_count(), q.unacked_count(), q.held_count()),
        (0, 0, 2)
    );
    assert_eq!(q.held_bytes(), 4);
    let r = DeadLetterReason::Rejected;
    assert_eq!(held_list(&q), vec![(1, r), (0, r)]);
}

#[test]
fn dead_letter_settled_removes_held_messages() {
    let mut q = QueueMachine::new(alo());
    enqueue_n(&mut q, 0, 3);
    checkout(&mut q, 1, cid(1), 0);
    discard(&mut q, 2, cid(1), &[0, 1, 2]);
    let (r, e) = run(
        &mut q,
        QueueCommand::DeadLetterSettled {
            now_ms: 3,
            ids: vec![1, 99],
        },
    );
    assert_eq!(r, QueueReply::Ok);
    assert_eq!(e, vec![Effect::DropBody { id: 1 }]);
    let x = DeadLetterReason::Rejected;
    assert_eq!(held_list(&q), vec![(0, x), (2, x)]);
    assert_eq!(q.held_bytes(), 4);
    // Settling again is ignored.
    let (_, e) = run(
        &mut q,
        QueueCommand::DeadLetterSettled {
            now_ms: 4,
            ids: vec![1],
        },
    );
    assert!(e.is_empty());
}

#[test]
fn dead_letter_settled_without_at_least_once_is_ignored() {
    let mut q = QueueMachine::new(amo());
    enqueue_n(&mut q, 0, 1);
    let (_, e) = run(
        &mut q,
        QueueCommand::DeadLetterSettled {
            now_ms: 1,
            ids: vec![0],
        },
    );
    assert!(e.is_empty());
    assert_eq!(q.ready_count(), 1);
}

#[test]
fn at_least_once_holds_expired_and_delivery_limit_messages() {
    let mut q = QueueMachine::new(QueueConfig {
        delivery_limit: Some(0),
        ..alo()
    });
    enqueue(&mut q, 0, vec![msg("a"), msg_ttl("b", 5)]);
    get(&mut q, 1, cid(1), false);
    let e = ret(&mut q, 2, cid(1), &[0]);
    assert_eq!(held(&e), vec![(0, DeadLetterReason::DeliveryLimit)]);
    let e = tick(&mut q, 5);
    assert_eq!(held(&e), vec![(1, DeadLetterReason::Expired)]);
    assert_eq!(
        held_list(&q),
        vec![
            (0, DeadLetterReason::DeliveryLimit),
            (1, DeadLetterReason::Expired)
        ]
    );
}

#[test]
fn at_least_once_with_drop_head_falls_back_to_at_most_once() {
    // drop_head_falls_back_to_at_most_once (spec §5.1).
    let cfg = QueueConfig {
        overflow: Overflow::DropHead,
        ..alo()
    };
    let mut q = QueueMachine::new(cfg);
    enqueue_n(&mut q, 0, 1);
    get(&mut q, 1, cid(1), false);
    let e = discard(&mut q, 2, cid(1), &[0]);
    assert_eq!(dead_lettered(&e), vec![(0, DeadLetterReason::Rejected)]);
    assert_eq!(q.held_count(), 0);
}

#[test]
fn at_least_once_without_target_is_disabled() {
    let cfg = QueueConfig {
        dead_letter: None,
        ..alo()
    };
    let mut q = QueueMachine::new(cfg);
    enqueue_n(&mut q, 0, 1);
    get(&mut q, 1, cid(1), false);
    assert_eq!(
        discard(&mut q, 2, cid(1), &[0]),
        vec![
            Effect::DeadLettered {
                reason: DeadLetterReason::Rejected,
                strategy: None
            },
            Effect::DropBody { id: 0 }
        ]
    );
}

#[test]
fn held_messages_count_toward_max_length() {
    // reject_publish_source_queue_max_length: x-max-length 1, two expired
    // and held messages, the 3rd publish is refused.
    let mut q = QueueMachine::new(QueueConfig {
        max_length: Some(1),
        message_ttl_ms: Some(10),
        ..alo()
    });
    let (o, _) = enqueue(&mut q, 0, vec![msg("a")]);
    assert_eq!(o, vec![EnqueueOutcome::Accepted]);
    tick(&mut q, 10);
    assert_eq!((q.ready_count(), q.held_count()), (0, 1));
    let (o, e) = enqueue(&mut q, 11, vec![msg("b")]);
    assert_eq!(o, vec![EnqueueOutcome::Accepted]);
    assert_eq!(blocked(&e), vec![true]);
    tick(&mut q, 21);
    assert_eq!((q.ready_count(), q.held_count()), (0, 2));
    let (o, _) = enqueue(&mut q, 22, vec![msg("c")]);
    assert_eq!(o, vec![EnqueueOutcome::Rejected]);
    // Settling the held messages unblocks.
    let (_, e) = run(
        &mut q,
        QueueCommand::DeadLetterSettled {
            now_ms: 23,
            ids: vec![0, 1],
        },
    );
    assert_eq!(blocked(&e), vec![false]);
    assert_eq!(
        enqueue(&mut q, 24, vec![msg("d")]).0,
        vec![EnqueueOutcome::Accepted]
    );
}

#[test]
fn held_bytes_count_toward_max_length_bytes() {
    let mut q = QueueMachine::new(QueueConfig {
        max_length_bytes: Some(4),
        ..alo()
    });
    enqueue(&mut q, 0, vec![sized(3)]);
    get(&mut q, 1, cid(1), false);
    discard(&mut q, 2, cid(1), &[0]);
    let (o, e) = enqueue(&mut q, 3, vec![sized(2), sized(1)]);
    assert_eq!(o, vec![EnqueueOutcome::Accepted, EnqueueOutcome::Rejected]);
    assert_eq!(blocked(&e), vec![true]);
}

#[test]
fn at_most_once_order_of_expired_messages_is_queue_order() {
    // at_most_once_dead_letter_order_expired.
    let mut q = QueueMachine::new(QueueConfig {
        message_ttl_ms: Some(5),
        ..amo()
    });
    enqueue_n(&mut q, 0, 3);
    let e = tick(&mut q, 5);
    let x = DeadLetterReason::Expired;
    assert_eq!(dead_lettered(&e), vec![(0, x), (1, x), (2, x)]);
    assert_eq!(dropped(&e), vec![0, 1, 2]);
    // DeadLetter always precedes the DropBody of the same message.
    let pos = |want: &Effect| e.iter().position(|x| x == want);
    assert!(
        pos(&Effect::DropBody { id: 0 })
            > pos(&Effect::DeadLetter {
                id: 0,
                reason: x,
                target: target()
            })
    );
}
