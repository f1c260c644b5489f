//! Request bodies: a JSON object (an empty body is `{}`) and its fields.

use axum::body::Bytes;
use serde_json::Value;

use super::ApiError;

/// The request body as a JSON object (an empty body is `{}`).
///
/// Errors: 400 for a body that is not a JSON object.
pub fn body_object(body: &Bytes) -> Result<serde_json::Map<String, Value>, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(serde_json::Map::new());
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(other) => Err(ApiError::bad_request(format!(
            "expected a JSON object, got {other}"
        ))),
        Err(e) => Err(ApiError::bad_request(format!("not JSON: {e}"))),
    }
}

/// Field `key` of `m` when it is a string.
pub(super) fn str_field<'a>(m: &'a serde_json::Map<String, Value>, key: &str) -> Option<&'a str> {
    m.get(key).and_then(Value::as_str)
}

/// Field `key` of `m` when it is a boolean, else `default`.
pub(super) fn bool_field(m: &serde_json::Map<String, Value>, key: &str, default: bool) -> bool {
    m.get(key).and_then(Value::as_bool).unwrap_or(default)
}

/// The query string's parameters (`?a=1&b=x`), URL-decoded; a repeated name keeps its last
/// value.
pub fn query_params(uri: &axum::http::Uri) -> std::collections::HashMap<String, String> {
    uri.query()
        .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
        .unwrap_or_default()
}
