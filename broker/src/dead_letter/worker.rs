//! The at-least-once dead-letter worker of one source queue (spec §5.4-5.5,
//! RabbitMQ's rabbit_fifo_dlx_worker). It runs beside the queue's leader,
//! forwards held messages to every routed target, waits until each target
//! has committed its enqueue (its Raft commit is the confirm), and only
//! then proposes `DeadLetterSettled` to the source. Each target
//! de-duplicates what it is sent by (source group, source message id)
//! (`QueueCommand::EnqueueDeadLetters`, `queue/dedup.rs`), so a message
//! forwarded again after a failover between the target's commit and the
//! source's settle is enqueued once. Anything that blocks a
//! message — no DLX, no route, a cycle, a target refusing with
//! reject-publish — keeps it held; retries are driven by node events
//! (topology changes, a queue unblocking) with a periodic fallback.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::Notify;

use super::at_most_once::{log_once, prepare};
use super::held::HoldReason;
use crate::queue::handle::QueueHandle;
use crate::queue::services::QueueServices;
use crate::queue::supervise::supervise;
use crate::queue::types::{
    DeadLetterStrategy, EnqueueMsg, EnqueueOutcome, MsgId, PrioritizedMsg, QueueCommand, QueueReply,
};

/// Held messages forwarded per round.
const ROUND: usize = 512;
/// Retry interval when nothing signals a change (ms). RabbitMQ: 180 000.
const FALLBACK_MS: u64 = 1000;
/// Longest a round waits to confirm it reads the leader's latest state
/// ([`reads_latest`]); then it waits for the next wake-up.
const READ_INDEX_FOR: Duration = Duration::from_secs(5);

/// Handle to a running worker; dropping it stops the task.
pub struct Worker {
    wake: Arc<Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl Worker {
    /// Starts the worker of `queue`.
    pub fn spawn(services: Weak<dyn QueueServices>, queue: Arc<QueueHandle>) -> Worker {
        let wake = Arc::new(Notify::new());
        let notify = wake.clone();
        let name = queue.name.clone();
        // Restarted if it panics: held dead letters must keep moving.
        let task = tokio::spawn(async move {
            supervise("dead-letter worker", &name, |_| {
                run(services.clone(), queue.clone(), notify.clone())
            })
            .await
        });
        Worker { wake, task }
    }

    /// New held messages arrived.
    pub fn wake(&self) {
        self.wake.notify_one();
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn run(services: Weak<dyn QueueServices>, queue: Arc<QueueHandle>, wake: Arc<Notify>) {
    let Some(mut events) = services.upgrade().map(|b| b.events()) else {
        return;
    };
    // Targets that already committed a copy, per held message: a retry
    // only goes to the others (no duplicates from partial rejections).
    let mut settled_targets: HashMap<MsgId, HashSet<u64>> = HashMap::new();
    let mut led = false;
    loop {
        events.borrow_and_update();
        let Some(b) = services.upgrade() else { return };
        if b.is_stopping() {
            return;
        }
        // The worker runs beside the leader only (spec §5.8); a new leader is
        // woken by the held messages it re-announces.
        let leads = queue.is_local_leader();
        if !leads {
            queue.held_reasons().clear();
        } else if !led {
            // What the worker sees first as it starts leading (its replica may
            // still be applying entries the old leader committed).
            if let Some((held, (floor, version), next_id)) = queue.read(|h| {
                let m = h.machine();
                (m.held_count(), m.dead_letter_floor(), m.next_msg_id())
            }) {
                if held > 0 {
                    tracing::info!(queue = %queue.name, held, floor, version, next_id, "dead-letter worker: leading");
                }
            }
        }
        led = leads;
        // A round with nothing held confirms no leadership (a heartbeat
        // round each time a burst ends would buy nothing).
        let progress = leads
            && holds_any(&queue)
            && reads_latest(&queue).await
            && forward_round(&*b, &queue, &mut settled_targets).await;
        drop(b);
        if progress {
            continue;
        }
        // Topology events and the fallback retry matter only while messages
        // are held: an idle queue's worker sleeps until woken.
        let holding = holds_any(&queue);
        tokio::select! {
            _ = wake.notified() => {}
            r = events.changed(), if holding => { if r.is_err() { return; } }
            _ = tokio::time::sleep(Duration::from_millis(FALLBACK_MS)), if holding => {}
        }
    }
}

/// True when this node's replica of `queue` holds at-least-once dead letters.
fn holds_any(queue: &QueueHandle) -> bool {
    queue
        .read(|h| h.machine().held_count() > 0)
        .unwrap_or(false)
}

/// True once this node's replica of `queue` may be read as the leader's
/// latest state: it still leads (a heartbeat round a quorum answered) and
/// has applied every entry committed before (a read index, Raft §6.4;
/// openraft `ensure_linearizable`). A queue without a replica (node-local)
/// always may.
///
/// Why: a round forwards the held dead letters it reads, with the source's
/// floor. A new leader still applying its predecessor's entries, or a
/// deposed leader resumed after a pause, would read dead letters the
/// source settled long ago. Their floor's older version makes the target
/// ignore it, and once the target's floor has dropped (a message with a
/// lower id was held since, e.g. one returned and then expired), those ids
/// are neither below it nor in the window any more: the target would
/// enqueue them again (issue 32 item 5's bursts of second copies, a new
/// leader of the source forwarding as held what its predecessor had
/// settled).
async fn reads_latest(queue: &QueueHandle) -> bool {
    let Some(route) = queue.route() else {
        return true;
    };
    let Some(raft) = route.local_leader() else {
        return false;
    };
    match tokio::time::timeout(READ_INDEX_FOR, raft.ensure_linearizable()).await {
        Ok(Ok(_)) => true,
        Ok(Err(e)) => {
            tracing::debug!(queue = %queue.name, error = %e, "dead-letter worker: not reading as the leader");
            false
        }
        Err(_) => false,
    }
}

/// One pass over the held messages; true if any was settled. Records why
/// each message it could not forward stays held ([`HoldReason`]).
async fn forward_round(
    services: &dyn QueueServices,
    queue: &QueueHandle,
    settled_targets: &mut HashMap<MsgId, HashSet<u64>>,
) -> bool {
    // One lock of the queue for the round: the held messages with their
    // bodies, and the floor the targets may forget below.
    let Some((held, config, (settled_below, floor_version))) = queue.read(|h| {
        let m = h.machine();
        let held: Vec<_> = m
            .held_dead_letters()
            .take(ROUND)
            .map(|(id, reason)| (id, reason, h.payload(id)))
            .collect();
        (held, m.config().clone(), m.dead_letter_floor())
    }) else {
        return false;
    };
    if held.is_empty() {
        settled_targets.clear();
        queue.held_reasons().clear();
        return false;
    }
    let mut holds: HashMap<MsgId, HoldReason> = HashMap::new();
    let (DeadLetterStrategy::AtLeastOnce, Some(target)) =
        (config.strategy, config.dead_letter.as_ref())
    else {
        if config.dead_letter.is_none() {
            holds.extend(held.iter().map(|(id, _, _)| (*id, HoldReason::NoDlx)));
        }
        queue.held_reasons().replace(holds);
        return false;
    };
    let now_ms = crate::now_ms();
    // One enqueue per target for the whole round (group id -> target, messages with their ids).
    type TargetBatch = (Arc<QueueHandle>, Vec<(MsgId, PrioritizedMsg)>);
    let mut batches: HashMap<u64, TargetBatch> = HashMap::new();
    let mut done: Vec<MsgId> = Vec::new();
    for (id, reason, payload) in held {
        let Some(payload) = payload else {
            holds.insert(id, HoldReason::TargetUnavailable);
            continue;
        };
        let Some((dl, targets, cycles)) = prepare(services, queue, reason, target, &payload) else {
            holds.insert(id, HoldReason::NoRoute);
            log_once(format!("nodlx:{}:{}", queue.name, target.exchange), || {
                format!("Cannot forward any dead-letter messages from source quorum queue '{}' because its configured dead-letter-exchange '{}' does not exist. This message will not be logged again.", queue.name, target.exchange)
            });
            continue;
        };
        let already = settled_targets.entry(id).or_default();
        let pending: Vec<Arc<QueueHandle>> = targets
            .into_iter()
            .filter(|t| !already.contains(&t.group))
            .collect();
        if pending.is_empty() {
            if already.is_empty() {
                let why = if cycles > 0 {
                    HoldReason::Cycle
                } else {
                    HoldReason::NoRoute
                };
                holds.insert(id, why);
                log_once(
                    format!("noroute:{}:{}", queue.name, target.exchange),
                    || {
                        format!("Cannot forward any dead-letter messages from source quorum queue '{}' with configured dead-letter-exchange '{}' and configured dead-letter-routing-key '{}'. This can happen either if the dead-letter routing topology is misconfigured or if all target queues reject messages. This message will not be logged again.", queue.name, target.exchange, target.routing_key.clone().unwrap_or_default())
                    },
                );
            } else {
                done.push(id);
            }
            continue;
        }
        let Ok(encoded) = dl.message.encode() else {
            holds.insert(id, HoldReason::TargetUnavailable);
            continue;
        };
        let body_size = dl.message.body.len() as u32;
        for t in pending {
            let msg = PrioritizedMsg {
                msg: EnqueueMsg {
                    payload: encoded.clone(),
                    body_size,
                    ttl_ms: None,
                },
                priority: t.message_priority(dl.priority),
            };
            let b = batches
                .entry(t.group)
                .or_insert_with(|| (t.clone(), Vec::new()));
            b.1.push((id, msg));
        }
    }
    let mut inflight = Vec::with_capacity(batches.len());
    for (group, (t, msgs)) in batches {
        let ids: Vec<MsgId> = msgs.iter().map(|(id, _)| *id).collect();
        let cmd = QueueCommand::EnqueueDeadLetters {
            now_ms,
            source: queue.group,
            settled_below,
            floor_version,
            msgs,
        };
        let rx = t.propose(cmd).await;
        inflight.push((group, ids, rx));
    }
    let mut all_ok: HashMap<MsgId, bool> = HashMap::new();
    for (group, ids, rx) in inflight {
        // Per-message outcomes, in the order the messages were sent; anything else fails all.
        let outcomes = match rx.await {
            Ok(Ok(QueueReply::Enqueued(o))) if o.len() == ids.len() => o,
            _ => Vec::new(),
        };
        for (i, id) in ids.into_iter().enumerate() {
            let outcome = outcomes.get(i);
            let ok = outcome == Some(&EnqueueOutcome::Accepted);
            if ok {
                settled_targets.entry(id).or_default().insert(group);
            } else {
                // A full target outranks an unavailable one: it is the one to act on.
                let why = if outcome == Some(&EnqueueOutcome::Rejected) {
                    HoldReason::TargetFull
                } else {
                    HoldReason::TargetUnavailable
                };
                let e = holds.entry(id).or_insert(why);
                *e = (*e).min(why);
            }
            *all_ok.entry(id).or_insert(true) &= ok;
        }
    }
    queue.held_reasons().replace(holds);
    done.extend(all_ok.into_iter().filter(|(_, ok)| *ok).map(|(id, _)| id));
    if done.is_empty() {
        return false;
    }
    done.sort_unstable();
    for id in &done {
        settled_targets.remove(id);
    }
    let n = done.len() as u64;
    match queue
        .call(QueueCommand::DeadLetterSettled {
            now_ms: crate::now_ms(),
            ids: done,
        })
        .await
    {
        Ok(_) => {
            crate::metrics::COUNTERS.dead_letters_confirmed(n);
            true
        }
        Err(e) => {
            tracing::warn!(queue = %queue.name, error = %e, "dead-letter settle failed; will resend");
            false
        }
    }
}
