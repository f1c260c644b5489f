//! The management API's object routes: a RabbitMQ-compatible subset with RabbitMQ 3.10.8's
//! JSON shapes (captured from the installed 3.10.8's management plugin): overview, nodes,
//! vhosts, users, permissions, exchanges, queues, bindings, policies, alarms. Reads need a
//! management tag (objects of other vhosts only for `administrator` / `monitoring`);
//! changes need `administrator` (policies also `policymaker`). Rates and Erlang process
//! statistics are not kept, so their fields are absent.
//!
//! One file per resource, each with its routes and handlers; [`routes`] merges them.
//! The helpers the definitions import and export with (`user_json`, `declare_queue`,
//! ...) are re-exported here.

mod bindings;
mod body;
pub mod connections;
mod dead_letters;
mod exchange_ops;
mod exchanges;
mod health;
mod listing;
mod maintenance;
mod nodes;
mod overview;
mod permissions;
mod policies;
mod queue_ops;
mod queues;
mod redrive;
mod users;
mod vhosts;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use serde_json::Value;

use super::{ApiError, Started};

pub use bindings::{binding_command, bindings_in};
pub use body::body_object;
pub use exchanges::{exchange_declare, exchange_json};
pub use permissions::all_permissions;
pub use policies::{policy_json, policy_of};
pub use queues::{declare_queue, queue_type};
pub use users::{parse_tags, password_hash_of, user_json};

type ApiResult = Result<Response, ApiError>;

/// The object routes.
pub fn routes() -> Router<Started> {
    Router::new()
        .merge(overview::routes())
        .merge(nodes::routes())
        .merge(maintenance::routes())
        .merge(health::routes())
        .merge(vhosts::routes())
        .merge(users::routes())
        .merge(permissions::routes())
        .merge(exchanges::routes())
        .merge(queues::routes())
        .merge(queue_ops::routes())
        .merge(exchange_ops::routes())
        .merge(connections::routes())
        .merge(dead_letters::routes())
        .merge(redrive::routes())
        .merge(bindings::routes())
        .merge(policies::routes())
}

fn ok(v: Value) -> ApiResult {
    Ok(Json(v).into_response())
}

fn created() -> ApiResult {
    Ok(StatusCode::CREATED.into_response())
}

fn no_content() -> ApiResult {
    Ok(StatusCode::NO_CONTENT.into_response())
}
