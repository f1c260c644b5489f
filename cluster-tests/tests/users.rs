//! Users and permissions (issue 13 item 1), as RabbitMQ's internal backend:
//! logins against stored hashes, vhost access at connection.open, configure /
//! write / read regexes where RabbitMQ checks them (403 ACCESS_REFUSED with its
//! texts), and the seed's dead-letter rule: declaring a queue with a DLX needs
//! write on the DLX. Runs against RabbitMQ 3.10.8 too (`QUORUMQ_TEST_URI`, with
//! `rabbitmqctl` on the PATH): the same answers come back.

use cluster_tests::{cluster::retry, dlx, *};
use lapin::{
    options::{BasicConsumeOptions, BasicGetOptions, QueueDeclareOptions, QueueDeleteOptions},
    types::FieldTable,
    BasicProperties, Connection,
};
use std::time::Duration;

const T: Duration = TEST_TIMEOUT;
const CTL: Duration = Duration::from_secs(30);

async fn ctl(broker: &Broker, args: &[&str]) -> anyhow::Result<String> {
    dlx::run(dlx::ctl(broker, args)?, CTL).await
}

/// The broker's URI with other credentials.
fn as_user(broker: &Broker, user: &str, password: &str) -> String {
    broker
        .uri()
        .replacen("guest:guest@", &format!("{user}:{password}@"), 1)
}

async fn declare(conn: &Connection, q: &str, args: FieldTable) -> Result<(), lapin::Error> {
    let ch = conn.create_channel().await?;
    ch.queue_declare(q.into(), durable(), args)
        .await
        .map(|_| ())
}

fn refused(kind: &str, name: &str, user: &str) -> (u16, String) {
    (
        403,
        format!(
            "ACCESS_REFUSED - access to {kind} '{name}' in vhost '/' refused for user '{user}'"
        ),
    )
}

#[tokio::test]
async fn users_and_permissions_as_rabbitmq() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let user = unique("bob").replace('.', "-");
        ctl(&broker, &["add_user", &user, "s3cret"]).await?;
        let result = async {
            let uri = as_user(&broker, &user, "s3cret");
            // A user without permissions is refused at connection.open.
            assert_eq!(
                connect_refusal(&uri).await?,
                (
                    530,
                    format!("NOT_ALLOWED - access to vhost '/' refused for user '{user}'")
                )
            );
            // A wrong password is a refused login.
            assert_eq!(
                connect_refusal(&as_user(&broker, &user, "nope")).await?.0,
                403
            );

            let mine = format!("^{user}\\.");
            ctl(
                &broker,
                &[
                    "set_permissions",
                    "-p",
                    "/",
                    &user,
                    &mine,
                    &format!("{mine}|^amq\\.default$"),
                    &mine,
                ],
            )
            .await?;
            let listed = ctl(&broker, &["list_permissions", "-p", "/"]).await?;
            assert!(listed.contains(&user), "{listed}");
            let conn = connect(&uri).await?;

            // configure: own names only.
            let q = format!("{user}.q");
            declare(&conn, &q, quorum_args(&[])).await?;
            let other = unique("other.q");
            assert_eq!(
                expect_amqp_error(declare(&conn, &other, quorum_args(&[])).await),
                refused("queue", &other, &user)
            );
            // The seed's rule: a DLX the user may not write to refuses the declare ...
            let dl = format!("{user}.dl");
            assert_eq!(
                expect_amqp_error(
                    declare(
                        &conn,
                        &dl,
                        quorum_args(&[("x-dead-letter-exchange", s("amq.direct"))])
                    )
                    .await
                ),
                refused("exchange", "amq.direct", &user)
            );
            // ... a policy's DLX is not checked (RabbitMQ 3.10.8: the declare succeeds) ...
            let by_policy = format!("{user}.bypolicy");
            let policy = unique("dlx-pol").replace('.', "-");
            dlx::set_policy(
                &broker,
                &policy,
                &format!("^{by_policy}$"),
                r#"{"dead-letter-exchange":"amq.direct"}"#,
            )
            .await?;
            let declared = declare(&conn, &by_policy, quorum_args(&[])).await;
            dlx::clear_policy(&broker, &policy).await?;
            declared?;
            // ... one it may write to does not.
            let own_dlx = format!("{user}.dlx");
            declare(
                &conn,
                &dl,
                quorum_args(&[("x-dead-letter-exchange", s(&own_dlx))]),
            )
            .await?;

            // write: the default exchange (amq.default) yes, amq.fanout no.
            let ch = confirm_channel(&conn).await?;
            publish_confirmed(&ch, "", &q, b"m", BasicProperties::default()).await?;
            let pc = ch
                .basic_publish(
                    "amq.fanout".into(),
                    "".into(),
                    Default::default(),
                    b"x",
                    BasicProperties::default(),
                )
                .await?;
            assert_eq!(
                expect_amqp_error(pc.await),
                refused("exchange", "amq.fanout", &user)
            );

            // read: own queue yes; another user's no (get and consume).
            let ch = conn.create_channel().await?;
            let got = ch
                .basic_get(q.as_str().into(), BasicGetOptions { no_ack: true })
                .await?;
            assert!(got.is_some(), "the published message");
            let guest = connect(broker.uri()).await?;
            let gq = unique("guest.q");
            declare(&guest, &gq, quorum_args(&[])).await?;
            let ch = conn.create_channel().await?;
            assert_eq!(
                expect_amqp_error(
                    ch.basic_get(gq.as_str().into(), BasicGetOptions::default())
                        .await
                ),
                refused("queue", &gq, &user)
            );
            let ch = conn.create_channel().await?;
            assert_eq!(
                expect_amqp_error(
                    ch.basic_consume(
                        gq.as_str().into(),
                        "".into(),
                        BasicConsumeOptions::default(),
                        FieldTable::default()
                    )
                    .await
                ),
                refused("queue", &gq, &user)
            );
            // configure is needed to delete.
            let ch = conn.create_channel().await?;
            assert_eq!(
                expect_amqp_error(
                    ch.queue_delete(gq.as_str().into(), QueueDeleteOptions::default())
                        .await
                ),
                refused("queue", &gq, &user)
            );
            let ch = conn.create_channel().await?;
            for name in [&q, &dl, &by_policy] {
                ch.queue_delete(name.as_str().into(), QueueDeleteOptions::default())
                    .await?;
            }
            let gch = guest.create_channel().await?;
            gch.queue_delete(gq.as_str().into(), QueueDeleteOptions::default())
                .await?;
            drop(conn);

            // Passwords change, tags are listed, cleared permissions close the vhost again.
            ctl(&broker, &["change_password", &user, "n3w"]).await?;
            assert_eq!(
                connect_refusal(&uri).await?.0,
                403,
                "the old password no longer works"
            );
            let uri = as_user(&broker, &user, "n3w");
            connect(&uri).await?;
            ctl(&broker, &["set_user_tags", &user, "monitoring"]).await?;
            let users = ctl(&broker, &["list_users"]).await?;
            let line = users
                .lines()
                .find(|l| l.starts_with(&user))
                .unwrap_or_default()
                .to_string();
            assert!(line.contains("monitoring"), "{users}");
            ctl(&broker, &["clear_permissions", "-p", "/", &user]).await?;
            assert_eq!(connect_refusal(&uri).await?.0, 530);
            close_connection(&guest).await
        }
        .await;
        let deleted = ctl(&broker, &["delete_user", &user]).await;
        result?;
        deleted?;
        // A deleted user cannot log in.
        assert_eq!(
            connect_refusal(&as_user(&broker, &user, "n3w")).await?.0,
            403
        );
        Ok(())
    })
    .await
}

/// quorumq's default user is RabbitMQ's: guest/guest, administrator, all
/// permissions on `/` (and none on vhosts added later).
/// The (code, text) of the next connection error lapin reports on `events` within 10 s.
async fn next_connection_error(
    events: &mut (impl futures::Stream<Item = lapin::Event> + Unpin),
) -> anyhow::Result<(u16, String)> {
    use futures::StreamExt;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match tokio::time::timeout_at(deadline, events.next()).await {
            Err(_) => anyhow::bail!("the connection was not closed within 10 s"),
            Ok(None) => anyhow::bail!("the event stream ended without an error"),
            Ok(Some(lapin::Event::Error(e))) => {
                return amqp_error(&e).ok_or_else(|| anyhow::anyhow!("not an AMQP error: {e:?}"))
            }
            Ok(Some(_)) => continue,
        }
    }
}

/// RabbitMQ closes the connections of a deleted vhost or user at once (320
/// CONNECTION_FORCED, `rabbit_connection_tracking_handler`); others stay open.
#[tokio::test]
async fn deleting_a_vhost_or_a_user_closes_their_connections() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let vhost = unique("gone").replace('.', "-");
        let user = unique("leaving").replace('.', "-");
        ctl(&broker, &["add_vhost", &vhost]).await?;
        ctl(&broker, &["add_user", &user, "pw"]).await?;
        for v in [vhost.as_str(), "/"] {
            ctl(
                &broker,
                &["set_permissions", "-p", v, &user, ".*", ".*", ".*"],
            )
            .await?;
        }
        let in_vhost =
            connect(&as_user(&broker, &user, "pw").replace("/%2f", &format!("/{vhost}"))).await?;
        let mut in_vhost_events = Box::pin(in_vhost.events_listener());
        let as_leaving = connect(&as_user(&broker, &user, "pw")).await?;
        let mut as_leaving_events = Box::pin(as_leaving.events_listener());
        let bystander = connect(broker.uri()).await?;

        ctl(&broker, &["delete_vhost", &vhost]).await?;
        assert_eq!(
            next_connection_error(&mut in_vhost_events).await?,
            (
                320,
                format!("CONNECTION_FORCED - vhost '{vhost}' is deleted")
            )
        );
        // The user's connection to another vhost stays open.
        as_leaving
            .create_channel()
            .await?
            .close(200, "ok".into())
            .await?;

        ctl(&broker, &["delete_user", &user]).await?;
        assert_eq!(
            next_connection_error(&mut as_leaving_events).await?,
            (320, format!("CONNECTION_FORCED - user '{user}' is deleted"))
        );
        assert!(!in_vhost.status().connected() && !as_leaving.status().connected());
        // Other users' connections are untouched.
        let ch = bystander.create_channel().await?;
        ch.queue_declare(
            unique("bystander").as_str().into(),
            QueueDeclareOptions {
                exclusive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await?;
        close_connection(&bystander).await
    })
    .await
}

#[tokio::test]
async fn guest_is_the_default_administrator_of_slash_only() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::spawn().await?;
        let users = ctl(&broker, &["list_users", "--formatter", "json"]).await?;
        let v: serde_json::Value = serde_json::from_str(&users)?;
        assert_eq!(
            v,
            serde_json::json!([{"user": "guest", "tags": ["administrator"]}])
        );
        ctl(&broker, &["add_vhost", "fresh"]).await?;
        let uri = broker.uri().replace("/%2f", "/fresh");
        assert_eq!(
            connect_refusal(&uri).await?,
            (
                530,
                "NOT_ALLOWED - access to vhost 'fresh' refused for user 'guest'".to_string()
            )
        );
        ctl(
            &broker,
            &["set_permissions", "-p", "fresh", "guest", ".*", ".*", ".*"],
        )
        .await?;
        let conn = connect(&uri).await?;
        let ch = conn.create_channel().await?;
        ch.queue_declare(
            "in.fresh".into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await?;
        close_connection(&conn).await
    })
    .await
}

/// A local address that is not loopback: one end of a veth pair made for the test
/// (needs root, as CI runs; removed on drop).
struct NonLoopbackAddr {
    link: String,
    ip: String,
}

impl NonLoopbackAddr {
    fn make(link: &str, ip: &str) -> anyhow::Result<NonLoopbackAddr> {
        let run = |args: &[&str]| -> anyhow::Result<()> {
            let out = std::process::Command::new("ip").args(args).output()?;
            anyhow::ensure!(
                out.status.success(),
                "ip {}: {} (this test needs root and iproute2)",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
            Ok(())
        };
        let _ = std::process::Command::new("ip")
            .args(["link", "del", link])
            .output();
        let addr = NonLoopbackAddr {
            link: link.into(),
            ip: ip.into(),
        };
        run(&[
            "link",
            "add",
            link,
            "type",
            "veth",
            "peer",
            "name",
            &format!("{link}p"),
        ])?;
        run(&["addr", "add", &format!("{ip}/24"), "dev", link])?;
        run(&["link", "set", link, "up"])?;
        Ok(addr)
    }
}

impl Drop for NonLoopbackAddr {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["link", "del", &self.link])
            .output();
    }
}

/// As RabbitMQ's default `loopback_users`: guest logs in only from a loopback address; from
/// another one the login is refused with RabbitMQ's text, while a user of one's own works
/// from there.
#[tokio::test]
async fn guest_is_refused_from_a_non_loopback_address() -> anyhow::Result<()> {
    bounded(T, async {
        let addr = NonLoopbackAddr::make("qqguest", "10.214.77.1")?;
        let data = tempfile::tempdir()?;
        let (amqp, cluster) = (free_port()?, free_port()?);
        let log = std::fs::File::create(data.path().join("log"))?;
        let mut node = std::process::Command::new(quorumq_bin())
            .arg("--amqp-listen")
            .arg(format!("{}:{amqp}", addr.ip))
            .arg("--cluster-listen")
            .arg(format!("127.0.0.1:{cluster}"))
            .arg("--data-dir")
            .arg(data.path().join("data"))
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        let result = async {
            let admin = format!("http://127.0.0.1:{cluster}");
            let guest = format!("amqp://guest:guest@{}:{amqp}/%2f", addr.ip);
            let refused = retry(Duration::from_secs(20), "node up and refusing guest", || async {
                connect_refusal(&guest).await
            })
            .await?;
            assert_eq!(
                refused,
                (
                    403,
                    "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. For details see the broker logfile."
                        .to_string()
                )
            );
            let ctl = |args: &[&str]| dlx::run(dlx::quorumqctl(&admin, args), CTL);
            ctl(&["add_user", "remote", "pw"]).await?;
            ctl(&["set_permissions", "remote", ".*", ".*", ".*"]).await?;
            let conn = connect(&format!("amqp://remote:pw@{}:{amqp}/%2f", addr.ip)).await?;
            close_connection(&conn).await
        }
        .await;
        let _ = node.kill();
        let _ = node.wait();
        if result.is_err() {
            eprintln!("{}", std::fs::read_to_string(data.path().join("log")).unwrap_or_default());
        }
        result
    })
    .await
}
