//! The node's HTTP listener (`--http-listen`, default 127.0.0.1:15672, as RabbitMQ's
//! management plugin): the management API, Prometheus metrics and health probes.
//!
//! - `/api/...`: a RabbitMQ-compatible subset of the management HTTP API, JSON shapes as
//!   RabbitMQ 3.10.8's, basic authentication against the cluster's users ([`api`],
//!   [`definitions`], [`auth`]).
//! - `GET /`: the management web UI ([`ui`]), a client of `/api`.
//! - `GET /metrics`: Prometheus text format, no authentication, names as
//!   `rabbitmq_prometheus` ([`crate::metrics`]).
//! - `GET /health/live`: 200 `up` while the process runs (from before the node has
//!   recovered its data: a long recovery is not a hang).
//! - `GET /health/ready`: 200 `serving` when the node serves clients — it has started,
//!   knows a meta leader (it is part of a cluster with a quorum), and is neither draining
//!   nor stopping; else 503 and the reason (RabbitMQ's `rabbitmq-diagnostics
//!   check_running` / maintenance mode).

pub mod api;
pub mod auth;
pub mod definitions;
pub mod json;
pub mod metrics;
pub mod rates;
pub mod ui;

use std::sync::{Arc, OnceLock};

use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};

use crate::node::Broker;

/// The broker, once it has started (readiness is 503 and the API 503 before).
pub type Started = Arc<OnceLock<Arc<Broker>>>;

/// Default of `--http-listen` (RabbitMQ's management port, loopback only).
pub const DEFAULT_LISTEN: &str = "127.0.0.1:15672";

/// Serves the HTTP endpoints on `listener` until the process ends.
///
/// Errors: the listener fails (I/O error from accept).
pub async fn serve(listener: tokio::net::TcpListener, broker: Started) -> std::io::Result<()> {
    std::sync::LazyLock::force(&metrics::STARTED);
    tokio::spawn(rates::run_sampler(broker.clone()));
    let app = Router::new()
        .route("/health/live", get(|| async { "up\n" }))
        .route("/health/ready", get(ready))
        .route("/metrics", get(metrics))
        .route("/metrics/per-object", get(metrics_per_object))
        .route("/metrics/detailed", get(metrics_detailed))
        .merge(api::routes())
        .merge(definitions::routes())
        .merge(ui::routes())
        .fallback(|| async { ApiError::not_found() })
        .with_state(broker);
    axum::serve(listener, app).await
}

async fn ready(State(broker): State<Started>) -> (StatusCode, String) {
    match broker.get().map(|b| b.not_serving()) {
        None => (
            StatusCode::SERVICE_UNAVAILABLE,
            "not serving: starting\n".into(),
        ),
        Some(Some(why)) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not serving: {why}\n"),
        ),
        Some(None) => (StatusCode::OK, "serving\n".into()),
    }
}

async fn metrics(State(started): State<Started>) -> Response {
    let Some(broker) = started.get().cloned() else {
        return ApiError::starting().into_response();
    };
    let text = metrics::scrape(&broker).await;
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

async fn metrics_per_object(State(started): State<Started>) -> Response {
    let Some(broker) = started.get().cloned() else {
        return ApiError::starting().into_response();
    };
    openmetrics(metrics::scrape_endpoint(
        &broker,
        metrics::Endpoint::PerObject,
    ))
}

async fn metrics_detailed(State(started): State<Started>, uri: axum::http::Uri) -> Response {
    let Some(broker) = started.get().cloned() else {
        return ApiError::starting().into_response();
    };
    let families: Vec<String> = uri
        .query()
        .map(|q| {
            form_urlencoded::parse(q.as_bytes())
                .filter(|(k, _)| k == "family")
                .map(|(_, v)| v.into_owned())
                .collect()
        })
        .unwrap_or_default();
    openmetrics(metrics::scrape_detailed(&broker, &families))
}

fn openmetrics(text: String) -> Response {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// A management API error: HTTP status and RabbitMQ's `{"error": …, "reason": …}` body.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    error: &'static str,
    reason: String,
}

impl ApiError {
    /// An error with `status`, RabbitMQ's `error` word and a `reason` text.
    pub fn new(status: StatusCode, error: &'static str, reason: impl Into<String>) -> Self {
        ApiError {
            status,
            error,
            reason: reason.into(),
        }
    }

    /// 404 `Object Not Found` (RabbitMQ's answer for a missing object or route).
    pub fn not_found() -> Self {
        Self::new(StatusCode::NOT_FOUND, "Object Not Found", "Not Found")
    }

    /// 400 `bad_request` with `reason`.
    pub fn bad_request(reason: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", reason)
    }

    /// 503 while the node is still starting.
    pub fn starting() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "service_unavailable",
            "the node is starting",
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.status,
            Json(serde_json::json!({ "error": self.error, "reason": self.reason })),
        )
            .into_response()
    }
}

/// An AMQP error from a topology change: 404 for NOT_FOUND, else 400 with the reply text
/// after its `NAME - ` prefix (RabbitMQ's management API answers `inequivalent arg ...`
/// as 400 `bad_request`).
impl From<crate::amqp::error::ProtocolError> for ApiError {
    fn from(e: crate::amqp::error::ProtocolError) -> Self {
        use crate::amqp::error::ProtocolError as P;
        match e {
            P::Channel { code, text } | P::Connection { code, text } => {
                ApiError::from_amqp(code, &text)
            }
        }
    }
}

impl From<crate::meta::AmqpError> for ApiError {
    fn from(e: crate::meta::AmqpError) -> Self {
        ApiError::from_amqp(e.code, &e.text)
    }
}

impl ApiError {
    fn from_amqp(code: u16, text: &str) -> Self {
        let reason = text.split_once(" - ").map_or(text, |(_, r)| r);
        if code == 404 {
            Self::new(StatusCode::NOT_FOUND, "Object Not Found", reason)
        } else {
            Self::bad_request(reason)
        }
    }
}

/// An authenticated API request: the started broker and the caller. Extracting it answers
/// 503 before the node started and 401 for a refused login ([`auth::authenticate`]).
pub struct Api {
    /// The node.
    pub broker: Arc<Broker>,
    /// Who called.
    pub caller: auth::Caller,
}

impl FromRequestParts<Started> for Api {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &Started) -> Result<Self, Response> {
        let Some(broker) = state.get().cloned() else {
            return Err(ApiError::starting().into_response());
        };
        let caller = auth::authenticate(&broker, &parts.headers).await?;
        Ok(Api { broker, caller })
    }
}

/// The name the API gives node `id` (RabbitMQ's `name@host` node names; quorumq's nodes
/// are numbered).
pub fn node_name(id: u64) -> String {
    format!("quorumq@{id}")
}
