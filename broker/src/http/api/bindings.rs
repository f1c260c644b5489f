//! `/api/bindings`: list bindings (the default exchange's implicit ones first) and bind
//! a queue or an exchange to an exchange.

use axum::body::Bytes;
use axum::extract::Path;
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};

use super::body::{body_object, str_field};
use super::vhosts::{readable_vhost, readable_vhosts};
use super::{created, ok, ApiResult};
use crate::http::json::{json_to_table, table_to_json};
use crate::http::{Api, ApiError, Started};
use crate::meta::command::MetaCommand;
use crate::node::Broker;

/// The binding routes.
pub(super) fn routes() -> Router<Started> {
    Router::new()
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
}

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

pub(super) async fn bindings(api: Api) -> ApiResult {
    ok(Value::Array(bindings_in(
        &api.broker,
        &readable_vhosts(&api),
        true,
    )))
}

pub(super) async fn bindings_of(api: Api, Path(vhost): Path<String>) -> ApiResult {
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

pub(super) async fn bind_queue(
    api: Api,
    Path((vhost, source, dest)): Path<(String, String, String)>,
    body: Bytes,
) -> ApiResult {
    bind(api, vhost, source, dest, false, body).await
}

pub(super) async fn bind_exchange(
    api: Api,
    Path((vhost, source, dest)): Path<(String, String, String)>,
    body: Bytes,
) -> ApiResult {
    bind(api, vhost, source, dest, true, body).await
}
