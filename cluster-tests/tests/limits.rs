//! Limits (issue 14 item 4), each with RabbitMQ's error: the vhost limits of
//! `set_vhost_limits` (`max-connections` cluster-wide, `max-queues`), the node's
//! `connection_max`, `consumer_max_per_channel` and `channel_max`.
//!
//! `vhost_limits_*` runs against RabbitMQ 3.10.8 too (`QUORUMQ_TEST_URI`, with
//! `rabbitmqctl` on the PATH): the same texts come back.

use cluster_tests::{
    cluster::{retry, wait_for, Cluster},
    dlx,
    raw::RawConn,
    *,
};
use lapin::{
    options::{BasicConsumeOptions, QueueDeclareOptions, QueueDeleteOptions},
    types::FieldTable,
    Connection,
};
use std::time::Duration;

const T: Duration = TEST_TIMEOUT;
const CTL: Duration = Duration::from_secs(30);

async fn ctl(broker: &Broker, args: &[&str]) -> anyhow::Result<String> {
    dlx::run(dlx::ctl(broker, args)?, CTL).await
}

async fn declare(conn: &Connection, q: &str) -> Result<(), lapin::Error> {
    let ch = conn.create_channel().await?;
    ch.queue_declare(q.into(), durable(), quorum_args(&[]))
        .await
        .map(|_| ())
}

#[tokio::test]
async fn vhost_limits_refuse_connections_and_queues_as_rabbitmq() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let uri = broker.uri().to_string();
        ctl(
            &broker,
            &["set_vhost_limits", "-p", "/", r#"{"max-connections": 2, "max-queues": 2}"#],
        )
        .await?;
        let result = async {
            let listed = ctl(&broker, &["list_vhost_limits", "-p", "/"]).await?;
            assert!(
                listed.contains(r#""max-connections":2"#) && listed.contains(r#""max-queues":2"#),
                "{listed}"
            );
            // Two connections fit; the third is refused at connection.open.
            let c1 = connect(&uri).await?;
            let c2 = connect(&uri).await?;
            assert_eq!(
                connect_refusal(&uri).await?,
                (
                    530,
                    "NOT_ALLOWED - access to vhost '/' refused for user 'guest': connection limit (2) is reached"
                        .to_string()
                )
            );
            // A closed connection frees its place.
            close_connection(&c2).await?;
            let c3 = retry(Duration::from_secs(5), "connect after a close", || connect(&uri)).await?;

            // Queues: two new ones fit; a third is refused (406, channel closed); an
            // existing one can still be redeclared; a deleted one frees a place.
            let (a, b, c) = (unique("lim.a"), unique("lim.b"), unique("lim.c"));
            declare(&c1, &a).await?;
            declare(&c1, &b).await?;
            let e = expect_amqp_error(declare(&c1, &c).await);
            assert_eq!(
                e,
                (
                    406,
                    format!("PRECONDITION_FAILED - cannot declare queue '{c}': queue limit in vhost '/' (2) is reached")
                )
            );
            assert!(c1.status().connected(), "a channel error, not a connection error");
            declare(&c3, &a).await?;
            let ch = c1.create_channel().await?;
            ch.queue_delete(a.as_str().into(), QueueDeleteOptions::default())
                .await?;
            declare(&c1, &c).await?;

            // Invalid definitions are refused by the CLI, nothing changes.
            let out = dlx::output(
                dlx::ctl(&broker, &["set_vhost_limits", "-p", "/", r#"{"max-foo": 5}"#])?,
                CTL,
            )
            .await?;
            assert!(!out.status.success());
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(text.contains("max-foo") && text.contains("in limits"), "{text}");
            assert!(connect_refusal(&uri).await.is_ok(), "the limit of 2 still holds");

            // Cleared: connections and queues are unlimited again; clearing twice is an
            // error, as rabbitmqctl's "Parameter does not exist".
            ctl(&broker, &["clear_vhost_limits", "-p", "/"]).await?;
            let again = dlx::output(dlx::ctl(&broker, &["clear_vhost_limits", "-p", "/"])?, CTL).await?;
            assert!(!again.status.success());
            assert!(String::from_utf8_lossy(&again.stderr).contains("Parameter does not exist"));
            let more = retry(Duration::from_secs(5), "connect after clear", || connect(&uri)).await?;
            declare(&more, &a).await?;
            for q in [&a, &b, &c] {
                ch.queue_delete(q.as_str().into(), QueueDeleteOptions::default())
                    .await?;
            }
            for conn in [&c1, &c3, &more] {
                close_connection(conn).await?;
            }
            anyhow::Ok(())
        }
        .await;
        // Never leave an external broker limited (an error here: nothing left to clear).
        if result.is_err() {
            let _ = dlx::output(dlx::ctl(&broker, &["clear_vhost_limits", "-p", "/"])?, CTL).await;
        }
        result
    })
    .await
}

#[tokio::test]
async fn node_connection_consumer_and_channel_limits() -> anyhow::Result<()> {
    bounded(T, async {
        let mut broker = Broker::spawn().await?;
        broker
            .restart_with(&[
                "--connection-max",
                "1",
                "--consumer-max-per-channel",
                "2",
                "--channel-max",
                "10",
            ])
            .await?;
        let uri = broker.uri().to_string();

        // channel_max is offered in connection.tune.
        let raw = RawConn::handshake(&uri).await?;
        assert_eq!(raw.server_channel_max, 10);
        drop(raw);

        let c1 = retry(Duration::from_secs(5), "first connection", || connect(&uri)).await?;
        assert_eq!(
            connect_refusal(&uri).await?,
            (
                530,
                "NOT_ALLOWED - connection refused: node connection limit (1) is reached"
                    .to_string()
            )
        );

        // Two consumers on a channel fit; a third closes the connection (530).
        let ch = c1.create_channel().await?;
        let q = unique("lim.consumers");
        ch.queue_declare(
            q.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            quorum_args(&[]),
        )
        .await?;
        // (lapin cancels a consumer whose handle is dropped: keep them.)
        let mut consumers = Vec::new();
        for _ in 0..2 {
            consumers.push(
                ch.basic_consume(
                    q.as_str().into(),
                    "".into(),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await?,
            );
        }
        let e = expect_amqp_error(
            ch.basic_consume(
                q.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await,
        );
        assert_eq!(
            e,
            (
                530,
                "NOT_ALLOWED - reached maximum (2) of consumers per channel".to_string()
            )
        );
        // The closed connection frees the node's only place.
        let c2 = retry(Duration::from_secs(5), "connect after the close", || {
            connect(&uri)
        })
        .await?;
        let ch2 = c2.create_channel().await?;
        ch2.queue_delete(q.as_str().into(), QueueDeleteOptions::default())
            .await?;
        close_connection(&c2).await
    })
    .await
}

/// `max-connections` counts the cluster's connections: with 2 allowed, one on
/// node 1 and one on node 2 leave no place on node 3 (counts travel on the
/// failure detector's beats, ≤ 100 ms old); a node that goes down takes its
/// connections off the count.
#[tokio::test]
async fn vhost_connection_limit_is_cluster_wide() -> anyhow::Result<()> {
    bounded(T, async {
        let cluster = Cluster::start(3).await?;
        cluster
            .ctl(1, &["set_vhost_limits", r#"{"max-connections": 2}"#])
            .await?;
        // Every node applies the meta write before the limit holds there.
        wait_for(Duration::from_secs(10), "limit listed on node 3", || async {
            cluster
                .ctl(3, &["list_vhost_limits"])
                .await
                .is_ok_and(|out| out.contains(r#""max-connections":2"#))
        })
        .await?;
        let _c1 = connect(&cluster.uri(1)).await?;
        let _c2 = connect(&cluster.uri(2)).await?;
        let want = (
            530,
            "NOT_ALLOWED - access to vhost '/' refused for user 'guest': connection limit (2) is reached"
                .to_string(),
        );
        let got = retry(Duration::from_secs(5), "node 3 sees two connections", || async {
            let r = connect_refusal(&cluster.uri(3)).await?;
            anyhow::ensure!(r == want, "{r:?}");
            Ok(r)
        })
        .await?;
        assert_eq!(got, want);
        // Node 2 dies: its connection no longer counts.
        cluster.kill9(2);
        let uri3 = cluster.uri(3);
        let c3 = retry(Duration::from_secs(10), "connect once node 2 is down", || {
            connect(&uri3)
        })
        .await?;
        close_connection(&c3).await
    })
    .await
}
