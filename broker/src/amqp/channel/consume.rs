//! basic.qos, basic.consume, basic.cancel, basic.get, and the deliveries and
//! cancellations a channel's consumers receive from their queues.

use amq_protocol::protocol::basic;
use amq_protocol::protocol::AMQPClass;
use amq_protocol::types::{AMQPValue, FieldTable};
use bytes::Bytes;

use super::{server_name, Channel, ConsumerEntry, Result, Unacked};
use crate::amqp::codec;
use crate::amqp::error::ProtocolError;
use crate::consumers::QueueDelivery;
use crate::message::StoredMessage;
use crate::meta::access::Perm;
use crate::meta::value::{as_integer, lookup};
use crate::queue::types::{ConsumerId, ConsumerSpec, QueueCommand, QueueReply};

impl Channel {
    /// basic.consume: a consumer on a queue of this vhost (403 when the queue
    /// is in exclusive use, 530 for a reused tag), then its checkout.
    pub(super) async fn on_consume(&mut self, c: basic::Consume) -> Result<()> {
        // RabbitMQ 3.12+ rabbit_channel: a new consumer over consumer_max_per_channel is a
        // connection error, checked before the queue is looked up.
        if let Some(max) = self.session.broker.config().consumer_max_per_channel {
            let active = self.consumers.values().filter(|e| !e.cancelled).count() as u64;
            if active >= max && !self.consumers.contains_key(c.consumer_tag.as_str()) {
                return Err(ProtocolError::connection(
                    530,
                    format!("NOT_ALLOWED - reached maximum ({max}) of consumers per channel"),
                ));
            }
        }
        let name = self.default_queue_name(c.queue.as_str())?;
        self.permit("queue", &name, Perm::Read)?;
        let (_, handle) = self.lookup_queue(&name).await?;
        if handle.is_quorum() && self.global_prefetch {
            return Err(ProtocolError::not_implemented(format!(
                "queue '{name}' in vhost '{}' does not support global qos",
                self.session.vhost
            )));
        }
        // rabbit_amqqueue:basic_consume checks the consume arguments first (406).
        let priority = crate::meta::queue_args::check_consume_arguments(
            &c.arguments,
            &crate::meta::error::rs("queue", &name, &self.session.vhost),
        )?;
        let timeout_ms = self.consumer_timeout(&name, &c.arguments)?;
        let tag = if c.consumer_tag.as_str().is_empty() {
            server_name("amq.ctag-")
        } else {
            c.consumer_tag.as_str().to_string()
        };
        let prefetch = {
            if self.consumers.contains_key(&tag) {
                return Err(ProtocolError::connection(
                    530,
                    format!("NOT_ALLOWED - attempt to reuse consumer tag '{tag}'"),
                ));
            }
            self.prefetch
        };
        if !handle.try_add_consumer(c.exclusive) {
            return Err(ProtocolError::channel(
                403,
                format!(
                    "ACCESS_REFUSED - queue '{name}' in vhost '{}' in exclusive use",
                    self.session.vhost
                ),
            ));
        }
        let id = self.session.register_consumer(self.key, handle.group);
        self.consumers.insert(
            tag.clone(),
            ConsumerEntry {
                id,
                queue: handle.clone(),
                no_ack: c.no_ack,
                exclusive: c.exclusive,
                arguments: c.arguments.clone(),
                cancelled: false,
            },
        );
        if !c.nowait {
            self.send(AMQPClass::Basic(basic::AMQPMethod::ConsumeOk(
                basic::ConsumeOk {
                    consumer_tag: tag.as_str().into(),
                },
            )));
        }
        let reply = handle
            .call(QueueCommand::Subscribe {
                now_ms: crate::now_ms(),
                consumer: id,
                spec: ConsumerSpec {
                    prefetch: u32::from(prefetch),
                    no_ack: c.no_ack,
                    priority,
                    timeout_ms,
                },
            })
            .await;
        if let Err(e) = reply {
            return Err(ProtocolError::internal(e));
        }
        Ok(())
    }

    /// The consumer timeout of a new consumer on queue `name`, ms (RabbitMQ
    /// 4.3 precedence): the `x-consumer-timeout` argument of basic.consume,
    /// else the queue's (`x-consumer-timeout` argument and `consumer-timeout`
    /// policy, the smaller), else the node's `consumer_timeout` (0 = none).
    /// A no-ack consumer never holds a delivery, so it never times out.
    ///
    /// Errors: 406 for an `x-consumer-timeout` that is not a non-negative
    /// integer.
    fn consumer_timeout(&self, name: &str, args: &FieldTable) -> Result<Option<u64>> {
        if let Some(v) = lookup(args, "x-consumer-timeout") {
            return match as_integer(v).and_then(|i| u64::try_from(i).ok()) {
                Some(ms) => Ok(Some(ms)),
                None => Err(ProtocolError::precondition(format!(
                    "invalid arg 'x-consumer-timeout' for queue '{name}' in vhost '{}': expected a non-negative integer",
                    self.session.vhost
                ))),
            };
        }
        let broker = &self.session.broker;
        Ok(broker
            .effective_config(&self.session.vhost, name)
            .consumer_timeout_ms
            .or_else(|| {
                let node = broker.config().consumer_timeout;
                (node > 0).then_some(node)
            }))
    }

    /// A queue timed out consumer (or basic.get slot) `id` of this channel
    /// (`timeout_ms`): the queue already took its messages back and removed
    /// it, so acks of those deliveries are ignored from now on. A client
    /// that announced `consumer_cancel_notify` gets basic.cancel for the
    /// consumer and the channel stays open (RabbitMQ 4.3); otherwise — and
    /// always for a basic.get delivery, which has no consumer to cancel — the
    /// channel is closed with 406 and RabbitMQ's text (3.10.8 behaviour). A
    /// consumer the client had cancelled already just loses its messages.
    /// The queue is answered with `Cancel`, so it stops re-announcing the
    /// timeout after a leader change.
    pub(super) fn on_consumer_timed_out(&mut self, id: ConsumerId, timeout_ms: u64) {
        if self.closing || self.ended {
            return;
        }
        let active = self
            .consumers
            .iter()
            .find(|(_, c)| c.id == id && !c.cancelled)
            .map(|(t, c)| (t.clone(), c.queue.clone(), c.exclusive));
        let slot = self
            .get_slots
            .values()
            .find(|(c, _)| *c == id)
            .map(|(_, q)| q.clone());
        let cancelled = self
            .consumers
            .values()
            .find(|c| c.id == id)
            .map(|c| c.queue.clone())
            .or_else(|| {
                self.cancelled
                    .iter()
                    .find(|(c, _)| *c == id)
                    .map(|(_, q)| q.clone())
            });
        let Some(queue) = slot.clone().or(cancelled) else {
            return;
        };
        let tags: Vec<u64> = self
            .unacked
            .iter()
            .filter(|(_, u)| u.consumer == id)
            .map(|(t, _)| *t)
            .collect();
        for t in tags {
            self.take_unacked(t);
            self.timed_out_tags.insert(t);
        }
        tracing::warn!(channel = self.number, ?id, timeout_ms, queue = %queue.name, "consumer timed out");
        if slot.is_some() || !self.session.cancel_notify {
            let text = format!(
                "PRECONDITION_FAILED - delivery acknowledgement on channel {} timed out. Timeout value used: {} ms. This timeout value can be configured, see consumers doc guide to learn more",
                self.number, timeout_ms
            );
            self.close_with(406, text, 0, 0);
            return;
        }
        if let Some((tag, _, exclusive)) = active {
            self.consumers.remove(&tag);
            self.session.unregister_consumer(id);
            queue.remove_consumer(exclusive);
            self.send(AMQPClass::Basic(basic::AMQPMethod::Cancel(basic::Cancel {
                consumer_tag: tag.as_str().into(),
                nowait: true,
            })));
            self.cancelled.push((id, queue.clone()));
        }
        let broker = self.session.broker.clone();
        tokio::spawn(async move {
            let _ = queue
                .call(QueueCommand::Cancel {
                    now_ms: crate::now_ms(),
                    consumer: id,
                })
                .await;
            broker.maybe_auto_delete(&queue).await;
        });
    }

    pub(super) async fn on_cancel(&mut self, c: basic::Cancel) -> Result<()> {
        let tag = c.consumer_tag.as_str().to_string();
        let entry = self
            .consumers
            .get(&tag)
            .map(|e| (e.id, e.queue.clone(), e.exclusive));
        if let Some((id, handle, exclusive)) = entry {
            let _ = handle
                .call(QueueCommand::Cancel {
                    now_ms: crate::now_ms(),
                    consumer: id,
                })
                .await;
            handle.remove_consumer(exclusive);
            self.session.unregister_consumer(id);
            if let Some(e) = self.consumers.get_mut(&tag) {
                e.cancelled = true;
            }
            self.session.broker.maybe_auto_delete(&handle).await;
        }
        if !c.nowait {
            self.deferred
                .push(AMQPClass::Basic(basic::AMQPMethod::CancelOk(
                    basic::CancelOk {
                        consumer_tag: tag.as_str().into(),
                    },
                )));
        }
        Ok(())
    }

    pub(super) async fn on_get(&mut self, g: basic::Get) -> Result<()> {
        let name = self.default_queue_name(g.queue.as_str())?;
        self.permit("queue", &name, Perm::Read)?;
        let (_, handle) = self.lookup_queue(&name).await?;
        let sac = handle.is_quorum()
            && self
                .session
                .broker
                .effective_config(&self.session.vhost, &name)
                .single_active_consumer;
        if sac {
            return Err(ProtocolError::channel(
                405,
                format!(
                    "RESOURCE_LOCKED - cannot obtain access to locked queue '{name}' in vhost '{}'. basic.get operations are not supported by quorum queues with single active consumer",
                    self.session.vhost
                ),
            ));
        }
        let slot = match self.get_slots.get(&handle.group) {
            Some((id, _)) => *id,
            None => {
                let id = self.session.register_consumer(self.key, handle.group);
                self.get_slots.insert(handle.group, (id, handle.clone()));
                id
            }
        };
        let reply = handle
            .call(QueueCommand::Dequeue {
                now_ms: crate::now_ms(),
                consumer: slot,
                no_ack: g.no_ack,
            })
            .await
            .map_err(ProtocolError::internal)?;
        let counts = handle.counts_deliveries();
        let QueueReply::Dequeued(Some((delivery, left))) = reply else {
            crate::node_counters::inc(&crate::node_counters::NODE.get_empty);
            self.send(AMQPClass::Basic(basic::AMQPMethod::GetEmpty(
                basic::GetEmpty {},
            )));
            return Ok(());
        };
        let Some(msg) = delivery
            .payload
            .as_ref()
            .and_then(|p| StoredMessage::decode_bytes(p).ok())
        else {
            return Err(ProtocolError::internal("stored message is missing"));
        };
        self.next_tag += 1;
        let tag = self.next_tag;
        if !g.no_ack {
            self.add_unacked(
                tag,
                Unacked {
                    queue: handle.clone(),
                    consumer: slot,
                    msg: delivery.id,
                    count: delivery.delivery_count,
                },
            );
        }
        self.send(AMQPClass::Basic(basic::AMQPMethod::GetOk(basic::GetOk {
            delivery_tag: tag,
            redelivered: delivery.delivery_count > 0,
            exchange: msg.exchange.as_str().into(),
            routing_key: msg.routing_key.as_str().into(),
            message_count: left as u32,
        })));
        crate::metrics::COUNTERS.delivered(delivery.delivery_count > 0);
        self.count_delivered(delivery.delivery_count > 0);
        count_queue_delivered(&handle, delivery.delivery_count > 0);
        crate::node_counters::inc(if g.no_ack {
            &crate::node_counters::NODE.delivered_get_auto_ack
        } else {
            &crate::node_counters::NODE.delivered_get_manual_ack
        });
        // RabbitMQ 3.10 adds x-delivery-count to every basic.get from a quorum
        // queue (spec §2.7), never on a classic queue.
        let props = if counts {
            with_delivery_count(&msg.properties, delivery.delivery_count)
        } else {
            msg.properties.clone()
        };
        self.write_content(&props, &msg.body);
        Ok(())
    }

    /// A consumer's queue was deleted: drop the consumer and send
    /// basic.cancel (consumer_cancel_notify, as RabbitMQ).
    pub(super) fn on_consumer_cancelled(&mut self, id: ConsumerId) {
        let Some(tag) = self
            .consumers
            .iter()
            .find(|(_, c)| c.id == id && !c.cancelled)
            .map(|(t, _)| t.clone())
        else {
            return;
        };
        self.consumers.remove(&tag);
        self.unacked.retain(|_, u| u.consumer != id);
        self.unacked_index = None;
        self.session.unregister_consumer(id);
        if !self.closing {
            self.send(AMQPClass::Basic(basic::AMQPMethod::Cancel(basic::Cancel {
                consumer_tag: tag.as_str().into(),
                nowait: true,
            })));
        }
    }

    /// A queue handed a message to one of this connection's consumers.
    pub(super) fn on_delivery(&mut self, d: QueueDelivery) {
        let found = if self.closing {
            None
        } else {
            self.consumers
                .iter()
                .find(|(_, c)| c.id == d.consumer)
                .map(|(tag, c)| (tag.clone(), c.no_ack, c.queue.clone()))
        };
        let Some((tag, no_ack, queue)) = found else {
            tracing::debug!(target: "deliveries", consumer = ?d.consumer, id = d.delivery.id, "dropped: no such consumer on this channel");
            return;
        };
        let counts = queue.counts_deliveries();
        if d.delivery.resend && self.holds_unacked(d.consumer, d.delivery.id) {
            // A new leader re-sent a delivery this consumer already has.
            tracing::debug!(target: "deliveries", consumer = ?d.consumer, id = d.delivery.id, "resend of a held delivery dropped");
            return;
        }
        let key = (d.consumer, d.delivery.id, d.delivery.delivery_count);
        if !d.delivery.resend && self.recent_resends.contains(&key) {
            // A deposed leader's original of a delivery a new leader already
            // re-sent here (held up by a partition): the same delivery twice.
            tracing::debug!(target: "deliveries", consumer = ?d.consumer, id = d.delivery.id, "late original of a re-sent delivery dropped");
            return;
        }
        if self.recent_settles.contains(&key) {
            // Settled here already: a new leader's re-send (the settlement
            // was not committed when the leader changed), or a deposed
            // leader's original delivery arriving after that re-send (held
            // up by a partition). Every return raises the delivery count,
            // so this very delivery cannot be due again.
            tracing::debug!(target: "deliveries", consumer = ?d.consumer, id = d.delivery.id, resend = d.delivery.resend, "delivery of a settled message dropped");
            return;
        }
        count_queue_delivered(&queue, d.delivery.delivery_count > 0);
        let Some(msg) = d
            .delivery
            .payload
            .as_ref()
            .and_then(|p| StoredMessage::decode_bytes(p).ok())
        else {
            tracing::error!(queue = %queue.name, id = d.delivery.id, "delivered message has no stored payload");
            return;
        };
        if d.delivery.resend {
            self.recent_resends.insert(key);
        } else {
            // The new leader's re-sends are over: regular deliveries follow.
            self.unacked_index = None;
        }
        self.next_tag += 1;
        let dtag = self.next_tag;
        tracing::debug!(target: "deliveries", consumer = ?d.consumer, id = d.delivery.id, dtag, "to client");
        if !no_ack {
            self.add_unacked(
                dtag,
                Unacked {
                    queue,
                    consumer: d.consumer,
                    msg: d.delivery.id,
                    count: d.delivery.delivery_count,
                },
            );
        }
        self.send(AMQPClass::Basic(basic::AMQPMethod::Deliver(
            basic::Deliver {
                consumer_tag: tag.as_str().into(),
                delivery_tag: dtag,
                redelivered: d.delivery.delivery_count > 0,
                exchange: msg.exchange.as_str().into(),
                routing_key: msg.routing_key.as_str().into(),
            },
        )));
        crate::metrics::COUNTERS.delivered(d.delivery.delivery_count > 0);
        self.count_delivered(d.delivery.delivery_count > 0);
        crate::node_counters::inc(if no_ack {
            &crate::node_counters::NODE.delivered_consume_auto_ack
        } else {
            &crate::node_counters::NODE.delivered_consume_manual_ack
        });
        let props = if d.delivery.delivery_count > 0 && counts {
            with_delivery_count(&msg.properties, d.delivery.delivery_count)
        } else {
            msg.properties.clone()
        };
        self.write_content(&props, &msg.body);
    }
}

/// Counts a delivery or get answer of `queue` (management API `message_stats`).
fn count_queue_delivered(queue: &crate::queue::handle::QueueHandle, redelivered: bool) {
    crate::tracking::MessageCounts::add(&queue.stats.deliver_get, 1);
    if redelivered {
        crate::tracking::MessageCounts::add(&queue.stats.redeliver, 1);
    }
}

/// Raw properties with an `x-delivery-count` header (long), spec §2.7.
fn with_delivery_count(raw: &Bytes, count: u32) -> Bytes {
    let Ok((_, props)) = basic::parse_properties(&raw[..]) else {
        return raw.clone();
    };
    let mut headers = props.headers().clone().unwrap_or_default();
    headers.insert(
        "x-delivery-count".into(),
        AMQPValue::LongLongInt(i64::from(count)),
    );
    codec::encode_properties(&props.with_headers(headers))
}
