//! Queue membership changes under load (issue: cluster operations, item 1):
//! `add_member`, `delete_member`, `grow` and `shrink` through quorumqctl on
//! a 3-node cluster while a publisher sends confirmed messages and a
//! consumer acknowledges them. Every confirmed message is consumed (none
//! lost), each change shows in `list_queues`, removing the leader hands the
//! queue to another member, and the last member cannot be removed.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cluster_tests::cluster::{declare_durable, retry, wait_for, wait_until_some, Cluster};
use cluster_tests::{confirm_channel, connect, open_consumer, publish_confirmed, quorum_args};
use futures::StreamExt;
use lapin::options::BasicAckOptions;
use lapin::types::AMQPValue;
use lapin::BasicProperties;

/// Members of `q` as node `via` lists them, sorted.
async fn members(cluster: &Cluster, via: u64, q: &str) -> anyhow::Result<Vec<u64>> {
    let mut m = cluster.queue_view(via, q).await?.members;
    m.sort_unstable();
    Ok(m)
}

/// Waits until node `via` lists `want` as the members of `q` and one of
/// them as its leader.
async fn expect_members(cluster: &Cluster, via: u64, q: &str, want: &[u64]) -> anyhow::Result<()> {
    wait_until_some(
        Duration::from_secs(30),
        &format!("{q} members {want:?} with a leader among them"),
        || async {
            let v = cluster.queue_view(via, q).await?;
            let mut m = v.members.clone();
            m.sort_unstable();
            Ok((m == want && v.leader.is_some_and(|l| want.contains(&l))).then_some(()))
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn membership_changes_under_load_lose_nothing() -> anyhow::Result<()> {
    cluster_tests::bounded(Duration::from_secs(300), async {
        let cluster = Cluster::start(3).await?;
        let q = "members.q";
        let c1 = connect(&cluster.uri(1)).await?;
        let ch1 = confirm_channel(&c1).await?;
        declare_durable(
            &ch1,
            q,
            quorum_args(&[("x-quorum-initial-group-size", AMQPValue::LongInt(2))]),
        )
        .await?;
        expect_members(&cluster, 1, q, &[1, 2]).await?;

        // Load: confirmed publishes on node 1, a consumer on node 2 acking.
        let stop = Arc::new(AtomicBool::new(false));
        let published = Arc::new(AtomicU32::new(0));
        let publisher = {
            let stop = stop.clone();
            let published = published.clone();
            tokio::spawn(async move {
                let mut confirmed = BTreeSet::new();
                let mut i = 0u32;
                while !stop.load(Ordering::Relaxed) {
                    publish_confirmed(
                        &ch1,
                        "",
                        q,
                        format!("m{i}").as_bytes(),
                        BasicProperties::default(),
                    )
                    .await?;
                    confirmed.insert(format!("m{i}"));
                    i += 1;
                    published.store(i, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                anyhow::Ok(confirmed)
            })
        };
        let c2 = connect(&cluster.uri(2)).await?;
        let (_ch2, mut consumer) = open_consumer(&c2, q, 50).await?;
        let received = Arc::new(std::sync::Mutex::new(BTreeSet::new()));
        let consuming = {
            let received = received.clone();
            tokio::spawn(async move {
                while let Some(d) = consumer.next().await {
                    let d = d?;
                    d.ack(BasicAckOptions::default()).await?;
                    if let Ok(mut r) = received.lock() {
                        r.insert(String::from_utf8_lossy(&d.data).into_owned());
                    }
                }
                anyhow::Ok(())
            })
        };
        tokio::time::sleep(Duration::from_millis(500)).await;

        // add_member through a node that does not lead (forwarded to the leader).
        let out = cluster.ctl(2, &["add_member", "/", q, "3"]).await?;
        eprintln!("$ quorumqctl add_member / {q} 3\n{out}");
        assert!(out.contains("ok"), "{out}");
        expect_members(&cluster, 3, q, &[1, 2, 3]).await?;

        // delete_member of the consumer's node: the consumer keeps consuming.
        let out = cluster.ctl(3, &["delete_member", q, "2"]).await?;
        eprintln!("$ quorumqctl delete_member {q} 2\n{out}");
        expect_members(&cluster, 1, q, &[1, 3]).await?;

        // delete_member of the leader: another member takes over.
        let leader = cluster
            .wait_queue_leader(1, q, Duration::from_secs(30))
            .await?;
        cluster
            .ctl(1, &["delete_member", q, &leader.to_string()])
            .await?;
        let rest: Vec<u64> = [1, 3].into_iter().filter(|m| *m != leader).collect();
        expect_members(&cluster, 2, q, &rest).await?;

        // The last member cannot go.
        let err = cluster
            .ctl(1, &["delete_member", q, &rest[0].to_string()])
            .await
            .expect_err("removing the last member is refused");
        eprintln!("$ quorumqctl delete_member {q} {}\n{err:#}", rest[0]);
        assert!(format!("{err:#}").contains("last member"), "{err:#}");

        // grow every queue onto the missing nodes (`all`, then `even`: one
        // member is odd, two are even), then shrink one node away.
        let missing: Vec<u64> = (1..=3).filter(|n| !rest.contains(n)).collect();
        let out = cluster
            .ctl(1, &["grow", &missing[0].to_string(), "all"])
            .await?;
        eprintln!("$ quorumqctl grow {} all\n{out}", missing[0]);
        assert!(out.contains(q) && out.contains("\t2\tok"), "{out}");
        let out = cluster
            .ctl(
                1,
                &[
                    "grow",
                    &missing[1].to_string(),
                    "even",
                    "--queue-pattern",
                    "^members",
                ],
            )
            .await?;
        eprintln!(
            "$ quorumqctl grow {} even --queue-pattern ^members\n{out}",
            missing[1]
        );
        assert!(out.contains("\t3\tok"), "{out}");
        expect_members(&cluster, 1, q, &[1, 2, 3]).await?;
        let out = cluster.ctl(2, &["shrink", "3"]).await?;
        eprintln!("$ quorumqctl shrink 3\n{out}");
        assert!(out.contains("\t2\tok"), "{out}");
        expect_members(&cluster, 2, q, &[1, 2]).await?;
        assert_eq!(
            members(&cluster, 3, q).await?,
            vec![1, 2],
            "node 3 lists it too"
        );

        // The publisher keeps going after the changes (confirms still come,
        // however slow the machine), then every confirmed message reaches
        // the consumer.
        let after_changes = published.load(Ordering::Relaxed);
        assert!(after_changes > 0, "nothing confirmed during the changes");
        wait_for(
            Duration::from_secs(60),
            "50 more confirms after the membership changes",
            || async { published.load(Ordering::Relaxed) >= after_changes + 50 },
        )
        .await?;
        stop.store(true, Ordering::Relaxed);
        let confirmed = publisher.await??;
        eprintln!(
            "{} messages published and confirmed during the changes",
            confirmed.len()
        );
        wait_for(
            Duration::from_secs(60),
            "every confirmed message consumed",
            || async {
                received
                    .lock()
                    .map(|r| confirmed.is_subset(&r))
                    .unwrap_or(false)
            },
        )
        .await
        .map_err(|e| {
            let r = received.lock().map(|r| r.clone()).unwrap_or_default();
            let lost: Vec<_> = confirmed.difference(&r).take(10).collect();
            e.context(format!("lost e.g. {lost:?} of {}", confirmed.len()))
        })?;
        consuming.abort();
        Ok(())
    })
    .await
}

/// `rebalance quorum` spreads leaders: six queues declared on node 1 (all
/// led by it) end up led two per node, and the moved ones still take
/// confirmed publishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebalance_spreads_leaders_within_one_of_even() -> anyhow::Result<()> {
    cluster_tests::bounded(Duration::from_secs(180), async {
        let cluster = Cluster::start(3).await?;
        let c1 = connect(&cluster.uri(1)).await?;
        let ch1 = confirm_channel(&c1).await?;
        let names: Vec<String> = (0..6).map(|i| format!("rebalance.q{i}")).collect();
        for q in &names {
            declare_durable(&ch1, q, quorum_args(&[])).await?;
            assert_eq!(
                cluster
                    .wait_queue_leader(1, q, Duration::from_secs(30))
                    .await?,
                1
            );
        }
        let out = cluster.ctl(2, &["rebalance", "quorum"]).await?;
        eprintln!("$ quorumqctl rebalance quorum\n{out}");
        assert!(out.contains("number_of_quorum_leaders"), "{out}");
        let mut per_node = std::collections::BTreeMap::<u64, usize>::new();
        for q in &names {
            let l = cluster
                .wait_queue_leader(3, q, Duration::from_secs(30))
                .await?;
            *per_node.entry(l).or_default() += 1;
        }
        assert_eq!(
            per_node.values().copied().collect::<Vec<_>>(),
            vec![2, 2, 2],
            "{per_node:?}"
        );
        for q in &names {
            publish_confirmed(&ch1, "", q, b"after", BasicProperties::default()).await?;
            assert_eq!(cluster.queue_view(2, q).await?.messages_ready, 1);
        }
        Ok(())
    })
    .await
}

/// `forget_cluster_node` after a node is destroyed (kill -9): refused while
/// the node runs; afterwards the node is gone from the cluster and from the
/// queue's members, and the queue keeps its messages and serves them. Then
/// the destroyed node's replacement (wiped disk, new id 4) joins and is
/// grown into the queue, and holds a quorum with node 2 once node 1 dies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forget_cluster_node_removes_a_destroyed_node() -> anyhow::Result<()> {
    cluster_tests::bounded(Duration::from_secs(180), async {
        let cluster = Cluster::start(3).await?;
        let q = "forget.q";
        let c1 = connect(&cluster.uri(1)).await?;
        let ch1 = confirm_channel(&c1).await?;
        declare_durable(&ch1, q, quorum_args(&[])).await?;
        expect_members(&cluster, 1, q, &[1, 2, 3]).await?;
        for i in 0..10u32 {
            publish_confirmed(
                &ch1,
                "",
                q,
                format!("f{i}").as_bytes(),
                BasicProperties::default(),
            )
            .await?;
        }
        let err = cluster
            .ctl(1, &["forget_cluster_node", "3"])
            .await
            .expect_err("node 3 runs");
        assert!(format!("{err:#}").contains("running"), "{err:#}");

        cluster.kill9(3);
        let out = retry(
            Duration::from_secs(20),
            "forget node 3 once it is seen down",
            || async { cluster.ctl(2, &["forget_cluster_node", "3"]).await },
        )
        .await?;
        eprintln!("$ quorumqctl forget_cluster_node 3\n{out}");
        assert!(out.contains(q) && out.contains("\t2\tok"), "{out}");
        expect_members(&cluster, 1, q, &[1, 2]).await?;
        wait_until_some(
            Duration::from_secs(10),
            "node 1 lists nodes 1 and 2 only",
            || async {
                let status = cluster
                    .ctl(1, &["cluster_status", "--formatter", "json"])
                    .await?;
                let v: serde_json::Value = serde_json::from_str(&status)?;
                let ids: Vec<u64> = v["nodes"]
                    .as_array()
                    .map(|a| a.iter().filter_map(|n| n["id"].as_u64()).collect())
                    .unwrap_or_default();
                Ok((ids == [1, 2]).then_some(()))
            },
        )
        .await?;

        let c2 = connect(&cluster.uri(2)).await?;
        let (_ch2, mut consumer) = open_consumer(&c2, q, 20).await?;
        let got = cluster_tests::consume_n(&mut consumer, 10, Duration::from_secs(30)).await?;
        let bodies: BTreeSet<String> = got
            .iter()
            .map(|d| String::from_utf8_lossy(&d.data).into_owned())
            .collect();
        assert_eq!(bodies, (0..10).map(|i| format!("f{i}")).collect());
        publish_confirmed(&ch1, "", q, b"after", BasicProperties::default()).await?;

        // A node whose disk was wiped comes back under a new id (4): it joins
        // through node 1 and `grow` makes it a member of every queue.
        let _node4 = Joining::start(&cluster, 4, &[]).await?;
        let out = retry(Duration::from_secs(30), "grow node 4", || async {
            let out = cluster.ctl(2, &["grow", "4", "all"]).await?;
            anyhow::ensure!(out.contains("\t3\tok"), "{out}");
            Ok(out)
        })
        .await?;
        eprintln!("$ quorumqctl grow 4 all\n{out}");
        expect_members(&cluster, 2, q, &[1, 2, 4]).await?;
        // Node 4 is a working voter: without node 1, nodes 2 and 4 are the quorum.
        cluster.kill9(1);
        let c2b = connect(&cluster.uri(2)).await?;
        let ch2b = confirm_channel(&c2b).await?;
        retry(
            Duration::from_secs(30),
            "publish with nodes 2 and 4",
            || async {
                publish_confirmed(
                    &ch2b,
                    "",
                    q,
                    b"quorum of 2 and 4",
                    BasicProperties::default(),
                )
                .await
            },
        )
        .await?;
        Ok(())
    })
    .await
}

/// Flips a byte of the first WAL record holding `needle` under `wal_dir` (later synced
/// records follow it, so recovery must call it corruption, not a torn tail).
fn damage_wal_record(wal_dir: &std::path::Path, needle: &[u8]) -> anyhow::Result<()> {
    let mut segments: Vec<_> = std::fs::read_dir(wal_dir)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    segments.sort();
    for seg in segments {
        let mut bytes = std::fs::read(&seg)?;
        if let Some(at) = bytes.windows(needle.len()).position(|w| w == needle) {
            bytes[at + needle.len() + 4] ^= 0x01;
            std::fs::write(&seg, &bytes)?;
            return Ok(());
        }
    }
    anyhow::bail!("no WAL record under {} holds {needle:?}", wal_dir.display())
}

/// Issue 11: a member whose write-ahead log is damaged mid-log refuses to start and says how
/// to rebuild it from the other replicas; a node started with a new id, `--join` and
/// `--replaces 3` forgets it and takes its place in every queue, and then forms the quorum
/// with node 2 once node 1 dies: every message is still there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_member_refuses_and_a_replacement_takes_its_place() -> anyhow::Result<()> {
    cluster_tests::bounded(Duration::from_secs(180), async {
        let cluster = Cluster::start(3).await?;
        let q = "replaced.q";
        let c1 = connect(&cluster.uri(1)).await?;
        let ch1 = confirm_channel(&c1).await?;
        declare_durable(&ch1, q, quorum_args(&[])).await?;
        expect_members(&cluster, 1, q, &[1, 2, 3]).await?;
        let body = |i: u32| {
            let mut b = format!("corrupt-member-{i:03}-").into_bytes();
            b.resize(256, b'.');
            b
        };
        for i in 0..30u32 {
            publish_confirmed(&ch1, "", q, &body(i), BasicProperties::default()).await?;
        }
        cluster.kill9(3);
        damage_wal_record(
            &cluster.root().join("data/node-3/raft/wal"),
            &body(10)[..19],
        )?;
        let refused = cluster
            .restart(3)
            .await
            .expect_err("a corrupt member must not start");
        let log = cluster.log_tail(3, 8000);
        assert!(
            log.contains("is corrupt")
                && log.contains("This node is a member of a cluster")
                && log.contains("--replaces 3"),
            "{refused:#}\n{log}"
        );

        // The operator's rebuild: node 3's machine starts over as node 4.
        let node4 = Joining::start(&cluster, 4, &["--replaces", "3"]).await?;
        expect_members(&cluster, 1, q, &[1, 2, 4])
            .await
            .map_err(|e| e.context(node4.log()))?;
        let status = cluster
            .ctl(1, &["cluster_status", "--formatter", "json"])
            .await?;
        let v: serde_json::Value = serde_json::from_str(&status)?;
        let ids: Vec<u64> = v["nodes"]
            .as_array()
            .map(|a| a.iter().filter_map(|n| n["id"].as_u64()).collect())
            .unwrap_or_default();
        assert_eq!(ids, [1, 2, 4], "{status}");

        // Node 4 holds its part: without node 1, nodes 2 and 4 serve every message.
        cluster.kill9(1);
        let c2 = connect(&cluster.uri(2)).await?;
        let (_ch2, mut consumer) = open_consumer(&c2, q, 50).await?;
        let got = cluster_tests::consume_n(&mut consumer, 30, Duration::from_secs(60)).await?;
        let bodies: BTreeSet<Vec<u8>> = got.iter().map(|d| d.data.clone()).collect();
        assert_eq!(bodies, (0..30).map(body).collect::<BTreeSet<_>>());
        Ok(())
    })
    .await
}

/// A fresh node started outside the `Cluster` with `--join` node 1 (its data in a temporary
/// directory); killed when dropped.
struct Joining {
    child: std::process::Child,
    dir: tempfile::TempDir,
}

impl Joining {
    /// Starts node `id` with `extra` flags and waits (≤ 60 s) for its `quorumq ready` line.
    async fn start(cluster: &Cluster, id: u64, extra: &[&str]) -> anyhow::Result<Joining> {
        let ports = cluster_tests::cluster::distinct_free_ports(2)?;
        let dir = tempfile::tempdir()?;
        let log = std::fs::File::create(dir.path().join("node.log"))?;
        let child = std::process::Command::new(cluster_tests::quorumq_bin())
            .args(["--node-id", &id.to_string(), "--data-dir"])
            .arg(dir.path().join("data"))
            .args(["--amqp-listen", &format!("127.0.0.1:{}", ports[0])])
            .args(["--cluster-listen", &format!("127.0.0.1:{}", ports[1])])
            .args(["--join", &cluster.cluster_addr(1)])
            .args(extra)
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        let node = Joining { child, dir };
        wait_for(
            Duration::from_secs(60),
            &format!("node {id} ready"),
            || async { node.log().contains("quorumq ready") },
        )
        .await
        .map_err(|e| e.context(node.log()))?;
        Ok(node)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("node.log")).unwrap_or_default()
    }
}

impl Drop for Joining {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
