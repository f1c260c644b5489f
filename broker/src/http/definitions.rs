//! `/api/definitions`: the cluster's users, vhosts, permissions, vhost limits, policies,
//! queues, exchanges and bindings exported and imported in RabbitMQ's definitions JSON, so
//! a file exported from RabbitMQ 3.10.8 (management UI, `rabbitmqadmin export`, `GET
//! /api/definitions`) imports here and the other way round. Password hashes are RabbitMQ's
//! `rabbit_password_hashing_sha256` layout, so users keep their passwords. Source: RabbitMQ
//! 3.10.8 `rabbit_definitions` (import order: users, vhosts, permissions, parameters,
//! policies, queues, exchanges, bindings) and an export captured from the installed 3.10.8
//! (`cluster-tests/tests/data/rabbitmq-3.10.8-definitions.json`).
//!
//! Not carried: topic permissions, runtime parameters other than `vhost-limits`, global
//! parameters (RabbitMQ's `internal_cluster_id` names a RabbitMQ cluster), user limits.

use axum::body::Bytes;
use axum::extract::Path;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Map, Value};

use super::api::{
    all_permissions, binding_command, bindings_in, body_object, declare_queue, exchange_declare,
    exchange_json, parse_tags, password_hash_of, policy_json, policy_of, user_json,
};
use super::{Api, ApiError, Started};
use crate::meta::access::{Permission, User};
use crate::meta::command::MetaCommand;
use crate::meta::VhostLimits;
use crate::node::Broker;

/// The definitions routes.
pub fn routes() -> Router<Started> {
    Router::new()
        .route("/api/definitions", get(export_all).post(import_all))
        .route(
            "/api/definitions/{vhost}",
            get(export_vhost).post(import_vhost),
        )
}

type ApiResult = Result<Response, ApiError>;

fn header() -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("rabbit_version".into(), "3.10.8".into());
    m.insert("rabbitmq_version".into(), "3.10.8".into());
    m.insert("product_name".into(), "quorumq".into());
    m.insert("product_version".into(), env!("CARGO_PKG_VERSION").into());
    m
}

/// The vhost-scoped sections of `vhosts` (parameters, policies, queues, exchanges,
/// bindings), each item with its `vhost` unless `strip_vhost`.
fn vhost_sections(b: &Broker, vhosts: &[String], strip_vhost: bool, out: &mut Map<String, Value>) {
    let (parameters, queues, exchanges, policies) = b
        .with_topology(|t| {
            let parameters: Vec<Value> = vhosts
                .iter()
                .filter_map(|v| {
                    let l = t.vhost_limits(v);
                    (!l.is_empty()).then(|| {
                        json!({
                            "value": serde_json::from_str::<Value>(&l.to_json()).unwrap_or_default(),
                            "vhost": v, "component": "vhost-limits", "name": "limits",
                        })
                    })
                })
                .collect();
            let queues: Vec<Value> = t
                .queues()
                .filter(|q| vhosts.contains(&q.vhost) && q.exclusive_owner.is_none())
                .map(|q| {
                    json!({"name": q.name, "vhost": q.vhost, "durable": q.durable,
                           "auto_delete": q.auto_delete,
                           "arguments": super::json::table_to_json(&q.arguments)})
                })
                .collect();
            let exchanges: Vec<Value> = vhosts
                .iter()
                .flat_map(|v| {
                    t.exchanges(v)
                        .filter(|e| !e.name.is_empty() && !e.name.starts_with("amq."))
                        .map(move |e| exchange_json(v, e))
                })
                .collect();
            let policies: Vec<Value> = vhosts
                .iter()
                .flat_map(|v| t.policies(v))
                .map(|p| policy_json(&p))
                .collect();
            (parameters, queues, exchanges, policies)
        })
        .unwrap_or_default();
    let bindings = bindings_in(b, vhosts, false)
        .into_iter()
        .map(|mut v| {
            if let Value::Object(m) = &mut v {
                m.remove("properties_key");
            }
            v
        })
        .collect();
    for (key, items) in [
        ("parameters", parameters),
        ("policies", policies),
        ("queues", queues),
        ("exchanges", exchanges),
        ("bindings", bindings),
    ] {
        let items = items
            .into_iter()
            .map(|mut v| {
                if strip_vhost {
                    if let Value::Object(m) = &mut v {
                        m.remove("vhost");
                    }
                }
                v
            })
            .collect();
        out.insert(key.into(), Value::Array(items));
    }
}

/// `GET /api/definitions`: everything (administrator only).
async fn export_all(api: Api) -> ApiResult {
    api.caller.require_admin()?;
    let b = &api.broker;
    let mut out = header();
    let (users, vhosts): (Vec<Value>, Vec<String>) = b
        .with_topology(|t| {
            (
                t.access().users().map(user_json).collect(),
                t.vhosts().map(str::to_owned).collect(),
            )
        })
        .unwrap_or_default();
    let vhost_items: Vec<Value> = vhosts
        .iter()
        .map(|v| {
            let dqt = b
                .with_topology(|t| t.vhost_settings(v).default_queue_type)
                .flatten();
            match dqt {
                Some(t) => json!({"name": v, "default_queue_type": t}),
                None => json!({"name": v}),
            }
        })
        .collect();
    out.insert("users".into(), Value::Array(users));
    out.insert("vhosts".into(), Value::Array(vhost_items));
    out.insert("permissions".into(), Value::Array(all_permissions(b)));
    out.insert("topic_permissions".into(), json!([]));
    out.insert("global_parameters".into(), json!([]));
    vhost_sections(b, &vhosts, false, &mut out);
    Ok(Json(Value::Object(out)).into_response())
}

/// `GET /api/definitions/{vhost}`: one vhost's objects, without `vhost` fields.
async fn export_vhost(api: Api, Path(vhost): Path<String>) -> ApiResult {
    api.caller.require_admin()?;
    if !api
        .broker
        .with_topology(|t| t.has_vhost(&vhost))
        .unwrap_or(false)
    {
        return Err(ApiError::not_found());
    }
    let mut out = header();
    vhost_sections(&api.broker, &[vhost], true, &mut out);
    Ok(Json(Value::Object(out)).into_response())
}

/// `POST /api/definitions`: imports a definitions document; 204 when everything was
/// applied.
///
/// Errors: 400 with the first failure's reason (what came before it stays applied, as in
/// RabbitMQ).
async fn import_all(api: Api, body: Bytes) -> ApiResult {
    api.caller.require_admin()?;
    let doc = body_object(&body)?;
    import(&api.broker, &doc, None).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `POST /api/definitions/{vhost}`: imports the vhost-scoped sections into `vhost`.
async fn import_vhost(api: Api, Path(vhost): Path<String>, body: Bytes) -> ApiResult {
    api.caller.require_admin()?;
    if !api
        .broker
        .with_topology(|t| t.has_vhost(&vhost))
        .unwrap_or(false)
    {
        return Err(ApiError::not_found());
    }
    let doc = body_object(&body)?;
    import(&api.broker, &doc, Some(&vhost)).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

fn items<'a>(
    doc: &'a Map<String, Value>,
    key: &str,
) -> impl Iterator<Item = &'a Map<String, Value>> {
    doc.get(key)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object)
}

fn text<'a>(m: &'a Map<String, Value>, key: &str) -> Result<&'a str, ApiError> {
    m.get(key).and_then(Value::as_str).ok_or_else(|| {
        ApiError::bad_request(format!(
            "key_missing: {key} in {}",
            Value::Object(m.clone())
        ))
    })
}

/// Applies `doc` in RabbitMQ's import order. `into` = a vhost import: items' own `vhost`
/// fields are ignored and users, vhosts and permissions are not read.
async fn import(
    b: &std::sync::Arc<Broker>,
    doc: &Map<String, Value>,
    into: Option<&str>,
) -> Result<(), ApiError> {
    let vhost_of = |m: &Map<String, Value>| -> Result<String, ApiError> {
        match into {
            Some(v) => Ok(v.to_owned()),
            None => text(m, "vhost").map(str::to_owned),
        }
    };
    if into.is_none() {
        for u in items(doc, "users") {
            let name = text(u, "name")?.to_owned();
            let user = User {
                name: name.clone(),
                password_hash: password_hash_of(u)?,
                tags: parse_tags(u.get("tags")),
            };
            let exists = b
                .with_topology(|t| t.access().user(&name).is_some())
                .unwrap_or(false);
            if exists {
                b.operator_write(MetaCommand::SetPasswordHash {
                    name: name.clone(),
                    hash: user.password_hash,
                })
                .await?;
                b.operator_write(MetaCommand::SetUserTags {
                    name,
                    tags: user.tags,
                })
                .await?;
            } else {
                b.operator_write(MetaCommand::AddUser(user)).await?;
            }
        }
        for v in items(doc, "vhosts") {
            let dqt = v
                .get("default_queue_type")
                .or_else(|| v.get("metadata").and_then(|m| m.get("default_queue_type")))
                .and_then(Value::as_str)
                .filter(|t| !t.is_empty() && *t != "undefined")
                .map(str::to_owned);
            b.operator_write(MetaCommand::AddVhost {
                name: text(v, "name")?.to_owned(),
                default_queue_type: dqt,
            })
            .await?;
        }
        for p in items(doc, "permissions") {
            b.operator_write(MetaCommand::SetPermissions {
                user: text(p, "user")?.to_owned(),
                vhost: text(p, "vhost")?.to_owned(),
                permission: Permission {
                    configure: text(p, "configure")?.to_owned(),
                    write: text(p, "write")?.to_owned(),
                    read: text(p, "read")?.to_owned(),
                },
            })
            .await?;
        }
    }
    for p in items(doc, "parameters") {
        if p.get("component").and_then(Value::as_str) != Some("vhost-limits") {
            let parameter = Value::Object(p.clone()).to_string();
            tracing::warn!(%parameter, "definitions import: runtime parameter not supported, skipped");
            continue;
        }
        let value = p.get("value").cloned().unwrap_or_default();
        let limits = VhostLimits::parse(&value.to_string()).map_err(ApiError::bad_request)?;
        b.operator_write(MetaCommand::SetVhostLimits {
            vhost: vhost_of(p)?,
            limits,
        })
        .await?;
    }
    for p in items(doc, "policies") {
        let policy = policy_of(&vhost_of(p)?, text(p, "name")?, p)?;
        b.operator_write(MetaCommand::SetPolicy(policy)).await?;
    }
    for q in items(doc, "queues") {
        declare_queue(b, &vhost_of(q)?, text(q, "name")?, q).await?;
    }
    for e in items(doc, "exchanges") {
        b.operator_write(exchange_declare(&vhost_of(e)?, text(e, "name")?, e)?)
            .await?;
    }
    for bd in items(doc, "bindings") {
        let to_exchange = text(bd, "destination_type")? == "exchange";
        b.operator_write(binding_command(
            &vhost_of(bd)?,
            text(bd, "source")?,
            text(bd, "destination")?,
            to_exchange,
            bd,
        )?)
        .await?;
    }
    b.topology_changed();
    Ok(())
}
