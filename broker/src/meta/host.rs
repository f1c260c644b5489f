//! The meta group's state machine: the topology, changed only by
//! [`MetaCommand`]s in log order. Every node applies it, so routing is a
//! local lookup.

use super::command::{MetaCommand, MetaReply};
use super::{QueueDeclared, Topology};
use crate::cluster::types::{GroupCommand, GroupReply, TypeConfig};

/// Which queue records changed since the node's reconciler last looked
/// ([`MetaHost::take_queue_changes`]): the reconciler then visits only those,
/// not every queue, so one declare costs the same at 10 queues as at 10,000
/// (issue 31).
#[derive(Debug, Clone, PartialEq)]
pub struct QueueChanges {
    /// Every queue may have changed (first look, a snapshot installed, a
    /// vhost deleted): reconcile them all.
    pub full: bool,
    /// (vhost, name, group id) of each queue created, deleted or given new
    /// members, in log order (a name may appear with several group ids).
    pub queues: Vec<(String, String, u64)>,
}

impl Default for QueueChanges {
    /// A first look: everything.
    fn default() -> Self {
        QueueChanges {
            full: true,
            queues: Vec::new(),
        }
    }
}

/// Most queue changes kept before the next look becomes a full one.
const MAX_QUEUE_CHANGES: usize = 100_000;

/// Most new quorum queues kept in [`MetaHost::take_newborn`]'s table (each
/// node takes every entry when it opens the queue's handle; beyond this,
/// new groups start by election instead).
const MAX_NEWBORN: usize = 65_536;

/// Topology plus the Raft adapter glue.
#[derive(Default)]
pub struct MetaHost {
    topology: Topology,
    /// Queue records changed since [`MetaHost::take_queue_changes`].
    changes: QueueChanges,
    /// Bumped after every applied command (the node reconciles its queue
    /// replicas and handles with the topology).
    changed: Option<tokio::sync::watch::Sender<u64>>,
    /// Bumped after a vhost or a user was deleted, and after a snapshot install (open
    /// connections check theirs; few changes do this, so connections are not woken by
    /// every declare).
    revoked: Option<tokio::sync::watch::Sender<u64>>,
    /// Quorum queues created by a `DeclareQueue` this replica applied, by
    /// group id, with their first members, until this node opens the queue
    /// ([`MetaHost::take_newborn`]); a membership change or deletion drops
    /// the entry, a snapshot install all of them.
    newborn: std::collections::HashMap<u64, Vec<u64>>,
}

impl MetaHost {
    /// Fresh topology (vhost "/", predeclared exchanges).
    pub fn new() -> Self {
        MetaHost {
            topology: Topology::new(),
            changes: QueueChanges::default(),
            changed: None,
            revoked: None,
            newborn: Default::default(),
        }
    }

    /// The first members of quorum queue group `group` when this replica
    /// applied its creation and nothing changed them since, once: the
    /// members may then start the group with its preferred leader's first
    /// term instead of an election (`cluster::bootstrap::seed_new_group`).
    /// `None` for a group created before this process started (its
    /// creation replayed or installed by snapshot is not seen here unless
    /// applied again), changed, or taken already.
    pub fn take_newborn(&mut self, group: u64) -> Option<Vec<u64>> {
        self.newborn.remove(&group)
    }

    /// Notifies `tx` after every applied command and snapshot install.
    pub fn with_notifier(mut self, tx: tokio::sync::watch::Sender<u64>) -> Self {
        self.changed = Some(tx);
        self
    }

    /// Notifies `tx` after a vhost or user deletion and after a snapshot install.
    pub fn with_revocation_notifier(mut self, tx: tokio::sync::watch::Sender<u64>) -> Self {
        self.revoked = Some(tx);
        self
    }

    fn notify_revoked(&self) {
        if let Some(tx) = &self.revoked {
            tx.send_modify(|g| *g = g.wrapping_add(1));
        }
    }

    fn notify(&self) {
        if let Some(tx) = &self.changed {
            tx.send_modify(|g| *g = g.wrapping_add(1));
        }
    }

    /// The current topology (local replica).
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// The queue records changed since the last call (see [`QueueChanges`]),
    /// and starts a new list.
    pub fn take_queue_changes(&mut self) -> QueueChanges {
        std::mem::replace(
            &mut self.changes,
            QueueChanges {
                full: false,
                queues: Vec::new(),
            },
        )
    }

    fn queue_changed(&mut self, vhost: &str, name: &str, group: u64) {
        if self.changes.full {
            return;
        }
        if self.changes.queues.len() >= MAX_QUEUE_CHANGES {
            self.changes.full = true;
            self.changes.queues = Vec::new();
            return;
        }
        self.changes
            .queues
            .push((vhost.to_owned(), name.to_owned(), group));
    }

    /// Applies one command; errors are replies, not failures.
    pub fn apply(&mut self, cmd: MetaCommand) -> MetaReply {
        let mut changed: Vec<(String, String, u64)> = Vec::new();
        let mut all_changed = false;
        let t = &mut self.topology;
        let r = match cmd {
            MetaCommand::DeclareExchange {
                vhost,
                name,
                kind,
                passive,
                durable,
                auto_delete,
                internal,
                arguments,
            } => t
                .declare_exchange(
                    &vhost,
                    &name,
                    &kind,
                    passive,
                    durable,
                    auto_delete,
                    internal,
                    &arguments,
                )
                .map(|_| MetaReply::Ok),
            MetaCommand::DeleteExchange {
                vhost,
                name,
                if_unused,
            } => t
                .delete_exchange(&vhost, &name, if_unused)
                .map(|_| MetaReply::Ok),
            MetaCommand::DeclareQueue(d) => {
                t.check_queue_declare(&d).map(|declared| match declared {
                    QueueDeclared::Existing(record) => MetaReply::QueueDeclared {
                        record,
                        created: false,
                    },
                    QueueDeclared::Create(record) => {
                        if record.kind == super::QueueKind::Quorum
                            && self.newborn.len() < MAX_NEWBORN
                        {
                            self.newborn.insert(record.group_id, record.members.clone());
                        }
                        t.add_queue(record.clone());
                        changed.push((record.vhost.clone(), record.name.clone(), record.group_id));
                        MetaReply::QueueDeclared {
                            record,
                            created: true,
                        }
                    }
                })
            }
            MetaCommand::DeleteQueue { vhost, name } => {
                let deleted = t.delete_queue(&vhost, &name);
                if let Some(r) = &deleted {
                    self.newborn.remove(&r.group_id);
                    changed.push((vhost.clone(), name.clone(), r.group_id));
                }
                Ok(MetaReply::QueueDeleted(deleted))
            }
            MetaCommand::Bind {
                vhost,
                queue,
                exchange,
                routing_key,
                arguments,
            } => t
                .bind(&vhost, &queue, &exchange, &routing_key, &arguments)
                .map(|_| MetaReply::Ok),
            MetaCommand::Unbind {
                vhost,
                queue,
                exchange,
                routing_key,
                arguments,
            } => t
                .unbind(&vhost, &queue, &exchange, &routing_key, &arguments)
                .map(|_| MetaReply::Ok),
            MetaCommand::BindExchange {
                vhost,
                destination,
                source,
                routing_key,
                arguments,
            } => t
                .bind_exchange(&vhost, &destination, &source, &routing_key, &arguments)
                .map(|_| MetaReply::Ok),
            MetaCommand::UnbindExchange {
                vhost,
                destination,
                source,
                routing_key,
                arguments,
            } => t
                .unbind_exchange(&vhost, &destination, &source, &routing_key, &arguments)
                .map(|_| MetaReply::Ok),
            MetaCommand::SetPolicy(p) => t.set_policy(p).map(|_| MetaReply::Ok),
            MetaCommand::ClearPolicy { vhost, name } => {
                t.clear_policy(&vhost, &name).map(|_| MetaReply::Ok)
            }
            MetaCommand::SetClusterId(id) => Ok(MetaReply::ClusterId(t.set_cluster_id(id))),
            MetaCommand::SetQueueMembers {
                vhost,
                name,
                group_id,
                members,
            } => {
                self.newborn.remove(&group_id);
                changed.push((vhost.clone(), name.clone(), group_id));
                t.set_queue_members(&vhost, &name, group_id, members)
                    .map(|_| MetaReply::Ok)
            }
            MetaCommand::SetVhostLimits { vhost, limits } => {
                t.set_vhost_limits(&vhost, limits).map(|_| MetaReply::Ok)
            }
            MetaCommand::AddVhost {
                name,
                default_queue_type,
            } => t
                .add_vhost_with(&name, default_queue_type)
                .map(|_| MetaReply::Ok),
            MetaCommand::AddUser(u) => t.access_mut().add_user(u).map(|_| MetaReply::Ok),
            MetaCommand::DeleteUser { name } => {
                let r = t.access_mut().delete_user(&name).map(|_| MetaReply::Ok);
                if r.is_ok() {
                    self.notify_revoked();
                }
                r
            }
            MetaCommand::SetPasswordHash { name, hash } => t
                .access_mut()
                .set_password_hash(&name, hash)
                .map(|_| MetaReply::Ok),
            MetaCommand::SetUserTags { name, tags } => {
                t.access_mut().set_tags(&name, tags).map(|_| MetaReply::Ok)
            }
            MetaCommand::SetPermissions {
                user,
                vhost,
                permission,
            } => t
                .set_permissions(&user, &vhost, permission)
                .map(|_| MetaReply::Ok),
            MetaCommand::ClearPermissions { user, vhost } => {
                t.access_mut().clear_permissions(&user, &vhost);
                Ok(MetaReply::Ok)
            }
            MetaCommand::DeleteVhost { name } => match t.delete_vhost(&name) {
                Some(_) => {
                    all_changed = true;
                    self.notify_revoked();
                    Ok(MetaReply::Ok)
                }
                None => Err(super::AmqpError::not_found(format!(
                    "vhost '{name}' does not exist"
                ))),
            },
        };
        if all_changed {
            self.changes.full = true;
            self.changes.queues = Vec::new();
            self.newborn.clear();
        }
        for (vhost, name, group) in changed {
            self.queue_changed(&vhost, &name, group);
        }
        self.notify();
        r.unwrap_or_else(MetaReply::Error)
    }
}

impl raft_log::Machine<TypeConfig> for MetaHost {
    fn apply(&mut self, _meta: &raft_log::ApplyMeta, cmd: GroupCommand) -> GroupReply {
        match cmd {
            GroupCommand::Meta(c) => GroupReply::Meta(MetaHost::apply(self, c)),
            GroupCommand::Queue { .. } | GroupCommand::LeaderRestored { .. } => GroupReply::None,
        }
    }

    fn snapshot(&mut self) -> Result<Vec<u8>, raft_log::StoreError> {
        raft_log::codec::encode(&self.topology)
    }

    fn restore(&mut self, data: &[u8]) -> Result<(), raft_log::StoreError> {
        self.topology = Topology::decode_snapshot(data)?;
        self.changes.full = true;
        self.changes.queues = Vec::new();
        self.newborn.clear();
        self.notify();
        self.notify_revoked();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::access::User;

    fn declare(name: &str) -> MetaCommand {
        let mut arguments = amq_protocol::types::FieldTable::default();
        arguments.insert(
            "x-queue-type".into(),
            amq_protocol::types::AMQPValue::LongString("quorum".into()),
        );
        MetaCommand::DeclareQueue(crate::meta::QueueDeclare {
            vhost: "/".into(),
            name: name.into(),
            passive: false,
            durable: true,
            exclusive: false,
            auto_delete: false,
            arguments,
            node: 1,
            connection: 1,
            server_named: false,
            members: vec![1, 2, 3],
        })
    }

    /// The reconciler visits only the queues a command created, deleted or
    /// re-membered (issue 31); a snapshot or a vhost deletion means all.
    #[test]
    fn queue_changes_list_what_changed_since_the_last_look() {
        let mut host = MetaHost::new();
        assert!(host.take_queue_changes().full, "the first look is full");
        host.apply(declare("a"));
        host.apply(declare("a")); // redeclared: no change
        host.apply(declare("b"));
        let ga = host
            .topology()
            .queue("/", "a")
            .map(|r| r.group_id)
            .unwrap_or(0);
        let gb = host
            .topology()
            .queue("/", "b")
            .map(|r| r.group_id)
            .unwrap_or(0);
        host.apply(MetaCommand::SetQueueMembers {
            vhost: "/".into(),
            name: "b".into(),
            group_id: gb,
            members: vec![1, 2],
        });
        host.apply(MetaCommand::DeleteQueue {
            vhost: "/".into(),
            name: "a".into(),
        });
        host.apply(MetaCommand::DeleteQueue {
            vhost: "/".into(),
            name: "missing".into(),
        });
        let c = host.take_queue_changes();
        assert!(!c.full);
        let q = |n: &str, g| ("/".to_string(), n.to_string(), g);
        assert_eq!(
            c.queues,
            vec![q("a", ga), q("b", gb), q("b", gb), q("a", ga)]
        );
        assert_eq!(host.take_queue_changes().queues, vec![], "taken");
        host.apply(MetaCommand::AddVhost {
            name: "v".into(),
            default_queue_type: None,
        });
        host.apply(MetaCommand::DeleteVhost { name: "v".into() });
        assert!(
            host.take_queue_changes().full,
            "a vhost deletion changes all"
        );
    }

    /// A group is newborn once, with the members of its creation, until a
    /// membership change, deletion or snapshot install says otherwise.
    #[test]
    fn a_new_quorum_queue_is_newborn_once_until_something_changes_it() {
        let mut host = MetaHost::new();
        let group = |host: &MetaHost, n: &str| {
            host.topology()
                .queue("/", n)
                .map(|r| r.group_id)
                .unwrap_or(0)
        };
        for n in ["a", "b", "c", "d"] {
            host.apply(declare(n));
        }
        let (a, b, c, d) = (
            group(&host, "a"),
            group(&host, "b"),
            group(&host, "c"),
            group(&host, "d"),
        );
        host.apply(declare("a")); // redeclared: still the first one
        assert_eq!(host.take_newborn(a), Some(vec![1, 2, 3]));
        assert_eq!(host.take_newborn(a), None, "taken once");
        host.apply(MetaCommand::SetQueueMembers {
            vhost: "/".into(),
            name: "b".into(),
            group_id: b,
            members: vec![1, 2, 3],
        });
        assert_eq!(host.take_newborn(b), None, "members were set again");
        host.apply(MetaCommand::DeleteQueue {
            vhost: "/".into(),
            name: "c".into(),
        });
        host.apply(declare("c"));
        assert_eq!(host.take_newborn(c), None, "deleted");
        let c2 = group(&host, "c");
        assert_ne!(c, c2);
        let snapshot = raft_log::Machine::<TypeConfig>::snapshot(&mut host).unwrap_or_default();
        raft_log::Machine::<TypeConfig>::restore(&mut host, &snapshot).unwrap_or(());
        assert_eq!(host.take_newborn(c2), None, "installed from a snapshot");
        assert_eq!(host.take_newborn(d), None, "installed from a snapshot");
    }

    #[test]
    fn only_deleting_a_vhost_or_a_user_signals_a_revocation() {
        let (tx, rx) = tokio::sync::watch::channel(0u64);
        let mut host = MetaHost::new().with_revocation_notifier(tx);
        let user = User {
            name: "app".into(),
            password_hash: Vec::new(),
            tags: Vec::new(),
        };
        host.apply(MetaCommand::AddVhost {
            name: "v".into(),
            default_queue_type: None,
        });
        host.apply(MetaCommand::AddUser(user));
        assert_eq!(*rx.borrow(), 0, "additions revoke nothing");
        host.apply(MetaCommand::DeleteVhost { name: "v".into() });
        assert_eq!(*rx.borrow(), 1);
        host.apply(MetaCommand::DeleteUser { name: "app".into() });
        assert_eq!(*rx.borrow(), 2);
        host.apply(MetaCommand::DeleteVhost {
            name: "missing".into(),
        });
        assert_eq!(*rx.borrow(), 2, "deleting nothing revokes nothing");
    }
}
