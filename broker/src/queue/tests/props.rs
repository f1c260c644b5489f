//! Property tests: random command sequences against the naive model, plus
//! model-free properties (no loss, no double settle, FIFO, delivery counts,
//! prefetch, replay determinism, snapshot round trip).

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use proptest::prelude::*;

use super::super::machine::QueueMachine;
use super::super::types::*;
use super::model::Model;

/// Push consumers: node 1-2, epoch 1-2, seq 0-2. Prefetch by seq: 0
/// (unlimited), 1, 2; (2, 2, 1) is no_ack.
fn push_consumer(i: usize) -> (ConsumerId, u32, bool) {
    let node = 1 + (i % 2) as u64;
    let epoch = 1 + ((i / 2) % 2) as u32;
    let seq = ((i / 4) % 3) as u32;
    (
        ConsumerId { node, epoch, seq },
        seq,
        node == 2 && epoch == 2 && seq == 1,
    )
}

/// basic.get slots, never used for Checkout (so prefetch is never mixed with gets).
fn get_slot(i: usize) -> ConsumerId {
    ConsumerId {
        node: 1 + (i % 2) as u64,
        epoch: 1,
        seq: 10 + (i % 2) as u32,
    }
}

/// Any consumer id, push or get slot.
fn any_consumer(i: usize) -> ConsumerId {
    if i % 3 == 2 {
        get_slot(i / 3)
    } else {
        push_consumer(i).0
    }
}

#[derive(Debug, Clone)]
enum Op {
    Advance(u64),
    Enqueue(Vec<(u32, Option<u64>)>),
    /// Messages with a message priority (0..6, some above the maximum).
    EnqueuePrio(Vec<(u32, Option<u64>, u8)>),
    Checkout(usize),
    /// basic.consume with a consumer priority (-1..=2).
    Subscribe(usize, i32),
    Cancel(usize),
    Down(usize),
    NodeRestarted(u64, u32),
    NodeDown(u64),
    NodeUp(u64, u32),
    Settle(usize, Vec<usize>),
    Return(usize, Vec<usize>),
    Discard(usize, Vec<usize>),
    Dequeue(usize, bool),
    Purge,
    Tick,
    Config(QueueConfig),
    DlSettled(Vec<usize>),
    /// Redrive's removal of ready messages (some picks are unknown ids).
    Remove(Vec<usize>),
    /// Several commands in one Batch (commands that do not return messages).
    Batch(Vec<(u32, Option<u64>)>, usize, bool),
    /// An enqueue as proposer (node 1..3, epoch 1..3) with sequence 1..6:
    /// repeats and lower sequences are resends the machine must skip.
    Deduped(Vec<(u32, Option<u64>)>, u64, u32, u64),
    /// Forwarded dead letters from source group 1..3: (source message id
    /// 0..8, size, priority) each, with the source's floor (`settled_below`
    /// 0..10, `floor_version` 0..4): resends, prunes and stale floors.
    DeadLetters(u64, Vec<(u64, u32, u8)>, u64, u64),
}

fn config_strategy() -> impl Strategy<Value = QueueConfig> {
    (
        prop_oneof![
            Just(None),
            Just(Some(DeadLetterTarget {
                exchange: "dlx".into(),
                routing_key: None
            }))
        ],
        prop_oneof![
            Just(DeadLetterStrategy::AtMostOnce),
            Just(DeadLetterStrategy::AtLeastOnce)
        ],
        prop_oneof![
            Just(Overflow::DropHead),
            Just(Overflow::RejectPublish),
            Just(Overflow::RejectPublishDlx)
        ],
        prop::option::of(0u64..6),
        prop::option::of(0u64..60),
        prop::option::of(0u64..80),
        prop::option::of(-1i64..3),
        prop::option::of(1u64..60),
        prop::option::of(0u8..5),
        delayed_retry_strategy(),
    )
        .prop_map(
            |(
                dead_letter,
                strategy,
                overflow,
                max_length,
                max_length_bytes,
                message_ttl_ms,
                delivery_limit,
                expires_ms,
                max_priority,
                delayed_retry,
            )| {
                QueueConfig {
                    dead_letter,
                    strategy,
                    overflow,
                    max_length,
                    max_length_bytes,
                    message_ttl_ms,
                    delivery_limit,
                    expires_ms,
                    // The naive model has no single-active-consumer mode.
                    single_active_consumer: false,
                    max_priority,
                    delayed_retry,
                    ..QueueConfig::default()
                }
            },
        )
}

/// Delayed retry of every kind (half the configurations have none); min and
/// max in ms, max sometimes below min (the delay is then max).
fn delayed_retry_strategy() -> impl Strategy<Value = DelayedRetry> {
    prop_oneof![
        3 => Just(DelayedRetry::default()),
        3 => (
            prop_oneof![
                Just(DelayedRetryType::All),
                Just(DelayedRetryType::Failed),
                Just(DelayedRetryType::Returned)
            ],
            0u64..30,
            0u64..80,
        )
            .prop_map(|(kind, min_ms, max_ms)| DelayedRetry { kind, min_ms, max_ms }),
    ]
}

fn msgs_strategy() -> impl Strategy<Value = Vec<(u32, Option<u64>)>> {
    prop::collection::vec((0u32..12, prop::option::of(0u64..60)), 0..4)
}

fn picks() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(0usize..100, 0..4)
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0u64..40).prop_map(Op::Advance),
        1 => (100u64..400).prop_map(Op::Advance),
        6 => msgs_strategy().prop_map(Op::Enqueue),
        4 => prop::collection::vec((0u32..12, prop::option::of(0u64..60), 0u8..6), 0..4)
            .prop_map(Op::EnqueuePrio),
        3 => (0usize..12).prop_map(Op::Checkout),
        2 => (0usize..12, -1i32..3).prop_map(|(c, p)| Op::Subscribe(c, p)),
        1 => (0usize..12).prop_map(Op::Cancel),
        1 => (0usize..18).prop_map(Op::Down),
        1 => (1u64..3, 1u32..4).prop_map(|(n, e)| Op::NodeRestarted(n, e)),
        1 => (1u64..3).prop_map(Op::NodeDown),
        1 => (1u64..3, 1u32..4).prop_map(|(n, e)| Op::NodeUp(n, e)),
        3 => (0usize..18, picks()).prop_map(|(c, p)| Op::Settle(c, p)),
        3 => (0usize..18, picks()).prop_map(|(c, p)| Op::Return(c, p)),
        2 => (0usize..18, picks()).prop_map(|(c, p)| Op::Discard(c, p)),
        3 => (0usize..2, any::<bool>()).prop_map(|(c, n)| Op::Dequeue(c, n)),
        1 => Just(Op::Purge),
        2 => Just(Op::Tick),
        1 => config_strategy().prop_map(Op::Config),
        2 => picks().prop_map(Op::DlSettled),
        2 => picks().prop_map(Op::Remove),
        1 => (msgs_strategy(), 0usize..2, any::<bool>()).prop_map(|(m, c, n)| Op::Batch(m, c, n)),
        2 => (msgs_strategy(), 1u64..3, 1u32..4, 1u64..7).prop_map(|(m, n, e, s)| Op::Deduped(m, n, e, s)),
        3 => (1u64..3, prop::collection::vec((0u64..8, 0u32..12, 0u8..6), 0..4), 0u64..10, 0u64..4)
            .prop_map(|(src, m, below, v)| Op::DeadLetters(src, m, below, v)),
    ]
}

fn to_msgs(spec: &[(u32, Option<u64>)]) -> Vec<EnqueueMsg> {
    spec.iter()
        .map(|(size, ttl)| EnqueueMsg {
            payload: Bytes::from(vec![7u8; *size as usize]),
            body_size: *size,
            ttl_ms: *ttl,
        })
        .collect()
}

/// Pick ids from `pool` (or raw unknown ids if it is empty / for big picks).
fn resolve(pool: &[MsgId], picks: &[usize]) -> Vec<MsgId> {
    picks
        .iter()
        .map(|p| {
            if *p >= 90 || pool.is_empty() {
                10_000 + *p as u64
            } else {
                pool[*p % pool.len()]
            }
        })
        .collect()
}

/// Turn an abstract op into a concrete command against the current state.
fn concretize(op: &Op, now: &mut u64, q: &QueueMachine) -> Option<QueueCommand> {
    let now_ms = *now;
    Some(match op {
        Op::Advance(d) => {
            *now += d;
            return None;
        }
        Op::Enqueue(m) => QueueCommand::Enqueue {
            now_ms,
            msgs: to_msgs(m),
        },
        Op::EnqueuePrio(m) => QueueCommand::enqueue(
            now_ms,
            m.iter()
                .map(|(size, ttl, priority)| PrioritizedMsg {
                    msg: EnqueueMsg {
                        payload: Bytes::from(vec![7u8; *size as usize]),
                        body_size: *size,
                        ttl_ms: *ttl,
                    },
                    priority: *priority,
                })
                .collect(),
        ),
        Op::Subscribe(i, priority) => {
            let (consumer, prefetch, no_ack) = push_consumer(*i);
            QueueCommand::Subscribe {
                now_ms,
                consumer,
                spec: ConsumerSpec {
                    prefetch,
                    no_ack,
                    priority: *priority,
                    ..ConsumerSpec::default()
                },
            }
        }
        Op::Checkout(i) => {
            let (consumer, prefetch, no_ack) = push_consumer(*i);
            QueueCommand::Checkout {
                now_ms,
                consumer,
                prefetch,
                no_ack,
            }
        }
        Op::Cancel(i) => QueueCommand::Cancel {
            now_ms,
            consumer: push_consumer(*i).0,
        },
        Op::Down(i) => QueueCommand::ConsumerDown {
            now_ms,
            consumer: any_consumer(*i),
        },
        Op::NodeRestarted(node, epoch) => QueueCommand::NodeRestarted {
            now_ms,
            node: *node,
            epoch: *epoch,
        },
        Op::NodeDown(node) => QueueCommand::NodeDown {
            now_ms,
            node: *node,
        },
        Op::NodeUp(node, epoch) => QueueCommand::NodeUp {
            now_ms,
            node: *node,
            epoch: *epoch,
        },
        Op::Settle(c, p) | Op::Return(c, p) | Op::Discard(c, p) => {
            let consumer = any_consumer(*c);
            let pool: Vec<MsgId> = q.checked_out(consumer).collect();
            let ids = resolve(&pool, p);
            match op {
                Op::Settle(..) => QueueCommand::Settle {
                    now_ms,
                    consumer,
                    ids,
                },
                Op::Return(..) => QueueCommand::Return {
                    now_ms,
                    consumer,
                    ids,
                },
                _ => QueueCommand::Discard {
                    now_ms,
                    consumer,
                    ids,
                },
            }
        }
        Op::Dequeue(c, no_ack) => QueueCommand::Dequeue {
            now_ms,
            consumer: get_slot(*c),
            no_ack: *no_ack,
        },
        Op::Purge => QueueCommand::Purge { now_ms },
        Op::Tick => QueueCommand::Tick { now_ms },
        Op::Config(c) => QueueCommand::Configure {
            now_ms,
            config: c.clone(),
        },
        Op::DlSettled(p) => {
            let pool: Vec<MsgId> = q.held_dead_letters().map(|(id, _)| id).collect();
            QueueCommand::DeadLetterSettled {
                now_ms,
                ids: resolve(&pool, p),
            }
        }
        Op::Remove(p) => {
            let pool: Vec<MsgId> = q.ready_ids();
            QueueCommand::Remove {
                now_ms,
                ids: resolve(&pool, p),
            }
        }
        // The Dequeue comes first so that its delivery (in the reply) is
        // also the first in time, before any Deliver effect of the batch.
        Op::Deduped(m, node, epoch, seq) => QueueCommand::Deduped {
            proposer: crate::queue::types::ProposerId {
                node: *node,
                epoch: *epoch,
            },
            seq: *seq,
            cmd: Box::new(QueueCommand::Enqueue {
                now_ms,
                msgs: to_msgs(m),
            }),
        },
        Op::DeadLetters(source, m, settled_below, floor_version) => {
            QueueCommand::EnqueueDeadLetters {
                now_ms,
                source: *source,
                settled_below: *settled_below,
                floor_version: *floor_version,
                msgs: m
                    .iter()
                    .map(|(id, size, priority)| {
                        (
                            *id,
                            PrioritizedMsg {
                                msg: EnqueueMsg {
                                    payload: Bytes::from(vec![7u8; *size as usize]),
                                    body_size: *size,
                                    ttl_ms: None,
                                },
                                priority: *priority,
                            },
                        )
                    })
                    .collect(),
            }
        }
        Op::Batch(m, c, no_ack) => QueueCommand::Batch(vec![
            QueueCommand::Dequeue {
                now_ms,
                consumer: get_slot(*c),
                no_ack: *no_ack,
            },
            QueueCommand::Enqueue {
                now_ms,
                msgs: to_msgs(m),
            },
            QueueCommand::Tick { now_ms: now_ms + 1 },
            QueueCommand::Checkout {
                now_ms: now_ms + 2,
                consumer: push_consumer(*c).0,
                prefetch: push_consumer(*c).1,
                no_ack: push_consumer(*c).2,
            },
        ]),
    })
}

/// Deliveries (effects and basic.get replies) of one command, in order.
fn deliveries(reply: &QueueReply, effects: &[Effect], out: &mut Vec<Delivery>) {
    fn from_reply(r: &QueueReply, out: &mut Vec<Delivery>) {
        match r {
            QueueReply::Dequeued(Some((d, _))) => out.push(d.clone()),
            QueueReply::Batch(rs) => rs.iter().for_each(|r| from_reply(r, out)),
            _ => {}
        }
    }
    from_reply(reply, out);
    for e in effects {
        if let Effect::Deliver { delivery, .. } = e {
            out.push(delivery.clone());
        }
    }
}

fn accepted(reply: &QueueReply) -> usize {
    outcomes(reply, EnqueueOutcome::Accepted)
}

/// Enqueue outcomes equal to `which` in a reply.
fn outcomes(reply: &QueueReply, which: EnqueueOutcome) -> usize {
    match reply {
        QueueReply::Enqueued(o) => o.iter().filter(|x| **x == which).count(),
        QueueReply::Batch(rs) => rs.iter().map(|r| outcomes(r, which)).sum(),
        _ => 0,
    }
}

/// Messages an enqueue stores: the accepted ones, and with reject-publish-dlx
/// the refused ones too (they are dead-lettered from the store).
fn stored_by(reply: &QueueReply, overflow: Overflow) -> usize {
    let refused_stored = if overflow == Overflow::RejectPublishDlx {
        outcomes(reply, EnqueueOutcome::Rejected)
    } else {
        0
    };
    accepted(reply) + refused_stored
}

/// Which checked-out messages this command will return (counted), from the pre-state.
fn counted_returns(cmd: &QueueCommand, q: &QueueMachine) -> Vec<MsgId> {
    match cmd {
        QueueCommand::Return { consumer, ids, .. } => {
            let out: BTreeSet<MsgId> = q.checked_out(*consumer).collect();
            ids.iter()
                .filter(|id| out.contains(id))
                .copied()
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect()
        }
        QueueCommand::ConsumerDown { consumer, .. } => q.checked_out(*consumer).collect(),
        QueueCommand::NodeRestarted { node, epoch, .. }
        | QueueCommand::NodeUp { node, epoch, .. } => q
            .consumer_ids()
            .into_iter()
            .filter(|c| c.node == *node && c.epoch < *epoch)
            .flat_map(|c| q.checked_out(c).collect::<Vec<_>>())
            .collect(),
        // Suspected records hold nothing, so every record of the node gives back all it holds.
        QueueCommand::NodeDown { node, .. } => q
            .consumer_ids()
            .into_iter()
            .filter(|c| c.node == *node)
            .flat_map(|c| q.checked_out(c).collect::<Vec<_>>())
            .collect(),
        _ => Vec::new(),
    }
}

/// Ids of the messages stored by a command's effects, in order.
fn stored_ids(effects: &[Effect]) -> Vec<MsgId> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::StoreBody { id, .. } => Some(*id),
            _ => None,
        })
        .collect()
}

/// The message priorities of the messages a command stored, in order (0
/// for `Enqueue`): those its reply reports accepted, and with
/// reject-publish-dlx (`overflow`) the refused ones too.
fn stored_priorities(cmd: &QueueCommand, reply: &QueueReply, overflow: Overflow) -> Vec<u8> {
    let stored = |o: &EnqueueOutcome| {
        *o == EnqueueOutcome::Accepted || overflow == Overflow::RejectPublishDlx
    };
    match (cmd, reply) {
        (QueueCommand::Enqueue { .. }, QueueReply::Enqueued(o)) => {
            o.iter().filter(|x| stored(x)).map(|_| 0).collect()
        }
        (QueueCommand::EnqueuePrioritized { msgs, .. }, QueueReply::Enqueued(o)) => msgs
            .iter()
            .zip(o)
            .filter(|(_, x)| stored(x))
            .map(|(m, _)| m.priority)
            .collect(),
        (QueueCommand::Batch(cmds), QueueReply::Batch(replies)) => cmds
            .iter()
            .zip(replies)
            .flat_map(|(c, r)| stored_priorities(c, r, overflow))
            .collect(),
        (QueueCommand::Deduped { cmd, .. }, r) => stored_priorities(cmd, r, overflow),
        _ => Vec::new(),
    }
}

/// The `now_ms` of a command (of its last part for a batch), if it has one.
fn command_now(cmd: &QueueCommand) -> Option<u64> {
    match cmd {
        QueueCommand::Batch(cmds) => cmds.iter().rev().find_map(command_now),
        QueueCommand::Deduped { cmd, .. } => command_now(cmd),
        c => c.now_ms(),
    }
}

fn snapshot(q: &QueueMachine) -> QueueMachine {
    let bytes = bincode::serde::encode_to_vec(q, bincode::config::standard())
        .unwrap_or_else(|e| panic!("encode: {e}"));
    let (back, _) =
        bincode::serde::decode_from_slice::<QueueMachine, _>(&bytes, bincode::config::standard())
            .unwrap_or_else(|e| panic!("decode: {e}"));
    back
}

fn run_ops(cfg: QueueConfig, ops: Vec<Op>, split: usize) -> Result<(), TestCaseError> {
    let mut q = QueueMachine::new(cfg.clone());
    let mut model = Model::new(cfg.clone());
    let mut now = 1_000u64;
    let mut log: Vec<(QueueCommand, QueueReply, Vec<Effect>)> = Vec::new();
    let mut stored: BTreeSet<MsgId> = BTreeSet::new();
    let mut dropped: BTreeSet<MsgId> = BTreeSet::new();
    let mut returns: BTreeMap<MsgId, u32> = BTreeMap::new();
    // Last fresh (never returned) delivery per kept message priority.
    let mut last_fresh: BTreeMap<u8, MsgId> = BTreeMap::new();
    let mut priority_of: BTreeMap<MsgId, u8> = BTreeMap::new();
    let mut restored: Option<(QueueMachine, usize)> = None;

    for (step, op) in ops.iter().enumerate() {
        if step == split {
            restored = Some((snapshot(&q), log.len()));
            prop_assert_eq!(&restored.as_ref().map(|r| r.0.clone()), &Some(q.clone()));
        }
        let Some(cmd) = concretize(op, &mut now, &q) else {
            continue;
        };
        for id in counted_returns(&cmd, &q) {
            *returns.entry(id).or_default() += 1;
        }
        let overflow = q.config().overflow;
        let max_priority = q.config().max_priority;
        let was_delayed: BTreeMap<MsgId, u64> = q
            .delayed_entries()
            .into_iter()
            .map(|(at, id)| (id, at))
            .collect();
        let cmd_now = command_now(&cmd);
        let fresh = q.dead_letters_fresh(&cmd);
        let (reply, effects) = q.apply(cmd.clone());
        let stored_now = stored_ids(&effects);
        let prios = match (&cmd, &reply) {
            // A copy of a message in the window is accepted, not stored.
            (QueueCommand::EnqueueDeadLetters { msgs, .. }, QueueReply::Enqueued(o)) => msgs
                .iter()
                .zip(o)
                .zip(&fresh)
                .filter(|((_, x), f)| {
                    **f && (**x == EnqueueOutcome::Accepted
                        || overflow == Overflow::RejectPublishDlx)
                })
                .map(|((m, _), _)| m.1.priority)
                .collect(),
            _ => stored_priorities(&cmd, &reply, overflow),
        };
        prop_assert_eq!(stored_now.len(), prios.len());
        let prios_len = prios.len();
        for (id, p) in stored_now.into_iter().zip(prios) {
            priority_of.insert(id, max_priority.map_or(0, |m| p.min(m)));
        }
        let (m_reply, m_effects) = model.apply(cmd.clone());
        prop_assert_eq!(
            &reply,
            &m_reply,
            "reply differs from the model for {:?}",
            cmd
        );
        prop_assert_eq!(
            &effects,
            &m_effects,
            "effects differ from the model for {:?}",
            cmd
        );
        if let Err(e) = q.check_invariants() {
            return Err(TestCaseError::fail(format!("invariant: {e} after {cmd:?}")));
        }

        // Accounting: each accepted message stored once, dropped at most once,
        // nothing used after its drop.
        let mut new_stored = 0;
        for e in &effects {
            match e {
                Effect::StoreBody { id, .. } => {
                    prop_assert!(stored.insert(*id), "id {} stored twice", id);
                    new_stored += 1;
                }
                Effect::DropBody { id } => {
                    prop_assert!(stored.contains(id), "drop of unknown {}", id);
                    prop_assert!(dropped.insert(*id), "id {} dropped twice", id);
                }
                Effect::Deliver {
                    delivery: Delivery { id, .. },
                    ..
                }
                | Effect::DeadLetter { id, .. }
                | Effect::DeadLetterHeld { id, .. } => {
                    prop_assert!(
                        stored.contains(id) && !dropped.contains(id),
                        "use of gone message {}",
                        id
                    );
                }
                _ => {}
            }
        }
        if matches!(cmd, QueueCommand::EnqueueDeadLetters { .. }) {
            prop_assert_eq!(new_stored, prios_len);
        } else {
            prop_assert_eq!(new_stored, stored_by(&reply, overflow));
        }
        let live: Vec<MsgId> = q.live_ids();
        let live_set: BTreeSet<MsgId> = live.iter().copied().collect();
        prop_assert_eq!(live.len(), live_set.len());
        prop_assert!(live_set.is_disjoint(&dropped));
        let all: BTreeSet<MsgId> = live_set.union(&dropped).copied().collect();
        prop_assert_eq!(&all, &stored, "a message was lost or invented");
        prop_assert_eq!(
            q.ready_count() + q.unacked_count() + q.held_count() + q.delayed_count(),
            live.len() as u64
        );

        // Delayed retry: nothing leaves the delayed area before its ready-at
        // (ready, delivered, or got); what left now is in (ready-at, id)
        // order among the ready ones; nothing due is still waiting.
        let still: BTreeSet<MsgId> = q.delayed_entries().into_iter().map(|(_, id)| id).collect();
        let mut ds = Vec::new();
        deliveries(&reply, &effects, &mut ds);
        let left_ready: Vec<(u64, MsgId)> = q
            .ready_ids()
            .into_iter()
            .filter_map(|id| was_delayed.get(&id).map(|at| (*at, id)))
            .collect();
        // Left for the ready queue, a consumer or basic.get: due. (Dead-lettered
        // ones — drop-head when nothing is ready — and purged ones are exempt.)
        let handed: BTreeSet<MsgId> = ds.iter().map(|d| d.id).collect();
        for (id, at) in &was_delayed {
            let released = !still.contains(id)
                && (handed.contains(id)
                    || q.ready_ids().contains(id)
                    || q.consumer_ids()
                        .iter()
                        .any(|c| q.checked_out(*c).any(|x| x == *id)));
            if released {
                prop_assert!(
                    cmd_now.is_some_and(|n| n >= *at),
                    "message {} released at {:?} before its ready-at {}",
                    id,
                    cmd_now,
                    at
                );
            }
        }
        // Within one message priority (delivery order puts higher priorities first).
        let mut by_priority: BTreeMap<u8, Vec<(u64, MsgId)>> = BTreeMap::new();
        for (at, id) in &left_ready {
            let p = priority_of.get(id).copied().unwrap_or(0);
            by_priority.entry(p).or_default().push((*at, *id));
        }
        for lane in by_priority.values() {
            let mut sorted = lane.clone();
            sorted.sort();
            prop_assert_eq!(lane, &sorted, "released out of (ready-at, id) order");
        }
        // (A resent or out-of-sequence `Deduped` is not applied at all.)
        let applied = !matches!(reply, QueueReply::Resent | QueueReply::OutOfSequence);
        if let Some(n) = cmd_now.filter(|_| applied) {
            prop_assert!(
                q.delayed_entries().first().is_none_or(|(at, _)| *at > n),
                "a due delayed message is still waiting at {}",
                n
            );
        }

        // Delivery counts = counted returns so far; fresh messages in FIFO order.
        for d in ds {
            prop_assert_eq!(
                d.delivery_count,
                returns.get(&d.id).copied().unwrap_or(0),
                "delivery_count of {}",
                d.id
            );
            prop_assert!(d.payload.is_none());
            if d.delivery_count == 0 {
                let p = priority_of.get(&d.id).copied().unwrap_or(0);
                let last = last_fresh.insert(p, d.id);
                prop_assert!(
                    last.is_none_or(|l| d.id > l),
                    "first deliveries of priority {} out of order: {} after {:?}",
                    p,
                    d.id,
                    last
                );
            }
        }

        // Views agree with the model.
        prop_assert_eq!(q.ready_ids(), model.ready_ids());
        prop_assert_eq!(q.held_dead_letters().collect::<Vec<_>>(), model.held());
        prop_assert_eq!(q.delayed_entries(), model.delayed());
        prop_assert_eq!(q.dedup_window(), model.dedup_window());
        prop_assert_eq!(q.consumer_count(), model.active());
        prop_assert_eq!(q.publishers_blocked(), model.blocked());
        for c in q.consumer_ids() {
            prop_assert_eq!(q.checked_out(c).collect::<Vec<_>>(), model.out_ids(c));
        }
        log.push((cmd, reply, effects));
    }

    // Replay determinism: a fresh machine fed the same log gives the same
    // replies, effects and state; so does a clone restored from a snapshot.
    let mut replay = QueueMachine::new(cfg);
    for (cmd, reply, effects) in &log {
        let (r, e) = replay.apply(cmd.clone());
        prop_assert_eq!(&r, reply);
        prop_assert_eq!(&e, effects);
    }
    prop_assert_eq!(&replay, &q);
    if let Some((mut from_snapshot, at)) = restored {
        for (cmd, reply, effects) in &log[at..] {
            let (r, e) = from_snapshot.apply(cmd.clone());
            prop_assert_eq!(&r, reply);
            prop_assert_eq!(&e, effects);
        }
        prop_assert_eq!(&from_snapshot, &q);
    }
    prop_assert_eq!(&snapshot(&q), &q);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Random command sequences under a random configuration.
    #[test]
    fn machine_matches_model(cfg in config_strategy(), ops in prop::collection::vec(op_strategy(), 0..80), split in 0usize..80) {
        run_ops(cfg, ops, split)?;
    }

    /// Same, biased to at-least-once with reject-publish (held area + limits).
    #[test]
    fn at_least_once_matches_model(
        max_length in prop::option::of(0u64..5),
        ttl in prop::option::of(0u64..50),
        limit in prop::option::of(0i64..3),
        ops in prop::collection::vec(op_strategy(), 0..80),
        split in 0usize..80,
    ) {
        let cfg = QueueConfig {
            dead_letter: Some(DeadLetterTarget { exchange: "dlx".into(), routing_key: Some("rk".into()) }),
            strategy: DeadLetterStrategy::AtLeastOnce,
            overflow: Overflow::RejectPublish,
            max_length,
            message_ttl_ms: ttl,
            delivery_limit: limit,
            ..QueueConfig::default()
        };
        run_ops(cfg, ops, split)?;
    }
}

/// The generators reach every effect kind, every dead-letter reason under
/// both handlers, and both reject outcomes: the properties above are not
/// vacuous.
#[test]
fn generators_cover_every_effect() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let strategy = (
        config_strategy(),
        prop::collection::vec(op_strategy(), 0..80),
    );
    let mut seen: BTreeSet<String> = BTreeSet::new();
    for _ in 0..400 {
        let (cfg, ops) = match strategy.new_tree(&mut runner) {
            Ok(t) => t.current(),
            Err(e) => panic!("generator: {e}"),
        };
        let mut q = QueueMachine::new(cfg);
        let mut now = 0;
        for op in &ops {
            let Some(cmd) = concretize(op, &mut now, &q) else {
                continue;
            };
            let fresh = q.dead_letters_fresh(&cmd);
            if fresh.iter().any(|f| !f) {
                seen.insert("Dead letter de-duplicated".into());
            }
            let pruned = q.dedup_window().0;
            let (reply, effects) = q.apply(cmd);
            if matches!(reply, QueueReply::Enqueued(_)) && q.dedup_window().0 < pruned {
                seen.insert("Dedup window pruned".into());
            }
            if let QueueReply::Enqueued(o) = &reply {
                o.iter().for_each(|x| {
                    seen.insert(format!("{x:?}"));
                });
            }
            if let QueueReply::Dequeued(Some(_)) = &reply {
                seen.insert("Dequeued".into());
            }
            if q.delayed_count() > 0 {
                seen.insert("Delayed".into());
            }
            if effects.iter().any(
                |e| matches!(e, Effect::Deliver { delivery, .. } if delivery.delivery_count > 0),
            ) && q.config().delayed_retry.kind != DelayedRetryType::Disabled
            {
                seen.insert("Redelivered with delayed retry".into());
            }
            for e in effects {
                let key = match e {
                    Effect::StoreBody { .. } => "StoreBody".to_string(),
                    Effect::DropBody { .. } => "DropBody".to_string(),
                    Effect::Deliver { delivery, .. } => {
                        format!("Deliver redelivered={}", delivery.delivery_count > 0)
                    }
                    Effect::DeadLetter { reason, .. } => format!("DeadLetter {}", reason.as_str()),
                    Effect::DeadLetterHeld { reason, .. } => format!("Held {}", reason.as_str()),
                    Effect::DeadLettered { reason, strategy } => {
                        format!("DeadLettered {} {strategy:?}", reason.as_str())
                    }
                    Effect::PublishersBlocked(b) => format!("Blocked {b}"),
                    Effect::QueueExpired => "QueueExpired".to_string(),
                    Effect::ExpiryTimer { .. } => "ExpiryTimer".to_string(),
                    Effect::ConsumerTimedOut { .. } => "ConsumerTimedOut".to_string(),
                };
                seen.insert(key);
            }
        }
    }
    let mut want: Vec<String> = [
        "StoreBody",
        "DropBody",
        "Deliver redelivered=false",
        "Deliver redelivered=true",
        "Blocked true",
        "Blocked false",
        "QueueExpired",
        "ExpiryTimer",
        "Accepted",
        "Rejected",
        "Dequeued",
        "Delayed",
        "Redelivered with delayed retry",
        "Dead letter de-duplicated",
        "Dedup window pruned",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for r in ["rejected", "expired", "maxlen", "delivery_limit"] {
        want.push(format!("DeadLetter {r}"));
        // Every dead-lettering is counted, with its strategy (None: no DLX, dropped).
        want.push(format!("DeadLettered {r} None"));
        want.push(format!("DeadLettered {r} Some(AtMostOnce)"));
        // maxlen is held only by reject-publish-dlx's refused publishes
        // (at-least-once requires reject-publish(-dlx), which never drops the head).
        want.push(format!("Held {r}"));
    }
    let missing: Vec<&String> = want.iter().filter(|w| !seen.contains(*w)).collect();
    assert!(missing.is_empty(), "generators never produced {missing:?}");
}
