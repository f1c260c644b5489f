//! `POST /api/queues/{vhost}/{name}/redrive` with `{"to", "max", "rate"}` (all
//! optional): moves the queue's ready messages back to the queue each one last
//! died in, or to `to`, at-least-once, and answers the summary of
//! `quorumqctl redrive --formatter json` (quorumq's own resource, after SQS
//! `StartMessageMoveTask`). Synchronous: the answer comes when the redrive is
//! done, so bound long ones with `max` (or use quorumqctl, which shows
//! progress). Needs the `administrator` tag, as `PUT` and `DELETE` of a queue do.

use axum::body::Bytes;
use axum::extract::Path;
use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use serde_json::Value;

use super::body::body_object;
use super::vhosts::readable_vhost;
use super::{ok, ApiResult};
use crate::admin::redrive::{redrive, Options};
use crate::http::{Api, ApiError, Started};

/// The redrive route.
pub(super) fn routes() -> Router<Started> {
    Router::new().route("/api/queues/{vhost}/{name}/redrive", post(redrive_queue))
}

/// The options of a request body.
///
/// Errors: 400 when a field has the wrong type (`to` a string, `max` a
/// non-negative integer, `rate` a number; null = absent).
fn parse(body: &Bytes) -> Result<Options, ApiError> {
    let m = body_object(body)?;
    let field = |k: &str| m.get(k).filter(|v| !v.is_null());
    let to = match field("to") {
        None => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(ApiError::bad_request("to must be a queue name")),
    };
    let max = match field("max") {
        None => None,
        Some(v) => Some(
            v.as_u64()
                .ok_or_else(|| ApiError::bad_request("max must be a non-negative integer"))?,
        ),
    };
    let rate = match field("rate") {
        None => None,
        Some(v) => Some(
            v.as_f64()
                .ok_or_else(|| ApiError::bad_request("rate must be a number"))?,
        ),
    };
    Ok(Options { to, max, rate })
}

/// 200 with the summary; 400 for bad options; 404 for no such queue (or
/// destination); 503 while the queue has no leader or when the redrive
/// stopped part-way (the reason says how many were moved).
async fn redrive_queue(
    api: Api,
    Path((vhost, name)): Path<(String, String)>,
    body: Bytes,
) -> ApiResult {
    api.caller.require_writer()?;
    readable_vhost(&api, &vhost)?;
    let opts = parse(&body)?;
    match redrive(api.broker.queues(), &vhost, &name, &opts, false, None).await {
        Ok(mut v) => {
            if let Value::Object(m) = &mut v {
                m.remove("done");
            }
            ok(v)
        }
        Err(e) if e.status == 404 => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "Object Not Found",
            e.text,
        )),
        Err(e) if e.status == 400 => Err(ApiError::bad_request(e.text)),
        Err(e) => Err(ApiError::new(
            StatusCode::from_u16(e.status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE),
            "service_unavailable",
            e.text,
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_fields_are_optional_and_typed() {
        assert_eq!(parse(&Bytes::new()).ok(), Some(Options::default()));
        let o = parse(&Bytes::from_static(br#"{"to":"q","max":5,"rate":2.5}"#)).ok();
        assert_eq!(
            o,
            Some(Options {
                to: Some("q".into()),
                max: Some(5),
                rate: Some(2.5)
            })
        );
        let o = parse(&Bytes::from_static(br#"{"to":null,"max":null}"#)).ok();
        assert_eq!(o, Some(Options::default()));
        for bad in [
            r#"{"to":1}"#,
            r#"{"max":-1}"#,
            r#"{"max":"x"}"#,
            r#"{"rate":"x"}"#,
        ] {
            assert!(parse(&Bytes::from(bad)).is_err(), "{bad}");
        }
    }
}
