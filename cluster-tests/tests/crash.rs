//! Durability across process death: confirmed messages in a durable quorum
//! queue survive `kill -9` and a graceful SIGTERM stop. Needs a spawned
//! broker; with QUORUMQ_TEST_URI set these tests print why and return.

use cluster_tests::*;
use futures::StreamExt;
use lapin::{
    options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions, QueueDeclareOptions},
    types::FieldTable,
    BasicProperties,
};
use std::{collections::HashSet, time::Duration};

const N: u32 = 10_000;

async fn spawned_or_skip(test: &str) -> anyhow::Result<Option<Broker>> {
    let broker = Broker::start().await?;
    if broker.is_external() {
        println!("{test}: {TEST_URI_ENV} is set; a kill/restart test needs a spawned quorumq, returning early");
        return Ok(None);
    }
    Ok(Some(broker))
}

/// Publishes bodies 0..n (u32 BE) with confirms (window 512); returns the confirmed ids.
async fn publish_all(uri: &str, q: &str, n: u32) -> anyhow::Result<HashSet<u32>> {
    publish_windowed(uri, q, n, 512).await
}

/// Publishes bodies 0..n with at most `window` unconfirmed publishes.
async fn publish_windowed(
    uri: &str,
    q: &str,
    n: u32,
    window_size: usize,
) -> anyhow::Result<HashSet<u32>> {
    let conn = connect(uri).await?;
    let ch = confirm_channel(&conn).await?;
    ch.queue_declare(
        q.into(),
        QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
        quorum_args(&[]),
    )
    .await?;
    let mut confirmed = HashSet::new();
    let mut window = Vec::new();
    for i in 0..n {
        let pc = ch
            .basic_publish(
                "".into(),
                q.into(),
                Default::default(),
                &i.to_be_bytes(),
                BasicProperties::default().with_delivery_mode(2),
            )
            .await?;
        window.push((i, pc));
        if window.len() == window_size || i + 1 == n {
            for (id, pc) in window.drain(..) {
                if pc.await?.is_ack() {
                    confirmed.insert(id);
                }
            }
        }
    }
    close_connection(&conn).await?;
    Ok(confirmed)
}

/// Consumes until `expected` distinct ids have arrived, then 500 ms more; returns (ids, duplicates).
async fn consume_all(uri: &str, q: &str, expected: usize) -> anyhow::Result<(HashSet<u32>, usize)> {
    let conn = connect(uri).await?;
    let ch = conn.create_channel().await?;
    ch.basic_qos(1000, BasicQosOptions::default()).await?;
    let d = ch
        .queue_declare(
            q.into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            quorum_args(&[]),
        )
        .await?;
    println!(
        "after restart: queue {q} reports {} ready messages",
        d.message_count()
    );
    let mut c = ch
        .basic_consume(
            q.into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let (mut seen, mut dups) = (HashSet::new(), 0);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let limit = if seen.len() >= expected {
            tokio::time::Instant::now() + Duration::from_millis(500)
        } else {
            deadline
        };
        match tokio::time::timeout_at(limit, c.next()).await {
            Err(_) if seen.len() >= expected => break,
            Err(_) => anyhow::bail!("only {} of {expected} messages came back", seen.len()),
            Ok(None) => anyhow::bail!("consumer ended"),
            Ok(Some(r)) => {
                let dl = r?;
                let id = u32::from_be_bytes(dl.data[..4].try_into()?);
                if !seen.insert(id) {
                    dups += 1;
                }
                dl.ack(BasicAckOptions::default()).await?;
            }
        }
    }
    ch.queue_delete(q.into(), Default::default()).await?;
    close_connection(&conn).await?;
    Ok((seen, dups))
}

#[tokio::test]
async fn confirmed_messages_survive_kill9() -> anyhow::Result<()> {
    bounded(Duration::from_secs(300), async {
        let Some(mut broker) = spawned_or_skip("confirmed_messages_survive_kill9").await? else {
            return Ok(());
        };
        let q = unique("q.crash");
        let confirmed = publish_all(broker.uri(), &q, N).await?;
        assert_eq!(confirmed.len(), N as usize, "every publish should be acked");
        broker.kill9();
        broker.restart().await?;
        let (seen, dups) = consume_all(broker.uri(), &q, N as usize).await?;
        let lost: Vec<_> = confirmed.difference(&seen).take(10).collect();
        assert!(lost.is_empty(), "confirmed but lost (first 10): {lost:?}");
        assert_eq!(seen.len(), N as usize, "unexpected ids");
        assert_eq!(
            dups, 0,
            "every message was confirmed, so none may be duplicated"
        );
        Ok(())
    })
    .await
}

#[tokio::test]
async fn graceful_stop_and_restart_keeps_messages() -> anyhow::Result<()> {
    bounded(Duration::from_secs(180), async {
        let Some(mut broker) = spawned_or_skip("graceful_stop_and_restart_keeps_messages").await?
        else {
            return Ok(());
        };
        let q = unique("q.stop");
        let confirmed = publish_all(broker.uri(), &q, 500).await?;
        assert_eq!(confirmed.len(), 500);
        let status = broker.stop_with_timeout(Duration::from_secs(30)).await?;
        assert!(
            status.map(|s| s.success()).unwrap_or(false),
            "SIGTERM should exit 0, got {status:?}"
        );
        broker.restart().await?;
        let (seen, dups) = consume_all(broker.uri(), &q, 500).await?;
        assert_eq!((seen.len(), dups), (500, 0));
        Ok(())
    })
    .await
}

/// One publish per Raft entry, so the queue's group takes a snapshot (every
/// 4096 entries) and purges its log before the crash: the bodies of the
/// surviving messages must have been moved out of the log in time.
#[tokio::test]
async fn confirmed_messages_survive_kill9_after_a_snapshot() -> anyhow::Result<()> {
    bounded(Duration::from_secs(300), async {
        let Some(mut broker) =
            spawned_or_skip("confirmed_messages_survive_kill9_after_a_snapshot").await?
        else {
            return Ok(());
        };
        const M: u32 = 5_000;
        let q = unique("q.crash.snap");
        let confirmed = publish_windowed(broker.uri(), &q, M, 1).await?;
        assert_eq!(confirmed.len(), M as usize);
        broker.kill9();
        broker.restart().await?;
        let (seen, dups) = consume_all(broker.uri(), &q, M as usize).await?;
        let lost: Vec<_> = confirmed.difference(&seen).take(10).collect();
        assert!(lost.is_empty(), "confirmed but lost (first 10): {lost:?}");
        assert_eq!((seen.len(), dups), (M as usize, 0));
        Ok(())
    })
    .await
}
