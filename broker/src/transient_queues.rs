//! A down node's transient queues are deleted, as RabbitMQ's
//! `rabbit_amqqueue:on_node_down` deletes them: a node-local queue that is
//! not durable (every exclusive queue is one) lives only in its home node's
//! memory, so it is gone with that node. Until its record goes, clients of
//! the other nodes could not declare the name again (an RPC client that
//! reconnects elsewhere and re-declares its fixed-name exclusive reply
//! queue got 405 RESOURCE_LOCKED), and their commands to it waited for the
//! node's return.
//!
//! The meta leader deletes such a record once the failure detector has seen
//! its home node down with its stream closed for [`CLOSED_FOR_MS`] (killed,
//! stopped, restarting; RabbitMQ's `nodedown` comes at once when the node's
//! connection closes, but a beat stream that breaks and reconnects under
//! load must not take a live node's queues), or silent for
//! [`SILENT_FOR_MS`] (paused or cut off: RabbitMQ's default `net_ticktime`
//! before it takes a node for down). A home node that
//! comes back drops what it still has of them when it applies the
//! deletion; a restarted one drops its earlier boot's local queues itself
//! (`Queues::drop_own_local_queues`). Durable node-local queues (durable
//! auto-delete ones) stay, as RabbitMQ keeps a down node's durable classic
//! queues for its return.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use crate::cluster::detector::Detector;
use crate::meta::queue::{QueueKind, QueueRecord};
use crate::queue::registry::Queues;

/// A home node down with its stream closed this long (ms) is taken for
/// gone (a killed node's last beat is this old).
pub const CLOSED_FOR_MS: u64 = 5_000;
/// A home node silent this long (ms) while its stream stays open (paused,
/// partitioned) is taken for gone: RabbitMQ's default `net_ticktime`.
pub const SILENT_FOR_MS: u64 = 60_000;
/// Sweep interval when the detector reports no change (ms).
const SWEEP_MS: u64 = 1000;
/// The same record gets no second deletion within this long (ms).
const RETRY_MS: u64 = 5000;

/// Runs the sweep until the node's queues are gone or stopping: on every
/// detector change and every [`SWEEP_MS`], on the meta leader only, deletes
/// the records of transient queues whose home node is gone.
pub async fn run(queues: Weak<Queues>) {
    let Some(mut changes) = queues.upgrade().map(|q| q.detector().subscribe()) else {
        return;
    };
    // Group id of each record deleted lately -> when.
    let mut deleted: HashMap<u64, Instant> = HashMap::new();
    loop {
        tokio::select! {
            r = changes.changed() => if r.is_err() { return },
            _ = tokio::time::sleep(Duration::from_millis(SWEEP_MS)) => {}
        }
        let Some(q) = queues.upgrade() else { return };
        if q.is_stopping() {
            return;
        }
        let me = q.node_id();
        let leads = q.meta().raft().metrics().borrow().current_leader == Some(me);
        if !leads {
            continue;
        }
        deleted.retain(|_, at| at.elapsed() < Duration::from_millis(RETRY_MS));
        let detector = q.detector().clone();
        let gone: Vec<QueueRecord> = q
            .meta()
            .with_topology(|t| {
                t.queues()
                    .filter(|r| !deleted.contains_key(&r.group_id))
                    .filter(|r| home_is_gone(r, me, |n| home(&detector, n)))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        for rec in gone {
            deleted.insert(rec.group_id, Instant::now());
            delete(&q, &rec).await;
        }
    }
}

/// What the failure detector says of a queue's home node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Home {
    /// Up, or not known to be down.
    Up,
    /// Down with its stream closed (killed, stopped, restarting), its last
    /// beat this long ago (ms).
    Closed { for_ms: u64 },
    /// Down because its beats stopped this long ago (ms), its stream open.
    Silent { for_ms: u64 },
}

/// The detector's view of `node` as a [`Home`].
fn home(detector: &Detector, node: u64) -> Home {
    let for_ms = detector.last_seen_ms(node).unwrap_or(0);
    if detector.is_down(node) {
        Home::Closed { for_ms }
    } else if detector.is_silent(node) {
        Home::Silent { for_ms }
    } else {
        Home::Up
    }
}

/// Whether `rec` is a transient queue of a node other than `me` that is
/// gone by `home_of` (see the module docs).
fn home_is_gone(rec: &QueueRecord, me: u64, home_of: impl Fn(u64) -> Home) -> bool {
    let QueueKind::Local { node } = rec.kind else {
        return false;
    };
    if rec.durable || node == me {
        return false;
    }
    match home_of(node) {
        Home::Up => false,
        Home::Closed { for_ms } => for_ms >= CLOSED_FOR_MS,
        Home::Silent { for_ms } => for_ms >= SILENT_FOR_MS,
    }
}

/// Deletes `rec`'s queue if the record of that name is still this
/// incarnation (a queue declared again under the name meanwhile stays).
async fn delete(q: &Arc<Queues>, rec: &QueueRecord) {
    let current = q
        .meta()
        .with_topology(|t| t.queue(&rec.vhost, &rec.name).map(|r| r.group_id))
        .flatten();
    if current != Some(rec.group_id) {
        return;
    }
    let QueueKind::Local { node } = rec.kind else {
        return;
    };
    tracing::info!(queue = %rec.name, vhost = %rec.vhost, node, "home node down: its transient queue is deleted (RabbitMQ on_node_down)");
    if let Err(e) = q.delete_queue(&rec.vhost, &rec.name).await {
        tracing::warn!(queue = %rec.name, error = ?e, "deleting a down node's transient queue failed; the next sweep retries");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::queue::QueueKind;

    fn record(kind: QueueKind, durable: bool) -> QueueRecord {
        QueueRecord {
            vhost: "/".into(),
            name: "q".into(),
            durable,
            exclusive_owner: None,
            auto_delete: false,
            arguments: Default::default(),
            kind,
            group_id: 7,
            members: vec![2],
        }
    }

    /// Only a non-durable local queue of another node, whose home is closed
    /// for [`CLOSED_FOR_MS`] or silent for [`SILENT_FOR_MS`], is gone
    /// (RabbitMQ `on_node_down`).
    #[test]
    fn only_a_gone_nodes_transient_queues_are_gone() {
        let local2 = record(QueueKind::Local { node: 2 }, false);
        let silent = |ms| move |_| Home::Silent { for_ms: ms };
        let closed = |ms| move |_| Home::Closed { for_ms: ms };
        assert!(home_is_gone(&local2, 1, closed(CLOSED_FOR_MS)));
        assert!(
            !home_is_gone(&local2, 1, closed(CLOSED_FOR_MS - 1)),
            "a beat stream that broke a moment ago may reconnect"
        );
        assert!(!home_is_gone(&local2, 1, |_| Home::Up));
        assert!(!home_is_gone(&local2, 1, silent(SILENT_FOR_MS - 1)));
        assert!(home_is_gone(&local2, 1, silent(SILENT_FOR_MS)));
        assert!(
            !home_is_gone(&local2, 2, closed(CLOSED_FOR_MS)),
            "a node's own queues are its own business"
        );
        let durable = record(QueueKind::Local { node: 2 }, true);
        assert!(
            !home_is_gone(&durable, 1, closed(CLOSED_FOR_MS)),
            "a durable local queue waits for its node"
        );
        let quorum = record(QueueKind::Quorum, false);
        assert!(
            !home_is_gone(&quorum, 1, closed(CLOSED_FOR_MS)),
            "a quorum queue has other replicas"
        );
    }
}
