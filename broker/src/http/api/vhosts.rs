//! `/api/vhosts`: list, show, create (the creator gets full permissions) and delete
//! virtual hosts; which vhosts a caller may read.

use std::collections::BTreeMap;

use axum::body::Bytes;
use axum::extract::Path;
use axum::routing::get;
use axum::Router;
use serde_json::{json, Value};

use super::body::{body_object, str_field};
use super::{created, no_content, ok, ApiResult};
use crate::http::rates::{RateKey, RATES};
use crate::http::{node_name, Api, ApiError, Started};
use crate::meta::access::Permission;
use crate::meta::command::MetaCommand;
use crate::node::Broker;

/// The vhost routes.
pub(super) fn routes() -> Router<Started> {
    Router::new().route("/api/vhosts", get(vhosts)).route(
        "/api/vhosts/{vhost}",
        get(vhost).put(put_vhost).delete(delete_vhost),
    )
}

/// Whether `vhost` exists (false while the topology is unreadable).
pub(super) fn has_vhost(broker: &Broker, vhost: &str) -> bool {
    broker
        .with_topology(|t| t.has_vhost(vhost))
        .unwrap_or(false)
}

/// The vhosts the caller may read, sorted.
pub(super) fn readable_vhosts(api: &Api) -> Vec<String> {
    let all: Vec<String> = api
        .broker
        .with_topology(|t| t.vhosts().map(str::to_owned).collect())
        .unwrap_or_default();
    all.into_iter()
        .filter(|v| api.caller.may_read(&api.broker, v))
        .collect()
}

/// 404 unless `vhost` exists and the caller may read it.
pub(super) fn readable_vhost(api: &Api, vhost: &str) -> Result<(), ApiError> {
    if has_vhost(&api.broker, vhost) && api.caller.may_read(&api.broker, vhost) {
        Ok(())
    } else {
        Err(ApiError::not_found())
    }
}

/// Messages of a vhost's queues (ready, unacknowledged) and its `message_stats` (the
/// summed counts and rates of its open connections on this node).
fn vhost_stats(b: &Broker, name: &str, statuses: &[(String, [u64; 2])]) -> Value {
    let (ready, unacked) = statuses
        .iter()
        .filter(|(v, _)| v == name)
        .fold((0, 0), |(r, u), (_, [r2, u2])| (r + r2, u + u2));
    let conns: Vec<_> = b
        .tracking()
        .connections()
        .into_iter()
        .filter(|c| c.info.vhost == name)
        .map(|c| (RateKey::Connection(c.info.id), c.counts()))
        .collect();
    json!({
        "messages": ready + unacked,
        "messages_ready": ready,
        "messages_unacknowledged": unacked,
        "message_stats": RATES.message_stats_sum(&conns),
    })
}

/// (vhost, [ready, unacknowledged]) of every queue of `vhosts`.
async fn queue_counts(b: &Broker, vhosts: &[String]) -> Vec<(String, [u64; 2])> {
    let records = super::queues::queue_records(b, vhosts);
    let statuses = super::queues::statuses(b, &records).await;
    records
        .iter()
        .zip(statuses)
        .map(|(r, s)| {
            (
                r.vhost.clone(),
                [s.messages_ready, s.messages_unacknowledged],
            )
        })
        .collect()
}

fn vhost_json(b: &Broker, name: &str, counts: &[(String, [u64; 2])]) -> Value {
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
    let mut v = json!({
        "name": name,
        "description": description,
        "tags": [],
        "metadata": {"description": description, "tags": []},
        "default_queue_type": settings.default_queue_type.unwrap_or_else(|| "undefined".into()),
        "tracing": false,
        "cluster_state": state,
    });
    if let (Value::Object(m), Value::Object(stats)) = (&mut v, vhost_stats(b, name, counts)) {
        m.extend(stats);
    }
    v
}

pub(super) async fn vhosts(api: Api, uri: axum::http::Uri) -> ApiResult {
    let names = readable_vhosts(&api);
    let counts = queue_counts(&api.broker, &names).await;
    let list: Vec<Value> = names
        .iter()
        .map(|v| vhost_json(&api.broker, v, &counts))
        .collect();
    super::listing::reply_list(list, &uri)
}

pub(super) async fn vhost(api: Api, Path(vhost): Path<String>) -> ApiResult {
    readable_vhost(&api, &vhost)?;
    let counts = queue_counts(&api.broker, std::slice::from_ref(&vhost)).await;
    ok(vhost_json(&api.broker, &vhost, &counts))
}

/// `PUT /api/vhosts/{vhost}` `{"default_queue_type": …}`: 201 created (the caller gets full
/// permissions on it), 204 when it existed.
pub(super) async fn put_vhost(api: Api, Path(vhost): Path<String>, body: Bytes) -> ApiResult {
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

pub(super) async fn delete_vhost(api: Api, Path(vhost): Path<String>) -> ApiResult {
    api.caller.require_admin()?;
    api.broker
        .operator_write(MetaCommand::DeleteVhost { name: vhost })
        .await?;
    no_content()
}
