//! Why an at-least-once source queue still holds a dead letter: the last
//! reason its dead-letter worker could not forward each held message
//! (`quorumqctl inspect_dead_letters`, `GET /api/queues/{vhost}/{name}/dead-letters`,
//! `quorumq_queue_dead_letters_held`). RabbitMQ only logs these once
//! (`rabbit_fifo_dlx_worker`); quorumq also keeps the count.
//!
//! Leader-local and not replicated: the record is written by the worker
//! beside the leader and starts empty on a new leader (its held messages
//! read `pending` until its worker has tried them once, within a second).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use crate::queue::types::MsgId;

/// Why a held dead letter was not forwarded on the worker's last try.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HoldReason {
    /// The queue has no `dead-letter-exchange` (any more).
    NoDlx,
    /// The dead-letter exchange does not exist, or routes the message to no
    /// queue.
    NoRoute,
    /// A target queue refused it: overflow `reject-publish` over its limit.
    TargetFull,
    /// Every routed target would close a dead-letter cycle (spec §4).
    Cycle,
    /// A target queue did not commit it (no leader, unreachable), or the
    /// body could not be read.
    TargetUnavailable,
}

impl HoldReason {
    /// Every reason, in report order.
    pub const ALL: [HoldReason; 5] = [
        HoldReason::NoDlx,
        HoldReason::NoRoute,
        HoldReason::TargetFull,
        HoldReason::Cycle,
        HoldReason::TargetUnavailable,
    ];

    /// The name reports and metric labels use (`no_dlx`, `no_route`,
    /// `target_full`, `cycle`, `target_unavailable`).
    pub fn as_str(self) -> &'static str {
        match self {
            HoldReason::NoDlx => "no_dlx",
            HoldReason::NoRoute => "no_route",
            HoldReason::TargetFull => "target_full",
            HoldReason::Cycle => "cycle",
            HoldReason::TargetUnavailable => "target_unavailable",
        }
    }
}

/// Label of held messages the worker has not tried since this node leads.
pub const PENDING: &str = "pending";

/// The last hold reason of each held message the worker tried (at most one
/// round of messages, see `worker::ROUND`).
#[derive(Debug, Default)]
pub struct HeldReasons {
    by_msg: Mutex<HashMap<MsgId, HoldReason>>,
}

impl HeldReasons {
    /// Replaces the record with the outcome of one worker round: `held`
    /// (the reasons of the messages it could not forward). Messages no
    /// longer in it were forwarded or settled.
    pub fn replace(&self, held: HashMap<MsgId, HoldReason>) {
        if let Ok(mut m) = self.by_msg.lock() {
            *m = held;
        }
    }

    /// Forgets every reason (this node stopped leading, or nothing is held).
    pub fn clear(&self) {
        if let Ok(mut m) = self.by_msg.lock() {
            m.clear();
        }
    }

    /// The last reason recorded for message `id`.
    pub fn reason(&self, id: MsgId) -> Option<HoldReason> {
        self.by_msg.lock().ok()?.get(&id).copied()
    }

    /// Recorded messages per reason (cheap: for `/metrics`).
    pub fn counts(&self) -> BTreeMap<HoldReason, u64> {
        let mut out = BTreeMap::new();
        if let Ok(m) = self.by_msg.lock() {
            for r in m.values() {
                *out.entry(*r).or_insert(0) += 1;
            }
        }
        out
    }

    /// Held messages per reason name: `held` (the machine's held ids) by
    /// their recorded reason, [`PENDING`] for those not tried yet.
    pub fn summarise(&self, held: impl Iterator<Item = MsgId>) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        let Ok(m) = self.by_msg.lock() else {
            return out;
        };
        for id in held {
            let name = m.get(&id).map_or(PENDING, |r| r.as_str());
            *out.entry(name.to_string()).or_insert(0) += 1;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_replaces_the_record_and_untried_messages_are_pending() {
        let h = HeldReasons::default();
        h.replace(HashMap::from([
            (1, HoldReason::NoRoute),
            (2, HoldReason::TargetFull),
        ]));
        h.replace(HashMap::from([
            (2, HoldReason::TargetFull),
            (3, HoldReason::TargetFull),
        ]));
        assert_eq!(h.reason(1), None, "forwarded in the last round");
        assert_eq!(h.counts(), BTreeMap::from([(HoldReason::TargetFull, 2)]));
        let s = h.summarise([2, 3, 4].into_iter());
        assert_eq!(s.get("target_full"), Some(&2));
        assert_eq!(s.get(PENDING), Some(&1));
        h.clear();
        assert!(h.counts().is_empty());
    }

    #[test]
    fn names_are_the_documented_labels() {
        let names: Vec<_> = HoldReason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(
            names,
            [
                "no_dlx",
                "no_route",
                "target_full",
                "cycle",
                "target_unavailable"
            ]
        );
    }
}
