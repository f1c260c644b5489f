//! The HTTP health probes (`--http-listen`) against a real quorumq process:
//! `/health/live` answers `up`; `/health/ready` answers `serving`, turns to
//! 503 `not serving: draining` under `quorumqctl drain` and back after
//! `revive`; an unknown path is 404.

use std::time::Duration;

use anyhow::Context;
use cluster_tests::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `GET path` over HTTP/1.1 on `addr`: (status code, body).
async fn get(addr: &str, path: &str) -> anyhow::Result<(u16, String)> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut text = String::new();
    s.read_to_string(&mut text).await?;
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .with_context(|| format!("no status line in {text:?}"))?;
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    Ok((status, body))
}

async fn ctl(broker: &Broker, args: &[&str]) -> anyhow::Result<String> {
    let admin = broker.admin_addr().context("admin address")?;
    dlx::run(dlx::quorumqctl(&admin, args), dlx::CTL_TIMEOUT).await
}

#[tokio::test]
async fn readiness_follows_drain_and_revive() -> anyhow::Result<()> {
    bounded(Duration::from_secs(60), async {
        let mut broker = Broker::spawn().await?;
        let addr = format!("127.0.0.1:{}", free_port()?);
        broker.restart_with(&["--http-listen", &addr]).await?;

        assert_eq!(get(&addr, "/health/live").await?, (200, "up\n".into()));
        assert_eq!(
            get(&addr, "/health/ready").await?,
            (200, "serving\n".into())
        );
        assert_eq!(get(&addr, "/nope").await?.0, 404);

        ctl(&broker, &["drain"]).await?;
        assert_eq!(
            get(&addr, "/health/ready").await?,
            (503, "not serving: draining\n".into())
        );
        assert_eq!(
            get(&addr, "/health/live").await?.0,
            200,
            "draining is alive"
        );

        ctl(&broker, &["revive"]).await?;
        assert_eq!(
            get(&addr, "/health/ready").await?,
            (200, "serving\n".into())
        );
        Ok(())
    })
    .await
}
