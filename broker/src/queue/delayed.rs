//! Delayed retry (RabbitMQ 4.3 `x-delayed-retry-*`, rabbitmq-server PR
//! 13885): returned messages that wait before they are ready again, and
//! which returns wait ([`ReturnCause`] against [`DelayedRetryType`]).
//!
//! The waiting messages are part of the replicated state, ordered by
//! (ready-at, id); time comes only from the commands' `now_ms`. A message is
//! released to the back of the returns queue by the first command whose
//! `now_ms` is at or past its ready-at, in (ready-at, id) order; the leader's
//! timer (`Effect::ExpiryTimer`) fires at the earliest ready-at, so an idle
//! queue holding any number of delayed messages costs one timer and, when
//! it fires, work only for the messages that are due.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::machine::QueueMachine;
use super::message::Msg;
use super::types::{DelayedRetry, DelayedRetryType, MsgId};

/// Why a checked-out message goes back to the queue. The one place that
/// decides which returns a delayed-retry kind delays ([`ReturnCause::delayed_by`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReturnCause {
    /// The consumer gave it back: basic.reject / basic.nack with requeue,
    /// basic.recover (`QueueCommand::Return`).
    Failed,
    /// The consumer went away holding it: channel or connection closed
    /// (`ConsumerDown`), its node restarted (`NodeRestarted`) or is down
    /// (`NodeDown`), or its delivery timed out (consumer timeout).
    ConsumerGone,
}

impl ReturnCause {
    /// Whether delayed retry of `kind` delays a return of this cause:
    /// `failed` delays `Failed`, `returned` delays `ConsumerGone`, `all`
    /// both, `disabled` none.
    pub fn delayed_by(self, kind: DelayedRetryType) -> bool {
        matches!(
            (kind, self),
            (DelayedRetryType::All, _)
                | (DelayedRetryType::Failed, ReturnCause::Failed)
                | (DelayedRetryType::Returned, ReturnCause::ConsumerGone)
        )
    }
}

/// The delay of a return: `min(min_ms × n, max_ms)` ms, n = the message's
/// delivery count after this return (at least 1), saturating.
pub(super) fn retry_delay_ms(cfg: &DelayedRetry, delivery_count: u32) -> u64 {
    let n = u64::from(delivery_count.max(1));
    cfg.min_ms.saturating_mul(n).min(cfg.max_ms)
}

/// Delayed messages by (ready-at ms, id), with their body bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct DelayedArea {
    entries: BTreeMap<(u64, MsgId), Msg>,
    /// Sum of `size`, bytes.
    bytes: u64,
}

impl DelayedArea {
    /// Delay `msg` until `ready_at` ms.
    pub fn push(&mut self, ready_at: u64, msg: Msg) {
        self.bytes += u64::from(msg.size);
        self.entries.insert((ready_at, msg.id), msg);
    }

    /// The earliest ready-at, if any message waits.
    pub fn next_ready_at(&self) -> Option<u64> {
        self.entries.first_key_value().map(|((at, _), _)| *at)
    }

    /// Take the earliest message if it is due at `now_ms`.
    pub fn pop_due(&mut self, now_ms: u64) -> Option<Msg> {
        if self.next_ready_at()? > now_ms {
            return None;
        }
        self.pop_first()
    }

    /// Take the earliest message, due or not (drop-head when nothing is ready).
    pub fn pop_first(&mut self) -> Option<Msg> {
        let (_, msg) = self.entries.pop_first()?;
        self.bytes -= u64::from(msg.size);
        Some(msg)
    }

    /// Remove everything, in (ready-at, id) order.
    pub fn drain(&mut self) -> Vec<Msg> {
        self.bytes = 0;
        std::mem::take(&mut self.entries).into_values().collect()
    }

    /// Delayed messages with their ready-at, in (ready-at, id) order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &Msg)> + '_ {
        self.entries.iter().map(|((at, _), m)| (*at, m))
    }

    /// Number of delayed messages.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Body bytes of the delayed messages.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Test-only consistency check of the totals.
    #[cfg(test)]
    pub fn check(&self) -> Result<(), String> {
        let sum: u64 = self.entries.values().map(|m| u64::from(m.size)).sum();
        if sum != self.bytes {
            return Err(format!("delayed bytes {} != sum {}", self.bytes, sum));
        }
        if self.entries.iter().any(|((_, id), m)| *id != m.id) {
            return Err("delayed key id != message id".into());
        }
        Ok(())
    }
}

impl QueueMachine {
    /// If delayed retry delays a return of `cause`, park `msg` (its delivery
    /// count already raised) until `now_ms + delay` and return None; else
    /// hand it back.
    pub(super) fn maybe_delay(&mut self, msg: Msg, cause: ReturnCause, now_ms: u64) -> Option<Msg> {
        let cfg = self.config.delayed_retry;
        if !cause.delayed_by(cfg.kind) {
            return Some(msg);
        }
        let ready_at = now_ms.saturating_add(retry_delay_ms(&cfg, msg.delivery_count()));
        self.delayed.push(ready_at, msg);
        None
    }

    /// Move every delayed message due at `now_ms` to the back of the returns
    /// queue, in (ready-at, id) order. Costs O(log n) when nothing is due.
    pub(super) fn release_delayed(&mut self, now_ms: u64) {
        while let Some(msg) = self.delayed.pop_due(now_ms) {
            self.ready.push_return(msg);
        }
    }
}
