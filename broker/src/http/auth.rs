//! Who calls the management API, and what they may see and do. Basic authentication
//! against the cluster's users (the same hashes AMQP logins check), and RabbitMQ's
//! management tags: `administrator` everything; `monitoring` every read but users,
//! permissions and definitions; `policymaker` and `management` the reads (and, for
//! `policymaker`, the policies) of the vhosts they have permissions in. Source: RabbitMQ
//! 3.10.8 `rabbit_mgmt_util:is_authorized*`, texts and codes observed on the installed
//! 3.10.8 (401 with `{"error":"not_authorized","reason":"Login failed"}`, `Not management
//! user`, `Not administrator user`, `User not authorised to access object`).

use std::time::Duration;

use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;

use super::ApiError;
use crate::node::Broker;

/// A refused login waits this long before its 401, as refused AMQP logins do (slows
/// password guessing).
const REFUSED_LOGIN_DELAY: Duration = Duration::from_secs(1);

/// An authenticated caller of the API.
#[derive(Debug, Clone)]
pub struct Caller {
    /// The user name.
    pub user: String,
    /// The user's tags (`administrator`, `monitoring`, `policymaker`, `management`, ...).
    pub tags: Vec<String>,
}

impl Caller {
    fn has(&self, tag: &str) -> bool {
        self.tags.iter().any(|t| t == tag)
    }

    /// `administrator`.
    pub fn is_admin(&self) -> bool {
        self.has("administrator")
    }

    /// Sees every vhost's objects (`administrator` or `monitoring`).
    pub fn sees_all(&self) -> bool {
        self.is_admin() || self.has("monitoring")
    }

    /// May use the management API at all (any management tag).
    fn is_management(&self) -> bool {
        self.sees_all() || self.has("policymaker") || self.has("management")
    }

    /// Refuses a caller who is not an administrator.
    ///
    /// Errors: 401 `Not administrator user`.
    pub fn require_admin(&self) -> Result<(), ApiError> {
        if self.is_admin() {
            Ok(())
        } else {
            Err(not_authorised("Not administrator user"))
        }
    }

    /// True when the caller may read objects of `vhost`: it sees all, or has permissions
    /// there.
    pub fn may_read(&self, broker: &Broker, vhost: &str) -> bool {
        self.sees_all()
            || broker
                .with_topology(|t| t.access().check_vhost_access(&self.user, vhost).is_ok())
                .unwrap_or(false)
    }

    /// Refuses a caller who may not change policies of `vhost` (an administrator, or a
    /// policymaker with permissions there, may).
    ///
    /// Errors: 401 `User not authorised to access object`.
    pub fn require_policymaker(&self, broker: &Broker, vhost: &str) -> Result<(), ApiError> {
        let may = self.is_admin() || (self.has("policymaker") && self.may_read(broker, vhost));
        if may {
            Ok(())
        } else {
            Err(not_authorised("User not authorised to access object"))
        }
    }

    /// Refuses writes to queues, exchanges and bindings by anyone but an administrator.
    ///
    /// Errors: 401 `User not authorised to access object`.
    pub fn require_writer(&self) -> Result<(), ApiError> {
        if self.is_admin() {
            Ok(())
        } else {
            Err(not_authorised("User not authorised to access object"))
        }
    }
}

fn not_authorised(reason: &str) -> ApiError {
    ApiError::new(StatusCode::UNAUTHORIZED, "not_authorised", reason)
}

/// Checks the request's basic-auth credentials.
///
/// Errors: 401 `Login failed` (with `WWW-Authenticate`, after a 1 s delay) for missing or
/// wrong credentials; 401 `Not management user` for a user without a management tag.
/// A script's request (`X-Requested-With: XMLHttpRequest`, as the web UI sends) gets no
/// `WWW-Authenticate`, so a refused login does not open the browser's own login dialog.
pub async fn authenticate(broker: &Broker, headers: &HeaderMap) -> Result<Caller, Response> {
    let credentials = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Basic "))
        .and_then(|b| {
            base64::engine::general_purpose::STANDARD
                .decode(b.trim())
                .ok()
        })
        .and_then(|raw| String::from_utf8(raw).ok())
        .and_then(|s| s.split_once(':').map(|(u, p)| (u.to_owned(), p.to_owned())));
    let scripted = headers
        .get("x-requested-with")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"XMLHttpRequest"));
    let Some((user, password)) = credentials else {
        return Err(login_failed(scripted));
    };
    if !broker.password_ok(&user, password.as_bytes()) {
        tracing::warn!(%user, "HTTP API login refused: wrong user name or password");
        tokio::time::sleep(REFUSED_LOGIN_DELAY).await;
        return Err(login_failed(scripted));
    }
    let tags = broker
        .with_topology(|t| t.access().user(&user).map(|u| u.tags.clone()))
        .flatten()
        .unwrap_or_default();
    let caller = Caller { user, tags };
    if !caller.is_management() {
        return Err(not_authorised("Not management user").into_response());
    }
    Ok(caller)
}

fn login_failed(scripted: bool) -> Response {
    let mut r =
        ApiError::new(StatusCode::UNAUTHORIZED, "not_authorized", "Login failed").into_response();
    if scripted {
        return r;
    }
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Basic realm=\"RabbitMQ Management\""),
    );
    r
}
