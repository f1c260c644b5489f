//! `GET /api/queues/{vhost}/{name}/dead-letters`: the dead letters a queue holds,
//! counted by the reason and source queue of their last death, and the at-least-once
//! dead letters it holds as a source by why they are held (quorumq's own resource; the
//! document of `quorumqctl inspect_dead_letters --formatter json`). Reads every message
//! body on the queue's leader: an operator's call, not a monitoring one (`/metrics`
//! carries the cheap held counts). And `GET /api/queues/{vhost}/{name}/quorum-status`,
//! the queue's Raft members (the web UI's "members with lag").

use axum::extract::Path;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;

use super::vhosts::readable_vhost;
use super::{ok, ApiResult};
use crate::admin::inspect::{queue_read, What};
use crate::http::{Api, ApiError, Started};

/// The dead-letter and Raft status routes.
pub(super) fn routes() -> Router<Started> {
    Router::new()
        .route("/api/queues/{vhost}/{name}/dead-letters", get(dead_letters))
        .route(
            "/api/queues/{vhost}/{name}/quorum-status",
            get(quorum_status),
        )
}

/// 200 with the summary; 404 for no such queue; 503 while the queue has no leader.
async fn dead_letters(api: Api, Path((vhost, name)): Path<(String, String)>) -> ApiResult {
    read(api, vhost, name, What::DeadLetters).await
}

/// `GET /api/queues/{vhost}/{name}/quorum-status` (quorumq's own): each member's Raft
/// state, term, indexes, match index and lag behind the leader (entries), last contact
/// (ms), the document of `quorumqctl quorum_status --formatter json`. 404 for no such
/// queue, 400 for a queue that is not a quorum queue.
async fn quorum_status(api: Api, Path((vhost, name)): Path<(String, String)>) -> ApiResult {
    read(api, vhost, name, What::QuorumStatus).await
}

/// A read of queue `vhost`/`name` on its leader, its errors as HTTP statuses.
async fn read(api: Api, vhost: String, name: String, what: What) -> ApiResult {
    readable_vhost(&api, &vhost)?;
    match queue_read(api.broker.queues(), &vhost, &name, what, false).await {
        Ok(v) => ok(v),
        Err(e) if e.status == 404 => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "Object Not Found",
            e.text,
        )),
        Err(e) => Err(ApiError::new(
            StatusCode::from_u16(e.status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE),
            "service_unavailable",
            e.text,
        )),
    }
}
