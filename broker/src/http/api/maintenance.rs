//! Cluster maintenance through the HTTP API, for the web UI's cluster page:
//! `POST /api/rebalance/queues` (RabbitMQ 3.10.8's `rabbit_mgmt_wm_rebalance_queues`:
//! spreads quorum queue leaders over the nodes holding replicas, started in the
//! background, 204) and quorumq's own `POST /api/nodes/{name}/drain` and
//! `/revive` (RabbitMQ has these only as `rabbitmq-upgrade drain` / `revive`:
//! maintenance mode, the node hands its leaderships over and takes no new ones;
//! answered with `{"moved", "kept", "failed"}` once done). All need the
//! `administrator` tag.

use axum::extract::Path;
use axum::routing::post;
use axum::Router;
use serde_json::json;

use super::{no_content, ok, ApiResult};
use crate::cluster::{drain, membership};
use crate::http::{Api, ApiError, Started};
use quorumq_proto::v1::{DrainRequest, ReviveRequest};

/// How long a drain may take to hand over the node's leaderships (as quorumqctl's).
const DRAIN_FOR: std::time::Duration = std::time::Duration::from_secs(30);

/// The routes.
pub(super) fn routes() -> Router<Started> {
    Router::new()
        .route("/api/rebalance/queues", post(rebalance))
        .route("/api/nodes/{name}/drain", post(drain_node))
        .route("/api/nodes/{name}/revive", post(revive_node))
}

/// Starts a rebalance of every quorum queue's leader (204 at once, as RabbitMQ).
pub(super) async fn rebalance(api: Api) -> ApiResult {
    api.caller.require_admin()?;
    let queues = api.broker.queues().clone();
    tokio::spawn(async move {
        match membership::rebalance(&queues, ".*", ".*").await {
            Ok((_, moved)) => tracing::info!(moved = moved.len(), "rebalance (HTTP API) done"),
            Err(e) => tracing::warn!(error = %e, "rebalance (HTTP API) failed"),
        }
    });
    no_content()
}

/// The node id of `name` (`quorumq@ID`, as `/api/nodes` names nodes), if it is a
/// node of the cluster.
fn node_id(api: &Api, name: &str) -> Result<u64, ApiError> {
    let id = name
        .strip_prefix("quorumq@")
        .and_then(|n| n.parse::<u64>().ok())
        .ok_or_else(ApiError::not_found)?;
    api.broker
        .cluster_status()
        .nodes
        .iter()
        .any(|n| n.id == id)
        .then_some(id)
        .ok_or_else(ApiError::not_found)
}

fn unavailable(e: impl std::fmt::Display) -> ApiError {
    ApiError::new(
        axum::http::StatusCode::SERVICE_UNAVAILABLE,
        "service_unavailable",
        e.to_string(),
    )
}

/// Drains node `name` (here, or asked over the cluster port): 200 with what moved.
pub(super) async fn drain_node(api: Api, Path(name): Path<String>) -> ApiResult {
    api.caller.require_admin()?;
    let id = node_id(&api, &name)?;
    let (moved, kept, failed) = if id == api.broker.node_id() {
        let r = drain::drain(api.broker.queues(), DRAIN_FOR).await;
        let failed: Vec<String> = r
            .failed
            .into_iter()
            .map(|(q, e)| format!("{q}: {e}"))
            .collect();
        (r.moved, r.kept, failed)
    } else {
        let mut client = membership::admin_client(api.broker.queues(), id).map_err(unavailable)?;
        let r = client
            .drain(DrainRequest::default())
            .await
            .map_err(|e| unavailable(e.message()))?
            .into_inner();
        (r.moved, r.kept, r.failed)
    };
    ok(json!({"node": name, "moved": moved, "kept": kept, "failed": failed}))
}

/// Ends node `name`'s maintenance mode: 204.
pub(super) async fn revive_node(api: Api, Path(name): Path<String>) -> ApiResult {
    api.caller.require_admin()?;
    let id = node_id(&api, &name)?;
    if id == api.broker.node_id() {
        drain::revive(api.broker.queues());
    } else {
        let mut client = membership::admin_client(api.broker.queues(), id).map_err(unavailable)?;
        let r = client
            .revive(ReviveRequest::default())
            .await
            .map_err(|e| unavailable(e.message()))?
            .into_inner();
        if !r.ok {
            return Err(unavailable(r.error));
        }
    }
    no_content()
}
