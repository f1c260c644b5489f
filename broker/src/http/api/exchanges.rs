//! `/api/exchanges`: list (all, per vhost), show, declare and delete exchanges.

use axum::body::Bytes;
use axum::extract::Path;
use axum::routing::get;
use axum::Router;
use serde_json::{json, Value};

use super::body::{body_object, bool_field, str_field};
use super::vhosts::{readable_vhost, readable_vhosts};
use super::{created, no_content, ok, ApiResult};
use crate::http::json::{json_to_table, table_to_json};
use crate::http::{Api, ApiError, Started};
use crate::meta::command::MetaCommand;
use crate::meta::ExchangeRecord;
use crate::node::Broker;

/// The exchange routes.
pub(super) fn routes() -> Router<Started> {
    Router::new()
        .route("/api/exchanges", get(exchanges))
        .route("/api/exchanges/{vhost}", get(exchanges_of))
        .route(
            "/api/exchanges/{vhost}/{name}",
            get(exchange).put(put_exchange).delete(delete_exchange),
        )
}

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
    let mut list: Vec<Value> = b
        .with_topology(|t| {
            vhosts
                .iter()
                .flat_map(|v| t.exchanges(v).map(move |e| exchange_json(v, e)))
                .collect()
        })
        .unwrap_or_default();
    for e in &mut list {
        with_stats(b, e);
    }
    list
}

/// Adds the exchange's `message_stats` (publishes through this node) to its JSON.
fn with_stats(b: &Broker, e: &mut Value) {
    let (Some(v), Some(n)) = (
        e["vhost"].as_str().map(str::to_owned),
        e["name"].as_str().map(str::to_owned),
    ) else {
        return;
    };
    let counts = b.tracking().exchange_counts(&v, &n);
    e["message_stats"] = crate::http::rates::exchange_stats(&v, &n, counts);
}

pub(super) async fn exchanges(api: Api, uri: axum::http::Uri) -> ApiResult {
    super::listing::reply_list(exchanges_in(&api.broker, &readable_vhosts(&api)), &uri)
}

pub(super) async fn exchanges_of(
    api: Api,
    Path(vhost): Path<String>,
    uri: axum::http::Uri,
) -> ApiResult {
    readable_vhost(&api, &vhost)?;
    super::listing::reply_list(exchanges_in(&api.broker, &[vhost]), &uri)
}

pub(super) async fn exchange(api: Api, Path((vhost, name)): Path<(String, String)>) -> ApiResult {
    readable_vhost(&api, &vhost)?;
    let name = if name == "amq.default" {
        String::new()
    } else {
        name
    };
    let mut e = api
        .broker
        .find_in_topology(|t| t.exchange(&vhost, &name).map(|e| exchange_json(&vhost, e)))
        .await
        .ok_or_else(ApiError::not_found)?;
    with_stats(&api.broker, &mut e);
    ok(e)
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

pub(super) async fn put_exchange(
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

pub(super) async fn delete_exchange(
    api: Api,
    Path((vhost, name)): Path<(String, String)>,
    uri: axum::http::Uri,
) -> ApiResult {
    api.caller.require_writer()?;
    readable_vhost(&api, &vhost)?;
    // RabbitMQ answers 404 for a missing exchange (`resource_exists`), not 204.
    let exists = api
        .broker
        .find_in_topology(|t| t.exchange(&vhost, &name).map(|_| ()))
        .await
        .is_some();
    if !exists {
        return Err(ApiError::not_found());
    }
    let if_unused = matches!(
        super::body::query_params(&uri)
            .get("if-unused")
            .map(String::as_str),
        Some("true")
    );
    api.broker
        .operator_write(MetaCommand::DeleteExchange {
            vhost,
            name,
            if_unused,
        })
        .await?;
    no_content()
}
