//! `POST /api/exchanges/{vhost}/{name}/publish` (RabbitMQ 3.10.8
//! `rabbit_mgmt_wm_exchange_publish`): publish one message as the caller, mandatory and
//! confirmed, and answer `{"routed": bool}`. `amq.default` names the default exchange.

use amq_protocol::protocol::basic::AMQPProperties;
use axum::body::Bytes;
use axum::extract::Path;
use axum::routing::post;
use axum::Router;
use base64::Engine;
use serde_json::{json, Value};

use super::body::body_object;
use super::vhosts::readable_vhost;
use super::{ok, ApiResult};
use crate::amqp::codec::encode_properties;
use crate::http::json::json_to_table;
use crate::http::{Api, ApiError, Started};
use crate::message::StoredMessage;
use crate::meta::access::Perm;
use crate::meta::publish::{publish_keys, strip_bcc, PublishKeys};
use crate::queue::types::{EnqueueMsg, EnqueueOutcome, PrioritizedMsg, QueueCommand, QueueReply};

/// The routes.
pub(super) fn routes() -> Router<Started> {
    Router::new().route("/api/exchanges/{vhost}/{name}/publish", post(publish))
}

/// Basic properties from the management API's JSON object
/// (`rabbit_mgmt_format:to_basic_properties/1`): the names `properties_json` writes;
/// `delivery_mode`, `priority` and `timestamp` as numbers or decimal text, `headers` as
/// an arguments object. Unknown keys are ignored.
///
/// Errors: 400 for a value of the wrong type.
pub fn properties_from_json(v: Option<&Value>) -> Result<AMQPProperties, ApiError> {
    let mut p = AMQPProperties::default();
    let m = match v {
        None | Some(Value::Null) => return Ok(p),
        Some(Value::Object(m)) => m,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "properties must be an object, actually was {other}"
            )))
        }
    };
    let text = |k: &str, v: &Value| -> Result<amq_protocol::types::ShortString, ApiError> {
        v.as_str()
            .map(Into::into)
            .ok_or_else(|| ApiError::bad_request(format!("{k}: not a string")))
    };
    let int = |k: &str, v: &Value| -> Result<u64, ApiError> {
        v.as_u64()
            .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
            .ok_or_else(|| ApiError::bad_request(format!("{k}: not an integer")))
    };
    for (k, v) in m {
        let k = k.as_str();
        p = match k {
            "content_type" => p.with_content_type(text(k, v)?),
            "content_encoding" => p.with_content_encoding(text(k, v)?),
            "headers" => p.with_headers(json_to_table(Some(v)).map_err(ApiError::bad_request)?),
            "delivery_mode" => p.with_delivery_mode(int(k, v)? as u8),
            "priority" => p.with_priority(int(k, v)? as u8),
            "correlation_id" => p.with_correlation_id(text(k, v)?),
            "reply_to" => p.with_reply_to(text(k, v)?),
            "expiration" => p.with_expiration(text(k, v)?),
            "message_id" => p.with_message_id(text(k, v)?),
            "timestamp" => p.with_timestamp(int(k, v)?),
            "type" => p.with_type(text(k, v)?),
            "user_id" => p.with_user_id(text(k, v)?),
            "app_id" => p.with_app_id(text(k, v)?),
            "cluster_id" => p.with_cluster_id(text(k, v)?),
            _ => p,
        };
    }
    Ok(p)
}

fn key_missing(key: &str) -> ApiError {
    ApiError::bad_request(format!("key_missing: {key}"))
}

pub(super) async fn publish(
    api: Api,
    Path((vhost, name)): Path<(String, String)>,
    body: Bytes,
) -> ApiResult {
    readable_vhost(&api, &vhost)?;
    let exchange = if name == "amq.default" {
        String::new()
    } else {
        name
    };
    let exists = api
        .broker
        .with_topology(|t| t.exchange(&vhost, &exchange).is_some())
        .unwrap_or(false);
    if !exists {
        // RabbitMQ 3.10.8 answers through its channel's error: 400, not 404 (observed).
        let shown = if exchange.is_empty() {
            "amq.default"
        } else {
            exchange.as_str()
        };
        return Err(ApiError::bad_request(format!(
            "404 NOT_FOUND - no exchange '{shown}' in vhost '{vhost}'"
        )));
    }
    let m = body_object(&body)?;
    let routing_key = m
        .get("routing_key")
        .ok_or_else(|| key_missing("routing_key"))?
        .as_str()
        .unwrap_or("")
        .to_owned();
    let props = properties_from_json(Some(
        m.get("properties")
            .ok_or_else(|| key_missing("properties"))?,
    ))?;
    let payload = m
        .get("payload")
        .ok_or_else(|| key_missing("payload"))?
        .as_str()
        .ok_or_else(|| ApiError::bad_request("payload_not_string"))?;
    let encoding = m
        .get("payload_encoding")
        .ok_or_else(|| key_missing("payload_encoding"))?
        .as_str()
        .unwrap_or("");
    let body = match encoding {
        "string" => Bytes::copy_from_slice(payload.as_bytes()),
        "base64" => base64::engine::general_purpose::STANDARD
            .decode(payload)
            .map(Bytes::from)
            .map_err(|_| ApiError::bad_request("not_base64"))?,
        other => {
            return Err(ApiError::bad_request(format!(
                "unsupported_encoding: {other}"
            )))
        }
    };
    let routed = publish_message(&api, &vhost, &exchange, &routing_key, props, body).await?;
    ok(json!({ "routed": routed }))
}

/// Publishes one message as the caller (write permission on the exchange, `user_id`
/// checked, CC/BCC honoured) and waits for every target queue to accept it; true when
/// some queue took it.
///
/// Errors: 403 without write permission, 400 for a bad `user_id` or `expiration`, 400
/// "Unable to publish message. Check queue limits." when a queue refused it (RabbitMQ's
/// text for a nack).
async fn publish_message(
    api: &Api,
    vhost: &str,
    exchange: &str,
    routing_key: &str,
    mut props: AMQPProperties,
    body: Bytes,
) -> Result<bool, ApiError> {
    let b = &api.broker;
    if let Some(Err(e)) = b.with_topology(|t| {
        t.access()
            .check_resource(&api.caller.user, vhost, "exchange", exchange, Perm::Write)
    }) {
        return Err(ApiError::new(
            axum::http::StatusCode::FORBIDDEN,
            "access_refused",
            e.text.split_once(" - ").map_or(e.text.as_str(), |(_, r)| r),
        ));
    }
    if let Some(user) = props.user_id() {
        if user.as_str() != api.caller.user {
            return Err(ApiError::bad_request(format!(
                "user_id property set to '{}' but authenticated user was '{}'",
                user.as_str(),
                api.caller.user
            )));
        }
    }
    let PublishKeys { keys, bcc, ttl_ms } = publish_keys(
        routing_key,
        props.headers().as_ref(),
        props.expiration().as_ref().map(|e| e.as_str()),
    )?;
    let targets = b
        .route(
            vhost,
            exchange,
            &keys,
            props.headers().as_ref(),
            b.meta_stamp(),
        )
        .await?;
    if !bcc.is_empty() {
        if let Some(mut h) = props.headers().clone() {
            strip_bcc(&mut h);
            props = props.with_headers(h);
        }
    }
    crate::metrics::COUNTERS.published(!targets.is_empty());
    b.tracking()
        .exchange_published(vhost, exchange, !targets.is_empty());
    if targets.is_empty() {
        crate::metrics::COUNTERS.confirmed(1);
        return Ok(false);
    }
    let priority = props.priority().unwrap_or(0);
    let body_size = body.len() as u32;
    let stored = StoredMessage {
        exchange: exchange.to_owned(),
        routing_key: routing_key.to_owned(),
        bcc,
        properties: encode_properties(&props),
        body,
    };
    let payload = stored
        .encode()
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let now_ms = crate::now_ms();
    let mut waits = Vec::with_capacity(targets.len());
    for q in targets {
        crate::tracking::MessageCounts::add(&q.stats.publish, 1);
        let msg = PrioritizedMsg {
            msg: EnqueueMsg {
                payload: payload.clone(),
                body_size,
                ttl_ms,
            },
            priority: q.message_priority(priority),
        };
        waits.push(q.propose(QueueCommand::enqueue(now_ms, vec![msg])).await);
    }
    let mut accepted = true;
    for w in waits {
        match w.await {
            Ok(Ok(QueueReply::Enqueued(outcomes))) => {
                accepted &= outcomes.iter().all(|o| *o == EnqueueOutcome::Accepted);
            }
            _ => accepted = false,
        }
    }
    if !accepted {
        return Err(ApiError::bad_request(
            "Unable to publish message. Check queue limits.",
        ));
    }
    crate::metrics::COUNTERS.confirmed(1);
    Ok(true)
}
