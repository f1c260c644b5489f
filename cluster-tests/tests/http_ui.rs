//! The management web UI's HTTP side (issue 30 item 2) with curl against a real quorumq:
//! the page and its assets are served from the binary with their content types, without
//! shadowing the API, and a refused login from the UI's scripts (`X-Requested-With:
//! XMLHttpRequest`) answers 401 without `WWW-Authenticate`, so browsers show the UI's own
//! error instead of their login dialog. The UI itself is tested in a browser by
//! `cluster-tests/ui/test_ui.py` (run by `./test.sh`).

use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::Context;
use cluster_tests::http::HttpBroker;
use cluster_tests::*;

/// `curl -i` of `base+path` with extra `headers`: the status line's code and the raw
/// response (headers, then body).
fn curl_i(base: &str, path: &str, headers: &[&str]) -> anyhow::Result<(u16, String)> {
    let mut cmd = Command::new("curl");
    cmd.args(["-s", "-S", "-i", "--max-time", "30"]);
    for h in headers {
        cmd.args(["-H", h]);
    }
    let out = cmd
        .arg(format!("{base}{path}"))
        .stdin(Stdio::null())
        .output()
        .context("running curl")?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .with_context(|| format!("status of {text:?}"))?;
    Ok((code, text))
}

fn header<'a>(response: &'a str, name: &str) -> Option<&'a str> {
    let head = response.split("\r\n\r\n").next().unwrap_or("");
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

#[tokio::test]
async fn the_ui_is_served_beside_the_api_and_refused_script_logins_skip_the_browser_dialog(
) -> anyhow::Result<()> {
    bounded(Duration::from_secs(120), async {
        let h = HttpBroker::start().await?;
        if !h.is_quorumq() {
            return Ok(()); // RabbitMQ serves its own UI
        }
        let b = &h.base;
        for (path, ty, needle) in [
            ("/", "text/html", "name=\"username\""),
            ("/ui/app.js", "text/javascript", "/api/whoami"),
            ("/ui/style.css", "text/css", "body"),
            ("/ui/favicon.svg", "image/svg+xml", "<svg"),
            ("/favicon.ico", "image/svg+xml", "<svg"),
        ] {
            let (code, r) = curl_i(b, path, &[])?;
            assert_eq!(code, 200, "{path}: {r}");
            assert!(
                header(&r, "content-type").is_some_and(|t| t.starts_with(ty)),
                "{path}: {r}"
            );
            assert!(r.contains(needle), "{path}");
        }
        let (code, r) = curl_i(b, "/ui/missing.js", &[])?;
        assert_eq!(code, 404, "{r}");
        // The API, metrics and health routes are not shadowed.
        assert_eq!(curl_i(b, "/api/nope", &[])?.0, 404);
        assert_eq!(curl_i(b, "/health/live", &[])?.0, 200);
        assert_eq!(curl_i(b, "/metrics", &[])?.0, 200);
        let (code, r) = curl_i(
            b,
            "/api/overview",
            &["Authorization: Basic Z3Vlc3Q6Z3Vlc3Q="],
        )?;
        assert_eq!(code, 200, "{r}");

        // guest:wrong
        let wrong = "Authorization: Basic Z3Vlc3Q6d3Jvbmc=";
        let (code, r) = curl_i(b, "/api/whoami", &[wrong])?;
        assert_eq!(code, 401);
        assert!(header(&r, "www-authenticate").is_some(), "{r}");
        let (code, r) = curl_i(
            b,
            "/api/whoami",
            &[wrong, "X-Requested-With: XMLHttpRequest"],
        )?;
        assert_eq!(code, 401);
        assert!(header(&r, "www-authenticate").is_none(), "{r}");
        assert!(r.contains("Login failed"), "{r}");
        Ok(())
    })
    .await
}
