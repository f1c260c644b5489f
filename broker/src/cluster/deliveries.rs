//! Deliveries from a queue leader to consumers attached on other nodes: one
//! outbox and one sender task per peer node, deliveries batched per `Deliver`
//! call in the order the leader made them. A failed call is retried (the
//! deliveries are checked out to those consumers and would otherwise be
//! stuck) until it succeeds or the peer restarted (its consumers are gone;
//! the queue returns their messages on `NodeRestarted`). Before each retry,
//! and before the calls queued behind a call that needed one,
//! deliveries this node's replica no longer has checked out to their
//! consumer with the same delivery count are dropped: the leader returned
//! them (its failure detector took the consumer's node for down, `NodeDown`)
//! and delivered them again, or they were settled. Sent after a partition
//! heals, such a late original reached the consumer as a second copy not
//! flagged redelivered (the fault suite: ~20 per partition, one prefetch).
//!
//! Calls are idempotent: each carries its outbox (random per sender task)
//! and a number growing by one per call, and the receiver ([`SeenCalls`])
//! drops a call at or below the last number it took from that outbox. A
//! call that arrived but whose reply was lost, sent again, therefore
//! delivers nothing twice (the fault suite's seed 233802 saw one message
//! twice in one millisecond on one consumer from exactly that).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::Bytes;
use quorumq_proto::v1::cluster_client::ClusterClient;
use quorumq_proto::v1::{DeliverChunk, DeliverRequest};
use tokio::sync::mpsc;

use super::detector::Detector;
use super::groups::GroupTable;
use super::peers::{Peers, MAX_MESSAGE_BYTES};
use crate::consumers::QueueDelivery;
use crate::queue::types::ConsumerId;

/// Most deliveries per `Deliver` call.
const BATCH: usize = 512;
/// A Deliver call of this many bytes or more is streamed in chunks of this size
/// (`DeliverStream`), as appends are (cluster/transport.rs).
const STREAM_BYTES: usize = 1 << 20;
/// The slowest transfer a Deliver call is given time for, in bytes per second: a 100 MiB body
/// gets 105 s (on a debug build at load average 10, 10 MB/s was not enough).
const MIN_BYTES_PER_S: u64 = 1 << 20;

/// What goes to a peer's consumers, in the order the leaders made it.
#[derive(Debug)]
enum Outgoing {
    Delivery(QueueDelivery),
    /// A queue (`group`) timed the consumer out (consumer timeout, ms).
    TimedOut {
        group: u64,
        consumer: ConsumerId,
        timeout_ms: u64,
    },
}

impl Outgoing {
    fn consumer(&self) -> ConsumerId {
        match self {
            Outgoing::Delivery(d) => d.consumer,
            Outgoing::TimedOut { consumer, .. } => *consumer,
        }
    }
}

/// The per-peer outboxes.
pub struct RemoteDeliveries {
    peers: Arc<Peers>,
    detector: Arc<Detector>,
    /// This node's replicas: which retried deliveries are still due.
    groups: Arc<GroupTable>,
    outboxes: Mutex<HashMap<u64, mpsc::UnboundedSender<Outgoing>>>,
}

impl RemoteDeliveries {
    /// Outboxes over the shared peer channels; `groups` are this node's
    /// replicas (a retried delivery goes only while still due in them).
    pub fn new(peers: Arc<Peers>, detector: Arc<Detector>, groups: Arc<GroupTable>) -> Arc<Self> {
        Arc::new(RemoteDeliveries {
            peers,
            detector,
            groups,
            outboxes: Mutex::new(HashMap::new()),
        })
    }

    /// Queues `d` for its consumer's node (`d.consumer.node`).
    pub fn send(self: &Arc<Self>, d: QueueDelivery) {
        self.push(Outgoing::Delivery(d));
    }

    /// Tells `consumer`'s node that queue `group` timed it out, after the
    /// deliveries queued for that node before.
    pub fn send_timed_out(self: &Arc<Self>, group: u64, consumer: ConsumerId, timeout_ms: u64) {
        self.push(Outgoing::TimedOut {
            group,
            consumer,
            timeout_ms,
        });
    }

    /// Whether delivery `d` of queue `group` to `consumer` is still due:
    /// this node's replica has the message checked out to that consumer
    /// with the delivery's count (true without a local replica).
    fn still_due(
        &self,
        group: u64,
        consumer: ConsumerId,
        d: &crate::queue::types::Delivery,
    ) -> bool {
        self.groups
            .get(group)
            .is_none_or(|r| r.delivery_due(consumer, d.id, d.delivery_count))
    }

    /// Drops from `wire` (a call to `node`) the deliveries no longer due
    /// ([`RemoteDeliveries::still_due`]); true if it dropped any.
    fn keep_due(
        &self,
        node: u64,
        wire: &mut Vec<(u64, ConsumerId, crate::queue::types::Delivery)>,
    ) -> bool {
        let before = wire.len();
        wire.retain(|(group, consumer, d)| self.still_due(*group, *consumer, d));
        let dropped = before - wire.len();
        if dropped > 0 {
            tracing::debug!(target: "deliveries", node, dropped, "dropped: no longer checked out to their consumer (returned or settled)");
        }
        dropped > 0
    }

    fn push(self: &Arc<Self>, d: Outgoing) {
        let node = d.consumer().node;
        let Ok(mut o) = self.outboxes.lock() else {
            return;
        };
        let d = match o.get(&node) {
            Some(tx) => match tx.send(d) {
                Ok(()) => return,
                Err(mpsc::error::SendError(d)) => d,
            },
            None => d,
        };
        // No outbox yet, or its task ended: start one.
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(Arc::downgrade(self), node, rx));
        let _ = tx.send(d);
        o.insert(node, tx);
    }
}

async fn run(owner: Weak<RemoteDeliveries>, node: u64, mut rx: mpsc::UnboundedReceiver<Outgoing>) {
    let mut batch: Vec<Outgoing> = Vec::with_capacity(BATCH);
    // Never 0 (0 is "no de-duplication" for the receiver).
    let outbox = rand::random::<u64>() | 1;
    let mut call = 0u64;
    // The previous call failed at least once: deliveries queued meanwhile may
    // have been returned, so the next call sends only what is still due.
    let mut after_failure = false;
    while let Some(first) = rx.recv().await {
        call += 1;
        batch.push(first);
        // A timeout ends a batch: the receiver handles deliveries first.
        while batch.len() < BATCH && !matches!(batch.last(), Some(Outgoing::TimedOut { .. })) {
            match rx.try_recv() {
                Ok(d) => batch.push(d),
                Err(_) => break,
            }
        }
        let mut wire = Vec::new();
        let mut timed_out = Vec::new();
        for d in batch.drain(..) {
            match d {
                Outgoing::Delivery(d) => wire.push((d.group, d.consumer, d.delivery)),
                Outgoing::TimedOut {
                    group,
                    consumer,
                    timeout_ms,
                } => timed_out.push((group, consumer, timeout_ms)),
            }
        }
        if after_failure {
            if let Some(me) = owner.upgrade() {
                me.keep_due(node, &mut wire);
            }
            if wire.is_empty() && timed_out.is_empty() {
                continue;
            }
        }
        let first_consumer = wire
            .first()
            .map(|(_, c, _)| *c)
            .or(timed_out.first().map(|(_, c, _)| *c));
        let (Some(mut encoded), Ok(timed_out_bytes)) = (
            Encoded::of(&wire),
            raft_log::codec::encode(&timed_out).map(Bytes::from),
        ) else {
            continue;
        };
        let timed_out_bytes = if timed_out.is_empty() {
            Bytes::new()
        } else {
            timed_out_bytes
        };
        // Nodes older than DeliverStream answer it UNIMPLEMENTED: then one unary call.
        let mut unary_only = false;
        let mut tries = 0u32;
        after_failure = true;
        loop {
            let Some(me) = owner.upgrade() else { return };
            // Consumers of an earlier boot of that node are gone.
            if let (Some(now), Some(c)) = (me.detector.epoch_of(node), first_consumer) {
                if c.epoch < now {
                    tracing::debug!(target: "deliveries", node, n = wire.len(), "dropped: consumers of an earlier boot");
                    break;
                }
            }
            let Some(ch) = me.peers.channel(node) else {
                tracing::debug!(target: "deliveries", node, n = wire.len(), "dropped: no address");
                break;
            };
            let mut client = ClusterClient::new(ch).max_encoding_message_size(MAX_MESSAGE_BYTES);
            let from_node = me.peers.me();
            drop(me);
            let (len, streamed) = (encoded.len, encoded.streamed);
            let (bytes, chunks) = (&encoded.bytes, &encoded.chunks);
            let call = async {
                if streamed && !unary_only {
                    let head = DeliverChunk {
                        from_node,
                        timed_out: timed_out_bytes.clone(),
                        outbox,
                        batch: call,
                        total_bytes: len as u64,
                        data: Bytes::new(),
                    };
                    let rest: Vec<DeliverChunk> = chunks
                        .iter()
                        .map(|data| DeliverChunk {
                            data: data.clone(),
                            ..Default::default()
                        })
                        .collect();
                    let stream = futures::stream::iter(std::iter::once(head).chain(rest));
                    client.deliver_stream(stream).await
                } else {
                    let deliveries = if streamed {
                        chunks.concat().into()
                    } else {
                        bytes.clone()
                    };
                    client
                        .deliver(DeliverRequest {
                            deliveries,
                            from_node,
                            timed_out: timed_out_bytes.clone(),
                            outbox,
                            batch: call,
                        })
                        .await
                }
            };
            // A big call takes its time on the wire: 5 s plus its bytes at MIN_BYTES_PER_S
            // (a call given up is sent again whole).
            let limit =
                Duration::from_secs(5) + Duration::from_millis(len as u64 * 1000 / MIN_BYTES_PER_S);
            match tokio::time::timeout(limit, call).await {
                Ok(Ok(_)) => {
                    tracing::debug!(target: "deliveries", node, n = wire.len(), "delivered to remote consumers");
                    after_failure = tries > 0;
                    break;
                }
                Ok(Err(status)) if status.code() == tonic::Code::Unimplemented && !unary_only => {
                    tracing::info!(
                        node,
                        "peer without DeliverStream (an older node): big deliveries go unary"
                    );
                    unary_only = true;
                }
                r => {
                    tries += 1;
                    if tries == 1 || tries.is_multiple_of(50) {
                        tracing::warn!(node, tries, error = ?r.err().map(|_| "timeout"), "delivery to remote consumers failed; retrying");
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    let Some(me) = owner.upgrade() else { return };
                    if me.keep_due(node, &mut wire) {
                        if wire.is_empty() && timed_out.is_empty() {
                            break;
                        }
                        match Encoded::of(&wire) {
                            Some(e) => encoded = e,
                            None => break,
                        }
                    }
                }
            }
        }
    }
}

/// A `Deliver` call's deliveries, encoded. Big bodies stay slices of the
/// queue's own buffers ([`raft_log::codec::encode_rope`]); a call of
/// [`STREAM_BYTES`] or more goes out in chunks of that size.
struct Encoded {
    /// The whole call (unary), empty when streamed.
    bytes: Bytes,
    /// The call in chunks (streamed), empty when unary.
    chunks: Vec<Bytes>,
    /// Encoded length, bytes.
    len: usize,
    streamed: bool,
}

impl Encoded {
    /// None if the deliveries do not encode.
    fn of(wire: &[(u64, ConsumerId, crate::queue::types::Delivery)]) -> Option<Encoded> {
        let (pieces, len) = raft_log::codec::encode_rope(&wire).ok()?;
        let streamed = len >= STREAM_BYTES;
        let (bytes, chunks) = if streamed {
            (
                Bytes::new(),
                super::transport::rechunk(pieces, STREAM_BYTES),
            )
        } else {
            let one = match <[Bytes; 1]>::try_from(pieces) {
                Ok([one]) => one,
                Err(pieces) => pieces.concat().into(),
            };
            (one, Vec::new())
        };
        Some(Encoded {
            bytes,
            chunks,
            len,
            streamed,
        })
    }
}

/// Which `Deliver` calls a node has taken: per sender outbox, the highest
/// call number. Bounded: past [`SeenCalls::MAX_OUTBOXES`] outboxes the
/// oldest-numbered entries go (an outbox only lives as long as its sender
/// task, and a forgotten outbox only loses de-duplication, never a delivery).
#[derive(Debug, Default)]
pub struct SeenCalls {
    last: Mutex<Seen>,
}

/// Per (node, outbox): (highest call taken, use stamp); `stamp` counts calls taken.
#[derive(Debug, Default)]
struct Seen {
    calls: HashMap<(u64, u64), (u64, u64)>,
    stamp: u64,
}

impl SeenCalls {
    /// Outboxes remembered at most.
    pub const MAX_OUTBOXES: usize = 256;

    /// True when call `batch` of `outbox` on node `from` is new (and
    /// records it); false for a call at or below one taken before, which
    /// must not be delivered again. `outbox == 0` (older senders): always new.
    pub fn take(&self, from: u64, outbox: u64, batch: u64) -> bool {
        if outbox == 0 {
            return true;
        }
        let Ok(mut seen) = self.last.lock() else {
            return true;
        };
        seen.stamp += 1;
        let Seen { calls: last, stamp } = &mut *seen;
        let tick = *stamp;
        match last.get_mut(&(from, outbox)) {
            Some((seen, _)) if *seen >= batch => false,
            Some(entry) => {
                *entry = (batch, tick);
                true
            }
            None => {
                if last.len() >= Self::MAX_OUTBOXES {
                    if let Some(oldest) = last.iter().min_by_key(|(_, &(_, t))| t).map(|(k, _)| *k)
                    {
                        last.remove(&oldest);
                    }
                }
                last.insert((from, outbox), (batch, tick));
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::SeenCalls;

    #[test]
    fn a_call_taken_once_is_refused_again_and_older_calls_too() {
        let seen = SeenCalls::default();
        assert!(seen.take(3, 77, 1));
        assert!(!seen.take(3, 77, 1), "the same call sent again");
        assert!(seen.take(3, 77, 2));
        assert!(
            !seen.take(3, 77, 1),
            "a delayed first attempt of an older call"
        );
        assert!(seen.take(3, 78, 1), "another outbox of that node");
        assert!(seen.take(2, 77, 1), "another node");
        assert!(
            seen.take(3, 0, 5) && seen.take(3, 0, 5),
            "older senders: no de-duplication"
        );
    }

    #[test]
    fn outboxes_past_the_bound_forget_the_least_recently_used() {
        let seen = SeenCalls::default();
        for outbox in 1..=SeenCalls::MAX_OUTBOXES as u64 {
            assert!(seen.take(1, outbox, 1));
        }
        assert!(seen.take(1, 1, 2), "outbox 1 used again: now the newest");
        assert!(
            seen.take(1, 9999, 1),
            "one more outbox pushes out the least recently used (2)"
        );
        assert!(!seen.take(1, 1, 2), "outbox 1 is still remembered");
        assert!(
            seen.take(1, 2, 1),
            "outbox 2 was forgotten: its call counts as new"
        );
    }
}
