//! `GET /api/health/checks/alarms`: the alarms in effect in the cluster.

use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;

use super::{ok, ApiResult};
use crate::http::{node_name, Api, Started};

/// The health check routes.
pub(super) fn routes() -> Router<Started> {
    Router::new().route("/api/health/checks/alarms", get(alarms))
}

/// `GET /api/health/checks/alarms`: 200 `{"status":"ok"}`, or 503 with the alarms in
/// effect in the cluster (RabbitMQ `rabbit_mgmt_wm_health_check_alarms`).
pub(super) async fn alarms(api: Api) -> ApiResult {
    let b = &api.broker;
    let mut raised = Vec::new();
    let mut add = |node: u64, a: crate::alarms::Alarm| {
        if a.memory {
            raised.push(json!({"node": node_name(node), "resource": "memory"}));
        }
        if a.disk {
            raised.push(json!({"node": node_name(node), "resource": "disk"}));
        }
    };
    add(b.node_id(), b.alarms().local());
    let mut remote: Vec<_> = b.alarms().remote().into_iter().collect();
    remote.sort_by_key(|(n, _)| *n);
    for (n, a) in remote {
        add(n, a);
    }
    if raised.is_empty() {
        ok(json!({"status": "ok"}))
    } else {
        Ok((
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "failed",
                        "reason": "There are alarms in effect in the cluster",
                        "alarms": raised})),
        )
            .into_response())
    }
}
