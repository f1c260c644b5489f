//! Operations on a queue's messages: `POST /api/queues/{vhost}/{name}/get` (RabbitMQ
//! 3.10.8 `rabbit_mgmt_wm_queue_get`) and `DELETE /api/queues/{vhost}/{name}/contents`
//! (purge, `rabbit_mgmt_wm_queue_purge`).
//!
//! `get` goes through the queue's leader as a client's basic.get does: a get slot (a
//! consumer id of this node) takes each message with `Dequeue`, so delivery counts,
//! `redelivered`, `x-delivery-count` and dead-lettering behave as for a real client.

use axum::body::Bytes;
use axum::extract::Path;
use axum::routing::{delete, post};
use axum::Router;
use serde_json::Value;

use super::body::{body_object, str_field};
use super::vhosts::readable_vhost;
use super::{no_content, ok, ApiResult};
use crate::admin::peek::{get_item_json, PayloadEncoding};
use crate::http::{Api, ApiError, Started};
use crate::message::StoredMessage;
use crate::meta::access::Perm;
use crate::queue::types::{MsgId, QueueCommand, QueueReply};

/// The routes.
pub(super) fn routes() -> Router<Started> {
    Router::new()
        .route("/api/queues/{vhost}/{name}/get", post(get_messages))
        .route("/api/queues/{vhost}/{name}/contents", delete(purge))
}

/// What happens to the messages a `get` took (`ackmode`, RabbitMQ's four atoms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckMode {
    /// Taken unacknowledged, returned when the get slot goes down (as RabbitMQ's closing
    /// channel does): the next get sees them again, redelivered.
    AckRequeueTrue,
    /// Taken with `no_ack`: gone from the queue.
    AckRequeueFalse,
    /// Taken, then rejected with requeue (basic.reject requeue=true).
    RejectRequeueTrue,
    /// Taken, then rejected without requeue: dead-lettered (`rejected`) or dropped.
    RejectRequeueFalse,
}

impl AckMode {
    /// Parses RabbitMQ's `ackmode` value.
    ///
    /// Errors: any other text (RabbitMQ 3.10.8 crashes the request with a 500; quorumq
    /// answers 400).
    pub fn parse(s: &str) -> Result<AckMode, ApiError> {
        Ok(match s {
            "ack_requeue_true" => AckMode::AckRequeueTrue,
            "ack_requeue_false" => AckMode::AckRequeueFalse,
            "reject_requeue_true" => AckMode::RejectRequeueTrue,
            "reject_requeue_false" => AckMode::RejectRequeueFalse,
            other => {
                return Err(ApiError::bad_request(format!(
                    "Unsupported ackmode '{other}'. Please use ack_requeue_true, ack_requeue_false, reject_requeue_true or reject_requeue_false."
                )))
            }
        })
    }
}

/// An integer field given as a number or as decimal text (`rabbit_mgmt_util:parse_int/1`;
/// rabbitmqadmin sends `"count": "5"`).
fn int_field(m: &serde_json::Map<String, Value>, key: &str) -> Result<Option<u64>, ApiError> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_u64()
            .map(Some)
            .ok_or_else(|| ApiError::bad_request(format!("{key}: not a non-negative integer"))),
        Some(Value::String(s)) => s
            .trim()
            .parse::<u64>()
            .map(Some)
            .map_err(|_| ApiError::bad_request(format!("{key}: not a non-negative integer"))),
        Some(other) => Err(ApiError::bad_request(format!(
            "{key}: not a non-negative integer: {other}"
        ))),
    }
}

fn required<'a>(m: &'a serde_json::Map<String, Value>, key: &str) -> Result<&'a Value, ApiError> {
    m.get(key)
        .ok_or_else(|| ApiError::bad_request(format!("key_missing: {key}")))
}

/// The 403 of the caller's missing `perm` on queue `name` (as the channel RabbitMQ opens
/// for the request as the caller would refuse it).
fn permit(api: &Api, vhost: &str, kind: &str, name: &str, perm: Perm) -> Result<(), ApiError> {
    match api.broker.with_topology(|t| {
        t.access()
            .check_resource(&api.caller.user, vhost, kind, name, perm)
    }) {
        Some(Err(e)) => Err(ApiError::new(
            axum::http::StatusCode::FORBIDDEN,
            "access_refused",
            e.text.split_once(" - ").map_or(e.text.as_str(), |(_, r)| r),
        )),
        _ => Ok(()),
    }
}

pub(super) async fn get_messages(
    api: Api,
    Path((vhost, name)): Path<(String, String)>,
    body: Bytes,
) -> ApiResult {
    readable_vhost(&api, &vhost)?;
    let (_, handle) = api
        .broker
        .find_queue(&vhost, &name)
        .await
        .ok_or_else(ApiError::not_found)?;
    let m = body_object(&body)?;
    let ackmode = required(&m, "ackmode")?
        .as_str()
        .ok_or_else(|| ApiError::bad_request("ackmode: not a string"))?;
    let ackmode = AckMode::parse(ackmode)?;
    required(&m, "count")?;
    let count = int_field(&m, "count")?.unwrap_or(0);
    required(&m, "encoding")?;
    let encoding = match str_field(&m, "encoding") {
        Some("auto") => PayloadEncoding::Auto,
        Some("base64") => PayloadEncoding::Base64,
        _ => {
            return Err(ApiError::bad_request(
                "Unsupported encoding. Please use auto or base64.",
            ))
        }
    };
    let truncate = int_field(&m, "truncate")?.map(|n| n as usize);
    permit(&api, &vhost, "queue", &name, Perm::Read)?;
    if handle.is_quorum()
        && api
            .broker
            .effective_config(&vhost, &name)
            .single_active_consumer
    {
        return Err(ApiError::bad_request(format!(
            "cannot obtain access to locked queue '{name}' in vhost '{vhost}'. basic.get operations are not supported by quorum queues with single active consumer"
        )));
    }
    // Run to the end even if the client goes away: the get slot must go down, or the
    // messages it holds stay checked out.
    let broker = api.broker.clone();
    let task = tokio::spawn(async move {
        let (mailbox, _) = tokio::sync::mpsc::unbounded_channel();
        let slot = broker.consumers().register(mailbox, handle.group, 0);
        let no_ack = ackmode == AckMode::AckRequeueFalse;
        let counts = handle.counts_deliveries();
        let mut items = Vec::new();
        let mut taken: Vec<MsgId> = Vec::new();
        let mut failure = None;
        for _ in 0..count {
            let reply = handle
                .call(QueueCommand::Dequeue {
                    now_ms: crate::now_ms(),
                    consumer: slot,
                    no_ack,
                })
                .await;
            let (delivery, left) = match reply {
                Ok(QueueReply::Dequeued(Some(d))) => d,
                Ok(_) => break,
                Err(e) => {
                    failure = Some(e.to_string());
                    break;
                }
            };
            if !no_ack {
                taken.push(delivery.id);
            }
            let Some(msg) = delivery
                .payload
                .as_ref()
                .and_then(|p| StoredMessage::decode_bytes(p).ok())
            else {
                failure = Some("stored message is missing".to_owned());
                break;
            };
            crate::metrics::COUNTERS.delivered(delivery.delivery_count > 0);
            items.push(get_item_json(
                &msg,
                delivery.delivery_count,
                left,
                counts,
                encoding,
                truncate,
            ));
        }
        let now_ms = crate::now_ms();
        let settle = match ackmode {
            AckMode::RejectRequeueTrue => Some(QueueCommand::Return {
                now_ms,
                consumer: slot,
                ids: taken,
            }),
            AckMode::RejectRequeueFalse => Some(QueueCommand::Discard {
                now_ms,
                consumer: slot,
                ids: taken,
            }),
            _ => None,
        };
        if let Some(cmd) = settle {
            let pending = handle.propose(cmd.clone()).await;
            handle.clone().keep_proposing(cmd, pending).await;
        }
        broker.consumers().unregister(slot);
        handle.consumer_down(slot, now_ms).await.await;
        match failure {
            Some(e) if items.is_empty() => Err(ApiError::new(
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                "service_unavailable",
                e,
            )),
            _ => Ok(items),
        }
    });
    let items = task
        .await
        .map_err(|e| ApiError::bad_request(format!("get failed: {e}")))??;
    ok(Value::Array(items))
}

pub(super) async fn purge(api: Api, Path((vhost, name)): Path<(String, String)>) -> ApiResult {
    readable_vhost(&api, &vhost)?;
    let (_, handle) = api
        .broker
        .find_queue(&vhost, &name)
        .await
        .ok_or_else(ApiError::not_found)?;
    permit(&api, &vhost, "queue", &name, Perm::Read)?;
    handle
        .call(QueueCommand::Purge {
            now_ms: crate::now_ms(),
        })
        .await
        .map_err(|e| {
            ApiError::new(
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                "service_unavailable",
                e.to_string(),
            )
        })?;
    no_content()
}
