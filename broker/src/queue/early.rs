//! Replies a queue leader's state machine hands straight to this node's
//! waiting publishers and consumers as it applies their entry, instead of
//! through openraft's reply path (state machine task → RaftCore → the
//! queue's proposer → the connection): two task hand-offs fewer on the
//! path of every confirm.
//!
//! The proposer parks the reply senders of an entry it submitted to its
//! local Raft under the entry's sequence number ([`EarlyReplies::park`]);
//! when the state machine applies that entry on this node with an ordinary
//! reply, it answers them at once ([`EarlyReplies::answer`]). An entry
//! refused as out of sequence, or skipped as a resend, is answered by the
//! proposer as before: it alone knows whether to resend and what a resend
//! answers. Whatever answers first takes the senders, so every proposal is
//! answered exactly once.
//!
//! An answer is the state machine's reply to the applied entry: the same
//! value openraft would have carried back, at the same point (the entry is
//! committed and durable on this node, see `raft_log::durable`).

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::sync::oneshot;

use super::error::QueueError;
use super::types::QueueReply;

/// The senders of one entry's proposals, in the entry's order.
pub type Replies = Vec<oneshot::Sender<Result<QueueReply, QueueError>>>;

/// Reply senders of this node's in-flight local proposals of one queue, by
/// the proposer's sequence number. Empty when idle: an idle queue holds an
/// empty map (no allocation).
#[derive(Default)]
pub struct EarlyReplies {
    waiting: Mutex<HashMap<u64, Replies>>,
}

impl EarlyReplies {
    /// Parks the senders of the entry proposed with sequence number `seq`.
    pub fn park(&self, seq: u64, replies: Replies) {
        if let Ok(mut w) = self.waiting.lock() {
            w.insert(seq, replies);
        }
    }

    /// Takes back the senders of `seq` if nobody answered them yet (the
    /// proposer, once openraft answered or the write failed).
    pub fn take(&self, seq: u64) -> Option<Replies> {
        self.waiting.lock().ok()?.remove(&seq)
    }

    /// The state machine applied `seq` with `reply`: answers its parked
    /// senders, if any, and returns None; else gives `reply` back. Out of
    /// sequence and resend replies are always given back (see the module
    /// docs).
    pub fn answer(&self, seq: u64, reply: QueueReply) -> Option<QueueReply> {
        if matches!(reply, QueueReply::Resent | QueueReply::OutOfSequence) {
            return Some(reply);
        }
        let Some(replies) = self.take(seq) else {
            return Some(reply);
        };
        deliver(reply, replies);
        None
    }
}

/// Hands each proposal of one entry its reply: the reply itself for a
/// single proposal, the elements of a batch reply otherwise.
pub fn deliver(reply: QueueReply, replies: Replies) {
    if replies.len() == 1 {
        if let Some(tx) = replies.into_iter().next() {
            let _ = tx.send(Ok(reply));
        }
    } else if let QueueReply::Batch(rs) = reply {
        for (tx, r) in replies.into_iter().zip(rs) {
            let _ = tx.send(Ok(r));
        }
    } else {
        for tx in replies {
            let _ = tx.send(Err(QueueError::Raft("unexpected batch reply".into())));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn senders(
        n: usize,
    ) -> (
        Replies,
        Vec<oneshot::Receiver<Result<QueueReply, QueueError>>>,
    ) {
        (0..n).map(|_| oneshot::channel()).unzip()
    }

    #[test]
    fn an_applied_entry_answers_its_parked_proposals_once() {
        let early = EarlyReplies::default();
        let (txs, mut rxs) = senders(2);
        early.park(4, txs);
        let reply = QueueReply::Batch(vec![QueueReply::Ok, QueueReply::Ok]);
        assert!(early.answer(4, reply).is_none());
        for rx in &mut rxs {
            assert!(matches!(rx.try_recv(), Ok(Ok(QueueReply::Ok))));
        }
        assert!(early.take(4).is_none(), "answered senders are gone");
        assert!(
            early.answer(4, QueueReply::Ok).is_some(),
            "a second apply of the same sequence number answers nobody"
        );
    }

    #[test]
    fn resends_and_out_of_sequence_replies_stay_with_the_proposer() {
        let early = EarlyReplies::default();
        let (txs, mut rxs) = senders(1);
        early.park(9, txs);
        assert!(early.answer(9, QueueReply::Resent).is_some());
        assert!(early.answer(9, QueueReply::OutOfSequence).is_some());
        assert!(rxs[0].try_recv().is_err(), "not answered");
        assert_eq!(early.take(9).map(|r| r.len()), Some(1));
    }

    #[test]
    fn an_entry_nobody_parked_gives_its_reply_back() {
        let early = EarlyReplies::default();
        assert!(matches!(
            early.answer(1, QueueReply::Ok),
            Some(QueueReply::Ok)
        ));
    }
}
