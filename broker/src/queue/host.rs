//! The impure shell around the pure [`QueueMachine`]: it applies commands,
//! keeps the body store in step with the machine on every replica, and —
//! only on the leader, for entries it proposed itself — carries out the
//! machine's effects (deliveries, dead-letters, timers).

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::mpsc::UnboundedSender;

use super::bodies::BodyStore;
use super::types::{DeadLetterReason, DeadLetterTarget, Effect, MsgId, QueueCommand, QueueReply};
use super::QueueMachine;
use crate::consumers::{ConsumerRegistry, QueueDelivery};

/// Effects only the leader carries out, handed to the queue's runtime task.
#[derive(Debug)]
pub enum LeaderEffect {
    /// At-most-once: publish this message to the dead-letter target now.
    DeadLetter {
        id: MsgId,
        reason: DeadLetterReason,
        target: DeadLetterTarget,
        payload: Bytes,
    },
    /// At-least-once: a message entered the dead-letter area.
    DeadLetterHeld { id: MsgId, reason: DeadLetterReason },
    /// x-expires elapsed: delete the queue.
    QueueExpired,
    /// Propose a `Tick` at this time (ms since the epoch).
    ExpiryTimer { at_ms: u64 },
    /// Publishers blocked (true) or unblocked (false) by reject-publish.
    PublishersBlocked(bool),
}

/// Per-queue context shared by the host and the queue's runtime.
pub struct QueueContext {
    /// Group id of the queue.
    pub group: u64,
    /// The queue's vhost and name (metrics labels).
    pub vhost: String,
    /// See `vhost`.
    pub name: String,
    /// This node's id.
    pub node: u64,
    /// Where deliveries go.
    pub consumers: Arc<ConsumerRegistry>,
    /// Leader-only effects other than deliveries.
    pub effects: UnboundedSender<LeaderEffect>,
    /// Set when the queue's group is shut down (deleted or node stopping):
    /// its runtime and dead-letter worker end. Set through [`QueueContext::close`].
    pub closed: AtomicBool,
    /// Wakes the queue's runtime when `closed` is set.
    pub closing: tokio::sync::Notify,
    /// Set once the group finished opening: entries applied before it are
    /// replays of the log at start, whose leader effects are not re-run.
    pub live: AtomicBool,
    /// Reply senders of this node's local proposals, answered as they apply.
    pub early: super::early::EarlyReplies,
}

impl QueueContext {
    /// Marks the queue shut down and wakes its runtime, which then ends.
    pub fn close(&self) {
        self.closed
            .store(true, std::sync::atomic::Ordering::Release);
        self.closing.notify_one();
    }

    /// True once [`QueueContext::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.closed.load(std::sync::atomic::Ordering::Acquire)
    }
}

/// The queue state machine plus its body store.
pub struct QueueHost {
    machine: QueueMachine,
    bodies: Box<dyn BodyStore>,
    ctx: Arc<QueueContext>,
}

impl QueueHost {
    /// A host over `machine` (fresh or restored later from a snapshot).
    pub fn new(machine: QueueMachine, bodies: Box<dyn BodyStore>, ctx: Arc<QueueContext>) -> Self {
        QueueHost {
            machine,
            bodies,
            ctx,
        }
    }

    /// Read access to the machine (counts for declare-ok, get-ok, …).
    pub fn machine(&self) -> &QueueMachine {
        &self.machine
    }

    /// Counts of this replica (what `list_queues` and declare-ok report).
    pub fn status(&self) -> crate::cluster::status::QueueStatus {
        let m = &self.machine;
        crate::cluster::status::QueueStatus {
            messages_ready: m.ready_count(),
            messages_unacknowledged: m.unacked_count(),
            consumers: m.consumer_count(),
            dead_letter_held: m.held_count(),
            messages_delayed: m.delayed_count(),
            unreadable_bodies: self.bodies.unreadable(),
            ..Default::default()
        }
    }

    /// The group finished opening (snapshot restored or not).
    pub fn finish_open(&mut self) {
        self.bodies.finish_open();
    }

    /// Reads a stored payload (used by the dead-letter worker).
    pub fn payload(&self, id: MsgId) -> Option<Bytes> {
        self.bodies.get(id)
    }

    /// Applies one command. `lead` = this node proposed the entry in its
    /// current leadership, so effects are carried out here.
    pub fn apply(&mut self, cmd: QueueCommand, lead: bool) -> QueueReply {
        // Diagnostics of forwarded dead letters (off unless asked for).
        let before = (tracing::enabled!(target: "dead_letters", tracing::Level::DEBUG)
            && log_dead_letter_commands(self.ctx.group, &cmd))
        .then(|| (self.machine.next_msg_id(), self.machine.dedup_window().0));
        let (mut reply, effects) = self.machine.apply(cmd);
        if let Some((next_id, window)) = before {
            tracing::debug!(target: "dead_letters", group = self.ctx.group, enqueued = self.machine.next_msg_id() - next_id, window_before = window, window = self.machine.dedup_window().0, "applied");
        }
        if lead {
            self.count(&effects);
        }
        let drops = self.carry_out(effects, lead);
        self.fill_payloads(&mut reply);
        for id in drops {
            self.bodies.remove(id);
        }
        reply
    }

    /// This node just became the leader (its blank entry applied, not a
    /// replay): carry out the machine's [`QueueMachine::leader_effects`] —
    /// re-deliver checked-out messages, wake the dead-letter worker, re-arm
    /// the expiry timer — since a former leader's effects may be lost.
    pub fn became_leader(&mut self) {
        let effects = self.machine.leader_effects();
        let m = &self.machine;
        let (dedup_ids, dedup_sources) = m.dedup_window();
        if m.held_count() > 0 || dedup_ids > 0 {
            // What a new leader holds of dead letters (the fault suite's
            // re-forwarded bursts, 2026-11-27); quiet for other queues, so
            // 10,000 leaderships moving log nothing at info.
            let (floor, floor_version) = m.dead_letter_floor();
            tracing::info!(
                group = self.ctx.group,
                queue = %self.ctx.name,
                ready = m.ready_count(),
                unacked = m.unacked_count(),
                held = m.held_count(),
                floor,
                floor_version,
                dedup_ids,
                dedup_sources,
                next_id = m.next_msg_id(),
                "leader: dead-letter state"
            );
        }
        tracing::debug!(
            group = self.ctx.group,
            effects = effects.len(),
            "leader: re-issuing effects"
        );
        let drops = self.carry_out(effects, true);
        debug_assert!(drops.is_empty());
    }

    /// Counts the dead-lettering among a newly applied entry's `effects` (on the leader
    /// only, so each message is counted once in the cluster).
    fn count(&self, effects: &[Effect]) {
        for e in effects {
            if let Effect::DeadLettered { reason, strategy } = e {
                crate::metrics::COUNTERS.dead_lettered(
                    &self.ctx.vhost,
                    &self.ctx.name,
                    *reason,
                    *strategy,
                );
            }
        }
    }

    /// Carries out `effects` (leader-only ones only when `lead`); returns
    /// the bodies to drop once the reply has read them.
    fn carry_out(&mut self, effects: Vec<Effect>, lead: bool) -> Vec<MsgId> {
        let mut drops = Vec::new();
        for effect in effects {
            match effect {
                Effect::StoreBody { id, payload } => self.bodies.put(id, &payload),
                Effect::DropBody { id } => drops.push(id),
                Effect::Deliver {
                    consumer,
                    mut delivery,
                } if lead => {
                    delivery.payload = self.bodies.get(delivery.id);
                    tracing::debug!(target: "deliveries", group = self.ctx.group, ?consumer, id = delivery.id, resend = delivery.resend, body = delivery.payload.is_some(), "deliver");
                    self.ctx.consumers.deliver(QueueDelivery {
                        consumer,
                        group: self.ctx.group,
                        delivery,
                    });
                }
                Effect::DeadLetter { id, reason, target } if lead => {
                    if let Some(payload) = self.bodies.get(id) {
                        let _ = self.ctx.effects.send(LeaderEffect::DeadLetter {
                            id,
                            reason,
                            target,
                            payload,
                        });
                    }
                }
                Effect::DeadLetterHeld { id, reason } if lead => {
                    let _ = self
                        .ctx
                        .effects
                        .send(LeaderEffect::DeadLetterHeld { id, reason });
                }
                Effect::QueueExpired if lead => {
                    let _ = self.ctx.effects.send(LeaderEffect::QueueExpired);
                }
                Effect::ExpiryTimer { at_ms } if lead => {
                    let _ = self.ctx.effects.send(LeaderEffect::ExpiryTimer { at_ms });
                }
                Effect::ConsumerTimedOut {
                    consumer,
                    timeout_ms,
                } if lead => {
                    tracing::info!(queue = %self.ctx.name, ?consumer, timeout_ms, "consumer timed out: its unacknowledged messages are returned");
                    self.ctx
                        .consumers
                        .timed_out(self.ctx.group, consumer, timeout_ms);
                }
                Effect::PublishersBlocked(b) if lead => {
                    let _ = self.ctx.effects.send(LeaderEffect::PublishersBlocked(b));
                }
                _ => {}
            }
        }
        drops
    }

    /// Attaches payloads to basic.get replies (before bodies are dropped).
    fn fill_payloads(&self, reply: &mut QueueReply) {
        match reply {
            QueueReply::Dequeued(Some((d, _))) => d.payload = self.bodies.get(d.id),
            QueueReply::Batch(rs) => rs.iter_mut().for_each(|r| self.fill_payloads(r)),
            _ => {}
        }
    }

    /// Serialized machine plus the location index of its spilled bodies.
    /// Bodies held only in memory are written (and synced) to the body
    /// segments first: the snapshot lets openraft purge the log entries
    /// that carried them.
    ///
    /// Errors: a body could not be written or synced (no snapshot is taken,
    /// so the log that holds the bodies is not purged); encoding.
    pub fn snapshot(&mut self) -> Result<Vec<u8>, raft_log::StoreError> {
        let index = self
            .bodies
            .persist_all()
            .map_err(raft_log::StoreError::Flush)?;
        super::snapshot_format::encode(&self.machine, &index)
    }

    /// Replaces the machine from a snapshot.
    pub fn restore(&mut self, data: &[u8]) -> Result<(), raft_log::StoreError> {
        let (machine, index) = decode_machine(data)?;
        self.bodies
            .restore(&index)
            .map_err(raft_log::StoreError::corrupt)?;
        self.machine = machine;

        tracing::debug!(
            group = self.ctx.group,
            ready = self.machine.ready_count(),
            "queue restored from snapshot"
        );

        Ok(())
    }
}

/// Diagnostics (target `dead_letters`, debug): the forwarded dead letters
/// and dead-letter settles in `cmd` (nested in `Deduped` and `Batch`),
/// before they are applied; true if it had any.
fn log_dead_letter_commands(group: u64, cmd: &QueueCommand) -> bool {
    match cmd {
        QueueCommand::Deduped { cmd, proposer, seq } => {
            let any = log_dead_letter_commands(group, cmd);
            if any {
                tracing::debug!(target: "dead_letters", group, ?proposer, seq, "deduped");
            }
            any
        }
        // Every command is logged (no short cut after the first hit).
        QueueCommand::Batch(cmds) => {
            cmds.iter()
                .filter(|c| log_dead_letter_commands(group, c))
                .count()
                > 0
        }
        QueueCommand::EnqueueDeadLetters {
            source,
            settled_below,
            floor_version,
            msgs,
            ..
        } => {
            let lo = msgs.iter().map(|(id, _)| *id).min();
            let hi = msgs.iter().map(|(id, _)| *id).max();
            tracing::debug!(target: "dead_letters", group, source, settled_below, floor_version, n = msgs.len(), ?lo, ?hi, "enqueue dead letters");
            true
        }
        QueueCommand::DeadLetterSettled { ids, .. } => {
            let lo = ids.iter().min();
            let hi = ids.iter().max();
            tracing::debug!(target: "dead_letters", group, n = ids.len(), ?lo, ?hi, "dead letters settled");
            true
        }
        _ => false,
    }
}

impl raft_log::Machine<crate::cluster::types::TypeConfig> for QueueHost {
    fn apply(
        &mut self,
        meta: &raft_log::ApplyMeta,
        cmd: crate::cluster::types::GroupCommand,
    ) -> crate::cluster::types::GroupReply {
        use crate::cluster::types::{GroupCommand, GroupReply};
        match cmd {
            GroupCommand::Queue { origin, cmd } => {
                let lead =
                    origin.node == self.ctx.node && origin.epoch == self.ctx.consumers.epoch();
                let seq = match &cmd {
                    QueueCommand::Deduped { proposer, seq, .. } => {
                        Some((proposer.node, proposer.epoch, *seq))
                    }
                    _ => None,
                };
                let reply = QueueHost::apply(self, cmd, lead);
                tracing::debug!(target: "proposals", group = self.ctx.group, index = meta.index, term = meta.term, ?seq, resent = matches!(reply, QueueReply::Resent), next_id = self.machine.next_id, "applied");
                match seq {
                    // This node's own proposal: its waiting senders (if still parked)
                    // are answered here; openraft's reply then carries nothing.
                    Some((node, epoch, seq))
                        if lead && (node, epoch) == (origin.node, origin.epoch) =>
                    {
                        GroupReply::Queue(
                            self.ctx.early.answer(seq, reply).unwrap_or(QueueReply::Ok),
                        )
                    }
                    _ => GroupReply::Queue(reply),
                }
            }
            GroupCommand::LeaderRestored { origin } => {
                if origin.node == self.ctx.node
                    && origin.epoch == self.ctx.consumers.epoch()
                    && self.ctx.live.load(std::sync::atomic::Ordering::Acquire)
                {
                    self.became_leader();
                }
                GroupReply::None
            }
            GroupCommand::Meta(_) => GroupReply::None,
        }
    }

    fn snapshot(&mut self) -> Result<Vec<u8>, raft_log::StoreError> {
        QueueHost::snapshot(self)
    }

    fn restore(&mut self, data: &[u8]) -> Result<(), raft_log::StoreError> {
        QueueHost::restore(self, data)
    }

    fn leader_blank(&mut self, _meta: &raft_log::ApplyMeta, leader: u64) {
        if leader == self.ctx.node && self.ctx.live.load(std::sync::atomic::Ordering::Acquire) {
            self.became_leader();
        }
    }
}

impl QueueHost {
    /// Sender side of a snapshot install: the ids of every message the
    /// snapshot's machine owns (their bodies must go with it).
    ///
    /// Errors: the snapshot bytes do not decode.
    pub fn snapshot_body_ids(snapshot: &[u8]) -> Result<Vec<MsgId>, String> {
        let (_, machine) = decode_snapshot(snapshot)?;
        Ok(machine.all_message_ids())
    }

    /// Receiver side: stores bodies received with a snapshot.
    pub fn import_bodies(&mut self, bodies: Vec<(MsgId, Bytes)>) {
        for (id, body) in bodies {
            self.bodies.put(id, &body);
        }
    }

    /// Receiver side, after all bodies: drops bodies the snapshot does not
    /// own, persists the rest, and returns the snapshot bytes with the body
    /// index replaced by this replica's own.
    ///
    /// Errors: the snapshot bytes do not decode or re-encode; the bodies
    /// cannot be written or synced.
    pub fn finish_import(
        &mut self,
        snapshot: Vec<u8>,
        received: &std::collections::HashSet<MsgId>,
    ) -> Result<Vec<u8>, String> {
        let (mut payload, machine) = decode_snapshot(&snapshot)?;
        let owned: std::collections::HashSet<MsgId> =
            machine.all_message_ids().into_iter().collect();
        let missing = owned.iter().filter(|id| !received.contains(id)).count();
        if missing > 0 {
            // The sender reads bodies when it streams, not when it took the
            // snapshot: messages settled in between have no body there, and
            // the log entries after the snapshot settle them here too.
            tracing::info!(
                group = self.ctx.group,
                missing,
                "snapshot arrived without some message bodies (expected for messages settled since it was taken: the log entries after it settle them here too)"
            );
        }
        for id in self.bodies.ids() {
            if !owned.contains(&id) {
                self.bodies.remove(id);
            }
        }
        let index = self
            .bodies
            .persist_all()
            .map_err(|e| format!("persisting received bodies: {e}"))?;
        payload.machine =
            super::snapshot_format::encode(&machine, &index).map_err(|e| e.to_string())?;
        payload.encode().map_err(|e| e.to_string())
    }
}

/// A queue replica's snapshot form ([`QueueHost::snapshot`]): the machine
/// and the location index of its spilled bodies.
fn decode_machine(data: &[u8]) -> Result<(QueueMachine, Vec<u8>), raft_log::StoreError> {
    super::snapshot_format::decode(data)
}

/// A whole snapshot as openraft holds it, with its queue machine decoded
/// (the body index, valid only on the node that wrote it, is left out).
fn decode_snapshot(
    snapshot: &[u8],
) -> Result<
    (
        raft_log::SnapshotPayload<u64, openraft::BasicNode>,
        QueueMachine,
    ),
    String,
> {
    let payload = raft_log::SnapshotPayload::decode(snapshot).map_err(|e| e.to_string())?;
    let (machine, _index) = decode_machine(&payload.machine).map_err(|e| e.to_string())?;
    Ok((payload, machine))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use raft_log::{ApplyMeta, Machine};
    use tokio::sync::mpsc;

    use super::*;
    use crate::cluster::types::{GroupCommand, GroupReply, Origin};
    use crate::consumers::ConnEvent;
    use crate::queue::bodies::MemBodies;
    use crate::queue::types::{EnqueueMsg, QueueConfig};

    const META: ApplyMeta = ApplyMeta {
        group: 7,
        index: 1,
        term: 3,
    };

    /// Applies `cmd` as proposed by `origin`.
    fn apply(host: &mut QueueHost, origin: Origin, cmd: QueueCommand) {
        Machine::apply(host, &META, GroupCommand::Queue { origin, cmd });
    }

    /// Delivered message ids and their resend flags, in order.
    fn drain(rx: &mut mpsc::UnboundedReceiver<ConnEvent>) -> Vec<(MsgId, bool)> {
        let mut out = Vec::new();
        while let Ok(ConnEvent::Delivery { delivery: d, .. }) = rx.try_recv() {
            out.push((d.delivery.id, d.delivery.resend));
        }
        out
    }

    /// Node 1 in boot 2, leading queue group 7, with one local consumer
    /// (prefetch 1) holding the one enqueued message, id 0.
    fn leader_with_checked_out() -> (QueueHost, Origin, mpsc::UnboundedReceiver<ConnEvent>) {
        let registry = ConsumerRegistry::new(1, 2);
        let (tx, mut rx) = mpsc::unbounded_channel();
        let consumer = registry.register(tx, 7, 0);
        let (effects, _effects_rx) = mpsc::unbounded_channel();
        let ctx = Arc::new(QueueContext {
            group: 7,
            vhost: "/".into(),
            name: "q".into(),
            node: 1,
            consumers: registry,
            effects,
            closed: AtomicBool::new(false),
            closing: tokio::sync::Notify::new(),
            live: AtomicBool::new(true),
            early: Default::default(),
        });
        let mut host = QueueHost::new(
            QueueMachine::new(QueueConfig::default()),
            Box::new(MemBodies::default()),
            ctx,
        );
        let me = Origin { node: 1, epoch: 2 };
        apply(
            &mut host,
            me,
            QueueCommand::Enqueue {
                now_ms: 1,
                msgs: vec![EnqueueMsg {
                    payload: Bytes::from_static(b"m"),
                    body_size: 1,
                    ttl_ms: None,
                }],
            },
        );
        apply(
            &mut host,
            me,
            QueueCommand::Checkout {
                now_ms: 1,
                consumer,
                prefetch: 1,
                no_ack: false,
            },
        );
        assert_eq!(
            drain(&mut rx),
            vec![(0, false)],
            "delivered once by the leader"
        );
        (host, me, rx)
    }

    /// A replica openraft restored as leader from its vote appends
    /// `LeaderRestored`: applying it re-issues the deliveries the boot that
    /// went down may have lost (fault suite seed 879026: two messages stuck
    /// unacknowledged after a rolling restart).
    #[test]
    fn leader_restored_reissues_checked_out_deliveries() {
        let (mut host, me, mut rx) = leader_with_checked_out();
        Machine::apply(
            &mut host,
            &META,
            GroupCommand::LeaderRestored { origin: me },
        );
        assert_eq!(
            drain(&mut rx),
            vec![(0, true)],
            "re-sent, marked as a resend"
        );
    }

    /// The mark of another node, of an earlier boot, or one replayed while
    /// the group opens re-issues nothing.
    #[test]
    fn leader_restored_of_others_or_replayed_is_inert() {
        let (mut host, me, mut rx) = leader_with_checked_out();
        for origin in [Origin { node: 2, ..me }, Origin { epoch: 1, ..me }] {
            Machine::apply(&mut host, &META, GroupCommand::LeaderRestored { origin });
        }
        host.ctx.live.store(false, Ordering::Release);
        Machine::apply(
            &mut host,
            &META,
            GroupCommand::LeaderRestored { origin: me },
        );
        assert_eq!(drain(&mut rx), vec![]);
    }

    /// This node's own proposal is answered by the apply itself (`early`): its
    /// parked sender gets the reply, openraft's carries nothing; a resend of it
    /// is left to the proposer, and another node's proposal never takes our
    /// senders.
    #[test]
    fn own_proposals_are_answered_as_they_apply() {
        use crate::queue::types::{ProposerId, QueueReply};
        let (mut host, me, _rx) = leader_with_checked_out();
        // Applies `origin`'s proposal number 1 (an enqueue).
        fn apply_first(host: &mut QueueHost, origin: Origin) -> GroupReply {
            let cmd = QueueCommand::Deduped {
                proposer: ProposerId {
                    node: origin.node,
                    epoch: origin.epoch,
                },
                seq: 1,
                cmd: Box::new(QueueCommand::Enqueue {
                    now_ms: 2,
                    msgs: vec![EnqueueMsg {
                        payload: Bytes::from_static(b"n"),
                        body_size: 1,
                        ttl_ms: None,
                    }],
                }),
            };
            Machine::apply(host, &META, GroupCommand::Queue { origin, cmd })
        }
        let (tx, mut answered) = tokio::sync::oneshot::channel();
        host.ctx.early.park(1, vec![tx]);
        let r = apply_first(&mut host, Origin { node: 2, ..me });
        assert!(
            matches!(r, GroupReply::Queue(QueueReply::Enqueued(_))),
            "another node's reply: {r:?}"
        );
        assert!(
            answered.try_recv().is_err(),
            "another node's proposal of the same sequence number took our sender"
        );

        let r = apply_first(&mut host, me);
        assert!(
            matches!(r, GroupReply::Queue(QueueReply::Ok)),
            "placeholder: {r:?}"
        );
        assert!(matches!(
            answered.try_recv(),
            Ok(Ok(QueueReply::Enqueued(_)))
        ));
        assert!(host.ctx.early.take(1).is_none());

        let (tx, mut resent) = tokio::sync::oneshot::channel();
        host.ctx.early.park(1, vec![tx]);
        let r = apply_first(&mut host, me);
        assert!(
            matches!(r, GroupReply::Queue(QueueReply::Resent)),
            "resend: {r:?}"
        );
        assert!(
            resent.try_recv().is_err(),
            "a resend is answered by the proposer"
        );
        assert_eq!(host.ctx.early.take(1).map(|r| r.len()), Some(1));
    }
}
