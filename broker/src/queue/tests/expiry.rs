//! Message TTL (head-only), the expiry timer, and x-expires (spec §2.4).

use super::super::machine::QueueMachine;
use super::super::types::*;
use super::helpers::*;

fn ttl(ms: u64) -> QueueConfig {
    QueueConfig {
        message_ttl_ms: Some(ms),
        ..amo()
    }
}

#[test]
fn tick_expires_the_head_at_its_expiry() {
    let mut q = QueueMachine::new(ttl(100));
    enqueue_n(&mut q, 0, 1);
    assert!(dead_lettered(&tick(&mut q, 99)).is_empty());
    let e = tick(&mut q, 100);
    assert_eq!(dead_lettered(&e), vec![(0, DeadLetterReason::Expired)]);
    assert_eq!(q.ready_count(), 0);
}

#[test]
fn message_behind_an_unexpired_head_waits() {
    // per_message_ttl_mixed_expiry / §10.4: 200 ms behind 1200 ms dies at 1.2 s.
    let mut q = QueueMachine::new(amo());
    enqueue(
        &mut q,
        0,
        vec![msg_ttl("long", 1200), msg_ttl("short", 200)],
    );
    assert!(dead_lettered(&tick(&mut q, 500)).is_empty());
    assert_eq!(q.ready_count(), 2);
    let e = tick(&mut q, 1200);
    let x = DeadLetterReason::Expired;
    assert_eq!(dead_lettered(&e), vec![(0, x), (1, x)]);
}

#[test]
fn expiry_runs_on_any_command_not_only_ticks() {
    let mut q = QueueMachine::new(ttl(10));
    enqueue_n(&mut q, 0, 1);
    let (_, e) = enqueue(&mut q, 10, vec![msg("late")]);
    assert_eq!(dead_lettered(&e), vec![(0, DeadLetterReason::Expired)]);
    assert_eq!(q.ready_ids(), vec![1]);
}

#[test]
fn expired_head_is_not_delivered() {
    let mut q = QueueMachine::new(amo());
    enqueue(&mut q, 0, vec![msg_ttl("a", 5), msg("b")]);
    let e = checkout(&mut q, 5, cid(1), 0);
    assert_eq!(dead_lettered(&e), vec![(0, DeadLetterReason::Expired)]);
    assert_eq!(delivered_ids(&e), vec![1]);
}

#[test]
fn ttl_zero_reaches_a_waiting_consumer() {
    let mut q = QueueMachine::new(amo());
    checkout(&mut q, 0, cid(1), 1);
    let (_, e) = enqueue(&mut q, 1, vec![msg_ttl("a", 0), msg_ttl("b", 0)]);
    assert_eq!(delivered_ids(&e), vec![0]);
    // b waits for a consumer; it survives its own millisecond only.
    let e = tick(&mut q, 2);
    assert_eq!(dead_lettered(&e), vec![(1, DeadLetterReason::Expired)]);
}

#[test]
fn unacked_messages_never_expire() {
    let mut q = QueueMachine::new(ttl(10));
    enqueue_n(&mut q, 0, 1);
    checkout(&mut q, 1, cid(1), 0);
    assert!(dead_lettered(&tick(&mut q, 1_000_000)).is_empty());
    assert_eq!(q.unacked_count(), 1);
    assert_eq!(
        settle(&mut q, 1_000_001, cid(1), &[0]),
        vec![Effect::DropBody { id: 0 }]
    );
}

#[test]
fn expiry_timer_is_emitted_when_the_next_instant_is_earlier_only() {
    let mut q = QueueMachine::new(ttl(100));
    let (_, e) = enqueue(&mut q, 0, vec![msg("a")]);
    assert_eq!(timers(&e), vec![100]);
    // Same head: no new timer.
    let (_, e) = enqueue(&mut q, 50, vec![msg("b")]);
    assert!(timers(&e).is_empty());
    // Head leaves: the new head expires later (150) than the armed timer
    // (100), which fires first; no effect per delivery.
    let (_, e) = get(&mut q, 60, cid(1), true);
    assert!(timers(&e).is_empty());
    assert_eq!(q.next_timer_ms(), Some(150));
    assert!(q
        .leader_effects()
        .contains(&Effect::ExpiryTimer { at_ms: 100 }));
    // The armed timer's tick re-arms at the head's expiry.
    assert_eq!(timers(&tick(&mut q, 100)), vec![150]);
    // Queue empties: nothing to arm.
    let (_, e) = get(&mut q, 101, cid(1), true);
    assert!(timers(&e).is_empty());
    assert_eq!(q.next_expiry_ms(), None);
    // A new head later than the armed timer (150) waits for its tick ...
    let (_, e) = enqueue(&mut q, 110, vec![msg("c")]);
    assert!(timers(&e).is_empty());
    assert_eq!(timers(&tick(&mut q, 150)), vec![210]);
    // ... an earlier one is emitted at once.
    let (_, e) = enqueue(&mut q, 120, vec![msg_ttl("d", 10)]);
    assert!(timers(&e).is_empty(), "behind c: not the head");
    get(&mut q, 121, cid(1), true);
    let (_, e) = enqueue(&mut q, 122, vec![]);
    assert!(timers(&e).is_empty(), "head d expires at 130");
    assert_eq!(q.next_timer_ms(), Some(130));
}

#[test]
fn a_due_timer_is_re_armed_by_any_command_if_its_tick_was_lost() {
    let mut q = QueueMachine::new(ttl(100));
    enqueue(&mut q, 0, vec![msg("a")]);
    enqueue(&mut q, 10, vec![msg("b")]);
    get(&mut q, 20, cid(1), true);
    // Armed at 100, next 110; the tick at 100 never came. A command at 105
    // sees the armed timer due and emits the next instant.
    let (_, e) = enqueue(&mut q, 105, vec![msg("c")]);
    assert_eq!(timers(&e), vec![110]);
}

#[test]
fn tick_re_arms_the_timer_when_the_head_is_still_alive() {
    let mut q = QueueMachine::new(ttl(100));
    enqueue_n(&mut q, 0, 1);
    assert_eq!(timers(&tick(&mut q, 99)), vec![100]);
}

#[test]
fn tick_after_expiry_arms_the_next_head() {
    let mut q = QueueMachine::new(amo());
    enqueue(&mut q, 0, vec![msg_ttl("a", 10), msg_ttl("b", 30)]);
    let e = tick(&mut q, 10);
    assert_eq!(timers(&e), vec![30]);
}

#[test]
fn head_without_ttl_hides_later_expiries() {
    let mut q = QueueMachine::new(amo());
    let (_, e) = enqueue(&mut q, 0, vec![msg("a"), msg_ttl("b", 5)]);
    assert!(timers(&e).is_empty());
    assert_eq!(q.next_expiry_ms(), None);
    assert!(dead_lettered(&tick(&mut q, 100)).is_empty());
}

fn expires(ms: u64) -> QueueConfig {
    QueueConfig {
        expires_ms: Some(ms),
        ..QueueConfig::default()
    }
}

#[test]
fn queue_expires_after_the_lease_with_no_consumers() {
    let mut q = QueueMachine::new(expires(1000));
    tick(&mut q, 0);
    assert!(!queue_expired(&tick(&mut q, 1000)));
    let e = tick(&mut q, 1001);
    assert!(queue_expired(&e));
    assert!(q.queue_expired());
    // Once only.
    assert!(!queue_expired(&tick(&mut q, 5000)));
}

#[test]
fn queue_expiry_does_not_dead_letter_messages() {
    let mut q = QueueMachine::new(QueueConfig {
        expires_ms: Some(10),
        ..amo()
    });
    enqueue_n(&mut q, 0, 2);
    let e = tick(&mut q, 11);
    assert_eq!(e, vec![Effect::QueueExpired]);
    assert_eq!(q.ready_count(), 2);
}

#[test]
fn publishing_does_not_renew_the_lease() {
    let mut q = QueueMachine::new(expires(100));
    enqueue_n(&mut q, 0, 1);
    enqueue_n(&mut q, 90, 1);
    assert!(queue_expired(&tick(&mut q, 101)));
}

#[test]
fn an_active_consumer_prevents_expiry() {
    let mut q = QueueMachine::new(expires(100));
    checkout(&mut q, 0, cid(1), 0);
    assert!(!queue_expired(&tick(&mut q, 10_000)));
}

#[test]
fn consumer_leaving_renews_the_lease() {
    let mut q = QueueMachine::new(expires(100));
    checkout(&mut q, 0, cid(1), 0);
    run(
        &mut q,
        QueueCommand::Cancel {
            now_ms: 500,
            consumer: cid(1),
        },
    );
    assert!(!queue_expired(&tick(&mut q, 600)));
    assert!(queue_expired(&tick(&mut q, 601)));
    let mut q = QueueMachine::new(expires(100));
    checkout(&mut q, 0, cid(1), 0);
    run(
        &mut q,
        QueueCommand::ConsumerDown {
            now_ms: 500,
            consumer: cid(1),
        },
    );
    assert!(!queue_expired(&tick(&mut q, 600)));
    assert!(queue_expired(&tick(&mut q, 601)));
}

#[test]
fn basic_get_renews_the_lease() {
    let mut q = QueueMachine::new(expires(100));
    tick(&mut q, 0);
    get(&mut q, 80, cid(1), true);
    assert!(!queue_expired(&tick(&mut q, 150)));
    assert!(queue_expired(&tick(&mut q, 181)));
}

#[test]
fn a_get_slot_holding_messages_prevents_expiry() {
    // rabbit_fifo 3.10 `is_expired` counts every consumer record.
    let mut q = QueueMachine::new(expires(100));
    enqueue_n(&mut q, 0, 1);
    get(&mut q, 0, cid(1), false);
    assert!(!queue_expired(&tick(&mut q, 1000)));
    settle(&mut q, 1000, cid(1), &[0]);
    assert!(queue_expired(&tick(&mut q, 1101)));
}

#[test]
fn lease_starts_at_the_first_command() {
    let mut q = QueueMachine::new(expires(100));
    assert!(!queue_expired(&tick(&mut q, 5000)));
    assert!(!queue_expired(&tick(&mut q, 5100)));
    assert!(queue_expired(&tick(&mut q, 5101)));
}

#[test]
fn expired_queue_that_sees_activity_can_expire_again() {
    let mut q = QueueMachine::new(expires(100));
    tick(&mut q, 0);
    assert!(queue_expired(&tick(&mut q, 101)));
    get(&mut q, 200, cid(1), true);
    assert!(!q.queue_expired());
    assert!(queue_expired(&tick(&mut q, 301)));
}

#[test]
fn no_expires_configured_never_expires() {
    let mut q = QueueMachine::default();
    assert!(!queue_expired(&tick(&mut q, 0)));
    assert!(!queue_expired(&tick(&mut q, u64::MAX)));
}
