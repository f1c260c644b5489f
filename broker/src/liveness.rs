//! Consumer liveness: the queues this node leads keep consumer records of
//! channels on every node, and a record whose node is gone would hold its
//! messages checked out forever. This sweep compares each led queue's
//! records with the failure detector and proposes what RabbitMQ's
//! `rabbit_fifo` applies on `noconnection` / `nodeup`:
//!
//! - a node seen down: `NodeDown` — its consumers are suspected (no pushes)
//!   and their checked-out messages return, counted, to live consumers;
//! - a node seen up (this node always is): `NodeUp` in its boot epoch —
//!   records of its earlier boots are down (their messages return), and its
//!   suspected consumers take pushes again.
//!
//! It runs on every detector change and every [`SWEEP_MS`], so a leader
//! elected after the change, or a proposal that found no leader, is caught
//! up by a later sweep; a command is not proposed again for the same queue
//! and node while the last one is in flight, nor within [`RETRY_MS`] of it.
//! Commands are idempotent: a repeat changes nothing.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use crate::cluster::detector::Liveness;
use crate::queue::registry::Queues;
use crate::queue::{QueueCommand, SeenNode};

/// Sweep interval when the detector reports no change (ms).
const SWEEP_MS: u64 = 2000;
/// The same queue and node get no second proposal within this long (ms).
const RETRY_MS: u64 = 2000;

/// Runs the sweep until the node's queues are gone or stopping.
pub async fn run(queues: Weak<Queues>) {
    let Some(mut changes) = queues.upgrade().map(|b| b.detector().subscribe()) else {
        return;
    };
    // (group, node) -> when its last command was proposed.
    let mut proposed: HashMap<(u64, u64), Instant> = HashMap::new();
    let inflight: Arc<Mutex<HashSet<(u64, u64)>>> = Arc::default();
    loop {
        tokio::select! {
            r = changes.changed() => if r.is_err() { return },
            _ = tokio::time::sleep(Duration::from_millis(SWEEP_MS)) => {}
        }
        let Some(b) = queues.upgrade() else { return };
        if b.is_stopping() {
            return;
        }
        let now = Instant::now();
        proposed.retain(|_, at| now.duration_since(*at) < Duration::from_millis(RETRY_MS));
        for h in b.queue_handles() {
            // A quorum queue's leader, or the home of a node-local queue
            // (whose consumers may be on other nodes too).
            if !(h.is_local_here() || h.is_quorum() && h.is_local_leader()) {
                continue;
            }
            let Some(nodes) = h.read(|host| host.machine().consumer_nodes()) else {
                continue;
            };
            for nc in nodes {
                let seen = match b.detector().liveness(nc.node) {
                    Liveness::Up { epoch } => SeenNode::Up { epoch },
                    Liveness::Down => SeenNode::Down,
                    Liveness::Unknown => SeenNode::Unknown,
                };
                let Some(cmd) = nc.command(seen, crate::now_ms()) else {
                    continue;
                };
                let key = (h.group, nc.node);
                if proposed.contains_key(&key) || !inflight.lock().is_ok_and(|mut f| f.insert(key))
                {
                    continue;
                }
                proposed.insert(key, now);
                tracing::info!(queue = %h.name, node = nc.node, ?seen, "consumers of a node that is down or restarted: {}",
                    if matches!(cmd, QueueCommand::NodeDown { .. }) { "suspending them, returning their messages" } else { "resuming them, dropping earlier boots" });
                let (h, inflight) = (h.clone(), inflight.clone());
                tokio::spawn(async move {
                    if let Err(e) = h.call(cmd).await {
                        tracing::debug!(queue = %h.name, error = %e, "consumer liveness command not applied; the next sweep retries");
                    }
                    if let Ok(mut f) = inflight.lock() {
                        f.remove(&key);
                    }
                });
            }
        }
    }
}
