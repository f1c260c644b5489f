//! The ready messages: per message priority a lane holding the returns
//! queue (served first) and the main FIFO, as in rabbit_fifo 3.10
//! (`returns` + `messages`), with running totals. A queue without
//! `x-max-priority` keeps every message at priority 0: one lane, exactly the
//! 3.10 FIFO.

use std::collections::{BTreeSet, VecDeque};

use serde::ser::SerializeSeq;
use serde::{Deserialize, Serialize, Serializer};

use super::message::Msg;
use super::types::MsgId;

/// The ready messages of one priority: every message of `returns`, then `main`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Lane {
    /// Returned messages (front requeue, consumer down), FIFO in return order (spec §2.8).
    returns: VecDeque<Msg>,
    /// Enqueued messages (and 3.10 back-requeues), FIFO.
    main: VecDeque<Msg>,
}

impl Lane {
    fn head(&self) -> Option<&Msg> {
        self.returns.front().or_else(|| self.main.front())
    }

    fn pop_head(&mut self) -> Option<Msg> {
        self.returns.pop_front().or_else(|| self.main.pop_front())
    }

    fn is_empty(&self) -> bool {
        self.returns.is_empty() && self.main.is_empty()
    }

    fn iter(&self) -> impl Iterator<Item = &Msg> + '_ {
        self.returns.iter().chain(self.main.iter())
    }
}

/// Priorities with a non-empty lane, one bit each (256 priorities).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Occupied([u64; 4]);

impl Occupied {
    fn set(&mut self, p: u8, on: bool) {
        let (w, b) = (usize::from(p / 64), p % 64);
        if on {
            self.0[w] |= 1 << b;
        } else {
            self.0[w] &= !(1 << b);
        }
    }

    /// The highest occupied priority.
    fn top(&self) -> Option<u8> {
        (0..4).rev().find_map(|w| {
            let word = self.0[w];
            (word != 0).then(|| (w * 64 + 63 - word.leading_zeros() as usize) as u8)
        })
    }

    /// Occupied priorities, highest first.
    fn iter(self) -> impl Iterator<Item = u8> {
        (0..4usize).rev().flat_map(move |w| {
            let mut word = self.0[w];
            std::iter::from_fn(move || {
                (word != 0).then(|| {
                    let b = 63 - word.leading_zeros();
                    word &= !(1u64 << b);
                    (w * 64 + b as usize) as u8
                })
            })
        })
    }
}

/// Ready messages in delivery order: the lanes from the highest priority
/// down, each lane's returns before its main queue. Strict priority: a
/// message is delivered only when no higher priority has one ready.
///
/// On disk (snapshots) it keeps the shape of snapshot formats 0 and 1, two
/// FIFOs and the byte total: every lane's returns (highest priority first),
/// every lane's main queue, the total; reading splits them back into lanes
/// by each message's priority, so the order within a lane survives.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(from = "ReadyRepr")]
pub(super) struct ReadyQueue {
    /// Lane per priority, index = priority; grown on demand (a queue
    /// without priorities has one).
    lanes: Vec<Lane>,
    occupied: Occupied,
    /// Number of ready messages.
    len: usize,
    /// Sum of `size` over every lane, bytes.
    bytes: u64,
}

impl ReadyQueue {
    /// Number of ready messages.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when nothing is ready.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Body bytes of the ready messages.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The highest priority with a ready message. A queue without
    /// priorities (one lane) skips the bitmap.
    fn top(&self) -> Option<u8> {
        if self.lanes.len() <= 1 {
            return (self.len > 0).then_some(0);
        }
        self.occupied.top()
    }

    /// Take the next message to be delivered.
    pub fn pop_head(&mut self) -> Option<Msg> {
        self.pop_from(self.top()?)
    }

    /// Take the head of lane `p` (occupied).
    fn pop_from(&mut self, p: u8) -> Option<Msg> {
        let lane = &mut self.lanes[usize::from(p)];
        let msg = lane.pop_head()?;
        if lane.is_empty() {
            self.occupied.set(p, false);
        }
        self.len -= 1;
        self.bytes -= u64::from(msg.size);
        Some(msg)
    }

    /// Take the first lane head, highest priority first, that `pred` picks:
    /// head-only expiry per priority (RabbitMQ's classic priority queue
    /// drops expired messages at the head of every priority).
    pub fn pop_head_where(&mut self, mut pred: impl FnMut(&Msg) -> bool) -> Option<Msg> {
        let p = if self.lanes.len() <= 1 {
            self.lanes.first()?.head().is_some_and(pred).then_some(0)?
        } else {
            self.occupied
                .iter()
                .find(|p| self.lanes[usize::from(*p)].head().is_some_and(&mut pred))?
        };
        self.pop_from(p)
    }

    /// The earliest expiry over the heads of every priority (see
    /// [`super::message::Msg::expiry_ms`]).
    pub fn next_head_expiry_ms(&self) -> Option<u64> {
        if self.lanes.len() <= 1 {
            return self.lanes.first()?.head()?.expiry_ms();
        }
        self.occupied
            .iter()
            .filter_map(|p| self.lanes[usize::from(p)].head()?.expiry_ms())
            .min()
    }

    /// The lane of `msg`'s priority, created if needed, marked occupied.
    fn lane_for(&mut self, msg: &Msg) -> &mut Lane {
        let p = msg.priority();
        if self.lanes.len() <= usize::from(p) {
            self.lanes.resize_with(usize::from(p) + 1, Lane::default);
        }
        self.occupied.set(p, true);
        self.len += 1;
        self.bytes += u64::from(msg.size);
        &mut self.lanes[usize::from(p)]
    }

    /// Append to the tail of its priority's main queue (enqueue, 3.10
    /// requeue-to-back).
    pub fn push_back(&mut self, msg: Msg) {
        self.lane_for(&msg).main.push_back(msg);
    }

    /// Append to its priority's returns queue (served before that
    /// priority's main queue).
    pub fn push_return(&mut self, msg: Msg) {
        self.lane_for(&msg).returns.push_back(msg);
    }

    /// Remove every ready message, in delivery order.
    pub fn drain(&mut self) -> impl Iterator<Item = Msg> + '_ {
        self.len = 0;
        self.bytes = 0;
        self.occupied = Occupied::default();
        self.lanes
            .iter_mut()
            .rev()
            .flat_map(|l| l.returns.drain(..).chain(l.main.drain(..)))
    }

    /// Take the ready messages whose ids are in `ids`; the others keep
    /// their order. Returns the taken ones in delivery order. Each lane is
    /// scanned only until every id is found, so ids near the head (where a
    /// redrive takes them from) cost little.
    pub fn remove_ids(&mut self, ids: &BTreeSet<MsgId>) -> Vec<Msg> {
        let mut out = Vec::new();
        if ids.is_empty() || self.len == 0 {
            return out;
        }
        for p in (0..self.lanes.len()).rev() {
            let lane = &mut self.lanes[p];
            for q in [&mut lane.returns, &mut lane.main] {
                let mut i = 0;
                while i < q.len() && out.len() < ids.len() {
                    if ids.contains(&q[i].id) {
                        out.extend(q.remove(i));
                    } else {
                        i += 1;
                    }
                }
            }
            if lane.is_empty() {
                self.occupied.set(p as u8, false);
            }
        }
        self.len -= out.len();
        self.bytes -= out.iter().map(|m| u64::from(m.size)).sum::<u64>();
        out
    }

    /// Ready messages in delivery order.
    pub fn iter(&self) -> impl Iterator<Item = &Msg> + '_ {
        self.lanes.iter().rev().flat_map(Lane::iter)
    }

    /// Test-only consistency check of the running totals and lanes.
    #[cfg(test)]
    pub fn check(&self) -> Result<(), String> {
        let sum: u64 = self.iter().map(|m| u64::from(m.size)).sum();
        if sum != self.bytes {
            return Err(format!("ready bytes {} != sum {}", self.bytes, sum));
        }
        if self.iter().count() != self.len {
            return Err(format!("ready len {} is stale", self.len));
        }
        for (p, lane) in self.lanes.iter().enumerate() {
            if lane.iter().any(|m| usize::from(m.priority()) != p) {
                return Err(format!("a message in lane {p} has another priority"));
            }
            let bit = self.occupied.0[p / 64] & (1 << (p % 64)) != 0;
            if bit == lane.is_empty() {
                return Err(format!("occupied bit of lane {p} is wrong"));
            }
        }
        Ok(())
    }
}

/// Equal when every priority holds the same returns and main queue (lanes
/// that exist but are empty do not count).
impl PartialEq for ReadyQueue {
    fn eq(&self, other: &Self) -> bool {
        let n = self.lanes.len().max(other.lanes.len());
        let empty = Lane::default();
        self.bytes == other.bytes
            && self.len == other.len
            && (0..n).all(|p| {
                self.lanes.get(p).unwrap_or(&empty) == other.lanes.get(p).unwrap_or(&empty)
            })
    }
}

impl Eq for ReadyQueue {}

/// The on-disk shape (snapshot formats 0 to 2): returns, main, bytes.
#[derive(Deserialize)]
struct ReadyRepr {
    returns: VecDeque<Msg>,
    main: VecDeque<Msg>,
    #[allow(dead_code)]
    bytes: u64,
}

impl From<ReadyRepr> for ReadyQueue {
    fn from(r: ReadyRepr) -> Self {
        let mut q = ReadyQueue::default();
        for m in r.returns {
            q.push_return(m);
        }
        for m in r.main {
            q.push_back(m);
        }
        q
    }
}

/// A sequence of `len` messages from an iterator (bincode needs the length first).
struct Seq<F>(usize, F);

impl<'a, I: Iterator<Item = &'a Msg>, F: Fn() -> I> Serialize for Seq<F> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.0))?;
        for m in (self.1)() {
            seq.serialize_element(m)?;
        }
        seq.end()
    }
}

impl Serialize for ReadyQueue {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let lanes = || self.lanes.iter().rev();
        let returns = lanes().map(|l| l.returns.len()).sum();
        let main = lanes().map(|l| l.main.len()).sum();
        let mut st = s.serialize_struct("ReadyQueue", 3)?;
        st.serialize_field(
            "returns",
            &Seq(returns, || lanes().flat_map(|l| l.returns.iter())),
        )?;
        st.serialize_field("main", &Seq(main, || lanes().flat_map(|l| l.main.iter())))?;
        st.serialize_field("bytes", &self.bytes)?;
        st.end()
    }
}
