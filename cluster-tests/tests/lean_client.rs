//! The benchmark's lean client (`cluster_tests::lean`) against a running
//! broker: pipelined handshake, confirmed publishes from the pre-encoded
//! template, deliveries reassembled and acked, the queue empty afterwards.

use amq_protocol::protocol::{basic, AMQPClass};
use cluster_tests::lean::{self, ConfirmBook, LeanConn, PublishTemplate};
use cluster_tests::*;

const N: u64 = 500;

#[tokio::test]
async fn lean_client_publishes_confirmed_and_consumes_every_body() -> anyhow::Result<()> {
    bounded(TEST_TIMEOUT, async {
        let broker = Broker::start().await?;
        let admin = connect(broker.uri()).await?;
        let ach = admin.create_channel().await?;
        let q = unique("lean");
        ach.queue_declare(q.as_str().into(), durable(), quorum_args(&[]))
            .await?;

        let mut p = LeanConn::connect(broker.uri()).await?;
        p.confirm_select().await?;
        let body = vec![7u8; 2000];
        // frame_max is at least 4096, so 2000 bytes fit one body frame; the
        // sequence number goes into bytes 10..18.
        let template = PublishTemplate::new(&q, &body, p.frame_max)?;
        let mut out = Vec::new();
        for seq in 0..N {
            template.append(&mut out, 10, &seq.to_be_bytes());
        }
        p.write(&out).await?;
        let mut book = ConfirmBook::new(N);
        while book.settled < N {
            p.reader
                .expect("basic.ack", |m| match m {
                    AMQPClass::Basic(basic::AMQPMethod::Ack(a)) => {
                        Some((a.delivery_tag, a.multiple))
                    }
                    _ => None,
                })
                .await
                .and_then(|(tag, multiple)| book.settle(tag, multiple, ConfirmBook::ACK))?;
        }
        assert!(book.state.iter().all(|s| *s == ConfirmBook::ACK));
        p.close().await;

        let mut c = LeanConn::connect(broker.uri()).await?;
        c.qos(50).await?;
        c.consume(&q).await?;
        let mut assembler = lean::Assembler::default();
        let mut seen = vec![false; N as usize];
        let mut got = 0;
        while got < N {
            let frame = c.reader.next().await?;
            let Some((tag, data)) = assembler
                .feed(frame)
                .map_err(|m| anyhow::anyhow!("{m:?}"))?
            else {
                continue;
            };
            assert_eq!(data.len(), body.len());
            let seq = u64::from_be_bytes(data[10..18].try_into()?);
            assert!(!seen[seq as usize], "message {seq} delivered twice");
            seen[seq as usize] = true;
            got += 1;
            let mut ack = Vec::new();
            lean::encode_method(
                &mut ack,
                AMQPClass::Basic(basic::AMQPMethod::Ack(basic::Ack {
                    delivery_tag: tag,
                    multiple: false,
                })),
            )?;
            c.write(&ack).await?;
        }
        // Checked on the consumer's own connection: RabbitMQ 3.10.8 sometimes
        // requeues the last acked messages of a connection closed right after
        // its acks (settles still in flight when the channel goes down).
        assert_eq!(c.message_count(&q).await?, 0);
        c.close().await;
        ach.queue_delete(q.as_str().into(), Default::default())
            .await?;
        close_connection(&admin).await?;
        Ok(())
    })
    .await
}
