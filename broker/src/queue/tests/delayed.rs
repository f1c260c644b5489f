//! Delayed retry (RabbitMQ 4.3 `x-delayed-retry-*`): which returns wait,
//! for how long, where they go when released, the timer, the limits, TTL,
//! purge, and the snapshot.

use super::super::machine::QueueMachine;
use super::super::types::*;
use super::helpers::*;

fn delayed(kind: DelayedRetryType, min_ms: u64, max_ms: u64) -> QueueConfig {
    QueueConfig {
        delayed_retry: DelayedRetry {
            kind,
            min_ms,
            max_ms,
        },
        ..QueueConfig::default()
    }
}

fn failed() -> QueueConfig {
    delayed(DelayedRetryType::Failed, 200, 1000)
}

#[test]
fn a_failed_return_waits_min_times_its_delivery_count_capped_at_max() {
    let mut q = QueueMachine::new(failed());
    enqueue_n(&mut q, 0, 1);
    let mut now = 10;
    for (n, wait) in [(1, 200), (2, 400), (3, 600), (4, 800), (5, 1000), (6, 1000)] {
        let (d, _) = get(&mut q, now, cid(9), false);
        assert_eq!(d.map(|(d, _)| d.delivery_count), Some(n - 1));
        let e = ret(&mut q, now, cid(9), &[0]);
        assert_eq!(timers(&e), vec![now + wait], "return {n}");
        assert_eq!((q.ready_count(), q.delayed_count()), (0, 1));
        assert_eq!(q.delayed_entries(), vec![(now + wait, 0)]);
        // Not a millisecond early: basic.get finds nothing before ready-at.
        assert!(get(&mut q, now + wait - 1, cid(9), false).0.is_none());
        assert_eq!(q.delayed_count(), 1);
        now += wait;
    }
}

#[test]
fn a_tick_at_ready_at_releases_to_a_waiting_consumer() {
    let mut q = QueueMachine::new(failed());
    enqueue_n(&mut q, 0, 1);
    checkout(&mut q, 1, cid(1), 1);
    let e = ret(&mut q, 5, cid(1), &[0]);
    assert!(delivered_ids(&e).is_empty(), "delayed, not redelivered");
    assert_eq!(timers(&e), vec![205]);
    let e = tick(&mut q, 204);
    assert!(delivered_ids(&e).is_empty());
    assert_eq!(timers(&e), vec![205], "an early tick re-arms the timer");
    let e = tick(&mut q, 205);
    assert_eq!(delivered(&e), vec![(cid(1), 0, 1)]);
    assert_eq!(q.delayed_count(), 0);
    assert!(timers(&e).is_empty());
}

#[test]
fn any_command_past_ready_at_releases_not_only_ticks() {
    let mut q = QueueMachine::new(failed());
    enqueue_n(&mut q, 0, 2);
    get(&mut q, 1, cid(9), false);
    ret(&mut q, 1, cid(9), &[0]);
    // An enqueue at 300 releases message 0 to the returns queue (served first).
    enqueue_n(&mut q, 300, 1);
    assert_eq!(q.ready_ids(), vec![0, 1, 2]);
}

#[test]
fn released_in_ready_at_then_id_order_to_the_back_of_the_returns_queue() {
    let mut q = QueueMachine::new(QueueConfig {
        delivery_limit: Some(10),
        ..delayed(DelayedRetryType::All, 100, 100)
    });
    enqueue_n(&mut q, 0, 5);
    for _ in 0..4 {
        get(&mut q, 1, cid(9), false);
    }
    // 3 and 1 at 10 (ready 110), 0 at 20 (ready 120), 2 at 5 (ready 105).
    ret(&mut q, 10, cid(9), &[3, 1]);
    ret(&mut q, 20, cid(9), &[0]);
    ret(&mut q, 5, cid(9), &[2]); // an older clock
    assert_eq!(
        q.delayed_entries(),
        vec![(105, 2), (110, 1), (110, 3), (120, 0)]
    );
    tick(&mut q, 200);
    // Returns queue first, in release order, then the main queue.
    assert_eq!(q.ready_ids(), vec![2, 1, 3, 0, 4]);
}

#[test]
fn failed_delays_nack_requeue_but_not_a_consumer_going_away() {
    let mut q = QueueMachine::new(failed());
    enqueue_n(&mut q, 0, 2);
    checkout(&mut q, 1, cid(1), 0);
    ret(&mut q, 2, cid(1), &[0]);
    assert_eq!(q.delayed_count(), 1);
    down(&mut q, 3, cid(1));
    assert_eq!(q.delayed_count(), 1);
    assert_eq!(
        q.ready_ids(),
        vec![1],
        "the consumer's return is ready at once"
    );
}

#[test]
fn returned_delays_a_consumer_going_away_but_not_nack_requeue() {
    let cfg = delayed(DelayedRetryType::Returned, 50, 50);
    // Channel closed.
    let mut q = QueueMachine::new(cfg.clone());
    enqueue_n(&mut q, 0, 2);
    checkout(&mut q, 1, cid(1), 0);
    ret(&mut q, 2, cid(1), &[0]);
    assert_eq!(q.delayed_count(), 0, "nack requeue is not delayed");
    let e = down(&mut q, 3, cid(1));
    assert_eq!(q.delayed_entries(), vec![(53, 0), (53, 1)]);
    assert_eq!(timers(&e), vec![53]);
    // Node restarted / node down.
    for cmd in [
        QueueCommand::NodeRestarted {
            now_ms: 10,
            node: 1,
            epoch: 2,
        },
        QueueCommand::NodeDown {
            now_ms: 10,
            node: 1,
        },
    ] {
        let mut q = QueueMachine::new(cfg.clone());
        enqueue_n(&mut q, 0, 1);
        checkout(&mut q, 1, cid(1), 0);
        run(&mut q, cmd);
        assert_eq!(q.delayed_entries(), vec![(60, 0)]);
    }
}

#[test]
fn disabled_and_all() {
    let mut q = QueueMachine::new(QueueConfig::default());
    enqueue_n(&mut q, 0, 1);
    checkout(&mut q, 1, cid(1), 0);
    ret(&mut q, 2, cid(1), &[0]);
    down(&mut q, 3, cid(1));
    assert_eq!(q.delayed_count(), 0);

    let mut q = QueueMachine::new(delayed(DelayedRetryType::All, 10, 10));
    enqueue_n(&mut q, 0, 2);
    checkout(&mut q, 1, cid(1), 0);
    ret(&mut q, 2, cid(1), &[0]);
    down(&mut q, 3, cid(1));
    assert_eq!(q.delayed_entries(), vec![(12, 0), (13, 1)]);
}

#[test]
fn the_delivery_limit_dead_letters_instead_of_delaying() {
    let mut q = QueueMachine::new(QueueConfig {
        delivery_limit: Some(1),
        dead_letter: amo().dead_letter,
        ..failed()
    });
    enqueue_n(&mut q, 0, 1);
    get(&mut q, 1, cid(9), false);
    ret(&mut q, 1, cid(9), &[0]);
    assert_eq!(q.delayed_count(), 1);
    get(&mut q, 201, cid(9), false);
    let e = ret(&mut q, 202, cid(9), &[0]);
    assert_eq!(
        dead_lettered(&e),
        vec![(0, DeadLetterReason::DeliveryLimit)]
    );
    assert_eq!(q.delayed_count(), 0);
    assert!(timers(&e).is_empty());
}

#[test]
fn delayed_messages_count_toward_the_limits_but_not_as_ready() {
    // reject-publish: 2 delayed messages fill max-length 2.
    let mut q = QueueMachine::new(QueueConfig {
        max_length: Some(2),
        overflow: Overflow::RejectPublish,
        ..failed()
    });
    enqueue_n(&mut q, 0, 3);
    assert_eq!(q.ready_count(), 3);
    for _ in 0..3 {
        get(&mut q, 1, cid(9), false);
    }
    ret(&mut q, 2, cid(9), &[0, 1, 2]);
    assert_eq!((q.ready_count(), q.delayed_count()), (0, 3));
    assert!(q.publishers_blocked());
    let (o, _) = enqueue(&mut q, 3, vec![msg("x")]);
    assert_eq!(o, vec![EnqueueOutcome::Rejected]);
    // Bytes count too.
    let mut q = QueueMachine::new(QueueConfig {
        max_length_bytes: Some(4),
        overflow: Overflow::RejectPublish,
        ..failed()
    });
    enqueue(&mut q, 0, vec![sized(5)]);
    assert!(q.publishers_blocked());
    get(&mut q, 1, cid(9), false);
    assert!(!q.publishers_blocked());
    ret(&mut q, 2, cid(9), &[0]);
    assert!(q.publishers_blocked(), "the delayed message's bytes count");
}

#[test]
fn drop_head_takes_ready_first_then_the_earliest_delayed() {
    let mut q = QueueMachine::new(QueueConfig {
        max_length: Some(2),
        dead_letter: amo().dead_letter,
        ..failed()
    });
    enqueue_n(&mut q, 0, 2);
    get(&mut q, 1, cid(9), false);
    get(&mut q, 1, cid(9), false);
    ret(&mut q, 2, cid(9), &[1]);
    ret(&mut q, 3, cid(9), &[0]);
    let e = enqueue_n(&mut q, 4, 1);
    assert_eq!(dead_lettered(&e), vec![(2, DeadLetterReason::Maxlen)]);
    // Nothing ready: a lower limit drops the earliest delayed one (1, ready at 202).
    let e = update(
        &mut q,
        5,
        QueueConfig {
            max_length: Some(1),
            dead_letter: amo().dead_letter,
            ..failed()
        },
    );
    assert_eq!(dead_lettered(&e), vec![(1, DeadLetterReason::Maxlen)]);
    assert_eq!(q.delayed_entries(), vec![(203, 0)]);
}

#[test]
fn ttl_expires_a_delayed_message_when_it_is_released() {
    let mut q = QueueMachine::new(QueueConfig {
        message_ttl_ms: Some(100),
        dead_letter: amo().dead_letter,
        ..failed()
    });
    enqueue_n(&mut q, 0, 1);
    get(&mut q, 1, cid(9), false);
    let e = ret(&mut q, 2, cid(9), &[0]);
    // The timer armed for the first head (100) fires first; its tick re-arms
    // at the release (202), not at the expiry (100) of a message that is not
    // at the head of the ready queue.
    assert!(timers(&e).is_empty());
    let e = tick(&mut q, 100);
    assert!(dead_lettered(&e).is_empty());
    assert_eq!(timers(&e), vec![202]);
    let e = tick(&mut q, 150);
    assert!(dead_lettered(&e).is_empty());
    assert_eq!(q.delayed_count(), 1);
    let e = tick(&mut q, 202);
    assert_eq!(dead_lettered(&e), vec![(0, DeadLetterReason::Expired)]);
    assert_eq!((q.ready_count(), q.delayed_count()), (0, 0));
}

#[test]
fn the_timer_is_the_earlier_of_head_expiry_and_first_release() {
    let mut q = QueueMachine::new(QueueConfig {
        message_ttl_ms: Some(1000),
        ..failed()
    });
    enqueue_n(&mut q, 0, 2);
    get(&mut q, 1, cid(9), false);
    let e = ret(&mut q, 2, cid(9), &[0]);
    assert_eq!(timers(&e), vec![202]);
    assert_eq!(q.next_timer_ms(), Some(202));
    assert_eq!(q.next_expiry_ms(), Some(1000));
    assert!(q
        .leader_effects()
        .contains(&Effect::ExpiryTimer { at_ms: 202 }));
    let e = tick(&mut q, 202);
    assert_eq!(timers(&e), vec![1000], "next: the head's expiry");
}

#[test]
fn a_new_leader_re_arms_the_release_timer() {
    let mut q = QueueMachine::new(failed());
    enqueue_n(&mut q, 0, 1);
    get(&mut q, 1, cid(9), false);
    ret(&mut q, 2, cid(9), &[0]);
    assert_eq!(q.leader_effects(), vec![Effect::ExpiryTimer { at_ms: 202 }]);
}

#[test]
fn purge_removes_delayed_messages_and_counts_them() {
    let mut q = QueueMachine::new(failed());
    enqueue_n(&mut q, 0, 3);
    get(&mut q, 1, cid(9), false);
    ret(&mut q, 2, cid(9), &[0]);
    let (r, e) = run(&mut q, QueueCommand::Purge { now_ms: 3 });
    assert_eq!(r, QueueReply::Purged(3));
    assert_eq!(dropped(&e), vec![1, 2, 0]);
    assert_eq!(q.delayed_count(), 0);
}

#[test]
fn turning_delayed_retry_off_keeps_waiting_messages_until_their_time() {
    let mut q = QueueMachine::new(failed());
    enqueue_n(&mut q, 0, 1);
    get(&mut q, 1, cid(9), false);
    ret(&mut q, 2, cid(9), &[0]);
    update(&mut q, 3, QueueConfig::default());
    assert_eq!(q.delayed_count(), 1);
    tick(&mut q, 202);
    assert_eq!(q.ready_ids(), vec![0]);
}

#[test]
fn an_idle_queue_with_many_delayed_messages_arms_one_timer_and_a_tick_touches_only_the_due() {
    let mut q = QueueMachine::new(QueueConfig {
        delivery_limit: Some(5),
        ..delayed(DelayedRetryType::All, 1000, 1000)
    });
    let n = 10_000;
    let (_, _) = enqueue(&mut q, 0, (0..n).map(|_| msg("x")).collect());
    checkout(&mut q, 1, cid(1), 0);
    let e = down(&mut q, 2, cid(1));
    assert_eq!(q.delayed_count(), n as u64);
    assert_eq!(timers(&e), vec![1002], "one timer for all of them");
    // A tick before the release does nothing and costs no scan (the state
    // is unchanged and no effect but the re-armed timer comes out).
    let before = q.clone();
    let e = tick(&mut q, 1001);
    assert_eq!(e, vec![Effect::ExpiryTimer { at_ms: 1002 }]);
    assert_eq!(q.delayed_entries(), before.delayed_entries());
    tick(&mut q, 1002);
    assert_eq!((q.ready_count(), q.delayed_count()), (n as u64, 0));
}

#[test]
fn snapshot_keeps_delayed_messages() {
    let mut q = QueueMachine::new(failed());
    enqueue_n(&mut q, 0, 3);
    get(&mut q, 1, cid(9), false);
    get(&mut q, 1, cid(9), false);
    ret(&mut q, 2, cid(9), &[1, 0]);
    let bytes = bincode::serde::encode_to_vec(&q, bincode::config::standard()).unwrap();
    let (back, _): (QueueMachine, usize) =
        bincode::serde::decode_from_slice(&bytes, bincode::config::standard()).unwrap();
    assert_eq!(back, q);
    assert_eq!(back.delayed_entries(), vec![(202, 0), (202, 1)]);
    let mut ids = back.all_message_ids();
    ids.sort();
    assert_eq!(
        ids,
        vec![0, 1, 2],
        "the snapshot's bodies include the delayed ones"
    );
}
