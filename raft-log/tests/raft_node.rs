//! A real single-voter `openraft::Raft` over `LogStore` + `GroupStateMachine`: writes, restart
//! from the same directory (snapshot restore + log replay), and log purging under a snapshot
//! policy.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{bounded, config, items, open, start_node, stop, wait_leader, Node};
use tempfile::TempDir;

const G: u64 = 11;

async fn write(node: &Node, cmds: impl IntoIterator<Item = u64>) {
    for c in cmds {
        node.raft.client_write(c).await.expect("client_write");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_replays_committed_log_into_machine() {
    bounded(async {
        let dir = TempDir::new().unwrap();
        // No snapshot during this test: state after restart comes from the log alone.
        let cfg = config(G, 10_000, 1000);

        let ns = open(dir.path());
        let node = start_node(&ns, G, cfg.clone()).await;
        node.raft.initialize(BTreeSet::from([1u64])).await.unwrap();
        wait_leader(&node).await;
        write(&node, 1..=100).await;
        let reply = node.raft.client_write(101).await.unwrap();
        assert_eq!(reply.data, 101, "reply is the machine's new length");
        let before = items(&node);
        assert_eq!(before, (1..=101).collect::<Vec<_>>());
        stop(node, ns).await;

        let ns = open(dir.path());
        let node = start_node(&ns, G, cfg).await;
        // Raft::new re-applied (last_applied, committed] before returning.
        assert_eq!(items(&node), before);
        wait_leader(&node).await;
        write(&node, [102]).await;
        assert_eq!(items(&node).len(), 102);
        stop(node, ns).await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_purge_the_log_and_restart_restores_from_snapshot() {
    bounded(async {
        let dir = TempDir::new().unwrap();
        let cfg = config(G, 50, 5);
        const N: u64 = 400;

        let ns = open(dir.path());
        let node = start_node(&ns, G, cfg.clone()).await;
        node.raft.initialize(BTreeSet::from([1u64])).await.unwrap();
        wait_leader(&node).await;
        write(&node, 1..=N).await;
        let before = items(&node);
        assert_eq!(before.len() as u64, N);

        // index 0 = membership, 1 = leader blank, 2..=N+1 = commands
        let last = N + 1;
        let m = node
            .raft
            .wait(Some(Duration::from_secs(10)))
            .metrics(
                |m| {
                    m.snapshot.map_or(0, |s| s.index) + 50 > last
                        && m.purged.map_or(0, |p| p.index) + 60 > last
                },
                "snapshot + purge caught up",
            )
            .await
            .expect("snapshot and purge");
        let kept = node.log.len();
        eprintln!(
            "snapshot={:?} purged={:?} entries kept={kept} of {}",
            m.snapshot,
            m.purged,
            last + 1
        );
        assert!(
            kept < 60,
            "log must not grow without bound: {kept} entries kept"
        );
        stop(node, ns).await;

        let ns = open(dir.path());
        let (_log, sm) = common::stores(&ns, G);
        let restored = sm
            .last_applied()
            .unwrap()
            .expect("restored from snapshot")
            .index;
        assert!(
            restored + 50 > last,
            "machine restored from the snapshot at {restored}"
        );
        drop((_log, sm));
        let node = start_node(&ns, G, cfg).await;
        assert_eq!(
            items(&node),
            before,
            "snapshot + replayed tail = state before restart"
        );
        wait_leader(&node).await;
        write(&node, [N + 1]).await;
        assert_eq!(items(&node).len() as u64, N + 1);
        stop(node, ns).await;
    })
    .await
}
