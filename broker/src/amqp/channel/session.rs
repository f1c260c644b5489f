//! What the channels of one open connection share: the node, the
//! connection's identity, its mailbox, and which channel each of its
//! consumers lives on.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc::UnboundedSender;

use crate::consumers::ConnEvent;
use crate::node::Broker;
use crate::queue::types::ConsumerId;

/// What every channel of one open connection shares: the node, the
/// connection's identity (id, vhost, user, negotiated frame size) and the
/// mailbox its consumers' deliveries arrive in.
pub struct Session {
    /// The node serving the connection.
    pub broker: Arc<Broker>,
    /// Node-unique connection id (exclusive queue ownership).
    pub id: u64,
    /// The vhost of connection.open.
    pub vhost: String,
    /// The authenticated user (permission checks).
    pub user: String,
    /// Negotiated largest frame (bytes).
    pub frame_max: u32,
    /// The connection's mailbox: deliveries and cancellations of its consumers.
    pub mailbox: UnboundedSender<ConnEvent>,
    /// Which channel (by [`Channel::key`]) each consumer of the connection
    /// lives on, so the connection can hand a delivery to its channel even
    /// while that channel is busy (then it waits in the channel's inputs).
    consumers: Mutex<HashMap<ConsumerId, u64>>,
}

impl Session {
    /// The session of a connection that just opened.
    pub fn new(
        broker: Arc<Broker>,
        id: u64,
        vhost: String,
        user: String,
        frame_max: u32,
        mailbox: UnboundedSender<ConnEvent>,
    ) -> Session {
        Session {
            broker,
            id,
            vhost,
            user,
            frame_max,
            mailbox,
            consumers: Mutex::new(HashMap::new()),
        }
    }

    /// The key of the channel consumer `id` lives on (None once it is
    /// unregistered).
    pub fn channel_of(&self, id: ConsumerId) -> Option<u64> {
        self.consumers.lock().ok()?.get(&id).copied()
    }

    /// A fresh consumer of queue group `group` on the channel with key `ch`,
    /// whose deliveries come to this connection's mailbox.
    pub(super) fn register_consumer(&self, ch: u64, group: u64) -> ConsumerId {
        let id = self
            .broker
            .consumers()
            .register(self.mailbox.clone(), group);
        if let Ok(mut m) = self.consumers.lock() {
            m.insert(id, ch);
        }
        id
    }

    /// Forgets consumer `id` (node registry and channel map).
    pub(super) fn unregister_consumer(&self, id: ConsumerId) {
        self.broker.consumers().unregister(id);
        if let Ok(mut m) = self.consumers.lock() {
            m.remove(&id);
        }
    }
}
