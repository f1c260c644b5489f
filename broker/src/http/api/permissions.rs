//! `/api/permissions`: list, show, set and clear a user's permissions in a vhost.

use axum::body::Bytes;
use axum::extract::Path;
use axum::routing::get;
use axum::Router;
use serde_json::{json, Value};

use super::body::{body_object, str_field};
use super::{created, no_content, ok, ApiResult};
use crate::http::{Api, ApiError, Started};
use crate::meta::access::Permission;
use crate::meta::command::MetaCommand;
use crate::node::Broker;

/// The permission routes.
pub(super) fn routes() -> Router<Started> {
    Router::new()
        .route("/api/permissions", get(permissions))
        .route(
            "/api/permissions/{vhost}/{user}",
            get(permission)
                .put(put_permission)
                .delete(delete_permission),
        )
}

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

pub(super) async fn permissions(api: Api) -> ApiResult {
    api.caller.require_admin()?;
    ok(Value::Array(all_permissions(&api.broker)))
}

pub(super) async fn permission(api: Api, Path((vhost, user)): Path<(String, String)>) -> ApiResult {
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
pub(super) async fn put_permission(
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

pub(super) async fn delete_permission(
    api: Api,
    Path((vhost, user)): Path<(String, String)>,
) -> ApiResult {
    api.caller.require_admin()?;
    api.broker
        .operator_write(MetaCommand::ClearPermissions { user, vhost })
        .await?;
    no_content()
}
