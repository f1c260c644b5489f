//! Effectively-once enqueue of forwarded dead letters
//! (`QueueCommand::EnqueueDeadLetters`, `dedup.rs`, issue 29 item 4): unit
//! tests per rule, and a property test of the whole protocol — a source
//! queue, workers reading current or stale replicas of it, lost replies and
//! settles — in which no source message is ever enqueued twice in the
//! target and none is lost.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use proptest::prelude::*;

use super::super::dedup::{MAX_IDS, MAX_IDS_PER_SOURCE, SOURCE_IDLE_MS};
use super::super::machine::QueueMachine;
use super::super::types::*;
use super::helpers::*;

/// A forwarded message whose payload names its source id.
fn fwd(id: MsgId) -> (MsgId, PrioritizedMsg) {
    (
        id,
        PrioritizedMsg {
            msg: EnqueueMsg {
                payload: Bytes::from(id.to_string()),
                body_size: 1,
                ttl_ms: None,
            },
            priority: 0,
        },
    )
}

fn dl(now_ms: u64, source: u64, floor: (MsgId, u64), ids: &[MsgId]) -> QueueCommand {
    QueueCommand::EnqueueDeadLetters {
        now_ms,
        source,
        settled_below: floor.0,
        floor_version: floor.1,
        msgs: ids.iter().map(|id| fwd(*id)).collect(),
    }
}

fn outcomes(r: QueueReply) -> Vec<EnqueueOutcome> {
    match r {
        QueueReply::Enqueued(o) => o,
        other => panic!("not an enqueue reply: {other:?}"),
    }
}

const A: EnqueueOutcome = EnqueueOutcome::Accepted;
const R: EnqueueOutcome = EnqueueOutcome::Rejected;

#[test]
fn a_resent_dead_letter_is_accepted_not_enqueued_again() {
    let mut q = QueueMachine::new(QueueConfig::default());
    let (r, e) = run(&mut q, dl(1, 7, (0, 0), &[3, 4]));
    assert_eq!(outcomes(r), vec![A, A]);
    assert_eq!(stored(&e), vec![0, 1]);
    // The source's leader died before it settled: its successor resends.
    let (r, e) = run(&mut q, dl(2, 7, (0, 0), &[3, 4, 5]));
    assert_eq!(outcomes(r), vec![A, A, A]);
    assert_eq!(stored(&e), vec![2], "only the new one is enqueued");
    assert_eq!(q.ready_count(), 3);
    assert_eq!(q.dedup_window(), (3, 1));
}

#[test]
fn copies_within_one_command_are_enqueued_once() {
    let mut q = QueueMachine::new(QueueConfig::default());
    let (r, e) = run(&mut q, dl(1, 7, (0, 0), &[3, 3, 4, 3]));
    assert_eq!(outcomes(r), vec![A, A, A, A]);
    assert_eq!(stored(&e).len(), 2);
}

#[test]
fn windows_are_per_source() {
    let mut q = QueueMachine::new(QueueConfig::default());
    run(&mut q, dl(1, 7, (0, 0), &[3]));
    let (_, e) = run(&mut q, dl(2, 8, (0, 0), &[3]));
    assert_eq!(
        stored(&e).len(),
        1,
        "id 3 of another queue is another message"
    );
    assert_eq!(q.dedup_window(), (2, 2));
}

#[test]
fn the_floor_forgets_settled_ids_and_refuses_their_copies() {
    let mut q = QueueMachine::new(QueueConfig::default());
    run(&mut q, dl(1, 7, (3, 1), &[3, 4, 9]));
    // 3 and 4 were settled in the source: its lowest held id is now 9.
    let (r, e) = run(&mut q, dl(2, 7, (9, 1), &[10]));
    assert_eq!(outcomes(r), vec![A]);
    assert_eq!(stored(&e).len(), 1);
    assert_eq!(q.dedup_window(), (2, 1), "3 and 4 forgotten, 9 and 10 kept");
    // A deposed leader's worker resends 4 from a stale replica: settled, not enqueued.
    let (r, e) = run(&mut q, dl(3, 7, (3, 1), &[4]));
    assert_eq!(outcomes(r), vec![A]);
    assert!(stored(&e).is_empty());
    assert_eq!(q.ready_count(), 4);
}

#[test]
fn a_newer_floor_may_go_down_and_a_stale_one_is_ignored() {
    let mut q = QueueMachine::new(QueueConfig::default());
    run(&mut q, dl(1, 7, (10, 2), &[10, 11]));
    // A stale sender (version 1) names a higher floor: ignored, 10 and 11 stay.
    let (_, e) = run(&mut q, dl(2, 7, (20, 1), &[]));
    assert!(e.iter().all(|e| !matches!(e, Effect::StoreBody { .. })));
    assert_eq!(q.dedup_window(), (2, 1));
    let (r, e) = run(&mut q, dl(3, 7, (20, 1), &[11]));
    assert_eq!((outcomes(r), stored(&e).len()), (vec![A], 0));
    // Message 5 of the source was held later (version 3): the floor goes down to it.
    let (r, e) = run(&mut q, dl(4, 7, (5, 3), &[5]));
    assert_eq!((outcomes(r), stored(&e).len()), (vec![A], 1));
    assert_eq!(q.dedup_window(), (3, 1));
}

#[test]
fn a_refused_dead_letter_is_not_remembered() {
    let mut q = QueueMachine::new(QueueConfig {
        max_length: Some(1),
        overflow: Overflow::RejectPublish,
        ..QueueConfig::default()
    });
    // The second message goes over max-length 1: the third is refused.
    let (r, _) = run(&mut q, dl(1, 7, (0, 0), &[1, 2, 3, 3]));
    assert_eq!(
        outcomes(r),
        vec![A, A, R, R],
        "a copy shares its first's outcome"
    );
    assert_eq!(q.dedup_window(), (2, 1));
    run(&mut q, QueueCommand::Purge { now_ms: 2 });
    let (r, e) = run(&mut q, dl(3, 7, (0, 0), &[1, 2, 3]));
    assert_eq!(outcomes(r), vec![A, A, A]);
    assert_eq!(stored(&e).len(), 1, "3 is enqueued now, 1 and 2 not again");
}

#[test]
fn purge_keeps_the_window() {
    let mut q = QueueMachine::new(QueueConfig::default());
    run(&mut q, dl(1, 7, (0, 0), &[1]));
    run(&mut q, QueueCommand::Purge { now_ms: 2 });
    let (_, e) = run(&mut q, dl(3, 7, (0, 0), &[1]));
    assert!(
        stored(&e).is_empty(),
        "a purged dead letter is not resurrected"
    );
}

#[test]
fn an_idle_source_is_forgotten() {
    let mut q = QueueMachine::new(QueueConfig::default());
    run(&mut q, dl(1_000, 7, (0, 0), &[1]));
    run(&mut q, dl(2_000, 8, (0, 0), &[1]));
    tick(&mut q, 1_000 + SOURCE_IDLE_MS - 1);
    assert_eq!(q.dedup_window(), (2, 2));
    tick(&mut q, 1_000 + SOURCE_IDLE_MS);
    assert_eq!(q.dedup_window(), (1, 1), "source 7 (deleted) is gone");
    // Aged on this command too.
    run(&mut q, dl(2_000 + SOURCE_IDLE_MS, 9, (0, 0), &[]));
    assert_eq!(q.dedup_window(), (0, 1));
}

#[test]
fn the_window_is_bounded_per_source_and_overall() {
    let mut q = QueueMachine::new(QueueConfig::default());
    let ids: Vec<MsgId> = (0..MAX_IDS_PER_SOURCE as u64 + 10).collect();
    for chunk in ids.chunks(4096) {
        run(&mut q, dl(1, 1, (0, 0), chunk));
    }
    assert_eq!(q.dedup_window(), (MAX_IDS_PER_SOURCE as u64, 1));
    // The lowest ids were forgotten: a copy of one is enqueued again
    // (at-least-once past the bound), a copy of a kept one is not.
    let (_, e) = run(&mut q, dl(2, 1, (0, 0), &[0, 100]));
    assert_eq!(stored(&e).len(), 1);
    // Over all sources: the largest window gives way.
    let per = MAX_IDS_PER_SOURCE as u64;
    for source in 2..=(MAX_IDS as u64 / per + 1) {
        let ids: Vec<MsgId> = (0..per).collect();
        for chunk in ids.chunks(8192) {
            run(&mut q, dl(3, source, (0, 0), chunk));
        }
    }
    assert_eq!(q.dedup_window().0, MAX_IDS as u64);
    assert!(q.check_invariants().is_ok());
}

#[test]
fn priorities_and_limits_apply_as_to_any_enqueue() {
    let mut q = QueueMachine::new(QueueConfig {
        max_priority: Some(3),
        ..QueueConfig::default()
    });
    let mut hi = fwd(2);
    hi.1.priority = 9;
    run(
        &mut q,
        QueueCommand::EnqueueDeadLetters {
            now_ms: 1,
            source: 7,
            settled_below: 0,
            floor_version: 0,
            msgs: vec![fwd(1), hi],
        },
    );
    assert_eq!(q.ready_ids(), vec![1, 0], "priority 9 kept as 3, first out");
}

/// One step of the protocol test.
#[derive(Debug, Clone)]
enum Step {
    /// Publish n messages to the source (its consumer gets them).
    Publish(u8),
    /// The consumer rejects (requeue=false) these picks of what it holds: held.
    Reject(Vec<usize>),
    /// A worker reads the source's replica as it was `age` commands ago
    /// (0 = current; a deposed leader's lagging replica otherwise) and
    /// prepares a forward of up to 3 held dead letters.
    Read(usize),
    /// The target applies a prepared forward (any order: slow networks).
    Deliver(usize),
    /// The worker whose forward was answered settles it in the source (or
    /// its reply was lost: the step is never generated for it).
    Settle(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        2 => (1u8..4).prop_map(Step::Publish),
        3 => prop::collection::vec(0usize..10, 1..3).prop_map(Step::Reject),
        3 => prop_oneof![Just(0usize), 0usize..12].prop_map(Step::Read),
        3 => (0usize..20).prop_map(Step::Deliver),
        2 => (0usize..20).prop_map(Step::Settle),
    ]
}

const SOURCE: u64 = 42;
const CONSUMER: ConsumerId = ConsumerId {
    node: 1,
    epoch: 1,
    seq: 1,
};

/// A prepared forward: its command and, once applied, the ids it got accepted.
struct Forward {
    cmd: QueueCommand,
    accepted: Option<Vec<MsgId>>,
}

/// Source message ids the target stored, from the payloads.
fn stored_sources(effects: &[Effect]) -> Vec<MsgId> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::StoreBody { payload, .. } => std::str::from_utf8(payload).ok()?.parse().ok(),
            _ => None,
        })
        .collect()
}

fn forward_from(replica: &QueueMachine, now_ms: u64) -> QueueCommand {
    let held: Vec<MsgId> = replica
        .held_dead_letters()
        .take(3)
        .map(|(id, _)| id)
        .collect();
    dl(now_ms, SOURCE, replica.dead_letter_floor(), &held)
}

fn run_protocol(steps: Vec<Step>) -> Result<(), TestCaseError> {
    let mut source = QueueMachine::new(alo());
    let mut target = QueueMachine::new(QueueConfig::default());
    source.apply(QueueCommand::Subscribe {
        now_ms: 0,
        consumer: CONSUMER,
        spec: ConsumerSpec::default(),
    });
    // Every state the source's log went through (replicas lag behind).
    let mut history: Vec<QueueMachine> = vec![source.clone()];
    let mut forwards: Vec<Forward> = Vec::new();
    let mut in_target: BTreeMap<MsgId, u32> = BTreeMap::new();
    let mut ever_held: BTreeSet<MsgId> = BTreeSet::new();
    let mut now = 1;
    let to_source = |source: &mut QueueMachine, cmd, history: &mut Vec<QueueMachine>| {
        let (_, e) = source.apply(cmd);
        history.push(source.clone());
        e
    };
    let store = |effects: &[Effect], in_target: &mut BTreeMap<MsgId, u32>| {
        for id in stored_sources(effects) {
            *in_target.entry(id).or_default() += 1;
        }
    };
    for s in steps {
        now += 1;
        match s {
            Step::Publish(n) => {
                let msgs = (0..n).map(|_| msg("m")).collect();
                to_source(
                    &mut source,
                    QueueCommand::Enqueue { now_ms: now, msgs },
                    &mut history,
                );
            }
            Step::Reject(picks) => {
                let out: Vec<MsgId> = source.checked_out(CONSUMER).collect();
                if out.is_empty() {
                    continue;
                }
                let ids = picks.iter().map(|p| out[p % out.len()]).collect();
                let e = to_source(
                    &mut source,
                    QueueCommand::Discard {
                        now_ms: now,
                        consumer: CONSUMER,
                        ids,
                    },
                    &mut history,
                );
                ever_held.extend(held(&e).into_iter().map(|(id, _)| id));
            }
            Step::Read(age) => {
                let replica = &history[history.len() - 1 - age.min(history.len() - 1)];
                forwards.push(Forward {
                    cmd: forward_from(replica, now),
                    accepted: None,
                });
            }
            Step::Deliver(i) => {
                let Some(f) = forwards.get_mut(i) else {
                    continue;
                };
                let (r, e) = target.apply(f.cmd.clone());
                store(&e, &mut in_target);
                let QueueCommand::EnqueueDeadLetters { msgs, .. } = &f.cmd else {
                    unreachable!("forwards are EnqueueDeadLetters")
                };
                let QueueReply::Enqueued(o) = r else {
                    return Err(TestCaseError::fail("not an enqueue reply"));
                };
                f.accepted = Some(
                    msgs.iter()
                        .zip(o)
                        .filter(|(_, o)| *o == EnqueueOutcome::Accepted)
                        .map(|((id, _), _)| *id)
                        .collect(),
                );
            }
            Step::Settle(i) => {
                let Some(ids) = forwards.get_mut(i).and_then(|f| f.accepted.take()) else {
                    continue;
                };
                to_source(
                    &mut source,
                    QueueCommand::DeadLetterSettled { now_ms: now, ids },
                    &mut history,
                );
            }
        }
        if let Some((id, n)) = in_target.iter().find(|(_, n)| **n > 1) {
            return Err(TestCaseError::fail(format!(
                "source message {id} enqueued {n} times"
            )));
        }
        prop_assert!(target.check_invariants().is_ok());
    }
    // A current leader's worker drains the rest: nothing was lost (every
    // dead letter is in the target once; none was answered Accepted unstored).
    while source.held_count() > 0 {
        now += 1;
        let cmd = forward_from(&source, now);
        let (r, e) = target.apply(cmd.clone());
        store(&e, &mut in_target);
        let QueueCommand::EnqueueDeadLetters { msgs, .. } = cmd else {
            unreachable!()
        };
        prop_assert!(
            matches!(&r, QueueReply::Enqueued(o) if o.iter().all(|o| *o == EnqueueOutcome::Accepted))
        );
        let ids = msgs.into_iter().map(|(id, _)| id).collect();
        source.apply(QueueCommand::DeadLetterSettled { now_ms: now, ids });
    }
    prop_assert!(in_target.values().all(|n| *n == 1));
    prop_assert_eq!(
        in_target.keys().copied().collect::<BTreeSet<_>>(),
        ever_held,
        "a dead letter is missing from the target"
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    /// Any interleaving of forwards from current and stale replicas, lost
    /// replies, late deliveries and settles: each dead letter is enqueued
    /// in the target exactly once.
    #[test]
    fn forwarded_dead_letters_are_enqueued_exactly_once(steps in prop::collection::vec(step(), 0..60)) {
        run_protocol(steps)?;
    }
}
