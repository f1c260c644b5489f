//! Node-wide group commit: callbacks complete only after a flush that started after they were
//! submitted; many callbacks share one flush; flush errors reach every waiter; two Raft groups on
//! one `NodeStore` append concurrently.

mod common;

use std::collections::BTreeSet;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use common::{bounded, config, items, open, start_node, stop, wait_leader};
use raft_log::{Flusher, FlusherStats, StoreError};
use tempfile::TempDir;

const T: Duration = Duration::from_secs(10);

#[test]
fn callback_never_fires_before_its_flush_and_batches_share_one_flush() {
    let done = Arc::new(AtomicU64::new(0)); // completed flushes
    let (started_tx, started_rx) = mpsc::channel::<()>();
    let (gate_tx, gate_rx) = mpsc::channel::<()>();
    let d = done.clone();
    let flusher = Flusher::start("test-flusher", move || {
        started_tx.send(()).map_err(io::Error::other)?;
        gate_rx.recv_timeout(T).map_err(io::Error::other)?;
        d.fetch_add(1, Ordering::SeqCst);
        Ok(())
    })
    .unwrap();

    // Each callback reports how many flushes had completed when it fired.
    let (fired_tx, fired_rx) = mpsc::channel::<(u32, u64)>();
    let submit = |id: u32| {
        let (tx, done) = (fired_tx.clone(), done.clone());
        flusher
            .submit(Box::new(move |r| {
                r.expect("flush ok");
                tx.send((id, done.load(Ordering::SeqCst))).unwrap();
            }))
            .unwrap();
    };

    submit(0);
    started_rx.recv_timeout(T).expect("flush 1 started");
    for id in 1..10 {
        submit(id); // queued while flush 1 runs: must wait for flush 2
    }
    assert!(
        fired_rx.recv_timeout(Duration::from_millis(100)).is_err(),
        "fired before flush 1 finished"
    );

    gate_tx.send(()).unwrap(); // finish flush 1
    assert_eq!(fired_rx.recv_timeout(T).unwrap(), (0, 1));
    started_rx.recv_timeout(T).expect("flush 2 started");
    assert!(
        fired_rx.recv_timeout(Duration::from_millis(100)).is_err(),
        "fired before flush 2 finished"
    );

    gate_tx.send(()).unwrap(); // finish flush 2
    let mut rest: Vec<(u32, u64)> = (1..10).map(|_| fired_rx.recv_timeout(T).unwrap()).collect();
    rest.sort();
    assert_eq!(rest, (1..10).map(|id| (id, 2)).collect::<Vec<_>>());
    assert_eq!(
        flusher.stats(),
        FlusherStats {
            flushes: 2,
            callbacks: 10,
            errors: 0
        }
    );
}

#[tokio::test]
async fn flush_error_reaches_every_waiter() {
    bounded(async {
        let flusher =
            Flusher::start("test-flusher", || Err(io::Error::other("disk gone"))).unwrap();
        let (a, b) = tokio::join!(flusher.flush(), flusher.flush());
        for r in [a, b] {
            match r {
                Err(StoreError::Flush(e)) => assert!(e.to_string().contains("disk gone")),
                other => panic!("want flush error, got {other:?}"),
            }
        }
        assert!(flusher.stats().errors >= 1);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_groups_append_concurrently_on_one_node_store() {
    bounded(async {
        let dir = TempDir::new().unwrap();
        let ns = open(dir.path());
        let a = start_node(&ns, 1, config(1, 10_000, 1000)).await;
        let b = start_node(&ns, 2, config(2, 10_000, 1000)).await;
        for n in [&a, &b] {
            n.raft.initialize(BTreeSet::from([1u64])).await.unwrap();
            wait_leader(n).await;
        }
        let before = ns.flusher().stats();

        // 2 groups x 8 concurrent writers x 25 commands
        let mut tasks = tokio::task::JoinSet::new();
        for (g, node) in [(1u64, &a), (2u64, &b)] {
            for w in 0..8u64 {
                let raft = node.raft.clone();
                tasks.spawn(async move {
                    for i in 0..25u64 {
                        raft.client_write(g * 1_000_000 + w * 1000 + i)
                            .await
                            .expect("client_write");
                    }
                });
            }
        }
        while let Some(r) = tasks.join_next().await {
            r.unwrap();
        }

        for (g, node) in [(1u64, &a), (2u64, &b)] {
            let mut got = items(node);
            assert_eq!(got.len(), 200);
            assert!(
                got.iter().all(|c| c / 1_000_000 == g),
                "group {g} saw another group's command"
            );
            got.sort();
            got.dedup();
            assert_eq!(got.len(), 200);
        }
        let after = ns.flusher().stats();
        let (flushes, callbacks) = (
            after.flushes - before.flushes,
            after.callbacks - before.callbacks,
        );
        eprintln!("400 writes: {callbacks} flush waiters served by {flushes} flushes");
        assert!(callbacks >= 400);

        a.raft.shutdown().await.unwrap();
        drop(a);
        stop(b, ns).await;
    })
    .await
}

/// A paced flusher delays a flush only while writers outrun it: a lone writer that waits for
/// each flush is served at once even with an hour-long interval.
#[test]
fn pacing_never_delays_a_lone_writer() {
    let flusher =
        Flusher::start_paced("test-flusher", Duration::from_secs(3600), || Ok(())).unwrap();
    for _ in 0..5 {
        let (tx, rx) = mpsc::channel();
        flusher
            .submit(Box::new(move |r| tx.send(r.is_ok()).unwrap()))
            .unwrap();
        assert_eq!(rx.recv_timeout(T), Ok(true), "lone writer was paced");
    }
    assert_eq!(flusher.stats().flushes, 5);
}

/// A flusher gated by the test: each flush signals `started`, then waits for a `gate` message.
fn gated_flusher(interval: Duration) -> (Flusher, mpsc::Receiver<()>, mpsc::Sender<()>) {
    let (started_tx, started_rx) = mpsc::channel::<()>();
    let (gate_tx, gate_rx) = mpsc::channel::<()>();
    let flusher = Flusher::start_paced("test-flusher", interval, move || {
        started_tx.send(()).map_err(io::Error::other)?;
        gate_rx.recv_timeout(T).map_err(io::Error::other)?;
        Ok(())
    })
    .unwrap();
    (flusher, started_rx, gate_tx)
}

/// Submits a callback that sends `id` on `fired` once its flush succeeded.
fn submit_id(flusher: &Flusher, fired: &mpsc::Sender<u32>, id: u32) {
    let tx = fired.clone();
    flusher
        .submit(Box::new(move |r| {
            r.expect("flush ok");
            tx.send(id).unwrap();
        }))
        .unwrap();
}

/// After a flush that served a backlog (`BUSY_BATCH` callbacks), the next flush waits for
/// the pacing interval and the callbacks arriving meanwhile share it.
#[test]
fn pacing_delays_the_flush_after_a_backlog() {
    const INTERVAL: Duration = Duration::from_millis(300);
    let (flusher, started, gate) = gated_flusher(INTERVAL);
    let (fired_tx, fired) = mpsc::channel::<u32>();
    submit_id(&flusher, &fired_tx, 0);
    started.recv_timeout(T).expect("first flush started");
    let backlog = raft_log::BUSY_BATCH as u32;
    for id in 1..=backlog {
        submit_id(&flusher, &fired_tx, id); // queue up while flush 1 runs
    }
    for _ in 0..3 {
        gate.send(()).unwrap();
    }
    for id in 0..=backlog {
        assert_eq!(fired.recv_timeout(T), Ok(id));
    }
    submit_id(&flusher, &fired_tx, 100);
    assert!(
        fired.recv_timeout(INTERVAL / 3).is_err(),
        "the flush after a backlog started before the interval"
    );
    assert_eq!(fired.recv_timeout(T), Ok(100));
    assert_eq!(flusher.stats().flushes, 3);
}

/// Two writers meeting by chance (one arrives while the other's flush runs) are not a
/// backlog: the flush after theirs is not delayed. Pacing them kept a moderate load paced
/// for good, since a paced round collects a pair by itself (a ~3 ms latency floor).
#[test]
fn pacing_ignores_a_pair_that_met_by_chance() {
    let (flusher, started, gate) = gated_flusher(Duration::from_secs(3600));
    let (fired_tx, fired) = mpsc::channel::<u32>();
    submit_id(&flusher, &fired_tx, 1);
    started.recv_timeout(T).expect("first flush started");
    submit_id(&flusher, &fired_tx, 2); // arrives while flush 1 runs
    for _ in 0..3 {
        gate.send(()).unwrap();
    }
    assert_eq!(fired.recv_timeout(T), Ok(1));
    assert_eq!(fired.recv_timeout(T), Ok(2));
    submit_id(&flusher, &fired_tx, 3);
    assert_eq!(fired.recv_timeout(T), Ok(3), "a pair made the flusher pace");
}

/// A writer's busy hint (a proposer folding a backlog into one entry) paces the next flush.
#[test]
fn a_busy_hint_paces_the_next_flush() {
    const INTERVAL: Duration = Duration::from_millis(300);
    let (flusher, started, gate) = gated_flusher(INTERVAL);
    let (fired_tx, fired) = mpsc::channel::<u32>();
    submit_id(&flusher, &fired_tx, 1);
    started.recv_timeout(T).expect("first flush started");
    gate.send(()).unwrap();
    assert_eq!(fired.recv_timeout(T), Ok(1));
    flusher.busy_hint().note();
    submit_id(&flusher, &fired_tx, 2);
    gate.send(()).unwrap();
    assert!(
        fired.recv_timeout(INTERVAL / 3).is_err(),
        "a hinted flush started before the interval"
    );
    assert_eq!(fired.recv_timeout(T), Ok(2));
}
