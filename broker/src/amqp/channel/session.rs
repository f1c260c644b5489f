//! What the channels of one open connection share: the node, the
//! connection's identity and the mailbox its consumers' deliveries arrive
//! in (each naming its channel).

use std::sync::Arc;

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
    /// The client announced the `consumer_cancel_notify` capability: a
    /// consumer timeout sends it basic.cancel instead of closing the channel
    /// (RabbitMQ 4.3).
    pub cancel_notify: bool,
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
        cancel_notify: bool,
    ) -> Session {
        Session {
            broker,
            id,
            vhost,
            user,
            frame_max,
            mailbox,
            cancel_notify,
        }
    }

    /// A fresh consumer of queue group `group` on the channel with key `ch`,
    /// whose deliveries come to this connection's mailbox naming `ch`.
    pub(super) fn register_consumer(&self, ch: u64, group: u64) -> ConsumerId {
        self.broker
            .consumers()
            .register(self.mailbox.clone(), group, ch)
    }

    /// Forgets consumer `id`: later deliveries to it are dropped.
    pub(super) fn unregister_consumer(&self, id: ConsumerId) {
        self.broker.consumers().unregister(id);
    }
}
