//! Forming a cluster with `--join` (issue 8, formation): node 1 starts alone,
//! node 2 joins through node 1 and node 3 through node 2 (a member that is
//! not the meta leader forwards the request). The joined nodes get queue
//! replicas, keep the queues through the founder's kill -9, rejoin by
//! themselves after a restart, and a node id that is already taken is refused.

use cluster_tests::{
    cluster::{declare_durable, distinct_free_ports, Cluster, Placement},
    confirm_channel, connect, consume_n, open_consumer, publish_confirmed, quorum_args,
    quorumq_bin,
};
use lapin::{options::BasicAckOptions, BasicProperties};
use std::{process::Stdio, time::Duration};

const WAIT: Duration = Duration::from_secs(30);

/// Declares quorum queue `q` through `uri` and publishes `n` confirmed messages `prefix-i`.
async fn publish_n(uri: &str, q: &str, prefix: &str, n: u32) -> anyhow::Result<Vec<String>> {
    let conn = connect(uri).await?;
    let ch = confirm_channel(&conn).await?;
    declare_durable(&ch, q, quorum_args(&[])).await?;
    let mut sent = Vec::new();
    for i in 0..n {
        let body = format!("{prefix}-{i}");
        publish_confirmed(
            &ch,
            "",
            q,
            body.as_bytes(),
            BasicProperties::default().with_delivery_mode(2),
        )
        .await?;
        sent.push(body);
    }
    Ok(sent)
}

/// Consumes exactly `want` from `q` through `uri` (acked), in any order.
async fn drain(uri: &str, q: &str, want: &[String]) -> anyhow::Result<()> {
    let conn = connect(uri).await?;
    let (_ch, mut consumer) = open_consumer(&conn, q, 1000).await?;
    let got = consume_n(&mut consumer, want.len(), Duration::from_secs(60)).await?;
    let mut bodies = Vec::new();
    for d in &got {
        bodies.push(String::from_utf8_lossy(&d.data).into_owned());
        d.ack(BasicAckOptions::default()).await?;
    }
    bodies.sort();
    let mut want = want.to_vec();
    want.sort();
    assert_eq!(
        bodies, want,
        "every confirmed message of {q} is delivered once"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_join_a_running_node_and_serve_its_queues() -> anyhow::Result<()> {
    cluster_tests::bounded(Duration::from_secs(240), async {
        let ports = distinct_free_ports(8)?;
        let mut places: Vec<Placement> = ports[..6]
            .chunks(2)
            .map(|p| Placement::loopback(p[0], p[1]))
            .collect();
        places[1].join = Some(1);
        places[2].join = Some(2);
        let root = tempfile::Builder::new().prefix("quorumq-join-").tempdir()?;
        let cluster = Cluster::start_placed(root, places).await?;

        // A queue declared through a joined node gets a replica on every node.
        let q = "join.q1";
        let sent = publish_n(&cluster.uri(3), q, "a", 100).await?;
        let view = cluster.queue_view(3, q).await?;
        let mut members = view.members.clone();
        members.sort();
        assert_eq!(
            members,
            vec![1, 2, 3],
            "placement sees the joined nodes: {view:?}"
        );

        // The founder dies: the joined nodes keep the queue (2 of 3).
        cluster.kill9(1);
        cluster.wait_queue_leader(2, q, WAIT).await?;
        drain(&cluster.uri(2), q, &sent).await?;

        // Restarted joined nodes find their peers from their own data.
        cluster.restart(1).await?;
        cluster.restart(3).await?;
        let q2 = "join.q2";
        let sent2 = publish_n(&cluster.uri(3), q2, "b", 50).await?;
        drain(&cluster.uri(1), q2, &sent2).await?;

        // A node id that is taken is refused for good: the process exits with the reason.
        let dir = tempfile::tempdir()?;
        let log_path = dir.path().join("dup.log");
        let log = std::fs::File::create(&log_path)?;
        let mut dup = std::process::Command::new(quorumq_bin())
            .args(["--node-id", "2", "--data-dir"])
            .arg(dir.path().join("data"))
            .args(["--amqp-listen", &format!("127.0.0.1:{}", ports[6])])
            .args(["--cluster-listen", &format!("127.0.0.1:{}", ports[7])])
            .args(["--join", &cluster.cluster_addr(1)])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(status) = dup.try_wait()? {
                break status;
            }
            if std::time::Instant::now() > deadline {
                let _ = dup.kill();
                let _ = dup.wait();
                panic!(
                    "a node reusing id 2 was still running after 60 s: {}",
                    std::fs::read_to_string(&log_path)?
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let text = std::fs::read_to_string(&log_path)?;
        assert!(
            !status.success(),
            "a node reusing id 2 must not start: {text}"
        );
        assert!(
            text.contains("already a member"),
            "the refusal says why: {text}"
        );
        anyhow::Ok(())
    })
    .await
}
