//! Dead-letter cycle detection (spec §4): a target queue already in the
//! death history is a cycle unless a `rejected` death lies between now and
//! that queue's most recent entry (inclusive). The history is the broker's
//! own ([`crate::message::DeathHistory`]): a client-supplied `x-death`
//! names no cycle (RabbitMQ 4.0.1+, `mc:is_death_cycle/2`).

use crate::message::DeathRecord;
use crate::queue::types::DeadLetterReason;

/// True if delivering to `target` would close an automatic cycle.
/// `deaths` is the broker's death records, most recent first, the current
/// event at the head (`DeadLettered::deaths`).
pub fn is_cycle(deaths: &[DeathRecord], target: &str) -> bool {
    let Some(first) = deaths.first() else {
        return false;
    };
    if first.reason == DeadLetterReason::Rejected {
        return false;
    }
    match deaths.iter().position(|d| d.queue == target) {
        None => false,
        Some(i) => !deaths[..=i]
            .iter()
            .any(|d| d.reason == DeadLetterReason::Rejected),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use DeadLetterReason::{Expired, Maxlen, Rejected};

    fn d(q: &str, reason: DeadLetterReason) -> DeathRecord {
        DeathRecord {
            queue: q.into(),
            reason,
            count: 1,
            time_secs: 0,
            exchange: String::new(),
            routing_keys: Vec::new(),
            original_expiration: None,
        }
    }

    #[test]
    fn self_loop_expired_is_cycle() {
        assert!(is_cycle(&[d("q", Expired)], "q"));
        assert!(is_cycle(&[d("q", Maxlen)], "q"));
    }

    #[test]
    fn rejected_never_cycles() {
        assert!(!is_cycle(&[d("q", Rejected)], "q"));
    }

    #[test]
    fn reject_expire_expire_is_delivered() {
        // dead_letter_reject_expire_expire: Q1 -rejected-> Q2 -expired-> Q3 -expired-> Q1
        let h = [d("q3", Expired), d("q2", Expired), d("q1", Rejected)];
        assert!(!is_cycle(&h, "q1"));
        assert!(is_cycle(&[d("q3", Expired), d("q2", Expired)], "q2"));
    }

    #[test]
    fn unseen_target_is_not_a_cycle() {
        assert!(!is_cycle(&[d("q1", Expired)], "q2"));
        assert!(!is_cycle(&[], "q1"));
    }
}
