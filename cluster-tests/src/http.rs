//! The management HTTP API of a broker under test, driven with `curl` (as operators and
//! the tests do): a spawned quorumq with `--http-listen` on a free port, or, with
//! `QUORUMQ_TEST_HTTP=http://HOST:PORT` (and `QUORUMQ_TEST_URI` for AMQP), an external
//! broker such as RabbitMQ 3.10.8 with its management plugin, to check the tests against
//! the reference.

use std::process::{Command, Stdio};

use anyhow::{bail, Context};
use serde_json::Value;

use crate::{free_port, Broker};

/// Environment variable naming an external broker's management API base URL.
pub const TEST_HTTP_ENV: &str = "QUORUMQ_TEST_HTTP";

/// A broker and the base URL of its HTTP API.
pub struct HttpBroker {
    /// The broker (external when `QUORUMQ_TEST_HTTP` is set).
    pub broker: Broker,
    /// `http://HOST:PORT`.
    pub base: String,
}

impl HttpBroker {
    /// A quorumq process with its HTTP API on a free port, or the external broker named by
    /// `QUORUMQ_TEST_HTTP` / `QUORUMQ_TEST_URI`.
    pub async fn start() -> anyhow::Result<HttpBroker> {
        if let Ok(base) = std::env::var(TEST_HTTP_ENV) {
            if !base.is_empty() {
                return Ok(HttpBroker {
                    broker: Broker::start().await?,
                    base,
                });
            }
        }
        let mut broker = Broker::spawn().await?;
        let addr = format!("127.0.0.1:{}", free_port()?);
        broker.restart_with(&["--http-listen", &addr]).await?;
        Ok(HttpBroker {
            broker,
            base: format!("http://{addr}"),
        })
    }

    /// True for quorumq spawned here (not an external broker).
    pub fn is_quorumq(&self) -> bool {
        !self.broker.is_external()
    }

    /// `curl -X method base+path` as `user:password` with a JSON `body`: the status and the
    /// body (JSON when it parses, else a JSON string; `null` when empty).
    ///
    /// Errors: curl failed to run or to connect.
    pub fn call(
        &self,
        method: &str,
        path: &str,
        (user, password): (&str, &str),
        body: Option<&Value>,
    ) -> anyhow::Result<(u16, Value)> {
        let url = format!("{}{}", self.base, path);
        let mut cmd = Command::new("curl");
        cmd.args(["-s", "-S", "--max-time", "30", "-X", method])
            .args(["-u", &format!("{user}:{password}")])
            .args(["-H", "content-type: application/json"])
            .args(["-w", "\n%{http_code}"]);
        if let Some(b) = body {
            cmd.args(["--data-binary", &b.to_string()]);
        }
        let out = cmd
            .arg(&url)
            .stdin(Stdio::null())
            .output()
            .context("running curl (is it installed?)")?;
        if !out.status.success() {
            bail!(
                "curl {method} {url}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
        let code: u16 = code
            .trim()
            .parse()
            .with_context(|| format!("status of {text:?}"))?;
        let json = if body.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(body).unwrap_or_else(|_| Value::String(body.to_owned()))
        };
        Ok((code, json))
    }

    /// [`HttpBroker::call`] as guest.
    pub fn guest(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> anyhow::Result<(u16, Value)> {
        self.call(method, path, ("guest", "guest"), body)
    }

    /// `GET path` as guest, expecting 200; the JSON body.
    pub fn get(&self, path: &str) -> anyhow::Result<Value> {
        match self.guest("GET", path, None)? {
            (200, v) => Ok(v),
            (code, v) => bail!("GET {path}: {code} {v}"),
        }
    }

    /// The AMQP URI of the broker for `user:password` on `vhost` (URL-encoded here).
    pub fn amqp_uri(&self, user: &str, password: &str, vhost: &str) -> String {
        let uri = self.broker.uri();
        let host = uri
            .split_once('@')
            .map(|(_, rest)| rest)
            .and_then(|r| r.split_once('/'))
            .map_or("127.0.0.1:5672", |(h, _)| h);
        let vhost = vhost.replace('%', "%25").replace('/', "%2f");
        format!("amqp://{user}:{password}@{host}/{vhost}")
    }
}
