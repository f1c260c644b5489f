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

    /// Frames for every completed publish, in order: the longest completed
    /// prefix of acks becomes one `multiple` ack; the rest go one by one.
    pub fn drain(&mut self) -> Vec<ConfirmFrame> {
        let mut frames = Vec::new();
        // Completed prefix of acks (no in-flight or nack before them).
        let mut prefix_end = None;
        let mut prefix_len = 0usize;
        for (&seq, state) in &self.pending {
            match state {
                Some(true) => {
                    prefix_end = Some(seq);
                    prefix_len += 1;
                }
                _ => break,
            }
        }
        if let Some(end) = prefix_end {
            let rest = self.pending.split_off(&(end + 1));
            self.pending = rest;
            frames.push((end, prefix_len > 1, true));
        }
        let done: Vec<(u64, bool)> = self
            .pending
            .iter()
            .filter_map(|(&s, st)| st.map(|ok| (s, ok)))
            .collect();
        for (seq, ok) in done {
            self.pending.remove(&seq);
            frames.push((seq, false, ok));
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
    fn out_of_order_and_nacks_are_individual() {
        let mut t = ConfirmTracker::default();
        for _ in 0..4 {
            t.allocate();
        }
        t.complete(3, true);
        t.complete(2, false);
        assert_eq!(t.drain(), vec![(2, false, false), (3, false, true)]);
        t.complete(1, true);
        assert_eq!(t.drain(), vec![(1, false, true)]);
        t.complete(4, true);
        assert_eq!(t.drain(), vec![(4, false, true)]);
    }

    #[test]
    fn single_ack_is_not_multiple() {
        let mut t = ConfirmTracker::default();
        let s = t.allocate();
        t.complete(s, true);
        assert_eq!(t.drain(), vec![(1, false, true)]);
    }
}
