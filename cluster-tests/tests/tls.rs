//! TLS (issue 13 item 2) against real quorumq processes, with certificates from
//! `deploy/gen-certs.sh`: AMQPS with lapin and pika (the CA checked by the client), the
//! EXTERNAL mechanism with a client certificate, a client certificate of another CA
//! refused, `tls_fail_if_no_peer_cert`; mutual TLS on the cluster port — quorumqctl and a
//! joining node with a certificate of the cluster's CA get in, without one (or with one
//! of another CA) they get nothing.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use cluster_tests::{dlx, *};
use futures::StreamExt;
use lapin::options::{BasicConsumeOptions, BasicPublishOptions, QueueDeclareOptions};
use lapin::tcp::{OwnedIdentity, OwnedTLSConfig};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection, ConnectionProperties};

const CTL: Duration = Duration::from_secs(30);

/// Runs `deploy/gen-certs.sh` into `dir` (node certificate for localhost / 127.0.0.1,
/// client certificates for `clients`).
fn gen_certs(dir: &Path, clients: &[&str]) -> anyhow::Result<()> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/gen-certs.sh");
    let mut cmd = Command::new("bash");
    cmd.arg(&script).arg(dir);
    for c in clients {
        cmd.args(["--client", c]);
    }
    let out = cmd.output()?;
    anyhow::ensure!(
        out.status.success(),
        "gen-certs.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

fn p(dir: &Path, file: &str) -> String {
    dir.join(file).display().to_string()
}

fn tls_config(ca: &Path, identity: Option<(&Path, &Path)>) -> anyhow::Result<OwnedTLSConfig> {
    Ok(OwnedTLSConfig {
        identity: match identity {
            Some((cert, key)) => Some(OwnedIdentity::PKCS8 {
                pem: std::fs::read(cert)?,
                key: std::fs::read(key)?,
            }),
            None => None,
        },
        cert_chain: Some(std::fs::read_to_string(ca)?),
    })
}

async fn connect_tls(uri: &str, config: OwnedTLSConfig) -> lapin::Result<Connection> {
    let runtime = lapin::runtime::default_runtime()?;
    Connection::connect_with_config(uri, ConnectionProperties::default(), config, runtime).await
}

/// A publish and its consumption over `conn`.
async fn round_trip(conn: &Connection) -> anyhow::Result<()> {
    let ch = conn.create_channel().await?;
    let q = unique("tls");
    ch.queue_declare(
        q.as_str().into(),
        QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await?;
    ch.confirm_select(Default::default()).await?;
    ch.basic_publish(
        "".into(),
        q.as_str().into(),
        BasicPublishOptions::default(),
        b"over tls",
        BasicProperties::default(),
    )
    .await?
    .await?;
    let mut consumer = ch
        .basic_consume(
            q.as_str().into(),
            "c".into(),
            BasicConsumeOptions {
                no_ack: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await?;
    let d = tokio::time::timeout(Duration::from_secs(10), consumer.next())
        .await?
        .expect("a delivery")?;
    assert_eq!(d.data, b"over tls");
    Ok(())
}

/// A node with AMQPS on a free port; returns the broker and the AMQPS port.
async fn amqps_node(certs: &Path, extra: &[&str]) -> anyhow::Result<(Broker, u16)> {
    let mut broker = Broker::spawn().await?;
    let port = free_port()?;
    let listen = format!("127.0.0.1:{port}");
    let (cert, key, ca) = (
        p(certs, "node.pem"),
        p(certs, "node.key"),
        p(certs, "ca.pem"),
    );
    let mut args = vec![
        "--tls-cert-file",
        cert.as_str(),
        "--tls-key-file",
        key.as_str(),
        "--tls-ca-file",
        ca.as_str(),
        "--amqps-listen",
        listen.as_str(),
    ];
    args.extend_from_slice(extra);
    broker.restart_with(&args).await?;
    Ok((broker, port))
}

#[tokio::test]
async fn amqps_with_lapin_and_external_login_by_client_certificate() -> anyhow::Result<()> {
    bounded(Duration::from_secs(120), async {
        let dir = tempfile::tempdir()?;
        let certs = dir.path().join("certs");
        let other = dir.path().join("other-ca");
        gen_certs(&certs, &["guest", "nobody"])?;
        gen_certs(&other, &["guest"])?;
        let (broker, port) = amqps_node(&certs, &["--tls-verify-peer"]).await?;
        let ca = certs.join("ca.pem");

        // Password login over TLS, the server checked against the CA.
        let uri = format!("amqps://guest:guest@localhost:{port}/%2f");
        let conn = connect_tls(&uri, tls_config(&ca, None)?).await?;
        round_trip(&conn).await?;
        conn.close(200, "bye".into()).await?;

        // EXTERNAL: the client certificate's CN (guest) is the user; no password.
        let ext = format!("amqps://localhost:{port}/%2f?auth_mechanism=external");
        let guest = (
            certs.join("client-guest.pem"),
            certs.join("client-guest.key"),
        );
        let conn = connect_tls(&ext, tls_config(&ca, Some((&guest.0, &guest.1)))?).await?;
        round_trip(&conn).await?;
        conn.close(200, "bye".into()).await?;

        // EXTERNAL for a certificate whose user does not exist: refused.
        let nobody = (
            certs.join("client-nobody.pem"),
            certs.join("client-nobody.key"),
        );
        let r = connect_tls(&ext, tls_config(&ca, Some((&nobody.0, &nobody.1)))?).await;
        assert!(r.is_err(), "EXTERNAL login of an unknown user must fail");

        // A client certificate signed by another CA fails the handshake.
        let foreign = (
            other.join("client-guest.pem"),
            other.join("client-guest.key"),
        );
        let r = connect_tls(&ext, tls_config(&ca, Some((&foreign.0, &foreign.1)))?).await;
        assert!(r.is_err(), "a certificate of another CA must be refused");

        // The plain listener still serves.
        let plain = connect(broker.uri()).await?;
        round_trip(&plain).await?;
        plain.close(200, "bye".into()).await?;
        Ok(())
    })
    .await
}

#[tokio::test]
async fn amqps_with_pika_and_a_required_client_certificate() -> anyhow::Result<()> {
    bounded(Duration::from_secs(120), async {
        let dir = tempfile::tempdir()?;
        let certs = dir.path().join("certs");
        gen_certs(&certs, &["guest"])?;
        let (_broker, port) = amqps_node(
            &certs,
            &["--tls-verify-peer", "--tls-fail-if-no-peer-cert"],
        )
        .await?;
        // pika over TLS: with a client certificate (EXTERNAL login), then without one.
        let script = r#"
import ssl, sys, pika
port, ca, cert, key = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
def params(with_cert):
    ctx = ssl.create_default_context(cafile=ca)
    if with_cert:
        ctx.load_cert_chain(cert, key)
    creds = pika.credentials.ExternalCredentials() if with_cert else pika.PlainCredentials("guest", "guest")
    return pika.ConnectionParameters("localhost", port, "/", creds,
        ssl_options=pika.SSLOptions(ctx, "localhost"), connection_attempts=1, socket_timeout=10)
conn = pika.BlockingConnection(params(True))
ch = conn.channel()
q = ch.queue_declare("", exclusive=True).method.queue
ch.confirm_delivery()
ch.basic_publish("", q, b"pika over tls")
_, _, body = ch.basic_get(q, auto_ack=True)
assert body == b"pika over tls", body
conn.close()
try:
    pika.BlockingConnection(params(False))
    print("UNEXPECTED: connected without a client certificate")
except Exception as e:
    print("refused without certificate:", type(e).__name__)
print("OK")
"#;
        let out = Command::new("python3")
            .args(["-c", script, &port.to_string()])
            .args([p(&certs, "ca.pem"), p(&certs, "client-guest.pem"), p(&certs, "client-guest.key")])
            .stdin(Stdio::null())
            .output()?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("OK") && stdout.contains("refused without certificate"),
            "pika: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    })
    .await
}

fn ctl_tls(node: &str, tls: Option<(&Path, &Path, &Path)>, args: &[&str]) -> Vec<String> {
    let mut full: Vec<String> = Vec::new();
    if let Some((ca, cert, key)) = tls {
        for (flag, f) in [
            ("--tls-ca-file", ca),
            ("--tls-cert-file", cert),
            ("--tls-key-file", key),
        ] {
            full.push(flag.into());
            full.push(f.display().to_string());
        }
    }
    full.extend(args.iter().map(|a| a.to_string()));
    let refs: Vec<&str> = full.iter().map(String::as_str).collect();
    dlx::quorumqctl(node, &refs)
}

#[tokio::test]
async fn cluster_port_with_mutual_tls_admits_only_the_clusters_certificates() -> anyhow::Result<()>
{
    bounded(Duration::from_secs(180), async {
        let dir = tempfile::tempdir()?;
        let certs = dir.path().join("certs");
        let other = dir.path().join("other-ca");
        gen_certs(&certs, &["admin"])?;
        gen_certs(&other, &["admin"])?;
        let (broker, _) = amqps_node(&certs, &["--cluster-tls"]).await?;
        let admin = broker.admin_addr().expect("spawned");
        let node = admin.trim_start_matches("http://").to_string();
        let ours: (PathBuf, PathBuf, PathBuf) = (
            certs.join("ca.pem"),
            certs.join("client-admin.pem"),
            certs.join("client-admin.key"),
        );
        let ours = Some((ours.0.as_path(), ours.1.as_path(), ours.2.as_path()));

        // quorumqctl with a certificate of the cluster's CA: served.
        let out = dlx::run(ctl_tls(&node, ours, &["list_users"]), CTL).await?;
        assert!(out.contains("guest"), "{out}");
        // Without TLS, or with a certificate of another CA: nothing.
        let plain = dlx::output(ctl_tls(&admin, None, &["list_users"]), CTL).await?;
        assert!(
            !plain.status.success(),
            "plain HTTP/2 to a TLS cluster port must fail"
        );
        let foreign: (PathBuf, PathBuf) = (
            other.join("client-admin.pem"),
            other.join("client-admin.key"),
        );
        let ca = certs.join("ca.pem");
        let out = dlx::output(
            ctl_tls(&node, Some((&ca, &foreign.0, &foreign.1)), &["list_users"]),
            CTL,
        )
        .await?;
        assert!(
            !out.status.success(),
            "a client certificate of another CA must be refused"
        );

        // A second node with the cluster's certificates joins over TLS.
        let data = tempfile::tempdir()?;
        let (amqp2, cluster2) = (free_port()?, free_port()?);
        let node2_log = std::fs::File::create(dir.path().join("node2.log"))?;
        let mut node2 = Command::new(quorumq_bin())
            .args(["--node-id", "2", "--join", &node])
            .args(["--amqp-listen", &format!("127.0.0.1:{amqp2}")])
            .args(["--cluster-listen", &format!("127.0.0.1:{cluster2}")])
            .args(["--http-listen", ""])
            .arg("--data-dir")
            .arg(data.path())
            .args([
                "--tls-cert-file",
                &p(&certs, "node.pem"),
                "--tls-key-file",
                &p(&certs, "node.key"),
            ])
            .args(["--tls-ca-file", &p(&certs, "ca.pem"), "--cluster-tls"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(node2_log)
            .spawn()?;
        let mut joined = false;
        for _ in 0..100 {
            let out = dlx::output(
                ctl_tls(&node, ours, &["cluster_status", "--formatter", "json"]),
                CTL,
            )
            .await?;
            let text = String::from_utf8_lossy(&out.stdout).to_string();
            let status: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
            let running: Vec<u64> = status["running_nodes"]
                .as_array()
                .map(|a| a.iter().filter_map(|v| v.as_u64()).collect())
                .unwrap_or_default();
            if running.contains(&2) {
                joined = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let _ = node2.kill();
        let _ = node2.wait();
        assert!(
            joined,
            "node 2 did not join over TLS: {}",
            std::fs::read_to_string(dir.path().join("node2.log")).unwrap_or_default()
        );
        Ok(())
    })
    .await
}
