//! Publisher confirms of one channel: sequence numbers, and turning
//! completions (in any order) into basic.ack / basic.nack frames, using
//! `multiple=true` when a contiguous run of acks can be confirmed at once.

use std::collections::BTreeMap;

/// One confirm frame to send: (delivery tag, multiple, ack=true / nack=false).
pub type ConfirmFrame = (u64, bool, bool);

/// Outstanding publishes of a channel in confirm mode.
#[derive(Debug, Default)]
pub struct ConfirmTracker {
    next_seq: u64,
    /// seq -> Some(ack?) once completed, None while in flight.
    pending: BTreeMap<u64, Option<bool>>,
}

impl ConfirmTracker {
    /// Allocates the sequence number of the next publish (1-based).
    pub fn allocate(&mut self) -> u64 {
        self.next_seq += 1;
        self.pending.insert(self.next_seq, None);
        self.next_seq
    }

    /// Records that publish `seq` completed (`ok` = ack, else nack).
    pub fn complete(&mut self, seq: u64, ok: bool) {
        if let Some(slot) = self.pending.get_mut(&seq) {
            *slot = Some(ok);
        }
    }

    /// Frames for the completed publishes that no in-flight publish
    /// precedes, in publish order: a run of acks becomes one `multiple` ack,
    /// nacks go one by one. A later publish that completed first waits for
    /// the earlier ones, so tags only ever increase on the wire (RabbitMQ
    /// 3.10.8 confirms one queue's publishes in order too; across queues it
    /// may confirm out of order, quorumq does not — README, differences).
    pub fn drain(&mut self) -> Vec<ConfirmFrame> {
        let mut frames: Vec<ConfirmFrame> = Vec::new();
        while let Some(entry) = self.pending.first_entry() {
            let Some(ok) = *entry.get() else { break };
            let seq = entry.remove_entry().0;
            match frames.last_mut() {
                Some((end, multiple, true)) if ok => {
                    *end = seq;
                    *multiple = true;
                }
                _ => frames.push((seq, false, ok)),
            }
        }
        frames
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_order_acks_fold_into_multiple() {
        let mut t = ConfirmTracker::default();
        let seqs: Vec<u64> = (0..5).map(|_| t.allocate()).collect();
        for s in &seqs {
            t.complete(*s, true);
        }
        assert_eq!(t.drain(), vec![(5, true, true)]);
        assert!(t.drain().is_empty());
    }

    #[test]
    fn later_completions_wait_for_earlier_ones_and_nacks_are_individual() {
        let mut t = ConfirmTracker::default();
        for _ in 0..5 {
            t.allocate();
        }
        t.complete(3, true);
        t.complete(2, false);
        assert!(t.drain().is_empty(), "publish 1 is still in flight");
        t.complete(1, true);
        assert_eq!(
            t.drain(),
            vec![(1, false, true), (2, false, false), (3, false, true)]
        );
        t.complete(5, true);
        assert!(t.drain().is_empty());
        t.complete(4, true);
        assert_eq!(t.drain(), vec![(5, true, true)]);
    }

    #[test]
    fn single_ack_is_not_multiple() {
        let mut t = ConfirmTracker::default();
        let s = t.allocate();
        t.complete(s, true);
        assert_eq!(t.drain(), vec![(1, false, true)]);
    }

    proptest::proptest! {
        /// Whatever order publishes complete in, and however drains
        /// interleave, the frames confirm every publish exactly once, with
        /// increasing tags, and with its own outcome.
        #[test]
        fn every_publish_is_confirmed_once_in_order(
            outcomes in proptest::collection::vec(proptest::bool::ANY, 1..60),
            order in proptest::collection::vec(proptest::num::usize::ANY, 60),
            drains in proptest::collection::vec(proptest::bool::ANY, 60),
        ) {
            let mut t = ConfirmTracker::default();
            let n = outcomes.len();
            for _ in 0..n {
                t.allocate();
            }
            // A permutation of 1..=n picked by `order`.
            let mut left: Vec<u64> = (1..=n as u64).collect();
            let mut frames = Vec::new();
            for i in 0..n {
                let seq = left.remove(order[i] % left.len());
                t.complete(seq, outcomes[seq as usize - 1]);
                if drains[i] {
                    frames.extend(t.drain());
                }
            }
            frames.extend(t.drain());
            let mut last = 0u64;
            for (tag, multiple, ack) in frames {
                proptest::prop_assert!(tag > last);
                let covered = if multiple { last + 1..=tag } else { tag..=tag };
                if !multiple {
                    proptest::prop_assert_eq!(tag, last + 1, "a single confirm skips no publish");
                }
                for s in covered {
                    proptest::prop_assert_eq!(outcomes[s as usize - 1], ack);
                }
                last = tag;
            }
            proptest::prop_assert_eq!(last, n as u64);
        }
    }
}
