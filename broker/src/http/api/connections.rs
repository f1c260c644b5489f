//! `/api/connections`, `/api/channels`, `/api/consumers` and their per-vhost forms: the
//! live AMQP connections of this node, their channels and consumers, in RabbitMQ 3.10.8's
//! shapes (`rabbit_mgmt_wm_connections`, `_channels`, `_consumers`), and
//! `DELETE /api/connections/{name}`, which closes a connection with 320
//! CONNECTION_FORCED and the `X-Reason` header's text ("Closed via management plugin"
//! without one). Users without `administrator` or `monitoring` see their own connections
//! only, as RabbitMQ's. Listed from this node's tracking ([`crate::tracking`]).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use axum::extract::Path;
use axum::http::HeaderMap;
use axum::routing::get;
use axum::Router;
use serde_json::{json, Value};

use super::vhosts::readable_vhost;
use super::{no_content, ok, ApiResult};

/// A JSON array answered as [`super::listing::reply_list`].
fn reply_list(v: Value, uri: &axum::http::Uri) -> ApiResult {
    let items = match v {
        Value::Array(a) => a,
        other => vec![other],
    };
    super::listing::reply_list(items, uri)
}
use crate::http::json::table_to_json;
use crate::http::rates::{RateKey, RATES};
use crate::http::{node_name, Api, ApiError, Started};
use crate::tracking::{ChannelStats, TrackedConnection};

/// The routes.
pub(super) fn routes() -> Router<Started> {
    Router::new()
        .route("/api/connections", get(connections))
        .route("/api/connections/{name}", get(connection).delete(close))
        .route("/api/connections/{name}/channels", get(connection_channels))
        .route("/api/vhosts/{vhost}/connections", get(vhost_connections))
        .route("/api/channels", get(channels))
        .route("/api/channels/{name}", get(channel))
        .route("/api/vhosts/{vhost}/channels", get(vhost_channels))
        .route("/api/consumers", get(consumers))
        .route("/api/consumers/{vhost}", get(vhost_consumers))
}

/// The connections `api`'s caller may see, of `vhost` when given.
fn visible(api: &Api, vhost: Option<&str>) -> Vec<Arc<TrackedConnection>> {
    api.broker
        .tracking()
        .connections()
        .into_iter()
        .filter(|c| vhost.is_none_or(|v| c.info.vhost == v))
        .filter(|c| {
            api.caller.sees_all()
                || (c.info.user == api.caller.user
                    && api.caller.may_read(&api.broker, &c.info.vhost))
        })
        .collect()
}

fn peer(c: &TrackedConnection) -> (Value, Value) {
    match c.info.peer {
        Some(a) => (json!(a.ip().to_string()), json!(a.port())),
        None => (Value::Null, Value::Null),
    }
}

fn connection_json(node: &str, c: &TrackedConnection) -> Value {
    let i = &c.info;
    let (peer_host, peer_port) = peer(c);
    let (host, port) = match i.local {
        Some(a) => (json!(a.ip().to_string()), json!(a.port())),
        None => (Value::Null, Value::Null),
    };
    let user_provided_name = crate::meta::value::lookup(&i.client_properties, "connection_name")
        .map(crate::http::json::value_to_json)
        .unwrap_or(Value::Null);
    json!({
        "name": i.name(),
        "node": node,
        "type": "network",
        "protocol": "AMQP 0-9-1",
        "state": "running",
        "user": i.user,
        "user_who_performed_action": i.user,
        "vhost": i.vhost,
        "auth_mechanism": i.auth_mechanism,
        "client_properties": table_to_json(&i.client_properties),
        "user_provided_name": user_provided_name,
        "connected_at": i.connected_at_ms,
        "channels": c.channels().len(),
        "channel_max": i.channel_max,
        "frame_max": i.frame_max,
        "timeout": i.heartbeat_s,
        "host": host,
        "port": port,
        "peer_host": peer_host,
        "peer_port": peer_port,
        "ssl": i.tls,
        "ssl_protocol": null,
        "ssl_key_exchange": null,
        "ssl_cipher": null,
        "ssl_hash": null,
        "peer_cert_subject": null,
        "peer_cert_issuer": null,
        "peer_cert_validity": null,
        "message_stats": RATES.message_stats(RateKey::Connection(i.id), c.counts()),
    })
}

fn channel_json(node: &str, c: &TrackedConnection, key: u64, ch: &ChannelStats) -> Value {
    let (peer_host, peer_port) = peer(c);
    let consumers = ch.consumers.lock().map(|v| v.len()).unwrap_or(0);
    json!({
        "name": format!("{} ({})", c.info.name(), ch.number),
        "node": node,
        "number": ch.number,
        "user": c.info.user,
        "user_who_performed_action": c.info.user,
        "vhost": c.info.vhost,
        "state": "running",
        "connection_details": {"name": c.info.name(), "peer_host": peer_host, "peer_port": peer_port},
        "consumer_count": consumers,
        "prefetch_count": ch.prefetch.load(Relaxed),
        "global_prefetch_count": ch.global_prefetch.load(Relaxed),
        "messages_unacknowledged": ch.unacked.load(Relaxed),
        "messages_unconfirmed": ch.unconfirmed.load(Relaxed),
        "messages_uncommitted": 0,
        "acks_uncommitted": 0,
        "pending_raft_commands": 0,
        "confirm": ch.confirm.load(Relaxed),
        "transactional": ch.transactional.load(Relaxed),
        "message_stats": RATES.message_stats(RateKey::Channel(c.info.id, key), ch.counts.snapshot()),
    })
}

fn consumers_json(node: &str, c: &TrackedConnection, ch: &ChannelStats) -> Vec<Value> {
    let (peer_host, peer_port) = peer(c);
    let details = json!({
        "name": format!("{} ({})", c.info.name(), ch.number),
        "connection_name": c.info.name(),
        "node": node,
        "number": ch.number,
        "peer_host": peer_host,
        "peer_port": peer_port,
        "user": c.info.user,
    });
    let list = ch.consumers.lock().map(|v| v.clone()).unwrap_or_default();
    list.into_iter()
        .map(|k| {
            json!({
                "consumer_tag": k.tag,
                "queue": {"name": k.queue, "vhost": k.vhost},
                "channel_details": details,
                "ack_required": k.ack_required,
                "exclusive": k.exclusive,
                "prefetch_count": k.prefetch_count,
                "arguments": table_to_json(&k.arguments),
                "active": true,
                "activity_status": "up",
            })
        })
        .collect()
}

fn list_connections(api: &Api, vhost: Option<&str>) -> Value {
    let node = node_name(api.broker.node_id());
    Value::Array(
        visible(api, vhost)
            .iter()
            .map(|c| connection_json(&node, c))
            .collect(),
    )
}

fn list_channels(api: &Api, conns: &[Arc<TrackedConnection>]) -> Value {
    let node = node_name(api.broker.node_id());
    Value::Array(
        conns
            .iter()
            .flat_map(|c| {
                c.channels()
                    .into_iter()
                    .map(|(k, ch)| channel_json(&node, c, k, &ch))
                    .collect::<Vec<_>>()
            })
            .collect(),
    )
}

fn list_consumers(api: &Api, vhost: Option<&str>) -> Value {
    let node = node_name(api.broker.node_id());
    Value::Array(
        visible(api, None)
            .iter()
            .flat_map(|c| {
                c.channels()
                    .into_iter()
                    .flat_map(|(_, ch)| consumers_json(&node, c, &ch))
                    .collect::<Vec<_>>()
            })
            .filter(|k| vhost.is_none_or(|v| k["queue"]["vhost"] == v))
            .collect(),
    )
}

/// The visible connection named `name`, else 404.
fn named(api: &Api, name: &str) -> Result<Arc<TrackedConnection>, ApiError> {
    visible(api, None)
        .into_iter()
        .find(|c| c.info.name() == name)
        .ok_or_else(ApiError::not_found)
}

pub(super) async fn connections(api: Api, uri: axum::http::Uri) -> ApiResult {
    reply_list(list_connections(&api, None), &uri)
}

pub(super) async fn vhost_connections(
    api: Api,
    Path(vhost): Path<String>,
    uri: axum::http::Uri,
) -> ApiResult {
    readable_vhost(&api, &vhost)?;
    reply_list(list_connections(&api, Some(&vhost)), &uri)
}

pub(super) async fn connection(api: Api, Path(name): Path<String>) -> ApiResult {
    let c = named(&api, &name)?;
    ok(connection_json(&node_name(api.broker.node_id()), &c))
}

pub(super) async fn connection_channels(
    api: Api,
    Path(name): Path<String>,
    uri: axum::http::Uri,
) -> ApiResult {
    let c = named(&api, &name)?;
    reply_list(list_channels(&api, &[c]), &uri)
}

/// Closes the connection: 320 CONNECTION_FORCED with `X-Reason` (or RabbitMQ's "Closed
/// via management plugin"); 204. The connection's own user or an administrator may.
pub(super) async fn close(api: Api, Path(name): Path<String>, headers: HeaderMap) -> ApiResult {
    let c = named(&api, &name)?;
    if !api.caller.is_admin() && c.info.user != api.caller.user {
        api.caller.require_admin()?;
    }
    let reason = headers
        .get("x-reason")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("Closed via management plugin")
        .to_owned();
    api.broker.tracking().close(c.info.id, reason);
    no_content()
}

pub(super) async fn channels(api: Api, uri: axum::http::Uri) -> ApiResult {
    let conns = visible(&api, None);
    reply_list(list_channels(&api, &conns), &uri)
}

pub(super) async fn vhost_channels(
    api: Api,
    Path(vhost): Path<String>,
    uri: axum::http::Uri,
) -> ApiResult {
    readable_vhost(&api, &vhost)?;
    let conns = visible(&api, Some(&vhost));
    reply_list(list_channels(&api, &conns), &uri)
}

pub(super) async fn channel(api: Api, Path(name): Path<String>) -> ApiResult {
    let conns = visible(&api, None);
    let list = list_channels(&api, &conns);
    list.as_array()
        .and_then(|a| a.iter().find(|c| c["name"] == name.as_str()).cloned())
        .map_or_else(|| Err(ApiError::not_found()), ok)
}

pub(super) async fn consumers(api: Api, uri: axum::http::Uri) -> ApiResult {
    reply_list(list_consumers(&api, None), &uri)
}

pub(super) async fn vhost_consumers(
    api: Api,
    Path(vhost): Path<String>,
    uri: axum::http::Uri,
) -> ApiResult {
    readable_vhost(&api, &vhost)?;
    reply_list(list_consumers(&api, Some(&vhost)), &uri)
}
