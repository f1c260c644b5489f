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

mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Over random enqueues, gets, returns (with and without a delivery
        /// limit, so both back and front requeues) and discards: position i
        /// is the i-th ready message in delivery order with its delivery
        /// count, nothing after the last, and `queued_message_ids` is every
        /// ready or checked-out message, never a held one.
        #[test]
        fn ready_at_is_the_delivery_order(
            ops in prop::collection::vec((0u8..4, 0usize..5), 0..60),
            limit in prop::option::of(1i64..4),
        ) {
            let mut q = QueueMachine::new(QueueConfig { delivery_limit: limit, ..alo() });
            let mut out: Vec<MsgId> = Vec::new();
            let mut returns: std::collections::HashMap<MsgId, u32> = Default::default();
            for (i, (op, n)) in ops.into_iter().enumerate() {
                let now = i as u64 + 1;
                match op {
                    0 => {
                        enqueue_n(&mut q, now, n);
                    }
                    1 => {
                        if let (Some((d, _)), _) = get(&mut q, now, cid(9), false) {
                            out.push(d.id);
                        }
                    }
                    _ if out.is_empty() => {}
                    2 => {
                        let id = out.remove(n % out.len());
                        ret(&mut q, now, cid(9), &[id]);
                        *returns.entry(id).or_default() += 1;
                    }
                    _ => {
                        let id = out.remove(n % out.len());
                        discard(&mut q, now, cid(9), &[id]);
                    }
                }
                let ready = q.ready_ids();
                for (pos, id) in ready.iter().enumerate() {
                    let at = q.ready_at(pos as u64 + 1);
                    let count = returns.get(id).copied().unwrap_or(0);
                    prop_assert_eq!(at, Some((*id, count)));
                }
                prop_assert_eq!(q.ready_at(ready.len() as u64 + 1), None);
                let held: Vec<MsgId> = held_list(&q).into_iter().map(|(id, _)| id).collect();
                let mut queued = q.queued_message_ids();
                queued.sort_unstable();
                let mut want: Vec<MsgId> =
                    q.live_ids().into_iter().filter(|id| !held.contains(id)).collect();
                want.sort_unstable();
                prop_assert_eq!(queued, want);
            }
        }
    }
}
