//! What a client declares through one node is there at once on every node,
//! as RabbitMQ's declare-ok promises (its metadata store commits on all
//! nodes): a publish through another node right after the declare-ok routes
//! to the new queue (not confirmed as unroutable and dropped), a passive
//! declare there finds it, and a node restarted after the declare serves it
//! from its first connection; a delete through another node deletes; a
//! binding made or removed through one node routes at once through the
//! others; and an exclusive queue belongs to its connection on every node.
//! Found by `disk_full`'s run after a restart.

use cluster_tests::{
    cluster::{retry, Cluster},
    confirm_channel, connect, consume_n, durable, open_consumer, publish_confirmed, quorum_args,
};
use lapin::{
    options::{BasicAckOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions},
    types::FieldTable,
    BasicProperties, ExchangeKind,
};
use std::time::Duration;

/// The status code of `GET path` on the HTTP API at `addr` (as guest), over
/// a fresh connection: quick enough to race a meta commit's announcement.
async fn http_status(addr: &str, path: &str) -> anyhow::Result<u16> {
    http_request(addr, "GET", path, "").await
}

/// The status code of `method path` with JSON `body` on the HTTP API at
/// `addr` (as guest), over a fresh connection.
async fn http_request(addr: &str, method: &str, path: &str, body: &str) -> anyhow::Result<u16> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Basic Z3Vlc3Q6Z3Vlc3Q=\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await?;
    let mut head = [0u8; 12];
    s.read_exact(&mut head).await?;
    let line = String::from_utf8_lossy(&head);
    Ok(line
        .split_whitespace()
        .nth(1)
        .ok_or_else(|| anyhow::anyhow!("no status in {line:?}"))?
        .parse()?)
}

fn passive() -> QueueDeclareOptions {
    QueueDeclareOptions {
        passive: true,
        ..QueueDeclareOptions::default()
    }
}

/// Declares `what` of the paused-node checks through `ch`: the queue
/// `vis.lagging` (or `vis.lagging.get`, `vis.lagging.purge`), the exchange
/// `vis.lagging.x`, or the binding of the one to the other with routing key
/// `k`.
async fn declare_lagging(ch: &lapin::Channel, what: &str) -> anyhow::Result<()> {
    match what {
        "a queue" => {
            ch.queue_declare("vis.lagging".into(), durable(), quorum_args(&[]))
                .await?;
        }
        "a queue to read" | "a queue to purge" => {
            let q = if what.ends_with("read") {
                "vis.lagging.get"
            } else {
                "vis.lagging.purge"
            };
            ch.queue_declare(q.into(), durable(), quorum_args(&[]))
                .await?;
        }
        "an exchange" => {
            ch.exchange_declare(
                "vis.lagging.x".into(),
                ExchangeKind::Direct,
                ExchangeDeclareOptions::default(),
                FieldTable::default(),
            )
            .await?
        }
        _ => {
            ch.queue_bind(
                "vis.lagging".into(),
                "vis.lagging.x".into(),
                "k".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?
        }
    }
    Ok(())
}

/// Declares queues (and an exchange bound to each) through node 1 and uses
/// each at once through nodes 2 and 3 (and node 2's HTTP API), then checks
/// every confirmed publish is in its queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_declared_through_one_node_is_there_at_once_on_the_others() -> anyhow::Result<()> {
    let cluster = Cluster::start(3).await?;
    let http2 = format!("127.0.0.1:{}", cluster_tests::free_port()?);
    cluster.restart_with(2, &["--http-listen", &http2]).await?;
    let r = cluster_tests::bounded(Duration::from_secs(180), async {
        let c1 = cluster.ready_connection(1, "vis.warmup").await?;
        let c2 = connect(&cluster.uri(2)).await?;
        let c3 = connect(&cluster.uri(3)).await?;
        let ch1 = c1.create_channel().await?;
        let ch2 = confirm_channel(&c2).await?;
        let ch3 = confirm_channel(&c3).await?;
        const QUEUES: usize = 60;
        for i in 0..QUEUES {
            let q = format!("vis.q{i}");
            let x = format!("vis.x{i}");
            ch1.queue_declare(q.as_str().into(), durable(), quorum_args(&[]))
                .await?;
            let status = http_status(&http2, &format!("/api/queues/%2F/{q}")).await?;
            assert_eq!(
                status, 200,
                "node 2's HTTP API shows {q} right after its declare-ok"
            );
            // Through node 2 on the default exchange, the moment declare-ok is in.
            publish_confirmed(&ch2, "", &q, b"direct", BasicProperties::default())
                .await
                .map_err(|e| anyhow::anyhow!("publish to {q} through node 2: {e:#}"))?;
            ch3.queue_declare(q.as_str().into(), passive(), FieldTable::default())
                .await
                .map_err(|e| anyhow::anyhow!("passive declare of {q} through node 3: {e}"))?;
            ch1.exchange_declare(
                x.as_str().into(),
                ExchangeKind::Fanout,
                ExchangeDeclareOptions::default(),
                FieldTable::default(),
            )
            .await?;
            ch1.queue_bind(
                q.as_str().into(),
                x.as_str().into(),
                "".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;
            // Through node 3 on the new exchange and binding.
            publish_confirmed(&ch3, &x, "", b"bound", BasicProperties::default())
                .await
                .map_err(|e| anyhow::anyhow!("publish to {x} through node 3: {e:#}"))?;
        }
        // Node 2 paused while each object is declared: just resumed, its
        // replica lags (the leader's appends to it back off), so only a
        // catch-up finds the object there.
        const GET_ONE: &str = r#"{"count":1,"ackmode":"ack_requeue_true","encoding":"auto"}"#;
        for (what, method, path, body, expected) in [
            ("a queue", "GET", "/api/queues/%2F/vis.lagging", "", 200),
            (
                "an exchange",
                "GET",
                "/api/exchanges/%2F/vis.lagging.x",
                "",
                200,
            ),
            (
                "a binding",
                "GET",
                "/api/bindings/%2F/e/vis.lagging.x/q/vis.lagging/k",
                "",
                200,
            ),
            (
                "a queue to read",
                "POST",
                "/api/queues/%2F/vis.lagging.get/get",
                GET_ONE,
                200,
            ),
            (
                "a queue to purge",
                "DELETE",
                "/api/queues/%2F/vis.lagging.purge/contents",
                "",
                204,
            ),
        ] {
            cluster.sigstop(2)?;
            let declared = declare_lagging(&ch1, what).await;
            cluster.sigcont(2)?;
            declared?;
            let status = http_request(&http2, method, path, body).await?;
            assert_eq!(
                status, expected,
                "node 2's HTTP API finds {what} declared while it was paused ({method} {path})"
            );
        }
        for i in 0..QUEUES {
            let q = format!("vis.q{i}");
            let (_ch, mut consumer) = open_consumer(&c1, &q, 10).await?;
            let got = consume_n(&mut consumer, 2, Duration::from_secs(30))
                .await
                .map_err(|e| anyhow::anyhow!("{q}: {e:#}"))?;
            let mut bodies: Vec<String> = got
                .iter()
                .map(|d| String::from_utf8_lossy(&d.data).into_owned())
                .collect();
            for d in &got {
                d.ack(BasicAckOptions::default()).await?;
            }
            bodies.sort();
            assert_eq!(
                bodies,
                ["bound", "direct"],
                "both confirmed publishes are in {q}"
            );
        }
        anyhow::Ok(())
    })
    .await;
    cluster.logs_on_error(r, 8_000)
}

/// Node 3 is stopped while queues are declared; a client that connects to
/// it as soon as it is back finds them and publishes into them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_node_serves_the_queues_declared_while_it_was_away() -> anyhow::Result<()> {
    let cluster = Cluster::start(3).await?;
    let r = cluster_tests::bounded(Duration::from_secs(180), async {
        let c1 = cluster.ready_connection(1, "away.warmup").await?;
        let ch1 = c1.create_channel().await?;
        cluster.stop(3).await?;
        const QUEUES: usize = 40;
        for i in 0..QUEUES {
            retry(
                Duration::from_secs(30),
                "declare while node 3 is away",
                || {
                    let ch1 = &ch1;
                    async move {
                        ch1.queue_declare(
                            format!("away.q{i}").as_str().into(),
                            durable(),
                            quorum_args(&[]),
                        )
                        .await?;
                        anyhow::Ok(())
                    }
                },
            )
            .await?;
        }
        cluster.restart(3).await?;
        let c3 = connect(&cluster.uri(3)).await?;
        let ch3 = confirm_channel(&c3).await?;
        for i in 0..QUEUES {
            let q = format!("away.q{i}");
            publish_confirmed(&ch3, "", &q, b"after", BasicProperties::default())
                .await
                .map_err(|e| anyhow::anyhow!("publish to {q} through node 3: {e:#}"))?;
            ch3.queue_declare(q.as_str().into(), passive(), FieldTable::default())
                .await
                .map_err(|e| anyhow::anyhow!("passive declare of {q} through node 3: {e}"))?;
        }
        for i in 0..QUEUES {
            let q = format!("away.q{i}");
            let (_ch, mut consumer) = open_consumer(&c1, &q, 10).await?;
            let got = consume_n(&mut consumer, 1, Duration::from_secs(30))
                .await
                .map_err(|e| anyhow::anyhow!("{q}: {e:#}"))?;
            assert_eq!(
                &got[0].data[..],
                b"after",
                "the publish through node 3 is in {q}"
            );
            got[0].ack(BasicAckOptions::default()).await?;
        }
        anyhow::Ok(())
    })
    .await;
    cluster.logs_on_error(r, 8_000)
}

/// A queue declared through node 1 and deleted through node 2 right after
/// is gone (before, node 2 answered delete-ok for a queue it did not know
/// yet and deleted nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_declared_through_one_node_can_be_deleted_through_another() -> anyhow::Result<()> {
    let cluster = Cluster::start(3).await?;
    let r = cluster_tests::bounded(Duration::from_secs(180), async {
        let c1 = cluster.ready_connection(1, "del.warmup").await?;
        let c2 = connect(&cluster.uri(2)).await?;
        let ch1 = c1.create_channel().await?;
        let ch2 = c2.create_channel().await?;
        const QUEUES: usize = 40;
        for i in 0..QUEUES {
            let q = format!("del.q{i}");
            ch1.queue_declare(q.as_str().into(), durable(), quorum_args(&[]))
                .await?;
            ch2.queue_delete(q.as_str().into(), Default::default())
                .await?;
        }
        for i in 0..QUEUES {
            let q = format!("del.q{i}");
            let ch = c1.create_channel().await?;
            let r = ch
                .queue_declare(q.as_str().into(), passive(), FieldTable::default())
                .await;
            let (code, _) = cluster_tests::expect_amqp_error(r);
            assert_eq!(code, 404, "{q} deleted through node 2 is gone");
        }
        anyhow::Ok(())
    })
    .await;
    cluster.logs_on_error(r, 8_000)
}

/// Runs `change` (a binding change through another node) while node `node`
/// is paused, and resumes it 300 ms later, before its failure detector gives
/// up on it: the change's ok then waits for `node` to apply it.
async fn while_paused(
    cluster: &Cluster,
    node: u64,
    change: impl std::future::Future<Output = lapin::Result<()>>,
) -> anyhow::Result<()> {
    cluster.sigstop(node)?;
    let resume = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        cluster.sigcont(node)
    };
    let (changed, resumed) = tokio::join!(change, resume);
    resumed?;
    changed?;
    Ok(())
}

/// A binding made or removed through node 1 routes at once through node 2,
/// also on an exchange that already routes elsewhere (where node 2's stale
/// view would still route, so no catch-up on a miss would help), and a
/// queue deleted through node 1 is gone from node 2's routing: RabbitMQ's
/// bind-ok, unbind-ok and delete-ok cover every running node. Node 2 is paused while
/// each change is proposed and resumed before the change's ok; a publish
/// through node 2 right after that ok must see the change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bindings_and_deletes_through_one_node_hold_at_once_through_the_others(
) -> anyhow::Result<()> {
    let cluster = Cluster::start(3).await?;
    let r = cluster_tests::bounded(Duration::from_secs(180), async {
        let c1 = cluster.ready_connection(1, "bindvis.warmup").await?;
        let c2 = connect(&cluster.uri(2)).await?;
        let ch1 = c1.create_channel().await?;
        let ch2 = confirm_channel(&c2).await?;
        let x = "bindvis.x";
        ch1.exchange_declare(
            x.into(),
            ExchangeKind::Direct,
            ExchangeDeclareOptions::default(),
            FieldTable::default(),
        )
        .await?;
        const ROUNDS: usize = 5;
        let queues: Vec<String> = std::iter::once("bindvis.old".to_string())
            .chain((0..ROUNDS).map(|i| format!("bindvis.new{i}")))
            .collect();
        for q in &queues {
            ch1.queue_declare(q.as_str().into(), durable(), quorum_args(&[]))
                .await?;
        }
        let bind = |q: String| {
            let ch1 = ch1.clone();
            async move {
                ch1.queue_bind(
                    q.as_str().into(),
                    x.into(),
                    "k".into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
            }
        };
        bind(queues[0].clone()).await?;
        for (i, q) in queues.iter().enumerate().skip(1) {
            while_paused(&cluster, 2, bind(q.clone())).await?;
            publish_confirmed(
                &ch2,
                x,
                "k",
                format!("after bind {i}").as_bytes(),
                BasicProperties::default(),
            )
            .await?;
        }
        // Unbinding the first new queue: the last publish must not reach it.
        let unbound = queues[1].clone();
        let unbind = {
            let ch1 = ch1.clone();
            let q = unbound.clone();
            async move {
                ch1.queue_unbind(
                    q.as_str().into(),
                    x.into(),
                    "k".into(),
                    FieldTable::default(),
                )
                .await
            }
        };
        while_paused(&cluster, 2, unbind).await?;
        publish_confirmed(&ch2, x, "k", b"after unbind", BasicProperties::default()).await?;
        // Queue j (1-based new queues) got the publishes of rounds j..=ROUNDS,
        // and every queue but the unbound one the last publish.
        for (j, q) in queues.iter().enumerate() {
            let rounds = if j == 0 { ROUNDS } else { ROUNDS + 1 - j };
            let expected = rounds + usize::from(*q != unbound);
            retry(
                Duration::from_secs(10),
                &format!("{q} holds {expected}"),
                || async {
                    let n = ch1
                        .queue_declare(q.as_str().into(), passive(), FieldTable::default())
                        .await?
                        .message_count() as usize;
                    anyhow::ensure!(n == expected, "{q} holds {n} messages, expected {expected}");
                    Ok(())
                },
            )
            .await?;
        }
        // A queue deleted through node 1: a mandatory publish to it through
        // node 2 right after the delete-ok is returned as unroutable and
        // confirmed, as RabbitMQ does (a stale view routed it into the
        // deleted queue and nacked it).
        let deleted = queues[2].clone();
        let delete = {
            let ch1 = ch1.clone();
            let q = deleted.clone();
            async move {
                ch1.queue_delete(q.as_str().into(), Default::default())
                    .await
                    .map(|_| ())
            }
        };
        while_paused(&cluster, 2, delete).await?;
        let confirm = ch2
            .basic_publish(
                "".into(),
                deleted.as_str().into(),
                lapin::options::BasicPublishOptions {
                    mandatory: true,
                    ..Default::default()
                },
                b"after delete",
                BasicProperties::default(),
            )
            .await?
            .await?;
        assert!(
            confirm.is_ack(),
            "a publish to {deleted} right after its delete-ok is confirmed, not nacked"
        );
        let returned = confirm.take_message().map(|m| m.reply_code);
        assert_eq!(
            returned,
            Some(312),
            "a publish to {deleted} right after its delete-ok is returned NO_ROUTE"
        );
        anyhow::Ok(())
    })
    .await;
    cluster.logs_on_error(r, 8_000)
}

/// An exclusive queue belongs to its connection on every node: another
/// node's connections get 405 RESOURCE_LOCKED, and closing them leaves the
/// queue alone (before, connection ids counted from 1 on every node, so
/// node 2's first connection passed as node 1's first and its close deleted
/// node 1's exclusive queue).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exclusive_queue_belongs_to_its_connection_on_every_node() -> anyhow::Result<()> {
    let cluster = Cluster::start(3).await?;
    let r = cluster_tests::bounded(Duration::from_secs(120), async {
        // The first connection of node 1, as the first of nodes 2 and 3 below.
        let owner = cluster.ready_connection(1, "excl.warmup").await?;
        let ch1 = owner.create_channel().await?;
        let exclusive = QueueDeclareOptions {
            exclusive: true,
            ..QueueDeclareOptions::default()
        };
        ch1.queue_declare("excl.q".into(), exclusive, FieldTable::default())
            .await?;
        for node in [2, 3] {
            // The first connections of nodes 2 and 3.
            let other = connect(&cluster.uri(node)).await?;
            let ch = other.create_channel().await?;
            let r = ch
                .queue_declare("excl.q".into(), passive(), FieldTable::default())
                .await;
            let (code, _) = cluster_tests::expect_amqp_error(r);
            assert_eq!(
                code, 405,
                "a connection of node {node} may not use node 1's exclusive queue"
            );
            other.close(200, "bye".into()).await?;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        ch1.queue_declare("excl.q".into(), passive(), FieldTable::default())
            .await
            .map_err(|e| {
                anyhow::anyhow!(
                    "the exclusive queue is gone after other nodes' connections closed: {e}"
                )
            })?;
        anyhow::Ok(())
    })
    .await;
    cluster.logs_on_error(r, 8_000)
}
