//! Settling deliveries: basic.ack, basic.nack, basic.reject, basic.recover,
//! and the ledger of unacked deliveries by delivery tag.

use std::sync::Arc;

use super::{Channel, Result, Unacked};
use crate::amqp::error::ProtocolError;
use crate::queue::handle::QueueHandle;
use crate::queue::types::{ConsumerId, MsgId, QueueCommand};

/// What a settlement does to its messages.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Settlement {
    /// basic.ack: done with.
    Ack,
    /// nack/reject with requeue: back to the queue.
    Requeue,
    /// nack/reject without requeue: dead-lettered or dropped.
    Discard,
}

impl Channel {
    /// Records an unacked delivery under its delivery tag.
    pub(super) fn add_unacked(&mut self, tag: u64, u: Unacked) {
        if let Some(ix) = &mut self.unacked_index {
            ix.insert((u.consumer, u.msg));
        }
        self.unacked.insert(tag, u);
    }

    /// Removes (settles) the unacked delivery `tag`.
    pub(super) fn take_unacked(&mut self, tag: u64) -> Option<Unacked> {
        let u = self.unacked.remove(&tag)?;
        if let Some(ix) = &mut self.unacked_index {
            ix.remove(&(u.consumer, u.msg));
        }
        Some(u)
    }

    /// True when message `msg` is delivered to `consumer` and not yet
    /// settled (builds the index on the first re-sent delivery).
    pub(super) fn holds_unacked(&mut self, consumer: ConsumerId, msg: MsgId) -> bool {
        let unacked = &self.unacked;
        self.unacked_index
            .get_or_insert_with(|| unacked.values().map(|u| (u.consumer, u.msg)).collect())
            .contains(&(consumer, msg))
    }

    /// basic.recover(requeue=true): every unacked delivery of the channel
    /// goes back to its queue (requeue=false: 540, as RabbitMQ).
    pub(super) async fn recover(&mut self, requeue: bool) -> Result<()> {
        if !requeue {
            return Err(ProtocolError::not_implemented("requeue=false"));
        }
        let all: Vec<u64> = self.unacked.keys().copied().collect();
        let tags = all;
        self.settle_tags(tags, Settlement::Requeue).await
    }

    /// basic.ack/nack/reject: the tag must be an unacked delivery of this
    /// channel (406 "unknown delivery tag N" otherwise, as rabbit_channel's
    /// collect_acks); `multiple` takes every tag up to it; tag 0 with
    /// `multiple` takes everything.
    pub(super) async fn settle(&mut self, tag: u64, multiple: bool, how: Settlement) -> Result<()> {
        if !self.timed_out_tags.is_empty() {
            // A consumer timeout took these back: settling them is no error.
            let late = if multiple {
                let hit = self.timed_out_tags.contains(&tag);
                if tag != 0 {
                    self.timed_out_tags.retain(|t| *t > tag);
                }
                hit
            } else {
                self.timed_out_tags.remove(&tag)
            };
            if late {
                if !multiple {
                    return Ok(());
                }
                let tags: Vec<u64> = self.unacked.range(..=tag).map(|(t, _)| *t).collect();
                return self.settle_tags(tags, how).await;
            }
        }
        let tags: Vec<u64> = if multiple && tag == 0 {
            self.unacked.keys().copied().collect()
        } else if !self.unacked.contains_key(&tag) {
            return Err(ProtocolError::precondition(format!(
                "unknown delivery tag {tag}"
            )));
        } else if multiple {
            self.unacked.range(..=tag).map(|(t, _)| *t).collect()
        } else {
            vec![tag]
        };
        self.settle_tags(tags, how).await
    }

    /// Settles the unacked deliveries `tags` (unknown ones are skipped): one
    /// command per (queue, consumer), proposed now or held in tx mode.
    pub(super) async fn settle_tags(&mut self, tags: Vec<u64>, how: Settlement) -> Result<()> {
        // Group by (queue, consumer), keeping delivery-tag order (spec §2.2).
        let mut groups: Vec<(Arc<QueueHandle>, ConsumerId, Vec<MsgId>)> = Vec::new();
        for t in tags {
            if let Some(u) = self.take_unacked(t) {
                self.recent_settles.insert((u.consumer, u.msg, u.count));
                match groups
                    .iter_mut()
                    .find(|(q, c, _)| q.group == u.queue.group && *c == u.consumer)
                {
                    Some(g) => g.2.push(u.msg),
                    None => groups.push((u.queue, u.consumer, vec![u.msg])),
                }
            }
        }
        let now_ms = crate::now_ms();
        if how == Settlement::Ack {
            let n: usize = groups.iter().map(|g| g.2.len()).sum();
            crate::metrics::COUNTERS.acknowledged(n as u64);
            crate::tracking::MessageCounts::add(&self.counts().ack, n as u64);
        }
        for (queue, consumer, ids) in groups {
            if how == Settlement::Ack {
                crate::tracking::MessageCounts::add(&queue.stats.ack, ids.len() as u64);
            }
            let cmd = match how {
                Settlement::Ack => QueueCommand::Settle {
                    now_ms,
                    consumer,
                    ids,
                },
                Settlement::Requeue => QueueCommand::Return {
                    now_ms,
                    consumer,
                    ids,
                },
                Settlement::Discard => QueueCommand::Discard {
                    now_ms,
                    consumer,
                    ids,
                },
            };
            // Ordered behind earlier commands; not awaited here, but retried
            // in the background if no leader took it.
            if let Some(pending) = self.submit(queue.clone(), cmd.clone()).await {
                tokio::spawn(queue.keep_proposing(cmd, pending));
            }
        }
        Ok(())
    }
}
