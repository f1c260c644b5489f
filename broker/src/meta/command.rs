//! Commands of the meta Raft group (topology changes) and their replies.
//! Validation happens when the command is applied, so concurrent declares
//! on different nodes resolve the same way on every replica.

use amq_protocol::types::FieldTable;
use serde::{Deserialize, Serialize};

use super::error::AmqpError;
use super::limits::VhostLimits;
use super::policy::Policy;
use super::{QueueDeclare, QueueRecord};

/// A topology change, applied in log order by every node.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum MetaCommand {
    /// exchange.declare (passive included: it is answered from the log order too).
    DeclareExchange {
        vhost: String,
        name: String,
        kind: String,
        passive: bool,
        durable: bool,
        auto_delete: bool,
        internal: bool,
        arguments: FieldTable,
    },
    /// exchange.delete.
    DeleteExchange {
        vhost: String,
        name: String,
        if_unused: bool,
    },
    /// queue.declare (non-passive; passive declares read the local replica).
    DeclareQueue(QueueDeclare),
    /// queue.delete (if-unused/if-empty are checked by the caller against the
    /// queue leader first), queue TTL expiry, exclusive owner gone.
    DeleteQueue { vhost: String, name: String },
    /// queue.bind.
    Bind {
        vhost: String,
        queue: String,
        exchange: String,
        routing_key: String,
        arguments: FieldTable,
    },
    /// queue.unbind.
    Unbind {
        vhost: String,
        queue: String,
        exchange: String,
        routing_key: String,
        arguments: FieldTable,
    },
    /// exchange.bind (exchange-to-exchange).
    BindExchange {
        vhost: String,
        destination: String,
        source: String,
        routing_key: String,
        arguments: FieldTable,
    },
    /// exchange.unbind.
    UnbindExchange {
        vhost: String,
        destination: String,
        source: String,
        routing_key: String,
        arguments: FieldTable,
    },
    /// quorumqctl set_policy.
    SetPolicy(Policy),
    /// quorumqctl clear_policy.
    ClearPolicy { vhost: String, name: String },
    /// Fixes the cluster id (proposed by the first meta leader; later ones
    /// change nothing). Replies `ClusterId` with the id in force.
    SetClusterId(u64),
    /// quorumqctl add_member / delete_member / grow / shrink: the nodes
    /// holding a replica of the quorum queue whose group is `group_id`
    /// (the record of a re-declared queue of the same name has another
    /// group and is left alone). Replies `Ok`, or 404 when the queue is gone.
    SetQueueMembers {
        vhost: String,
        name: String,
        group_id: u64,
        members: Vec<u64>,
    },
    /// quorumqctl set_vhost_limits / clear_vhost_limits (empty limits): replaces the
    /// vhost's limits. Replies `Ok`, or 530 `vhost … not found`.
    SetVhostLimits { vhost: String, limits: VhostLimits },
    /// quorumqctl add_vhost: creates the vhost (predeclared exchanges); on an existing one
    /// only sets a given default queue type. Replies `Ok`, or 406 for an unknown type.
    AddVhost {
        name: String,
        default_queue_type: Option<String>,
    },
    /// quorumqctl delete_vhost: deletes the vhost and everything in it (each node's
    /// reconciler stops the groups of its queues). Replies `Ok`, or 404.
    DeleteVhost { name: String },
    /// quorumqctl add_user (the hash made by the proposer, random salt).
    AddUser(super::access::User),
    /// quorumqctl delete_user (with its permissions).
    DeleteUser { name: String },
    /// quorumqctl change_password / clear_password (empty hash).
    SetPasswordHash { name: String, hash: Vec<u8> },
    /// quorumqctl set_user_tags.
    SetUserTags { name: String, tags: Vec<String> },
    /// quorumqctl set_permissions.
    SetPermissions {
        user: String,
        vhost: String,
        permission: super::access::Permission,
    },
    /// quorumqctl clear_permissions.
    ClearPermissions { user: String, vhost: String },
}

impl MetaCommand {
    /// True for a change a node's stale view would get wrong without
    /// noticing: a binding change (queue.bind/unbind, exchange.bind/unbind,
    /// and the HTTP API's), and a queue or exchange deletion. Its ok waits
    /// until every running node applied it
    /// ([`crate::cluster::meta_group::MetaGroup::write`]), as RabbitMQ's
    /// metadata changes commit on every running node before their ok. A
    /// catch-up on a miss cannot help here: a node whose view lacks a new
    /// binding still routes a publish elsewhere, and one that still holds a
    /// deleted queue routes a publish into it (nacked, where RabbitMQ
    /// returns it as unroutable).
    pub fn must_reach_every_node(&self) -> bool {
        matches!(
            self,
            MetaCommand::Bind { .. }
                | MetaCommand::Unbind { .. }
                | MetaCommand::BindExchange { .. }
                | MetaCommand::UnbindExchange { .. }
                | MetaCommand::DeleteQueue { .. }
                | MetaCommand::DeleteExchange { .. }
        )
    }
}

/// Result of a [`MetaCommand`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum MetaReply {
    Ok,
    /// The cluster id in force.
    ClusterId(u64),
    Error(AmqpError),
    /// The queue now exists; `created` = this command created it.
    QueueDeclared {
        record: QueueRecord,
        created: bool,
    },
    /// The deleted queue, if it existed.
    QueueDeleted(Option<QueueRecord>),
}
