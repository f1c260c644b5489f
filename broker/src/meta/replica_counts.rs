//! How many queue replicas each node holds by the topology (the members of
//! every queue record, local queues' single member included), kept up to date
//! as records come and go, so placing a new queue
//! (`cluster::placement::place`) reads a count instead of walking every
//! queue record (issue 31: that walk made each declare dearer than the last).
//! Derived state: never in a snapshot, rebuilt from the records on restore.

use std::collections::BTreeMap;

use super::QueueRecord;

/// Replicas per node id. Nodes holding none are absent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplicaCounts {
    by_node: BTreeMap<u64, usize>,
}

impl ReplicaCounts {
    /// The counts of `records` (a restored topology).
    pub fn of<'a>(records: impl IntoIterator<Item = &'a QueueRecord>) -> Self {
        let mut c = ReplicaCounts::default();
        for r in records {
            c.add(&r.members);
        }
        c
    }

    /// A record with `members` appeared (or got these members).
    pub fn add(&mut self, members: &[u64]) {
        for m in members {
            *self.by_node.entry(*m).or_default() += 1;
        }
    }

    /// A record with `members` went (or lost these members).
    pub fn remove(&mut self, members: &[u64]) {
        for m in members {
            if let Some(n) = self.by_node.get_mut(m) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    self.by_node.remove(m);
                }
            }
        }
    }

    /// Replicas node `node` holds (0 for a node holding none).
    pub fn get(&self, node: u64) -> usize {
        self.by_node.get(&node).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_follow_added_and_removed_members() {
        let mut c = ReplicaCounts::default();
        c.add(&[1, 2, 3]);
        c.add(&[1, 2]);
        assert_eq!((c.get(1), c.get(2), c.get(3), c.get(4)), (2, 2, 1, 0));
        c.remove(&[1, 2, 3]);
        assert_eq!((c.get(1), c.get(2), c.get(3)), (1, 1, 0));
        c.remove(&[3]); // never below zero
        assert_eq!(c.get(3), 0);
        c.remove(&[1, 2]);
        assert_eq!(c, ReplicaCounts::default(), "empty again");
    }
}
