//! Builders and effect filters shared by the unit tests.

use bytes::Bytes;

use super::super::machine::QueueMachine;
use super::super::types::*;

/// Consumer `seq` on node 1, epoch 1.
pub fn cid(seq: u32) -> ConsumerId {
    ConsumerId {
        node: 1,
        epoch: 1,
        seq,
    }
}

/// A message whose payload is `body` (body_size = its length), no TTL.
pub fn msg(body: &str) -> EnqueueMsg {
    EnqueueMsg {
        payload: Bytes::copy_from_slice(body.as_bytes()),
        body_size: body.len() as u32,
        ttl_ms: None,
    }
}

/// A message with a per-message TTL in ms.
pub fn msg_ttl(body: &str, ttl_ms: u64) -> EnqueueMsg {
    EnqueueMsg {
        ttl_ms: Some(ttl_ms),
        ..msg(body)
    }
}

/// A message of `size` body bytes.
pub fn sized(size: u32) -> EnqueueMsg {
    EnqueueMsg {
        payload: Bytes::from(vec![b'x'; size as usize]),
        body_size: size,
        ttl_ms: None,
    }
}

/// The dead-letter target used by the tests.
pub fn target() -> DeadLetterTarget {
    DeadLetterTarget {
        exchange: "dlx".into(),
        routing_key: Some("dead".into()),
    }
}

/// At-most-once dead-lettering to `target()`.
pub fn amo() -> QueueConfig {
    QueueConfig {
        dead_letter: Some(target()),
        ..QueueConfig::default()
    }
}

/// At-least-once dead-lettering (needs reject-publish).
pub fn alo() -> QueueConfig {
    QueueConfig {
        dead_letter: Some(target()),
        strategy: DeadLetterStrategy::AtLeastOnce,
        overflow: Overflow::RejectPublish,
        ..QueueConfig::default()
    }
}

/// Apply and check the invariants.
pub fn run(q: &mut QueueMachine, cmd: QueueCommand) -> (QueueReply, Vec<Effect>) {
    let out = q.apply(cmd);
    if let Err(e) = q.check_invariants() {
        panic!("invariant broken: {e}");
    }
    out
}

/// Enqueue messages at `now`; returns the outcomes and the effects.
pub fn enqueue(
    q: &mut QueueMachine,
    now_ms: u64,
    msgs: Vec<EnqueueMsg>,
) -> (Vec<EnqueueOutcome>, Vec<Effect>) {
    match run(q, QueueCommand::Enqueue { now_ms, msgs }) {
        (QueueReply::Enqueued(o), e) => (o, e),
        (other, _) => panic!("unexpected reply {other:?}"),
    }
}

/// Enqueue `n` small messages at `now`, all expected accepted.
pub fn enqueue_n(q: &mut QueueMachine, now_ms: u64, n: usize) -> Vec<Effect> {
    let (o, e) = enqueue(q, now_ms, (0..n).map(|i| msg(&format!("m{i}"))).collect());
    assert!(o.iter().all(|x| *x == EnqueueOutcome::Accepted));
    e
}

/// Attach a consumer.
pub fn checkout(q: &mut QueueMachine, now_ms: u64, c: ConsumerId, prefetch: u32) -> Vec<Effect> {
    run(
        q,
        QueueCommand::Checkout {
            now_ms,
            consumer: c,
            prefetch,
            no_ack: false,
        },
    )
    .1
}

/// Settle ids for a consumer.
pub fn settle(q: &mut QueueMachine, now_ms: u64, c: ConsumerId, ids: &[MsgId]) -> Vec<Effect> {
    run(
        q,
        QueueCommand::Settle {
            now_ms,
            consumer: c,
            ids: ids.to_vec(),
        },
    )
    .1
}

/// Return ids for a consumer.
pub fn ret(q: &mut QueueMachine, now_ms: u64, c: ConsumerId, ids: &[MsgId]) -> Vec<Effect> {
    run(
        q,
        QueueCommand::Return {
            now_ms,
            consumer: c,
            ids: ids.to_vec(),
        },
    )
    .1
}

/// Discard ids for a consumer.
pub fn discard(q: &mut QueueMachine, now_ms: u64, c: ConsumerId, ids: &[MsgId]) -> Vec<Effect> {
    run(
        q,
        QueueCommand::Discard {
            now_ms,
            consumer: c,
            ids: ids.to_vec(),
        },
    )
    .1
}

/// basic.get; returns the reply payload and the effects.
pub fn get(
    q: &mut QueueMachine,
    now_ms: u64,
    c: ConsumerId,
    no_ack: bool,
) -> (Option<(Delivery, u64)>, Vec<Effect>) {
    match run(
        q,
        QueueCommand::Dequeue {
            now_ms,
            consumer: c,
            no_ack,
        },
    ) {
        (QueueReply::Dequeued(d), e) => (d, e),
        (other, _) => panic!("unexpected reply {other:?}"),
    }
}

/// basic.cancel of consumer `c`.
pub fn cancel(q: &mut QueueMachine, now_ms: u64, c: ConsumerId) -> Vec<Effect> {
    run(
        q,
        QueueCommand::Cancel {
            now_ms,
            consumer: c,
        },
    )
    .1
}

/// Consumer `c`'s channel or connection went away.
pub fn down(q: &mut QueueMachine, now_ms: u64, c: ConsumerId) -> Vec<Effect> {
    run(
        q,
        QueueCommand::ConsumerDown {
            now_ms,
            consumer: c,
        },
    )
    .1
}

/// Consumers of every Deliver, in order.
pub fn delivered_to(effects: &[Effect]) -> Vec<ConsumerId> {
    delivered(effects).into_iter().map(|(c, _, _)| c).collect()
}

/// A tick at `now`.
pub fn tick(q: &mut QueueMachine, now_ms: u64) -> Vec<Effect> {
    run(q, QueueCommand::Tick { now_ms }).1
}

/// Replace the configuration.
pub fn update(q: &mut QueueMachine, now_ms: u64, config: QueueConfig) -> Vec<Effect> {
    run(q, QueueCommand::Configure { now_ms, config }).1
}

/// `(consumer, id, delivery_count)` of every Deliver, in order.
pub fn delivered(effects: &[Effect]) -> Vec<(ConsumerId, MsgId, u32)> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Deliver { consumer, delivery } => {
                Some((*consumer, delivery.id, delivery.delivery_count))
            }
            _ => None,
        })
        .collect()
}

/// Ids of every Deliver, in order.
pub fn delivered_ids(effects: &[Effect]) -> Vec<MsgId> {
    delivered(effects)
        .into_iter()
        .map(|(_, id, _)| id)
        .collect()
}

/// Ids of every DropBody, in order.
pub fn dropped(effects: &[Effect]) -> Vec<MsgId> {
    effects
        .iter()
        .filter_map(|e| {
            if let Effect::DropBody { id } = e {
                Some(*id)
            } else {
                None
            }
        })
        .collect()
}

/// Ids of every StoreBody, in order.
pub fn stored(effects: &[Effect]) -> Vec<MsgId> {
    effects
        .iter()
        .filter_map(|e| {
            if let Effect::StoreBody { id, .. } = e {
                Some(*id)
            } else {
                None
            }
        })
        .collect()
}

/// `(id, reason)` of every at-most-once DeadLetter, in order (target checked = `target()`).
pub fn dead_lettered(effects: &[Effect]) -> Vec<(MsgId, DeadLetterReason)> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::DeadLetter {
                id,
                reason,
                target: t,
            } => {
                assert_eq!(*t, target());
                Some((*id, *reason))
            }
            _ => None,
        })
        .collect()
}

/// `(id, reason)` of every DeadLetterHeld, in order.
pub fn held(effects: &[Effect]) -> Vec<(MsgId, DeadLetterReason)> {
    effects
        .iter()
        .filter_map(|e| {
            if let Effect::DeadLetterHeld { id, reason } = e {
                Some((*id, *reason))
            } else {
                None
            }
        })
        .collect()
}

/// Every PublishersBlocked value, in order.
pub fn blocked(effects: &[Effect]) -> Vec<bool> {
    effects
        .iter()
        .filter_map(|e| {
            if let Effect::PublishersBlocked(b) = e {
                Some(*b)
            } else {
                None
            }
        })
        .collect()
}

/// Every ExpiryTimer, in order.
pub fn timers(effects: &[Effect]) -> Vec<u64> {
    effects
        .iter()
        .filter_map(|e| {
            if let Effect::ExpiryTimer { at_ms } = e {
                Some(*at_ms)
            } else {
                None
            }
        })
        .collect()
}

/// True if the effects contain QueueExpired.
pub fn queue_expired(effects: &[Effect]) -> bool {
    effects.contains(&Effect::QueueExpired)
}

/// Held dead letters of the machine as a vector.
pub fn held_list(q: &QueueMachine) -> Vec<(MsgId, DeadLetterReason)> {
    q.held_dead_letters().collect()
}
