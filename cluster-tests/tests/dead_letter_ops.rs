//! Operating dead letters and quorum health (issue 29 items 1, 2, 5), with a
//! real client against the real binary: `quorumqctl peek`, `quorumqctl
//! inspect_dead_letters` and `GET /api/queues/{vhost}/{name}/dead-letters`,
//! the held-reason metric, `quorum_status`, `check_if_node_is_quorum_critical`,
//! `check_for_quorum_queues_without_an_elected_leader` and its HTTP health check.
//! quorumq's own verbs: against an external broker the tests return early.

use cluster_tests::cluster::{wait_for, wait_until_some, Cluster};
use cluster_tests::dlx::*;
use cluster_tests::http::HttpBroker;
use cluster_tests::s as ls;
use cluster_tests::*;
use lapin::options::{BasicNackOptions, BasicRejectOptions};
use lapin::types::AMQPValue;
use lapin::BasicProperties;
use serde_json::Value;
use std::time::Duration;

const T: Duration = Duration::from_secs(120);
const T3: Duration = Duration::from_secs(240);

/// `quorumqctl ARGS... --formatter json` against `broker`, exit 0: its JSON.
async fn ctl_json(broker: &Broker, args: &[&str]) -> anyhow::Result<Value> {
    let mut a = args.to_vec();
    a.extend(["--formatter", "json"]);
    let out = run(ctl(broker, &a)?, CTL_TIMEOUT).await?;
    Ok(serde_json::from_str(&out)?)
}

/// Source queue args: quorum, dead-lettered through the default exchange to `dlq`.
fn to_dlq(dlq: &str, extra: &[(&'static str, AMQPValue)]) -> lapin::types::FieldTable {
    let mut args = vec![
        ("x-queue-type", ls("quorum")),
        ("x-dead-letter-exchange", ls("")),
        ("x-dead-letter-routing-key", ls(dlq)),
    ];
    args.extend(extra.iter().cloned());
    table(&args)
}

/// basic.get + basic.reject(requeue=false) of `n` messages of `q`.
async fn reject_n(ch: &lapin::Channel, q: &str, n: usize) -> anyhow::Result<()> {
    for i in 0..n {
        let d = get(ch, q)
            .await?
            .ok_or_else(|| anyhow::anyhow!("{q}: get-empty at {i}"))?;
        ch.basic_reject(d.delivery_tag, BasicRejectOptions { requeue: false })
            .await?;
    }
    Ok(())
}

/// 35 dead letters from two source queues and three reasons (rejected,
/// expired, maxlen) in one DLQ, counted exactly by `inspect_dead_letters`
/// (JSON) and by the HTTP endpoint; nothing is consumed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_counts_dead_letters_by_last_death() -> anyhow::Result<()> {
    bounded(T, async {
        let h = HttpBroker::start().await?;
        if !h.is_quorumq() {
            return Ok(());
        }
        let conn = connect(h.broker.uri()).await?;
        let ch = confirm_channel(&conn).await?;
        let dlq = unique("ops_dlq");
        let a = unique("ops_src_a");
        let b = unique("ops_src_b");
        ch.queue_declare(dlq.as_str().into(), durable(), quorum_args(&[]))
            .await?;
        ch.queue_declare(a.as_str().into(), durable(), to_dlq(&dlq, &[]))
            .await?;
        ch.queue_declare(
            b.as_str().into(),
            durable(),
            to_dlq(&dlq, &[("x-max-length", long(5))]),
        )
        .await?;

        // a: 10 rejected, then 8 expired (per-message TTL, expired at the head).
        let ten: Vec<String> = (0..10).map(|i| format!("a-rej-{i}")).collect();
        publish(&ch, &a, &ten.iter().map(String::as_str).collect::<Vec<_>>()).await?;
        reject_n(&ch, &a, 10).await?;
        let eight: Vec<String> = (0..8).map(|i| format!("a-exp-{i}")).collect();
        publish_props(
            &ch,
            &a,
            &eight.iter().map(String::as_str).collect::<Vec<_>>(),
            BasicProperties::default().with_expiration("50".into()),
        )
        .await?;
        // b: 17 published over max-length 5 (drop-head): 12 maxlen; then 5 rejected.
        let seventeen: Vec<String> = (0..17).map(|i| format!("b-{i}")).collect();
        publish(
            &ch,
            &b,
            &seventeen.iter().map(String::as_str).collect::<Vec<_>>(),
        )
        .await?;
        wait_for_messages(&h.broker, &b, [5, 5, 0]).await?;
        reject_n(&ch, &b, 5).await?;
        wait_for_messages(&h.broker, &dlq, [35, 35, 0]).await?;

        let v = ctl_json(&h.broker, &["inspect_dead_letters", &dlq]).await?;
        assert_eq!(v["queue"], dlq.as_str());
        assert_eq!(v["messages"], 35, "{v}");
        assert_eq!(
            v["by_reason"],
            serde_json::json!({"rejected": 15, "expired": 8, "maxlen": 12}),
            "{v}"
        );
        let mut by_source = serde_json::Map::new();
        by_source.insert(a.clone(), 18.into());
        by_source.insert(b.clone(), 17.into());
        assert_eq!(v["by_source_queue"], Value::Object(by_source), "{v}");
        let (oldest, newest) = (
            v["oldest_death"].as_str().unwrap_or_default().to_string(),
            v["newest_death"].as_str().unwrap_or_default().to_string(),
        );
        assert!(
            oldest.len() == 20 && oldest.ends_with('Z') && oldest <= newest,
            "ISO 8601 UTC times, oldest first: {v}"
        );
        assert_eq!(v["without_death"], 0);
        assert_eq!(
            v["held"]["messages"], 0,
            "a DLQ holds no dead letters of its own"
        );

        let via_http = h.get(&format!("/api/queues/%2F/{dlq}/dead-letters"))?;
        for key in [
            "messages",
            "by_reason",
            "by_source_queue",
            "oldest_death",
            "newest_death",
        ] {
            assert_eq!(via_http[key], v[key], "HTTP {key}: {via_http}");
        }
        let (code, _) = h.guest(
            "GET",
            "/api/queues/%2F/no_such_queue_ops/dead-letters",
            None,
        )?;
        assert_eq!(code, 404);

        // Nothing was consumed.
        wait_for_messages(&h.broker, &dlq, [35, 35, 0]).await?;
        let table = run(
            ctl(&h.broker, &["inspect_dead_letters", &dlq])?,
            CTL_TIMEOUT,
        )
        .await?;
        assert!(table.contains("by_reason.maxlen\t12"), "{table}");
        Ok(())
    })
    .await
}

/// `peek` at positions 1, middle and last returns the right message (payload,
/// headers, redelivered), leaves the queue unchanged (counts and the following
/// consume order), and past the last position exits non-zero with RabbitMQ's text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peek_shows_messages_in_delivery_order_and_changes_nothing() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        if broker.is_external() {
            return Ok(());
        }
        let conn = connect(broker.uri()).await?;
        let ch = confirm_channel(&conn).await?;
        let q = unique("ops_peek");
        ch.queue_declare(q.as_str().into(), durable(), quorum_args(&[]))
            .await?;
        for i in 0..10 {
            let props = BasicProperties::default()
                .with_content_type("text/plain".into())
                .with_headers(table(&[("i", long(i))]));
            assert!(publish_confirm(&ch, &q, format!("m{i}").as_bytes(), props).await?);
        }
        // m0 is delivered and returned: it goes to the back, redelivered.
        let d = get(&ch, &q).await?.expect("m0");
        ch.basic_nack(
            d.delivery_tag,
            BasicNackOptions {
                multiple: false,
                requeue: true,
            },
        )
        .await?;
        wait_for_messages(&broker, &q, [10, 10, 0]).await?;
        let order: Vec<String> = (1..10)
            .map(|i| format!("m{i}"))
            .chain(["m0".into()])
            .collect();

        for (pos, want) in [(1usize, "m1"), (5, "m5"), (10, "m0")] {
            let v = ctl_json(&broker, &["peek", &q, &pos.to_string()]).await?;
            assert_eq!(v["payload"], want, "position {pos}: {v}");
            assert_eq!(v["payload_encoding"], "string");
            assert_eq!(v["payload_bytes"], want.len());
            assert_eq!(v["exchange"], "");
            assert_eq!(v["routing_key"], q.as_str());
            let i: i64 = want[1..].parse()?;
            assert_eq!(v["properties"]["headers"]["i"], i, "{v}");
            assert_eq!(v["properties"]["content_type"], "text/plain");
            let redelivered = want == "m0";
            assert_eq!(v["redelivered"], redelivered, "position {pos}: {v}");
            assert_eq!(
                v["properties"]["headers"]["x-delivery-count"],
                i64::from(redelivered),
                "{v}"
            );
            assert_eq!(v["message_count"], 10 - pos, "{v}");
        }
        let table = run(ctl(&broker, &["peek", &q, "2"])?, CTL_TIMEOUT).await?;
        assert!(table.contains("payload\tm2"), "{table}");

        for bad in ["11", "0"] {
            let out = output(ctl(&broker, &["peek", &q, bad])?, CTL_TIMEOUT).await?;
            assert!(!out.status.success(), "peek at {bad} must fail");
            let err = String::from_utf8_lossy(&out.stderr);
            let want = if bad == "0" {
                "position value must be a positive integer"
            } else {
                "Target queue does not have a message at that position"
            };
            assert!(err.contains(want), "peek at {bad}: {err}");
        }
        let out = output(
            ctl(&broker, &["peek", &q, "11", "--formatter", "json"])?,
            CTL_TIMEOUT,
        )
        .await?;
        assert!(!out.status.success());
        let v: Value = serde_json::from_slice(&out.stdout)?;
        assert_eq!(v["result"], "error");
        assert_eq!(
            v["message"],
            "Target queue does not have a message at that position"
        );
        let out = output(
            ctl(&broker, &["peek", "ops_no_such_queue", "1"])?,
            CTL_TIMEOUT,
        )
        .await?;
        assert!(!out.status.success());
        assert!(String::from_utf8_lossy(&out.stderr)
            .contains("Target queue was not found in virtual host '/'"));

        // Unchanged: counts, then the same consume order.
        wait_for_messages(&broker, &q, [10, 10, 0]).await?;
        let got = consume(
            &ch,
            &q,
            &order.iter().map(String::as_str).collect::<Vec<_>>(),
        )
        .await?;
        assert_eq!(got.last().map(|d| d.redelivered), Some(true));
        assert!(got[..9].iter().all(|d| !d.redelivered));
        consume_empty(&ch, &q).await?;
        Ok(())
    })
    .await
}

/// The `quorumq_queue_dead_letters_held` sample of queue `q` and `reason` in a `/metrics` text.
fn held_metric(metrics: &str, q: &str, reason: &str) -> Option<u64> {
    metrics
        .lines()
        .filter(|l| l.starts_with("quorumq_queue_dead_letters_held{"))
        .filter(|l| {
            l.contains(&format!("queue=\"{q}\"")) && l.contains(&format!("reason=\"{reason}\""))
        })
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

/// A source queue with at-least-once dead-lettering reports its held dead
/// letters by why they are held: `target_full` while the target refuses with
/// reject-publish, `no_route` when its DLX does not exist, `cycle` when it
/// expires into itself; through
/// `inspect_dead_letters`, the HTTP endpoint and `/metrics`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_dead_letters_are_reported_by_reason() -> anyhow::Result<()> {
    bounded(T, async {
        let h = HttpBroker::start().await?;
        if !h.is_quorumq() {
            return Ok(());
        }
        let conn = connect(h.broker.uri()).await?;
        let ch = confirm_channel(&conn).await?;
        let target = unique("ops_full");
        let src = unique("ops_alo");
        let lost = unique("ops_noroute");
        ch.queue_declare(
            target.as_str().into(),
            durable(),
            quorum_args(&[
                ("x-max-length", long(1)),
                ("x-overflow", ls("reject-publish")),
            ]),
        )
        .await?;
        // Full: the publish over the limit is accepted, later ones refused.
        publish(&ch, &target, &["t1", "t2"]).await?;
        let alo = [
            ("x-dead-letter-strategy", ls("at-least-once")),
            ("x-overflow", ls("reject-publish")),
        ];
        ch.queue_declare(src.as_str().into(), durable(), to_dlq(&target, &alo))
            .await?;
        let mut no_route_args = alo.to_vec();
        no_route_args.push(("x-queue-type", ls("quorum")));
        no_route_args.push(("x-dead-letter-exchange", ls("ops_no_such_exchange")));
        ch.queue_declare(lost.as_str().into(), durable(), table(&no_route_args))
            .await?;
        publish(&ch, &src, &["s1", "s2", "s3"]).await?;
        reject_n(&ch, &src, 3).await?;
        publish(&ch, &lost, &["l1", "l2"]).await?;
        reject_n(&ch, &lost, 2).await?;

        let held = |v: &Value, reason: &str| v["held"]["by_reason"][reason].as_u64();
        let v = wait_until_some(Duration::from_secs(30), "3 held as target_full", || async {
            let v = ctl_json(&h.broker, &["inspect_dead_letters", &src]).await?;
            Ok((held(&v, "target_full") == Some(3)).then_some(v))
        })
        .await?;
        assert_eq!(v["held"]["messages"], 3, "{v}");
        assert_eq!(v["messages"], 0, "nothing ready in the source: {v}");
        let v = wait_until_some(Duration::from_secs(30), "2 held as no_route", || async {
            let v = ctl_json(&h.broker, &["inspect_dead_letters", &lost]).await?;
            Ok((held(&v, "no_route") == Some(2)).then_some(v))
        })
        .await?;
        assert_eq!(v["held"]["messages"], 2, "{v}");

        // Expired into itself: an automatic cycle (no `rejected` death), held as `cycle`.
        let cyc = unique("ops_cycle");
        let mut cycle_args = alo.to_vec();
        cycle_args.push(("x-message-ttl", long(20)));
        ch.queue_declare(cyc.as_str().into(), durable(), to_dlq(&cyc, &cycle_args))
            .await?;
        publish(&ch, &cyc, &["c1"]).await?;
        wait_until_some(Duration::from_secs(30), "1 held as cycle", || async {
            let v = ctl_json(&h.broker, &["inspect_dead_letters", &cyc]).await?;
            Ok((held(&v, "cycle") == Some(1)).then_some(v))
        })
        .await?;

        let via_http = h.get(&format!("/api/queues/%2F/{src}/dead-letters"))?;
        assert_eq!(held(&via_http, "target_full"), Some(3), "{via_http}");
        let (code, metrics) = h.guest("GET", "/metrics", None)?;
        assert_eq!(code, 200);
        let metrics = metrics.as_str().unwrap_or_default().to_string();
        assert_eq!(
            held_metric(&metrics, &src, "target_full"),
            Some(3),
            "{metrics}"
        );
        assert_eq!(held_metric(&metrics, &src, "pending"), Some(0));
        assert_eq!(held_metric(&metrics, &lost, "no_route"), Some(2));

        // The target drains: the held dead letters are forwarded, none is held any more.
        consume(&ch, &target, &["t1", "t2"]).await?;
        let got = get_eventually(&ch, &target, "s1", Duration::from_secs(15)).await?;
        assert_eq!(body(&got), "s1");
        Ok(())
    })
    .await
}

/// Three nodes: `quorum_status` lists 3 members with one leader; with all nodes
/// up no node is quorum critical (exit 0) and every queue has a leader (HTTP
/// 200, exit 0); with one node down every 3-member queue is critical on each
/// remaining node (exit 69 listing them); with two down the queues have no
/// elected leader (HTTP 503 with RabbitMQ's body, exit 69).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_health_checks_on_three_nodes() -> anyhow::Result<()> {
    bounded(T3, async {
        let cluster = Cluster::start(3).await?;
        let http = format!("127.0.0.1:{}", free_port()?);
        cluster.restart_with(1, &["--http-listen", &http]).await?;
        let queues = [unique("ops_h1"), unique("ops_h2")];
        let _conns = {
            let mut v = Vec::new();
            for q in &queues {
                let conn = connect(&cluster.uri(1)).await?;
                let ch = confirm_channel(&conn).await?;
                cluster_tests::cluster::declare_durable(&ch, q, quorum_args(&[])).await?;
                publish(&ch, q, &["first", "second"]).await?;
                v.push(conn);
            }
            v
        };
        for q in &queues {
            cluster.wait_queue_leader(1, q, Duration::from_secs(30)).await?;
            wait_for(Duration::from_secs(30), "3 members online", || async {
                cluster
                    .queue_view(1, q)
                    .await
                    .is_ok_and(|v| v.members.len() == 3 && v.online.len() == 3)
            })
            .await?;
        }

        let status: Value = wait_until_some(Duration::from_secs(30), "quorum_status", || async {
            let out = cluster
                .ctl(2, &["quorum_status", &queues[0], "--formatter", "json"])
                .await?;
            let v: Value = serde_json::from_str(&out)?;
            let members = v["members"].as_array().cloned().unwrap_or_default();
            let leaders = members.iter().filter(|m| m["raft_state"] == "leader").count();
            let followers = members.iter().filter(|m| m["raft_state"] == "follower").count();
            Ok((members.len() == 3 && leaders == 1 && followers == 2).then_some(v))
        })
        .await?;
        let members = status["members"].as_array().cloned().unwrap_or_default();
        let leader = members.iter().find(|m| m["raft_state"] == "leader").cloned();
        let leader = leader.expect("one leader");
        assert_eq!(status["leader"], leader["node"]);
        assert!(leader["commit_index"].as_u64().is_some(), "{status}");
        for m in &members {
            assert!(m["term"].as_u64().is_some_and(|t| t >= 1), "{status}");
            assert!(m["match_index"].as_u64().is_some(), "{status}");
            assert!(m["lag"].as_u64().is_some(), "{status}");
        }
        let table = cluster.ctl(3, &["quorum_status", &queues[0]]).await?;
        assert_eq!(table.lines().filter(|l| l.contains("leader\t")).count(), 1, "{table}");

        // peek and inspect_dead_letters asked of every node: answered by the leader
        // (forwarded by the others), the same answer everywhere.
        for id in 1..=3 {
            let out = cluster
                .ctl(id, &["peek", &queues[0], "2", "--formatter", "json"])
                .await?;
            let v: Value = serde_json::from_str(&out)?;
            assert_eq!(v["payload"], "second", "via node {id}: {v}");
            assert_eq!(v["message_count"], 0, "via node {id}: {v}");
            let out = cluster
                .ctl(id, &["inspect_dead_letters", &queues[0], "--formatter", "json"])
                .await?;
            let v: Value = serde_json::from_str(&out)?;
            assert_eq!(v["messages"], 2, "via node {id}: {v}");
            assert_eq!(v["without_death"], 2, "never dead-lettered: {v}");
        }

        let health = || {
            let out = std::process::Command::new("curl")
                .args(["-s", "-u", "guest:guest", "-w", "\n%{http_code}"])
                .arg(format!(
                    "http://{http}/api/health/checks/quorum-queues-without-elected-leaders/all-vhosts/"
                ))
                .output()
                .expect("curl");
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let (body, code) = text.rsplit_once('\n').unwrap_or(("", ""));
            (
                code.trim().parse::<u16>().unwrap_or(0),
                serde_json::from_str::<Value>(body).unwrap_or(Value::Null),
            )
        };
        let admin = |id: u64| format!("http://{}", cluster.cluster_addr(id));
        let check = |id: u64, args: &[&str]| quorumqctl(&admin(id), args);

        // All up: nothing critical, every queue led.
        for id in 1..=3 {
            let out = run(check(id, &["check_if_node_is_quorum_critical"]), CTL_TIMEOUT).await?;
            assert!(out.contains("reported no quorum queues with minimum quorum"), "{out}");
        }
        let (code, body) = health();
        assert_eq!((code, &body), (200, &serde_json::json!({"status": "ok"})));
        run(
            check(2, &["check_for_quorum_queues_without_an_elected_leader", "--across-all-vhosts"]),
            CTL_TIMEOUT,
        )
        .await?;

        // Node 3 down: each remaining node is critical for every queue.
        cluster.kill9(3);
        for id in [1u64, 2] {
            let out = wait_until_some(Duration::from_secs(30), "critical", || async {
                let out = output(
                    check(id, &["check_if_node_is_quorum_critical", "--formatter", "json"]),
                    CTL_TIMEOUT,
                )
                .await?;
                Ok((out.status.code() == Some(69)).then_some(out))
            })
            .await?;
            let v: Value = serde_json::from_slice(&out.stdout)?;
            assert_eq!(v["result"], "error", "{v}");
            let names: Vec<&str> = v["queues"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|q| q["name"].as_str())
                .collect();
            for q in &queues {
                assert!(names.contains(&q.as_str()), "node {id}: {v}");
            }
            let out = output(check(id, &["check_if_node_is_quorum_critical"]), CTL_TIMEOUT).await?;
            assert_eq!(out.status.code(), Some(69));
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(
                text.contains(&format!("queue '{}' in vhost '/' would lose quorum if node {id} is stopped", queues[0])),
                "{text}"
            );
        }
        // A majority is still up: every queue gets (or keeps) a leader.
        wait_for(Duration::from_secs(30), "leaders with node 3 down", || async {
            health().0 == 200
        })
        .await?;

        // Node 2 down too: no queue has a majority, so none an elected leader.
        cluster.kill9(2);
        let (code, body) = wait_until_some(Duration::from_secs(30), "503", || async {
            let (code, body) = health();
            Ok((code == 503).then_some((code, body)))
        })
        .await?;
        assert_eq!(code, 503);
        assert_eq!(body["status"], "failed");
        assert_eq!(body["reason"], "Detected quorum queues without an elected leader");
        let listed: Vec<&str> = body["queues"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|q| q["name"].as_str())
            .collect();
        for q in &queues {
            assert!(listed.contains(&q.as_str()), "{body}");
        }
        assert_eq!(body["queues"][0]["virtual_host"], "/");
        assert_eq!(body["queues"][0]["type"], "quorum");
        let out = output(
            check(1, &["check_for_quorum_queues_without_an_elected_leader", "--across-all-vhosts"]),
            CTL_TIMEOUT,
        )
        .await?;
        assert_eq!(out.status.code(), Some(69));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("does not have an elected leader replica or the replica was unresponsive"),
            "{text}"
        );
        Ok(())
    })
    .await
}
