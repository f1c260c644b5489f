//! The queue class: declare, bind, unbind, purge, delete.

use amq_protocol::protocol::{queue, AMQPClass};

use super::{server_name, Channel, Result};
use crate::amqp::error::ProtocolError;
use crate::meta::access::Perm;
use crate::meta::command::{MetaCommand, MetaReply};
use crate::meta::Topology;
use crate::queue::types::{QueueCommand, QueueReply};

impl Channel {
    pub(super) async fn on_queue(&mut self, m: queue::AMQPMethod) -> Result<()> {
        match m {
            queue::AMQPMethod::Declare(d) => {
                let mut name = d.queue.as_str().to_string();
                let mut declare = self.session.broker.queue_declare(
                    &self.session.vhost,
                    &name,
                    d.passive,
                    d.durable,
                    d.exclusive,
                    d.auto_delete,
                    d.arguments,
                    self.session.id,
                );
                if name.is_empty() && !d.passive {
                    Topology::check_server_named(&declare)?;
                    name = server_name("amq.gen-");
                    declare.name = name.clone();
                    declare.server_named = true;
                } else if name.is_empty() {
                    name = self.default_queue_name("")?;
                }
                let (handle, created) = if d.passive {
                    (self.lookup_queue(&name).await?.1, false)
                } else {
                    // rabbit_channel: configure on the queue; with an x-dead-letter-exchange
                    // argument also read on the queue and write on the DLX (the seed's rule:
                    // no dead-lettering into what one could not publish to). A DLX set by a
                    // policy is not checked, as RabbitMQ 3.10.8 (policies are the operator's).
                    self.permit("queue", &name, Perm::Configure)?;
                    if let Some(dlx) =
                        crate::meta::value::lookup(&declare.arguments, "x-dead-letter-exchange")
                            .and_then(crate::meta::value::as_longstr)
                    {
                        self.permit("queue", &name, Perm::Read)?;
                        self.permit("exchange", &dlx, Perm::Write)?;
                    }
                    let reply = self.meta(MetaCommand::DeclareQueue(declare)).await?;
                    let MetaReply::QueueDeclared { record, created } = reply else {
                        return Err(ProtocolError::internal("unexpected reply to queue.declare"));
                    };
                    if created {
                        crate::node_counters::inc(&crate::node_counters::NODE.queues_created);
                    }
                    let handle = self.session.broker.ensure_queue(&record).await?;
                    (handle, created)
                };
                self.last_queue = Some(name.clone());
                crate::node_counters::inc(&crate::node_counters::NODE.queues_declared);
                // A queue this declare created is empty and has no consumers (its
                // group may not have a leader to ask yet).
                let (ready, _unacked, consumers) = if created {
                    (0, 0, 0)
                } else {
                    handle.counts().await
                };
                if !d.nowait {
                    self.send(AMQPClass::Queue(queue::AMQPMethod::DeclareOk(
                        queue::DeclareOk {
                            queue: name.as_str().into(),
                            message_count: ready as u32,
                            consumer_count: consumers as u32,
                        },
                    )));
                }
            }
            queue::AMQPMethod::Bind(b) => {
                let name = self.default_queue_name(b.queue.as_str())?;
                self.permit("queue", &name, Perm::Write)?;
                self.permit("exchange", b.exchange.as_str(), Perm::Read)?;
                // Exclusive ownership; the meta group answers 404 for a missing queue.
                self.find_queue(&name).await?;
                self.meta(MetaCommand::Bind {
                    vhost: self.session.vhost.clone(),
                    queue: name,
                    exchange: b.exchange.as_str().into(),
                    routing_key: b.routing_key.as_str().into(),
                    arguments: b.arguments,
                })
                .await?;
                self.session.broker.topology_changed();
                if !b.nowait {
                    self.send(AMQPClass::Queue(queue::AMQPMethod::BindOk(
                        queue::BindOk {},
                    )));
                }
            }
            queue::AMQPMethod::Unbind(b) => {
                let name = self.default_queue_name(b.queue.as_str())?;
                self.permit("queue", &name, Perm::Write)?;
                self.permit("exchange", b.exchange.as_str(), Perm::Read)?;
                self.meta(MetaCommand::Unbind {
                    vhost: self.session.vhost.clone(),
                    queue: name,
                    exchange: b.exchange.as_str().into(),
                    routing_key: b.routing_key.as_str().into(),
                    arguments: b.arguments,
                })
                .await?;
                self.send(AMQPClass::Queue(queue::AMQPMethod::UnbindOk(
                    queue::UnbindOk {},
                )));
            }
            queue::AMQPMethod::Purge(p) => {
                let name = self.default_queue_name(p.queue.as_str())?;
                self.permit("queue", &name, Perm::Read)?;
                let (_, handle) = self.lookup_queue(&name).await?;
                let reply = handle
                    .call(QueueCommand::Purge {
                        now_ms: crate::now_ms(),
                    })
                    .await
                    .map_err(ProtocolError::internal)?;
                let n = match reply {
                    QueueReply::Purged(n) => n,
                    _ => 0,
                };
                if !p.nowait {
                    self.send(AMQPClass::Queue(queue::AMQPMethod::PurgeOk(
                        queue::PurgeOk {
                            message_count: n as u32,
                        },
                    )));
                }
            }
            queue::AMQPMethod::Delete(d) => {
                let name = self.default_queue_name(d.queue.as_str())?;
                self.permit("queue", &name, Perm::Configure)?;
                let mut count = 0;
                if let Some((_, handle)) = self.find_queue(&name).await? {
                    if handle.refuses_conditional_delete() && (d.if_unused || d.if_empty) {
                        let flag = if d.if_empty { "if-empty" } else { "if-unused" };
                        return Err(ProtocolError::not_implemented(format!(
                            "cannot delete queue '{name}' in vhost '{}'. queue.delete operations with {flag} flag set are not supported by quorum queues",
                            self.session.vhost
                        )));
                    }
                    let (ready, _unacked, consumers) = handle.counts().await;
                    if d.if_unused && consumers > 0 {
                        return Err(ProtocolError::precondition(format!(
                            "queue '{name}' in vhost '{}' in use",
                            self.session.vhost
                        )));
                    }
                    // Classic semantics (rabbit_variable_queue:is_empty/1): ready messages
                    // only; unacknowledged ones do not make a queue non-empty.
                    if d.if_empty && ready > 0 {
                        return Err(ProtocolError::precondition(format!(
                            "queue '{name}' in vhost '{}' not empty",
                            self.session.vhost
                        )));
                    }
                    count = ready;
                    self.session
                        .broker
                        .delete_queue(&self.session.vhost, &name)
                        .await?;
                    crate::node_counters::inc(&crate::node_counters::NODE.queues_deleted);
                }
                if !d.nowait {
                    self.send(AMQPClass::Queue(queue::AMQPMethod::DeleteOk(
                        queue::DeleteOk {
                            message_count: count as u32,
                        },
                    )));
                }
            }
            _ => return Err(ProtocolError::command_invalid("unexpected queue method")),
        }
        Ok(())
    }
}
