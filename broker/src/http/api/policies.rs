//! `/api/policies`: list (all, per vhost), show, set and clear policies (`administrator`
//! or `policymaker`).

use axum::body::Bytes;
use axum::extract::Path;
use axum::routing::get;
use axum::Router;
use serde_json::{json, Value};

use super::body::{body_object, str_field};
use super::vhosts::{has_vhost, readable_vhost, readable_vhosts};
use super::{created, no_content, ok, ApiResult};
use crate::http::{Api, ApiError, Started};
use crate::meta::command::MetaCommand;
use crate::meta::policy::Policy;
use crate::node::Broker;

/// The policy routes.
pub(super) fn routes() -> Router<Started> {
    Router::new()
        .route("/api/policies", get(policies))
        .route("/api/policies/{vhost}", get(policies_of))
        .route(
            "/api/policies/{vhost}/{name}",
            get(policy).put(put_policy).delete(delete_policy),
        )
}

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

pub(super) async fn policies(api: Api, uri: axum::http::Uri) -> ApiResult {
    super::listing::reply_list(policies_in(&api.broker, &readable_vhosts(&api)), &uri)
}

pub(super) async fn policies_of(
    api: Api,
    Path(vhost): Path<String>,
    uri: axum::http::Uri,
) -> ApiResult {
    readable_vhost(&api, &vhost)?;
    super::listing::reply_list(policies_in(&api.broker, &[vhost]), &uri)
}

pub(super) async fn policy(api: Api, Path((vhost, name)): Path<(String, String)>) -> ApiResult {
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
pub(super) async fn put_policy(
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

pub(super) async fn delete_policy(
    api: Api,
    Path((vhost, name)): Path<(String, String)>,
) -> ApiResult {
    api.caller.require_policymaker(&api.broker, &vhost)?;
    api.broker
        .operator_write(MetaCommand::ClearPolicy { vhost, name })
        .await?;
    no_content()
}
