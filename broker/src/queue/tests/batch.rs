//! `Batch`: group commit of several commands in one entry.

use super::super::machine::QueueMachine;
use super::super::types::*;
use super::helpers::*;

#[test]
fn batch_replies_per_command_and_concatenates_effects() {
    let mut q = QueueMachine::default();
    let (r, e) = run(
        &mut q,
        QueueCommand::Batch(vec![
            QueueCommand::Enqueue {
                now_ms: 0,
                msgs: vec![msg("a"), msg("b")],
            },
            QueueCommand::Dequeue {
                now_ms: 1,
                consumer: cid(1),
                no_ack: true,
            },
            QueueCommand::Purge { now_ms: 2 },
            QueueCommand::Tick { now_ms: 3 },
        ]),
    );
    assert_eq!(
        r,
        QueueReply::Batch(vec![
            QueueReply::Enqueued(vec![EnqueueOutcome::Accepted; 2]),
            QueueReply::Dequeued(Some((
                Delivery {
                    id: 0,
                    delivery_count: 0,
                    payload: None,
                    resend: false
                },
                1
            ))),
            QueueReply::Purged(1),
            QueueReply::Ok,
        ])
    );
    assert_eq!(stored(&e), vec![0, 1]);
    assert_eq!(dropped(&e), vec![0, 1]);
}

#[test]
fn batch_equals_the_commands_applied_one_by_one() {
    let cmds = vec![
        QueueCommand::Checkout {
            now_ms: 0,
            consumer: cid(1),
            prefetch: 1,
            no_ack: false,
        },
        QueueCommand::Enqueue {
            now_ms: 1,
            msgs: vec![msg("a"), msg_ttl("b", 5)],
        },
        QueueCommand::Settle {
            now_ms: 2,
            consumer: cid(1),
            ids: vec![0],
        },
        QueueCommand::Tick { now_ms: 20 },
    ];
    let mut one = QueueMachine::new(amo());
    let mut effects = Vec::new();
    let mut replies = Vec::new();
    for c in cmds.clone() {
        let (r, e) = one.apply(c);
        replies.push(r);
        effects.extend(
            e.into_iter()
                .filter(|e| !matches!(e, Effect::ExpiryTimer { .. })),
        );
    }
    let mut batched = QueueMachine::new(amo());
    let (r, e) = batched.apply(QueueCommand::Batch(cmds));
    let e: Vec<_> = e
        .into_iter()
        .filter(|e| !matches!(e, Effect::ExpiryTimer { .. }))
        .collect();
    assert_eq!(r, QueueReply::Batch(replies));
    assert_eq!(e, effects);
    assert_eq!(one, batched);
}

#[test]
fn empty_batch_does_nothing() {
    let mut q = QueueMachine::default();
    assert_eq!(
        run(&mut q, QueueCommand::Batch(vec![])),
        (QueueReply::Batch(vec![]), vec![])
    );
    assert_eq!(q, QueueMachine::default());
}

#[test]
fn nested_batches_nest_replies() {
    let mut q = QueueMachine::default();
    let (r, _) = run(
        &mut q,
        QueueCommand::Batch(vec![QueueCommand::Batch(vec![QueueCommand::Purge {
            now_ms: 0,
        }])]),
    );
    assert_eq!(
        r,
        QueueReply::Batch(vec![QueueReply::Batch(vec![QueueReply::Purged(0)])])
    );
}

#[test]
fn batch_emits_the_expiry_timer_once_at_the_end() {
    let mut q = QueueMachine::new(QueueConfig {
        message_ttl_ms: Some(10),
        ..QueueConfig::default()
    });
    let (_, e) = q.apply(QueueCommand::Batch(vec![
        QueueCommand::Enqueue {
            now_ms: 0,
            msgs: vec![msg("a")],
        },
        QueueCommand::Enqueue {
            now_ms: 5,
            msgs: vec![msg("b")],
        },
        QueueCommand::Dequeue {
            now_ms: 6,
            consumer: cid(1),
            no_ack: true,
        },
    ]));
    assert_eq!(timers(&e), vec![15]);
    assert_eq!(e.last(), Some(&Effect::ExpiryTimer { at_ms: 15 }));
}

/// A resend (same proposer, sequence at or below the last applied) is not
/// applied again; only the next sequence is (a gap is refused); another
/// proposer's sequences are its own; a proposer's node restarting forgets
/// its sequences.
#[test]
fn deduped_resends_are_applied_once() {
    use crate::queue::types::{EnqueueMsg, ProposerId};
    let mut q = QueueMachine::new(QueueConfig::default());
    let p1 = ProposerId { node: 1, epoch: 1 };
    let p2 = ProposerId { node: 2, epoch: 1 };
    let enq = |p: ProposerId, seq: u64| QueueCommand::Deduped {
        proposer: p,
        seq,
        cmd: Box::new(QueueCommand::Enqueue {
            now_ms: 1,
            msgs: vec![EnqueueMsg {
                payload: bytes::Bytes::from_static(b"x"),
                body_size: 1,
                ttl_ms: None,
            }],
        }),
    };
    assert!(matches!(q.apply(enq(p1, 1)).0, QueueReply::Enqueued(_)));
    assert_eq!(q.apply(enq(p1, 1)).0, QueueReply::Resent);
    assert_eq!(q.ready_count(), 1);
    // Seq 2 is missing from the log (a leader refused it while it accepted
    // seq 3): 3 is refused until 2 is in, then applies (rabbit_fifo
    // `out_of_sequence`). Answering 3 first and then 2 as a resend lost a
    // confirmed publish (fault suite).
    assert_eq!(q.apply(enq(p1, 3)).0, QueueReply::OutOfSequence);
    assert_eq!(q.ready_count(), 1, "out of sequence: not applied");
    assert!(matches!(q.apply(enq(p1, 2)).0, QueueReply::Enqueued(_)));
    assert!(matches!(q.apply(enq(p1, 3)).0, QueueReply::Enqueued(_)));
    assert_eq!(
        q.apply(enq(p1, 2)).0,
        QueueReply::Resent,
        "below the last applied"
    );
    assert!(matches!(q.apply(enq(p2, 1)).0, QueueReply::Enqueued(_)));
    assert_eq!(q.ready_count(), 4);
    q.apply(QueueCommand::NodeRestarted {
        now_ms: 2,
        node: 1,
        epoch: 2,
    });
    assert!(
        matches!(q.apply(enq(p1, 1)).0, QueueReply::Enqueued(_)),
        "forgotten with its boot"
    );
    assert_eq!(q.ready_count(), 5);
    // The reply a resend's callers get: every message accepted.
    assert_eq!(
        QueueReply::for_resend(&enq(p1, 9)),
        QueueReply::Enqueued(vec![crate::queue::types::EnqueueOutcome::Accepted])
    );
}

/// A new leader re-issues deliveries of checked-out messages, held dead
/// letters and the expiry timer, without changing the state.
#[test]
fn leader_effects_reissue_checked_out_and_held() {
    use crate::queue::types::{ConsumerId, Effect, EnqueueMsg};
    let mut q = QueueMachine::new(QueueConfig::default());
    let c = ConsumerId {
        node: 2,
        epoch: 1,
        seq: 1,
    };
    q.apply(QueueCommand::Checkout {
        now_ms: 1,
        consumer: c,
        prefetch: 1,
        no_ack: false,
    });
    let msg = |ttl| EnqueueMsg {
        payload: bytes::Bytes::from_static(b"x"),
        body_size: 1,
        ttl_ms: ttl,
    };
    q.apply(QueueCommand::Enqueue {
        now_ms: 1,
        msgs: vec![msg(None), msg(Some(100))],
    });
    let before = q.clone();
    let fx = q.leader_effects();
    assert_eq!(q, before, "pure");
    let delivered: Vec<u64> = fx
        .iter()
        .filter_map(|e| match e {
            Effect::Deliver { consumer, delivery } if *consumer == c => {
                assert!(delivery.resend, "re-issued deliveries are marked");
                Some(delivery.id)
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        delivered,
        vec![0],
        "the checked-out message, not the ready one"
    );
    assert!(fx.contains(&Effect::ExpiryTimer { at_ms: 101 }), "{fx:?}");
}
