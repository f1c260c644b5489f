//! Issue 11 item 1 with a real broker: a byte flipped in a write-ahead-log record that later
//! synced records follow is corruption, not a torn tail. quorumq refuses to start, naming the
//! segment file and offset (before, recovery cut the log there and started as if nothing had
//! happened: every confirmed message after the damaged record vanished without an error). The
//! operator's explicit `--wal-truncate-at FILE:OFFSET` starts it having lost exactly the
//! records from that spot on; later starts need no flag.

use cluster_tests::*;
use lapin::BasicProperties;
use std::{collections::BTreeSet, path::PathBuf, time::Duration};

const N: u32 = 200;
const DAMAGED: u32 = 120;

fn body(i: u32) -> Vec<u8> {
    let mut b = format!("wal-corruption-{i:05}-").into_bytes();
    b.resize(256, b'.');
    b
}

fn wal_segments(data: &std::path::Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(data.join("node-1").join("raft").join("wal"))
        .expect("the node's WAL directory")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "wal"))
        .collect();
    v.sort();
    v
}

#[tokio::test]
async fn a_corrupt_wal_record_stops_the_node_until_the_operator_truncates() -> anyhow::Result<()> {
    bounded(Duration::from_secs(180), async {
        let mut broker = Broker::start().await?;
        if broker.is_external() {
            println!("{TEST_URI_ENV} is set; this test corrupts a spawned quorumq's files, returning early");
            return Ok(());
        }
        let q = unique("wal-corrupt");
        let conn = connect(broker.uri()).await?;
        let ch = confirm_channel(&conn).await?;
        ch.queue_declare(q.as_str().into(), durable(), quorum_args(&[]))
            .await?;
        // One publish per confirm: each message is its own Raft entry and its own sync round.
        let persistent = BasicProperties::default().with_delivery_mode(2);
        for i in 0..N {
            publish_confirmed(&ch, "", &q, &body(i), persistent.clone()).await?;
        }
        broker.kill9();

        // Flip a byte inside message DAMAGED's body in the WAL.
        let data = broker.data_dir().expect("spawned");
        let needle = format!("wal-corruption-{DAMAGED:05}-").into_bytes();
        let (seg, at) = wal_segments(&data)
            .into_iter()
            .find_map(|p| {
                let bytes = std::fs::read(&p).ok()?;
                let at = bytes.windows(needle.len()).position(|w| w == needle)?;
                Some((p, at))
            })
            .expect("message DAMAGED's body in a WAL segment");
        let mut bytes = std::fs::read(&seg)?;
        bytes[at + needle.len() + 10] ^= 0x20;
        std::fs::write(&seg, &bytes)?;

        // The node refuses to start and says where.
        let refused = broker.restart().await;
        assert!(refused.is_err(), "quorumq started on a corrupt WAL");
        let log = broker.log_tail(20_000);
        let name = seg.file_name().unwrap().to_str().unwrap().to_string();
        assert!(log.contains("corrupt at offset"), "no corruption error in:\n{log}");
        assert!(log.contains(&name), "the error does not name {name}:\n{log}");
        let flag = "--wal-truncate-at ";
        let spot: String = log[log.rfind(flag).expect("the repair flag is named") + flag.len()..]
            .chars()
            .take_while(|c| !c.is_whitespace() && *c != '"')
            .collect();
        assert!(spot.starts_with(&format!("{name}:")), "{spot}");
        println!("refused as expected; repair spot {spot}");
        let offset: usize = spot[name.len() + 1..].parse()?;
        assert!(offset <= at, "the damaged record starts at or before the flipped byte");

        // The operator's explicit truncate: the node starts, having lost exactly the records
        // from the damaged one on (message DAMAGED and every later one).
        broker.restart_with(&["--wal-truncate-at", &spot]).await?;
        broker.restart_with(&[]).await?;
        let conn = connect(broker.uri()).await?;
        let (_ch, mut consumer) = open_consumer(&conn, &q, 500).await?;
        let got = consume_n(&mut consumer, DAMAGED as usize, Duration::from_secs(30)).await?;
        let ids: BTreeSet<Vec<u8>> = got.iter().map(|d| d.data.clone()).collect();
        let want: BTreeSet<Vec<u8>> = (0..DAMAGED).map(body).collect();
        assert_eq!(ids, want, "messages before the damaged record, each once");
        expect_no_delivery(&mut consumer, Duration::from_millis(500)).await?;
        Ok(())
    })
    .await
}
