//! What a queue's runtime and its dead-letter workers may ask of the node:
//! a narrow capability instead of the whole node (TiKV's raftstore hands
//! its peers a `Router` and a `Transport`, not the store). [`Queues`]
//! implements it.
//!
//! [`Queues`]: super::registry::Queues

use std::sync::Arc;

use amq_protocol::types::FieldTable;
use futures::future::BoxFuture;
use tokio::sync::watch;

use super::handle::QueueHandle;
use crate::amqp::error::ProtocolError;
use crate::meta::QueueRecord;

/// The node's queue services a queue runtime, the at-least-once
/// dead-letter worker and the at-most-once publisher call.
pub trait QueueServices: Send + Sync {
    /// Routes a publish (a dead letter): target queue handles, in the
    /// topology's order.
    ///
    /// Errors: the exchange does not exist (404), the topology is unreadable (541).
    fn route(
        &self,
        vhost: &str,
        exchange: &str,
        routing_keys: &[String],
        headers: Option<&FieldTable>,
    ) -> Result<Vec<Arc<QueueHandle>>, ProtocolError>;

    /// Opens this node's handles of the queues a publish routes to that it
    /// has not opened yet (e.g. another node's classic queue, which no node
    /// opens before it is used); true when there were any, so that routing
    /// again finds them. For a dead letter that found no target.
    fn open_routed<'a>(
        &'a self,
        vhost: &'a str,
        exchange: &'a str,
        routing_keys: &'a [String],
        headers: Option<&'a FieldTable>,
    ) -> BoxFuture<'a, bool>;

    /// Subscribes to the events a held dead letter may be waiting for
    /// (topology changes, a queue regaining room).
    fn events(&self) -> watch::Receiver<u64>;

    /// Signals a topology change or a queue regaining room.
    fn topology_changed(&self);

    /// Deletes queue `name` of `vhost` (an expired queue, `x-expires`): the
    /// meta record, then the group and its storage. Returns the deleted
    /// record (None: there was none).
    ///
    /// Errors: 541 when no meta leader answered.
    fn delete_queue<'a>(
        &'a self,
        vhost: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<QueueRecord>, ProtocolError>>;

    /// True once the node began to stop.
    fn is_stopping(&self) -> bool;
}
