//! At-most-once dead-lettering (spec §5.2): the leader rewrites the message
//! and enqueues it into the routed target queues without waiting; the
//! source has already dropped it. Missing DLX, no route or a cycle: the
//! message is gone, the queue keeps working.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;

use super::cycle::is_cycle;
use super::rewrite::{rewrite, DeadLettered};
use crate::message::TrackedMessage;
use crate::queue::handle::QueueHandle;
use crate::queue::services::QueueServices;
use crate::queue::types::{
    DeadLetterReason, DeadLetterTarget, EnqueueMsg, MsgId, PrioritizedMsg, QueueCommand,
};

/// Logs `text` the first time `key` is seen (RabbitMQ logs each cycle once).
pub fn log_once(key: String, text: impl FnOnce() -> String) {
    static SEEN: OnceLock<Mutex<HashSet<String>>> = OnceLock::new();
    let seen = SEEN.get_or_init(|| Mutex::new(HashSet::new()));
    if let Ok(mut s) = seen.lock() {
        if s.insert(key) {
            tracing::warn!("{}", text());
        }
    }
}

/// Rewrites and routes one dead-lettered message; returns the target
/// queues (cycles removed, spec §4), the message and how many routed
/// targets were removed as cycles, or None when the DLX does not exist.
pub fn prepare(
    services: &dyn QueueServices,
    source: &QueueHandle,
    reason: DeadLetterReason,
    target: &DeadLetterTarget,
    payload: &Bytes,
) -> Option<(DeadLettered, Vec<Arc<QueueHandle>>, usize)> {
    let msg = TrackedMessage::decode_bytes(payload).ok()?;
    let dl = rewrite(&msg, &source.name, reason, target, crate::now_ms() / 1000);
    let routed = services
        .route(
            &source.vhost,
            &target.exchange,
            &dl.routing_keys,
            Some(&dl.headers),
        )
        .ok()?;
    let (cycling, targets): (Vec<_>, Vec<_>) = routed
        .into_iter()
        .partition(|q| is_cycle(&dl.deaths, &q.name));
    if !cycling.is_empty() {
        let queues: Vec<String> = dl.deaths.iter().map(|d| d.queue.clone()).collect();
        log_once(format!("cycle:{}:{:?}", source.name, queues), || {
            format!("Message dropped because the following list of queues (ordered by death recency) contains a dead letter cycle without reason 'rejected'. This list will not be logged again: {queues:?}")
        });
    }
    let cycles = cycling.len();
    Some((dl, targets, cycles))
}

/// Publishes message `id` of `source`, dead-lettered for `reason`.
pub async fn publish(
    services: &dyn QueueServices,
    source: &QueueHandle,
    id: MsgId,
    reason: DeadLetterReason,
    target: &DeadLetterTarget,
    payload: &Bytes,
) {
    let Some((mut dl, mut targets, _)) = prepare(services, source, reason, target, payload) else {
        tracing::debug!(queue = %source.name, id, "dead-letter exchange missing; message dropped");
        return;
    };
    // A target this node has not opened yet is opened now, then routed to.
    if targets.is_empty()
        && services
            .open_routed(
                &source.vhost,
                &target.exchange,
                &dl.routing_keys,
                Some(&dl.headers),
            )
            .await
    {
        if let Some((d, t, _)) = prepare(services, source, reason, target, payload) {
            (dl, targets) = (d, t);
        }
    }
    let Ok(encoded) = dl.message.encode() else {
        return;
    };
    let body_size = dl.message.body.len() as u32;
    let now_ms = crate::now_ms();
    for q in targets {
        let msg = PrioritizedMsg {
            msg: EnqueueMsg {
                payload: encoded.clone(),
                body_size,
                ttl_ms: None,
            },
            priority: q.message_priority(dl.priority),
        };
        drop(q.propose(QueueCommand::enqueue(now_ms, vec![msg])).await);
    }
}
