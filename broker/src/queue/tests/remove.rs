//! `Remove`: redrive's removal of ready messages by id after their copies
//! were committed elsewhere (RabbitMQ "move messages", SQS
//! `StartMessageMoveTask`).

use super::super::machine::QueueMachine;
use super::super::types::*;
use super::helpers::*;

fn remove(q: &mut QueueMachine, now_ms: u64, ids: &[MsgId]) -> (u64, Vec<Effect>) {
    match run(
        q,
        QueueCommand::Remove {
            now_ms,
            ids: ids.to_vec(),
        },
    ) {
        (QueueReply::Removed(n), e) => (n, e),
        (other, _) => panic!("unexpected reply {other:?}"),
    }
}

#[test]
fn removes_ready_messages_and_drops_their_bodies_in_delivery_order() {
    let mut q = QueueMachine::default();
    enqueue_n(&mut q, 0, 5);
    let bytes = q.ready_bytes();
    let (n, e) = remove(&mut q, 1, &[3, 1]);
    assert_eq!(n, 2);
    assert_eq!(dropped(&e), vec![1, 3], "DropBody in delivery order");
    assert!(
        dead_lettered(&e).is_empty(),
        "a removal is no dead-lettering"
    );
    assert_eq!(q.ready_ids(), vec![0, 2, 4], "the others keep their order");
    assert_eq!(q.ready_count(), 3);
    assert_eq!(q.ready_bytes(), bytes - 4);
}

#[test]
fn leaves_checked_out_held_unknown_and_repeated_ids_alone() {
    let mut q = QueueMachine::new(alo());
    enqueue_n(&mut q, 0, 4);
    get(&mut q, 1, cid(9), false); // 0 checked out
    get(&mut q, 1, cid(9), false); // 1 checked out
    discard(&mut q, 2, cid(9), &[1]); // 1 held
    let (n, e) = remove(&mut q, 3, &[0, 1, 2, 2, 99]);
    assert_eq!(n, 1, "only 2 was ready");
    assert_eq!(dropped(&e), vec![2]);
    assert_eq!(q.checked_out(cid(9)).collect::<Vec<_>>(), vec![0]);
    assert_eq!(q.held_count(), 1);
    assert_eq!(q.ready_ids(), vec![3]);
    let (n, e) = remove(&mut q, 4, &[2]);
    assert_eq!(
        (n, dropped(&e)),
        (0, vec![]),
        "a second removal does nothing"
    );
}

#[test]
fn removes_returned_messages_and_from_every_priority() {
    let mut q = QueueMachine::new(QueueConfig {
        max_priority: Some(5),
        delivery_limit: Some(5),
        ..QueueConfig::default()
    });
    let prio = |p: u8| PrioritizedMsg {
        msg: msg("x"),
        priority: p,
    };
    run(
        &mut q,
        QueueCommand::enqueue(0, vec![prio(1), prio(5), prio(1), prio(5)]),
    );
    get(&mut q, 1, cid(9), false); // 1 (priority 5) checked out
    ret(&mut q, 2, cid(9), &[1]); // 1 returned: first again
    assert_eq!(q.ready_ids(), vec![1, 3, 0, 2]);
    let (n, e) = remove(&mut q, 3, &[1, 3, 2]);
    assert_eq!(n, 3);
    assert_eq!(dropped(&e), vec![1, 3, 2]);
    assert_eq!(q.ready_ids(), vec![0]);
    // The next get serves what is left (the emptied lane is not served).
    let (got, _) = get(&mut q, 4, cid(9), true);
    assert_eq!(got.map(|(d, left)| (d.id, left)), Some((0, 0)));
}

#[test]
fn removing_below_the_limit_unblocks_publishers() {
    let mut q = QueueMachine::new(QueueConfig {
        max_length: Some(2),
        overflow: Overflow::RejectPublish,
        ..QueueConfig::default()
    });
    enqueue_n(&mut q, 0, 3);
    assert!(q.publishers_blocked());
    let (_, e) = remove(&mut q, 1, &[0, 1]);
    assert_eq!(blocked(&e), vec![false]);
    assert!(!q.publishers_blocked());
}

#[test]
fn a_resent_removal_replies_removed_zero() {
    let cmd = QueueCommand::Remove {
        now_ms: 0,
        ids: vec![1],
    };
    assert_eq!(QueueReply::for_resend(&cmd), QueueReply::Removed(0));
    assert_eq!(cmd.now_ms(), Some(0));
}

#[test]
fn redrive_queries_list_ready_ids_and_see_checked_out_ones() {
    let mut q = QueueMachine::new(QueueConfig {
        delivery_limit: Some(5),
        ..QueueConfig::default()
    });
    enqueue_n(&mut q, 0, 4);
    get(&mut q, 1, cid(9), false); // 0 checked out
    get(&mut q, 1, cid(9), false); // 1 checked out
    ret(&mut q, 2, cid(9), &[1]); // 1 returned: first
    assert_eq!(q.ready_message_ids(usize::MAX), vec![1, 2, 3]);
    assert_eq!(q.ready_message_ids(2), vec![1, 2]);
    assert!(q.is_checked_out(0));
    assert!(!q.is_checked_out(1));
    assert!(!q.is_checked_out(99));
}
