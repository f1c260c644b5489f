//! The management HTTP API (issue 13 item 4) with curl against a real quorumq process:
//! every route, RabbitMQ 3.10.8's JSON shapes and status codes, the management tags, and a
//! definitions round trip from a file exported by RabbitMQ 3.10.8
//! (`tests/data/rabbitmq-3.10.8-definitions.json`: `GET /api/definitions` of the installed
//! 3.10.8 after creating its objects). With `QUORUMQ_TEST_HTTP=http://127.0.0.1:15672
//! QUORUMQ_TEST_URI=amqp://guest:guest@127.0.0.1:5672/%2f` the same tests run against
//! RabbitMQ 3.10.8 with its management plugin (they pass there).

use std::time::Duration;

use cluster_tests::http::HttpBroker;
use cluster_tests::*;
use lapin::options::{BasicPublishOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::BasicProperties;
use serde_json::{json, Value};

/// `GET path` until `ready` holds for it (RabbitMQ's management statistics lag up to its
/// 5 s collection interval; quorumq's counts are current), at most 20 s; the last answer.
async fn get_when(
    h: &HttpBroker,
    path: &str,
    ready: impl Fn(&Value) -> bool,
) -> anyhow::Result<Value> {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let v = h.get(path)?;
        if ready(&v) || std::time::Instant::now() > deadline {
            return Ok(v);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn names(list: &Value, key: &str) -> Vec<String> {
    list.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|o| o.get(key).and_then(Value::as_str).map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Every route: create through the API, read back in RabbitMQ's shapes, delete.
#[tokio::test]
async fn every_route_creates_reads_and_deletes_with_rabbitmqs_shapes() -> anyhow::Result<()> {
    bounded(Duration::from_secs(120), async {
        let h = HttpBroker::start().await?;
        let vh = unique("vh");
        let user = unique("user");
        let (ex, q, pol) = ("ex.api", "q.api", "pol.api");
        let enc = |s: &str| s.replace('/', "%2F");

        // Create: vhost, user, permissions, exchange, queue, binding, policy.
        assert_eq!(h.guest("PUT", &format!("/api/vhosts/{vh}"), Some(&json!({})))?.0, 201);
        assert_eq!(h.guest("PUT", &format!("/api/vhosts/{vh}"), Some(&json!({})))?.0, 204, "existing vhost");
        let body = json!({"password": "pw", "tags": "management"});
        assert_eq!(h.guest("PUT", &format!("/api/users/{user}"), Some(&body))?.0, 201);
        let perms = json!({"configure": ".*", "write": ".*", "read": ".*"});
        let r = h.guest("PUT", &format!("/api/permissions/{vh}/guest"), Some(&perms))?;
        assert_eq!(r.0, 204, "the vhost's creator has full permissions already: {r:?}");
        let r = h.guest("PUT", &format!("/api/permissions/{vh}/{user}"), Some(&perms))?;
        assert_eq!(r.0, 201, "{r:?}");
        let r = h.guest("PUT", &format!("/api/exchanges/{vh}/{ex}"), Some(&json!({"type": "fanout", "durable": true})))?;
        assert_eq!(r.0, 201, "{r:?}");
        let qargs = json!({"durable": true, "arguments": {"x-queue-type": "quorum", "x-dead-letter-exchange": ex}});
        let r = h.guest("PUT", &format!("/api/queues/{vh}/{q}"), Some(&qargs))?;
        assert_eq!(r.0, 201, "{r:?}");
        assert_eq!(h.guest("PUT", &format!("/api/queues/{vh}/{q}"), Some(&qargs))?.0, 204, "equivalent redeclare");
        let r = h.guest("PUT", &format!("/api/queues/{vh}/{q}"), Some(&json!({"durable": true, "arguments": {"x-queue-type": "quorum"}})))?;
        assert_eq!(r.0, 400, "inequivalent redeclare: {r:?}");
        assert_eq!(r.1["error"], "bad_request");
        assert!(r.1["reason"].as_str().unwrap_or("").contains("inequivalent arg 'x-dead-letter-exchange'"), "{r:?}");
        let r = h.guest("POST", &format!("/api/bindings/{vh}/e/{ex}/q/{q}"), Some(&json!({"routing_key": "k", "arguments": {}})))?;
        assert_eq!(r.0, 201, "{r:?}");
        let pdef = json!({"pattern": "^q\\.api$", "definition": {"max-length": 5}, "priority": 2, "apply-to": "queues"});
        assert_eq!(h.guest("PUT", &format!("/api/policies/{vh}/{pol}"), Some(&pdef))?.0, 201);
        assert_eq!(h.guest("PUT", &format!("/api/policies/{vh}/{pol}"), Some(&pdef))?.0, 204);
        let r = h.guest("PUT", &format!("/api/policies/{vh}/bad"), Some(&json!({"pattern": "x", "definition": {"nope": 1}})))?;
        assert_eq!(r.0, 400, "unknown policy key: {r:?}");
        assert!(r.1["reason"].as_str().unwrap_or("").contains("are not recognised policy settings"), "{r:?}");

        // Read back.
        let overview = h.get("/api/overview")?;
        for key in ["node", "object_totals", "queue_totals", "listeners", "product_version"] {
            assert!(overview.get(key).is_some(), "overview lacks {key}: {overview}");
        }
        assert!(overview["object_totals"]["queues"].as_u64().unwrap_or(0) >= 1);
        let nodes = h.get("/api/nodes")?;
        assert!(nodes.as_array().is_some_and(|n| !n.is_empty() && n.iter().all(|n| n["running"] == true)), "{nodes}");
        assert_eq!(h.get("/api/whoami")?, json!({"name": "guest", "tags": ["administrator"]}));
        assert_eq!(h.get("/api/health/checks/alarms")?, json!({"status": "ok"}));
        assert!(names(&h.get("/api/vhosts")?, "name").contains(&vh));
        assert_eq!(h.get(&format!("/api/vhosts/{vh}"))?["name"], json!(vh));
        let u = h.get(&format!("/api/users/{user}"))?;
        assert_eq!(u["tags"], json!(["management"]));
        assert_eq!(u["hashing_algorithm"], "rabbit_password_hashing_sha256");
        assert!(names(&h.get("/api/users")?, "name").contains(&user));
        let p = h.get(&format!("/api/permissions/{vh}/{user}"))?;
        assert_eq!(p, json!({"user": user, "vhost": vh, "configure": ".*", "write": ".*", "read": ".*"}));
        assert!(h.get("/api/permissions")?.as_array().unwrap().iter().any(|x| x["user"] == json!(user)));
        let e = h.get(&format!("/api/exchanges/{vh}/{ex}"))?;
        assert_eq!((e["type"].clone(), e["durable"].clone(), e["vhost"].clone()), (json!("fanout"), json!(true), json!(vh)));
        assert!(names(&h.get(&format!("/api/exchanges/{vh}"))?, "name").contains(&"amq.topic".to_string()));
        assert!(names(&h.get("/api/exchanges")?, "name").contains(&ex.to_string()));

        // A message in the queue, then the queue's counts, leader and members.
        let conn = connect(&h.amqp_uri("guest", "guest", &vh)).await?;
        let ch = conn.create_channel().await?;
        ch.confirm_select(Default::default()).await?;
        ch.basic_publish("".into(), q.into(), BasicPublishOptions::default(), b"m", BasicProperties::default())
            .await?
            .await?;
        let qd = get_when(&h, &format!("/api/queues/{vh}/{q}"), |v| v["messages_ready"] == 1).await?;
        assert_eq!(qd["type"], "quorum");
        assert_eq!(qd["messages_ready"], 1, "{qd}");
        assert_eq!(qd["messages_unacknowledged"], 0);
        assert_eq!(qd["messages"], 1);
        assert_eq!(qd["messages_dlx"], 0, "at-least-once dead letters held");
        if h.is_quorumq() {
            assert_eq!(qd["messages_delayed"], 0, "delayed-retry messages (RabbitMQ 4.3)");
        }
        assert_eq!(qd["policy"], pol);
        assert_eq!(qd["effective_policy_definition"], json!({"max-length": 5}));
        assert_eq!(qd["arguments"]["x-dead-letter-exchange"], json!(ex));
        assert!(qd["leader"].is_string() && qd["members"].as_array().is_some_and(|m| m.contains(&qd["leader"])), "{qd}");
        assert!(names(&h.get(&format!("/api/queues/{vh}"))?, "name").contains(&q.to_string()));
        assert!(names(&h.get("/api/queues")?, "name").contains(&q.to_string()));
        let bindings = h.get(&format!("/api/bindings/{vh}"))?;
        let explicit: Vec<&Value> = bindings.as_array().unwrap().iter().filter(|b| b["source"] == json!(ex)).collect();
        assert_eq!(explicit.len(), 1, "{bindings}");
        assert_eq!((explicit[0]["destination"].clone(), explicit[0]["destination_type"].clone(), explicit[0]["routing_key"].clone()), (json!(q), json!("queue"), json!("k")));
        assert!(bindings.as_array().unwrap().iter().any(|b| b["source"] == "" && b["destination"] == json!(q)), "the default exchange's binding is listed");
        assert!(!h.get("/api/bindings")?.as_array().unwrap().is_empty());
        let pl = h.get(&format!("/api/policies/{vh}/{pol}"))?;
        assert_eq!(pl, json!({"vhost": vh, "name": pol, "pattern": "^q\\.api$", "apply-to": "queues", "definition": {"max-length": 5}, "priority": 2}));
        assert!(names(&h.get("/api/policies")?, "name").contains(&pol.to_string()));
        assert!(names(&h.get(&format!("/api/policies/{vh}"))?, "name").contains(&pol.to_string()));
        conn.close(200, "bye".into()).await?;

        // Missing objects and routes: RabbitMQ's 404 body.
        let nf = json!({"error": "Object Not Found", "reason": "Not Found"});
        assert_eq!(h.guest("GET", &format!("/api/queues/{vh}/nope"), None)?, (404, nf.clone()));
        assert_eq!(h.guest("GET", "/api/nope", None)?.0, 404);
        assert_eq!(h.guest("GET", &format!("/api/queues/{}", enc("no-such-vhost")), None)?.0, 404);

        // Delete, innermost first.
        assert_eq!(h.guest("DELETE", &format!("/api/policies/{vh}/{pol}"), None)?.0, 204);
        assert_eq!(h.guest("GET", &format!("/api/policies/{vh}/{pol}"), None)?, (404, nf.clone()));
        assert_eq!(h.guest("DELETE", &format!("/api/queues/{vh}/{q}"), None)?.0, 204);
        assert_eq!(h.guest("GET", &format!("/api/queues/{vh}/{q}"), None)?.0, 404);
        assert_eq!(h.guest("DELETE", &format!("/api/exchanges/{vh}/{ex}"), None)?.0, 204);
        assert_eq!(h.guest("DELETE", &format!("/api/permissions/{vh}/{user}"), None)?.0, 204);
        assert_eq!(h.guest("GET", &format!("/api/permissions/{vh}/{user}"), None)?.0, 404);
        assert_eq!(h.guest("DELETE", &format!("/api/users/{user}"), None)?.0, 204);
        assert_eq!(h.guest("GET", &format!("/api/users/{user}"), None)?.0, 404);
        assert_eq!(h.guest("DELETE", &format!("/api/vhosts/{vh}"), None)?.0, 204);
        assert_eq!(h.guest("GET", &format!("/api/vhosts/{vh}"), None)?.0, 404);
        Ok(())
    })
    .await
}

/// Basic auth and the management tags: a wrong password and a user without a management
/// tag get 401 with RabbitMQ's bodies; `monitoring` reads every vhost but not users or
/// definitions and changes nothing; `management` sees only vhosts it has permissions in.
#[tokio::test]
async fn logins_and_management_tags_decide_what_a_user_sees() -> anyhow::Result<()> {
    bounded(Duration::from_secs(120), async {
        let h = HttpBroker::start().await?;
        let (mon, mgmt, plain) = (unique("mon"), unique("mgmt"), unique("plain"));
        let vh = unique("vh");
        assert_eq!(
            h.guest("PUT", &format!("/api/vhosts/{vh}"), Some(&json!({})))?
                .0,
            201
        );
        for (u, tags) in [(&mon, "monitoring"), (&mgmt, "management"), (&plain, "")] {
            let r = h.guest(
                "PUT",
                &format!("/api/users/{u}"),
                Some(&json!({"password": "pw", "tags": tags})),
            )?;
            assert_eq!(r.0, 201, "{r:?}");
        }
        let perms = json!({"configure": ".*", "write": ".*", "read": ".*"});
        assert_eq!(
            h.guest(
                "PUT",
                &format!("/api/permissions/{vh}/{mgmt}"),
                Some(&perms)
            )?
            .0,
            201
        );

        let started = std::time::Instant::now();
        let r = h.call("GET", "/api/overview", ("guest", "wrong"), None)?;
        assert_eq!(
            r,
            (
                401,
                json!({"error": "not_authorized", "reason": "Login failed"})
            )
        );
        if h.is_quorumq() {
            assert!(
                started.elapsed() >= Duration::from_millis(900),
                "a refused login is slowed down"
            );
        }
        assert_eq!(
            h.call("GET", "/api/overview", ("nobody", "pw"), None)?.0,
            401
        );
        let r = h.call("GET", "/api/overview", (&plain, "pw"), None)?;
        assert_eq!(
            r,
            (
                401,
                json!({"error": "not_authorised", "reason": "Not management user"})
            )
        );

        let as_mon = |m: &str, p: &str, b: Option<&Value>| h.call(m, p, (&mon, "pw"), b);
        assert_eq!(as_mon("GET", "/api/queues", None)?.0, 200);
        assert_eq!(as_mon("GET", "/api/overview", None)?.0, 200);
        assert!(
            names(&as_mon("GET", "/api/vhosts", None)?.1, "name").contains(&vh),
            "monitoring sees every vhost"
        );
        let r = as_mon("GET", "/api/users", None)?;
        assert_eq!(
            r,
            (
                401,
                json!({"error": "not_authorised", "reason": "Not administrator user"})
            )
        );
        assert_eq!(as_mon("GET", "/api/definitions", None)?.0, 401);
        assert_eq!(as_mon("GET", "/api/permissions", None)?.0, 401);
        let r = as_mon(
            "PUT",
            &format!("/api/policies/{vh}/p"),
            Some(&json!({"pattern": "x", "definition": {"max-length": 5}})),
        )?;
        assert_eq!(
            r,
            (
                401,
                json!({"error": "not_authorised", "reason": "User not authorised to access object"})
            )
        );

        let seen = names(
            &h.call("GET", "/api/vhosts", (&mgmt, "pw"), None)?.1,
            "name",
        );
        assert_eq!(seen, vec![vh.clone()], "management sees only its vhosts");
        assert_eq!(h.call("GET", "/api/users", (&mgmt, "pw"), None)?.0, 401);

        for u in [&mon, &mgmt, &plain] {
            assert_eq!(h.guest("DELETE", &format!("/api/users/{u}"), None)?.0, 204);
        }
        assert_eq!(
            h.guest("DELETE", &format!("/api/vhosts/{vh}"), None)?.0,
            204
        );
        Ok(())
    })
    .await
}

fn sorted_by(v: &Value, keys: &[&str]) -> Vec<Value> {
    let mut items: Vec<Value> = v.as_array().cloned().unwrap_or_default();
    items.sort_by_key(|i| keys.iter().map(|k| i[*k].to_string()).collect::<Vec<_>>());
    items
}

/// Only the fields RabbitMQ's definitions carry for an object (an export may add more).
fn project(items: Vec<Value>, keys: &[&str]) -> Vec<Value> {
    items
        .into_iter()
        .map(|i| {
            Value::Object(
                keys.iter()
                    .map(|k| (k.to_string(), i[*k].clone()))
                    .collect(),
            )
        })
        .collect()
}

/// A definitions file exported from RabbitMQ 3.10.8 imports, and the export afterwards
/// has the same users (same password hashes), vhosts, permissions, vhost limits, policies,
/// queues, exchanges and bindings; the imported user logs in over AMQP with its RabbitMQ
/// password, and the imported topology routes.
#[tokio::test]
async fn definitions_exported_by_rabbitmq_import_and_export_the_same() -> anyhow::Result<()> {
    bounded(Duration::from_secs(120), async {
        let h = HttpBroker::start().await?;
        let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/rabbitmq-3.10.8-definitions.json");
        let rabbit: Value = serde_json::from_str(&std::fs::read_to_string(&file)?)?;
        let r = h.guest("POST", "/api/definitions", Some(&rabbit))?;
        assert_eq!(r.0, 204, "import: {r:?}");
        let ours = h.get("/api/definitions")?;

        // A fresh quorumq holds exactly what was imported; an external broker (tests run
        // in parallel) at least that.
        let same = |ours: Vec<Value>, theirs: Vec<Value>, what: &str| {
            if h.is_quorumq() {
                assert_eq!(ours, theirs, "{what}");
            } else {
                for t in &theirs {
                    assert!(ours.contains(t), "{what}: {t} missing from {ours:?}");
                }
            }
        };
        let users = |d: &Value| {
            project(
                sorted_by(&d["users"], &["name"]),
                &["name", "password_hash", "hashing_algorithm", "tags"],
            )
        };
        same(users(&ours), users(&rabbit), "users");
        let vhosts = |d: &Value| project(sorted_by(&d["vhosts"], &["name"]), &["name"]);
        same(vhosts(&ours), vhosts(&rabbit), "vhosts");
        for (section, keys) in [
            (
                "permissions",
                &["user", "vhost", "configure", "write", "read"][..],
            ),
            ("parameters", &["vhost", "component", "name", "value"][..]),
            (
                "policies",
                &[
                    "vhost",
                    "name",
                    "pattern",
                    "apply-to",
                    "definition",
                    "priority",
                ][..],
            ),
            (
                "queues",
                &["vhost", "name", "durable", "auto_delete", "arguments"][..],
            ),
            (
                "exchanges",
                &[
                    "vhost",
                    "name",
                    "type",
                    "durable",
                    "auto_delete",
                    "internal",
                    "arguments",
                ][..],
            ),
            (
                "bindings",
                &[
                    "vhost",
                    "source",
                    "destination",
                    "destination_type",
                    "routing_key",
                    "arguments",
                ][..],
            ),
        ] {
            let sort_keys: Vec<&str> = keys
                .iter()
                .copied()
                .filter(|k| *k != "arguments" && *k != "value" && *k != "definition")
                .collect();
            same(
                project(sorted_by(&ours[section], &sort_keys), keys),
                project(sorted_by(&rabbit[section], &sort_keys), keys),
                section,
            );
        }

        // alice's RabbitMQ password (s3cret) works over AMQP; events → work.* routes to work.
        let conn = connect(&h.amqp_uri("alice", "s3cret", "dev")).await?;
        let ch = conn.create_channel().await?;
        let before = get_when(&h, "/api/queues/dev/work", |v| {
            v.get("messages_ready").is_some()
        })
        .await?["messages_ready"]
            .as_u64()
            .unwrap_or(0);
        ch.confirm_select(Default::default()).await?;
        ch.basic_publish(
            "events".into(),
            "work.x".into(),
            BasicPublishOptions::default(),
            b"m",
            BasicProperties::default(),
        )
        .await?
        .await?;
        let ok = ch
            .queue_declare(
                "work".into(),
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await;
        assert!(
            ok.is_ok(),
            "alice may declare passively (configure ^alice-.* is not needed)"
        );
        let after = get_when(&h, "/api/queues/dev/work", |v| {
            v["messages_ready"].as_u64() == Some(before + 1)
        })
        .await?;
        assert_eq!(after["messages_ready"].as_u64(), Some(before + 1));
        conn.close(200, "bye".into()).await?;

        // A vhost export names no vhost in its items and imports into another vhost.
        let dev = h.get("/api/definitions/dev")?;
        assert!(dev["queues"]
            .as_array()
            .is_some_and(|q| q.iter().all(|q| q.get("vhost").is_none())));
        assert_eq!(
            h.guest("PUT", "/api/vhosts/dev-copy", Some(&json!({})))?.0,
            201
        );
        assert_eq!(
            h.guest("POST", "/api/definitions/dev-copy", Some(&dev))?.0,
            204
        );
        assert_eq!(
            names(&h.get("/api/queues/dev-copy")?, "name").len(),
            names(&h.get("/api/queues/dev")?, "name").len()
        );
        assert_eq!(h.guest("DELETE", "/api/vhosts/dev-copy", None)?.0, 204);
        Ok(())
    })
    .await
}
