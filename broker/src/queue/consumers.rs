//! Consumer records (rabbit_fifo `consumers` + `service_queue`): what each
//! consumer has checked out, its prefetch, and the round-robin order.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::{Deserialize, Serialize};

use super::message::Msg;
use super::types::{ConsumerId, MsgId};

/// One consumer, a cancelled consumer that still holds messages, or a
/// channel's basic.get slot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Consumer {
    /// Max messages checked out at once; 0 = unlimited.
    pub prefetch: u32,
    /// Settle on delivery (nothing is ever checked out by a push).
    pub no_ack: bool,
    /// Receives pushes. False for a cancelled consumer or a basic.get slot.
    pub active: bool,
    /// Its node is down as the leader sees it (`NodeDown`): no pushes until
    /// `NodeUp` (rabbit_fifo `suspected_down`).
    pub suspected: bool,
    /// In the service queue (= active with spare prefetch).
    queued: bool,
    /// Messages delivered and not yet settled, by id.
    pub checked_out: BTreeMap<MsgId, Msg>,
    /// Consumer timeout of its deliveries, ms (`ConsumerSpec::timeout_ms`);
    /// None = the queue's `consumer_timeout_ms` (a basic.get slot).
    pub timeout_ms: Option<u64>,
    /// When each checked-out message was checked out (the `now_ms` of the
    /// command), ordered by time: the first is the oldest unsettled delivery
    /// (consumer timeouts). Messages checked out before format 1 have none.
    delivered: BTreeSet<(u64, MsgId)>,
    /// The same times by message id.
    delivered_at: BTreeMap<MsgId, u64>,
}

impl Consumer {
    fn new() -> Self {
        Consumer {
            prefetch: 0,
            no_ack: false,
            active: false,
            suspected: false,
            queued: false,
            checked_out: BTreeMap::new(),
            timeout_ms: None,
            delivered: BTreeSet::new(),
            delivered_at: BTreeMap::new(),
        }
    }

    /// When the oldest checked-out message with a known delivery time was
    /// checked out, ms.
    pub fn oldest_delivery_ms(&self) -> Option<u64> {
        self.delivered.first().map(|(t, _)| *t)
    }

    /// Can take one more pushed message.
    fn has_spare(&self) -> bool {
        self.active
            && !self.suspected
            && (self.no_ack
                || self.prefetch == 0
                || self.checked_out.len() < self.prefetch as usize)
    }
}

/// All consumer records plus the service queue: the active consumers with
/// spare prefetch, in the order they became able to take a message
/// (rabbit_fifo 3.10 `service_queue`). A push goes to the first; it goes to
/// the back if it can take more. This is the round-robin.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Consumers {
    records: BTreeMap<ConsumerId, Consumer>,
    service: VecDeque<ConsumerId>,
    /// Active records, count.
    active: u64,
    /// Total checked-out messages over all records.
    unacked: u64,
}

impl Consumers {
    /// Put `id` into, or take it out of, the service queue to match its state.
    fn requeue(&mut self, id: ConsumerId) {
        let Some(rec) = self.records.get_mut(&id) else {
            return;
        };
        let want = rec.has_spare();
        if want && !rec.queued {
            rec.queued = true;
            self.service.push_back(id);
        } else if !want && rec.queued {
            rec.queued = false;
            self.service.retain(|c| *c != id);
        }
    }

    /// basic.consume: add the consumer, or update and re-activate it.
    pub fn checkout(
        &mut self,
        id: ConsumerId,
        prefetch: u32,
        no_ack: bool,
        timeout_ms: Option<u64>,
    ) {
        let rec = self.records.entry(id).or_insert_with(Consumer::new);
        rec.prefetch = prefetch;
        rec.no_ack = no_ack;
        rec.timeout_ms = timeout_ms;
        if !rec.active {
            rec.active = true;
            self.active += 1;
        }
        self.requeue(id);
    }

    /// basic.cancel: no more pushes; the record stays while it holds
    /// messages. Returns true if an active consumer was cancelled.
    pub fn cancel(&mut self, id: ConsumerId) -> bool {
        let Some(rec) = self.records.get_mut(&id) else {
            return false;
        };
        if !rec.active {
            return false;
        }
        rec.active = false;
        self.active -= 1;
        self.requeue(id);
        self.gc(id);
        true
    }

    /// Remove the record entirely (consumer down), giving back what it held.
    pub fn remove(&mut self, id: ConsumerId) -> Option<Consumer> {
        let rec = self.records.remove(&id)?;
        if rec.queued {
            self.service.retain(|c| *c != id);
        }
        if rec.active {
            self.active -= 1;
        }
        self.unacked -= rec.checked_out.len() as u64;
        Some(rec)
    }

    /// Drop an inactive record that holds nothing.
    pub fn gc(&mut self, id: ConsumerId) {
        if self
            .records
            .get(&id)
            .is_some_and(|r| !r.active && r.checked_out.is_empty())
        {
            self.records.remove(&id);
        }
    }

    /// The consumer the next push goes to, and whether it is no_ack. It
    /// leaves the service queue; [`Consumers::check_out`] or
    /// [`Consumers::pushed_no_ack`] puts it back at the end if it has room.
    /// Single-active-consumer mode: the oldest active consumer (ids grow
    /// with registration on a node) whose node is not suspected down, if it
    /// has spare prefetch.
    pub fn single_active_for_push(&self) -> Option<(ConsumerId, bool)> {
        let (id, rec) = self
            .records
            .iter()
            .find(|(_, r)| r.active && !r.suspected)?;
        rec.has_spare().then_some((*id, rec.no_ack))
    }

    pub fn next_for_push(&mut self) -> Option<(ConsumerId, bool)> {
        while let Some(id) = self.service.pop_front() {
            if let Some(rec) = self.records.get_mut(&id) {
                rec.queued = false;
                if rec.has_spare() {
                    return Some((id, rec.no_ack));
                }
            }
        }
        None
    }

    /// A no_ack push to `id` is done (nothing checked out).
    pub fn pushed_no_ack(&mut self, id: ConsumerId) {
        self.requeue(id);
    }

    /// Record `msg` as checked out to `id` at `now_ms`, creating an inactive
    /// record (the basic.get slot) if there is none.
    pub fn check_out(&mut self, id: ConsumerId, msg: Msg, now_ms: u64) {
        let rec = self.records.entry(id).or_insert_with(Consumer::new);
        if rec.checked_out.insert(msg.id, msg).is_none() {
            self.unacked += 1;
        }
        if let Some(old) = rec.delivered_at.insert(msg.id, now_ms) {
            rec.delivered.remove(&(old, msg.id));
        }
        rec.delivered.insert((now_ms, msg.id));
        self.requeue(id);
    }

    /// Take message `msg_id` back from consumer `id` if it holds it. Call
    /// [`Consumers::gc`] once done with the consumer.
    pub fn take(&mut self, id: ConsumerId, msg_id: MsgId) -> Option<Msg> {
        let rec = self.records.get_mut(&id)?;
        let msg = rec.checked_out.remove(&msg_id)?;
        if let Some(at) = rec.delivered_at.remove(&msg_id) {
            rec.delivered.remove(&(at, msg_id));
        }
        self.unacked -= 1;
        self.requeue(id);
        Some(msg)
    }

    /// Consumers of `node` from a boot epoch older than `epoch`, in id order.
    pub fn of_node_before(&self, node: u64, epoch: u32) -> Vec<ConsumerId> {
        self.records
            .keys()
            .filter(|c| c.node == node && c.epoch < epoch)
            .copied()
            .collect()
    }

    /// Consumers of `node` (any boot), in id order.
    pub fn of_node(&self, node: u64) -> Vec<ConsumerId> {
        self.records
            .keys()
            .filter(|c| c.node == node)
            .copied()
            .collect()
    }

    /// Suspends or resumes pushes to `id` (its node went down or came back).
    pub fn set_suspected(&mut self, id: ConsumerId, suspected: bool) {
        if let Some(rec) = self.records.get_mut(&id) {
            rec.suspected = suspected;
        }
        self.requeue(id);
    }

    /// Active (not cancelled) consumers.
    pub fn active_count(&self) -> u64 {
        self.active
    }

    /// All records: active, cancelled-with-messages, basic.get slots.
    pub fn record_count(&self) -> usize {
        self.records.len()
    }

    /// Checked-out messages over all consumers.
    pub fn unacked(&self) -> u64 {
        self.unacked
    }

    /// The record of consumer `id`.
    pub fn get(&self, id: &ConsumerId) -> Option<&Consumer> {
        self.records.get(id)
    }

    /// Every record, in id order.
    pub fn iter(&self) -> impl Iterator<Item = (&ConsumerId, &Consumer)> + '_ {
        self.records.iter()
    }

    /// Test-only consistency check: service queue = active records with
    /// spare, no duplicates; totals; no empty inactive record.
    #[cfg(test)]
    pub fn check(&self) -> Result<(), String> {
        let total: u64 = self
            .records
            .values()
            .map(|r| r.checked_out.len() as u64)
            .sum();
        if total != self.unacked {
            return Err(format!("unacked {} != sum {}", self.unacked, total));
        }
        let active = self.records.values().filter(|r| r.active).count() as u64;
        if active != self.active {
            return Err(format!("active {} != count {}", self.active, active));
        }
        let mut service: Vec<_> = self.service.iter().copied().collect();
        service.sort();
        let before = service.len();
        service.dedup();
        if before != service.len() {
            return Err("duplicate in service queue".into());
        }
        let spare: Vec<_> = self
            .records
            .iter()
            .filter(|(_, r)| r.has_spare())
            .map(|(id, _)| *id)
            .collect();
        if spare != service {
            return Err(format!(
                "service {service:?} != consumers with spare {spare:?}"
            ));
        }
        for (id, r) in &self.records {
            if r.queued != service.contains(id) {
                return Err(format!("queued flag wrong for {id:?}"));
            }
            if !r.active && r.checked_out.is_empty() {
                return Err(format!("empty inactive record {id:?} kept"));
            }
            if r.checked_out.iter().any(|(k, m)| *k != m.id) {
                return Err(format!("checked-out key mismatch for {id:?}"));
            }
            if r.delivered.len() != r.delivered_at.len()
                || r.delivered_at.iter().any(|(m, t)| {
                    !r.checked_out.contains_key(m) || !r.delivered.contains(&(*t, *m))
                })
            {
                return Err(format!("delivery times out of step for {id:?}"));
            }
        }
        Ok(())
    }
}

/// Snapshot format 0's shapes of the consumer records, frozen (format 1 added
/// `timeout_ms` and the delivery times).
pub(super) mod v0 {
    use std::collections::{BTreeMap, VecDeque};

    use serde::{Deserialize, Serialize};

    use super::super::message::Msg;
    use super::super::types::{ConsumerId, MsgId};

    /// `Consumer` in format 0.
    #[derive(Serialize, Deserialize)]
    pub(in crate::queue) struct Consumer {
        prefetch: u32,
        no_ack: bool,
        active: bool,
        suspected: bool,
        queued: bool,
        checked_out: BTreeMap<MsgId, Msg>,
    }

    /// `Consumers` in format 0.
    #[derive(Serialize, Deserialize)]
    pub(in crate::queue) struct Consumers {
        records: BTreeMap<ConsumerId, Consumer>,
        service: VecDeque<ConsumerId>,
        active: u64,
        unacked: u64,
    }

    /// Format 0 → current: no timeouts; messages checked out then have no
    /// delivery time (they never time out).
    impl From<Consumers> for super::Consumers {
        fn from(c: Consumers) -> Self {
            super::Consumers {
                records: c
                    .records
                    .into_iter()
                    .map(|(id, r)| {
                        (
                            id,
                            super::Consumer {
                                prefetch: r.prefetch,
                                no_ack: r.no_ack,
                                active: r.active,
                                suspected: r.suspected,
                                queued: r.queued,
                                checked_out: r.checked_out,
                                ..super::Consumer::new()
                            },
                        )
                    })
                    .collect(),
                service: c.service,
                active: c.active,
                unacked: c.unacked,
            }
        }
    }

    /// Current → format 0 (tests: what an old node wrote).
    #[cfg(test)]
    impl From<&super::Consumers> for Consumers {
        fn from(c: &super::Consumers) -> Self {
            Consumers {
                records: c
                    .records
                    .iter()
                    .map(|(id, r)| {
                        (
                            *id,
                            Consumer {
                                prefetch: r.prefetch,
                                no_ack: r.no_ack,
                                active: r.active,
                                suspected: r.suspected,
                                queued: r.queued,
                                checked_out: r.checked_out.clone(),
                            },
                        )
                    })
                    .collect(),
                service: c.service.clone(),
                active: c.active,
                unacked: c.unacked,
            }
        }
    }
}
