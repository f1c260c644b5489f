//! `/api/bindings`: list bindings (the default exchange's implicit ones first) and bind
//! a queue or an exchange to an exchange.

use axum::body::Bytes;
use axum::extract::Path;
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};

use super::body::{body_object, str_field};
use super::vhosts::{readable_vhost, readable_vhosts};
use super::{created, no_content, ok, ApiResult};
use crate::http::json::{json_to_table, table_to_json};
use crate::http::{Api, ApiError, Started};
use crate::meta::command::MetaCommand;
use crate::meta::queue::Binding;
use crate::node::Broker;

/// The binding routes.
pub(super) fn routes() -> Router<Started> {
    Router::new()
        .route("/api/bindings", get(bindings))
        .route("/api/bindings/{vhost}", get(bindings_of))
        .route(
            "/api/bindings/{vhost}/e/{source}/q/{destination}",
            post(bind_queue).get(queue_bindings_between),
        )
        .route(
            "/api/bindings/{vhost}/e/{source}/e/{destination}",
            post(bind_exchange).get(exchange_bindings_between),
        )
        .route(
            "/api/bindings/{vhost}/e/{source}/q/{destination}/{props}",
            get(queue_binding).delete(unbind_queue),
        )
        .route(
            "/api/bindings/{vhost}/e/{source}/e/{destination}/{props}",
            get(exchange_binding).delete(unbind_exchange),
        )
        .route("/api/queues/{vhost}/{name}/bindings", get(of_queue))
        .route(
            "/api/exchanges/{vhost}/{name}/bindings/source",
            get(from_exchange),
        )
        .route(
            "/api/exchanges/{vhost}/{name}/bindings/destination",
            get(to_exchange),
        )
}

/// `GET /api/queues/V/Q/bindings`: the queue's bindings, the default
/// exchange's implicit one first (`rabbit_mgmt_wm_bindings`, mode queue). As
/// RabbitMQ 3.10.8 answers: 200 even for a queue that does not exist (with
/// only the implicit binding) and `[]` for a vhost that does not exist.
pub(super) async fn of_queue(
    api: Api,
    Path((vhost, name)): Path<(String, String)>,
    uri: axum::http::Uri,
) -> ApiResult {
    if readable_vhost(&api, &vhost).is_err() {
        return super::listing::reply_list(Vec::new(), &uri);
    }
    let implicit = json!({"source": "", "vhost": vhost, "destination": name,
                          "destination_type": "queue", "routing_key": name,
                          "arguments": {}, "properties_key": quote_plus(&name)});
    let list = std::iter::once(implicit)
        .chain(
            bindings_in(&api.broker, std::slice::from_ref(&vhost), false)
                .into_iter()
                .filter(|b| b["destination_type"] == "queue" && b["destination"] == name.as_str()),
        )
        .collect();
    super::listing::reply_list(list, &uri)
}

/// `GET /api/exchanges/V/E/bindings/source` (bindings whose source is E; for
/// `amq.default` the implicit ones) and `.../destination` (exchange-to-exchange
/// bindings whose destination is E) (`rabbit_mgmt_wm_bindings`, modes
/// exchange_source and exchange_destination). As RabbitMQ 3.10.8 answers:
/// `[]` (200) for an exchange or vhost that does not exist.
async fn exchange_bindings(
    api: Api,
    vhost: String,
    name: String,
    as_source: bool,
    uri: axum::http::Uri,
) -> ApiResult {
    if readable_vhost(&api, &vhost).is_err() {
        return super::listing::reply_list(Vec::new(), &uri);
    }
    let name = if name == "amq.default" {
        String::new()
    } else {
        name
    };
    let list = bindings_in(&api.broker, std::slice::from_ref(&vhost), true)
        .into_iter()
        .filter(|b| {
            if as_source {
                b["source"] == name.as_str()
            } else {
                b["destination_type"] == "exchange" && b["destination"] == name.as_str()
            }
        })
        .collect();
    super::listing::reply_list(list, &uri)
}

pub(super) async fn from_exchange(
    api: Api,
    Path((vhost, name)): Path<(String, String)>,
    uri: axum::http::Uri,
) -> ApiResult {
    exchange_bindings(api, vhost, name, true, uri).await
}

pub(super) async fn to_exchange(
    api: Api,
    Path((vhost, name)): Path<(String, String)>,
    uri: axum::http::Uri,
) -> ApiResult {
    exchange_bindings(api, vhost, name, false, uri).await
}

/// RabbitMQ's `properties_key` of a binding (`rabbit_mgmt_format:pack_binding_props/2`):
/// the routing key quoted as a URL form value with `~` as `%7E` (`~` alone when empty),
/// with `~` and a digest of the arguments appended when there are any. RabbitMQ's digest
/// is the base64 of an MD5 of the Erlang term; quorumq's is a CRC-32 of the arguments'
/// JSON (the key names the binding on this broker only, as RabbitMQ's does).
pub fn properties_key(routing_key: &str, arguments: &amq_protocol::types::FieldTable) -> String {
    let key = if routing_key.is_empty() && arguments.inner().is_empty() {
        "~".to_owned()
    } else {
        quote_plus(routing_key)
    };
    if arguments.inner().is_empty() {
        key
    } else {
        let digest = crc32fast::hash(table_to_json(arguments).to_string().as_bytes());
        format!("{key}~{digest:08x}")
    }
}

/// `rabbit_http_util:quote_plus/1` then `~` → `%7E`: letters, digits, `.`, `-`, `_` as
/// they are, space as `+`, other bytes `%XX`.
fn quote_plus(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for &b in s.as_bytes() {
        match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'.' | b'-' | b'_' => out.push(b as char),
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

fn binding_json(vhost: &str, bd: &Binding) -> Value {
    json!({
        "source": bd.exchange,
        "vhost": vhost,
        "destination": bd.queue,
        "destination_type": if bd.to_exchange { "exchange" } else { "queue" },
        "routing_key": bd.routing_key,
        "arguments": table_to_json(&bd.arguments),
        "properties_key": properties_key(&bd.routing_key, &bd.arguments),
    })
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
                           "arguments": {}, "properties_key": quote_plus(q)})
                }));
            }
            for e in t.exchanges(v) {
                for bd in t.bindings(v, &e.name) {
                    out.push(binding_json(v, bd));
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

/// The explicit bindings of `source` to `destination` (a queue, or an exchange when
/// `to_exchange`); the default exchange's implicit binding of a queue too
/// (`rabbit_mgmt_wm_bindings` lists it; it cannot be deleted).
async fn bindings_between(
    b: &Broker,
    vhost: &str,
    source: &str,
    destination: &str,
    to_exchange: bool,
) -> Result<Vec<Value>, ApiError> {
    // Both ends, after a meta catch-up if this node does not know them yet.
    b.find_in_topology(|t| {
        let dest_exists = if to_exchange {
            t.exchange(vhost, destination).is_some()
        } else {
            t.queue(vhost, destination).is_some()
        };
        (t.exchange(vhost, source).is_some() && dest_exists).then_some(())
    })
    .await
    .ok_or_else(ApiError::not_found)?;
    b.with_topology(|t| {
        let mut out = Vec::new();
        if source.is_empty() && !to_exchange {
            out.push(
                json!({"source": "", "vhost": vhost, "destination": destination,
                            "destination_type": "queue", "routing_key": destination,
                            "arguments": {}, "properties_key": quote_plus(destination)}),
            );
        }
        out.extend(
            t.bindings(vhost, source)
                .iter()
                .filter(|bd| bd.to_exchange == to_exchange && bd.queue == destination)
                .map(|bd| binding_json(vhost, bd)),
        );
        Ok(out)
    })
    .unwrap_or_else(|| Err(ApiError::not_found()))
}

/// The binding `props` (its `properties_key`) of `source` to `destination`.
async fn find_binding(
    b: &Broker,
    vhost: &str,
    source: &str,
    destination: &str,
    to_exchange: bool,
    props: &str,
) -> Option<Binding> {
    b.find_in_topology(|t| {
        t.bindings(vhost, source)
            .iter()
            .find(|bd| {
                bd.to_exchange == to_exchange
                    && bd.queue == destination
                    && properties_key(&bd.routing_key, &bd.arguments) == props
            })
            .cloned()
    })
    .await
}

pub(super) async fn queue_bindings_between(
    api: Api,
    Path((vhost, source, dest)): Path<(String, String, String)>,
) -> ApiResult {
    readable_vhost(&api, &vhost)?;
    ok(Value::Array(
        bindings_between(&api.broker, &vhost, &source, &dest, false).await?,
    ))
}

pub(super) async fn exchange_bindings_between(
    api: Api,
    Path((vhost, source, dest)): Path<(String, String, String)>,
) -> ApiResult {
    readable_vhost(&api, &vhost)?;
    ok(Value::Array(
        bindings_between(&api.broker, &vhost, &source, &dest, true).await?,
    ))
}

async fn one_binding(
    api: Api,
    path: (String, String, String, String),
    to_exchange: bool,
) -> ApiResult {
    let (vhost, source, dest, props) = path;
    readable_vhost(&api, &vhost)?;
    match find_binding(&api.broker, &vhost, &source, &dest, to_exchange, &props).await {
        Some(bd) => ok(binding_json(&vhost, &bd)),
        None => Err(ApiError::not_found()),
    }
}

pub(super) async fn queue_binding(
    api: Api,
    Path(path): Path<(String, String, String, String)>,
) -> ApiResult {
    one_binding(api, path, false).await
}

pub(super) async fn exchange_binding(
    api: Api,
    Path(path): Path<(String, String, String, String)>,
) -> ApiResult {
    one_binding(api, path, true).await
}

/// Deletes the binding `props` (queue.unbind / exchange.unbind with its routing key and
/// arguments). 404 when there is none (RabbitMQ `rabbit_mgmt_wm_binding`).
async fn unbind(api: Api, path: (String, String, String, String), to_exchange: bool) -> ApiResult {
    let (vhost, source, dest, props) = path;
    api.caller.require_writer()?;
    readable_vhost(&api, &vhost)?;
    let bd = find_binding(&api.broker, &vhost, &source, &dest, to_exchange, &props)
        .await
        .ok_or_else(ApiError::not_found)?;
    let cmd = if to_exchange {
        MetaCommand::UnbindExchange {
            vhost,
            destination: bd.queue,
            source: bd.exchange,
            routing_key: bd.routing_key,
            arguments: bd.arguments,
        }
    } else {
        MetaCommand::Unbind {
            vhost,
            queue: bd.queue,
            exchange: bd.exchange,
            routing_key: bd.routing_key,
            arguments: bd.arguments,
        }
    };
    api.broker.operator_write(cmd).await?;
    api.broker.topology_changed();
    no_content()
}

pub(super) async fn unbind_queue(
    api: Api,
    Path(path): Path<(String, String, String, String)>,
) -> ApiResult {
    unbind(api, path, false).await
}

pub(super) async fn unbind_exchange(
    api: Api,
    Path(path): Path<(String, String, String, String)>,
) -> ApiResult {
    unbind(api, path, true).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use amq_protocol::types::{AMQPValue, FieldTable};

    #[test]
    fn properties_key_as_rabbitmq_quotes_it() {
        let none = FieldTable::default();
        assert_eq!(properties_key("", &none), "~");
        assert_eq!(properties_key("a.b", &none), "a.b");
        assert_eq!(properties_key("a b~c/#", &none), "a+b%7Ec%2F%23");
        let mut args = FieldTable::default();
        args.insert("x-match".into(), AMQPValue::LongString("all".into()));
        let k = properties_key("", &args);
        assert!(k.starts_with("~") && k.len() == 9, "{k}");
        assert!(properties_key("rk", &args).starts_with("rk~"));
    }
}
