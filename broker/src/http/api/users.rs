//! `/api/users`: list, show, create or update (password or hash, tags) and delete users;
//! the user JSON the definitions share.

use axum::body::Bytes;
use axum::extract::Path;
use axum::routing::get;
use axum::Router;
use serde_json::{json, Value};

use super::body::{body_object, str_field};
use super::{created, no_content, ok, ApiResult};
use crate::http::{Api, ApiError, Started};
use crate::meta::access::User;
use crate::meta::command::MetaCommand;

/// The user routes.
pub(super) fn routes() -> Router<Started> {
    Router::new().route("/api/users", get(users)).route(
        "/api/users/{user}",
        get(user).put(put_user).delete(delete_user),
    )
}

/// A user as the API and definitions show it (RabbitMQ: base64 of the
/// `rabbit_password_hashing_sha256` hash).
pub fn user_json(u: &User) -> Value {
    use base64::Engine;
    json!({
        "name": u.name,
        "password_hash": base64::engine::general_purpose::STANDARD.encode(&u.password_hash),
        "hashing_algorithm": "rabbit_password_hashing_sha256",
        "tags": u.tags,
        "limits": {},
    })
}

pub(super) async fn users(api: Api, uri: axum::http::Uri) -> ApiResult {
    api.caller.require_admin()?;
    let list: Vec<Value> = api
        .broker
        .with_topology(|t| t.access().users().map(user_json).collect())
        .unwrap_or_default();
    super::listing::reply_list(list, &uri)
}

pub(super) async fn user(api: Api, Path(name): Path<String>) -> ApiResult {
    api.caller.require_admin()?;
    api.broker
        .with_topology(|t| t.access().user(&name).map(user_json))
        .flatten()
        .map_or_else(|| Err(ApiError::not_found()), ok)
}

/// Tags as RabbitMQ accepts them: a JSON list, or one comma-separated string.
pub fn parse_tags(v: Option<&Value>) -> Vec<String> {
    match v {
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect(),
        Some(Value::String(s)) => s
            .split(',')
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(str::to_owned)
            .collect(),
        _ => Vec::new(),
    }
}

/// A password hash from a request: `password` (hashed here with a fresh salt) or
/// `password_hash` (base64, RabbitMQ's layout, as exported).
///
/// Errors: 400 for a `password_hash` that is not base64 or a `hashing_algorithm` other
/// than `rabbit_password_hashing_sha256`.
pub fn password_hash_of(m: &serde_json::Map<String, Value>) -> Result<Vec<u8>, ApiError> {
    use base64::Engine;
    if let Some(p) = str_field(m, "password") {
        return Ok(if p.is_empty() {
            Vec::new()
        } else {
            crate::meta::access::hash_password(rand::random(), p.as_bytes())
        });
    }
    if let Some(alg) = str_field(m, "hashing_algorithm") {
        if alg != "rabbit_password_hashing_sha256" {
            return Err(ApiError::bad_request(format!(
                "unsupported hashing algorithm {alg} (only rabbit_password_hashing_sha256)"
            )));
        }
    }
    match str_field(m, "password_hash") {
        Some(h) => base64::engine::general_purpose::STANDARD
            .decode(h)
            .map_err(|e| ApiError::bad_request(format!("password_hash is not base64: {e}"))),
        None => Err(ApiError::bad_request(
            "key_missing: password or password_hash",
        )),
    }
}

/// `PUT /api/users/{user}` `{"password" | "password_hash", "tags"}`: 201 or 204.
pub(super) async fn put_user(api: Api, Path(name): Path<String>, body: Bytes) -> ApiResult {
    api.caller.require_admin()?;
    let m = body_object(&body)?;
    let hash = password_hash_of(&m)?;
    let tags = parse_tags(m.get("tags"));
    let existed = api
        .broker
        .with_topology(|t| t.access().user(&name).is_some())
        .unwrap_or(false);
    if existed {
        api.broker
            .operator_write(MetaCommand::SetPasswordHash {
                name: name.clone(),
                hash,
            })
            .await?;
        api.broker
            .operator_write(MetaCommand::SetUserTags { name, tags })
            .await?;
        no_content()
    } else {
        api.broker
            .operator_write(MetaCommand::AddUser(User {
                name,
                password_hash: hash,
                tags,
            }))
            .await?;
        created()
    }
}

pub(super) async fn delete_user(api: Api, Path(name): Path<String>) -> ApiResult {
    api.caller.require_admin()?;
    api.broker
        .operator_write(MetaCommand::DeleteUser { name })
        .await?;
    no_content()
}
