//! The write-ahead log under the `LogStore`s: segments roll and drain, reads come back from disk
//! once out of the cache, a torn tail is cut at the last whole record, and records whose
//! segment was deleted (drop, truncate, purge) do not come back after a restart.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{bounded, log_id, normal, stores, Ls};
use openraft::storage::RaftLogStorage;
use openraft::{RaftLogReader, Vote};
use raft_log::{NodeStore, StoreOptions};
use tempfile::TempDir;

/// 4 KiB segments and a 512-byte read cache per group: many segments, most reads from disk.
fn open_small(dir: &Path) -> NodeStore {
    NodeStore::open_with(
        dir,
        StoreOptions {
            segment_bytes: 4096,
            group_cache_bytes: 512,
            ..StoreOptions::default()
        },
    )
    .expect("open node store")
}

fn wal_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir.join("wal"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "wal"))
        .collect();
    v.sort();
    v
}

async fn entries(log: &mut Ls) -> Vec<u64> {
    log.try_get_log_entries(..)
        .await
        .unwrap()
        .into_iter()
        .map(|e| match e.payload {
            openraft::EntryPayload::Normal(v) => v,
            other => panic!("unexpected payload {other:?}"),
        })
        .collect()
}

async fn append_one(log: &mut Ls, index: u64, value: u64) {
    log.append_durable([normal(1, index, value)]).await.unwrap();
}

#[tokio::test]
async fn segments_roll_drain_and_replay() {
    bounded(async {
        let dir = TempDir::new().unwrap();
        let ns = open_small(dir.path());
        let (mut a, _) = stores(&ns, 1);
        let (mut b, _) = stores(&ns, 2);
        for i in 1..=600 {
            append_one(&mut a, i, i).await;
            append_one(&mut b, i, 1000 + i).await;
        }
        let rolled = wal_files(dir.path()).len();
        assert!(rolled > 8, "only {rolled} segments");
        assert_eq!(entries(&mut a).await, (1..=600).collect::<Vec<_>>());
        assert_eq!(
            a.try_get_log_entries(100..=102).await.unwrap(),
            vec![
                normal(1, 100, 100),
                normal(1, 101, 101),
                normal(1, 102, 102)
            ]
        );

        a.purge(log_id(1, 550)).await.unwrap();
        b.purge(log_id(1, 590)).await.unwrap();
        ns.flush().await.unwrap();
        let drained = wal_files(dir.path()).len();
        assert!(drained < rolled / 2, "{drained} of {rolled} segments left");
        drop((a, b));
        ns.close(Duration::from_secs(5)).await.unwrap();

        let ns = open_small(dir.path());
        let (mut a, _) = stores(&ns, 1);
        let (mut b, _) = stores(&ns, 2);
        assert_eq!(entries(&mut a).await, (551..=600).collect::<Vec<_>>());
        assert_eq!(entries(&mut b).await, (1591..=1600).collect::<Vec<_>>());
        let st = a.get_log_state().await.unwrap();
        assert_eq!(
            (st.last_purged_log_id, st.last_log_id),
            (Some(log_id(1, 550)), Some(log_id(1, 600)))
        );
        // appends continue after the replayed tail
        append_one(&mut b, 601, 1601).await;
        assert_eq!(b.try_get_log_entries(600..).await.unwrap().len(), 2);
    })
    .await
}

#[tokio::test]
async fn torn_tail_is_cut_at_the_last_whole_record() {
    bounded(async {
        let dir = TempDir::new().unwrap();
        let ns = NodeStore::open(dir.path(), common::CACHE).unwrap();
        let (mut log, _) = stores(&ns, 9);
        for i in 1..=10 {
            append_one(&mut log, i, i).await;
        }
        drop(log);
        ns.close(Duration::from_secs(5)).await.unwrap();

        // A reopen cuts the last segment's preallocated rest: its length is its records' then.
        let ns = NodeStore::open(dir.path(), common::CACHE).unwrap();
        ns.close(Duration::from_secs(5)).await.unwrap();
        // Zeros after the last record (a file extended but never written): nothing lost.
        let files = wal_files(dir.path());
        let with_entries = files
            .iter()
            .find(|p| std::fs::metadata(p).unwrap().len() > 200)
            .expect("the segment holding the entries")
            .clone();
        let len = std::fs::metadata(&with_entries).unwrap().len();
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&with_entries)
            .unwrap();
        f.set_len(len + 64).unwrap();
        drop(f);
        let ns = NodeStore::open(dir.path(), common::CACHE).unwrap();
        let (mut log, _) = stores(&ns, 9);
        assert_eq!(entries(&mut log).await, (1..=10).collect::<Vec<_>>());
        drop(log);
        ns.close(Duration::from_secs(5)).await.unwrap();

        // The last entry's record loses its last 3 bytes: the log ends at entry 9, and the
        // segments written after it (the checkpoint segment of the reopen) are dropped.
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&with_entries)
            .unwrap();
        f.set_len(len - 3).unwrap();
        drop(f);
        let ns = NodeStore::open(dir.path(), common::CACHE).unwrap();
        let (mut log, _) = stores(&ns, 9);
        assert_eq!(entries(&mut log).await, (1..=9).collect::<Vec<_>>());
        append_one(&mut log, 10, 100).await;
        drop(log);
        ns.close(Duration::from_secs(5)).await.unwrap();
        let ns = NodeStore::open(dir.path(), common::CACHE).unwrap();
        let (mut log, _) = stores(&ns, 9);
        assert_eq!(
            entries(&mut log).await,
            [(1..=9).collect(), vec![100]].concat()
        );
    })
    .await
}

#[tokio::test]
async fn drops_truncates_and_purges_stay_done_after_their_segments_are_deleted() {
    bounded(async {
        let dir = TempDir::new().unwrap();
        let ns = open_small(dir.path());
        let (mut gone, _) = stores(&ns, 1);
        let (mut pinned, _) = stores(&ns, 2);
        let (mut busy, _) = stores(&ns, 3);
        for i in 1..=20 {
            append_one(&mut gone, i, i).await;
        }
        for i in 1..=5 {
            append_one(&mut pinned, i, 100 + i).await;
        }
        pinned.save_vote(&Vote::new(4, 1)).await.unwrap();
        // The first segment stays (pinned's entries 1..=2 live in it), the records below
        // land in later segments that drain and get deleted.
        ns.drop_group(1).unwrap();
        pinned.truncate(log_id(1, 3)).await.unwrap();
        for i in 1..=400 {
            append_one(&mut busy, i, i).await;
            if i > 5 {
                busy.purge(log_id(1, i - 5)).await.unwrap();
            }
        }
        ns.flush().await.unwrap();
        let left = wal_files(dir.path()).len();
        assert!(left <= 4, "{left} segments left");
        drop((gone, pinned, busy));
        ns.close(Duration::from_secs(5)).await.unwrap();

        let ns = open_small(dir.path());
        assert_eq!(ns.groups().unwrap(), vec![2, 3]);
        let (mut gone, _) = stores(&ns, 1);
        let (mut pinned, _) = stores(&ns, 2);
        let (mut busy, _) = stores(&ns, 3);
        assert!(entries(&mut gone).await.is_empty());
        assert_eq!(gone.read_vote().await.unwrap(), None);
        assert_eq!(entries(&mut pinned).await, vec![101, 102]);
        assert_eq!(pinned.read_vote().await.unwrap(), Some(Vote::new(4, 1)));
        assert_eq!(entries(&mut busy).await, (396..=400).collect::<Vec<_>>());
    })
    .await
}

#[tokio::test]
async fn an_idle_group_does_not_pin_old_segments() {
    bounded(async {
        let dir = TempDir::new().unwrap();
        let ns = open_small(dir.path());
        let (mut idle, _) = stores(&ns, 1);
        let (mut busy, _) = stores(&ns, 2);
        // The idle group appends now and then (never enough to snapshot and purge), so
        // without compaction each of its entries would keep a segment of drained entries.
        let mut most = 0;
        let mut idle_next = 1;
        for i in 1..=3000 {
            append_one(&mut busy, i, i).await;
            if i > 5 {
                busy.purge(log_id(1, i - 5)).await.unwrap();
            }
            if i % 100 == 0 {
                append_one(&mut idle, idle_next, 1000 + idle_next).await;
                idle_next += 1;
            }
            most = most.max(wal_files(dir.path()).len());
        }
        assert!(most <= 8, "up to {most} segments");
        let want: Vec<u64> = (1..idle_next).map(|i| 1000 + i).collect();
        assert_eq!(entries(&mut idle).await, want);
        drop((idle, busy));
        ns.close(Duration::from_secs(5)).await.unwrap();

        let ns = open_small(dir.path());
        let (mut idle, _) = stores(&ns, 1);
        let (mut busy, _) = stores(&ns, 2);
        assert_eq!(entries(&mut idle).await, want);
        assert_eq!(entries(&mut busy).await, (2996..=3000).collect::<Vec<_>>());
    })
    .await
}

/// A node restarted before it fills a segment (the fault suite kills one every few minutes)
/// starts a new segment at each open; with an idle group's entries in the first one, no
/// segment was ever deleted and the log grew by a segment per restart until the disk was
/// full. Opening compacts too: the segment count stays bounded, and nothing is lost.
#[tokio::test]
async fn restarts_that_never_fill_a_segment_do_not_pile_up_segments() {
    bounded(async {
        let dir = TempDir::new().unwrap();
        let mut busy_next = 1;
        let mut most = 0;
        for restart in 0..20u64 {
            let ns = open_small(dir.path());
            let (mut idle, _) = stores(&ns, 1);
            let (mut busy, _) = stores(&ns, 2);
            if restart == 0 {
                append_one(&mut idle, 1, 1001).await;
                append_one(&mut idle, 2, 1002).await;
            }
            // Far less than a 4 KiB segment per life.
            for _ in 0..5 {
                append_one(&mut busy, busy_next, busy_next).await;
                if busy_next > 3 {
                    busy.purge(log_id(1, busy_next - 3)).await.unwrap();
                }
                busy_next += 1;
            }
            most = most.max(wal_files(dir.path()).len());
            assert_eq!(entries(&mut idle).await, vec![1001, 1002]);
            drop((idle, busy));
            ns.close(Duration::from_secs(5)).await.unwrap();
        }
        assert!(most <= 6, "up to {most} segments after 20 restarts");
        let ns = open_small(dir.path());
        let (mut idle, _) = stores(&ns, 1);
        let (mut busy, _) = stores(&ns, 2);
        assert_eq!(entries(&mut idle).await, vec![1001, 1002]);
        let last = busy_next - 1;
        assert_eq!(
            entries(&mut busy).await,
            (last - 2..=last).collect::<Vec<_>>()
        );
    })
    .await
}

/// An entry larger than the WAL accepts is refused with an error, not a panic (a 32-bit record
/// length used to `expect`), and nothing of it is written: the log goes on after it.
#[tokio::test]
async fn an_entry_over_the_size_limit_is_refused_and_nothing_is_written() {
    bounded(async {
        let dir = TempDir::new().unwrap();
        let small = raft_log::codec::encode(&normal(1, 1, 7)).unwrap().len();
        let big = common::membership(1, 1, &[1, 2, 3, 4, 5]);
        assert!(raft_log::codec::encode(&big).unwrap().len() > small);
        let ns = NodeStore::open_with(
            dir.path(),
            StoreOptions {
                max_entry_bytes: small,
                ..StoreOptions::default()
            },
        )
        .unwrap();
        let (mut log, _) = stores(&ns, 3);
        let err = log.append_durable([big]).await.unwrap_err();
        assert!(
            matches!(err, raft_log::StoreError::TooLarge(_)),
            "unexpected error {err}"
        );
        assert!(log.is_empty());
        log.append_durable([normal(1, 1, 7)]).await.unwrap();
        assert_eq!(log.len(), 1);
        let state = log.get_log_state().await.unwrap();
        assert_eq!(state.last_log_id, Some(log_id(1, 1)));
    })
    .await
}
