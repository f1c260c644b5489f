//! basic.publish and its content frames, confirm.select, and publisher
//! confirms (basic.ack / basic.nack to the publisher).

use amq_protocol::protocol::basic::{self, AMQPProperties};
use amq_protocol::protocol::{confirm, AMQPClass};
use bytes::{Bytes, BytesMut};

use super::{Channel, Completion, Result};
use crate::amqp::codec;
use crate::amqp::confirms::ConfirmTracker;
use crate::amqp::error::ProtocolError;
use crate::message::StoredMessage;
use crate::meta::access::Perm;
use crate::meta::publish::{publish_keys, strip_bcc, PublishKeys};
use crate::node_counters;
use crate::queue::types::{EnqueueMsg, EnqueueOutcome, PrioritizedMsg, QueueCommand, QueueReply};
use crate::tracking::MessageCounts;

/// Most body bytes reserved when a content header arrives (bytes). A larger body gets the
/// rest of its declared size in one allocation once its frames have filled that much (a
/// client has to send a megabyte before the broker trusts its declared size): growing by
/// doubling copied a 100 MiB body six times over and held it in a 128 MiB buffer.
const BODY_RESERVE_BYTES: u64 = 1 << 20;
/// Largest message body accepted (bytes), RabbitMQ 3.10's `max_message_size`.
pub const MAX_MESSAGE_SIZE: u64 = 134_217_728;

/// A basic.publish whose content is still arriving.
pub(super) struct Publishing {
    pub(super) publish: basic::Publish,
    header: Option<(AMQPProperties, Bytes, u64)>,
    body: BytesMut,
}

impl Publishing {
    /// basic.publish seen; its content header comes next.
    pub(super) fn new(publish: basic::Publish) -> Publishing {
        Publishing {
            publish,
            header: None,
            body: BytesMut::new(),
        }
    }
}

impl Channel {
    /// Content header frame of a publish.
    pub(super) async fn on_content_header(
        &mut self,
        class_id: u16,
        body_size: u64,
        properties: AMQPProperties,
        raw: Bytes,
    ) -> Result<()> {
        if self.closing {
            return Ok(());
        }
        let Some(p) = self.content.as_mut() else {
            return Err(ProtocolError::unexpected_frame(
                "expected method frame, got non method frame instead",
            ));
        };
        if p.header.is_some() || class_id != 60 {
            return Err(ProtocolError::unexpected_frame(
                "expected content body, got non content body frame instead",
            ));
        }
        if body_size > MAX_MESSAGE_SIZE {
            self.content = None;
            let text = format!(
                "message size {body_size} is larger than configured max size {MAX_MESSAGE_SIZE}"
            );
            self.close_with(406, format!("PRECONDITION_FAILED - {text}"), 60, 40);
            return Ok(());
        }
        p.header = Some((properties, raw, body_size));
        // The declared size is the client's word: reserve at most one chunk up front and grow
        // as body frames arrive (2,047 channels announcing 128 MiB each must not reserve 256 GiB).
        p.body.reserve(body_size.min(BODY_RESERVE_BYTES) as usize);
        if body_size == 0 {
            return self.finish_publish().await;
        }
        Ok(())
    }

    /// Content body frame of a publish.
    pub(super) async fn on_content_body(&mut self, body: Bytes) -> Result<()> {
        if self.closing {
            return Ok(());
        }
        let Some(p) = self.content.as_mut() else {
            return Err(ProtocolError::unexpected_frame(
                "expected method frame, got non method frame instead",
            ));
        };
        let Some((_, _, size)) = p.header.as_ref() else {
            return Err(ProtocolError::unexpected_frame(
                "expected content header for class 60, got non content header frame instead",
            ));
        };
        let size = *size;
        let after = (p.body.len() + body.len()) as u64;
        if after > p.body.capacity() as u64 && after <= size {
            p.body.reserve((size - p.body.len() as u64) as usize);
        }
        p.body.extend_from_slice(&body);
        if p.body.len() as u64 > size {
            return Err(ProtocolError::connection(
                501,
                "FRAME_ERROR - content body larger than declared size",
            ));
        }
        if p.body.len() as u64 == size {
            return self.finish_publish().await;
        }
        Ok(())
    }

    /// The publish's content is complete: route and enqueue it; a channel
    /// error closes the channel (class 60, method 40).
    pub(super) async fn finish_publish(&mut self) -> Result<()> {
        let r = self.publish().await;
        if let Err(ProtocolError::Channel { code, text }) = r {
            self.close_with(code, text, 60, 40);
            return Ok(());
        }
        r
    }

    /// Routes the completed publish and proposes it to every target queue;
    /// in confirm mode a wait for all of them joins the confirm waits.
    pub(super) async fn publish(&mut self) -> Result<()> {
        let Some(Publishing {
            publish,
            header: Some((mut props, mut raw, _)),
            body,
        }) = self.content.take()
        else {
            return Ok(());
        };
        let seq = self.confirms.as_mut().map(|c| c.allocate());
        let exchange = publish.exchange.as_str().to_string();
        let routing_key = publish.routing_key.as_str().to_string();
        self.permit("exchange", &exchange, Perm::Write)?;
        if let Some(user) = props.user_id() {
            if user.as_str() != self.session.user {
                return Err(ProtocolError::precondition(format!(
                    "user_id property set to '{}' but authenticated user was '{}'",
                    user.as_str(),
                    self.session.user
                )));
            }
        }
        let PublishKeys { keys, bcc, ttl_ms } = publish_keys(
            &routing_key,
            props.headers().as_ref(),
            props.expiration().as_ref().map(|e| e.as_str()),
        )?;
        let targets = self
            .session
            .broker
            .route(
                &self.session.vhost,
                &exchange,
                &keys,
                props.headers().as_ref(),
                self.arrived,
            )
            .await?;
        if !bcc.is_empty() {
            if let Some(mut h) = props.headers().clone() {
                strip_bcc(&mut h);
                props = props.with_headers(h);
                raw = codec::encode_properties(&props);
            }
        }
        let body = body.freeze();
        crate::metrics::COUNTERS.published(!targets.is_empty());
        crate::metrics::COUNTERS.message_received(body.len());
        MessageCounts::add(&self.counts().publish, 1);
        if seq.is_some() {
            node_counters::inc(&node_counters::NODE.received_confirm);
        }
        self.session.broker.tracking().exchange_published(
            &self.session.vhost,
            &exchange,
            !targets.is_empty(),
        );
        if targets.is_empty() {
            tracing::debug!(target: "proposals", exchange = %exchange, routing_key = %routing_key, "unroutable publish");
            node_counters::inc(if publish.mandatory {
                &node_counters::NODE.unroutable_returned
            } else {
                &node_counters::NODE.unroutable_dropped
            });
            if publish.mandatory {
                self.send(AMQPClass::Basic(basic::AMQPMethod::Return(basic::Return {
                    reply_code: 312,
                    reply_text: "NO_ROUTE".into(),
                    exchange: exchange.as_str().into(),
                    routing_key: routing_key.as_str().into(),
                })));
                self.write_content(&raw, &body);
            }
            if let Some(seq) = seq {
                if let Some(c) = self.confirms.as_mut() {
                    c.complete(seq, true);
                    crate::metrics::COUNTERS.confirmed(1);
                    MessageCounts::add(&self.counts().confirm, 1);
                }
                self.send_confirms();
            }
            return Ok(());
        }
        let body_size = body.len() as u32;
        let stored = StoredMessage {
            exchange,
            routing_key,
            bcc,
            properties: raw,
            body,
        };
        let payload = stored.encode().map_err(ProtocolError::internal)?;
        let now_ms = crate::now_ms();
        let mut waits = Vec::with_capacity(targets.len());
        let priority = props.priority().unwrap_or(0);
        for q in targets {
            MessageCounts::add(&q.stats.publish, 1);
            let msg = PrioritizedMsg {
                msg: EnqueueMsg {
                    payload: payload.clone(),
                    body_size,
                    ttl_ms,
                },
                priority: q.message_priority(priority),
            };
            let cmd = QueueCommand::enqueue(now_ms, vec![msg]);
            if let Some(w) = self.submit(q, cmd).await {
                waits.push(w);
            }
        }

        if let Some(seq) = seq {
            let channel = self.key;
            self.confirm_waits.push(Box::pin(async move {
                let mut ok = true;
                for w in waits {
                    match w.await {
                        Ok(Ok(QueueReply::Enqueued(outcomes))) => {
                            ok &= outcomes.iter().all(|o| *o == EnqueueOutcome::Accepted);
                        }
                        _ => ok = false,
                    }
                }
                Completion::Confirm { channel, seq, ok }
            }));
        }
        Ok(())
    }

    /// Writes basic.ack / basic.nack for the publishes confirmed so far, in
    /// publish order (a run of acks as one `multiple` ack).
    pub fn send_confirms(&mut self) {
        let frames = match self.confirms.as_mut() {
            Some(c) => c.drain(),
            None => return,
        };
        for (tag, multiple, ack) in frames {
            let m = if ack {
                basic::AMQPMethod::Ack(basic::Ack {
                    delivery_tag: tag,
                    multiple,
                })
            } else {
                basic::AMQPMethod::Nack(basic::Nack {
                    delivery_tag: tag,
                    multiple,
                    requeue: false,
                })
            };
            self.send(AMQPClass::Basic(m));
        }
    }

    /// Records that confirm-mode publish `seq` completed (`ok`: ack, else
    /// nack); [`Channel::send_confirms`] writes the frames.
    pub fn confirmed(&mut self, seq: u64, ok: bool) {
        if let Some(t) = self.confirms.as_mut() {
            t.complete(seq, ok);
            if ok {
                crate::metrics::COUNTERS.confirmed(1);
                MessageCounts::add(&self.counts().confirm, 1);
            }
        }
    }

    /// confirm.select: the channel confirms its publishes from now on
    /// (406 after tx.select).
    pub(super) fn on_confirm_select(&mut self, s: confirm::Select) -> Result<()> {
        if self.tx.is_some() {
            return Err(ProtocolError::precondition(
                "cannot switch from tx to confirm mode",
            ));
        }
        if self.confirms.is_none() {
            self.confirms = Some(ConfirmTracker::default());
        }
        if !s.nowait {
            self.send(AMQPClass::Confirm(confirm::AMQPMethod::SelectOk(
                confirm::SelectOk {},
            )));
        }
        Ok(())
    }
}
