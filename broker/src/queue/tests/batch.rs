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
                    payload: None
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
