//! Node-local table of consumers: where the queue leader sends a delivery.
//! A consumer id names (node, boot epoch, sequence); the channel that
//! registered it receives its deliveries on its connection's mailbox.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, RwLock};

use tokio::sync::mpsc::UnboundedSender;

use crate::queue::types::{ConsumerId, Delivery};

/// A message for a consumer, as handed over by a queue leader.
#[derive(Debug)]
pub struct QueueDelivery {
    pub consumer: ConsumerId,
    /// Group id of the queue it comes from.
    pub group: u64,
    pub delivery: Delivery,
}

/// Consumers attached on this node.
pub struct ConsumerRegistry {
    node: u64,
    epoch: u32,
    next_seq: AtomicU32,
    mailboxes: RwLock<HashMap<ConsumerId, UnboundedSender<QueueDelivery>>>,
}

impl ConsumerRegistry {
    /// Registry of node `node` in boot `epoch`.
    pub fn new(node: u64, epoch: u32) -> Arc<Self> {
        Arc::new(ConsumerRegistry {
            node,
            epoch,
            next_seq: AtomicU32::new(1),
            mailboxes: RwLock::new(HashMap::new()),
        })
    }

    /// This node's boot epoch.
    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    /// A fresh consumer id delivering into `mailbox`.
    pub fn register(&self, mailbox: UnboundedSender<QueueDelivery>) -> ConsumerId {
        let id = ConsumerId {
            node: self.node,
            epoch: self.epoch,
            seq: self.next_seq.fetch_add(1, Ordering::Relaxed),
        };
        if let Ok(mut m) = self.mailboxes.write() {
            m.insert(id, mailbox);
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

    /// Hands a delivery to its consumer's connection; false if it is gone.
    pub fn deliver(&self, d: QueueDelivery) -> bool {
        let Ok(m) = self.mailboxes.read() else {
            return false;
        };
        match m.get(&d.consumer) {
            Some(tx) => tx.send(d).is_ok(),
            None => false,
        }
    }
}
