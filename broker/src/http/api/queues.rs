//! `/api/queues`: list (all, per vhost), show, declare and delete queues, with each
//! queue's status asked from its leader.

use axum::body::Bytes;
use axum::extract::Path;
use axum::routing::get;
use axum::Router;
use futures::StreamExt;
use serde_json::{json, Value};

use super::body::{body_object, bool_field, query_params};
use super::listing;
use super::vhosts::{readable_vhost, readable_vhosts};
use super::{created, no_content, ok, ApiResult};
use crate::http::json::{json_to_table, table_to_json};
use crate::http::rates::{RateKey, RATES};
use crate::http::{node_name, Api, ApiError, Started};
use crate::meta::command::{MetaCommand, MetaReply};
use crate::meta::{QueueKind, QueueRecord, QueueType};
use crate::node::Broker;

/// How many queues' statuses a listing asks at once (each may be a round trip to the
/// queue's leader on another node).
const QUEUE_STATUS_CONCURRENCY: usize = 32;

/// The queue routes.
pub(super) fn routes() -> Router<Started> {
    Router::new()
        .route("/api/queues", get(queues))
        .route("/api/queues/{vhost}", get(queues_of))
        .route(
            "/api/queues/{vhost}/{name}",
            get(queue).put(put_queue).delete(delete_queue),
        )
}

/// Queue records of `vhosts` (exclusive ones included, as RabbitMQ lists them).
pub(super) fn queue_records(b: &Broker, vhosts: &[String]) -> Vec<QueueRecord> {
    b.with_topology(|t| {
        t.queues()
            .filter(|q| vhosts.contains(&q.vhost))
            .cloned()
            .collect()
    })
    .unwrap_or_default()
}

pub(super) async fn statuses(
    b: &Broker,
    records: &[QueueRecord],
) -> Vec<crate::cluster::status::QueueStatus> {
    let asks: Vec<_> = records.iter().map(|r| b.queue_status(r)).collect();
    futures::stream::iter(asks)
        .buffered(QUEUE_STATUS_CONCURRENCY)
        .collect()
        .await
}

/// The queue's type as clients see it: a durable queue declared classic is replicated
/// here but behaves, and lists, as classic.
pub fn queue_type(rec: &QueueRecord) -> &'static str {
    match rec.kind {
        QueueKind::Quorum if QueueType::of_args(&rec.arguments) == QueueType::Quorum => "quorum",
        _ => "classic",
    }
}

/// The queue's `message_stats` through this node (publishes, deliveries, acks of this
/// node's clients) with rates.
fn message_stats(b: &Broker, rec: &QueueRecord) -> Value {
    match b.queue(&rec.vhost, &rec.name) {
        Some((_, h)) => RATES.message_stats(RateKey::Queue(h.group), h.stats.snapshot()),
        None => crate::http::rates::stats_json([0; 5], [0.0; 5]),
    }
}

fn queue_json(b: &Broker, rec: &QueueRecord, st: &crate::cluster::status::QueueStatus) -> Value {
    let (policy, definition) = b
        .with_topology(|t| {
            t.queue_policy(&rec.vhost, &rec.name)
                .map(|p| (Value::from(p.name.clone()), p.definition.clone()))
        })
        .flatten()
        .unwrap_or((Value::Null, json!({})));
    let leader = st.leader.map(node_name);
    let names = |ids: &[u64]| ids.iter().copied().map(node_name).collect::<Vec<_>>();
    let state = if st.leader.is_some() {
        "running"
    } else {
        "minority"
    };
    json!({
        "name": rec.name,
        "vhost": rec.vhost,
        "type": queue_type(rec),
        "durable": rec.durable,
        "auto_delete": rec.auto_delete,
        "exclusive": rec.exclusive_owner.is_some(),
        "arguments": table_to_json(&rec.arguments),
        "node": leader,
        "leader": leader,
        "members": names(&st.members),
        "online": names(&st.online),
        "state": state,
        "policy": policy,
        "operator_policy": null,
        "effective_policy_definition": definition,
        "consumers": st.consumers,
        // 4.3 counts delayed-retry messages in the total (messages_total).
        "messages": st.messages_ready + st.messages_unacknowledged + st.messages_delayed,
        "messages_ready": st.messages_ready,
        "messages_unacknowledged": st.messages_unacknowledged,
        "messages_delayed": st.messages_delayed,
        "messages_dlx": st.dead_letter_held,
        "unreadable_bodies": st.unreadable_bodies,
        "message_stats": message_stats(b, rec),
    })
}

async fn queues_in(b: &Broker, vhosts: &[String]) -> Vec<Value> {
    let records = queue_records(b, vhosts);
    let statuses = statuses(b, &records).await;
    records
        .iter()
        .zip(&statuses)
        .map(|(r, s)| queue_json(b, r, s))
        .collect()
}

/// A queue list as the query asks ([`listing`]). A page sorted by name or vhost (the
/// default) asks only its own queues' statuses from their leaders, as RabbitMQ pages
/// before it augments.
async fn queue_list(b: &Broker, vhosts: &[String], uri: &axum::http::Uri) -> ApiResult {
    let q = query_params(uri);
    let basic_sort = matches!(
        q.get("sort").map(String::as_str),
        None | Some("") | Some("name") | Some("vhost")
    );
    if !(q.contains_key("page") && basic_sort) {
        return listing::reply_list(queues_in(b, vhosts).await, uri);
    }
    let records = queue_records(b, vhosts);
    let index: Vec<Value> = records
        .iter()
        .enumerate()
        .map(|(i, r)| json!({"name": r.name, "vhost": r.vhost, "i": i}))
        .collect();
    let mut without_columns = uri.to_string();
    if q.contains_key("columns") {
        let rest: Vec<String> = q
            .iter()
            .filter(|(k, _)| *k != "columns")
            .map(|(k, v)| {
                form_urlencoded::Serializer::new(String::new())
                    .append_pair(k, v)
                    .finish()
            })
            .collect();
        without_columns = format!("{}?{}", uri.path(), rest.join("&"));
    }
    let index_uri: axum::http::Uri = without_columns.parse().unwrap_or_else(|_| uri.clone());
    let mut page = listing::list_page(index, &index_uri)?;
    let picked: Vec<QueueRecord> = page["items"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v["i"].as_u64())
                .filter_map(|i| records.get(i as usize).cloned())
                .collect()
        })
        .unwrap_or_default();
    let sts = statuses(b, &picked).await;
    let items: Vec<Value> = picked
        .iter()
        .zip(&sts)
        .map(|(r, s)| queue_json(b, r, s))
        .collect();
    page["items"] = listing::columns_of(items, &q);
    ok(page)
}

pub(super) async fn queues(api: Api, uri: axum::http::Uri) -> ApiResult {
    let vhosts = readable_vhosts(&api);
    queue_list(&api.broker, &vhosts, &uri).await
}

pub(super) async fn queues_of(
    api: Api,
    Path(vhost): Path<String>,
    uri: axum::http::Uri,
) -> ApiResult {
    readable_vhost(&api, &vhost)?;
    queue_list(&api.broker, &[vhost], &uri).await
}

pub(super) async fn queue(api: Api, Path((vhost, name)): Path<(String, String)>) -> ApiResult {
    readable_vhost(&api, &vhost)?;
    // A queue declared through another node a moment ago is found after a
    // meta catch-up, as an AMQP lookup finds it.
    let rec = api
        .broker
        .find_record(&vhost, &name)
        .await
        .ok_or_else(ApiError::not_found)?;
    let st = api.broker.queue_status(&rec).await;
    ok(queue_json(&api.broker, &rec, &st))
}

/// Declares a queue from a JSON object (`durable`, default true; `auto_delete`;
/// `arguments`) as queue.declare through this node would, and opens it here.
///
/// Errors: 400 for bad arguments or an inequivalent redeclare (RabbitMQ's texts).
pub async fn declare_queue(
    b: &std::sync::Arc<Broker>,
    vhost: &str,
    name: &str,
    m: &serde_json::Map<String, Value>,
) -> Result<bool, ApiError> {
    let arguments = json_to_table(m.get("arguments")).map_err(ApiError::bad_request)?;
    let declare = b.queue_declare(
        vhost,
        name,
        false,
        bool_field(m, "durable", true),
        false,
        bool_field(m, "auto_delete", false),
        arguments,
        0,
    );
    let reply = b.meta_write(MetaCommand::DeclareQueue(declare)).await?;
    match reply {
        MetaReply::QueueDeclared { record, created } => {
            b.ensure_queue(&record).await?;
            crate::node_counters::inc(&crate::node_counters::NODE.queues_declared);
            if created {
                crate::node_counters::inc(&crate::node_counters::NODE.queues_created);
            }
            Ok(created)
        }
        MetaReply::Error(e) => Err(e.into()),
        _ => Err(ApiError::bad_request("unexpected reply to queue.declare")),
    }
}

pub(super) async fn put_queue(
    api: Api,
    Path((vhost, name)): Path<(String, String)>,
    body: Bytes,
) -> ApiResult {
    api.caller.require_writer()?;
    readable_vhost(&api, &vhost)?;
    let m = body_object(&body)?;
    if declare_queue(&api.broker, &vhost, &name, &m).await? {
        created()
    } else {
        no_content()
    }
}

pub(super) async fn delete_queue(
    api: Api,
    Path((vhost, name)): Path<(String, String)>,
) -> ApiResult {
    api.caller.require_writer()?;
    readable_vhost(&api, &vhost)?;
    match api.broker.delete_queue(&vhost, &name).await? {
        Some(_) => {
            crate::node_counters::inc(&crate::node_counters::NODE.queues_deleted);
            no_content()
        }
        None => Err(ApiError::not_found()),
    }
}
