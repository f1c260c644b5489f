//! Delayed retry (RabbitMQ 4.3 `x-delayed-retry-*`, issue 28 item 2) through
//! lapin against the real binary: which returns wait and for how long
//! (`min(min × n, max)` ms, n = delivery count after the return), the
//! `messages_delayed` count, the delivery limit, a broker restart and a
//! leader kill on a 3-node cluster.
//!
//! Times are measured on this machine's clock, as the broker's are: a
//! redelivery must come no earlier than the delay after the return was sent
//! (less 2 ms: the broker stamps whole milliseconds).

use cluster_tests::cluster::{self, Cluster, QueueView};
use cluster_tests::*;
use futures::StreamExt;
use lapin::{
    options::{BasicAckOptions, BasicNackOptions},
    types::{AMQPValue, FieldTable},
    BasicProperties, Channel,
};
use std::collections::HashMap;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(90);
/// The broker stamps whole milliseconds: a release may be this much before
/// the client's own measure of "return sent + delay".
const CLOCK_SLACK: Duration = Duration::from_millis(2);

fn delayed_args(kind: &str, min_ms: i64, max_ms: i64, extra: &[(&str, AMQPValue)]) -> FieldTable {
    let mut args = vec![
        ("x-delayed-retry-type", s(kind)),
        ("x-delayed-retry-min", AMQPValue::LongLongInt(min_ms)),
        ("x-delayed-retry-max", AMQPValue::LongLongInt(max_ms)),
    ];
    args.extend_from_slice(extra);
    quorum_args(&args)
}

async fn declare(ch: &Channel, q: &str, args: FieldTable) -> anyhow::Result<()> {
    cluster::declare_durable(ch, q, args).await
}

async fn publish(ch: &Channel, q: &str, bodies: &[String]) -> anyhow::Result<()> {
    for b in bodies {
        ch.basic_publish(
            "".into(),
            q.into(),
            Default::default(),
            b.as_bytes(),
            BasicProperties::default(),
        )
        .await?;
    }
    anyhow::ensure!(
        ch.wait_for_confirms().await?.is_empty(),
        "a publish was nacked"
    );
    Ok(())
}

fn body(d: &lapin::message::Delivery) -> String {
    String::from_utf8_lossy(&d.data).into_owned()
}

/// Queue `q` as the single broker's `quorumqctl list_queues` shows it (None
/// for an external broker).
async fn view(broker: &Broker, q: &str) -> anyhow::Result<Option<QueueView>> {
    let Some(admin) = broker.admin_addr() else {
        return Ok(None);
    };
    let out = cluster_tests::dlx::run(
        cluster_tests::dlx::quorumqctl(&admin, &["list_queues", "--formatter", "json"]),
        Duration::from_secs(15),
    )
    .await?;
    let queues: Vec<QueueView> = serde_json::from_str(&out)?;
    Ok(queues.into_iter().find(|v| v.name == q))
}

/// The next delivery within `limit`.
async fn next(
    c: &mut lapin::Consumer,
    limit: Duration,
) -> anyhow::Result<lapin::message::Delivery> {
    Ok(consume_n(c, 1, limit).await?.remove(0))
}

/// `failed`: each basic.nack requeue waits min × n, capped at max (200, 400,
/// 600, 800, 1000, 1000 ms); meanwhile the message is delayed, not ready.
#[tokio::test]
async fn failed_delays_nack_requeue_by_min_times_delivery_count_capped_at_max() -> anyhow::Result<()>
{
    bounded(T, async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let ch = confirm_channel(&conn).await?;
        let q = unique("dr.failed");
        declare(&ch, &q, delayed_args("failed", 200, 1000, &[])).await?;
        publish(&ch, &q, &["m".to_string()]).await?;
        let (cch, mut c) = open_consumer(&conn, &q, 10).await?;
        let mut d = next(&mut c, Duration::from_secs(10)).await?;
        for (n, delay_ms) in [200u64, 400, 600, 800, 1000, 1000].into_iter().enumerate() {
            let delay = Duration::from_millis(delay_ms);
            let sent = Instant::now();
            cch.basic_nack(
                d.delivery_tag,
                BasicNackOptions {
                    requeue: true,
                    ..Default::default()
                },
            )
            .await?;
            if delay_ms >= 800 {
                // Visible as delayed while it waits (list_queues), once the nack is applied
                // (basic.nack has no reply: on a loaded machine the first look can come first).
                while let Some(v) = view(&broker, &q).await? {
                    if sent.elapsed() + Duration::from_millis(50) >= delay {
                        break;
                    }
                    if v.messages_unacknowledged == 0 {
                        assert_eq!((v.messages_delayed, v.messages_ready), (1, 0), "{v:?}");
                        break;
                    }
                }
            }
            d = next(&mut c, delay + Duration::from_secs(5)).await?;
            let waited = sent.elapsed();
            assert!(d.redelivered);
            assert!(
                waited + CLOCK_SLACK >= delay,
                "return {} redelivered after {waited:?}, before its delay {delay:?}",
                n + 1
            );
        }
        d.ack(BasicAckOptions::default()).await?;
        if let Some(v) = view(&broker, &q).await? {
            assert_eq!(
                (
                    v.messages_delayed,
                    v.messages_ready,
                    v.messages_unacknowledged
                ),
                (0, 0, 0)
            );
        }
        Ok(())
    })
    .await
}

/// `returned`: a basic.nack requeue is redelivered at once; messages left
/// unacked on a closed channel wait.
#[tokio::test]
async fn returned_delays_what_a_closed_channel_held_but_not_a_nack() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let ch = confirm_channel(&conn).await?;
        let q = unique("dr.returned");
        declare(&ch, &q, delayed_args("returned", 700, 700, &[])).await?;
        publish(&ch, &q, &["a".to_string(), "b".to_string()]).await?;
        let (cch, mut c) = open_consumer(&conn, &q, 10).await?;
        let got = consume_n(&mut c, 2, Duration::from_secs(10)).await?;
        let sent = Instant::now();
        cch.basic_nack(
            got[0].delivery_tag,
            BasicNackOptions {
                requeue: true,
                ..Default::default()
            },
        )
        .await?;
        let again = next(&mut c, Duration::from_secs(5)).await?;
        assert!(again.redelivered);
        assert!(
            sent.elapsed() < Duration::from_millis(700),
            "a nack under `returned` is not delayed (took {:?})",
            sent.elapsed()
        );
        // Close the channel holding both, unacked: both wait 700 ms.
        let closed = Instant::now();
        cch.close(200, "bye".into()).await?;
        if let Some(v) = view(&broker, &q).await? {
            if closed.elapsed() < Duration::from_millis(600) {
                assert_eq!((v.messages_delayed, v.messages_ready), (2, 0), "{v:?}");
            }
        }
        let (_c2, mut c2) = open_consumer(&conn, &q, 10).await?;
        let back = consume_n(&mut c2, 2, Duration::from_secs(10)).await?;
        let waited = closed.elapsed();
        assert!(
            waited + CLOCK_SLACK >= Duration::from_millis(700),
            "redelivered after {waited:?}, before the 700 ms delay"
        );
        let mut bodies: Vec<String> = back.iter().map(body).collect();
        bodies.sort();
        assert_eq!(bodies, vec!["a", "b"]);
        Ok(())
    })
    .await
}

/// The delivery limit dead-letters a message instead of delaying it.
#[tokio::test]
async fn the_delivery_limit_dead_letters_instead_of_delaying() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let ch = confirm_channel(&conn).await?;
        let q = unique("dr.limit");
        let dlq = unique("dr.limit.dlq");
        declare(&ch, &dlq, quorum_args(&[])).await?;
        declare(
            &ch,
            &q,
            delayed_args(
                "failed",
                300,
                300,
                &[
                    ("x-delivery-limit", AMQPValue::LongInt(1)),
                    ("x-dead-letter-exchange", s("")),
                    ("x-dead-letter-routing-key", s(&dlq)),
                ],
            ),
        )
        .await?;
        publish(&ch, &q, &["p".to_string()]).await?;
        let (cch, mut c) = open_consumer(&conn, &q, 10).await?;
        let d = next(&mut c, Duration::from_secs(10)).await?;
        cch.basic_nack(
            d.delivery_tag,
            BasicNackOptions {
                requeue: true,
                ..Default::default()
            },
        )
        .await?;
        let d = next(&mut c, Duration::from_secs(10)).await?;
        assert!(d.redelivered);
        // Second return: delivery count 2 > limit 1 → dead-lettered now.
        cch.basic_nack(
            d.delivery_tag,
            BasicNackOptions {
                requeue: true,
                ..Default::default()
            },
        )
        .await?;
        let (_dch, mut dc) = open_consumer(&conn, &dlq, 10).await?;
        let dead = next(&mut dc, Duration::from_secs(10)).await?;
        assert_eq!(body(&dead), "p");
        let reason = dead
            .properties
            .headers()
            .as_ref()
            .and_then(|h| h.inner().get("x-last-death-reason").cloned());
        if let Some(r) = reason {
            assert_eq!(r, s("delivery_limit"));
        }
        expect_no_delivery(&mut c, Duration::from_millis(600)).await?;
        if let Some(v) = view(&broker, &q).await? {
            assert_eq!((v.messages_delayed, v.messages_ready), (0, 0), "{v:?}");
        }
        Ok(())
    })
    .await
}

/// A crash (kill -9) and restart keeps delayed messages: they come back,
/// no earlier than their delay.
#[tokio::test]
async fn a_broker_restart_keeps_delayed_messages() -> anyhow::Result<()> {
    bounded(T, async {
        let mut broker = Broker::start().await?;
        if broker.is_external() {
            println!("external broker: cannot restart it, skipping");
            return Ok(());
        }
        let q = unique("dr.restart");
        let sent;
        {
            let conn = connect(broker.uri()).await?;
            let ch = confirm_channel(&conn).await?;
            declare(&ch, &q, delayed_args("all", 4000, 4000, &[])).await?;
            publish(&ch, &q, &["x".to_string(), "y".to_string()]).await?;
            let (cch, mut c) = open_consumer(&conn, &q, 10).await?;
            let got = consume_n(&mut c, 2, Duration::from_secs(10)).await?;
            sent = Instant::now();
            for d in &got {
                cch.basic_nack(
                    d.delivery_tag,
                    BasicNackOptions {
                        requeue: true,
                        ..Default::default()
                    },
                )
                .await?;
            }
            cluster::wait_until_some(Duration::from_secs(5), "2 delayed", || async {
                Ok(view(&broker, &q)
                    .await?
                    .filter(|v| v.messages_delayed == 2)
                    .map(|_| ()))
            })
            .await?;
        }
        broker.restart().await?;
        if sent.elapsed() < Duration::from_millis(3500) {
            let v = view(&broker, &q).await?;
            assert_eq!(
                v.map(|v| v.messages_delayed),
                Some(2),
                "still delayed after the restart"
            );
        }
        let conn = connect(broker.uri()).await?;
        let (_ch, mut c) = open_consumer(&conn, &q, 10).await?;
        let back = consume_n(&mut c, 2, Duration::from_secs(20)).await?;
        assert!(sent.elapsed() + CLOCK_SLACK >= Duration::from_millis(4000));
        let mut bodies: Vec<String> = back.iter().map(body).collect();
        bodies.sort();
        assert_eq!(bodies, vec!["x", "y"]);
        assert!(back.iter().all(|d| d.redelivered));
        Ok(())
    })
    .await
}

/// A policy sets delayed retry (`delayed-retry-*` keys) on a queue without arguments.
#[tokio::test]
async fn a_policy_turns_delayed_retry_on() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let Some(admin) = broker.admin_addr() else {
            println!("external broker: no quorumqctl, skipping");
            return Ok(());
        };
        let q = unique("dr.policy");
        cluster_tests::dlx::run(
            cluster_tests::dlx::quorumqctl(
                &admin,
                &[
                    "set_policy",
                    &q,
                    &format!("^{q}$"),
                    r#"{"delayed-retry-type":"failed","delayed-retry-min":500}"#,
                    "--apply-to",
                    "queues",
                ],
            ),
            Duration::from_secs(15),
        )
        .await?;
        let conn = connect(broker.uri()).await?;
        let ch = confirm_channel(&conn).await?;
        declare(&ch, &q, quorum_args(&[])).await?;
        publish(&ch, &q, &["m".to_string()]).await?;
        let (cch, mut c) = open_consumer(&conn, &q, 10).await?;
        let d = next(&mut c, Duration::from_secs(10)).await?;
        let sent = Instant::now();
        cch.basic_nack(
            d.delivery_tag,
            BasicNackOptions {
                requeue: true,
                ..Default::default()
            },
        )
        .await?;
        next(&mut c, Duration::from_secs(10)).await?;
        assert!(sent.elapsed() + CLOCK_SLACK >= Duration::from_millis(500));
        Ok(())
    })
    .await
}

/// A queue's leader is killed while messages wait: none lost, none early
/// (by more than 50 ms), none later than 1 s after its ready time or the new
/// leader's election, whichever is later.
#[tokio::test]
async fn delayed_messages_survive_a_leader_kill() -> anyhow::Result<()> {
    if std::env::var(TEST_URI_ENV).is_ok_and(|v| !v.is_empty()) {
        println!("{TEST_URI_ENV} is set; this test spawns its own cluster, returning early");
        return Ok(());
    }
    bounded(Duration::from_secs(180), async {
        let c = Cluster::start(3).await?;
        let q = unique("dr.failover");
        const N: usize = 30;
        const DELAY: Duration = Duration::from_millis(2500);
        // Declare through node 1 and find the leader; clients use another node.
        {
            let conn = connect(&c.uri(1)).await?;
            let ch = confirm_channel(&conn).await?;
            declare(&ch, &q, delayed_args("failed", 2500, 2500, &[])).await?;
        }
        let leader = c.wait_queue_leader(1, &q, Duration::from_secs(30)).await?;
        let client = c.ids().find(|id| *id != leader).expect("3 nodes");
        let conn = connect(&c.uri(client)).await?;
        let ch = confirm_channel(&conn).await?;
        let bodies: Vec<String> = (0..N).map(|i| format!("m{i}")).collect();
        publish(&ch, &q, &bodies).await?;
        let (cch, mut consumer) = open_consumer(&conn, &q, N as u16).await?;
        let first = consume_n(&mut consumer, N, Duration::from_secs(20)).await?;
        // Nack one every 40 ms (ready times spread over 1.2 s), then kill the leader.
        let mut nacked: HashMap<String, Instant> = HashMap::new();
        for d in &first {
            nacked.insert(body(d), Instant::now());
            cch.basic_nack(
                d.delivery_tag,
                BasicNackOptions {
                    requeue: true,
                    ..Default::default()
                },
            )
            .await?;
            tokio::time::sleep(Duration::from_millis(40)).await;
        }
        // Every nack committed (all N delayed) before the leader goes.
        cluster::wait_until_some(Duration::from_secs(2), "all delayed", || async {
            let v = c.queue_view(client, &q).await?;
            Ok((v.messages_delayed == N as u64).then_some(()))
        })
        .await?;
        c.kill9(leader);
        eprintln!("kill -9 node {leader} (leader of {q})");
        let new_leader = c
            .wait_queue_leader(client, &q, Duration::from_secs(60))
            .await?;
        let elected = Instant::now();
        eprintln!(
            "node {new_leader} leads {q} {:?} after the last nack",
            elected - nacked.values().max().copied().unwrap()
        );
        // Take every redelivery (first arrival per body), acking as they come.
        let mut arrived: HashMap<String, Instant> = HashMap::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        while arrived.len() < N && Instant::now() < deadline {
            match tokio::time::timeout(Duration::from_secs(1), consumer.next()).await {
                Ok(Some(Ok(d))) => {
                    arrived.entry(body(&d)).or_insert_with(Instant::now);
                    d.ack(BasicAckOptions::default()).await?;
                }
                Ok(Some(Err(e))) => anyhow::bail!("consumer error: {e}"),
                Ok(None) => anyhow::bail!("consumer ended"),
                Err(_) => {}
            }
        }
        let missing: Vec<&String> = bodies
            .iter()
            .filter(|b| !arrived.contains_key(*b))
            .collect();
        assert_none("delayed messages lost across the leader kill", &missing);
        for b in &bodies {
            let ready = nacked[b] + DELAY;
            let at = arrived[b];
            assert!(
                at + Duration::from_millis(50) >= ready,
                "{b} arrived {:?} before its ready time",
                ready - at
            );
            let bound = ready.max(elected) + Duration::from_secs(1);
            assert!(
                at <= bound,
                "{b} arrived {:?} after max(ready, election) + 1 s",
                at - bound
            );
        }
        Ok(())
    })
    .await
}

/// `messages_delayed` in the HTTP API's queue object (and in its
/// `messages` total, not in `messages_ready`) and in `/metrics`.
#[tokio::test]
async fn messages_delayed_in_the_http_api_and_metrics() -> anyhow::Result<()> {
    bounded(T, async {
        let h = cluster_tests::http::HttpBroker::start().await?;
        let conn = connect(&h.amqp_uri("guest", "guest", "/")).await?;
        let ch = confirm_channel(&conn).await?;
        let q = unique("dr.http");
        declare(&ch, &q, delayed_args("failed", 60_000, 60_000, &[])).await?;
        publish(
            &ch,
            &q,
            &["a".to_string(), "b".to_string(), "c".to_string()],
        )
        .await?;
        let (cch, mut c) = open_consumer(&conn, &q, 10).await?;
        let got = consume_n(&mut c, 2, Duration::from_secs(10)).await?;
        for d in &got {
            cch.basic_nack(
                d.delivery_tag,
                BasicNackOptions {
                    requeue: true,
                    ..Default::default()
                },
            )
            .await?;
        }
        let path = format!("/api/queues/%2F/{q}");
        let qd =
            cluster::wait_until_some(Duration::from_secs(10), "2 delayed in the API", || async {
                let v = h.get(&path)?;
                Ok((v["messages_delayed"] == 2).then_some(v))
            })
            .await?;
        assert_eq!(qd["messages_ready"], 0, "{qd}");
        assert_eq!(qd["messages_unacknowledged"], 1, "{qd}");
        assert_eq!(qd["messages"], 3, "ready + unacked + delayed: {qd}");
        if h.is_quorumq() {
            let out = std::process::Command::new("curl")
                .args(["-s", "--max-time", "10", &format!("{}/metrics", h.base)])
                .output()?;
            let text = String::from_utf8_lossy(&out.stdout);
            let line = format!("rabbitmq_queue_messages_delayed{{vhost=\"/\",queue=\"{q}\"}} 2");
            assert!(text.lines().any(|l| l == line), "no `{line}` in /metrics");
        }
        Ok(())
    })
    .await
}
