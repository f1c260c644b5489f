//! The ready messages: the returns queue (served first) and the main FIFO,
//! as in rabbit_fifo 3.10 (`returns` + `messages`), with running totals.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use super::message::Msg;

/// Ready messages in delivery order: every message of `returns`, then `main`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct ReadyQueue {
    /// Returned messages (front requeue, consumer down), FIFO in return order (spec §2.8).
    returns: VecDeque<Msg>,
    /// Enqueued messages (and 3.10 back-requeues), FIFO.
    main: VecDeque<Msg>,
    /// Sum of `size` over both queues, bytes.
    bytes: u64,
}

impl ReadyQueue {
    /// Number of ready messages.
    pub fn len(&self) -> usize {
        self.returns.len() + self.main.len()
    }

    /// True when nothing is ready.
    pub fn is_empty(&self) -> bool {
        self.returns.is_empty() && self.main.is_empty()
    }

    /// Body bytes of the ready messages.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The next message to be delivered: returns head, else main head.
    pub fn head(&self) -> Option<&Msg> {
        self.returns.front().or_else(|| self.main.front())
    }

    /// Take the next message to be delivered.
    pub fn pop_head(&mut self) -> Option<Msg> {
        let msg = match self.returns.pop_front() {
            Some(m) => m,
            None => self.main.pop_front()?,
        };
        self.bytes -= u64::from(msg.size);
        Some(msg)
    }

    /// Append to the tail of the main queue (enqueue, 3.10 requeue-to-back).
    pub fn push_back(&mut self, msg: Msg) {
        self.bytes += u64::from(msg.size);
        self.main.push_back(msg);
    }

    /// Append to the returns queue (served before the main queue).
    pub fn push_return(&mut self, msg: Msg) {
        self.bytes += u64::from(msg.size);
        self.returns.push_back(msg);
    }

    /// Remove every ready message, in delivery order.
    pub fn drain(&mut self) -> impl Iterator<Item = Msg> + '_ {
        self.bytes = 0;
        self.returns.drain(..).chain(self.main.drain(..))
    }

    /// Ready messages in delivery order.
    pub fn iter(&self) -> impl Iterator<Item = &Msg> + '_ {
        self.returns.iter().chain(self.main.iter())
    }

    /// Test-only consistency check of the running totals.
    #[cfg(test)]
    pub fn check(&self) -> Result<(), String> {
        let sum: u64 = self.iter().map(|m| u64::from(m.size)).sum();
        if sum != self.bytes {
            return Err(format!("ready bytes {} != sum {}", self.bytes, sum));
        }
        Ok(())
    }
}
