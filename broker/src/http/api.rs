//! The management API's object routes: a RabbitMQ-compatible subset with RabbitMQ 3.10.8's
//! JSON shapes (captured from the installed 3.10.8's management plugin): overview, nodes,
//! vhosts, users, permissions, exchanges, queues, bindings, policies, alarms. Reads need a
//! management tag (objects of other vhosts only for `administrator` / `monitoring`);
//! changes need `administrator` (policies also `policymaker`). Rates and Erlang process
//! statistics are not kept, so their fields are absent.

use std::collections::BTreeMap;

use axum::body::Bytes;
use axum::extract::Path;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::StreamExt;
use serde_json::{json, Value};

use super::json::{json_to_table, table_to_json};
use super::{node_name, Api, ApiError, Started};
use crate::meta::access::{Permission, User};
use crate::meta::command::{MetaCommand, MetaReply};
use crate::meta::policy::Policy;
use crate::meta::{ExchangeRecord, QueueKind, QueueRecord, QueueType};
use crate::node::Broker;

/// How many queues' statuses a listing asks at once (each may be a round trip to the
/// queue's leader on another node).
const QUEUE_STATUS_CONCURRENCY: usize = 32;

type ApiResult = Result<Response, ApiError>;

/// The object routes.
pub fn routes() -> Router<Started> {
    Router::new()
        .route("/api/overview", get(overview))
        .route("/api/whoami", get(whoami))
        .route("/api/nodes", get(nodes))
        .route("/api/health/checks/alarms", get(alarms))
        .route("/api/vhosts", get(vhosts))
        .route(
            "/api/vhosts/{vhost}",
            get(vhost).put(put_vhost).delete(delete_vhost),
        )
        .route("/api/users", get(users))
        .route(
            "/api/users/{user}",
            get(user).put(put_user).delete(delete_user),
        )
        .route("/api/permissions", get(permissions))
        .route(
            "/api/permissions/{vhost}/{user}",
            get(permission)
                .put(put_permission)
                .delete(delete_permission),
        )
        .route("/api/exchanges", get(exchanges))
        .route("/api/exchanges/{vhost}", get(exchanges_of))
        .route(
            "/api/exchanges/{vhost}/{name}",
            get(exchange).put(put_exchange).delete(delete_exchange),
        )
        .route("/api/queues", get(queues))
        .route("/api/queues/{vhost}", get(queues_of))
        .route(
            "/api/queues/{vhost}/{name}",
            get(queue).put(put_queue).delete(delete_queue),
        )
        .route("/api/bindings", get(bindings))
        .route("/api/bindings/{vhost}", get(bindings_of))
        .route(
            "/api/bindings/{vhost}/e/{source}/q/{destination}",
            post(bind_queue),
        )
        .route(
            "/api/bindings/{vhost}/e/{source}/e/{destination}",
            post(bind_exchange),
        )
        .route("/api/policies", get(policies))
        .route("/api/policies/{vhost}", get(policies_of))
        .route(
            "/api/policies/{vhost}/{name}",
            get(policy).put(put_policy).delete(delete_policy),
        )
}

fn ok(v: Value) -> ApiResult {
    Ok(Json(v).into_response())
}

fn created() -> ApiResult {
    Ok(StatusCode::CREATED.into_response())
}

fn no_content() -> ApiResult {
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// The request body as a JSON object (an empty body is `{}`).
///
/// Errors: 400 for a body that is not a JSON object.
pub fn body_object(body: &Bytes) -> Result<serde_json::Map<String, Value>, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(serde_json::Map::new());
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(other) => Err(ApiError::bad_request(format!(
            "expected a JSON object, got {other}"
        ))),
        Err(e) => Err(ApiError::bad_request(format!("not JSON: {e}"))),
    }
}

fn str_field<'a>(m: &'a serde_json::Map<String, Value>, key: &str) -> Option<&'a str> {
    m.get(key).and_then(Value::as_str)
}

fn bool_field(m: &serde_json::Map<String, Value>, key: &str, default: bool) -> bool {
    m.get(key).and_then(Value::as_bool).unwrap_or(default)
}

fn has_vhost(broker: &Broker, vhost: &str) -> bool {
    broker
        .with_topology(|t| t.has_vhost(vhost))
        .unwrap_or(false)
}

/// The vhosts the caller may read, sorted.
fn readable_vhosts(api: &Api) -> Vec<String> {
    let all: Vec<String> = api
        .broker
        .with_topology(|t| t.vhosts().map(str::to_owned).collect())
        .unwrap_or_default();
    all.into_iter()
        .filter(|v| api.caller.may_read(&api.broker, v))
        .collect()
}

/// 404 unless `vhost` exists and the caller may read it.
fn readable_vhost(api: &Api, vhost: &str) -> Result<(), ApiError> {
    if has_vhost(&api.broker, vhost) && api.caller.may_read(&api.broker, vhost) {
        Ok(())
    } else {
        Err(ApiError::not_found())
    }
}

// ------------------------------------------------------------------ overview, nodes

async fn overview(api: Api) -> ApiResult {
    let b = &api.broker;
    let vhosts = readable_vhosts(&api);
    let records = queue_records(b, &vhosts);
    let statuses = statuses(b, &records).await;
    let (ready, unacked): (u64, u64) = statuses.iter().fold((0, 0), |(r, u), s| {
        (r + s.messages_ready, u + s.messages_unacknowledged)
    });
    let consumers: u64 = statuses.iter().map(|s| s.consumers).sum();
    let exchanges = b
        .with_topology(|t| vhosts.iter().map(|v| t.exchanges(v).count()).sum::<usize>())
        .unwrap_or(0);
    let me = node_name(b.node_id());
    let cfg = b.config();
    let listener = |protocol: &str, addr: &str| {
        let (ip, port) = addr.rsplit_once(':').unwrap_or((addr, "0"));
        json!({"node": me, "protocol": protocol, "ip_address": ip,
               "port": port.parse::<u16>().unwrap_or(0)})
    };
    let mut listeners = vec![
        listener("amqp", &cfg.amqp_listen),
        listener("clustering", &cfg.cluster_listen),
    ];
    if let Some(h) = cfg.http_listen.as_deref().filter(|h| !h.is_empty()) {
        listeners.push(listener("http", h));
    }
    let exchange_types: Vec<Value> = ["direct", "fanout", "headers", "topic"]
        .iter()
        .map(|t| json!({"name": t, "enabled": true}))
        .collect();
    ok(json!({
        "management_version": env!("CARGO_PKG_VERSION"),
        "product_name": "quorumq",
        "product_version": env!("CARGO_PKG_VERSION"),
        "rabbitmq_version": "3.10.8",
        "rates_mode": "none",
        "cluster_name": format!("quorumq-{:016x}", b.peers().cluster_id()),
        "node": me,
        "exchange_types": exchange_types,
        "object_totals": {
            "connections": b.connections().total(),
            "consumers": consumers,
            "exchanges": exchanges,
            "queues": records.len(),
        },
        "queue_totals": {
            "messages": ready + unacked,
            "messages_ready": ready,
            "messages_unacknowledged": unacked,
        },
        "listeners": listeners,
    }))
}

async fn whoami(api: Api) -> ApiResult {
    ok(json!({"name": api.caller.user, "tags": api.caller.tags}))
}

async fn nodes(api: Api) -> ApiResult {
    let b = &api.broker;
    let me = b.node_id();
    let cluster = b.cluster_status();
    let (memory_limit, disk_limit) = b.alarms().limits();
    let local = b.alarms().local();
    let remote = b.alarms().remote();
    let list: Vec<Value> = cluster
        .nodes
        .iter()
        .map(|n| {
            let mut v = json!({
                "name": node_name(n.id),
                "type": "disc",
                "running": n.running,
                "cluster_addr": n.cluster_addr,
                "amqp_addr": n.amqp_addr,
                "mem_alarm": remote.get(&n.id).is_some_and(|a| a.memory),
                "disk_free_alarm": remote.get(&n.id).is_some_and(|a| a.disk),
            });
            if n.id == me {
                let extra = json!({
                    "uptime": b.detector().uptime().as_millis() as u64,
                    "mem_used": crate::alarms::rss_bytes(),
                    "mem_limit": memory_limit,
                    "mem_alarm": local.memory,
                    "disk_free": crate::alarms::disk_free_bytes(&b.config().data_dir),
                    "disk_free_limit": disk_limit,
                    "disk_free_alarm": local.disk,
                    "os_pid": std::process::id().to_string(),
                    "processors": std::thread::available_parallelism().map_or(1, |n| n.get()),
                    "being_drained": b.detector().is_draining(),
                });
                merge(&mut v, extra);
            }
            v
        })
        .collect();
    ok(Value::Array(list))
}

fn merge(into: &mut Value, from: Value) {
    if let (Value::Object(a), Value::Object(b)) = (into, from) {
        a.extend(b);
    }
}

/// `GET /api/health/checks/alarms`: 200 `{"status":"ok"}`, or 503 with the alarms in
/// effect in the cluster (RabbitMQ `rabbit_mgmt_wm_health_check_alarms`).
async fn alarms(api: Api) -> ApiResult {
    let b = &api.broker;
    let mut raised = Vec::new();
    let mut add = |node: u64, a: crate::alarms::Alarm| {
        if a.memory {
            raised.push(json!({"node": node_name(node), "resource": "memory"}));
        }
        if a.disk {
            raised.push(json!({"node": node_name(node), "resource": "disk"}));
        }
    };
    add(b.node_id(), b.alarms().local());
    let mut remote: Vec<_> = b.alarms().remote().into_iter().collect();
    remote.sort_by_key(|(n, _)| *n);
    for (n, a) in remote {
        add(n, a);
    }
    if raised.is_empty() {
        ok(json!({"status": "ok"}))
    } else {
        Ok((
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "failed",
                        "reason": "There are alarms in effect in the cluster",
                        "alarms": raised})),
        )
            .into_response())
    }
}

// ------------------------------------------------------------------------- vhosts

fn vhost_json(b: &Broker, name: &str) -> Value {
    let settings = b
        .with_topology(|t| t.vhost_settings(name))
        .unwrap_or_default();
    let description = if name == "/" {
        "Default virtual host"
    } else {
        ""
    };
    let state: BTreeMap<String, &str> = b
        .cluster_status()
        .nodes
        .iter()
        .map(|n| {
            (
                node_name(n.id),
                if n.running { "running" } else { "stopped" },
            )
        })
        .collect();
    json!({
        "name": name,
        "description": description,
        "tags": [],
        "metadata": {"description": description, "tags": []},
        "default_queue_type": settings.default_queue_type.unwrap_or_else(|| "undefined".into()),
        "tracing": false,
        "cluster_state": state,
    })
}

async fn vhosts(api: Api) -> ApiResult {
    let list: Vec<Value> = readable_vhosts(&api)
        .iter()
        .map(|v| vhost_json(&api.broker, v))
        .collect();
    ok(Value::Array(list))
}

async fn vhost(api: Api, Path(vhost): Path<String>) -> ApiResult {
    readable_vhost(&api, &vhost)?;
    ok(vhost_json(&api.broker, &vhost))
}

/// `PUT /api/vhosts/{vhost}` `{"default_queue_type": …}`: 201 created (the caller gets full
/// permissions on it), 204 when it existed.
async fn put_vhost(api: Api, Path(vhost): Path<String>, body: Bytes) -> ApiResult {
    api.caller.require_admin()?;
    let m = body_object(&body)?;
    let existed = has_vhost(&api.broker, &vhost);
    api.broker
        .operator_write(MetaCommand::AddVhost {
            name: vhost.clone(),
            default_queue_type: str_field(&m, "default_queue_type")
                .filter(|t| !t.is_empty() && *t != "undefined")
                .map(str::to_owned),
        })
        .await?;
    if existed {
        return no_content();
    }
    // As RabbitMQ's management API: the user who created the vhost gets full permissions
    // on it.
    api.broker
        .operator_write(MetaCommand::SetPermissions {
            user: api.caller.user.clone(),
            vhost,
            permission: Permission {
                configure: ".*".into(),
                write: ".*".into(),
                read: ".*".into(),
            },
        })
        .await?;
    created()
}

async fn delete_vhost(api: Api, Path(vhost): Path<String>) -> ApiResult {
    api.caller.require_admin()?;
    api.broker
        .operator_write(MetaCommand::DeleteVhost { name: vhost })
        .await?;
    no_content()
}

// -------------------------------------------------------------------------- users

/// A user as the API and definitions show it (RabbitMQ: base64 of the
/// `rabbit_password_hashing_sha256` hash).
pub fn user_json(u: &User) -> Value {
    use base64::Engine;
    json!({
        "name": u.name,
        "password_hash": base64::engine::general_purpose::STANDARD.encode(&u.password_hash),
        "hashing_algorithm": "rabbit_password_hashing_sha256",
        "tags": u.tags,
        "limits": {},
    })
}

async fn users(api: Api) -> ApiResult {
    api.caller.require_admin()?;
    let list: Vec<Value> = api
        .broker
        .with_topology(|t| t.access().users().map(user_json).collect())
        .unwrap_or_default();
    ok(Value::Array(list))
}

async fn user(api: Api, Path(name): Path<String>) -> ApiResult {
    api.caller.require_admin()?;
    api.broker
        .with_topology(|t| t.access().user(&name).map(user_json))
        .flatten()
        .map_or_else(|| Err(ApiError::not_found()), ok)
}

/// Tags as RabbitMQ accepts them: a JSON list, or one comma-separated string.
pub fn parse_tags(v: Option<&Value>) -> Vec<String> {
    match v {
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect(),
        Some(Value::String(s)) => s
            .split(',')
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(str::to_owned)
            .collect(),
        _ => Vec::new(),
    }
}

/// A password hash from a request: `password` (hashed here with a fresh salt) or
/// `password_hash` (base64, RabbitMQ's layout, as exported).
///
/// Errors: 400 for a `password_hash` that is not base64 or a `hashing_algorithm` other
/// than `rabbit_password_hashing_sha256`.
pub fn password_hash_of(m: &serde_json::Map<String, Value>) -> Result<Vec<u8>, ApiError> {
    use base64::Engine;
    if let Some(p) = str_field(m, "password") {
        return Ok(if p.is_empty() {
            Vec::new()
        } else {
            crate::meta::access::hash_password(rand::random(), p.as_bytes())
        });
    }
    if let Some(alg) = str_field(m, "hashing_algorithm") {
        if alg != "rabbit_password_hashing_sha256" {
            return Err(ApiError::bad_request(format!(
                "unsupported hashing algorithm {alg} (only rabbit_password_hashing_sha256)"
            )));
        }
    }
    match str_field(m, "password_hash") {
        Some(h) => base64::engine::general_purpose::STANDARD
            .decode(h)
            .map_err(|e| ApiError::bad_request(format!("password_hash is not base64: {e}"))),
        None => Err(ApiError::bad_request(
            "key_missing: password or password_hash",
        )),
    }
}

/// `PUT /api/users/{user}` `{"password" | "password_hash", "tags"}`: 201 or 204.
async fn put_user(api: Api, Path(name): Path<String>, body: Bytes) -> ApiResult {
    api.caller.require_admin()?;
    let m = body_object(&body)?;
    let hash = password_hash_of(&m)?;
    let tags = parse_tags(m.get("tags"));
    let existed = api
        .broker
        .with_topology(|t| t.access().user(&name).is_some())
        .unwrap_or(false);
    if existed {
        api.broker
            .operator_write(MetaCommand::SetPasswordHash {
                name: name.clone(),
                hash,
            })
            .await?;
        api.broker
            .operator_write(MetaCommand::SetUserTags { name, tags })
            .await?;
        no_content()
    } else {
        api.broker
            .operator_write(MetaCommand::AddUser(User {
                name,
                password_hash: hash,
                tags,
            }))
            .await?;
        created()
    }
}

async fn delete_user(api: Api, Path(name): Path<String>) -> ApiResult {
    api.caller.require_admin()?;
    api.broker
        .operator_write(MetaCommand::DeleteUser { name })
        .await?;
    no_content()
}

// -------------------------------------------------------------------- permissions

fn permission_json(user: &str, vhost: &str, p: &Permission) -> Value {
    json!({"user": user, "vhost": vhost, "configure": p.configure,
           "write": p.write, "read": p.read})
}

/// Every user's permissions in every vhost, as `GET /api/permissions` lists them.
pub fn all_permissions(b: &Broker) -> Vec<Value> {
    b.with_topology(|t| {
        t.access()
            .permissions()
            .map(|(u, v, p)| permission_json(u, v, p))
            .collect()
    })
    .unwrap_or_default()
}

async fn permissions(api: Api) -> ApiResult {
    api.caller.require_admin()?;
    ok(Value::Array(all_permissions(&api.broker)))
}

async fn permission(api: Api, Path((vhost, user)): Path<(String, String)>) -> ApiResult {
    api.caller.require_admin()?;
    api.broker
        .with_topology(|t| {
            t.access()
                .permissions()
                .find(|(u, v, _)| *u == user && *v == vhost)
                .map(|(u, v, p)| permission_json(u, v, p))
        })
        .flatten()
        .map_or_else(|| Err(ApiError::not_found()), ok)
}

/// `PUT /api/permissions/{vhost}/{user}` `{"configure","write","read"}`: 201 or 204.
async fn put_permission(
    api: Api,
    Path((vhost, user)): Path<(String, String)>,
    body: Bytes,
) -> ApiResult {
    api.caller.require_admin()?;
    let m = body_object(&body)?;
    let field = |k: &str| {
        str_field(&m, k)
            .map(str::to_owned)
            .ok_or_else(|| ApiError::bad_request(format!("key_missing: {k}")))
    };
    let permission = Permission {
        configure: field("configure")?,
        write: field("write")?,
        read: field("read")?,
    };
    let existed = api
        .broker
        .with_topology(|t| {
            t.access()
                .permissions()
                .any(|(u, v, _)| u == user && v == vhost)
        })
        .unwrap_or(false);
    api.broker
        .operator_write(MetaCommand::SetPermissions {
            user,
            vhost,
            permission,
        })
        .await?;
    if existed {
        no_content()
    } else {
        created()
    }
}

async fn delete_permission(api: Api, Path((vhost, user)): Path<(String, String)>) -> ApiResult {
    api.caller.require_admin()?;
    api.broker
        .operator_write(MetaCommand::ClearPermissions { user, vhost })
        .await?;
    no_content()
}

// ---------------------------------------------------------------------- exchanges

/// An exchange as the API shows it (`""` is the default exchange, as RabbitMQ lists it).
pub fn exchange_json(vhost: &str, e: &ExchangeRecord) -> Value {
    json!({
        "name": e.name,
        "vhost": vhost,
        "type": e.kind.as_str(),
        "durable": e.durable,
        "auto_delete": e.auto_delete,
        "internal": e.internal,
        "arguments": table_to_json(&e.arguments),
    })
}

fn exchanges_in(b: &Broker, vhosts: &[String]) -> Vec<Value> {
    b.with_topology(|t| {
        vhosts
            .iter()
            .flat_map(|v| t.exchanges(v).map(move |e| exchange_json(v, e)))
            .collect()
    })
    .unwrap_or_default()
}

async fn exchanges(api: Api) -> ApiResult {
    ok(Value::Array(exchanges_in(
        &api.broker,
        &readable_vhosts(&api),
    )))
}

async fn exchanges_of(api: Api, Path(vhost): Path<String>) -> ApiResult {
    readable_vhost(&api, &vhost)?;
    ok(Value::Array(exchanges_in(&api.broker, &[vhost])))
}

async fn exchange(api: Api, Path((vhost, name)): Path<(String, String)>) -> ApiResult {
    readable_vhost(&api, &vhost)?;
    let name = if name == "amq.default" {
        String::new()
    } else {
        name
    };
    api.broker
        .with_topology(|t| t.exchange(&vhost, &name).map(|e| exchange_json(&vhost, e)))
        .flatten()
        .map_or_else(|| Err(ApiError::not_found()), ok)
}

/// An exchange.declare from a JSON object (`type`, `durable`, `auto_delete`, `internal`,
/// `arguments`; RabbitMQ's defaults: durable, not auto-delete, not internal).
///
/// Errors: 400 for arguments that are not an object, or a missing `type`.
pub fn exchange_declare(
    vhost: &str,
    name: &str,
    m: &serde_json::Map<String, Value>,
) -> Result<MetaCommand, ApiError> {
    Ok(MetaCommand::DeclareExchange {
        vhost: vhost.to_owned(),
        name: name.to_owned(),
        kind: str_field(m, "type")
            .ok_or_else(|| ApiError::bad_request("key_missing: type"))?
            .to_owned(),
        passive: false,
        durable: bool_field(m, "durable", true),
        auto_delete: bool_field(m, "auto_delete", false),
        internal: bool_field(m, "internal", false),
        arguments: json_to_table(m.get("arguments")).map_err(ApiError::bad_request)?,
    })
}

async fn put_exchange(
    api: Api,
    Path((vhost, name)): Path<(String, String)>,
    body: Bytes,
) -> ApiResult {
    api.caller.require_writer()?;
    readable_vhost(&api, &vhost)?;
    let m = body_object(&body)?;
    let existed = api
        .broker
        .with_topology(|t| t.exchange(&vhost, &name).is_some())
        .unwrap_or(false);
    api.broker
        .operator_write(exchange_declare(&vhost, &name, &m)?)
        .await?;
    api.broker.topology_changed();
    if existed {
        no_content()
    } else {
        created()
    }
}

async fn delete_exchange(api: Api, Path((vhost, name)): Path<(String, String)>) -> ApiResult {
    api.caller.require_writer()?;
    readable_vhost(&api, &vhost)?;
    api.broker
        .operator_write(MetaCommand::DeleteExchange {
            vhost,
            name,
            if_unused: false,
        })
        .await?;
    no_content()
}

// ------------------------------------------------------------------------- queues

/// Queue records of `vhosts` (exclusive ones included, as RabbitMQ lists them).
fn queue_records(b: &Broker, vhosts: &[String]) -> Vec<QueueRecord> {
    b.with_topology(|t| {
        t.queues()
            .filter(|q| vhosts.contains(&q.vhost))
            .cloned()
            .collect()
    })
    .unwrap_or_default()
}

async fn statuses(b: &Broker, records: &[QueueRecord]) -> Vec<crate::cluster::status::QueueStatus> {
    let asks: Vec<_> = records.iter().map(|r| b.queue_status(r)).collect();
    futures::stream::iter(asks)
        .buffered(QUEUE_STATUS_CONCURRENCY)
        .collect()
        .await
}

/// The queue's type as clients see it: a durable queue declared classic is replicated
/// here but behaves, and lists, as classic.
pub fn queue_type(rec: &QueueRecord) -> &'static str {
    match rec.kind {
        QueueKind::Quorum if QueueType::of_args(&rec.arguments) == QueueType::Quorum => "quorum",
        _ => "classic",
    }
}

fn queue_json(b: &Broker, rec: &QueueRecord, st: &crate::cluster::status::QueueStatus) -> Value {
    let (policy, definition) = b
        .with_topology(|t| {
            t.queue_policy(&rec.vhost, &rec.name)
                .map(|p| (Value::from(p.name.clone()), p.definition.clone()))
        })
        .flatten()
        .unwrap_or((Value::Null, json!({})));
    let leader = st.leader.map(node_name);
    let names = |ids: &[u64]| ids.iter().copied().map(node_name).collect::<Vec<_>>();
    let state = if st.leader.is_some() {
        "running"
    } else {
        "minority"
    };
    json!({
        "name": rec.name,
        "vhost": rec.vhost,
        "type": queue_type(rec),
        "durable": rec.durable,
        "auto_delete": rec.auto_delete,
        "exclusive": rec.exclusive_owner.is_some(),
        "arguments": table_to_json(&rec.arguments),
        "node": leader,
        "leader": leader,
        "members": names(&st.members),
        "online": names(&st.online),
        "state": state,
        "policy": policy,
        "operator_policy": null,
        "effective_policy_definition": definition,
        "consumers": st.consumers,
        "messages": st.messages_ready + st.messages_unacknowledged,
        "messages_ready": st.messages_ready,
        "messages_unacknowledged": st.messages_unacknowledged,
        "messages_dlx": st.dead_letter_held,
        "unreadable_bodies": st.unreadable_bodies,
    })
}

async fn queues_in(b: &Broker, vhosts: &[String]) -> Vec<Value> {
    let records = queue_records(b, vhosts);
    let statuses = statuses(b, &records).await;
    records
        .iter()
        .zip(&statuses)
        .map(|(r, s)| queue_json(b, r, s))
        .collect()
}

async fn queues(api: Api) -> ApiResult {
    let vhosts = readable_vhosts(&api);
    ok(Value::Array(queues_in(&api.broker, &vhosts).await))
}

async fn queues_of(api: Api, Path(vhost): Path<String>) -> ApiResult {
    readable_vhost(&api, &vhost)?;
    ok(Value::Array(queues_in(&api.broker, &[vhost]).await))
}

async fn queue(api: Api, Path((vhost, name)): Path<(String, String)>) -> ApiResult {
    readable_vhost(&api, &vhost)?;
    let rec = api
        .broker
        .with_topology(|t| t.queue(&vhost, &name).cloned())
        .flatten()
        .ok_or_else(ApiError::not_found)?;
    let st = api.broker.queue_status(&rec).await;
    ok(queue_json(&api.broker, &rec, &st))
}

/// Declares a queue from a JSON object (`durable`, default true; `auto_delete`;
/// `arguments`) as queue.declare through this node would, and opens it here.
///
/// Errors: 400 for bad arguments or an inequivalent redeclare (RabbitMQ's texts).
pub async fn declare_queue(
    b: &std::sync::Arc<Broker>,
    vhost: &str,
    name: &str,
    m: &serde_json::Map<String, Value>,
) -> Result<bool, ApiError> {
    let arguments = json_to_table(m.get("arguments")).map_err(ApiError::bad_request)?;
    let declare = b.queue_declare(
        vhost,
        name,
        false,
        bool_field(m, "durable", true),
        false,
        bool_field(m, "auto_delete", false),
        arguments,
        0,
    );
    let reply = b.meta_write(MetaCommand::DeclareQueue(declare)).await?;
    match reply {
        MetaReply::QueueDeclared { record, created } => {
            b.ensure_queue(&record).await?;
            Ok(created)
        }
        MetaReply::Error(e) => Err(e.into()),
        _ => Err(ApiError::bad_request("unexpected reply to queue.declare")),
    }
}

async fn put_queue(
    api: Api,
    Path((vhost, name)): Path<(String, String)>,
    body: Bytes,
) -> ApiResult {
    api.caller.require_writer()?;
    readable_vhost(&api, &vhost)?;
    let m = body_object(&body)?;
    if declare_queue(&api.broker, &vhost, &name, &m).await? {
        created()
    } else {
        no_content()
    }
}

async fn delete_queue(api: Api, Path((vhost, name)): Path<(String, String)>) -> ApiResult {
    api.caller.require_writer()?;
    readable_vhost(&api, &vhost)?;
    match api.broker.delete_queue(&vhost, &name).await? {
        Some(_) => no_content(),
        None => Err(ApiError::not_found()),
    }
}

// ----------------------------------------------------------------------- bindings

/// RabbitMQ's `properties_key` of a binding: the routing key (`~` when empty), with a
/// digest of the arguments appended when there are any.
fn properties_key(routing_key: &str, arguments: &amq_protocol::types::FieldTable) -> String {
    let key = if routing_key.is_empty() {
        "~".to_owned()
    } else {
        routing_key.to_owned()
    };
    if arguments.inner().is_empty() {
        key
    } else {
        let digest = crc32fast::hash(table_to_json(arguments).to_string().as_bytes());
        format!("{key}~{digest:08x}")
    }
}

/// Bindings of `vhosts` as the API lists them: the default exchange's implicit binding
/// of every queue first, then the explicit ones; `with_defaults` = false leaves the
/// implicit ones out (definitions).
pub fn bindings_in(b: &Broker, vhosts: &[String], with_defaults: bool) -> Vec<Value> {
    b.with_topology(|t| {
        let mut out = Vec::new();
        for v in vhosts {
            if with_defaults {
                let mut names: Vec<&str> = t
                    .queues()
                    .filter(|q| q.vhost == *v)
                    .map(|q| q.name.as_str())
                    .collect();
                names.sort_unstable();
                out.extend(names.into_iter().map(|q| {
                    json!({"source": "", "vhost": v, "destination": q,
                           "destination_type": "queue", "routing_key": q,
                           "arguments": {}, "properties_key": q})
                }));
            }
            for e in t.exchanges(v) {
                for bd in t.bindings(v, &e.name) {
                    out.push(json!({
                        "source": bd.exchange,
                        "vhost": v,
                        "destination": bd.queue,
                        "destination_type": if bd.to_exchange { "exchange" } else { "queue" },
                        "routing_key": bd.routing_key,
                        "arguments": table_to_json(&bd.arguments),
                        "properties_key": properties_key(&bd.routing_key, &bd.arguments),
                    }));
                }
            }
        }
        out
    })
    .unwrap_or_default()
}

async fn bindings(api: Api) -> ApiResult {
    ok(Value::Array(bindings_in(
        &api.broker,
        &readable_vhosts(&api),
        true,
    )))
}

async fn bindings_of(api: Api, Path(vhost): Path<String>) -> ApiResult {
    readable_vhost(&api, &vhost)?;
    ok(Value::Array(bindings_in(&api.broker, &[vhost], true)))
}

/// A binding from a JSON object (`routing_key`, `arguments`) of `source` to a queue or
/// (`to_exchange`) an exchange.
///
/// Errors: 400 for arguments that are not an object.
pub fn binding_command(
    vhost: &str,
    source: &str,
    destination: &str,
    to_exchange: bool,
    m: &serde_json::Map<String, Value>,
) -> Result<MetaCommand, ApiError> {
    let routing_key = str_field(m, "routing_key").unwrap_or("").to_owned();
    let arguments = json_to_table(m.get("arguments")).map_err(ApiError::bad_request)?;
    Ok(if to_exchange {
        MetaCommand::BindExchange {
            vhost: vhost.to_owned(),
            destination: destination.to_owned(),
            source: source.to_owned(),
            routing_key,
            arguments,
        }
    } else {
        MetaCommand::Bind {
            vhost: vhost.to_owned(),
            queue: destination.to_owned(),
            exchange: source.to_owned(),
            routing_key,
            arguments,
        }
    })
}

async fn bind(
    api: Api,
    vhost: String,
    source: String,
    dest: String,
    to_exchange: bool,
    body: Bytes,
) -> ApiResult {
    api.caller.require_writer()?;
    readable_vhost(&api, &vhost)?;
    let m = body_object(&body)?;
    api.broker
        .operator_write(binding_command(&vhost, &source, &dest, to_exchange, &m)?)
        .await?;
    api.broker.topology_changed();
    created()
}

async fn bind_queue(
    api: Api,
    Path((vhost, source, dest)): Path<(String, String, String)>,
    body: Bytes,
) -> ApiResult {
    bind(api, vhost, source, dest, false, body).await
}

async fn bind_exchange(
    api: Api,
    Path((vhost, source, dest)): Path<(String, String, String)>,
    body: Bytes,
) -> ApiResult {
    bind(api, vhost, source, dest, true, body).await
}

// ----------------------------------------------------------------------- policies

/// A policy as the API and definitions show it.
pub fn policy_json(p: &Policy) -> Value {
    json!({
        "vhost": p.vhost,
        "name": p.name,
        "pattern": p.pattern,
        "apply-to": p.apply_to,
        "definition": p.definition,
        "priority": p.priority,
    })
}

fn policies_in(b: &Broker, vhosts: &[String]) -> Vec<Value> {
    b.with_topology(|t| {
        vhosts
            .iter()
            .flat_map(|v| t.policies(v))
            .map(|p| policy_json(&p))
            .collect()
    })
    .unwrap_or_default()
}

async fn policies(api: Api) -> ApiResult {
    ok(Value::Array(policies_in(
        &api.broker,
        &readable_vhosts(&api),
    )))
}

async fn policies_of(api: Api, Path(vhost): Path<String>) -> ApiResult {
    readable_vhost(&api, &vhost)?;
    ok(Value::Array(policies_in(&api.broker, &[vhost])))
}

async fn policy(api: Api, Path((vhost, name)): Path<(String, String)>) -> ApiResult {
    readable_vhost(&api, &vhost)?;
    api.broker
        .with_topology(|t| {
            t.policies(&vhost)
                .into_iter()
                .find(|p| p.name == name)
                .map(|p| policy_json(&p))
        })
        .flatten()
        .map_or_else(|| Err(ApiError::not_found()), ok)
}

/// A policy from a JSON object (`pattern`, `definition`, `priority` default 0, `apply-to`
/// default `all`).
///
/// Errors: 400 for a missing `pattern` or `definition`.
pub fn policy_of(
    vhost: &str,
    name: &str,
    m: &serde_json::Map<String, Value>,
) -> Result<Policy, ApiError> {
    Ok(Policy {
        vhost: vhost.to_owned(),
        name: name.to_owned(),
        pattern: str_field(m, "pattern")
            .ok_or_else(|| ApiError::bad_request("key_missing: pattern"))?
            .to_owned(),
        definition: m
            .get("definition")
            .cloned()
            .ok_or_else(|| ApiError::bad_request("key_missing: definition"))?,
        priority: m
            .get("priority")
            .and_then(Value::as_i64)
            .and_then(|p| i32::try_from(p).ok())
            .unwrap_or(0),
        apply_to: str_field(m, "apply-to").unwrap_or("all").to_owned(),
    })
}

/// `PUT /api/policies/{vhost}/{name}`: 201 created, 204 replaced; 400 with RabbitMQ's
/// validation text for a bad definition.
async fn put_policy(
    api: Api,
    Path((vhost, name)): Path<(String, String)>,
    body: Bytes,
) -> ApiResult {
    api.caller.require_policymaker(&api.broker, &vhost)?;
    if !has_vhost(&api.broker, &vhost) {
        return Err(ApiError::not_found());
    }
    let m = body_object(&body)?;
    let policy = policy_of(&vhost, &name, &m)?;
    let existed = api
        .broker
        .with_topology(|t| t.policies(&vhost).iter().any(|p| p.name == name))
        .unwrap_or(false);
    api.broker
        .operator_write(MetaCommand::SetPolicy(policy))
        .await?;
    if existed {
        no_content()
    } else {
        created()
    }
}

async fn delete_policy(api: Api, Path((vhost, name)): Path<(String, String)>) -> ApiResult {
    api.caller.require_policymaker(&api.broker, &vhost)?;
    api.broker
        .operator_write(MetaCommand::ClearPolicy { vhost, name })
        .await?;
    no_content()
}
