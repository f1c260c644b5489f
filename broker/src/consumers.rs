//! Node-local table of consumers: where the queue leader sends a delivery.
//! A consumer id names (node, boot epoch, sequence); the channel that
//! registered it receives its deliveries on its connection's mailbox.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock, RwLock};

use tokio::sync::mpsc::UnboundedSender;

use crate::cluster::deliveries::RemoteDeliveries;
use crate::queue::types::{ConsumerId, Delivery};

/// A message for a consumer, as handed over by a queue leader.
#[derive(Debug, Clone)]
pub struct QueueDelivery {
    pub consumer: ConsumerId,
    /// Group id of the queue it comes from.
    pub group: u64,
    pub delivery: Delivery,
}

/// What a connection's mailbox receives, each naming the channel (the
/// connection's key for it, given at [`ConsumerRegistry::register`]) whose
/// consumer it is for.
#[derive(Debug)]
pub enum ConnEvent {
    /// A message for one of its consumers.
    Delivery {
        channel: u64,
        delivery: QueueDelivery,
    },
    /// The consumer's queue is gone: send basic.cancel to the client
    /// (RabbitMQ's consumer_cancel_notify).
    Cancelled { channel: u64, consumer: ConsumerId },
    /// The consumer held a delivery past its consumer timeout (`timeout_ms`):
    /// the queue took its messages back and removed it.
    TimedOut {
        channel: u64,
        consumer: ConsumerId,
        timeout_ms: u64,
    },
}

struct Entry {
    mailbox: UnboundedSender<ConnEvent>,
    group: u64,
    /// The connection's key of the consumer's channel.
    channel: u64,
}

/// Consumers attached on this node.
pub struct ConsumerRegistry {
    node: u64,
    epoch: u32,
    next_seq: AtomicU32,
    mailboxes: RwLock<HashMap<ConsumerId, Entry>>,
    /// Where deliveries for consumers on other nodes go.
    remote: OnceLock<Arc<RemoteDeliveries>>,
}

impl ConsumerRegistry {
    /// Registry of node `node` in boot `epoch`.
    pub fn new(node: u64, epoch: u32) -> Arc<Self> {
        Arc::new(ConsumerRegistry {
            node,
            epoch,
            next_seq: AtomicU32::new(1),
            mailboxes: RwLock::new(HashMap::new()),
            remote: OnceLock::new(),
        })
    }

    /// Routes deliveries for consumers of other nodes through `remote`.
    pub fn set_remote(&self, remote: Arc<RemoteDeliveries>) {
        let _ = self.remote.set(remote);
    }

    /// This node's id.
    pub fn node(&self) -> u64 {
        self.node
    }

    /// This node's boot epoch.
    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    /// A fresh consumer id of queue group `group`, delivering into `mailbox`
    /// with events naming `channel` (the connection's key of the channel).
    pub fn register(
        &self,
        mailbox: UnboundedSender<ConnEvent>,
        group: u64,
        channel: u64,
    ) -> ConsumerId {
        let id = ConsumerId {
            node: self.node,
            epoch: self.epoch,
            seq: self.next_seq.fetch_add(1, Ordering::Relaxed),
        };
        if let Ok(mut m) = self.mailboxes.write() {
            m.insert(
                id,
                Entry {
                    mailbox,
                    group,
                    channel,
                },
            );
        }
        id
    }

    /// Forgets a consumer; later deliveries to it are dropped (the queue
    /// returns them once it applies the matching `ConsumerDown`).
    pub fn unregister(&self, id: ConsumerId) {
        if let Ok(mut m) = self.mailboxes.write() {
            m.remove(&id);
        }
    }

    /// Hands a delivery to its consumer's connection (on another node: to
    /// that node's outbox); false if the local consumer is gone.
    pub fn deliver(&self, d: QueueDelivery) -> bool {
        if d.consumer.node != self.node {
            return match self.remote.get() {
                Some(r) => {
                    r.send(d);
                    true
                }
                None => false,
            };
        }
        let Ok(m) = self.mailboxes.read() else {
            return false;
        };
        match m.get(&d.consumer) {
            Some(e) => e
                .mailbox
                .send(ConnEvent::Delivery {
                    channel: e.channel,
                    delivery: d,
                })
                .is_ok(),
            None => false,
        }
    }

    /// A queue timed `consumer` out (`Effect::ConsumerTimedOut`): tell its
    /// channel (on another node: through that node's outbox). Dropped if
    /// the local consumer is gone (its channel already let it go).
    pub fn timed_out(&self, group: u64, consumer: ConsumerId, timeout_ms: u64) {
        if consumer.node != self.node {
            if let Some(r) = self.remote.get() {
                r.send_timed_out(group, consumer, timeout_ms);
            }
            return;
        }
        let Ok(m) = self.mailboxes.read() else {
            return;
        };
        if let Some(e) = m.get(&consumer) {
            let _ = e.mailbox.send(ConnEvent::TimedOut {
                channel: e.channel,
                consumer,
                timeout_ms,
            });
        }
    }

    /// The queue of `group` was deleted: tell every consumer of it.
    pub fn cancel_group(&self, group: u64) {
        let Ok(mut m) = self.mailboxes.write() else {
            return;
        };
        let ids: Vec<ConsumerId> = m
            .iter()
            .filter(|(_, e)| e.group == group)
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            if let Some(e) = m.remove(&id) {
                let _ = e.mailbox.send(ConnEvent::Cancelled {
                    channel: e.channel,
                    consumer: id,
                });
            }
        }
    }
}
