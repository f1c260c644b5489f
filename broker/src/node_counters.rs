//! Node-wide counters RabbitMQ's Grafana dashboards chart beyond those of
//! [`crate::metrics`] (RabbitMQ 3.10.8 `rabbit_global_counters` and `rabbit_core_metrics`
//! families): deliveries split by consume/get and ack mode, empty gets, unroutable
//! publishes dropped or returned, publishes received in confirm mode, queues
//! declared/created/deleted. Relaxed atomic adds, read at scrape time
//! (`crate::http::metrics`); process-wide as RabbitMQ's are node-wide.

use std::sync::atomic::{AtomicU64, Ordering};

/// The counters.
#[derive(Debug, Default)]
pub struct NodeCounters {
    /// basic.deliver to a consumer that acknowledges.
    pub delivered_consume_manual_ack: AtomicU64,
    /// basic.deliver to a `no_ack` consumer.
    pub delivered_consume_auto_ack: AtomicU64,
    /// basic.get-ok without `no_ack`.
    pub delivered_get_manual_ack: AtomicU64,
    /// basic.get-ok with `no_ack`.
    pub delivered_get_auto_ack: AtomicU64,
    /// basic.get-empty.
    pub get_empty: AtomicU64,
    /// Unroutable publishes without `mandatory` (dropped).
    pub unroutable_dropped: AtomicU64,
    /// Unroutable mandatory publishes (basic.return).
    pub unroutable_returned: AtomicU64,
    /// Publishes received on channels in confirm mode.
    pub received_confirm: AtomicU64,
    /// queue.declare (and API declares) answered.
    pub queues_declared: AtomicU64,
    /// Declares that created the queue.
    pub queues_created: AtomicU64,
    /// Queues deleted through this node.
    pub queues_deleted: AtomicU64,
}

/// The node's counters.
pub static NODE: NodeCounters = NodeCounters {
    delivered_consume_manual_ack: AtomicU64::new(0),
    delivered_consume_auto_ack: AtomicU64::new(0),
    delivered_get_manual_ack: AtomicU64::new(0),
    delivered_get_auto_ack: AtomicU64::new(0),
    get_empty: AtomicU64::new(0),
    unroutable_dropped: AtomicU64::new(0),
    unroutable_returned: AtomicU64::new(0),
    received_confirm: AtomicU64::new(0),
    queues_declared: AtomicU64::new(0),
    queues_created: AtomicU64::new(0),
    queues_deleted: AtomicU64::new(0),
};

/// Adds one to `c`.
pub fn inc(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

impl NodeCounters {
    /// (metric name without `_total`, help, value) of every counter, RabbitMQ's names.
    pub fn families(&self) -> Vec<(&'static str, &'static str, u64)> {
        let v = |c: &AtomicU64| c.load(Ordering::Relaxed);
        vec![
            ("rabbitmq_global_messages_delivered_consume_manual_ack", "Total number of messages delivered to consumers using manual acknowledgement mode", v(&self.delivered_consume_manual_ack)),
            ("rabbitmq_global_messages_delivered_consume_auto_ack", "Total number of messages delivered to consumers using automatic acknowledgement mode", v(&self.delivered_consume_auto_ack)),
            ("rabbitmq_global_messages_delivered_get_manual_ack", "Total number of messages delivered to polling consumers using manual acknowledgement mode", v(&self.delivered_get_manual_ack)),
            ("rabbitmq_global_messages_delivered_get_auto_ack", "Total number of messages delivered to polling consumers using automatic acknowledgement mode", v(&self.delivered_get_auto_ack)),
            ("rabbitmq_global_messages_get_empty", "Total number of times basic.get operations fetched no message", v(&self.get_empty)),
            ("rabbitmq_global_messages_unroutable_dropped", "Total number of messages published as non-mandatory into an exchange and dropped as unroutable", v(&self.unroutable_dropped)),
            ("rabbitmq_global_messages_unroutable_returned", "Total number of messages published as mandatory into an exchange and returned to the publisher as unroutable", v(&self.unroutable_returned)),
            ("rabbitmq_global_messages_received_confirm", "Total number of messages received from publishers expecting confirmations", v(&self.received_confirm)),
            ("rabbitmq_queues_declared", "Total number of queues declared", v(&self.queues_declared)),
            ("rabbitmq_queues_created", "Total number of queues created", v(&self.queues_created)),
            ("rabbitmq_queues_deleted", "Total number of queues deleted", v(&self.queues_deleted)),
        ]
    }
}
