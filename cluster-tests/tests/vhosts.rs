//! Virtual hosts (`quorumqctl add_vhost / delete_vhost / list_vhosts`) and the
//! per-vhost default queue type (issue 14 item 6: RabbitMQ's vhost
//! `default_queue_type`, so applications written for classic queues run
//! unchanged in a vhost that defaults to classic).

use cluster_tests::{dlx, *};
use lapin::{
    options::{BasicGetOptions, QueueDeclareOptions},
    types::FieldTable,
    BasicProperties, Connection,
};
use std::time::Duration;

const T: Duration = TEST_TIMEOUT;
const CTL: Duration = Duration::from_secs(30);

fn vhost_uri(broker: &Broker, vhost: &str) -> String {
    let base = broker.uri().trim_end_matches("/%2f");
    format!("{base}/{vhost}")
}

async fn ctl(broker: &Broker, args: &[&str]) -> anyhow::Result<String> {
    dlx::run(dlx::ctl(broker, args)?, CTL).await
}

/// Declares an untyped durable queue, publishes one message and gets it:
/// returns whether the delivery carried `x-delivery-count` (quorum) or not (classic).
async fn untyped_queue_has_delivery_count(conn: &Connection, q: &str) -> anyhow::Result<bool> {
    let ch = confirm_channel(conn).await?;
    ch.queue_declare(
        q.into(),
        QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await?;
    publish_confirmed(&ch, "", q, b"m", BasicProperties::default()).await?;
    let msg = ch
        .basic_get(q.into(), BasicGetOptions { no_ack: true })
        .await?
        .ok_or_else(|| anyhow::anyhow!("no message in {q}"))?;
    Ok(dlx::header(&msg.delivery, "x-delivery-count").is_some())
}

fn queue_type(listing: &str, name: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(listing).ok()?;
    v.as_array()?
        .iter()
        .find(|q| q["name"] == name)
        .and_then(|q| q["type"].as_str().map(str::to_string))
}

#[tokio::test]
async fn vhosts_are_separate_and_carry_their_default_queue_type() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::spawn().await?;
        // An unknown vhost is refused at connection.open, as RabbitMQ does.
        assert_eq!(
            connect_refusal(&vhost_uri(&broker, "legacy")).await?,
            (530, "NOT_ALLOWED - vhost legacy not found".to_string())
        );

        ctl(
            &broker,
            &["add_vhost", "legacy", "--default-queue-type", "classic"],
        )
        .await?;
        // As RabbitMQ: a new vhost grants nobody access.
        ctl(
            &broker,
            &["set_permissions", "-p", "legacy", "guest", ".*", ".*", ".*"],
        )
        .await?;
        let listed = ctl(&broker, &["list_vhosts", "--formatter", "json"]).await?;
        let v: serde_json::Value = serde_json::from_str(&listed)?;
        assert_eq!(
            v,
            serde_json::json!([
                {"name": "/", "default_queue_type": ""},
                {"name": "legacy", "default_queue_type": "classic"}
            ])
        );

        // The same queue name in two vhosts: two queues, each with its vhost's default type.
        let root = connect(broker.uri()).await?;
        let legacy = connect(&vhost_uri(&broker, "legacy")).await?;
        let q = unique("vh.q");
        assert!(
            untyped_queue_has_delivery_count(&root, &q).await?,
            "quorum in /"
        );
        assert!(
            !untyped_queue_has_delivery_count(&legacy, &q).await?,
            "classic in legacy"
        );
        let in_legacy = ctl(
            &broker,
            &["list_queues", "-p", "legacy", "--formatter", "json"],
        )
        .await?;
        assert_eq!(
            queue_type(&in_legacy, &q).as_deref(),
            Some("classic"),
            "{in_legacy}"
        );
        let in_root = ctl(&broker, &["list_queues", "--formatter", "json"]).await?;
        assert_eq!(
            queue_type(&in_root, &q).as_deref(),
            Some("quorum"),
            "{in_root}"
        );

        // Vhost limits are per vhost.
        ctl(
            &broker,
            &["set_vhost_limits", "-p", "legacy", r#"{"max-queues": 1}"#],
        )
        .await?;
        let ch = legacy.create_channel().await?;
        let e = expect_amqp_error(
            ch.queue_declare(
                unique("vh.more").as_str().into(),
                durable(),
                FieldTable::default(),
            )
            .await,
        );
        assert_eq!(e.0, 406);
        assert!(e.1.contains("queue limit in vhost 'legacy' (1)"), "{}", e.1);
        let rch = root.create_channel().await?;
        cluster_tests::cluster::declare_durable(&rch, &unique("vh.root"), FieldTable::default())
            .await?;

        // Deleting the vhost deletes its queues; new connections are refused.
        drop(legacy);
        ctl(&broker, &["delete_vhost", "legacy"]).await?;
        let after = ctl(&broker, &["list_vhosts"]).await?;
        assert!(!after.contains("legacy"), "{after}");
        assert_eq!(connect_refusal(&vhost_uri(&broker, "legacy")).await?.0, 530);
        ctl(&broker, &["add_vhost", "legacy"]).await?;
        ctl(
            &broker,
            &["set_permissions", "-p", "legacy", "guest", ".*", ".*", ".*"],
        )
        .await?;
        let again = connect(&vhost_uri(&broker, "legacy")).await?;
        let ch = again.create_channel().await?;
        let e = expect_amqp_error(
            ch.queue_declare(
                q.as_str().into(),
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await,
        );
        assert_eq!(e.0, 404, "the re-created vhost starts empty: {e:?}");
        // Re-created without a default type: quorum, as the node's default.
        assert!(untyped_queue_has_delivery_count(&again, &unique("vh.q2")).await?);
        drop(again);
        close_connection(&root).await
    })
    .await
}
