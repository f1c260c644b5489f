//! One lock per queue group, for what must not overlap on one group: opening
//! its replica, following a membership change, dropping it. Groups do not
//! wait for each other: with one lock for every group, a node opened its new
//! replicas one after another, each through its storage and its Raft's start
//! (and, until the preferred leader stopped waiting for its seed's sync, one
//! sync after another: issue 31, 8 connections declaring were capped by it).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::OwnedMutexGuard;

/// The locks of the groups someone holds or waits for (an entry exists
/// only while it is held or awaited).
#[derive(Default)]
pub struct GroupLocks(Mutex<HashMap<u64, Arc<tokio::sync::Mutex<()>>>>);

/// Group `group`'s lock, held until dropped.
pub struct GroupGuard<'a> {
    locks: &'a GroupLocks,
    group: u64,
    guard: Option<OwnedMutexGuard<()>>,
}

impl GroupLocks {
    /// Waits for and takes group `group`'s lock.
    pub async fn lock(&self, group: u64) -> GroupGuard<'_> {
        let lock = {
            let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
            map.entry(group).or_default().clone()
        };
        GroupGuard {
            locks: self,
            group,
            guard: Some(lock.lock_owned().await),
        }
    }

    /// Groups with an entry (held or awaited locks).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.lock().map(|m| m.len()).unwrap_or(0)
    }
}

impl Drop for GroupGuard<'_> {
    fn drop(&mut self) {
        let mut map = self.locks.0.lock().unwrap_or_else(|p| p.into_inner());
        // Clones are taken under the map's lock: the map's and this guard's
        // alone mean nobody awaits it.
        if let Some(guard) = self.guard.take() {
            if Arc::strong_count(OwnedMutexGuard::mutex(&guard)) == 2 {
                map.remove(&self.group);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Two groups' locks are held at once; one group's lock is exclusive,
    /// and the table forgets a lock nobody holds or awaits.
    #[tokio::test]
    async fn one_group_waits_for_itself_only() {
        let locks = Arc::new(GroupLocks::default());
        let a = locks.lock(1).await;
        let b = tokio::time::timeout(Duration::from_secs(1), locks.lock(2)).await;
        assert!(b.is_ok(), "another group's lock is free");
        drop(b);
        let l = locks.clone();
        let mut again = tokio::spawn(async move {
            let _g = l.lock(1).await;
        });
        assert!(
            tokio::time::timeout(Duration::from_millis(50), &mut again)
                .await
                .is_err(),
            "group 1 is held"
        );
        assert_eq!(
            locks.len(),
            1,
            "group 1 held and awaited, group 2 forgotten"
        );
        drop(a);
        again.await.unwrap();
        assert_eq!(locks.len(), 0, "nobody holds or awaits a lock");
    }
}
