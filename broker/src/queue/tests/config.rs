//! `UpdateConfig`: policy changes at runtime (spec §1.6, §5.7).

use super::super::machine::QueueMachine;
use super::super::types::*;
use super::helpers::*;

#[test]
fn lowering_max_length_drops_the_excess_from_the_head() {
    let mut q = QueueMachine::new(amo());
    enqueue_n(&mut q, 0, 5);
    let e = update(
        &mut q,
        1,
        QueueConfig {
            max_length: Some(2),
            ..amo()
        },
    );
    let m = DeadLetterReason::Maxlen;
    assert_eq!(dead_lettered(&e), vec![(0, m), (1, m), (2, m)]);
    assert_eq!(q.ready_ids(), vec![3, 4]);
    assert_eq!(q.config().max_length, Some(2));
}

#[test]
fn new_message_ttl_applies_to_later_messages_only() {
    // message_ttl_policy.
    let mut q = QueueMachine::new(amo());
    enqueue_n(&mut q, 0, 1);
    update(
        &mut q,
        1,
        QueueConfig {
            message_ttl_ms: Some(10),
            ..amo()
        },
    );
    enqueue_n(&mut q, 2, 1);
    let e = tick(&mut q, 100);
    assert!(dead_lettered(&e).is_empty());
    // Once the untimed head is gone, the later message is expired at once.
    let (d, e) = get(&mut q, 101, cid(1), true);
    assert_eq!(d.map(|(d, _)| d.id), Some(0));
    assert_eq!(dead_lettered(&e), vec![(1, DeadLetterReason::Expired)]);
}

#[test]
fn leaving_at_least_once_deletes_held_messages() {
    // switch_strategy: "Deleted N dead-lettered messages".
    let mut q = QueueMachine::new(alo());
    enqueue_n(&mut q, 0, 3);
    get(&mut q, 1, cid(1), false);
    get(&mut q, 1, cid(1), false);
    discard(&mut q, 2, cid(1), &[1, 0]);
    assert_eq!(q.held_count(), 2);
    let e = update(&mut q, 3, amo());
    assert_eq!(
        e,
        vec![Effect::DropBody { id: 1 }, Effect::DropBody { id: 0 }]
    );
    assert_eq!((q.held_count(), q.held_bytes()), (0, 0));
    assert_eq!(q.ready_count(), 1);
}

#[test]
fn changing_overflow_to_drop_head_also_leaves_at_least_once() {
    let mut q = QueueMachine::new(alo());
    enqueue_n(&mut q, 0, 1);
    get(&mut q, 1, cid(1), false);
    discard(&mut q, 2, cid(1), &[0]);
    let e = update(
        &mut q,
        3,
        QueueConfig {
            overflow: Overflow::DropHead,
            ..alo()
        },
    );
    assert_eq!(dropped(&e), vec![0]);
    assert_eq!(q.held_count(), 0);
}

#[test]
fn at_least_once_to_at_least_once_keeps_held_messages() {
    let mut q = QueueMachine::new(alo());
    enqueue_n(&mut q, 0, 1);
    get(&mut q, 1, cid(1), false);
    discard(&mut q, 2, cid(1), &[0]);
    let new_target = DeadLetterTarget {
        exchange: "other".into(),
        routing_key: None,
    };
    let e = update(
        &mut q,
        3,
        QueueConfig {
            dead_letter: Some(new_target),
            ..alo()
        },
    );
    assert!(e.is_empty());
    assert_eq!(held_list(&q), vec![(0, DeadLetterReason::Rejected)]);
}

#[test]
fn switching_to_at_least_once_leaves_earlier_dead_letters_alone() {
    let mut q = QueueMachine::new(amo());
    enqueue_n(&mut q, 0, 2);
    get(&mut q, 1, cid(1), false);
    discard(&mut q, 2, cid(1), &[0]);
    update(&mut q, 3, alo());
    assert_eq!(q.held_count(), 0);
    get(&mut q, 4, cid(1), false);
    discard(&mut q, 5, cid(1), &[1]);
    assert_eq!(held_list(&q), vec![(1, DeadLetterReason::Rejected)]);
}

#[test]
fn removing_the_limit_unblocks_publishers() {
    let cfg = QueueConfig {
        max_length: Some(1),
        overflow: Overflow::RejectPublish,
        ..QueueConfig::default()
    };
    let mut q = QueueMachine::new(cfg.clone());
    enqueue_n(&mut q, 0, 2);
    assert!(q.publishers_blocked());
    let e = update(
        &mut q,
        1,
        QueueConfig {
            max_length: None,
            ..cfg
        },
    );
    assert_eq!(blocked(&e), vec![false]);
    assert!(!q.publishers_blocked());
}

#[test]
fn switching_to_drop_head_unblocks_and_drops() {
    let cfg = QueueConfig {
        max_length: Some(1),
        overflow: Overflow::RejectPublish,
        ..amo()
    };
    let mut q = QueueMachine::new(cfg.clone());
    enqueue_n(&mut q, 0, 2);
    let e = update(
        &mut q,
        1,
        QueueConfig {
            overflow: Overflow::DropHead,
            ..cfg
        },
    );
    assert_eq!(dead_lettered(&e), vec![(0, DeadLetterReason::Maxlen)]);
    assert_eq!(blocked(&e), vec![false]);
}

#[test]
fn lowering_the_limit_with_reject_publish_blocks_without_dropping() {
    let mut q = QueueMachine::new(QueueConfig {
        overflow: Overflow::RejectPublish,
        ..amo()
    });
    enqueue_n(&mut q, 0, 3);
    let e = update(
        &mut q,
        1,
        QueueConfig {
            overflow: Overflow::RejectPublish,
            max_length: Some(1),
            ..amo()
        },
    );
    assert_eq!(e, vec![Effect::PublishersBlocked(true)]);
    assert_eq!(q.ready_count(), 3);
}

#[test]
fn update_config_renews_the_x_expires_lease() {
    // 3.10 quirk (spec §1.6).
    let cfg = QueueConfig {
        expires_ms: Some(100),
        ..QueueConfig::default()
    };
    let mut q = QueueMachine::new(cfg.clone());
    tick(&mut q, 0);
    update(&mut q, 90, cfg);
    assert!(!queue_expired(&tick(&mut q, 150)));
    assert!(queue_expired(&tick(&mut q, 191)));
}

#[test]
fn removing_the_dead_letter_exchange_drops_later_dead_letters() {
    // dead_letter_policy: set, then cleared: the second nack is dropped.
    let mut q = QueueMachine::new(amo());
    enqueue_n(&mut q, 0, 2);
    checkout(&mut q, 1, cid(1), 0);
    assert_eq!(dead_lettered(&discard(&mut q, 2, cid(1), &[0])).len(), 1);
    update(&mut q, 3, QueueConfig::default());
    assert_eq!(
        discard(&mut q, 4, cid(1), &[1]),
        vec![
            Effect::DeadLettered {
                reason: DeadLetterReason::Rejected,
                strategy: None
            },
            Effect::DropBody { id: 1 }
        ]
    );
}
