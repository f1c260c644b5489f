//! The metric families RabbitMQ's Grafana dashboards (RabbitMQ-Overview,
//! RabbitMQ-Quorum-Queues-Raft) query, scraped from a real quorumq after real AMQP traffic
//! (issue 30 item 4): identity and build info, uptime, limits, churn, delivery and get
//! counters by ack mode, unroutable, confirm, publishers/consumers, queues this node
//! leads, Raft term and commit index; `/metrics/per-object` and `/metrics/detailed`.

use std::collections::HashMap;
use std::time::Duration;

use cluster_tests::http::HttpBroker;
use cluster_tests::*;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicGetOptions, BasicPublishOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::BasicProperties;

/// `name{label=value,...}` (labels sorted) → value of every sample at `path`.
fn scrape(h: &HttpBroker, path: &str) -> anyhow::Result<(HashMap<String, f64>, String)> {
    let out = std::process::Command::new("curl")
        .args(["-s", "-S", "--max-time", "30", &format!("{}{path}", h.base)])
        .output()?;
    anyhow::ensure!(out.status.success(), "curl {path} failed");
    let text = String::from_utf8(out.stdout)?;
    let parsed = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned())))?;
    let mut values = HashMap::new();
    for s in parsed.samples {
        let mut labels: Vec<String> = s.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        labels.sort();
        let v = match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            _ => continue,
        };
        values.insert(format!("{}{{{}}}", s.metric, labels.join(",")), v);
    }
    Ok((values, text))
}

fn v(m: &HashMap<String, f64>, key: &str) -> f64 {
    *m.get(key).unwrap_or_else(|| panic!("no sample {key}"))
}

#[tokio::test]
async fn the_dashboards_families_follow_real_traffic() -> anyhow::Result<()> {
    bounded(Duration::from_secs(120), async {
        let h = HttpBroker::start().await?;
        let conn = connect(h.broker.uri()).await?;
        let ch = conn.create_channel().await?;
        ch.confirm_select(Default::default()).await?;
        let q = unique("dash");
        let mut qargs = FieldTable::default();
        qargs.insert(
            "x-queue-type".into(),
            AMQPValue::LongString("quorum".into()),
        );
        let durable = QueueDeclareOptions {
            durable: true,
            ..Default::default()
        };
        ch.queue_declare(q.as_str().into(), durable, qargs.clone())
            .await?;
        ch.queue_declare(q.as_str().into(), durable, qargs).await?;
        for _ in 0..3 {
            ch.basic_publish(
                "".into(),
                q.as_str().into(),
                BasicPublishOptions::default(),
                b"m",
                BasicProperties::default(),
            )
            .await?
            .await?;
        }
        ch.basic_publish(
            "".into(),
            "nowhere".into(),
            BasicPublishOptions::default(),
            b"x",
            BasicProperties::default(),
        )
        .await?
        .await?;
        let mandatory = BasicPublishOptions {
            mandatory: true,
            ..Default::default()
        };
        ch.basic_publish(
            "".into(),
            "nowhere".into(),
            mandatory,
            b"x",
            BasicProperties::default(),
        )
        .await?
        .await?;
        let got = ch
            .basic_get(q.as_str().into(), BasicGetOptions { no_ack: true })
            .await?;
        anyhow::ensure!(got.is_some(), "get auto ack");
        let got = ch
            .basic_get(q.as_str().into(), BasicGetOptions { no_ack: false })
            .await?;
        let Some(got) = got else {
            anyhow::bail!("get manual ack")
        };
        got.delivery.ack(BasicAckOptions::default()).await?;
        let consumer_ch = conn.create_channel().await?;
        let mut consumer = consumer_ch
            .basic_consume(
                q.as_str().into(),
                "dash".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        use futures::StreamExt;
        let d = tokio::time::timeout(Duration::from_secs(10), consumer.next())
            .await?
            .expect("a delivery")?;
        d.ack(BasicAckOptions::default()).await?;
        let empty = ch
            .basic_get(q.as_str().into(), BasicGetOptions { no_ack: true })
            .await?;
        anyhow::ensure!(empty.is_none(), "the queue is empty now");

        let (m, text) = scrape(&h, "/metrics")?;
        let node = text
            .lines()
            .find(|l| l.starts_with("rabbitmq_identity_info{"))
            .expect("rabbitmq_identity_info");
        assert!(
            node.contains("rabbitmq_node=\"quorumq@")
                && node.contains("rabbitmq_cluster=\"quorumq-"),
            "{node}"
        );
        assert!(node.ends_with(" 1"), "{node}");
        assert!(
            text.contains("rabbitmq_build_info{") && text.contains("rabbitmq_version=\"3.10.8\"")
        );
        assert!(v(&m, "rabbitmq_erlang_uptime_seconds{}") > 0.0);
        assert!(v(&m, "rabbitmq_resident_memory_limit_bytes{}") > 0.0);
        assert!(v(&m, "rabbitmq_disk_space_available_bytes{}") > 0.0);
        assert!(v(&m, "rabbitmq_disk_space_available_limit_bytes{}") > 0.0);
        assert!(v(&m, "rabbitmq_process_max_fds{}") >= v(&m, "rabbitmq_process_open_fds{}"));
        assert_eq!(v(&m, "rabbitmq_connections_opened_total{}"), 1.0);
        assert_eq!(v(&m, "rabbitmq_channels_opened_total{}"), 2.0);
        assert_eq!(v(&m, "rabbitmq_queues_declared_total{}"), 2.0);
        assert_eq!(v(&m, "rabbitmq_queues_created_total{}"), 1.0);
        assert_eq!(
            v(
                &m,
                "rabbitmq_global_messages_received_confirm_total{protocol=amqp091}"
            ),
            5.0
        );
        assert_eq!(
            v(
                &m,
                "rabbitmq_global_messages_unroutable_dropped_total{protocol=amqp091}"
            ),
            1.0
        );
        assert_eq!(
            v(
                &m,
                "rabbitmq_global_messages_unroutable_returned_total{protocol=amqp091}"
            ),
            1.0
        );
        assert_eq!(
            v(
                &m,
                "rabbitmq_global_messages_delivered_get_auto_ack_total{protocol=amqp091}"
            ),
            1.0
        );
        assert_eq!(
            v(
                &m,
                "rabbitmq_global_messages_delivered_get_manual_ack_total{protocol=amqp091}"
            ),
            1.0
        );
        assert_eq!(
            v(
                &m,
                "rabbitmq_global_messages_delivered_consume_manual_ack_total{protocol=amqp091}"
            ),
            1.0
        );
        assert_eq!(
            v(
                &m,
                "rabbitmq_global_messages_delivered_consume_auto_ack_total{protocol=amqp091}"
            ),
            0.0
        );
        assert_eq!(
            v(
                &m,
                "rabbitmq_global_messages_get_empty_total{protocol=amqp091}"
            ),
            1.0
        );
        assert_eq!(v(&m, "rabbitmq_global_publishers{protocol=amqp091}"), 1.0);
        assert_eq!(v(&m, "rabbitmq_global_consumers{protocol=amqp091}"), 1.0);
        assert_eq!(v(&m, "rabbitmq_queues{}"), 1.0, "the queue this node leads");
        let ql = format!("queue={q},vhost=/");
        assert!(v(&m, &format!("rabbitmq_raft_term{{{ql}}}")) >= 1.0);
        assert!(v(&m, &format!("rabbitmq_raft_commit_index{{{ql}}}")) >= 1.0);
        // RabbitMQ 4.2's Raft names beside the 3.x ones, a measured commit latency.
        assert_eq!(
            v(&m, &format!("rabbitmq_raft_last_written_index{{{ql}}}")),
            v(&m, &format!("rabbitmq_raft_log_last_written_index{{{ql}}}"))
        );
        assert!(v(&m, &format!("rabbitmq_raft_log_commit_index{{{ql}}}")) >= 1.0);
        assert!(v(&m, &format!("rabbitmq_raft_commit_latency_seconds{{{ql}}}")) > 0.0);
        assert!(node.contains("rabbitmq_endpoint=\"aggregated\""), "{node}");
        // Five 1-byte bodies published (three routed, two unroutable), RabbitMQ's buckets.
        assert!(
            text.contains(
                "rabbitmq_message_size_bytes_bucket{protocol=\"amqp091\",le=\"100.0\"} 5\n"
            ) && text.contains(
                "rabbitmq_message_size_bytes_bucket{protocol=\"amqp091\",le=\"1e+06\"} 5\n"
            ) && text.contains("rabbitmq_message_size_bytes_sum{protocol=\"amqp091\"} 5\n"),
            "{text}"
        );

        // /metrics/per-object: the same series, endpoint per-object.
        let (_, per_object) = scrape(&h, "/metrics/per-object")?;
        assert!(per_object.contains("rabbitmq_endpoint=\"per-object\""));
        assert!(per_object.contains("rabbitmq_queue_messages_ready{"));
        // /metrics/detailed: only the asked families, detailed names.
        let (d, detailed) = scrape(
            &h,
            "/metrics/detailed?family=queue_coarse_metrics&family=connection_churn_metrics",
        )?;
        assert!(
            detailed.contains("rabbitmq_endpoint=\"detailed\""),
            "{detailed}"
        );
        assert_eq!(
            v(
                &d,
                &format!("rabbitmq_detailed_queue_messages_ready{{{ql}}}")
            ),
            0.0
        );
        assert_eq!(v(&d, "rabbitmq_detailed_connections_opened_total{}"), 1.0);
        assert!(!detailed.contains("rabbitmq_global_"), "{detailed}");
        assert!(
            !detailed.contains("rabbitmq_detailed_queue_consumers"),
            "not asked: {detailed}"
        );

        ch.queue_delete(q.as_str().into(), QueueDeleteOptions::default())
            .await?;
        conn.close(200, "bye".into()).await?;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let (m, _) = scrape(&h, "/metrics")?;
            if v(&m, "rabbitmq_connections_closed_total{}") == 1.0 {
                assert_eq!(v(&m, "rabbitmq_channels_closed_total{}"), 2.0);
                assert_eq!(v(&m, "rabbitmq_queues_deleted_total{}"), 1.0);
                assert_eq!(v(&m, "rabbitmq_queues{}"), 0.0);
                break;
            }
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "connection close not counted"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(())
    })
    .await
}
