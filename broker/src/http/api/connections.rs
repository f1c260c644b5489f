//! `/api/connections`, `/api/channels`, `/api/consumers` and their per-vhost forms: the
//! live AMQP connections of every node of the cluster, their channels and consumers, in
//! RabbitMQ 3.10.8's shapes (`rabbit_mgmt_wm_connections`, `_channels`, `_consumers`), and
//! `DELETE /api/connections/{name}`, which closes a connection (on whichever node holds
//! it) with 320 CONNECTION_FORCED and the `X-Reason` header's text ("Closed via
//! management plugin" without one). Users without `administrator` or `monitoring` see
//! their own connections only, as RabbitMQ's.
//!
//! Each node lists its own from its tracking ([`crate::tracking`]); the answering node
//! adds the other running nodes' lists (admin RPC `Tracking`, [`REMOTE_WAIT`] each, asked
//! together). A node that does not answer in time is left out of the listing (its
//! connections are not shown), as a RabbitMQ node's are while it is unreachable.

use std::sync::atomic::Ordering::Relaxed;

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
use std::time::Duration;

use quorumq_proto::v1::{CloseConnectionRequest, TrackingRequest};

use crate::cluster::membership::admin_client;
use crate::http::json::table_to_json;
use crate::http::rates::{RateKey, RATES};
use crate::http::{node_name, Api, ApiError, Started};
use crate::node::Broker;
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

/// How long the answering node waits for each other node's listing.
pub const REMOTE_WAIT: Duration = Duration::from_secs(2);

/// What a listing gathers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// AMQP connections.
    Connections,
    /// Their channels.
    Channels,
    /// The channels' consumers.
    Consumers,
}

impl Kind {
    /// The kind's name in the admin RPC (`TrackingRequest.kind`).
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Connections => "connections",
            Kind::Channels => "channels",
            Kind::Consumers => "consumers",
        }
    }

    /// The kind named `name` ([`Kind::as_str`]).
    pub fn from_name(name: &str) -> Option<Kind> {
        [Kind::Connections, Kind::Channels, Kind::Consumers]
            .into_iter()
            .find(|k| k.as_str() == name)
    }
}

/// This node's connections, channels or consumers, every user's, as the
/// management API shows them.
pub fn local_items(b: &Broker, kind: Kind) -> Vec<Value> {
    let node = node_name(b.node_id());
    let conns = b.tracking().connections();
    match kind {
        Kind::Connections => conns.iter().map(|c| connection_json(&node, c)).collect(),
        Kind::Channels => conns
            .iter()
            .flat_map(|c| {
                c.channels()
                    .into_iter()
                    .map(|(k, ch)| channel_json(&node, c, k, &ch))
                    .collect::<Vec<_>>()
            })
            .collect(),
        Kind::Consumers => conns
            .iter()
            .flat_map(|c| {
                c.channels()
                    .into_iter()
                    .flat_map(|(_, ch)| consumers_json(&node, c, &ch))
                    .collect::<Vec<_>>()
            })
            .collect(),
    }
}

/// Closes this node's connection named `name` with 320 CONNECTION_FORCED and
/// `reason`; false when this node has none of that name.
pub fn close_local(b: &Broker, name: &str, reason: String) -> bool {
    let found = b
        .tracking()
        .connections()
        .into_iter()
        .find(|c| c.info.name() == name);
    match found {
        Some(c) => b.tracking().close(c.info.id, reason),
        None => false,
    }
}

/// Every running node's items of `kind`, with the node that holds each:
/// this node's, then the others' ([`REMOTE_WAIT`] each, asked together).
async fn gather(b: &Broker, kind: Kind) -> Vec<(u64, Value)> {
    let me = b.node_id();
    let mut items: Vec<(u64, Value)> = local_items(b, kind).into_iter().map(|v| (me, v)).collect();
    let others: Vec<u64> = b
        .cluster_status()
        .nodes
        .iter()
        .filter(|n| n.id != me && n.running)
        .map(|n| n.id)
        .collect();
    let asks = others.into_iter().map(|node| async move {
        let Ok(mut client) = admin_client(b.queues(), node) else {
            return Vec::new();
        };
        let ask = client.tracking(TrackingRequest {
            kind: kind.as_str().to_string(),
        });
        match tokio::time::timeout(REMOTE_WAIT, ask).await {
            Ok(Ok(reply)) => {
                let reply = reply.into_inner();
                match serde_json::from_str::<Value>(&reply.json) {
                    Ok(Value::Array(list)) if reply.ok => {
                        list.into_iter().map(|v| (node, v)).collect()
                    }
                    _ => Vec::new(),
                }
            }
            Ok(Err(e)) => {
                tracing::debug!(node, kind = kind.as_str(), error = %e.message(), "listing not answered");
                Vec::new()
            }
            Err(_) => {
                tracing::debug!(node, kind = kind.as_str(), "listing not answered in time");
                Vec::new()
            }
        }
    });
    for list in futures::future::join_all(asks).await {
        items.extend(list);
    }
    items
}

/// The user and vhost an item belongs to (a consumer: its channel's user,
/// its queue's vhost).
fn owner(kind: Kind, item: &Value) -> (&str, &str) {
    let (user, vhost) = match kind {
        Kind::Consumers => (&item["channel_details"]["user"], &item["queue"]["vhost"]),
        _ => (&item["user"], &item["vhost"]),
    };
    (user.as_str().unwrap_or(""), vhost.as_str().unwrap_or(""))
}

/// The items of `kind` on every node that `api`'s caller may see, of `vhost`
/// when given: all for `administrator`/`monitoring`, else the caller's own
/// in vhosts it may read.
async fn visible(api: &Api, kind: Kind, vhost: Option<&str>) -> Vec<(u64, Value)> {
    gather(&api.broker, kind)
        .await
        .into_iter()
        .filter(|(_, item)| {
            let (user, v) = owner(kind, item);
            vhost.is_none_or(|want| v == want)
                && (api.caller.sees_all()
                    || (user == api.caller.user && api.caller.may_read(&api.broker, v)))
        })
        .collect()
}

/// The items of [`visible`] without their nodes.
async fn visible_list(api: &Api, kind: Kind, vhost: Option<&str>) -> Value {
    Value::Array(
        visible(api, kind, vhost)
            .await
            .into_iter()
            .map(|(_, v)| v)
            .collect(),
    )
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

/// The visible connection named `name` and its node, else 404.
async fn named(api: &Api, name: &str) -> Result<(u64, Value), ApiError> {
    visible(api, Kind::Connections, None)
        .await
        .into_iter()
        .find(|(_, c)| c["name"] == name)
        .ok_or_else(ApiError::not_found)
}

pub(super) async fn connections(api: Api, uri: axum::http::Uri) -> ApiResult {
    reply_list(visible_list(&api, Kind::Connections, None).await, &uri)
}

pub(super) async fn vhost_connections(
    api: Api,
    Path(vhost): Path<String>,
    uri: axum::http::Uri,
) -> ApiResult {
    readable_vhost(&api, &vhost)?;
    reply_list(
        visible_list(&api, Kind::Connections, Some(&vhost)).await,
        &uri,
    )
}

pub(super) async fn connection(api: Api, Path(name): Path<String>) -> ApiResult {
    ok(named(&api, &name).await?.1)
}

pub(super) async fn connection_channels(
    api: Api,
    Path(name): Path<String>,
    uri: axum::http::Uri,
) -> ApiResult {
    named(&api, &name).await?;
    let list: Vec<Value> = visible(&api, Kind::Channels, None)
        .await
        .into_iter()
        .map(|(_, ch)| ch)
        .filter(|ch| ch["connection_details"]["name"] == name.as_str())
        .collect();
    reply_list(Value::Array(list), &uri)
}

/// Closes the connection, on whichever node holds it: 320 CONNECTION_FORCED with
/// `X-Reason` (or RabbitMQ's "Closed via management plugin"); 204. The connection's
/// own user or an administrator may. 404 when no node has it (any more).
pub(super) async fn close(api: Api, Path(name): Path<String>, headers: HeaderMap) -> ApiResult {
    let (node, c) = named(&api, &name).await?;
    let (user, _) = owner(Kind::Connections, &c);
    if !api.caller.is_admin() && user != api.caller.user {
        api.caller.require_admin()?;
    }
    let reason = headers
        .get("x-reason")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("Closed via management plugin")
        .to_owned();
    let closed = if node == api.broker.node_id() {
        close_local(&api.broker, &name, reason)
    } else {
        let mut client = admin_client(api.broker.queues(), node).map_err(|e| {
            ApiError::new(
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                "service_unavailable",
                e,
            )
        })?;
        let ask = client.close_connection(CloseConnectionRequest { name, reason });
        match tokio::time::timeout(REMOTE_WAIT, ask).await {
            Ok(Ok(r)) => r.into_inner().ok,
            Ok(Err(e)) => {
                return Err(ApiError::new(
                    axum::http::StatusCode::SERVICE_UNAVAILABLE,
                    "service_unavailable",
                    format!("node {node}: {}", e.message()),
                ))
            }
            Err(_) => {
                return Err(ApiError::new(
                    axum::http::StatusCode::SERVICE_UNAVAILABLE,
                    "service_unavailable",
                    format!("node {node} did not answer"),
                ))
            }
        }
    };
    if closed {
        no_content()
    } else {
        Err(ApiError::not_found())
    }
}

pub(super) async fn channels(api: Api, uri: axum::http::Uri) -> ApiResult {
    reply_list(visible_list(&api, Kind::Channels, None).await, &uri)
}

pub(super) async fn vhost_channels(
    api: Api,
    Path(vhost): Path<String>,
    uri: axum::http::Uri,
) -> ApiResult {
    readable_vhost(&api, &vhost)?;
    reply_list(visible_list(&api, Kind::Channels, Some(&vhost)).await, &uri)
}

pub(super) async fn channel(api: Api, Path(name): Path<String>) -> ApiResult {
    visible(&api, Kind::Channels, None)
        .await
        .into_iter()
        .map(|(_, ch)| ch)
        .find(|c| c["name"] == name.as_str())
        .map_or_else(|| Err(ApiError::not_found()), ok)
}

pub(super) async fn consumers(api: Api, uri: axum::http::Uri) -> ApiResult {
    reply_list(visible_list(&api, Kind::Consumers, None).await, &uri)
}

pub(super) async fn vhost_consumers(
    api: Api,
    Path(vhost): Path<String>,
    uri: axum::http::Uri,
) -> ApiResult {
    readable_vhost(&api, &vhost)?;
    reply_list(
        visible_list(&api, Kind::Consumers, Some(&vhost)).await,
        &uri,
    )
}
