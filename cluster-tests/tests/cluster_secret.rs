//! Cluster authentication (issue 13 item 3): every call on the cluster/admin
//! port must carry the cluster secret. quorumqctl with another secret gets
//! nothing but a refusal, and a node with another secret cannot join.

use cluster_tests::{dlx, *};
use std::process::{Command, Stdio};
use std::time::Duration;

const CTL: Duration = Duration::from_secs(30);

#[tokio::test]
async fn calls_without_the_cluster_secret_are_refused() -> anyhow::Result<()> {
    bounded(TEST_TIMEOUT, async {
        let broker = Broker::spawn().await?;
        let admin = broker.admin_addr().expect("spawned");
        // Same user, same default file as the node: the verbs work unchanged.
        let out = dlx::run(dlx::quorumqctl(&admin, &["list_users"]), CTL).await?;
        assert!(out.contains("guest"), "{out}");

        let dir = tempfile::tempdir()?;
        let wrong = dir.path().join("wrong.cookie");
        std::fs::write(&wrong, "not-the-cluster-secret\n")?;
        let wrong_arg = wrong.display().to_string();
        for verb in [&["list_users"][..], &["add_user", "mallory", "x"][..]] {
            let mut args = vec!["--cluster-secret-file", wrong_arg.as_str()];
            args.extend_from_slice(verb);
            let out = dlx::output(dlx::quorumqctl(&admin, &args), CTL).await?;
            assert!(
                !out.status.success(),
                "{verb:?} succeeded with a wrong secret"
            );
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains("cluster secret missing or wrong"), "{err}");
        }
        let users = dlx::run(dlx::quorumqctl(&admin, &["list_users"]), CTL).await?;
        assert!(
            !users.contains("mallory"),
            "the refused call changed nothing: {users}"
        );

        // A node with another secret asks to join: refused, and never listed.
        let data = tempfile::tempdir()?;
        let (amqp, cluster) = (free_port()?, free_port()?);
        let mut intruder = Command::new(quorumq_bin())
            .args(["--node-id", "9", "--join"])
            .arg(admin.trim_start_matches("http://"))
            .arg("--amqp-listen")
            .arg(format!("127.0.0.1:{amqp}"))
            .arg("--cluster-listen")
            .arg(format!("127.0.0.1:{cluster}"))
            .arg("--data-dir")
            .arg(data.path())
            .arg("--cluster-secret-file")
            .arg(&wrong)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let refused = async {
            for _ in 0..100 {
                if broker
                    .log_tail(20_000)
                    .contains("refused a cluster/admin call")
                {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            false
        }
        .await;
        let status = dlx::run(
            dlx::quorumqctl(&admin, &["cluster_status", "--formatter", "json"]),
            CTL,
        )
        .await;
        let _ = intruder.kill();
        let _ = intruder.wait();
        assert!(refused, "the node did not log refusing the intruder's join");
        let status = status?;
        let v: serde_json::Value = serde_json::from_str(&status)?;
        assert!(
            !status.contains("\"id\":9") && !status.contains("\"node_id\":9"),
            "node 9 was admitted: {v}"
        );
        Ok(())
    })
    .await
}
