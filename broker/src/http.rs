//! The node's HTTP endpoint (`--http-listen`, off unless given): health
//! probes for supervisors and load balancers (Kubernetes liveness and
//! readiness probes, compose healthchecks).
//!
//! - `GET /health/live`: 200 `up` while the process runs (from before the
//!   node has recovered its data: a long recovery is not a hang).
//! - `GET /health/ready`: 200 `serving` when the node serves clients — it
//!   has started, knows a meta leader (it is part of a cluster with a
//!   quorum), and is neither draining nor stopping; else 503 and the reason
//!   (RabbitMQ's `rabbitmq-diagnostics check_running` / maintenance mode).

use std::sync::{Arc, OnceLock};

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;

use crate::node::Broker;

/// The broker, once it has started (readiness is 503 before).
pub type Started = Arc<OnceLock<Arc<Broker>>>;

/// Serves the health endpoints on `listener` until the process ends.
///
/// Errors: the listener fails (I/O error from accept).
pub async fn serve(listener: tokio::net::TcpListener, broker: Started) -> std::io::Result<()> {
    let app = Router::new()
        .route("/health/live", get(|| async { "up\n" }))
        .route("/health/ready", get(ready))
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
