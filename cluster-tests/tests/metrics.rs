//! `GET /metrics` (issue 13 item 5) against a real quorumq process, parsed by a Prometheus
//! text-format parser (`prometheus-parse`): the dead-letter counters move by reason after
//! a reject, an expiry and an overflow, the per-queue gauges show ready / unacknowledged /
//! held dead letters, and the node gauges, Raft and WAL metrics are there.

use std::collections::HashMap;
use std::time::Duration;

use cluster_tests::http::HttpBroker;
use cluster_tests::*;
use futures::StreamExt;
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, BasicRejectOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::BasicProperties;

/// One scrape: value of every sample by `name{label=value,...}` (labels sorted), histogram
/// sample counts by name.
struct Scrape(HashMap<String, f64>);

impl Scrape {
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.0
            .get(&key(
                name,
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ))
            .copied()
    }

    /// A dead-lettered counter of a reason for quorum queues and a strategy.
    fn dead_lettered(&self, reason: &str, strategy: &str) -> f64 {
        let name = format!("rabbitmq_global_messages_dead_lettered_{reason}_total");
        self.get(
            &name,
            &[
                ("dead_letter_strategy", strategy),
                ("queue_type", "rabbit_quorum_queue"),
            ],
        )
        .unwrap_or_else(|| panic!("no {name} for {strategy}"))
    }
}

fn key(name: &str, mut labels: Vec<(String, String)>) -> String {
    labels.sort();
    let l: Vec<String> = labels
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    format!("{name}{{{}}}", l.join(","))
}

async fn scrape(h: &HttpBroker) -> anyhow::Result<Scrape> {
    let out = std::process::Command::new("curl")
        .args([
            "-s",
            "-S",
            "--max-time",
            "30",
            &format!("{}/metrics", h.base),
        ])
        .output()?;
    anyhow::ensure!(out.status.success(), "curl /metrics failed");
    let text = String::from_utf8(out.stdout)?;
    let parsed = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned())))?;
    let mut values = HashMap::new();
    for s in parsed.samples {
        let labels: Vec<(String, String)> = s
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let v = match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            prometheus_parse::Value::Histogram(b) => b.last().map_or(0.0, |c| c.count),
            prometheus_parse::Value::Summary(_) => continue,
        };
        values.insert(key(&s.metric, labels), v);
    }
    anyhow::ensure!(!values.is_empty(), "no samples parsed from {text}");
    Ok(Scrape(values))
}

fn args(pairs: &[(&str, AMQPValue)]) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in pairs {
        t.insert((*k).into(), v.clone());
    }
    t
}

#[tokio::test]
async fn dead_letter_counters_move_by_reason_and_queue_gauges_follow() -> anyhow::Result<()> {
    bounded(Duration::from_secs(120), async {
        let h = HttpBroker::start().await?;
        let conn = connect(h.broker.uri()).await?;
        let ch = conn.create_channel().await?;
        ch.confirm_select(Default::default()).await?;
        let durable = QueueDeclareOptions {
            durable: true,
            ..Default::default()
        };
        let quorum = AMQPValue::LongString("quorum".into());
        let dlx = AMQPValue::LongString("amq.fanout".into());
        let (rejects, expires, overflows, sink) =
            (unique("rej"), unique("ttl"), unique("max"), unique("sink"));
        ch.queue_declare(
            sink.as_str().into(),
            durable,
            args(&[("x-queue-type", quorum.clone())]),
        )
        .await?;
        ch.queue_bind(
            sink.as_str().into(),
            "amq.fanout".into(),
            "".into(),
            Default::default(),
            FieldTable::default(),
        )
        .await?;
        ch.queue_declare(
            rejects.as_str().into(),
            durable,
            args(&[
                ("x-queue-type", quorum.clone()),
                ("x-dead-letter-exchange", dlx.clone()),
            ]),
        )
        .await?;
        ch.queue_declare(
            expires.as_str().into(),
            durable,
            args(&[
                ("x-queue-type", quorum.clone()),
                ("x-message-ttl", AMQPValue::LongInt(1)),
            ]),
        )
        .await?;
        ch.queue_declare(
            overflows.as_str().into(),
            durable,
            args(&[
                ("x-queue-type", quorum.clone()),
                ("x-max-length", AMQPValue::LongInt(1)),
            ]),
        )
        .await?;

        let before = scrape(&h).await?;
        let publish = |q: String| {
            let ch = ch.clone();
            async move {
                ch.basic_publish(
                    "".into(),
                    q.as_str().into(),
                    BasicPublishOptions::default(),
                    b"m",
                    BasicProperties::default(),
                )
                .await?
                .await?;
                anyhow::Ok(())
            }
        };
        // A reject (at-most-once to amq.fanout), an expiry (no DLX: dropped), an overflow
        // (drop-head, no DLX: dropped).
        publish(rejects.clone()).await?;
        publish(expires.clone()).await?;
        publish(overflows.clone()).await?;
        publish(overflows.clone()).await?;
        ch.basic_qos(1, BasicQosOptions::default()).await?;
        let mut consumer = ch
            .basic_consume(
                rejects.as_str().into(),
                "c".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        let d = tokio::time::timeout(Duration::from_secs(10), consumer.next())
            .await?
            .expect("a delivery")?;
        d.reject(BasicRejectOptions { requeue: false }).await?;

        // Counters are updated when the leader applies; poll for a few seconds.
        let mut after = scrape(&h).await?;
        for _ in 0..50 {
            let moved = after.dead_lettered("rejected", "at_most_once")
                > before.dead_lettered("rejected", "at_most_once")
                && after.dead_lettered("expired", "disabled")
                    > before.dead_lettered("expired", "disabled")
                && after.dead_lettered("maxlen", "disabled")
                    > before.dead_lettered("maxlen", "disabled")
                // The at-most-once publish to the DLX follows the count.
                && after.get(
                    "rabbitmq_queue_messages_ready",
                    &[("vhost", "/"), ("queue", &sink)],
                ) == Some(1.0);
            if moved {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            after = scrape(&h).await?;
        }
        assert_eq!(
            after.dead_lettered("rejected", "at_most_once")
                - before.dead_lettered("rejected", "at_most_once"),
            1.0,
            "reject"
        );
        assert_eq!(
            after.dead_lettered("expired", "disabled")
                - before.dead_lettered("expired", "disabled"),
            1.0,
            "expiry"
        );
        assert_eq!(
            after.dead_lettered("maxlen", "disabled") - before.dead_lettered("maxlen", "disabled"),
            1.0,
            "overflow"
        );
        assert_eq!(
            after.dead_lettered("delivery_limit", "disabled"),
            before.dead_lettered("delivery_limit", "disabled")
        );
        for (q, reason, strategy) in [
            (&rejects, "rejected", "at_most_once"),
            (&expires, "expired", "disabled"),
            (&overflows, "maxlen", "disabled"),
        ] {
            let by_queue = after.get(
                "quorumq_queue_messages_dead_lettered_total",
                &[
                    ("vhost", "/"),
                    ("queue", q),
                    ("reason", reason),
                    ("dead_letter_strategy", strategy),
                ],
            );
            assert_eq!(by_queue, Some(1.0), "per-queue dead-lettered of {q}");
        }
        assert!(
            after
                .get(
                    "rabbitmq_global_messages_received_total",
                    &[("protocol", "amqp091")]
                )
                .unwrap_or(0.0)
                >= 4.0
        );
        assert!(
            after
                .get(
                    "rabbitmq_global_messages_confirmed_total",
                    &[("protocol", "amqp091")]
                )
                .unwrap_or(0.0)
                >= 4.0
        );
        assert!(
            after
                .get(
                    "rabbitmq_global_messages_delivered_total",
                    &[("protocol", "amqp091")]
                )
                .unwrap_or(0.0)
                >= 1.0
        );

        // Per-queue gauges: the overflow queue holds 1 ready message, the dead-lettered
        // reject reached the sink.
        let q = |name: &str, qn: &str| after.get(name, &[("vhost", "/"), ("queue", qn)]);
        assert_eq!(q("rabbitmq_queue_messages_ready", &overflows), Some(1.0));
        assert_eq!(q("rabbitmq_queue_messages_unacked", &overflows), Some(0.0));
        assert_eq!(q("quorumq_queue_messages_dlx", &overflows), Some(0.0));
        assert_eq!(q("rabbitmq_queue_messages_delayed", &overflows), Some(0.0));
        assert_eq!(
            q("rabbitmq_queue_messages_ready", &sink),
            Some(1.0),
            "the rejected message was dead-lettered"
        );
        assert_eq!(q("quorumq_raft_leader", &sink), Some(1.0));
        assert!(q("rabbitmq_raft_term", &sink).unwrap_or(0.0) >= 1.0);
        assert!(q("rabbitmq_raft_log_last_applied_index", &sink).unwrap_or(0.0) >= 1.0);
        assert!(after.get("rabbitmq_connections", &[]).unwrap_or(0.0) >= 1.0);
        assert!(after.get("rabbitmq_channels", &[]).unwrap_or(0.0) >= 1.0);
        assert!(after.get("rabbitmq_consumers", &[]).unwrap_or(0.0) >= 1.0);
        assert!(
            after
                .get("rabbitmq_process_resident_memory_bytes", &[])
                .unwrap_or(0.0)
                > 1e6
        );
        assert!(after.get("rabbitmq_process_open_fds", &[]).unwrap_or(0.0) > 3.0);
        assert!(
            after
                .get("quorumq_wal_fsync_seconds_count", &[])
                .unwrap_or(0.0)
                >= 1.0,
            "WAL fsync histogram counts syncs"
        );
        conn.close(200, "bye".into()).await?;
        Ok(())
    })
    .await
}
