//! Consumer records (rabbit_fifo `consumers` + `service_queue`): what each
//! consumer has checked out, its prefetch and priority, and the round-robin
//! order within each consumer priority.

use std::cmp::Reverse;
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
    /// `x-priority` of basic.consume (0 for a basic.get slot): pushes go to
    /// the highest priority that can take one.
    pub priority: i32,
    /// In the single-active-consumer candidates (= active, not suspected).
    candidate: bool,
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
            priority: 0,
            candidate: false,
            timeout_ms: None,
            delivered: BTreeSet::new(),
            delivered_at: BTreeMap::new(),
        }
    }

    /// Could be the single active consumer.
    fn is_candidate(&self) -> bool {
        self.active && !self.suspected
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

/// All consumer records plus the service queue: per consumer priority
/// (highest first), the active consumers of that priority with spare
/// prefetch, in the order they became able to take a message (rabbit_fifo
/// 3.10 `service_queue`, a priority queue keyed by consumer priority). A
/// push goes to the first consumer of the highest priority that has one; it
/// goes to the back of its priority if it can take more. This is the
/// round-robin among equals; a lower priority gets pushes only while every
/// higher one is at its prefetch limit (or suspected, or cancelled).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(super) struct Consumers {
    records: BTreeMap<ConsumerId, Consumer>,
    /// Per priority, highest first. A lane emptied by pushes stays (no
    /// allocation per message); empty lanes go when a consumer attaches,
    /// leaves or is cancelled.
    service: BTreeMap<Reverse<i32>, VecDeque<ConsumerId>>,
    /// Single-active-consumer candidates (active, not suspected), highest
    /// priority first, then oldest (lowest id) first.
    candidates: BTreeSet<(Reverse<i32>, ConsumerId)>,
    /// Active records, count.
    active: u64,
    /// Total checked-out messages over all records.
    unacked: u64,
}

/// Equal when the records, the non-empty service lanes and the totals are
/// (an empty lane is an allocation kept for the next push, not state).
impl PartialEq for Consumers {
    fn eq(&self, other: &Self) -> bool {
        let lanes = |c: &Consumers| {
            c.service
                .iter()
                .filter(|(_, l)| !l.is_empty())
                .map(|(p, l)| (p.0, l.clone()))
                .collect::<Vec<_>>()
        };
        self.records == other.records
            && self.candidates == other.candidates
            && self.active == other.active
            && self.unacked == other.unacked
            && lanes(self) == lanes(other)
    }
}

impl Eq for Consumers {}

impl Consumers {
    /// Put `id` into, or take it out of, the service queue and the
    /// candidates to match its state.
    fn requeue(&mut self, id: ConsumerId) {
        let Some(rec) = self.records.get_mut(&id) else {
            return;
        };
        let want = rec.has_spare();
        if want && !rec.queued {
            rec.queued = true;
            self.service
                .entry(Reverse(rec.priority))
                .or_default()
                .push_back(id);
        } else if !want && rec.queued {
            rec.queued = false;
            if let Some(lane) = self.service.get_mut(&Reverse(rec.priority)) {
                lane.retain(|c| *c != id);
            }
        }
        let candidate = rec.is_candidate();
        if candidate != rec.candidate {
            rec.candidate = candidate;
            let key = (Reverse(rec.priority), id);
            if candidate {
                self.candidates.insert(key);
            } else {
                self.candidates.remove(&key);
            }
        }
    }

    /// Take `id` out of the service queue and the candidates (before its
    /// priority changes or it goes); [`Consumers::requeue`] puts it back.
    fn unqueue(&mut self, id: ConsumerId) {
        let Some(rec) = self.records.get_mut(&id) else {
            return;
        };
        if rec.queued {
            rec.queued = false;
            if let Some(lane) = self.service.get_mut(&Reverse(rec.priority)) {
                lane.retain(|c| *c != id);
            }
        }
        if rec.candidate {
            rec.candidate = false;
            self.candidates.remove(&(Reverse(rec.priority), id));
        }
    }

    /// Drop the service lanes pushes emptied (not per message: on attach,
    /// cancel and removal).
    fn drop_empty_lanes(&mut self) {
        self.service.retain(|_, lane| !lane.is_empty());
    }

    /// basic.consume: add the consumer, or update and re-activate it, with
    /// its prefetch, no-ack, consumer priority (`x-priority`) and consumer
    /// timeout (ms). A re-subscription with another priority goes to the back
    /// of the new one.
    pub fn checkout(
        &mut self,
        id: ConsumerId,
        prefetch: u32,
        no_ack: bool,
        priority: i32,
        timeout_ms: Option<u64>,
    ) {
        if self
            .records
            .get(&id)
            .is_some_and(|r| r.priority != priority)
        {
            self.unqueue(id);
        }
        let rec = self.records.entry(id).or_insert_with(Consumer::new);
        rec.prefetch = prefetch;
        rec.no_ack = no_ack;
        rec.priority = priority;
        rec.timeout_ms = timeout_ms;
        if !rec.active {
            rec.active = true;
            self.active += 1;
        }
        self.requeue(id);
        self.drop_empty_lanes();
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
        self.drop_empty_lanes();
        true
    }

    /// Remove the record entirely (consumer down), giving back what it held.
    pub fn remove(&mut self, id: ConsumerId) -> Option<Consumer> {
        self.unqueue(id);
        let rec = self.records.remove(&id)?;
        self.drop_empty_lanes();
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
            self.unqueue(id);
            self.records.remove(&id);
        }
    }

    /// Single-active-consumer mode: the consumer the next push goes to, and
    /// whether it is no_ack: the active consumer of the highest priority
    /// whose node is not suspected down, the oldest of them (ids grow with
    /// registration on a node), if it has spare prefetch. A consumer of a
    /// higher priority that subscribes takes over at once; the one it
    /// replaces keeps its unacked messages (RabbitMQ 4.0 lets it finish them
    /// before the new one gets any; quorumq does not wait). O(log n).
    pub fn single_active_for_push(&self) -> Option<(ConsumerId, bool)> {
        let (_, id) = self.candidates.first()?;
        let rec = self.records.get(id)?;
        rec.has_spare().then_some((*id, rec.no_ack))
    }

    /// The consumer the next push goes to, and whether it is no_ack: the
    /// first of the highest priority with one waiting. It leaves the service
    /// queue; [`Consumers::check_out`] or [`Consumers::pushed_no_ack`] puts
    /// it back at the end of its priority if it has room. O(log n) plus the
    /// lanes pushes emptied since the last attach or leave.
    pub fn next_for_push(&mut self) -> Option<(ConsumerId, bool)> {
        for lane in self.service.values_mut() {
            while let Some(id) = lane.pop_front() {
                if let Some(rec) = self.records.get_mut(&id) {
                    rec.queued = false;
                    if rec.has_spare() {
                        return Some((id, rec.no_ack));
                    }
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
        for (prio, lane) in &self.service {
            if let Some(id) = lane
                .iter()
                .find(|id| self.records.get(id).map(|r| r.priority) != Some(prio.0))
            {
                return Err(format!("{id:?} queued under priority {}", prio.0));
            }
        }
        let mut service: Vec<_> = self.service.values().flatten().copied().collect();
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
        if self.candidates.len() != self.records.values().filter(|r| r.is_candidate()).count() {
            return Err("candidates hold a stale entry".into());
        }
        for (id, r) in &self.records {
            if r.queued != service.contains(id) {
                return Err(format!("queued flag wrong for {id:?}"));
            }
            if !r.active && r.checked_out.is_empty() {
                return Err(format!("empty inactive record {id:?} kept"));
            }
            if r.candidate != r.is_candidate()
                || r.candidate != self.candidates.contains(&(Reverse(r.priority), *id))
            {
                return Err(format!("candidate flag wrong for {id:?}"));
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

impl Consumers {
    /// These records as a format-0/1 snapshot restores them (tests): no
    /// delivery times, no emptied service lanes.
    #[cfg(test)]
    pub fn without_delivery_times(&self) -> Consumers {
        let mut c = self.clone();
        for rec in c.records.values_mut() {
            rec.delivered.clear();
            rec.delivered_at.clear();
        }
        c.drop_empty_lanes();
        c
    }
}

/// The consumer records in the shape of snapshot formats 0 and 1 (before
/// consumer priorities), frozen: never change it.
pub(super) mod v1 {
    use std::collections::{BTreeMap, VecDeque};

    use serde::{Deserialize, Serialize};

    use super::super::message::Msg;
    use super::super::types::{ConsumerId, MsgId};

    /// `Consumer` in formats 0 and 1.
    #[derive(Debug, Clone, Serialize, Deserialize)]
    pub(in super::super) struct Consumer {
        pub prefetch: u32,
        pub no_ack: bool,
        pub active: bool,
        pub suspected: bool,
        pub queued: bool,
        pub checked_out: BTreeMap<MsgId, Msg>,
    }

    /// `Consumers` in formats 0 and 1.
    #[derive(Debug, Clone, Default, Serialize, Deserialize)]
    pub(in super::super) struct Consumers {
        pub records: BTreeMap<ConsumerId, Consumer>,
        pub service: VecDeque<ConsumerId>,
        pub active: u64,
        pub unacked: u64,
    }

    impl From<Consumers> for super::Consumers {
        /// Every consumer at priority 0, the service queue in its order.
        fn from(c: Consumers) -> Self {
            let mut out = super::Consumers {
                active: c.active,
                unacked: c.unacked,
                ..super::Consumers::default()
            };
            for (id, r) in c.records {
                let mut rec = super::Consumer::new();
                rec.prefetch = r.prefetch;
                rec.no_ack = r.no_ack;
                rec.active = r.active;
                rec.suspected = r.suspected;
                rec.checked_out = r.checked_out;
                out.records.insert(id, rec);
            }
            // The old service order first, then anything it missed.
            let ids: Vec<ConsumerId> = c
                .service
                .into_iter()
                .chain(out.records.keys().copied())
                .collect();
            for id in ids {
                out.requeue(id);
            }
            out
        }
    }
}
