//! Health checks: `GET /api/health/checks/alarms` (the alarms in effect in the
//! cluster) and `GET /api/health/checks/quorum-queues-without-elected-leaders/all-vhosts/`
//! (RabbitMQ 4.1 `rabbit_mgmt_wm_health_check_quorum_queues_without_elected_leaders`).

use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;

use super::{ok, ApiResult};
use crate::http::{node_name, Api, Started};

/// The health check routes.
pub(super) fn routes() -> Router<Started> {
    const LEADERLESS: &str = "/api/health/checks/quorum-queues-without-elected-leaders";
    Router::new()
        .route("/api/health/checks/alarms", get(alarms))
        .route(&format!("{LEADERLESS}/all-vhosts/"), get(leaderless_all))
        .route(&format!("{LEADERLESS}/all-vhosts"), get(leaderless_all))
        .route(
            &format!("{LEADERLESS}/vhost/{{vhost}}/"),
            get(leaderless_in),
        )
        .route(&format!("{LEADERLESS}/vhost/{{vhost}}"), get(leaderless_in))
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

/// `GET .../quorum-queues-without-elected-leaders/all-vhosts/`: 200 `{"status":"ok"}`, or
/// 503 `{"status":"failed","reason":"Detected quorum queues without an elected leader",
/// "queues":[{"readable_name","name","virtual_host","type"}]}` (RabbitMQ 4.1's shape).
pub(super) async fn leaderless_all(api: Api) -> ApiResult {
    leaderless(&api, None)
}

/// The same for one vhost (`.../vhost/{vhost}/`).
pub(super) async fn leaderless_in(
    api: Api,
    axum::extract::Path(vhost): axum::extract::Path<String>,
) -> ApiResult {
    super::vhosts::readable_vhost(&api, &vhost)?;
    leaderless(&api, Some(&vhost))
}

fn leaderless(api: &Api, vhost: Option<&str>) -> ApiResult {
    let found = crate::admin::health::without_leader(api.broker.queues(), vhost, ".*")
        .map_err(crate::http::ApiError::bad_request)?;
    if found.is_empty() {
        return ok(json!({"status": "ok"}));
    }
    Ok((
        StatusCode::SERVICE_UNAVAILABLE,
        Json(json!({"status": "failed",
                    "reason": "Detected quorum queues without an elected leader",
                    "queues": found})),
    )
        .into_response())
}
