//! Publisher confirms: every publish confirmed, delivery tags and `multiple`
//! acks seen on the wire, nacks from reject-publish, tx/confirm mode clashes.

use cluster_tests::{raw::RawConn, *};
use lapin::{
    options::{ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions},
    types::AMQPValue,
    BasicProperties,
};
use std::{collections::BTreeSet, time::Duration};

const T: Duration = TEST_TIMEOUT;

#[tokio::test]
async fn every_publish_is_confirmed() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let ch = confirm_channel(&conn).await?;
        let q = unique("q.confirm");
        ch.queue_declare(
            q.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            quorum_args(&[]),
        )
        .await?;
        let mut pending = Vec::new();
        for i in 0..2000u32 {
            pending.push(
                ch.basic_publish(
                    "".into(),
                    q.as_str().into(),
                    Default::default(),
                    &i.to_be_bytes(),
                    BasicProperties::default(),
                )
                .await?,
            );
        }
        for p in pending {
            let c = p.await?;
            assert!(c.is_ack());
        }
        assert!(ch.wait_for_confirms().await?.is_empty());
        let d = ch
            .queue_declare(
                q.as_str().into(),
                QueueDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                quorum_args(&[]),
            )
            .await?;
        assert_eq!(d.message_count(), 2000);
        ch.queue_delete(q.as_str().into(), QueueDeleteOptions::default())
            .await?;
        Ok(())
    })
    .await
}

/// Raw wire view: confirm.select-ok, then basic.ack frames whose tags (with
/// `multiple`) cover 1..=N exactly once, in increasing order.
#[tokio::test]
async fn confirm_tags_cover_every_publish_raw() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let setup = connect(broker.uri()).await?;
        let sch = setup.create_channel().await?;
        let q = unique("q.rawconfirm");
        sch.queue_declare(
            q.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            quorum_args(&[]),
        )
        .await?;

        let mut c = RawConn::handshake(broker.uri()).await?;
        c.send_method(1, raw::Args::method(20, 10).shortstr(""))
            .await?;
        assert_eq!(
            c.read_method(Duration::from_secs(10))
                .await?
                .and_then(|f| f.method()),
            Some((20, 11))
        );
        c.send_method(1, raw::Args::method(85, 10).u8(0)).await?;
        assert_eq!(
            c.read_method(Duration::from_secs(10))
                .await?
                .and_then(|f| f.method()),
            Some((85, 11))
        );
        const N: u64 = 500;
        let mut buf = Vec::new();
        for i in 0..N {
            buf.extend(raw::frame(
                raw::FRAME_METHOD,
                1,
                &raw::Args::method(60, 40)
                    .u16(0)
                    .shortstr("")
                    .shortstr(&q)
                    .u8(0)
                    .0,
            ));
            // content header: class 60, weight 0, body size, flags 0
            let mut h = raw::Args::default().u16(60).u16(0).0;
            h.extend_from_slice(&8u64.to_be_bytes());
            h.extend_from_slice(&0u16.to_be_bytes());
            buf.extend(raw::frame(raw::FRAME_HEADER, 1, &h));
            buf.extend(raw::frame(raw::FRAME_BODY, 1, &i.to_be_bytes()));
        }
        c.send(&buf).await?;
        let mut confirmed = BTreeSet::new();
        let (mut last, mut multiples) = (0u64, 0);
        while (confirmed.len() as u64) < N {
            let f = c
                .read_method(Duration::from_secs(20))
                .await?
                .expect("basic.ack");
            assert_eq!(
                f.method(),
                Some((60, 80)),
                "expected basic.ack, got {f:?} {:?}",
                f.close_reason()
            );
            let tag = u64::from_be_bytes(f.payload[4..12].try_into()?);
            let multiple = f.payload[12] & 1 == 1;
            assert!(tag > last && tag <= N, "tag {tag} after {last}");
            if multiple {
                multiples += 1;
                confirmed.extend(last + 1..=tag);
            } else {
                confirmed.insert(tag);
            }
            last = tag;
        }
        assert_eq!(confirmed, (1..=N).collect::<BTreeSet<_>>());
        println!("{N} publishes confirmed; {multiples} acks had multiple=true");
        let d = sch
            .queue_declare(
                q.as_str().into(),
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                Default::default(),
            )
            .await?;
        assert_eq!(d.message_count() as u64, N);
        sch.queue_delete(q.as_str().into(), QueueDeleteOptions::default())
            .await?;
        Ok(())
    })
    .await
}

#[tokio::test]
async fn reject_publish_overflow_nacks() -> anyhow::Result<()> {
    // RabbitMQ 3.10.8 checks the limit after the enqueue: x-max-length 2
    // accepts a third message and nacks from the fourth on.
    bounded(T, async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let ch = confirm_channel(&conn).await?;
        let q = unique("q.rejectpub");
        let args = quorum_args(&[
            ("x-max-length", AMQPValue::LongInt(2)),
            ("x-overflow", s("reject-publish")),
        ]);
        ch.queue_declare(
            q.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            args,
        )
        .await?;
        let mut outcome = Vec::new();
        for i in 0..5u8 {
            let c = ch
                .basic_publish(
                    "".into(),
                    q.as_str().into(),
                    Default::default(),
                    &[i],
                    BasicProperties::default(),
                )
                .await?
                .await?;
            outcome.push(c.is_ack());
        }
        assert!(
            outcome[0] && outcome[1],
            "the first max-length publishes are acked: {outcome:?}"
        );
        assert!(
            !outcome[3] && !outcome[4],
            "publishes beyond the limit are nacked: {outcome:?}"
        );
        let d = ch
            .queue_declare(
                q.as_str().into(),
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                Default::default(),
            )
            .await?;
        assert_eq!(
            d.message_count() as usize,
            outcome.iter().filter(|a| **a).count()
        );
        ch.queue_delete(q.as_str().into(), QueueDeleteOptions::default())
            .await?;
        Ok(())
    })
    .await
}

#[tokio::test]
async fn tx_and_confirm_modes_exclude_each_other() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let ch = conn.create_channel().await?;
        ch.tx_select().await?;
        let err = expect_amqp_error(ch.confirm_select(ConfirmSelectOptions::default()).await);
        assert_eq!(
            err,
            (
                406,
                "PRECONDITION_FAILED - cannot switch from tx to confirm mode".into()
            )
        );
        let ch = confirm_channel(&conn).await?;
        let err = expect_amqp_error(ch.tx_select().await);
        assert_eq!(
            err,
            (
                406,
                "PRECONDITION_FAILED - cannot switch from confirm to tx mode".into()
            )
        );
        Ok(())
    })
    .await
}
