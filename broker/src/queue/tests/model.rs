//! A naive reference model of the queue: plain vectors, linear scans, sums
//! recomputed on every use, written straight from the spec rules (§2.4 head
//! expiry, §2.5 limits, §2.8 return position, §5 handlers, §6.2 limit). The
//! property tests require the machine to give the same replies and effects.

use std::collections::BTreeMap;

use super::super::dedup;
use super::super::types::*;

#[derive(Debug, Clone, Copy)]
struct MMsg {
    id: MsgId,
    expiry: Option<u64>,
    size: u32,
    count: u32,
    /// Message priority as kept (clamped to `x-max-priority`, else 0).
    prio: u8,
}

#[derive(Debug, Clone, Default)]
struct MCons {
    prefetch: u32,
    no_ack: bool,
    active: bool,
    /// Its node is down (`NodeDown`): no pushes until `NodeUp`.
    suspected: bool,
    /// Consumer priority (`x-priority`).
    priority: i32,
    out: BTreeMap<MsgId, MMsg>,
}

impl MCons {
    fn spare(&self) -> bool {
        self.active
            && !self.suspected
            && (self.no_ack
                || self.prefetch == 0
                || (self.out.len() as u64) < u64::from(self.prefetch))
    }
}

enum Dl {
    Drop,
    Publish(DeadLetterTarget),
    Hold,
}

/// The naive model.
#[derive(Debug, Clone, Default)]
pub struct Model {
    cfg: QueueConfig,
    next_id: u64,
    returns: Vec<MMsg>,
    main: Vec<MMsg>,
    cons: BTreeMap<ConsumerId, MCons>,
    /// Consumers waiting for a message, in the order they became able to.
    waiting: Vec<ConsumerId>,
    held: Vec<(MsgId, u32, DeadLetterReason)>,
    /// Delayed-retry messages with their ready-at, in no order.
    delayed: Vec<(u64, MMsg)>,
    blocked: bool,
    lease: Option<u64>,
    expired_sent: bool,
    timer: Option<u64>,
    /// Highest applied sequence per proposer (`Deduped`).
    seqs: BTreeMap<crate::queue::types::ProposerId, u64>,
    /// Per source group: the de-duplication window (`EnqueueDeadLetters`).
    dedup: BTreeMap<u64, MWindow>,
}

/// A source's window: ids accepted, highest floor version, last command time.
#[derive(Debug, Clone, Default)]
struct MWindow {
    ids: std::collections::BTreeSet<MsgId>,
    floor: MsgId,
    version: u64,
    last_ms: u64,
}

impl Model {
    /// Empty queue.
    pub fn new(cfg: QueueConfig) -> Self {
        Model {
            cfg,
            ..Model::default()
        }
    }

    /// Ids in the de-duplication windows, and the number of sources.
    pub fn dedup_window(&self) -> (u64, usize) {
        (
            self.dedup.values().map(|w| w.ids.len() as u64).sum(),
            self.dedup.len(),
        )
    }

    /// Ready ids in delivery order: by priority, highest first; within
    /// one, returns then main.
    pub fn ready_ids(&self) -> Vec<MsgId> {
        let mut out = Vec::new();
        for p in (0..=255u8).rev() {
            for m in self.returns.iter().chain(self.main.iter()) {
                if m.prio == p {
                    out.push(m.id);
                }
            }
        }
        out
    }

    /// Checked-out ids of a consumer.
    pub fn out_ids(&self, c: ConsumerId) -> Vec<MsgId> {
        self.cons
            .get(&c)
            .map(|r| r.out.keys().copied().collect())
            .unwrap_or_default()
    }

    /// Held ids and reasons.
    pub fn held(&self) -> Vec<(MsgId, DeadLetterReason)> {
        self.held.iter().map(|h| (h.0, h.2)).collect()
    }

    /// Delayed ids with their ready-at, in (ready-at, id) order.
    pub fn delayed(&self) -> Vec<(u64, MsgId)> {
        let mut d: Vec<(u64, MsgId)> = self.delayed.iter().map(|(at, m)| (*at, m.id)).collect();
        d.sort();
        d
    }

    /// Active consumers.
    pub fn active(&self) -> u64 {
        self.cons.values().filter(|c| c.active).count() as u64
    }

    /// Whether publishers are blocked.
    pub fn blocked(&self) -> bool {
        self.blocked
    }

    fn dl_mode(&self) -> Dl {
        match &self.cfg.dead_letter {
            None => Dl::Drop,
            Some(t) => {
                if self.cfg.strategy == DeadLetterStrategy::AtLeastOnce
                    && matches!(
                        self.cfg.overflow,
                        Overflow::RejectPublish | Overflow::RejectPublishDlx
                    )
                {
                    Dl::Hold
                } else {
                    Dl::Publish(t.clone())
                }
            }
        }
    }

    fn dead_letter(&mut self, m: MMsg, reason: DeadLetterReason, fx: &mut Vec<Effect>) {
        let mode = self.dl_mode();
        fx.push(Effect::DeadLettered {
            reason,
            strategy: match mode {
                Dl::Drop => None,
                Dl::Publish(_) => Some(DeadLetterStrategy::AtMostOnce),
                Dl::Hold => Some(DeadLetterStrategy::AtLeastOnce),
            },
        });
        match mode {
            Dl::Drop => fx.push(Effect::DropBody { id: m.id }),
            Dl::Publish(target) => {
                fx.push(Effect::DeadLetter {
                    id: m.id,
                    reason,
                    target,
                });
                fx.push(Effect::DropBody { id: m.id });
            }
            Dl::Hold => {
                self.held.push((m.id, m.size, reason));
                fx.push(Effect::DeadLetterHeld { id: m.id, reason });
            }
        }
    }

    /// Priorities with a ready message, highest first.
    fn prios(&self) -> Vec<u8> {
        let mut ps: Vec<u8> = self
            .returns
            .iter()
            .chain(self.main.iter())
            .map(|m| m.prio)
            .collect();
        ps.sort_unstable_by(|a, b| b.cmp(a));
        ps.dedup();
        ps
    }

    /// Head of priority `p`: its first return, else its first main message.
    fn lane_head(&self, p: u8) -> Option<MMsg> {
        self.returns
            .iter()
            .find(|m| m.prio == p)
            .or_else(|| self.main.iter().find(|m| m.prio == p))
            .copied()
    }

    fn remove(&mut self, id: MsgId) {
        self.returns.retain(|m| m.id != id);
        self.main.retain(|m| m.id != id);
    }

    fn head(&self) -> Option<MMsg> {
        self.lane_head(*self.prios().first()?)
    }

    fn pop(&mut self) -> Option<MMsg> {
        let h = self.head()?;
        self.remove(h.id);
        Some(h)
    }

    fn sync(&mut self, c: ConsumerId) {
        let spare = self.cons.get(&c).is_some_and(|r| r.spare());
        let pos = self.waiting.iter().position(|x| *x == c);
        match (spare, pos) {
            (true, None) => self.waiting.push(c),
            (false, Some(i)) => {
                self.waiting.remove(i);
            }
            _ => {}
        }
    }

    fn forget_if_idle(&mut self, c: ConsumerId) {
        if self
            .cons
            .get(&c)
            .is_some_and(|r| !r.active && r.out.is_empty())
        {
            self.cons.remove(&c);
        }
    }

    /// The earliest delayed message (by ready-at, then id), removed.
    fn take_earliest_delayed(&mut self) -> Option<(u64, MMsg)> {
        let i =
            (0..self.delayed.len()).min_by_key(|i| (self.delayed[*i].0, self.delayed[*i].1.id))?;
        Some(self.delayed.remove(i))
    }

    /// Delayed messages due now go to the returns tail in (ready-at, id)
    /// order; then head-only expiry of every priority, highest first, until
    /// no head is expired.
    fn expire(&mut self, now: u64, fx: &mut Vec<Effect>) {
        while self.delayed.iter().any(|(at, _)| *at <= now) {
            let (at, m) = self.take_earliest_delayed().expect("one is due");
            assert!(at <= now);
            self.returns.push(m);
        }
        loop {
            let expired = self
                .prios()
                .into_iter()
                .filter_map(|p| self.lane_head(p))
                .find(|h| h.expiry.is_some_and(|e| now >= e));
            let Some(h) = expired else { break };
            self.remove(h.id);
            self.dead_letter(h, DeadLetterReason::Expired, fx);
        }
    }

    /// The waiting consumer of the highest priority that waited longest.
    fn next_waiting(&self) -> Option<usize> {
        let prio = |c: &ConsumerId| self.cons.get(c).map_or(0, |r| r.priority);
        let top = self.waiting.iter().map(prio).max()?;
        self.waiting.iter().position(|c| prio(c) == top)
    }

    fn deliver(&mut self, now: u64, fx: &mut Vec<Effect>) {
        loop {
            self.expire(now, fx);
            if self.head().is_none() {
                return;
            }
            let Some(i) = self.next_waiting() else { return };
            let c = self.waiting.remove(i);
            let Some(m) = self.pop() else { return };
            fx.push(Effect::Deliver {
                consumer: c,
                delivery: Delivery {
                    id: m.id,
                    delivery_count: m.count,
                    payload: None,
                    resend: false,
                },
            });
            let no_ack = self.cons.get(&c).is_some_and(|r| r.no_ack);
            if no_ack {
                fx.push(Effect::DropBody { id: m.id });
            } else if let Some(r) = self.cons.get_mut(&c) {
                r.out.insert(m.id, m);
            }
            self.sync(c);
        }
    }

    fn counted(&self) -> (u64, u64) {
        let n = self.returns.len() + self.main.len() + self.held.len() + self.delayed.len();
        let b: u64 = self
            .returns
            .iter()
            .chain(self.main.iter())
            .chain(self.delayed.iter().map(|(_, m)| m))
            .map(|m| u64::from(m.size))
            .sum::<u64>()
            + self.held.iter().map(|h| u64::from(h.1)).sum::<u64>();
        (n as u64, b)
    }

    fn over(&self) -> bool {
        let (n, b) = self.counted();
        self.cfg.max_length.is_some_and(|l| n > l)
            || self.cfg.max_length_bytes.is_some_and(|l| b > l)
    }

    fn limits(&mut self, fx: &mut Vec<Effect>) {
        if self.cfg.overflow == Overflow::DropHead {
            while self.over() {
                let Some(m) = self
                    .pop()
                    .or_else(|| self.take_earliest_delayed().map(|d| d.1))
                else {
                    break;
                };
                self.dead_letter(m, DeadLetterReason::Maxlen, fx);
            }
        } else if !self.blocked && self.over() {
            self.blocked = true;
            fx.push(Effect::PublishersBlocked(true));
        }
    }

    fn unblock(&mut self, fx: &mut Vec<Effect>) {
        let (n, b) = self.counted();
        // rabbit_fifo `is_below/2`: Num =< trunc(Limit * 0.8).
        let low = |l: Option<u64>, v: u64| l.is_none_or(|l| v <= ((l as f64) * 0.8).trunc() as u64);
        let below = low(self.cfg.max_length, n) && low(self.cfg.max_length_bytes, b);
        if self.blocked && (self.cfg.overflow == Overflow::DropHead || below) {
            self.blocked = false;
            fx.push(Effect::PublishersBlocked(false));
        }
    }

    /// A counted return; `explicit` = basic.reject/nack requeue (delayed by
    /// `failed`), else the consumer went away (delayed by `returned`).
    fn give_back(&mut self, now: u64, mut m: MMsg, explicit: bool, fx: &mut Vec<Effect>) {
        m.count += 1;
        let limit = self.cfg.delivery_limit.filter(|l| *l >= 0);
        let dr = self.cfg.delayed_retry;
        let delayed = match dr.kind {
            DelayedRetryType::Disabled => false,
            DelayedRetryType::All => true,
            DelayedRetryType::Failed => explicit,
            DelayedRetryType::Returned => !explicit,
        };
        match limit {
            Some(l) if i64::from(m.count) > l => {
                self.dead_letter(m, DeadLetterReason::DeliveryLimit, fx)
            }
            _ if delayed => {
                let wait = (u128::from(dr.min_ms) * u128::from(m.count.max(1)))
                    .min(u128::from(dr.max_ms)) as u64;
                self.delayed.push((now.saturating_add(wait), m));
            }
            None if explicit => self.main.push(m),
            _ => self.returns.push(m),
        }
    }

    fn down(&mut self, now: u64, c: ConsumerId, fx: &mut Vec<Effect>) {
        if let Some(r) = self.cons.remove(&c) {
            self.waiting.retain(|x| *x != c);
            for m in r.out.into_values() {
                self.give_back(now, m, false, fx);
            }
            self.lease = Some(now);
            self.expired_sent = false;
        }
    }

    /// `NodeRestarted` (and the first half of `NodeUp`): records of `node`'s
    /// boots before `epoch` are down; the node's proposer sequences of those
    /// boots are forgotten.
    fn restarted(&mut self, now: u64, node: u64, epoch: u32, fx: &mut Vec<Effect>) {
        self.seqs.retain(|p, _| p.node != node || p.epoch >= epoch);
        let gone: Vec<ConsumerId> = self
            .cons
            .keys()
            .filter(|c| c.node == node && c.epoch < epoch)
            .copied()
            .collect();
        for c in gone {
            self.down(now, c, fx);
        }
    }

    /// basic.consume: a consumer whose priority changes goes to the back of
    /// the waiting line.
    fn subscribe(&mut self, c: ConsumerId, prefetch: u32, no_ack: bool, priority: i32) {
        let r = self.cons.entry(c).or_default();
        let moved = r.priority != priority;
        r.prefetch = prefetch;
        r.no_ack = no_ack;
        r.active = true;
        r.priority = priority;
        if moved {
            self.waiting.retain(|x| *x != c);
        }
        self.sync(c);
    }

    fn take(&mut self, c: ConsumerId, id: MsgId) -> Option<MMsg> {
        let m = self.cons.get_mut(&c)?.out.remove(&id)?;
        self.sync(c);
        Some(m)
    }

    /// Apply a command; same contract as `QueueMachine::apply`.
    pub fn apply(&mut self, cmd: QueueCommand) -> (QueueReply, Vec<Effect>) {
        let mut fx = Vec::new();
        let mut ticked = false;
        let now = cmd.latest_now_ms();
        let reply = self.one(cmd, &mut fx, &mut ticked);
        let head = self
            .prios()
            .into_iter()
            .filter_map(|p| self.lane_head(p).and_then(|h| h.expiry))
            .min();
        let release = self.delayed.iter().map(|(at, _)| *at).min();
        let next = match (head, release) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        // Emitted when earlier than the armed timer, when none is armed, or
        // when the armed one is due; never for a later instant alone.
        let emit = match (next, self.timer) {
            (None, _) => false,
            (Some(_), None) => true,
            (Some(n), Some(t)) => n < t || (n != t && now.is_some_and(|now| now >= t)),
        };
        if emit || ticked {
            if let Some(at_ms) = next {
                fx.push(Effect::ExpiryTimer { at_ms });
            }
            self.timer = next;
        }
        (reply, fx)
    }

    /// One message of an enqueue, as the machine's `enqueue` does it.
    fn enqueue_one(
        &mut self,
        now: u64,
        m: EnqueueMsg,
        prio: u8,
        fx: &mut Vec<Effect>,
    ) -> EnqueueOutcome {
        if self.blocked && self.cfg.overflow == Overflow::RejectPublish {
            return EnqueueOutcome::Rejected;
        }
        let id = self.next_id;
        self.next_id += 1;
        let ttl = match (self.cfg.message_ttl_ms, m.ttl_ms) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let expiry = ttl.map(|t| {
            now.saturating_add(if t == 0 { 1 } else { t })
                .min(u64::MAX - 1)
        });
        fx.push(Effect::StoreBody {
            id,
            payload: m.payload,
        });
        let msg = MMsg {
            id,
            expiry,
            size: m.body_size,
            count: 0,
            prio: self.cfg.max_priority.map_or(0, |max| prio.min(max)),
        };
        if self.blocked {
            // reject-publish-dlx: refused and dead-lettered.
            self.dead_letter(msg, DeadLetterReason::Maxlen, fx);
            return EnqueueOutcome::Rejected;
        }
        self.main.push(msg);
        self.deliver(now, fx);
        self.limits(fx);
        EnqueueOutcome::Accepted
    }

    fn one(&mut self, cmd: QueueCommand, fx: &mut Vec<Effect>, ticked: &mut bool) -> QueueReply {
        use QueueCommand as C;
        let now = match &cmd {
            C::Deduped { proposer, seq, cmd } => {
                let last = self.seqs.get(proposer).copied().unwrap_or(0);
                if *seq <= last {
                    return QueueReply::Resent;
                }
                if *seq > last + 1 {
                    return QueueReply::OutOfSequence;
                }
                self.seqs.insert(*proposer, *seq);
                return self.one((**cmd).clone(), fx, ticked);
            }
            C::Batch(cmds) => {
                return QueueReply::Batch(
                    cmds.clone()
                        .into_iter()
                        .map(|c| self.one(c, fx, ticked))
                        .collect(),
                );
            }
            c => c
                .now_ms()
                .expect("every command but Batch and Deduped carries its time"),
        };
        if self.lease.is_none() {
            self.lease = Some(now);
        }
        let mut reply = QueueReply::Ok;
        let is_tick = matches!(cmd, C::Tick { .. });
        match cmd {
            C::Batch(_) | C::Deduped { .. } => {}
            C::Enqueue { .. } | C::EnqueuePrioritized { .. } => {
                let msgs: Vec<(EnqueueMsg, u8)> = match cmd {
                    C::Enqueue { msgs, .. } => msgs.into_iter().map(|m| (m, 0)).collect(),
                    C::EnqueuePrioritized { msgs, .. } => {
                        msgs.into_iter().map(|m| (m.msg, m.priority)).collect()
                    }
                    _ => unreachable!("matched above"),
                };
                let out = msgs
                    .into_iter()
                    .map(|(m, prio)| self.enqueue_one(now, m, prio, fx))
                    .collect();
                reply = QueueReply::Enqueued(out);
            }
            C::EnqueueDeadLetters {
                source,
                settled_below,
                floor_version,
                msgs,
                ..
            } => {
                // Idle sources go first; then the floor (unless a newer one was
                // seen); then each message in turn. The bounds of `dedup.rs`
                // (tens of thousands of ids) are never reached by the few ids
                // generated here: left out.
                self.dedup
                    .retain(|_, w| now.saturating_sub(w.last_ms) < dedup::SOURCE_IDLE_MS);
                let w = self.dedup.entry(source).or_default();
                w.last_ms = w.last_ms.max(now);
                if floor_version > w.version {
                    w.version = floor_version;
                    w.floor = settled_below;
                } else if floor_version == w.version {
                    w.floor = w.floor.max(settled_below);
                }
                let floor = w.floor;
                w.ids.retain(|id| *id >= floor);
                let mut first: BTreeMap<MsgId, EnqueueOutcome> = BTreeMap::new();
                let mut out = Vec::new();
                for (id, m) in msgs {
                    let w = &self.dedup[&source];
                    let o = if id < w.floor || w.ids.contains(&id) {
                        EnqueueOutcome::Accepted
                    } else if let Some(o) = first.get(&id) {
                        *o
                    } else {
                        let o = self.enqueue_one(now, m.msg, m.priority, fx);
                        first.insert(id, o);
                        if o == EnqueueOutcome::Accepted {
                            self.dedup.entry(source).or_default().ids.insert(id);
                        }
                        o
                    };
                    out.push(o);
                }
                reply = QueueReply::Enqueued(out);
            }
            C::Checkout {
                consumer,
                prefetch,
                no_ack,
                ..
            } => {
                self.subscribe(consumer, prefetch, no_ack, 0);
            }
            C::Subscribe { consumer, spec, .. } => {
                self.subscribe(consumer, spec.prefetch, spec.no_ack, spec.priority);
            }
            C::Cancel { consumer, .. } => {
                if let Some(r) = self.cons.get_mut(&consumer) {
                    if r.active {
                        r.active = false;
                        self.sync(consumer);
                        self.forget_if_idle(consumer);
                        self.lease = Some(now);
                        self.expired_sent = false;
                    }
                }
            }
            C::ConsumerDown { consumer, .. } => self.down(now, consumer, fx),
            C::NodeRestarted { node, epoch, .. } => self.restarted(now, node, epoch, fx),
            C::NodeDown { node, .. } => {
                // Every record of the node not yet suspected: suspect it, give
                // back all it holds (id order), drop it if it only held messages.
                let of_node: Vec<ConsumerId> = self
                    .cons
                    .iter()
                    .filter(|(c, r)| c.node == node && !r.suspected)
                    .map(|(c, _)| *c)
                    .collect();
                for c in &of_node {
                    let Some(r) = self.cons.get_mut(c) else {
                        continue;
                    };
                    r.suspected = true;
                    let out = std::mem::take(&mut r.out);
                    self.sync(*c);
                    for m in out.into_values() {
                        self.give_back(now, m, false, fx);
                    }
                    self.forget_if_idle(*c);
                }
                if !of_node.is_empty() {
                    self.lease = Some(now);
                    self.expired_sent = false;
                }
            }
            C::NodeUp { node, epoch, .. } => {
                self.restarted(now, node, epoch, fx);
                let of_node: Vec<ConsumerId> = self
                    .cons
                    .keys()
                    .filter(|c| c.node == node)
                    .copied()
                    .collect();
                for c in of_node {
                    if let Some(r) = self.cons.get_mut(&c) {
                        r.suspected = false;
                    }
                    self.sync(c);
                }
            }
            C::Settle { consumer, ids, .. } => {
                for id in ids {
                    if self.take(consumer, id).is_some() {
                        fx.push(Effect::DropBody { id });
                    }
                }
                self.forget_if_idle(consumer);
            }
            C::Return { consumer, ids, .. } => {
                for id in ids {
                    if let Some(m) = self.take(consumer, id) {
                        self.give_back(now, m, true, fx);
                    }
                }
                self.forget_if_idle(consumer);
            }
            C::Discard { consumer, ids, .. } => {
                for id in ids {
                    if let Some(m) = self.take(consumer, id) {
                        self.dead_letter(m, DeadLetterReason::Rejected, fx);
                    }
                }
                self.forget_if_idle(consumer);
            }
            C::Dequeue {
                consumer, no_ack, ..
            } => {
                self.lease = Some(now);
                self.expired_sent = false;
                self.expire(now, fx);
                let got = self.pop().map(|m| {
                    if no_ack {
                        fx.push(Effect::DropBody { id: m.id });
                    } else {
                        self.cons.entry(consumer).or_default().out.insert(m.id, m);
                        self.sync(consumer);
                    }
                    (
                        Delivery {
                            id: m.id,
                            delivery_count: m.count,
                            payload: None,
                            resend: false,
                        },
                        (self.returns.len() + self.main.len()) as u64,
                    )
                });
                reply = QueueReply::Dequeued(got);
            }
            C::Purge { .. } => {
                let mut delayed: Vec<(u64, MMsg)> = std::mem::take(&mut self.delayed);
                delayed.sort_by_key(|(at, m)| (*at, m.id));
                let mut all = self.ready_ids();
                self.returns.clear();
                self.main.clear();
                all.extend(delayed.into_iter().map(|(_, m)| m.id));
                for id in &all {
                    fx.push(Effect::DropBody { id: *id });
                }
                reply = QueueReply::Purged(all.len() as u64);
            }
            C::Tick { .. } => {
                self.dedup
                    .retain(|_, w| now.saturating_sub(w.last_ms) < dedup::SOURCE_IDLE_MS);
                *ticked = true
            }
            C::UpdateConfig { .. } | C::Configure { .. } => {
                let config = match cmd {
                    C::UpdateConfig { config, .. } => config.into(),
                    C::Configure { config, .. } => config,
                    _ => unreachable!("matched above"),
                };
                let was_hold = matches!(self.dl_mode(), Dl::Hold);
                self.cfg = config;
                if was_hold && !matches!(self.dl_mode(), Dl::Hold) {
                    for h in std::mem::take(&mut self.held) {
                        fx.push(Effect::DropBody { id: h.0 });
                    }
                }
                self.lease = Some(now);
                self.expired_sent = false;
            }
            C::Remove { ids, .. } => {
                let wanted: std::collections::BTreeSet<MsgId> = ids.into_iter().collect();
                let mut n = 0;
                for id in self.ready_ids() {
                    if wanted.contains(&id) {
                        self.remove(id);
                        fx.push(Effect::DropBody { id });
                        n += 1;
                    }
                }
                reply = QueueReply::Removed(n);
            }
            C::DeadLetterSettled { ids, .. } => {
                for id in ids {
                    if let Some(i) = self.held.iter().position(|h| h.0 == id) {
                        self.held.remove(i);
                        fx.push(Effect::DropBody { id });
                    }
                }
            }
        }
        self.deliver(now, fx);
        self.limits(fx);
        self.unblock(fx);
        if is_tick {
            self.tick_expires(now, fx);
        }
        reply
    }

    /// Queue TTL check, on a `Tick` only.
    fn tick_expires(&mut self, now: u64, fx: &mut Vec<Effect>) {
        if let (Some(exp), Some(lease)) = (self.cfg.expires_ms, self.lease) {
            if !self.expired_sent && self.cons.is_empty() && now > lease.saturating_add(exp) {
                self.expired_sent = true;
                fx.push(Effect::QueueExpired);
            }
        }
    }
}
