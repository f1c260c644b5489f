//! The leader-side runtime of one queue: carries out the machine's
//! leader-only effects — its one timer (proposing `Tick` when the head
//! expires or the earliest delayed-retry message is due), queue TTL
//! deletion, and handing dead-lettered messages to the dead-letter module.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::mpsc::UnboundedReceiver;

use super::handle::QueueHandle;
use super::host::LeaderEffect;
use super::services::QueueServices;
use super::supervise::supervise;
use super::types::QueueCommand;
use crate::dead_letter;

/// How often a queue with `x-expires` ticks (ms).
const IDLE_TICK_MS: u64 = 500;

/// Spawns the runtime task of `queue`.
/// Restarted if it panics ([`supervise`]); a restarted runtime ticks at once,
/// so the machine re-arms the expiry timer the panic lost.
pub fn spawn(
    services: Weak<dyn QueueServices>,
    queue: Arc<QueueHandle>,
    effects: UnboundedReceiver<LeaderEffect>,
) {
    let effects = Arc::new(tokio::sync::Mutex::new(effects));
    let name = queue.name.clone();
    tokio::spawn(async move {
        supervise("runtime", &name, |restarts| {
            let (services, queue, effects) = (services.clone(), queue.clone(), effects.clone());
            async move {
                let mut effects = effects.lock().await;
                run(services, queue, &mut effects, restarts > 0).await
            }
        })
        .await
    });
}

async fn run(
    services: Weak<dyn QueueServices>,
    queue: Arc<QueueHandle>,
    effects: &mut UnboundedReceiver<LeaderEffect>,
    restarted: bool,
) {
    let mut next_tick: Option<u64> = restarted.then(crate::now_ms);
    let worker = dead_letter::worker::Worker::spawn(services.clone(), queue.clone());
    let mut expires_check = tokio::time::interval(Duration::from_millis(IDLE_TICK_MS));
    loop {
        if queue.context().is_closed() || services.upgrade().is_none_or(|b| b.is_stopping()) {
            break;
        }
        // Only a queue with x-expires needs a periodic tick; an idle queue
        // otherwise sleeps until an effect or its close arrives.
        let has_expires = queue
            .read(|h| h.machine().config().expires_ms.is_some())
            .unwrap_or(false);
        let sleep_for =
            next_tick.map(|at| Duration::from_millis(at.saturating_sub(crate::now_ms())));
        tokio::select! {
            e = effects.recv() => {
                let Some(e) = e else { break };
                match e {
                    LeaderEffect::ExpiryTimer { at_ms } => {
                        next_tick = Some(next_tick.map_or(at_ms, |t| t.min(at_ms)));
                    }
                    LeaderEffect::QueueExpired => {
                        if let Some(b) = services.upgrade() {
                            tracing::info!(queue = %queue.name, "queue expired (x-expires), deleting");
                            let b2 = b.clone();
                            let (vhost, name) = (queue.vhost.clone(), queue.name.clone());
                            tokio::spawn(async move { let _ = b2.delete_queue(&vhost, &name).await; });
                        }
                    }
                    LeaderEffect::DeadLetter { id, reason, target, payload } => {
                        if let Some(b) = services.upgrade() {
                            dead_letter::at_most_once::publish(&*b, &queue, id, reason, &target, &payload).await;
                        }
                    }
                    LeaderEffect::DeadLetterHeld { .. } => worker.wake(),
                    LeaderEffect::PublishersBlocked(blocked) => {
                        tracing::debug!(queue = %queue.name, blocked, "reject-publish state changed");
                        if !blocked {
                            if let Some(b) = services.upgrade() { b.topology_changed(); }
                        }
                    }
                }
            }
            _ = async { match sleep_for { Some(d) => tokio::time::sleep(d).await, None => std::future::pending().await } } => {
                next_tick = None;
                // Only the leader ticks; a new leader re-arms its timer.
                if queue.is_local_leader() {
                    drop(queue.propose(QueueCommand::Tick { now_ms: crate::now_ms() }).await);
                }
            }
            _ = expires_check.tick(), if has_expires => {
                if queue.is_local_leader() {
                    drop(queue.propose(QueueCommand::Tick { now_ms: crate::now_ms() }).await);
                }
            }
            _ = queue.context().closing.notified() => {}
        }
    }
}
