//! Dead-letter cycle detection (spec §4): a target queue already in the
//! death history is a cycle unless a `rejected` death lies between now and
//! that queue's most recent entry (inclusive).

use super::rewrite::Death;

/// True if delivering to `target` would close an automatic cycle.
/// `deaths` is most recent first, the current event at the head.
pub fn is_cycle(deaths: &[Death], target: &str) -> bool {
    let Some(first) = deaths.first() else {
        return false;
    };
    if first.reason == "rejected" {
        return false;
    }
    match deaths.iter().position(|d| d.queue == target) {
        None => false,
        Some(i) => !deaths[..=i].iter().any(|d| d.reason == "rejected"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(q: &str, r: &str) -> Death {
        Death {
            queue: q.into(),
            reason: r.into(),
        }
    }

    #[test]
    fn self_loop_expired_is_cycle() {
        assert!(is_cycle(&[d("q", "expired")], "q"));
        assert!(is_cycle(&[d("q", "maxlen")], "q"));
    }

    #[test]
    fn rejected_never_cycles() {
        assert!(!is_cycle(&[d("q", "rejected")], "q"));
    }

    #[test]
    fn reject_expire_expire_is_delivered() {
        // dead_letter_reject_expire_expire: Q1 -rejected-> Q2 -expired-> Q3 -expired-> Q1
        let h = [d("q3", "expired"), d("q2", "expired"), d("q1", "rejected")];
        assert!(!is_cycle(&h, "q1"));
        assert!(is_cycle(&[d("q3", "expired"), d("q2", "expired")], "q2"));
    }

    #[test]
    fn unseen_target_is_not_a_cycle() {
        assert!(!is_cycle(&[d("q1", "expired")], "q2"));
    }
}
