//! A state machine gated by its log's durable mark (`apply_when_durable`, used with
//! `LogStore::ack_own_entries`): an entry is applied, and its reply returned, only once the
//! local log holds it durably.

mod common;

use std::time::Duration;

use common::{bounded, normal, open, stores};
use openraft::storage::RaftStateMachine;
use tempfile::TempDir;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_waits_until_the_entry_is_durable() {
    bounded(async {
        let dir = TempDir::new().unwrap();
        let ns = open(dir.path());
        let (mut log, sm) = stores(&ns, 5);
        let mut sm = sm.apply_when_durable(log.durable());
        let machine = sm.machine();
        log.append_durable([normal(1, 1, 10)]).await.unwrap();

        // Entry 2 is committed (say by followers) but not yet written here.
        let apply = tokio::spawn(async move { sm.apply([normal(1, 2, 20)]).await });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!apply.is_finished(), "applied before the local log held it");
        assert_eq!(machine.lock().unwrap().items, Vec::<u64>::new());

        log.append_durable([normal(1, 2, 20)]).await.unwrap();
        let replies = apply.await.unwrap().expect("apply");
        assert_eq!(replies, vec![1]);
        assert_eq!(machine.lock().unwrap().items, vec![20]);
    })
    .await
}
