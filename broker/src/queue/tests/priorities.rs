//! Consumer priorities (`Subscribe` with `x-priority`) and message
//! priorities (`x-max-priority`, `EnqueuePrioritized`): order, round-robin,
//! prefetch spill, single active consumer, and how TTL, drop-head, the
//! delivery limit, returns, basic.get, purge and dead-lettering pick.

use super::super::machine::QueueMachine;
use super::super::types::*;
use super::helpers::*;

/// A queue with `x-max-priority` `max` plus `config`'s other settings.
fn prio_queue(max: u8, config: QueueConfig) -> QueueMachine {
    QueueMachine::new(QueueConfig {
        max_priority: Some(max),
        ..config
    })
}

/// Enqueue one message per priority in `prios` (body = its index).
fn enqueue_prios(q: &mut QueueMachine, now_ms: u64, prios: &[u8]) -> Vec<Effect> {
    let msgs = prios
        .iter()
        .enumerate()
        .map(|(i, p)| PrioritizedMsg {
            msg: msg(&format!("m{i}")),
            priority: *p,
        })
        .collect();
    run(q, QueueCommand::enqueue(now_ms, msgs)).1
}

/// basic.consume with `prefetch` and consumer priority `priority`.
fn subscribe(
    q: &mut QueueMachine,
    now_ms: u64,
    c: ConsumerId,
    prefetch: u32,
    priority: i32,
) -> Vec<Effect> {
    run(
        q,
        QueueCommand::Subscribe {
            now_ms,
            consumer: c,
            spec: ConsumerSpec {
                prefetch,
                priority,
                ..ConsumerSpec::default()
            },
        },
    )
    .1
}

#[test]
fn enqueue_builds_the_plain_command_without_priorities() {
    let plain = QueueCommand::enqueue(
        1,
        vec![PrioritizedMsg {
            msg: msg("a"),
            priority: 0,
        }],
    );
    assert!(matches!(plain, QueueCommand::Enqueue { .. }));
    let prio = QueueCommand::enqueue(
        1,
        vec![
            PrioritizedMsg {
                msg: msg("a"),
                priority: 0,
            },
            PrioritizedMsg {
                msg: msg("b"),
                priority: 3,
            },
        ],
    );
    assert!(matches!(prio, QueueCommand::EnqueuePrioritized { .. }));
}

#[test]
fn highest_priority_first_fifo_within_one_and_clamped_to_the_maximum() {
    let mut q = prio_queue(5, QueueConfig::default());
    // ids 0..=7 with priorities:
    enqueue_prios(&mut q, 0, &[0, 3, 5, 3, 9, 0, 5, 1]);
    // 9 is kept as 5 (after id 2, before id 6: FIFO among the fives).
    assert_eq!(q.ready_ids(), vec![2, 4, 6, 1, 3, 7, 0, 5]);
    let e = checkout(&mut q, 1, cid(1), 0);
    assert_eq!(delivered_ids(&e), vec![2, 4, 6, 1, 3, 7, 0, 5]);
}

#[test]
fn without_max_priority_the_priority_is_ignored() {
    let mut q = QueueMachine::default();
    enqueue_prios(&mut q, 0, &[0, 3, 9, 1]);
    assert_eq!(q.ready_ids(), vec![0, 1, 2, 3]);
}

#[test]
fn basic_get_takes_the_highest_priority_and_purge_drops_all() {
    let mut q = prio_queue(10, QueueConfig::default());
    enqueue_prios(&mut q, 0, &[1, 7, 4]);
    let (d, _) = get(&mut q, 1, cid(9), true);
    assert_eq!(d.map(|(d, left)| (d.id, left)), Some((1, 2)));
    let e = run(&mut q, QueueCommand::Purge { now_ms: 2 }).1;
    assert_eq!(dropped(&e), vec![2, 0]);
    assert_eq!(q.ready_count(), 0);
}

#[test]
fn a_return_goes_back_to_the_front_of_its_priority() {
    // With a delivery limit returns go to the returns queue of their priority.
    let mut q = prio_queue(
        9,
        QueueConfig {
            delivery_limit: Some(5),
            ..QueueConfig::default()
        },
    );
    enqueue_prios(&mut q, 0, &[2, 2, 8]);
    let (d, _) = get(&mut q, 1, cid(9), false);
    assert_eq!(d.map(|d| d.0.id), Some(2));
    let (d, _) = get(&mut q, 2, cid(9), false);
    assert_eq!(d.map(|d| d.0.id), Some(0));
    ret(&mut q, 3, cid(9), &[0]);
    ret(&mut q, 3, cid(9), &[2]);
    // 2 (priority 8) first, then 0 back before 1 (both priority 2).
    assert_eq!(q.ready_ids(), vec![2, 0, 1]);
    // Without a limit, 3.10 puts an explicit requeue at the back of its priority.
    let mut q = prio_queue(9, QueueConfig::default());
    enqueue_prios(&mut q, 0, &[2, 2, 8]);
    get(&mut q, 1, cid(9), false);
    get(&mut q, 2, cid(9), false);
    ret(&mut q, 3, cid(9), &[0]);
    assert_eq!(q.ready_ids(), vec![1, 0]);
    ret(&mut q, 3, cid(9), &[2]);
    assert_eq!(q.ready_ids(), vec![2, 1, 0]);
}

#[test]
fn the_delivery_limit_holds_for_every_priority_and_keeps_the_priority() {
    let mut q = prio_queue(
        9,
        QueueConfig {
            delivery_limit: Some(1),
            ..amo()
        },
    );
    enqueue_prios(&mut q, 0, &[9, 3]);
    get(&mut q, 1, cid(9), false);
    ret(&mut q, 2, cid(9), &[0]);
    // Returned once, still priority 9: ahead of id 1.
    let (d, _) = get(&mut q, 3, cid(9), false);
    assert_eq!(d.map(|d| (d.0.id, d.0.delivery_count)), Some((0, 1)));
    let e = ret(&mut q, 4, cid(9), &[0]);
    assert_eq!(
        dead_lettered(&e),
        vec![(0, DeadLetterReason::DeliveryLimit)]
    );
    assert_eq!(q.ready_ids(), vec![1]);
}

#[test]
fn ttl_expires_the_head_of_every_priority() {
    let mut q = prio_queue(9, amo());
    // id 0: priority 5, no TTL; id 1: priority 1, TTL 10; id 2: priority 1, no TTL.
    let msgs = vec![
        PrioritizedMsg {
            msg: msg("a"),
            priority: 5,
        },
        PrioritizedMsg {
            msg: msg_ttl("b", 10),
            priority: 1,
        },
        PrioritizedMsg {
            msg: msg("c"),
            priority: 1,
        },
    ];
    let (_, e) = run(&mut q, QueueCommand::enqueue(0, msgs));
    // The timer follows the earliest head expiry over the priorities.
    assert_eq!(timers(&e), vec![10]);
    assert_eq!(q.next_expiry_ms(), Some(10));
    // Id 1 expires although id 0 (a higher priority, no TTL) is ahead of it.
    let e = tick(&mut q, 10);
    assert_eq!(dead_lettered(&e), vec![(1, DeadLetterReason::Expired)]);
    assert_eq!(q.ready_ids(), vec![0, 2]);
}

#[test]
fn drop_head_drops_the_next_message_to_be_delivered() {
    // RabbitMQ's classic priority queue drops from the highest priority
    // (rabbit_priority_queue `drop` takes the first non-empty priority).
    let mut q = prio_queue(
        9,
        QueueConfig {
            max_length: Some(2),
            ..amo()
        },
    );
    enqueue_prios(&mut q, 0, &[1, 9]);
    let e = enqueue_prios(&mut q, 1, &[5]);
    assert_eq!(dead_lettered(&e), vec![(1, DeadLetterReason::Maxlen)]);
    assert_eq!(q.ready_ids(), vec![2, 0]);
}

#[test]
fn higher_consumer_priority_gets_every_push_while_it_has_room() {
    let mut q = QueueMachine::default();
    subscribe(&mut q, 0, cid(1), 0, 0);
    subscribe(&mut q, 0, cid(2), 0, 10);
    let e = enqueue_n(&mut q, 1, 5);
    assert_eq!(delivered_to(&e), vec![cid(2); 5]);
}

#[test]
fn lower_priority_gets_pushes_when_the_higher_is_at_its_prefetch() {
    let mut q = QueueMachine::default();
    subscribe(&mut q, 0, cid(1), 0, 0);
    subscribe(&mut q, 0, cid(2), 2, 10);
    let e = enqueue_n(&mut q, 1, 5);
    assert_eq!(
        delivered_to(&e),
        vec![cid(2), cid(2), cid(1), cid(1), cid(1)]
    );
    // An ack makes room: the next push goes to the higher priority again.
    settle(&mut q, 2, cid(2), &[0]);
    let e = enqueue_n(&mut q, 3, 1);
    assert_eq!(delivered_to(&e), vec![cid(2)]);
}

#[test]
fn equal_priorities_round_robin() {
    let mut q = QueueMachine::default();
    subscribe(&mut q, 0, cid(1), 0, 3);
    subscribe(&mut q, 0, cid(2), 0, 3);
    subscribe(&mut q, 0, cid(3), 0, -1);
    let e = enqueue_n(&mut q, 1, 4);
    assert_eq!(delivered_to(&e), vec![cid(1), cid(2), cid(1), cid(2)]);
}

#[test]
fn a_resubscription_with_another_priority_moves_the_consumer() {
    let mut q = QueueMachine::default();
    subscribe(&mut q, 0, cid(1), 0, 0);
    subscribe(&mut q, 0, cid(2), 0, 5);
    subscribe(&mut q, 1, cid(1), 0, 9);
    let e = enqueue_n(&mut q, 2, 2);
    assert_eq!(delivered_to(&e), vec![cid(1), cid(1)]);
    // Cancelling it leaves the other.
    cancel(&mut q, 3, cid(1));
    let e = enqueue_n(&mut q, 4, 1);
    assert_eq!(delivered_to(&e), vec![cid(2)]);
}

#[test]
fn single_active_consumer_is_the_highest_priority_and_hands_over() {
    let mut q = QueueMachine::new(QueueConfig {
        single_active_consumer: true,
        ..QueueConfig::default()
    });
    subscribe(&mut q, 0, cid(1), 0, 0);
    subscribe(&mut q, 0, cid(2), 0, -3);
    let e = enqueue_n(&mut q, 1, 2);
    assert_eq!(delivered_to(&e), vec![cid(1), cid(1)]);
    // A higher priority subscribes: it gets the new pushes; cid(1) keeps its two.
    subscribe(&mut q, 2, cid(3), 0, 4);
    let e = enqueue_n(&mut q, 3, 2);
    assert_eq!(delivered_to(&e), vec![cid(3), cid(3)]);
    assert_eq!(q.checked_out(cid(1)).count(), 2);
    // Equal priorities: the oldest (lowest id) stays active.
    subscribe(&mut q, 4, cid(4), 0, 4);
    let e = enqueue_n(&mut q, 5, 1);
    assert_eq!(delivered_to(&e), vec![cid(3)]);
    // The active one at its prefetch: nobody else gets pushes.
    let mut q = QueueMachine::new(QueueConfig {
        single_active_consumer: true,
        ..QueueConfig::default()
    });
    subscribe(&mut q, 0, cid(1), 1, 5);
    subscribe(&mut q, 0, cid(2), 0, 0);
    let e = enqueue_n(&mut q, 1, 3);
    assert_eq!(delivered_to(&e), vec![cid(1)]);
    // It leaves: the next priority takes over, with its returned message first.
    let e = down(&mut q, 2, cid(1));
    assert_eq!(
        delivered(&e),
        vec![(cid(2), 0, 1), (cid(2), 1, 0), (cid(2), 2, 0)]
    );
}

#[test]
fn consumer_priorities_survive_a_snapshot() {
    let mut q = prio_queue(3, QueueConfig::default());
    subscribe(&mut q, 0, cid(1), 1, 0);
    subscribe(&mut q, 0, cid(2), 1, 7);
    enqueue_prios(&mut q, 1, &[0, 3, 1, 2]);
    let bytes = bincode::serde::encode_to_vec(&q, bincode::config::standard())
        .unwrap_or_else(|e| panic!("encode: {e}"));
    let (mut back, _): (QueueMachine, _) =
        bincode::serde::decode_from_slice(&bytes, bincode::config::standard())
            .unwrap_or_else(|e| panic!("decode: {e}"));
    assert_eq!(back, q);
    // Id 0 went to cid(2) (priority 7), id 1 to cid(1); 3 (priority 2) before 2 (priority 1).
    assert_eq!(back.ready_ids(), vec![3, 2]);
    settle(&mut q, 2, cid(2), &[0]);
    let e = settle(&mut back, 2, cid(2), &[0]);
    assert_eq!(delivered(&e), vec![(cid(2), 3, 0)]);
    assert_eq!(back, q);
}
