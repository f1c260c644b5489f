//! The management API lists the connections, channels and consumers of every
//! node of a cluster, whichever node answers, and closes a connection held by
//! another node (issue 30 item 1: "cluster-wide listings"; RabbitMQ's
//! management API shows the whole cluster's). Three nodes, HTTP on node 1;
//! connections to nodes 2 and 3.

use std::time::Duration;

use cluster_tests::cluster::Cluster;
use cluster_tests::*;
use futures::StreamExt;
use lapin::options::{BasicConsumeOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use serde_json::Value;

/// `curl -X method http://addr+path` as guest; (status, JSON body or null).
fn call(addr: &str, method: &str, path: &str, headers: &[&str]) -> anyhow::Result<(u16, Value)> {
    let mut cmd = std::process::Command::new("curl");
    cmd.args([
        "-s",
        "-S",
        "--max-time",
        "30",
        "-u",
        "guest:guest",
        "-X",
        method,
    ])
    .args(["-w", "\n%{http_code}"]);
    for h in headers {
        cmd.args(["-H", h]);
    }
    let out = cmd.arg(format!("http://{addr}{path}")).output()?;
    anyhow::ensure!(out.status.success(), "curl {method} {path} failed");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    let json = serde_json::from_str(body).unwrap_or(Value::Null);
    Ok((code.trim().parse()?, json))
}

/// The items of `GET path` as a list.
fn list(addr: &str, path: &str) -> anyhow::Result<Vec<Value>> {
    match call(addr, "GET", path, &[])? {
        (200, Value::Array(items)) => Ok(items),
        other => anyhow::bail!("GET {path}: {other:?}"),
    }
}

/// The connection labelled `label` (client-provided name) in `items`.
fn labelled<'a>(items: &'a [Value], label: &str) -> Option<&'a Value> {
    items.iter().find(|c| c["user_provided_name"] == label)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_nodes_connections_are_listed_and_closed_through_one_node() -> anyhow::Result<()> {
    bounded(Duration::from_secs(180), async {
        let cluster = Cluster::start(3).await?;
        let http = format!("127.0.0.1:{}", free_port()?);
        cluster.restart_with(1, &["--http-listen", &http]).await?;

        let (l2, l3) = (unique("on-node-2"), unique("on-node-3"));
        let open = |node: u64, label: String| {
            let uri = cluster.uri(node);
            async move {
                let props =
                    lapin::ConnectionProperties::default().with_connection_name(label.into());
                anyhow::Ok(lapin::Connection::connect(&uri, props).await?)
            }
        };
        let c2 = open(2, l2.clone()).await?;
        let mut events2 = Box::pin(c2.events_listener());
        let _ch2 = c2.create_channel().await?;
        let c3 = open(3, l3.clone()).await?;
        let ch3 = c3.create_channel().await?;
        let q = unique("listing.q");
        ch3.queue_declare(
            q.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            quorum_args(&[]),
        )
        .await?;
        let _consumer = ch3
            .basic_consume(
                q.as_str().into(),
                "ctag-node-3".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;

        // Both connections, through node 1, with the node that holds each.
        let conns = list(&http, "/api/connections")?;
        let n2 =
            labelled(&conns, &l2).ok_or_else(|| anyhow::anyhow!("node 2's missing: {conns:?}"))?;
        let n3 =
            labelled(&conns, &l3).ok_or_else(|| anyhow::anyhow!("node 3's missing: {conns:?}"))?;
        let (node2, node3) = (n2["node"].clone(), n3["node"].clone());
        assert_ne!(node2, node3, "two nodes: {n2} {n3}");
        assert!(node2.as_str().is_some_and(|n| n.contains('2')), "{n2}");
        assert!(node3.as_str().is_some_and(|n| n.contains('3')), "{n3}");
        assert_eq!(n2["channels"], 1);
        let name2 = n2["name"].as_str().unwrap_or_default().to_owned();
        let name3 = n3["name"].as_str().unwrap_or_default().to_owned();
        assert!(
            list(&http, "/api/vhosts/%2F/connections")?
                .iter()
                .any(|c| c["name"] == name3.as_str()),
            "per vhost"
        );
        let path = |name: &str| {
            format!(
                "/api/connections/{}",
                name.replace(' ', "%20").replace('>', "%3E")
            )
        };
        assert_eq!(call(&http, "GET", &path(&name3), &[])?.1["node"], node3);

        let chans = list(&http, "/api/channels")?;
        for name in [&name2, &name3] {
            assert_eq!(
                chans
                    .iter()
                    .filter(|c| c["connection_details"]["name"] == name.as_str())
                    .count(),
                1,
                "{name}: {chans:?}"
            );
        }
        let of3 = list(&http, &format!("{}/channels", path(&name3)))?;
        assert_eq!(of3.len(), 1, "{of3:?}");
        assert_eq!(of3[0]["consumer_count"], 1);

        let consumers = list(&http, "/api/consumers")?;
        let k = consumers
            .iter()
            .find(|k| k["consumer_tag"] == "ctag-node-3")
            .ok_or_else(|| anyhow::anyhow!("node 3's consumer missing: {consumers:?}"))?;
        assert_eq!(k["queue"]["name"], q.as_str());
        assert_eq!(k["channel_details"]["node"], node3);
        assert!(list(&http, "/api/consumers/%2F")?
            .iter()
            .any(|k| k["consumer_tag"] == "ctag-node-3"));

        // Closing node 2's connection through node 1.
        let (code, _) = call(
            &http,
            "DELETE",
            &path(&name2),
            &["X-Reason: moved elsewhere"],
        )?;
        assert_eq!(code, 204);
        let e = loop {
            match tokio::time::timeout(Duration::from_secs(10), events2.next()).await? {
                Some(lapin::Event::Error(e)) => break e,
                Some(_) => continue,
                None => anyhow::bail!("no error event on node 2's connection"),
            }
        };
        assert_eq!(
            amqp_error(&e),
            Some((320, "CONNECTION_FORCED - moved elsewhere".to_owned())),
            "{e:?}"
        );
        cluster_tests::cluster::wait_for(
            Duration::from_secs(10),
            "node 2's connection gone from the listing",
            || async { list(&http, "/api/connections").is_ok_and(|c| labelled(&c, &l2).is_none()) },
        )
        .await?;
        assert_eq!(call(&http, "DELETE", &path(&name2), &[])?.0, 404);
        assert!(labelled(&list(&http, "/api/connections")?, &l3).is_some());

        // A node down: the others are still listed.
        drop(ch3);
        cluster.kill9(2);
        let after = list(&http, "/api/connections")?;
        assert!(labelled(&after, &l3).is_some(), "{after:?}");
        let _ = c3.close(200, "bye".into()).await;
        Ok(())
    })
    .await
}
