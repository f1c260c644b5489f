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
        assert_eq!(r.0, 400, "RabbitMQ 3.10.8 answers with its channel's error: {r:?}");
        assert_eq!(r.1["reason"], "404 NOT_FOUND - no exchange 'no-such-exchange' in vhost '/'");
        let r = h.guest("POST", "/api/exchanges/%2F/amq.default/publish",
            Some(&json!({"properties": {}, "routing_key": q, "payload": "x"})))?;
        assert_eq!(r.0, 400, "payload_encoding is required: {r:?}");
        assert_eq!(ready_when(&h, &q, 3).await?, 3);
        if h.is_quorumq() {
            // RabbitMQ's exchange statistics lag behind; quorumq's count at once.
            let x = h.get("/api/exchanges/%2F/amq.default")?;
            let stats = &x["message_stats"];
            assert!(stats["publish_in"].as_u64().unwrap_or(0) >= 4, "{x}");
            assert!(stats["publish_out"].as_u64().unwrap_or(0) >= 3, "{x}");
            assert!(stats["publish_in_details"]["rate"].is_number(), "{x}");
        }

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

/// The connection, its channel and consumer as `/api/connections`, `/api/channels` and
/// `/api/consumers` list them; message rates appear; DELETE closes it with 320 and the
/// `X-Reason` text.
#[tokio::test]
async fn connections_channels_and_consumers_are_listed_and_a_connection_is_closed(
) -> anyhow::Result<()> {
    use lapin::options::{
        BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, QueueDeclareOptions,
    };
    use lapin::types::{AMQPValue, FieldTable};
    bounded(Duration::from_secs(120), async {
        let h = HttpBroker::start().await?;
        let uri = h.broker.uri().to_owned();
        let label = unique("conn");
        let props =
            lapin::ConnectionProperties::default().with_connection_name(label.clone().into());
        let conn = lapin::Connection::connect(&uri, props).await?;
        let mut events = Box::pin(conn.events_listener());
        let ch = conn.create_channel().await?;
        ch.basic_qos(7, BasicQosOptions::default()).await?;
        let q = unique("conn.q");
        ch.queue_declare(
            q.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await?;
        let mut cargs = FieldTable::default();
        cargs.insert("x-priority".into(), AMQPValue::LongInt(3));
        let _consumer = ch
            .basic_consume(
                q.as_str().into(),
                "ctag-1".into(),
                BasicConsumeOptions {
                    no_ack: true,
                    ..Default::default()
                },
                cargs,
            )
            .await?;

        // Publish for ~6 s so that two samples 5 s apart see them.
        let publisher = conn.create_channel().await?;
        let until = std::time::Instant::now() + Duration::from_secs(6);
        let mut sent = 0u64;
        while std::time::Instant::now() < until {
            publisher
                .basic_publish(
                    "".into(),
                    q.as_str().into(),
                    BasicPublishOptions::default(),
                    b"x",
                    lapin::BasicProperties::default(),
                )
                .await?;
            sent += 1;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        let ours = loop {
            let list = h.get("/api/connections")?;
            let ours = list
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["user_provided_name"] == label.as_str())
                .cloned();
            if let Some(c) = ours {
                let rate = c["message_stats"]["publish_details"]["rate"]
                    .as_f64()
                    .or(c["recv_oct_details"]["rate"].as_f64())
                    .unwrap_or(0.0);
                if rate > 0.0 || std::time::Instant::now() > deadline {
                    break c;
                }
            }
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "our connection is not listed: {list}"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        let name = ours["name"].as_str().unwrap_or("").to_owned();
        let (peer, local) = name.split_once(" -> ").expect("PEER -> LOCAL");
        assert!(
            peer.starts_with("127.0.0.1:") && local.starts_with("127.0.0.1:"),
            "{name}"
        );
        assert_eq!(ours["peer_host"], "127.0.0.1");
        assert_eq!(format!("127.0.0.1:{}", ours["peer_port"]), peer);
        assert_eq!(ours["user"], "guest");
        assert_eq!(ours["vhost"], "/");
        assert_eq!(ours["state"], "running");
        assert_eq!(ours["protocol"], "AMQP 0-9-1");
        assert_eq!(ours["channels"], 2);
        assert_eq!(ours["auth_mechanism"], "PLAIN");
        assert!(
            ours["connected_at"].as_u64().unwrap_or(0) > 1_600_000_000_000,
            "{ours}"
        );
        assert_eq!(ours["client_properties"]["connection_name"], label.as_str());
        assert!(
            ours["client_properties"]["capabilities"].is_object(),
            "{ours}"
        );
        if h.is_quorumq() {
            // RabbitMQ's connections carry byte counts and their rates instead.
            assert!(
                ours["message_stats"]["publish"].as_u64().unwrap_or(0) >= sent - 1,
                "{ours}"
            );
            assert!(
                ours["message_stats"]["publish_details"]["rate"]
                    .as_f64()
                    .unwrap_or(0.0)
                    > 0.0,
                "{ours}"
            );
        }
        let one = h.get(&format!(
            "/api/connections/{}",
            name.replace(' ', "%20").replace('>', "%3E")
        ))?;
        assert_eq!(one["name"], name.as_str());
        assert_eq!(
            h.get("/api/vhosts/%2F/connections")?
                .as_array()
                .map(|a| a.iter().any(|c| c["name"] == name.as_str())),
            Some(true)
        );

        let chans = h.get("/api/channels")?;
        let mine: Vec<&Value> = chans
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["connection_details"]["name"] == name.as_str())
            .collect();
        assert_eq!(mine.len(), 2, "{chans}");
        let c1 = mine.iter().find(|c| c["number"] == 1).expect("channel 1");
        assert_eq!(c1["name"], format!("{name} (1)").as_str());
        assert_eq!(c1["prefetch_count"], 7);
        assert_eq!(c1["consumer_count"], 1);
        assert_eq!(c1["state"], "running");
        assert!(
            c1["message_stats"]["deliver_get"].as_u64().unwrap_or(0) > 0,
            "{c1}"
        );

        let consumers = h.get("/api/consumers")?;
        let k = consumers
            .as_array()
            .unwrap()
            .iter()
            .find(|k| k["consumer_tag"] == "ctag-1")
            .expect("our consumer")
            .clone();
        assert_eq!(k["queue"], json!({"name": q, "vhost": "/"}));
        assert_eq!(k["ack_required"], false);
        assert_eq!(k["exclusive"], false);
        assert_eq!(k["prefetch_count"], 7);
        assert_eq!(k["arguments"]["x-priority"], 3);
        assert_eq!(k["channel_details"]["connection_name"], name.as_str());
        assert_eq!(k["channel_details"]["number"], 1);
        assert_eq!(
            h.get("/api/consumers/%2F")?
                .as_array()
                .map(|a| a.iter().any(|k| k["consumer_tag"] == "ctag-1")),
            Some(true)
        );

        if h.is_quorumq() {
            // The queue's counts through this node: every publish, every delivery.
            let qv = h.get(&format!("/api/queues/%2F/{q}"))?;
            assert!(
                qv["message_stats"]["publish"].as_u64().unwrap_or(0) >= sent - 1,
                "{qv}"
            );
            assert!(
                qv["message_stats"]["deliver_get"].as_u64().unwrap_or(0) >= sent - 1,
                "{qv}"
            );
            assert!(
                qv["message_stats"]["publish_details"]["rate"].is_number(),
                "{qv}"
            );
        }
        let overview = h.get("/api/overview")?;
        assert!(
            overview["object_totals"]["channels"].as_u64().unwrap_or(0) >= 2,
            "{overview}"
        );
        assert!(
            overview["message_stats"]["publish"].as_u64().unwrap_or(0) >= sent - 1,
            "{overview}"
        );
        let vh = h.get("/api/vhosts/%2F")?;
        assert!(
            vh["messages"].is_u64() && vh["messages_ready"].is_u64(),
            "{vh}"
        );

        // Close it with a reason.
        let url = format!(
            "{}/api/connections/{}",
            h.base,
            name.replace(' ', "%20").replace('>', "%3E")
        );
        let out = std::process::Command::new("curl")
            .args([
                "-s",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "-u",
                "guest:guest",
                "-X",
                "DELETE",
                "-H",
                "X-Reason: maintenance now",
                &url,
            ])
            .output()?;
        assert_eq!(String::from_utf8_lossy(&out.stdout), "204");
        let e = loop {
            use futures::StreamExt;
            match tokio::time::timeout(Duration::from_secs(10), events.next()).await? {
                Some(lapin::Event::Error(e)) => break e,
                Some(_) => continue,
                None => anyhow::bail!("no error event"),
            }
        };
        assert_eq!(
            amqp_error(&e),
            Some((320, "CONNECTION_FORCED - maintenance now".to_owned())),
            "{e:?}"
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while h
            .get("/api/connections")?
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["name"] == name.as_str())
        {
            anyhow::ensure!(std::time::Instant::now() < deadline, "still listed");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let r = h.guest(
            "DELETE",
            &format!(
                "/api/connections/{}",
                name.replace(' ', "%20").replace('>', "%3E")
            ),
            None,
        )?;
        assert_eq!(r.0, 404, "{r:?}");
        Ok(())
    })
    .await
}

/// `GET /api/queues/V/Q/bindings`, `/api/exchanges/V/E/bindings/source` and
/// `/destination` list the bindings of one queue or exchange (the queue's
/// implicit default-exchange binding first), as RabbitMQ 3.10.8 answers them
/// (checked against it with `QUORUMQ_TEST_HTTP`).
#[tokio::test]
async fn bindings_of_one_queue_or_exchange() -> anyhow::Result<()> {
    bounded(Duration::from_secs(60), async {
        let h = HttpBroker::start().await?;
        let (x, x2, q) = (unique("bq.x"), unique("bq.x2"), unique("bq.q"));
        for e in [&x, &x2] {
            let r = h.guest(
                "PUT",
                &format!("/api/exchanges/%2F/{e}"),
                Some(&json!({"type": "direct"})),
            )?;
            assert!(r.0 == 201 || r.0 == 204, "{r:?}");
        }
        let r = h.guest(
            "PUT",
            &format!("/api/queues/%2F/{q}"),
            Some(&json!({"durable": true, "arguments": {"x-queue-type": "quorum"}})),
        )?;
        assert!(r.0 == 201 || r.0 == 204, "{r:?}");
        let bind = |path: String, key: &str| {
            h.guest("POST", &path, Some(&json!({"routing_key": key})))
                .map(|r| r.0)
        };
        assert_eq!(bind(format!("/api/bindings/%2F/e/{x}/q/{q}"), "k1")?, 201);
        assert_eq!(bind(format!("/api/bindings/%2F/e/{x}/e/{x2}"), "k2")?, 201);

        let of_q = h.get(&format!("/api/queues/%2F/{q}/bindings"))?;
        let of_q = of_q.as_array().cloned().unwrap_or_default();
        assert_eq!(of_q.len(), 2, "{of_q:?}");
        assert_eq!(of_q[0]["source"], "", "the default exchange's first");
        assert_eq!(of_q[0]["routing_key"], q.as_str());
        assert_eq!(of_q[1]["source"], x.as_str());
        assert_eq!(of_q[1]["routing_key"], "k1");

        let from_x = h.get(&format!("/api/exchanges/%2F/{x}/bindings/source"))?;
        let mut dests: Vec<(String, String)> = from_x
            .as_array()
            .unwrap_or(&Vec::new())
            .iter()
            .map(|b| {
                (
                    b["destination"].as_str().unwrap_or("").to_owned(),
                    b["destination_type"].as_str().unwrap_or("").to_owned(),
                )
            })
            .collect();
        dests.sort();
        let mut want = vec![
            (q.clone(), "queue".to_owned()),
            (x2.clone(), "exchange".to_owned()),
        ];
        want.sort();
        assert_eq!(dests, want, "{from_x}");
        let to_x2 = h.get(&format!("/api/exchanges/%2F/{x2}/bindings/destination"))?;
        assert_eq!(to_x2.as_array().map(Vec::len), Some(1), "{to_x2}");
        assert_eq!(to_x2[0]["source"], x.as_str());
        assert_eq!(
            h.get(&format!("/api/exchanges/%2F/{x2}/bindings/source"))?,
            json!([])
        );

        // RabbitMQ 3.10.8: 200 for objects that do not exist; a missing
        // queue still shows its implicit default-exchange binding.
        let missing_q = h.get(&format!("/api/queues/%2F/{q}-missing/bindings"))?;
        assert_eq!(missing_q.as_array().map(Vec::len), Some(1), "{missing_q}");
        assert_eq!(missing_q[0]["source"], "");
        for missing in [
            format!("/api/exchanges/%2F/{x}-missing/bindings/source"),
            format!("/api/exchanges/%2F/{x}-missing/bindings/destination"),
            format!("/api/queues/no-such-vhost/{q}/bindings"),
        ] {
            assert_eq!(h.get(&missing)?, json!([]), "{missing}");
        }
        let implicit = h.get("/api/exchanges/%2F/amq.default/bindings/source")?;
        assert!(
            implicit
                .as_array()
                .is_some_and(|a| a.iter().any(|b| b["destination"] == q.as_str())),
            "{implicit}"
        );
        Ok(())
    })
    .await
}
