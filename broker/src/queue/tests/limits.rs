//! Length limits: drop-head and reject-publish (spec §2.5, §10.5).

use super::super::machine::QueueMachine;
use super::super::types::*;
use super::helpers::*;

fn drop_head(max_length: Option<u64>, max_length_bytes: Option<u64>) -> QueueConfig {
    QueueConfig {
        max_length,
        max_length_bytes,
        ..amo()
    }
}

fn reject(max_length: Option<u64>, max_length_bytes: Option<u64>) -> QueueConfig {
    QueueConfig {
        max_length,
        max_length_bytes,
        overflow: Overflow::RejectPublish,
        ..QueueConfig::default()
    }
}

#[test]
fn drop_head_keeps_the_newest() {
    // dead_letter_max_length_drop_head: P1, P2, P3 with max-length 1.
    let mut q = QueueMachine::new(drop_head(Some(1), None));
    let (o, e) = enqueue(&mut q, 0, vec![msg("p1"), msg("p2"), msg("p3")]);
    assert_eq!(o, vec![EnqueueOutcome::Accepted; 3]);
    let m = DeadLetterReason::Maxlen;
    assert_eq!(dead_lettered(&e), vec![(0, m), (1, m)]);
    assert_eq!(q.ready_ids(), vec![2]);
}

#[test]
fn drop_head_by_bytes_drops_in_order_including_the_big_one() {
    // at_most_once_dead_letter_order_maxlen: 1000 bytes, a 1500-byte third.
    let mut q = QueueMachine::new(drop_head(None, Some(1000)));
    enqueue(&mut q, 0, vec![sized(500), sized(500)]);
    assert_eq!(q.ready_count(), 2);
    let (_, e) = enqueue(&mut q, 1, vec![sized(1500)]);
    let m = DeadLetterReason::Maxlen;
    assert_eq!(dead_lettered(&e), vec![(0, m), (1, m), (2, m)]);
    assert_eq!(q.ready_bytes(), 0);
}

#[test]
fn drop_head_limit_is_strictly_greater() {
    let mut q = QueueMachine::new(drop_head(Some(2), Some(4)));
    let (_, e) = enqueue(&mut q, 0, vec![sized(2), sized(2)]);
    assert!(dropped(&e).is_empty());
    assert_eq!((q.ready_count(), q.ready_bytes()), (2, 4));
}

#[test]
fn drop_head_takes_returned_messages_first() {
    let mut q = QueueMachine::new(QueueConfig {
        delivery_limit: Some(9),
        ..drop_head(Some(2), None)
    });
    enqueue_n(&mut q, 0, 2);
    get(&mut q, 1, cid(1), false);
    ret(&mut q, 2, cid(1), &[0]);
    // Ready: 0 (returns), 1.
    let (_, e) = enqueue_n_outcomes(&mut q, 3, 1);
    assert_eq!(dead_lettered(&e), vec![(0, DeadLetterReason::Maxlen)]);
    assert_eq!(q.ready_ids(), vec![1, 2]);
}

fn enqueue_n_outcomes(
    q: &mut QueueMachine,
    now: u64,
    n: usize,
) -> (Vec<EnqueueOutcome>, Vec<Effect>) {
    enqueue(q, now, (0..n).map(|i| msg(&format!("x{i}"))).collect())
}

#[test]
fn checked_out_messages_do_not_count() {
    let mut q = QueueMachine::new(drop_head(Some(1), None));
    checkout(&mut q, 0, cid(1), 0);
    let e = enqueue_n(&mut q, 1, 5);
    assert!(dropped(&e).is_empty());
    assert_eq!(q.unacked_count(), 5);
}

#[test]
fn drop_head_without_dead_letter_exchange_drops() {
    let mut q = QueueMachine::new(QueueConfig {
        max_length: Some(0),
        ..QueueConfig::default()
    });
    let (_, e) = enqueue(&mut q, 0, vec![msg("a")]);
    assert_eq!(dropped(&e), vec![0]);
    assert_eq!(q.ready_count(), 0);
}

#[test]
fn max_length_zero_still_feeds_a_waiting_consumer() {
    let mut q = QueueMachine::new(drop_head(Some(0), None));
    checkout(&mut q, 0, cid(1), 1);
    let (_, e) = enqueue(&mut q, 1, vec![msg("a"), msg("b")]);
    assert_eq!(delivered_ids(&e), vec![0]);
    assert_eq!(dead_lettered(&e), vec![(1, DeadLetterReason::Maxlen)]);
}

#[test]
fn reject_publish_accepts_one_over_the_limit_then_rejects() {
    // queue_length_limit_reject_publish: 2 confirmed, 3rd nacked, allowed again after 2 gets.
    let mut q = QueueMachine::new(reject(Some(1), None));
    let (o, e) = enqueue(&mut q, 0, vec![msg("a")]);
    assert_eq!((o, blocked(&e)), (vec![EnqueueOutcome::Accepted], vec![]));
    let (o, e) = enqueue(&mut q, 1, vec![msg("b")]);
    assert_eq!(
        (o, blocked(&e)),
        (vec![EnqueueOutcome::Accepted], vec![true])
    );
    assert!(q.publishers_blocked());
    let (o, e) = enqueue(&mut q, 2, vec![msg("c")]);
    assert_eq!(o, vec![EnqueueOutcome::Rejected]);
    assert!(
        e.is_empty(),
        "a rejected message gets no id and no StoreBody"
    );
    assert_eq!(q.next_msg_id(), 2);
    let (_, e) = get(&mut q, 3, cid(1), true);
    assert!(blocked(&e).is_empty());
    assert_eq!(
        enqueue(&mut q, 4, vec![msg("d")]).0,
        vec![EnqueueOutcome::Rejected]
    );
    let (_, e) = get(&mut q, 5, cid(1), true);
    assert_eq!(blocked(&e), vec![false]);
    assert!(!q.publishers_blocked());
    assert_eq!(
        enqueue(&mut q, 6, vec![msg("e")]).0,
        vec![EnqueueOutcome::Accepted]
    );
}

#[test]
fn reject_publish_inside_one_enqueue_batch() {
    let mut q = QueueMachine::new(reject(Some(2), None));
    let (o, e) = enqueue(&mut q, 0, vec![msg("a"), msg("b"), msg("c"), msg("d")]);
    use EnqueueOutcome::*;
    assert_eq!(o, vec![Accepted, Accepted, Accepted, Rejected]);
    assert_eq!(stored(&e), vec![0, 1, 2]);
    assert_eq!(blocked(&e), vec![true]);
}

#[test]
fn reject_publish_unblocks_at_eighty_percent() {
    let mut q = QueueMachine::new(reject(Some(10), None));
    let (o, _) = enqueue_n_outcomes(&mut q, 0, 12);
    assert_eq!(
        o.iter().filter(|x| **x == EnqueueOutcome::Accepted).count(),
        11
    );
    let mut unblocked_at = None;
    for left in (0..11).rev() {
        let (_, e) = get(&mut q, 1, cid(1), true);
        if blocked(&e) == vec![false] {
            unblocked_at = Some(left);
            break;
        }
    }
    assert_eq!(unblocked_at, Some(8));
}

#[test]
fn reject_publish_by_bytes() {
    let mut q = QueueMachine::new(reject(None, Some(10)));
    let (o, _) = enqueue(&mut q, 0, vec![sized(6), sized(6), sized(1)]);
    use EnqueueOutcome::*;
    assert_eq!(o, vec![Accepted, Accepted, Rejected]);
    // 12 bytes: needs <= 8 to unblock. Taking one (6 left) unblocks.
    let (_, e) = get(&mut q, 1, cid(1), true);
    assert_eq!(blocked(&e), vec![false]);
}

#[test]
fn reject_publish_with_a_waiting_consumer_never_blocks() {
    let mut q = QueueMachine::new(reject(Some(0), None));
    checkout(&mut q, 0, cid(1), 0);
    let (o, e) = enqueue_n_outcomes(&mut q, 1, 3);
    assert_eq!(o, vec![EnqueueOutcome::Accepted; 3]);
    assert!(blocked(&e).is_empty());
}

#[test]
fn reject_publish_never_drops() {
    let mut q = QueueMachine::new(QueueConfig {
        dead_letter: Some(target()),
        ..reject(Some(1), None)
    });
    let (_, e) = enqueue_n_outcomes(&mut q, 0, 5);
    assert!(dropped(&e).is_empty());
    assert_eq!(q.ready_count(), 2);
}

#[test]
fn a_return_can_push_the_queue_over_and_block() {
    let mut q = QueueMachine::new(reject(Some(1), None));
    enqueue_n(&mut q, 0, 1);
    get(&mut q, 1, cid(1), false);
    enqueue_n(&mut q, 2, 1);
    let e = ret(&mut q, 3, cid(1), &[0]);
    assert_eq!(blocked(&e), vec![true]);
}

#[test]
fn purge_unblocks_publishers() {
    let mut q = QueueMachine::new(reject(Some(2), None));
    enqueue_n_outcomes(&mut q, 0, 3);
    assert!(q.publishers_blocked());
    let (r, e) = run(&mut q, QueueCommand::Purge { now_ms: 1 });
    assert_eq!(r, QueueReply::Purged(3));
    assert_eq!(blocked(&e), vec![false]);
}

#[test]
fn a_consumer_draining_the_queue_unblocks_publishers() {
    let mut q = QueueMachine::new(reject(Some(2), None));
    enqueue_n_outcomes(&mut q, 0, 3);
    let e = checkout(&mut q, 1, cid(1), 0);
    assert_eq!(delivered_ids(&e), vec![0, 1, 2]);
    assert_eq!(blocked(&e), vec![false]);
}

#[test]
fn blocked_is_announced_once() {
    let mut q = QueueMachine::new(reject(Some(1), None));
    let (_, e) = enqueue_n_outcomes(&mut q, 0, 5);
    assert_eq!(blocked(&e), vec![true]);
    let (_, e) = enqueue_n_outcomes(&mut q, 1, 5);
    assert!(e.is_empty());
}

#[test]
fn expiry_makes_room_under_reject_publish_at_most_once() {
    let mut q = QueueMachine::new(QueueConfig {
        message_ttl_ms: Some(10),
        ..reject(Some(1), None)
    });
    enqueue_n_outcomes(&mut q, 0, 3);
    assert!(q.publishers_blocked());
    let e = tick(&mut q, 10);
    assert_eq!(dropped(&e), vec![0, 1]);
    assert_eq!(blocked(&e), vec![false]);
}

/// reject-publish-dlx (issue 28 item 6): the publish that goes over is
/// accepted; the next ones are refused *and* dead-lettered `maxlen`.
#[test]
fn reject_publish_dlx_refuses_and_dead_letters_at_most_once() {
    let mut q = QueueMachine::new(QueueConfig {
        max_length: Some(1),
        overflow: Overflow::RejectPublishDlx,
        ..amo()
    });
    let (o, e) = enqueue(&mut q, 0, vec![msg("p1"), msg("p2")]);
    assert_eq!(o, vec![EnqueueOutcome::Accepted; 2]);
    assert!(dead_lettered(&e).is_empty());
    let (o, e) = enqueue(&mut q, 1, vec![msg("p3"), msg("p4")]);
    assert_eq!(o, vec![EnqueueOutcome::Rejected; 2]);
    let m = DeadLetterReason::Maxlen;
    assert_eq!(dead_lettered(&e), vec![(2, m), (3, m)]);
    // Each refused body is stored (the dead-letter publish reads it) and dropped after.
    let stored: Vec<MsgId> = e
        .iter()
        .filter_map(|e| match e {
            Effect::StoreBody { id, .. } => Some(*id),
            _ => None,
        })
        .collect();
    assert_eq!(stored, vec![2, 3]);
    assert_eq!(dropped(&e), vec![2, 3]);
    assert_eq!(q.ready_ids(), vec![0, 1]);
}

#[test]
fn reject_publish_dlx_holds_refused_publishes_at_least_once() {
    let mut q = QueueMachine::new(QueueConfig {
        max_length: Some(2),
        overflow: Overflow::RejectPublishDlx,
        ..alo()
    });
    enqueue(&mut q, 0, vec![msg("a"), msg("b"), msg("c")]);
    let (o, e) = enqueue(&mut q, 1, vec![msg("d")]);
    assert_eq!(o, vec![EnqueueOutcome::Rejected]);
    assert!(dropped(&e).is_empty(), "held, not dropped: {e:?}");
    let held: Vec<_> = q.held_dead_letters().collect();
    assert_eq!(held, vec![(3, DeadLetterReason::Maxlen)]);
    assert!(e.contains(&Effect::DeadLetterHeld {
        id: 3,
        reason: DeadLetterReason::Maxlen
    }));
    // Still blocked while over the limit; unblocked at <= 80 % once drained.
    assert!(q.blocked);
}

#[test]
fn plain_reject_publish_stores_nothing_it_refuses() {
    let mut q = QueueMachine::new(reject(Some(1), None));
    enqueue(&mut q, 0, vec![msg("a"), msg("b")]);
    let (o, e) = enqueue(&mut q, 1, vec![msg("c")]);
    assert_eq!(o, vec![EnqueueOutcome::Rejected]);
    assert!(e.is_empty(), "{e:?}");
}
