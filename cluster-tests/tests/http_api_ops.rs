//! The management API's operator actions (issue 30 item 1) with curl against a real
//! quorumq process: get messages in each `ackmode`, publish, purge, delete a binding by
//! its `properties_key`, delete a missing exchange; replies as RabbitMQ 3.10.8's
//! management plugin gives them (checked by hand against the installed 3.10.8). With
//! `QUORUMQ_TEST_HTTP` / `QUORUMQ_TEST_URI` they run against RabbitMQ itself.

use std::time::Duration;

use cluster_tests::http::HttpBroker;
use cluster_tests::*;
use serde_json::{json, Value};

/// `messages_ready` of queue `q` in `/` once it equals `want` (RabbitMQ's statistics lag
/// up to 5 s), at most 20 s; the last value seen.
async fn ready_when(h: &HttpBroker, q: &str, want: u64) -> anyhow::Result<u64> {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let v = h.get(&format!("/api/queues/%2F/{q}"))?;
        let n = v["messages_ready"].as_u64().unwrap_or(u64::MAX);
        if n == want || std::time::Instant::now() > deadline {
            return Ok(n);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn publish(h: &HttpBroker, exchange: &str, key: &str, payload: &str) -> anyhow::Result<Value> {
    let body = json!({"properties": {"headers": {"h": "v"}, "delivery_mode": 2},
                      "routing_key": key, "payload": payload, "payload_encoding": "string"});
    let r = h.guest(
        "POST",
        &format!("/api/exchanges/%2F/{exchange}/publish"),
        Some(&body),
    )?;
    anyhow::ensure!(r.0 == 200, "publish: {r:?}");
    Ok(r.1)
}

fn get(h: &HttpBroker, q: &str, body: Value) -> anyhow::Result<Vec<Value>> {
    let r = h.guest("POST", &format!("/api/queues/%2F/{q}/get"), Some(&body))?;
    anyhow::ensure!(r.0 == 200, "get: {r:?}");
    Ok(r.1.as_array().cloned().unwrap_or_default())
}

fn payloads(items: &[Value]) -> Vec<&str> {
    items.iter().filter_map(|i| i["payload"].as_str()).collect()
}

#[tokio::test]
async fn get_in_every_ackmode_publish_and_purge_behave_as_rabbitmq() -> anyhow::Result<()> {
    bounded(Duration::from_secs(120), async {
        let h = HttpBroker::start().await?;
        let q = unique("ops.q");
        let dlq = unique("ops.dlq");
        let qtype = json!({"durable": true, "arguments": {"x-queue-type": "quorum"}});
        assert_eq!(h.guest("PUT", &format!("/api/queues/%2F/{dlq}"), Some(&qtype))?.0, 201);
        let args = json!({"durable": true, "arguments": {"x-queue-type": "quorum",
            "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq}});
        assert_eq!(h.guest("PUT", &format!("/api/queues/%2F/{q}"), Some(&args))?.0, 201);

        // Publish through the default exchange, by its API name amq.default.
        for p in ["m1", "m2", "m3"] {
            assert_eq!(publish(&h, "amq.default", &q, p)?, json!({"routed": true}));
        }
        assert_eq!(publish(&h, "amq.default", "no-such-queue", "x")?, json!({"routed": false}));
        let r = h.guest("POST", "/api/exchanges/%2F/no-such-exchange/publish",
            Some(&json!({"properties": {}, "routing_key": "", "payload": "", "payload_encoding": "string"})))?;
        assert_eq!(r.0, 404, "{r:?}");
        let r = h.guest("POST", "/api/exchanges/%2F/amq.default/publish",
            Some(&json!({"properties": {}, "routing_key": q, "payload": "x"})))?;
        assert_eq!(r.0, 400, "payload_encoding is required: {r:?}");
        assert_eq!(ready_when(&h, &q, 3).await?, 3);

        // ack_requeue_true: the messages are taken, then returned (redelivered next time).
        let items = get(&h, &q, json!({"count": 2, "ackmode": "ack_requeue_true", "encoding": "auto"}))?;
        assert_eq!(payloads(&items), ["m1", "m2"]);
        let first = &items[0];
        assert_eq!(first["redelivered"], false);
        assert_eq!(first["exchange"], "");
        assert_eq!(first["routing_key"], q.as_str());
        assert_eq!(first["message_count"], 2, "ready messages left behind it");
        assert_eq!(first["payload_bytes"], 2);
        assert_eq!(first["payload_encoding"], "string");
        assert_eq!(first["properties"]["delivery_mode"], 2);
        assert_eq!(first["properties"]["headers"]["h"], "v");
        assert_eq!(items[1]["message_count"], 1);
        assert_eq!(ready_when(&h, &q, 3).await?, 3, "ack_requeue_true leaves them in the queue");
        let items = get(&h, &q, json!({"count": "5", "ackmode": "ack_requeue_true", "encoding": "auto"}))?;
        assert_eq!(items.len(), 3, "count as text, as rabbitmqadmin sends it: {items:?}");
        let m1 = items.iter().find(|i| i["payload"] == "m1").expect("m1");
        assert_eq!(m1["redelivered"], true, "{m1}");
        assert_eq!(m1["properties"]["headers"]["x-delivery-count"], 1, "{m1}");

        // reject_requeue_true: still there.
        let items = get(&h, &q, json!({"count": 1, "ackmode": "reject_requeue_true", "encoding": "auto"}))?;
        assert_eq!(items.len(), 1);
        assert_eq!(ready_when(&h, &q, 3).await?, 3);

        // ack_requeue_false: gone; base64 and truncate.
        let items = get(&h, &q, json!({"count": 1, "ackmode": "ack_requeue_false", "encoding": "base64", "truncate": 1}))?;
        assert_eq!(items.len(), 1);
        assert_eq!(items[0]["payload_encoding"], "base64");
        assert_eq!(items[0]["payload_bytes"], 2, "the whole body's size");
        assert_eq!(items[0]["payload"], "bQ==", "the first byte, 'm', in base64");
        assert_eq!(ready_when(&h, &q, 2).await?, 2);

        // reject_requeue_false: dead-lettered (reason rejected) to the DLQ.
        let items = get(&h, &q, json!({"count": 1, "ackmode": "reject_requeue_false", "encoding": "auto"}))?;
        assert_eq!(items.len(), 1);
        assert_eq!(ready_when(&h, &q, 1).await?, 1);
        assert_eq!(ready_when(&h, &dlq, 1).await?, 1);
        let dead = get(&h, &dlq, json!({"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"}))?;
        assert_eq!(dead[0]["payload"], items[0]["payload"]);
        assert_eq!(dead[0]["properties"]["headers"]["x-death"][0]["reason"], "rejected", "{dead:?}");

        // Errors: unknown encoding 400, missing key 400, missing queue 404; an empty
        // queue answers [].
        let r = h.guest("POST", &format!("/api/queues/%2F/{q}/get"),
            Some(&json!({"count": 1, "ackmode": "ack_requeue_true", "encoding": "hex"})))?;
        assert_eq!(r.0, 400, "{r:?}");
        assert_eq!(r.1["reason"], "Unsupported encoding. Please use auto or base64.");
        let r = h.guest("POST", &format!("/api/queues/%2F/{q}/get"),
            Some(&json!({"count": 1, "encoding": "auto"})))?;
        assert_eq!(r.0, 400, "{r:?}");
        let r = h.guest("POST", "/api/queues/%2F/no-such-queue/get",
            Some(&json!({"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"})))?;
        assert_eq!(r.0, 404, "{r:?}");
        assert_eq!(get(&h, &dlq, json!({"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"}))?, Vec::<Value>::new());

        // Purge: 204, the ready messages gone; a missing queue 404.
        let r = h.guest("DELETE", &format!("/api/queues/%2F/{q}/contents"), None)?;
        assert_eq!(r.0, 204, "{r:?}");
        assert_eq!(ready_when(&h, &q, 0).await?, 0);
        assert_eq!(h.guest("DELETE", "/api/queues/%2F/no-such-queue/contents", None)?.0, 404);

        for name in [&q, &dlq] {
            h.guest("DELETE", &format!("/api/queues/%2F/{name}"), None)?;
        }
        Ok(())
    })
    .await
}

#[tokio::test]
async fn bindings_are_deleted_by_properties_key_and_missing_exchanges_are_404() -> anyhow::Result<()>
{
    bounded(Duration::from_secs(120), async {
        let h = HttpBroker::start().await?;
        let ex = unique("ops.ex");
        let ex2 = unique("ops.ex2");
        let q = unique("ops.bq");
        for e in [&ex, &ex2] {
            let r = h.guest(
                "PUT",
                &format!("/api/exchanges/%2F/{e}"),
                Some(&json!({"type": "direct"})),
            )?;
            assert_eq!(r.0, 201, "{r:?}");
        }
        assert_eq!(
            h.guest(
                "PUT",
                &format!("/api/queues/%2F/{q}"),
                Some(&json!({"durable": true}))
            )?
            .0,
            201
        );
        let bind = |key: &str, args: Value| {
            h.guest(
                "POST",
                &format!("/api/bindings/%2F/e/{ex}/q/{q}"),
                Some(&json!({"routing_key": key, "arguments": args})),
            )
        };
        assert_eq!(bind("", json!({}))?.0, 201);
        assert_eq!(bind("a b", json!({}))?.0, 201);
        assert_eq!(bind("k", json!({"x-any": "v"}))?.0, 201);
        let r = h.guest(
            "POST",
            &format!("/api/bindings/%2F/e/{ex}/e/{ex2}"),
            Some(&json!({"routing_key": "r"})),
        )?;
        assert_eq!(r.0, 201, "{r:?}");

        let list = h.get(&format!("/api/bindings/%2F/e/{ex}/q/{q}"))?;
        let mut keys: Vec<String> = list
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["properties_key"].as_str().unwrap_or("").to_owned())
            .collect();
        keys.sort();
        assert_eq!(keys.len(), 3, "{list}");
        assert_eq!(keys[0], "a+b", "{keys:?}");
        assert!(
            keys[1].starts_with("k~"),
            "arguments add a digest: {keys:?}"
        );
        assert_eq!(keys[2], "~");

        // GET one, DELETE it (the key URL-encoded in the path), then it is 404.
        let one = h.get(&format!("/api/bindings/%2F/e/{ex}/q/{q}/a%2Bb"))?;
        assert_eq!(one["routing_key"], "a b");
        for key in ["~", "a%2Bb", &keys[1]] {
            let r = h.guest(
                "DELETE",
                &format!("/api/bindings/%2F/e/{ex}/q/{q}/{key}"),
                None,
            )?;
            assert_eq!(r.0, 204, "{key}: {r:?}");
        }
        let r = h.guest("DELETE", &format!("/api/bindings/%2F/e/{ex}/q/{q}/~"), None)?;
        assert_eq!(r.0, 404, "{r:?}");
        assert_eq!(
            h.get(&format!("/api/bindings/%2F/e/{ex}/q/{q}"))?,
            json!([])
        );
        let r = h.guest(
            "DELETE",
            &format!("/api/bindings/%2F/e/{ex}/e/{ex2}/r"),
            None,
        )?;
        assert_eq!(r.0, 204, "{r:?}");

        // Deleting a missing exchange: 404 (it was 204).
        for e in [&ex, &ex2] {
            assert_eq!(
                h.guest("DELETE", &format!("/api/exchanges/%2F/{e}"), None)?
                    .0,
                204
            );
        }
        let r = h.guest("DELETE", &format!("/api/exchanges/%2F/{ex}"), None)?;
        assert_eq!(r.0, 404, "{r:?}");
        assert_eq!(r.1["error"], "Object Not Found");
        h.guest("DELETE", &format!("/api/queues/%2F/{q}"), None)?;
        Ok(())
    })
    .await
}
