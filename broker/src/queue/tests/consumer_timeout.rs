//! Consumer timeouts (RabbitMQ 4.3 `x-consumer-timeout`): deadlines from the
//! commands' time, counted returns as on `ConsumerDown`, the leader's timer,
//! re-announcement by a new leader, snapshots; and a property over random
//! command sequences.

use proptest::prelude::*;

use super::super::machine::QueueMachine;
use super::super::types::*;
use super::helpers::*;

/// Subscribe `c` with `prefetch` and a consumer timeout.
fn subscribe(
    q: &mut QueueMachine,
    now_ms: u64,
    c: ConsumerId,
    prefetch: u32,
    timeout_ms: Option<u64>,
) -> Vec<Effect> {
    run(
        q,
        QueueCommand::Subscribe {
            now_ms,
            consumer: c,
            spec: ConsumerSpec {
                prefetch,
                timeout_ms,
                ..ConsumerSpec::default()
            },
        },
    )
    .1
}

fn timed_out(effects: &[Effect]) -> Vec<(ConsumerId, u64)> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::ConsumerTimedOut {
                consumer,
                timeout_ms,
            } => Some((*consumer, *timeout_ms)),
            _ => None,
        })
        .collect()
}

#[test]
fn fires_at_the_deadline_not_before() {
    let mut q = QueueMachine::new(QueueConfig::default());
    subscribe(&mut q, 0, cid(1), 10, Some(1000));
    let e = enqueue_n(&mut q, 100, 2);
    assert_eq!(delivered_ids(&e), vec![0, 1]);
    assert_eq!(q.next_timeout_ms(), Some(1100));
    assert_eq!(timers(&e), vec![1100], "the leader is asked to tick then");
    assert!(timed_out(&tick(&mut q, 1099)).is_empty());
    assert_eq!(q.checked_out(cid(1)).count(), 2);
    let e = tick(&mut q, 1100);
    assert_eq!(timed_out(&e), vec![(cid(1), 1000)]);
    assert_eq!(q.checked_out(cid(1)).count(), 0);
    assert_eq!(q.ready_count(), 2);
    assert_eq!(q.next_timeout_ms(), None);
    assert_eq!(
        q.timed_out_consumers().collect::<Vec<_>>(),
        vec![(cid(1), 1000)]
    );
}

#[test]
fn any_command_past_the_deadline_times_out() {
    let mut q = QueueMachine::new(QueueConfig::default());
    subscribe(&mut q, 0, cid(1), 1, Some(500));
    subscribe(&mut q, 0, cid(2), 1, None);
    enqueue_n(&mut q, 0, 1);
    assert_eq!(q.checked_out(cid(1)).count(), 1);
    // A publish at 600 finds the deadline passed; the returned message goes
    // to the other consumer in the same command, redelivered.
    let e = enqueue_n(&mut q, 600, 1);
    assert_eq!(timed_out(&e), vec![(cid(1), 500)]);
    assert_eq!(delivered(&e), vec![(cid(2), 0, 1)]);
}

#[test]
fn returns_are_counted_and_hit_the_delivery_limit() {
    let mut q = QueueMachine::new(QueueConfig {
        delivery_limit: Some(1),
        ..amo()
    });
    enqueue_n(&mut q, 0, 1);
    subscribe(&mut q, 0, cid(1), 1, Some(100));
    let e = tick(&mut q, 100);
    assert_eq!(timed_out(&e), vec![(cid(1), 100)]);
    subscribe(&mut q, 100, cid(2), 1, Some(100));
    assert_eq!(q.checked_out(cid(2)).collect::<Vec<_>>(), vec![0]);
    // The second timeout is the second return: over the limit of 1.
    let e = tick(&mut q, 200);
    assert_eq!(timed_out(&e), vec![(cid(2), 100)]);
    assert_eq!(
        dead_lettered(&e),
        vec![(0, DeadLetterReason::DeliveryLimit)]
    );
    assert_eq!(q.ready_count(), 0);
}

#[test]
fn a_timed_out_consumer_gets_no_more_pushes() {
    let mut q = QueueMachine::new(QueueConfig::default());
    subscribe(&mut q, 0, cid(1), 1, Some(100));
    enqueue_n(&mut q, 0, 1);
    tick(&mut q, 100);
    let e = enqueue_n(&mut q, 200, 3);
    assert!(delivered(&e).is_empty());
    assert_eq!(q.ready_count(), 4);
    assert_eq!(q.consumer_count(), 0);
    // Its channel answers with Cancel: the queue forgets it.
    cancel(&mut q, 300, cid(1));
    assert_eq!(q.timed_out_consumers().count(), 0);
    // Subscribing again (a new basic.consume) works as usual.
    let e = subscribe(&mut q, 400, cid(3), 0, Some(100));
    assert_eq!(delivered_ids(&e), vec![0, 1, 2, 3]);
}

#[test]
fn acked_messages_do_not_time_out() {
    let mut q = QueueMachine::new(QueueConfig::default());
    subscribe(&mut q, 0, cid(1), 0, Some(100));
    enqueue_n(&mut q, 0, 1);
    enqueue_n(&mut q, 50, 1);
    settle(&mut q, 90, cid(1), &[0]);
    // The deadline moves to the oldest unsettled delivery.
    assert_eq!(q.next_timeout_ms(), Some(150));
    assert!(timed_out(&tick(&mut q, 120)).is_empty());
    settle(&mut q, 140, cid(1), &[1]);
    assert_eq!(q.next_timeout_ms(), None);
    assert!(timed_out(&tick(&mut q, 10_000)).is_empty());
    assert_eq!(q.consumer_count(), 1);
}

#[test]
fn no_timeout_means_never() {
    let mut q = QueueMachine::new(QueueConfig::default());
    subscribe(&mut q, 0, cid(1), 0, None);
    enqueue_n(&mut q, 0, 1);
    assert_eq!(q.next_timeout_ms(), None);
    assert!(timed_out(&tick(&mut q, u64::MAX / 2)).is_empty());
}

#[test]
fn a_basic_get_slot_uses_the_queues_timeout() {
    let mut q = QueueMachine::new(QueueConfig {
        consumer_timeout_ms: Some(300),
        ..QueueConfig::default()
    });
    enqueue_n(&mut q, 0, 1);
    get(&mut q, 10, cid(9), false);
    assert_eq!(q.next_timeout_ms(), Some(310));
    let e = tick(&mut q, 310);
    assert_eq!(timed_out(&e), vec![(cid(9), 300)]);
    assert_eq!(q.ready_count(), 1);
}

#[test]
fn the_timer_is_the_earlier_of_expiry_and_deadline() {
    let mut q = QueueMachine::new(QueueConfig {
        message_ttl_ms: Some(5000),
        ..amo()
    });
    subscribe(&mut q, 0, cid(1), 1, Some(1000));
    let e = enqueue_n(&mut q, 0, 2);
    // Message 1 waits (expires at 5000); message 0 is out until 1000.
    assert_eq!(q.next_expiry_ms(), Some(5000));
    assert_eq!(timers(&e), vec![1000]);
    assert_eq!(q.next_timer_ms(), Some(1000));
    let e = tick(&mut q, 1000);
    assert_eq!(timed_out(&e), vec![(cid(1), 1000)]);
    assert_eq!(timers(&e), vec![5000]);
}

#[test]
fn a_new_leader_rearms_and_reannounces() {
    let mut q = QueueMachine::new(QueueConfig::default());
    subscribe(&mut q, 0, cid(1), 1, Some(1000));
    subscribe(&mut q, 0, cid(2), 1, Some(200));
    enqueue_n(&mut q, 10, 2);
    let e = q.leader_effects();
    assert_eq!(timers(&e), vec![210]);
    tick(&mut q, 210);
    let e = q.leader_effects();
    assert_eq!(timed_out(&e), vec![(cid(2), 200)]);
    assert_eq!(timers(&e), vec![1010]);
    down(&mut q, 300, cid(2));
    assert!(timed_out(&q.leader_effects()).is_empty());
}

#[test]
fn the_deadline_survives_a_snapshot() {
    let mut q = QueueMachine::new(QueueConfig::default());
    subscribe(&mut q, 0, cid(1), 1, Some(1000));
    subscribe(&mut q, 0, cid(2), 1, Some(100));
    enqueue_n(&mut q, 10, 2);
    tick(&mut q, 110);
    let bytes = bincode::serde::encode_to_vec(&q, bincode::config::standard()).unwrap();
    let (mut back, _): (QueueMachine, usize) =
        bincode::serde::decode_from_slice(&bytes, bincode::config::standard()).unwrap();
    assert_eq!(back, q);
    assert_eq!(back.next_timeout_ms(), Some(1010));
    assert_eq!(
        back.timed_out_consumers().collect::<Vec<_>>(),
        vec![(cid(2), 100)]
    );
    assert!(timed_out(&tick(&mut back, 1009)).is_empty());
    assert_eq!(timed_out(&tick(&mut back, 1010)), vec![(cid(1), 1000)]);
}

#[test]
fn node_restart_forgets_timed_out_consumers_of_old_boots() {
    let mut q = QueueMachine::new(QueueConfig::default());
    subscribe(&mut q, 0, cid(1), 1, Some(100));
    enqueue_n(&mut q, 0, 1);
    tick(&mut q, 100);
    assert_eq!(q.timed_out_consumers().count(), 1);
    run(
        &mut q,
        QueueCommand::NodeRestarted {
            now_ms: 200,
            node: 1,
            epoch: 2,
        },
    );
    assert_eq!(q.timed_out_consumers().count(), 0);
}

/// One step of the property: consumers 1-3 (timeouts 100, 250, none).
#[derive(Debug, Clone)]
enum Op {
    Advance(u64),
    Enqueue(usize),
    Subscribe(u32),
    Settle(u32, usize),
    Return(u32, usize),
    Cancel(u32),
    Down(u32),
    Get(bool),
    Tick,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (1u64..200).prop_map(Op::Advance),
        (1usize..4).prop_map(Op::Enqueue),
        (1u32..4).prop_map(Op::Subscribe),
        (1u32..4, 0usize..4).prop_map(|(c, i)| Op::Settle(c, i)),
        (1u32..4, 0usize..4).prop_map(|(c, i)| Op::Return(c, i)),
        (1u32..4).prop_map(Op::Cancel),
        (1u32..4).prop_map(Op::Down),
        any::<bool>().prop_map(Op::Get),
        Just(Op::Tick),
    ]
}

fn timeout_of(c: u32) -> Option<u64> {
    match c {
        1 => Some(100),
        2 => Some(250),
        _ => None,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// After every command no checked-out message is older than its
    /// consumer's timeout; a timed-out consumer gets no push until it
    /// subscribes again; every timeout returns all its consumer's messages;
    /// the timer never lets a deadline pass unannounced.
    #[test]
    fn no_delivery_outlives_its_timeout(ops in proptest::collection::vec(op(), 1..60)) {
        let mut q = QueueMachine::new(QueueConfig {
            consumer_timeout_ms: Some(400),
            delivery_limit: Some(3),
            ..amo()
        });
        let mut now = 0u64;
        let mut gone: std::collections::BTreeSet<ConsumerId> = Default::default();
        for op in ops {
            let cmd = match op {
                Op::Advance(d) => { now += d; continue; }
                Op::Enqueue(n) => QueueCommand::Enqueue {
                    now_ms: now,
                    msgs: (0..n).map(|i| msg(&format!("m{i}"))).collect(),
                },
                Op::Subscribe(c) => QueueCommand::Subscribe {
                    now_ms: now,
                    consumer: cid(c),
                    spec: ConsumerSpec { prefetch: c - 1, timeout_ms: timeout_of(c), ..ConsumerSpec::default() },
                },
                Op::Settle(c, i) | Op::Return(c, i) => {
                    let ids: Vec<MsgId> = q.checked_out(cid(c)).skip(i).take(1).collect();
                    if matches!(op, Op::Settle(..)) {
                        QueueCommand::Settle { now_ms: now, consumer: cid(c), ids }
                    } else {
                        QueueCommand::Return { now_ms: now, consumer: cid(c), ids }
                    }
                }
                Op::Cancel(c) => QueueCommand::Cancel { now_ms: now, consumer: cid(c) },
                Op::Down(c) => QueueCommand::ConsumerDown { now_ms: now, consumer: cid(c) },
                Op::Get(no_ack) => QueueCommand::Dequeue { now_ms: now, consumer: cid(9), no_ack },
                Op::Tick => QueueCommand::Tick { now_ms: now },
            };
            // A consumer this command (re)attaches may time out first and then
            // take messages again in the same command.
            let renews = match &cmd {
                QueueCommand::Subscribe { consumer, .. }
                | QueueCommand::Dequeue { consumer, .. } => Some(*consumer),
                _ => None,
            };
            if let Some(c) = renews {
                gone.remove(&c);
            }
            let before: Vec<(ConsumerId, Vec<MsgId>)> = q
                .consumer_ids()
                .into_iter()
                .map(|c| (c, q.checked_out(c).collect()))
                .collect();
            let deadline = q.next_timer_ms();
            let (_, effects) = q.apply(cmd);
            prop_assert!(q.check_invariants().is_ok(), "{:?}", q.check_invariants());
            for (c, t) in timed_out(&effects) {
                prop_assert_eq!(Some(t), timeout_of(c.seq).or(Some(400)));
                if renews != Some(c) {
                    prop_assert_eq!(q.checked_out(c).count(), 0);
                }
                prop_assert!(before.iter().any(|(b, ids)| *b == c && !ids.is_empty()));
                // Only at or after the deadline the timer announced.
                prop_assert!(deadline.is_some_and(|d| d <= now));
                if renews != Some(c) {
                    gone.insert(c);
                }
            }
            for (c, _, _) in delivered(&effects) {
                prop_assert!(!gone.contains(&c), "push to timed-out {:?}", c);
            }
            // Every message still out was checked out less than its timeout ago.
            prop_assert!(q.next_timeout_ms().is_none_or(|d| d > now),
                "a delivery is past its timeout at {}: {:?}", now, q.next_timeout_ms());
            prop_assert_eq!(q.next_timer_ms(), [q.next_expiry_ms(), q.next_timeout_ms()].into_iter().flatten().min());
        }
    }
}
