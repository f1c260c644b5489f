//! Drop and reopen a `NodeStore` from the same directory: log, vote, committed id, snapshot and
//! machine state come back identical; dropped groups stay dropped.

mod common;

use std::time::Duration;

use common::{bounded, log_id, membership, normal, open, stores};
use openraft::storage::{RaftLogStorage, RaftStateMachine};
use openraft::{RaftLogReader, RaftSnapshotBuilder, StorageHelper, Vote};
use raft_log::SnapshotPayload;
use tempfile::TempDir;

const G: u64 = 7;

#[tokio::test]
async fn log_vote_committed_snapshot_and_machine_survive_reopen() {
    bounded(async {
        let dir = TempDir::new().unwrap();

        // --- write: entries 0..=20, vote, committed 15, snapshot at 10, apply up to 15,
        //     purge ..=5, truncate 18.. (uncommitted suffix)
        let ns = open(dir.path());
        let (mut log, mut sm) = stores(&ns, G);
        let mut entries = vec![membership(1, 0, &[0])];
        entries.extend((1..=20).map(|i| normal(1, i, i * 10)));
        log.append_durable(entries.clone()).await.unwrap();
        log.save_vote(&Vote::new_committed(3, 0)).await.unwrap();
        log.save_committed(Some(log_id(1, 15))).await.unwrap();
        sm.apply(entries[..=10].to_vec()).await.unwrap();
        let snap = sm
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        assert_eq!(snap.meta.last_log_id, Some(log_id(1, 10)));
        sm.apply(entries[11..=15].to_vec()).await.unwrap();
        log.purge(log_id(1, 5)).await.unwrap();
        log.truncate(log_id(1, 18)).await.unwrap();

        let state = log.get_log_state().await.unwrap();
        assert_eq!(state.last_purged_log_id, Some(log_id(1, 5)));
        assert_eq!(state.last_log_id, Some(log_id(1, 17)));
        let before_entries = log.try_get_log_entries(0..100).await.unwrap();
        assert_eq!(before_entries.len(), 12); // 6..=17
        let before_machine = sm.machine().lock().unwrap().clone();
        let before_applied = sm.applied_state().await.unwrap();
        let before_snap = sm.get_current_snapshot().await.unwrap().unwrap();
        drop((log, sm));
        ns.close(Duration::from_secs(5)).await.unwrap();

        // --- reopen
        let ns = open(dir.path());
        assert_eq!(ns.groups().unwrap(), vec![G]);
        let (mut log, mut sm) = stores(&ns, G);
        let st = log.get_log_state().await.unwrap();
        assert_eq!(
            (st.last_purged_log_id, st.last_log_id),
            (state.last_purged_log_id, state.last_log_id)
        );
        assert_eq!(
            log.try_get_log_entries(0..100).await.unwrap(),
            before_entries
        );
        assert_eq!(
            log.read_vote().await.unwrap(),
            Some(Vote::new_committed(3, 0))
        );
        assert_eq!(log.read_committed().await.unwrap(), Some(log_id(1, 15)));

        let snap = sm.get_current_snapshot().await.unwrap().unwrap();
        assert_eq!(snap.meta, before_snap.meta);
        assert_eq!(snap.snapshot.get_ref(), before_snap.snapshot.get_ref());

        // The machine was restored from the snapshot (index 10), not from memory.
        let restored = sm.machine().lock().unwrap().clone();
        assert_eq!(restored.items, (1..=10).map(|i| i * 10).collect::<Vec<_>>());
        assert_eq!(sm.applied_state().await.unwrap().0, Some(log_id(1, 10)));

        // openraft's startup path re-applies (10, 15] from the log: same machine as before.
        StorageHelper::new(&mut log, &mut sm)
            .get_initial_state()
            .await
            .unwrap();
        assert_eq!(*sm.machine().lock().unwrap(), before_machine);
        assert_eq!(sm.applied_state().await.unwrap(), before_applied);
    })
    .await
}

#[tokio::test]
async fn drop_group_removes_all_three_trees() {
    bounded(async {
        let dir = TempDir::new().unwrap();
        let ns = open(dir.path());
        for g in [1, 2, 3] {
            let (mut log, mut sm) = stores(&ns, g);
            log.append_durable([normal(1, 1, g)]).await.unwrap();
            log.save_vote(&Vote::new(1, 0)).await.unwrap();
            sm.apply([normal(1, 1, g)]).await.unwrap();
            sm.get_snapshot_builder()
                .await
                .build_snapshot()
                .await
                .unwrap();
        }
        assert_eq!(ns.groups().unwrap(), vec![1, 2, 3]);
        ns.drop_group(2).unwrap();
        assert_eq!(ns.groups().unwrap(), vec![1, 3]);
        ns.close(Duration::from_secs(5)).await.unwrap();

        let ns = open(dir.path());
        assert_eq!(ns.groups().unwrap(), vec![1, 3]);
        let (mut log, mut sm) = stores(&ns, 2);
        assert!(log.is_empty());
        assert_eq!(log.read_vote().await.unwrap(), None);
        assert!(sm.get_current_snapshot().await.unwrap().is_none());
        let (mut log3, _sm3) = stores(&ns, 3);
        assert_eq!(
            log3.try_get_log_entries(..).await.unwrap(),
            vec![normal(1, 1, 3)]
        );
    })
    .await
}

#[test]
fn second_open_of_same_dir_is_an_error_not_a_panic() {
    let dir = TempDir::new().unwrap();
    let _ns = open(dir.path());
    assert!(raft_log::NodeStore::open(dir.path(), common::CACHE).is_err());
}

#[tokio::test]
async fn install_snapshot_rejects_bytes_that_disagree_with_meta() {
    bounded(async {
        let dir = TempDir::new().unwrap();
        let ns = open(dir.path());
        let (_l1, mut leader) = stores(&ns, 1);
        let (_l2, mut follower) = stores(&ns, 2);
        leader
            .apply([membership(1, 0, &[1]), normal(1, 1, 5)])
            .await
            .unwrap();
        let snap = leader
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();

        // meta claims index 9 but the bytes say index 1
        let mut meta = snap.meta.clone();
        meta.last_log_id = Some(log_id(1, 9));
        let bytes = snap.snapshot.clone();
        assert!(follower.install_snapshot(&meta, bytes).await.is_err());
        assert!(follower.get_current_snapshot().await.unwrap().is_none());

        // garbage bytes
        let garbage = Box::new(std::io::Cursor::new(vec![0xff; 16]));
        assert!(follower
            .install_snapshot(&snap.meta, garbage)
            .await
            .is_err());

        // the real thing installs and restores the machine
        follower
            .install_snapshot(&snap.meta, snap.snapshot.clone())
            .await
            .unwrap();
        assert_eq!(follower.machine().lock().unwrap().items, vec![5]);
        let payload =
            SnapshotPayload::<u64, openraft::BasicNode>::decode(snap.snapshot.get_ref()).unwrap();
        assert_eq!(payload.last_applied, Some(log_id(1, 1)));
    })
    .await
}

#[test]
fn a_directory_in_the_sled_only_layout_is_refused() {
    let dir = TempDir::new().unwrap();
    // What the earlier layout left: sled's files directly in the store directory.
    drop(sled::open(dir.path()).unwrap());
    let err = raft_log::NodeStore::open(dir.path(), common::CACHE)
        .err()
        .expect("old layout refused");
    assert!(
        err.to_string().contains("earlier sled-only layout"),
        "{err}"
    );
}

/// openraft's state machine worker drops its store a little after `Raft::shutdown`; a close
/// that returned before it did left sled's lock held, and the reopen failed (CI, 2026-11-25).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_waits_for_a_state_machine_still_held_elsewhere() {
    bounded(async {
        let dir = TempDir::new().unwrap();
        let ns = open(dir.path());
        let (log, sm) = stores(&ns, G);
        drop(log);
        let late = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            drop(sm);
        });
        ns.close(Duration::from_secs(5)).await.unwrap();
        // Open again at once: sled's lock must be free.
        let ns = open(dir.path());
        late.await.unwrap();

        // One that outlives the timeout is reported, and the store closes when it goes.
        let (log, sm) = stores(&ns, G);
        drop(log);
        let err = ns
            .close(Duration::from_millis(50))
            .await
            .expect_err("a live state machine keeps the store open");
        assert!(matches!(err, raft_log::StoreError::Busy(_)), "{err}");
        drop(sm);
        open(dir.path());
    })
    .await
}

/// Opening a group creates no sled tree: sled rewrites its whole tree directory for each new
/// tree, so a tree per group made every new queue dearer than the last (issue 31). A snapshot
/// an earlier version kept in a group's sled tree still restores after a reopen, and dropping
/// that group drops its tree.
#[tokio::test]
async fn new_groups_create_no_sled_trees_and_earlier_trees_still_restore() {
    bounded(async {
        let dir = TempDir::new().unwrap();
        let ns = open(dir.path());
        let trees = ns.db().tree_names().len();
        for g in 10..20 {
            let (_log, _sm) = stores(&ns, g);
        }
        assert_eq!(ns.db().tree_names().len(), trees, "no tree per group");

        // Group 5's snapshot as an earlier version stored it (tree `snap/5`).
        let payload = SnapshotPayload::<u64, openraft::BasicNode> {
            last_applied: Some(log_id(1, 3)),
            last_membership: openraft::StoredMembership::default(),
            machine: raft_log::codec::encode(&vec![10u64, 20, 30]).unwrap(),
        };
        let meta = openraft::SnapshotMeta::<u64, openraft::BasicNode> {
            last_log_id: Some(log_id(1, 3)),
            last_membership: openraft::StoredMembership::default(),
            snapshot_id: "old".into(),
        };
        let tree = ns.db().open_tree("snap/5").unwrap();
        tree.insert("meta", raft_log::codec::encode(&meta).unwrap())
            .unwrap();
        tree.insert("data", payload.encode().unwrap()).unwrap();
        drop(tree);
        ns.sync_sled().unwrap();
        ns.close(Duration::from_secs(5)).await.unwrap();

        let ns = open(dir.path());
        assert_eq!(ns.groups().unwrap(), vec![5]);
        let (_log, sm) = stores(&ns, 5);
        assert_eq!(sm.machine().lock().unwrap().items, vec![10, 20, 30]);
        drop((_log, sm));
        ns.drop_group(5).unwrap();
        assert_eq!(ns.groups().unwrap(), Vec::<u64>::new());
        assert!(!ns.db().tree_names().iter().any(|n| n.as_ref() == b"snap/5"));
        ns.close(Duration::from_secs(5)).await.unwrap();
    })
    .await
}
