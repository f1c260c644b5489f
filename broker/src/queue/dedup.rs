//! Effectively-once enqueue of messages another queue forwards
//! at-least-once (`QueueCommand::EnqueueDeadLetters`, issue 29 item 4).
//!
//! The at-least-once dead-letter worker of a source queue enqueues held dead
//! letters into each target, waits for the target's commit, then settles
//! them in the source. If the source's leader dies between the two (or the
//! target's reply is lost in a leader change), the next leader forwards the
//! same messages again. The target therefore remembers, per source queue
//! (its Raft group id), the source message ids it accepted that the source
//! may still send again — the *window* — and answers a copy `Accepted`
//! without enqueueing it. RabbitMQ 3.10's `rabbit_fifo_dlx_worker` has no
//! such table (its dead letters may be duplicated after a failover); the
//! idea is the publisher de-duplication of `rabbit_fifo` enqueuers (and
//! Kafka's idempotent producer), keyed by the source message instead of a
//! sequence number because a source forwards in any order.
//!
//! Pruning: the source says below which of its ids everything it ever
//! forwarded is settled (`settled_below`, the *floor*, with a
//! `floor_version` that orders such statements of one source: a stale
//! sender's older floor is ignored). The window forgets ids below the
//! floor, and a copy of one of them is a stale resend (a deposed leader's
//! worker reading an old replica): it is answered `Accepted`, not enqueued. Bounds: at
//! most [`MAX_IDS_PER_SOURCE`] ids per source and [`MAX_IDS`] over all
//! sources; past them the lowest ids of the (largest) window are forgotten,
//! and a copy of one of those would be enqueued again (at-least-once, as
//! before). A source that sent nothing for [`SOURCE_IDLE_MS`] is forgotten
//! whole (a deleted queue sends nothing more), checked on this command and
//! on `Tick`. Pure: time only from the commands' `now_ms`.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::machine::QueueMachine;
use super::types::{Effect, EnqueueMsg, EnqueueOutcome, MsgId, PrioritizedMsg};

/// Most source message ids remembered for one source queue. In steady state
/// a window holds about one worker round (512 ids) until the next round's
/// floor prunes it; it grows only while the source keeps an old dead letter
/// held (e.g. another of its targets is full) and forwards newer ones.
pub const MAX_IDS_PER_SOURCE: usize = 65_536;
/// Most source message ids remembered over all sources (about 3 MiB of
/// memory and at most a few MiB of snapshot).
pub const MAX_IDS: usize = 262_144;
/// A source that sent no `EnqueueDeadLetters` for this long (ms; 7 days) is
/// forgotten: a deleted source queue sends nothing more.
pub const SOURCE_IDLE_MS: u64 = 7 * 24 * 3600 * 1000;

/// What the target remembers of one source queue.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct SourceWindow {
    /// Source message ids at or above `floor` accepted and not known to be settled.
    ids: BTreeSet<MsgId>,
    /// The source's floor of the highest version: every id below it that
    /// the source ever forwarded is settled there, so a copy of one is a
    /// stale resend (a deposed leader's worker reading an old replica).
    floor: MsgId,
    /// Highest `floor_version` applied.
    floor_version: u64,
    /// `now_ms` of the latest command from this source.
    last_ms: u64,
}

/// The de-duplication windows of every source that forwards into this queue.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct DedupTable {
    sources: BTreeMap<u64, SourceWindow>,
    /// Ids over all windows.
    total: u64,
}

impl DedupTable {
    /// Forget sources idle for [`SOURCE_IDLE_MS`] at `now_ms`.
    pub fn age(&mut self, now_ms: u64) {
        if self.sources.is_empty() {
            return;
        }
        let total = &mut self.total;
        self.sources.retain(|_, w| {
            let keep = now_ms.saturating_sub(w.last_ms) < SOURCE_IDLE_MS;
            if !keep {
                *total -= w.ids.len() as u64;
            }
            keep
        });
    }

    /// Record a command of `source` at `now_ms` and apply its floor: a
    /// higher version replaces the floor (it may be lower: a message with a
    /// lower id was held since), the same version raises it (messages were
    /// only settled in between), a lower one is stale and ignored; ids
    /// below the floor are forgotten.
    fn touch(&mut self, now_ms: u64, source: u64, settled_below: MsgId, floor_version: u64) {
        let w = self.sources.entry(source).or_default();
        w.last_ms = w.last_ms.max(now_ms);
        if floor_version > w.floor_version {
            w.floor_version = floor_version;
            w.floor = settled_below;
        } else if floor_version == w.floor_version {
            w.floor = w.floor.max(settled_below);
        }
        let kept = w.ids.split_off(&w.floor);
        self.total -= w.ids.len() as u64;
        w.ids = kept;
    }

    /// True if a copy of `source`'s message `id` must not be enqueued: it
    /// was accepted and may still be resent, or it is below the source's
    /// floor (settled there: a stale resend).
    pub fn seen(&self, source: u64, id: MsgId) -> bool {
        self.sources
            .get(&source)
            .is_some_and(|w| id < w.floor || w.ids.contains(&id))
    }

    /// Remember `source`'s message `id`, then enforce the bounds.
    fn insert(&mut self, source: u64, id: MsgId) {
        let w = self.sources.entry(source).or_default();
        if !w.ids.insert(id) {
            return;
        }
        self.total += 1;
        if w.ids.len() > MAX_IDS_PER_SOURCE {
            w.ids.pop_first();
            self.total -= 1;
        }
        while self.total > MAX_IDS as u64 {
            // The largest window gives up its lowest id (the highest group
            // id among equals: deterministic).
            let Some(w) = self.sources.values_mut().max_by_key(|w| w.ids.len()) else {
                break;
            };
            if w.ids.pop_first().is_none() {
                break;
            }
            self.total -= 1;
        }
    }

    /// Ids remembered over all sources.
    pub fn len(&self) -> u64 {
        self.total
    }

    /// Sources with a window.
    pub fn sources(&self) -> usize {
        self.sources.len()
    }

    /// Test-only consistency check of the total and the bounds.
    #[cfg(test)]
    pub fn check(&self) -> Result<(), String> {
        let sum: u64 = self.sources.values().map(|w| w.ids.len() as u64).sum();
        if sum != self.total {
            return Err(format!("dedup total {} != sum {}", self.total, sum));
        }
        if self.total > MAX_IDS as u64 {
            return Err(format!("dedup total {} over {MAX_IDS}", self.total));
        }
        for (s, w) in &self.sources {
            if w.ids.len() > MAX_IDS_PER_SOURCE {
                return Err(format!("dedup window of {s} has {} ids", w.ids.len()));
            }
            if w.ids.first().is_some_and(|id| *id < w.floor) {
                return Err(format!("dedup window of {s} keeps ids below its floor"));
            }
        }
        Ok(())
    }

    /// Test-only: a table with `source`'s window `ids` (bounds tests).
    #[cfg(test)]
    pub fn insert_for_test(&mut self, source: u64, id: MsgId) {
        self.insert(source, id);
    }
}

impl QueueMachine {
    /// Test-only: for an `EnqueueDeadLetters`, which of its messages the
    /// machine will enqueue (not in the window after the floor, first of
    /// their id in the command); empty for any other command.
    #[cfg(test)]
    pub(crate) fn dead_letters_fresh(&self, cmd: &super::types::QueueCommand) -> Vec<bool> {
        let super::types::QueueCommand::EnqueueDeadLetters {
            now_ms,
            source,
            settled_below,
            floor_version,
            msgs,
        } = cmd
        else {
            return Vec::new();
        };
        let mut t = self.dedup.clone();
        t.age(*now_ms);
        t.touch(*now_ms, *source, *settled_below, *floor_version);
        let mut seen = BTreeSet::new();
        msgs.iter()
            .map(|(id, _)| !t.seen(*source, *id) && seen.insert(*id))
            .collect()
    }

    /// `EnqueueDeadLetters`: apply the source's floor, then enqueue each
    /// message not in its window (as `EnqueuePrioritized`, limits and
    /// reject-publish included) and remember the accepted ones; a message
    /// in the window (or twice in this command) is answered `Accepted` and
    /// not enqueued again. Idle sources are forgotten first.
    pub(super) fn enqueue_dead_letters(
        &mut self,
        now_ms: u64,
        source: u64,
        settled_below: MsgId,
        floor_version: u64,
        msgs: Vec<(MsgId, PrioritizedMsg)>,
        effects: &mut Vec<Effect>,
    ) -> Vec<EnqueueOutcome> {
        self.dedup.age(now_ms);
        self.dedup
            .touch(now_ms, source, settled_below, floor_version);
        let mut outcomes = vec![EnqueueOutcome::Accepted; msgs.len()];
        // (position, source id) of each message to enqueue, in order.
        let mut fresh: Vec<(usize, MsgId)> = Vec::new();
        let mut batch: Vec<(EnqueueMsg, u8)> = Vec::new();
        // First position of each id in this command; later copies share its outcome.
        let mut first: BTreeMap<MsgId, usize> = BTreeMap::new();
        let mut copies: Vec<(usize, usize)> = Vec::new();
        for (i, (id, m)) in msgs.into_iter().enumerate() {
            if self.dedup.seen(source, id) {
                continue;
            }
            if let Some(&f) = first.get(&id) {
                copies.push((i, f));
                continue;
            }
            first.insert(id, i);
            fresh.push((i, id));
            batch.push((m.msg, m.priority));
        }
        let enqueued = self.enqueue(now_ms, batch.into_iter(), effects);
        for ((i, id), outcome) in fresh.into_iter().zip(enqueued) {
            // A refused message (reject-publish) stays out of the window:
            // the source keeps it and retries.
            if outcome == EnqueueOutcome::Accepted {
                self.dedup.insert(source, id);
            }
            outcomes[i] = outcome;
        }
        for (i, f) in copies {
            outcomes[i] = outcomes[f];
        }
        outcomes
    }
}
