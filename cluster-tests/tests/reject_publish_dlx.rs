//! `x-overflow: reject-publish-dlx` on quorum queues (issue 28 item 6): a
//! publish over the limit is nacked to its publisher *and* dead-lettered with
//! reason `maxlen`, at-least-once when the strategy says so.
//!
//! RabbitMQ has it for classic queues only (3.10.8 quorum queues log a warning
//! and drop the head; rabbitmq-server#16673 is open): quorumq's deliberate
//! difference (README). The limit is quorum reject-publish's: the publish that
//! goes over is accepted, the ones after it are refused (spec §10.5). Against
//! an external broker (`QUORUMQ_TEST_URI`) the tests return early.

use cluster_tests::dlx::*;
use cluster_tests::s as ls;
use cluster_tests::*;
use lapin::types::AMQPValue;
use lapin::BasicProperties;
use std::time::Duration;

const T: Duration = Duration::from_secs(90);
const ARRIVAL: Duration = Duration::from_secs(15);

/// Source `q` (max-length 1, reject-publish-dlx, DLX "" → `dlq`) of `strategy`:
/// p1 and p2 are confirmed (p2 goes over), p3 and p4 are nacked and arrive in
/// `dlq` with reason `maxlen`, in order; `q` keeps p1 and p2.
async fn refused_publishes_are_dead_lettered(
    strategy: Strategy,
    by_policy: bool,
) -> anyhow::Result<()> {
    let broker = Broker::start().await?;
    if broker.is_external() {
        return Ok(());
    }
    let conn = connect(broker.uri()).await?;
    let ch = confirm_channel(&conn).await?;
    let q = unique("rpdlx_src");
    let dlq = unique("rpdlx_dlq");
    ch.queue_declare(dlq.as_str().into(), durable(), quorum_args(&[]))
        .await?;
    let mut args: Vec<(&str, AMQPValue)> = strategy
        .queue_args()
        .into_iter()
        .filter(|(k, _)| *k != "x-overflow")
        .collect();
    args.push(("x-dead-letter-exchange", ls("")));
    args.push(("x-dead-letter-routing-key", ls(&dlq)));
    args.push(("x-max-length", long(1)));
    let policy = format!("{q}_policy");
    if by_policy {
        set_policy(
            &broker,
            &policy,
            &format!("^{q}$"),
            r#"{"overflow":"reject-publish-dlx"}"#,
        )
        .await?;
    } else {
        args.push(("x-overflow", ls("reject-publish-dlx")));
    }
    ch.queue_declare(q.as_str().into(), durable(), table(&args))
        .await?;
    if by_policy {
        wait_policy_applied(&broker, &q, &policy).await?;
    }

    let mut confirmed = Vec::new();
    for p in ["p1", "p2", "p3", "p4"] {
        confirmed.push(publish_confirm(&ch, &q, p.as_bytes(), BasicProperties::default()).await?);
    }
    assert_eq!(
        confirmed,
        vec![true, true, false, false],
        "acks, then nacks"
    );

    for p in ["p3", "p4"] {
        let d = get_eventually(&ch, &dlq, p, ARRIVAL).await?;
        let deaths = x_death(&d);
        assert_eq!(deaths.len(), 1, "one death: {deaths:?}");
        assert_eq!(field(&deaths[0], "reason"), Some(&ls("maxlen")));
        assert_eq!(field(&deaths[0], "queue"), Some(&ls(&q)));
        assert_eq!(header(&d, "x-first-death-reason"), Some(&ls("maxlen")));
        assert_eq!(header(&d, "x-last-death-queue"), Some(&ls(&q)));
    }
    consume_empty(&ch, &dlq).await?;
    consume(&ch, &q, &["p1", "p2"]).await?;
    if by_policy {
        clear_policy(&broker, &policy).await?;
    }
    Ok(())
}

#[tokio::test]
async fn at_most_once_refused_publishes_are_dead_lettered() -> anyhow::Result<()> {
    bounded(
        T,
        refused_publishes_are_dead_lettered(Strategy::AtMostOnce, false),
    )
    .await
}

#[tokio::test]
async fn at_least_once_refused_publishes_are_dead_lettered() -> anyhow::Result<()> {
    bounded(
        T,
        refused_publishes_are_dead_lettered(Strategy::AtLeastOnce, false),
    )
    .await
}

#[tokio::test]
async fn reject_publish_dlx_by_policy_enables_at_least_once() -> anyhow::Result<()> {
    bounded(
        T,
        refused_publishes_are_dead_lettered(Strategy::AtLeastOnce, true),
    )
    .await
}

/// At-least-once with a full target: the refused publish is held (not lost)
/// until the target has room, then forwarded.
#[tokio::test]
async fn at_least_once_holds_a_refused_publish_until_the_target_has_room() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        if broker.is_external() {
            return Ok(());
        }
        let conn = connect(broker.uri()).await?;
        let ch = confirm_channel(&conn).await?;
        let q = unique("rpdlx_hold_src");
        let dlq = unique("rpdlx_hold_dlq");
        ch.queue_declare(
            dlq.as_str().into(),
            durable(),
            quorum_args(&[
                ("x-max-length", long(1)),
                ("x-overflow", ls("reject-publish")),
            ]),
        )
        .await?;
        publish(&ch, &dlq, &["d1", "d2"]).await?; // full: d2 went over, publishes refused
        ch.queue_declare(
            q.as_str().into(),
            durable(),
            quorum_args(&[
                ("x-dead-letter-strategy", ls("at-least-once")),
                ("x-overflow", ls("reject-publish-dlx")),
                ("x-dead-letter-exchange", ls("")),
                ("x-dead-letter-routing-key", ls(&dlq)),
                ("x-max-length", long(1)),
            ]),
        )
        .await?;
        let mut confirmed = Vec::new();
        for p in ["p1", "p2", "p3"] {
            confirmed
                .push(publish_confirm(&ch, &q, p.as_bytes(), BasicProperties::default()).await?);
        }
        assert_eq!(confirmed, vec![true, true, false]);
        // p3 is held in q's dead-letter area while dlq refuses it.
        tokio::time::sleep(Duration::from_secs(2)).await;
        consume(&ch, &dlq, &["d1", "d2"]).await?;
        let d = get_eventually(&ch, &dlq, "p3", ARRIVAL).await?;
        assert_eq!(header(&d, "x-first-death-reason"), Some(&ls("maxlen")));
        consume(&ch, &q, &["p1", "p2"]).await?;
        Ok(())
    })
    .await
}
