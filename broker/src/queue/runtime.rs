//! The leader-side runtime of one queue: carries out the machine's
//! leader-only effects — expiry timers (proposing `Tick`), queue TTL
//! deletion, and handing dead-lettered messages to the dead-letter module.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::mpsc::UnboundedReceiver;

use super::handle::QueueHandle;
use super::host::LeaderEffect;
use super::types::QueueCommand;
use crate::dead_letter;
use crate::node::Broker;

/// How often a queue with `x-expires` or held dead letters ticks (ms).
const IDLE_TICK_MS: u64 = 500;

/// Spawns the runtime task of `queue`.
pub fn spawn(
    broker: Weak<Broker>,
    queue: Arc<QueueHandle>,
    effects: UnboundedReceiver<LeaderEffect>,
) {
    tokio::spawn(run(broker, queue, effects));
}

async fn run(
    broker: Weak<Broker>,
    queue: Arc<QueueHandle>,
    mut effects: UnboundedReceiver<LeaderEffect>,
) {
    let mut next_tick: Option<u64> = None;
    let worker = dead_letter::worker::Worker::spawn(broker.clone(), queue.clone());
    let mut idle = tokio::time::interval(Duration::from_millis(IDLE_TICK_MS));
    loop {
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
                        if let Some(b) = broker.upgrade() {
                            tracing::info!(queue = %queue.name, "queue expired (x-expires), deleting");
                            let b2 = b.clone();
                            let (vhost, name) = (queue.vhost.clone(), queue.name.clone());
                            tokio::spawn(async move { let _ = b2.delete_queue(&vhost, &name).await; });
                        }
                    }
                    LeaderEffect::DeadLetter { id, reason, target, payload } => {
                        if let Some(b) = broker.upgrade() {
                            dead_letter::at_most_once::publish(&b, &queue, id, reason, &target, &payload).await;
                        }
                    }
                    LeaderEffect::DeadLetterHeld { .. } => worker.wake(),
                    LeaderEffect::PublishersBlocked(blocked) => {
                        tracing::debug!(queue = %queue.name, blocked, "reject-publish state changed");
                        if !blocked {
                            if let Some(b) = broker.upgrade() { b.topology_changed(); }
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
            _ = idle.tick() => {
                let wants_tick = queue.is_local_leader()
                    && queue
                        .read(|h| h.machine().config().expires_ms.is_some())
                        .unwrap_or(false);
                if wants_tick {
                    drop(queue.propose(QueueCommand::Tick { now_ms: crate::now_ms() }).await);
                }
                let closed = queue.context().closed.load(std::sync::atomic::Ordering::Acquire);
                if closed || broker.upgrade().map(|b| b.is_stopping()).unwrap_or(true) { break; }

            }
        }
    }
}
