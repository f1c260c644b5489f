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

pub(super) async fn vhosts(api: Api) -> ApiResult {
    let list: Vec<Value> = readable_vhosts(&api)
        .iter()
        .map(|v| vhost_json(&api.broker, v))
        .collect();
    ok(Value::Array(list))
}

pub(super) async fn vhost(api: Api, Path(vhost): Path<String>) -> ApiResult {
    readable_vhost(&api, &vhost)?;
    ok(vhost_json(&api.broker, &vhost))
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
