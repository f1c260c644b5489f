//! Issue 11 item 3 with a real broker: a message body that no longer reads back intact from
//! its body segment (a byte changed on disk after the snapshot spilled it) is never handed to
//! a consumer with wrong bytes, and the message is not dropped: it stays in the queue, the
//! broker logs it, and `quorumqctl list_queues` reports the queue's unreadable bodies.

use cluster_tests::*;
use futures::StreamExt;
use lapin::{options::BasicAckOptions, BasicProperties};
use serde_json::Value;
use std::{collections::BTreeSet, path::PathBuf, time::Duration};

/// More publishes (one Raft entry each) than the snapshot interval (4096 entries): the
/// snapshot spills every body to the queue's segment files.
const N: u32 = 4200;
const DAMAGED: u32 = 42;

fn body(i: u32) -> Vec<u8> {
    let mut b = format!("body-damage-{i:05}-").into_bytes();
    b.resize(200, b'~');
    b
}

fn body_segments(data: &std::path::Path) -> Vec<PathBuf> {
    let Ok(groups) = std::fs::read_dir(data.join("node-1").join("bodies")) else {
        return Vec::new();
    };
    groups
        .flatten()
        .flat_map(|g| std::fs::read_dir(g.path()).into_iter().flatten().flatten())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect()
}

async fn queue_row(broker: &Broker, q: &str) -> anyhow::Result<Value> {
    let admin = broker.admin_addr().expect("spawned");
    let out = dlx::run(
        dlx::quorumqctl(&admin, &["list_queues", "--formatter", "json"]),
        dlx::CTL_TIMEOUT,
    )
    .await?;
    let rows: Value = serde_json::from_str(&out)?;
    rows.as_array()
        .and_then(|rs| rs.iter().find(|r| r["name"] == q).cloned())
        .ok_or_else(|| anyhow::anyhow!("{q} not in {out}"))
}

#[tokio::test]
async fn a_damaged_body_is_reported_and_its_message_stays_queued() -> anyhow::Result<()> {
    bounded(Duration::from_secs(240), async {
        let broker = Broker::start().await?;
        if broker.is_external() {
            println!("{TEST_URI_ENV} is set; this test damages a spawned quorumq's files, returning early");
            return Ok(());
        }
        let q = unique("body-damage");
        let conn = connect(broker.uri()).await?;
        let ch = confirm_channel(&conn).await?;
        ch.queue_declare(q.as_str().into(), durable(), quorum_args(&[]))
            .await?;
        for i in 0..N {
            publish_confirmed(&ch, "", &q, &body(i), BasicProperties::default().with_delivery_mode(2))
                .await?;
        }
        let data = broker.data_dir().expect("spawned");
        let needle = format!("body-damage-{DAMAGED:05}-").into_bytes();
        let mut found = None;
        for _ in 0..100 {
            found = body_segments(&data).into_iter().find_map(|p| {
                let bytes = std::fs::read(&p).ok()?;
                let at = bytes.windows(needle.len()).position(|w| w == needle)?;
                Some((p, at))
            });
            if found.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let (seg, at) = found.expect("the snapshot spilled message DAMAGED's body to a segment");
        // Same inode the broker reads through: flip one byte of the body in place.
        let f = std::fs::OpenOptions::new().write(true).open(&seg)?;
        std::os::unix::fs::FileExt::write_all_at(&f, b"#", (at + needle.len() + 5) as u64)?;
        drop(f);

        let (_cch, mut consumer) = open_consumer(&conn, &q, 1000).await?;
        let mut got = BTreeSet::new();
        while got.len() < (N - 1) as usize {
            let d = tokio::time::timeout(Duration::from_secs(30), consumer.next())
                .await
                .map_err(|_| anyhow::anyhow!("{} of {} deliveries", got.len(), N - 1))?
                .ok_or_else(|| anyhow::anyhow!("consumer ended"))??;
            assert!(
                d.data.starts_with(b"body-damage-") && d.data.ends_with(b"~~~~"),
                "a delivery with damaged bytes: {:?}",
                String::from_utf8_lossy(&d.data)
            );
            got.insert(d.data.clone());
            d.ack(BasicAckOptions::default()).await?;
        }
        let want: BTreeSet<Vec<u8>> = (0..N).filter(|&i| i != DAMAGED).map(body).collect();
        let show = |s: Vec<&Vec<u8>>| -> Vec<String> {
            s.iter().take(3).map(|b| String::from_utf8_lossy(b).into_owned()).collect()
        };
        assert_none("messages missing", &show(want.difference(&got).collect()));
        assert_none("deliveries not as published", &show(got.difference(&want).collect()));
        expect_no_delivery(&mut consumer, Duration::from_millis(500)).await?;

        let row = queue_row(&broker, &q).await?;
        let held = row["messages_ready"].as_u64().unwrap_or(0)
            + row["messages_unacknowledged"].as_u64().unwrap_or(0);
        assert_eq!(held, 1, "the damaged message stays in the queue: {row}");
        assert!(row["unreadable_bodies"].as_u64().unwrap_or(0) >= 1, "reported: {row}");
        assert!(
            broker.log_tail(200_000).contains("message body unreadable"),
            "logged"
        );
        Ok(())
    })
    .await
}
