//! Error paths: channel errors (404/406/403/530 texts), and raw-socket abuse:
//! wrong protocol header, garbage after the handshake, oversized frames.

use cluster_tests::{raw::RawConn, *};
use lapin::{
    options::{BasicAckOptions, BasicConsumeOptions, QueueDeclareOptions, QueueDeleteOptions},
    types::FieldTable,
    BasicProperties,
};
use std::time::Duration;

const T: Duration = TEST_TIMEOUT;

#[tokio::test]
async fn publish_to_unknown_exchange_closes_channel_404() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let ch = confirm_channel(&conn).await?;
        let ex = unique("ex.nowhere");
        let pc = ch
            .basic_publish(
                ex.as_str().into(),
                "k".into(),
                Default::default(),
                b"x",
                BasicProperties::default(),
            )
            .await?;
        let err = expect_amqp_error(pc.await);
        assert_eq!(
            err,
            (404, format!("NOT_FOUND - no exchange '{ex}' in vhost '/'"))
        );
        assert!(!ch.status().connected());
        // the connection and other channels carry on
        let ch2 = confirm_channel(&conn).await?;
        publish_confirmed(&ch2, "amq.fanout", "", b"ok", BasicProperties::default()).await?;
        close_connection(&conn).await
    })
    .await
}

/// A quorum queue with one message, consumed (unacked) on a fresh channel.
async fn one_delivery(
    conn: &lapin::Connection,
) -> anyhow::Result<(
    String,
    lapin::Channel,
    lapin::Consumer,
    lapin::message::Delivery,
)> {
    let ch = confirm_channel(conn).await?;
    let q = unique("q.err");
    ch.queue_declare(
        q.as_str().into(),
        QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
        quorum_args(&[]),
    )
    .await?;
    publish_confirmed(&ch, "", &q, b"x", BasicProperties::default()).await?;
    let mut c = ch
        .basic_consume(
            q.as_str().into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let d = consume_n(&mut c, 1, Duration::from_secs(10))
        .await?
        .remove(0);
    Ok((q, ch, c, d))
}

#[tokio::test]
async fn unknown_delivery_tag_is_406() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let (q, ch, mut c, _d) = one_delivery(&conn).await?;
        ch.basic_ack(42, BasicAckOptions::default()).await?;
        let err = channel_close_reason(&mut c, Duration::from_secs(10)).await?;
        assert_eq!(
            err,
            (406, "PRECONDITION_FAILED - unknown delivery tag 42".into())
        );
        conn.create_channel()
            .await?
            .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
            .await?;
        Ok(())
    })
    .await
}

#[tokio::test]
async fn double_ack_is_406() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let (q, ch, mut c, d) = one_delivery(&conn).await?;
        ch.basic_ack(d.delivery_tag, BasicAckOptions::default())
            .await?;
        ch.basic_ack(d.delivery_tag, BasicAckOptions::default())
            .await?;
        let err = channel_close_reason(&mut c, Duration::from_secs(10)).await?;
        assert_eq!(
            err,
            (
                406,
                format!(
                    "PRECONDITION_FAILED - unknown delivery tag {}",
                    d.delivery_tag
                )
            )
        );
        conn.create_channel()
            .await?
            .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
            .await?;
        Ok(())
    })
    .await
}

#[tokio::test]
async fn consume_from_missing_queue_is_404() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let ch = conn.create_channel().await?;
        let q = unique("q.none");
        let err = expect_amqp_error(
            ch.basic_consume(
                q.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await,
        );
        assert_eq!(
            err,
            (404, format!("NOT_FOUND - no queue '{q}' in vhost '/'"))
        );
        let ch = conn.create_channel().await?;
        let err = expect_amqp_error(ch.basic_get(q.as_str().into(), Default::default()).await);
        assert_eq!(
            err,
            (404, format!("NOT_FOUND - no queue '{q}' in vhost '/'"))
        );
        Ok(())
    })
    .await
}

#[tokio::test]
async fn reused_consumer_tag_is_530() -> anyhow::Result<()> {
    // A connection-level error in RabbitMQ.
    bounded(T, async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let ch = conn.create_channel().await?;
        let q = unique("q.tag");
        ch.queue_declare(
            q.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            quorum_args(&[]),
        )
        .await?;
        let _c = ch
            .basic_consume(
                q.as_str().into(),
                "dup".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        let err = expect_amqp_error(
            ch.basic_consume(
                q.as_str().into(),
                "dup".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await,
        );
        assert_eq!(
            err,
            (
                530,
                "NOT_ALLOWED - attempt to reuse consumer tag 'dup'".into()
            )
        );
        let conn2 = connect(broker.uri()).await?;
        conn2
            .create_channel()
            .await?
            .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
            .await?;
        Ok(())
    })
    .await
}

#[tokio::test]
async fn bad_publish_properties_are_406() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let ch = confirm_channel(&conn).await?;
        let pc = ch.basic_publish("amq.fanout".into(), "".into(), Default::default(), b"x", BasicProperties::default().with_user_id("mallory".into())).await?;
        assert_eq!(expect_amqp_error(pc.await), (406, "PRECONDITION_FAILED - user_id property set to 'mallory' but authenticated user was 'guest'".into()));
        let ch = confirm_channel(&conn).await?;
        let pc = ch.basic_publish("amq.fanout".into(), "".into(), Default::default(), b"x", BasicProperties::default().with_expiration("soon".into())).await?;
        assert_eq!(expect_amqp_error(pc.await), (406, "PRECONDITION_FAILED - invalid expiration 'soon': no_integer".into()));
        let ch = confirm_channel(&conn).await?;
        let pc = ch.basic_publish("amq.fanout".into(), "".into(), Default::default(), b"x", BasicProperties::default().with_expiration("-5".into())).await?;
        assert_eq!(expect_amqp_error(pc.await), (406, "PRECONDITION_FAILED - invalid expiration '-5': {value_negative,-5}".into()));
        Ok(())
    })
    .await
}

#[tokio::test]
async fn wrong_protocol_header_gets_server_header_and_close() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        for header in [
            b"AMQP\x00\x00\x09\x02",
            b"AMQP\x00\x00\x08\x00",
            b"AMQP\x00\x01\x00\x00",
            b"XXXXXXXX",
        ] {
            let mut c = RawConn::connect(broker.uri()).await?;
            c.send(header).await?;
            let reply = c.read_exact(8, Duration::from_secs(10)).await?;
            assert_eq!(reply, raw::PROTOCOL_HEADER, "reply to {header:?}");
            assert!(
                c.wait_eof(Duration::from_secs(10)).await,
                "socket should close after the header reply"
            );
        }
        RawConn::handshake(broker.uri()).await?;
        Ok(())
    })
    .await
}

/// Sends `bytes` after a full handshake and expects connection.close with one
/// of `codes` (or a dropped socket); then checks the broker still accepts.
async fn abuse_after_handshake(
    uri: &str,
    bytes: &[u8],
    codes: &[u16],
) -> anyhow::Result<Option<(u16, String)>> {
    let mut c = RawConn::handshake(uri).await?;
    let _ = c.send(bytes).await; // the server may already have closed
    let reason = c.expect_connection_close(Duration::from_secs(10)).await?;
    if let Some((code, text)) = &reason {
        assert!(codes.contains(code), "close {code} {text}");
    }
    assert!(
        c.wait_eof(Duration::from_secs(10)).await,
        "socket should close"
    );
    let mut ok = RawConn::handshake(uri).await?;
    ok.send_method(
        0,
        raw::Args::method(10, 50)
            .u16(200)
            .shortstr("OK")
            .u16(0)
            .u16(0),
    )
    .await?;
    Ok(reason)
}

#[tokio::test]
async fn garbage_after_handshake_is_frame_error() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        // unknown frame type 9 (its "size" is huge)
        let r = abuse_after_handshake(
            broker.uri(),
            b"\x09garbage-garbage-garbage\xce",
            &[501, 505],
        )
        .await?;
        if let Some((_, text)) = r {
            assert!(
                text.starts_with("FRAME_ERROR - ") || text.starts_with("UNEXPECTED_FRAME - "),
                "{text}"
            );
        }
        // a method frame with a bad frame-end octet
        let mut bad_end = raw::frame(
            raw::FRAME_METHOD,
            1,
            &raw::Args::method(20, 10).shortstr("").0,
        );
        *bad_end.last_mut().unwrap() = 0;
        let r = abuse_after_handshake(broker.uri(), &bad_end, &[501]).await?;
        assert_eq!(r.map(|(c, _)| c), Some(501));
        // a content body frame on a channel with no publish in progress
        let mut seq = raw::frame(
            raw::FRAME_METHOD,
            1,
            &raw::Args::method(20, 10).shortstr("").0,
        );
        seq.extend(raw::frame(raw::FRAME_BODY, 1, b"orphan body"));
        abuse_after_handshake(broker.uri(), &seq, &[501, 503, 505]).await?;
        Ok(())
    })
    .await
}

#[tokio::test]
async fn frame_larger_than_frame_max_is_501() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let probe = RawConn::handshake(broker.uri()).await?;
        let frame_max = probe.frame_max as usize;
        drop(probe);
        let mut bytes = raw::frame(
            raw::FRAME_METHOD,
            1,
            &raw::Args::method(20, 10).shortstr("").0,
        );
        let big = raw::Args::method(60, 40)
            .u16(0)
            .shortstr("")
            .shortstr("k")
            .u8(0)
            .0
            .into_iter()
            .chain(std::iter::repeat_n(0u8, frame_max + 100))
            .collect::<Vec<_>>();
        bytes.extend(raw::frame(raw::FRAME_METHOD, 1, &big));
        let r = abuse_after_handshake(broker.uri(), &bytes, &[501]).await?;
        let (code, text) = r.expect("connection.close 501 expected");
        assert_eq!(code, 501);
        assert!(text.starts_with("FRAME_ERROR - "), "{text}");
        Ok(())
    })
    .await
}

/// After a frame error the broker sends connection.close and keeps the
/// socket open, reading and discarding what the client still sends, until
/// the client answers with close-ok: closing at once with those bytes unread
/// resets the connection, and a client can see the reset before the close.
#[tokio::test]
async fn a_frame_errors_close_waits_for_the_clients_close_ok() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let mut c = RawConn::handshake(broker.uri()).await?;
        let mut bad_end = raw::frame(
            raw::FRAME_METHOD,
            1,
            &raw::Args::method(20, 10).shortstr("").0,
        );
        *bad_end.last_mut().unwrap() = 0;
        // The frames a client had in flight behind the bad one.
        bad_end.extend(raw::frame(raw::FRAME_BODY, 1, &[7u8; 16 * 1024]));
        c.send(&bad_end).await?;
        let close = loop {
            let f = c
                .read_method(Duration::from_secs(10))
                .await?
                .ok_or_else(|| anyhow::anyhow!("EOF before connection.close"))?;
            if f.method() == Some((10, 50)) {
                break f;
            }
        };
        assert_eq!(close.close_reason().map(|(code, _)| code), Some(501));
        let _ = c.send(&[3, 0, 1, 0, 0, 0, 1, 9, 0xCE]).await;
        assert!(
            !c.wait_eof(Duration::from_millis(500)).await,
            "the broker closed the socket before the client's close-ok"
        );
        c.send_method(0, raw::Args::method(10, 51)).await?;
        assert!(
            c.wait_eof(Duration::from_secs(2)).await,
            "the socket should close after close-ok"
        );
        Ok(())
    })
    .await
}

#[tokio::test]
async fn channel_error_leaves_other_channels_working() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let good = confirm_channel(&conn).await?;
        let bad = conn.create_channel().await?;
        let q = unique("q.missing");
        let err = expect_amqp_error(
            bad.queue_declare(
                q.as_str().into(),
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await,
        );
        assert_eq!(err.0, 404);
        publish_confirmed(
            &good,
            "amq.fanout",
            "",
            b"still fine",
            BasicProperties::default(),
        )
        .await?;
        assert!(conn.status().connected());
        close_connection(&conn).await
    })
    .await
}

#[tokio::test]
async fn global_qos_consume_on_quorum_queue_is_540() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let q = unique("q.globalqos");
        let setup = conn.create_channel().await?;
        setup
            .queue_declare(
                q.as_str().into(),
                lapin::options::QueueDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                quorum_args(&[]),
            )
            .await?;
        let ch = conn.create_channel().await?;
        ch.basic_qos(10, lapin::options::BasicQosOptions { global: true })
            .await?;
        let err = expect_amqp_error(
            ch.basic_consume(
                q.as_str().into(),
                "".into(),
                Default::default(),
                lapin::types::FieldTable::default(),
            )
            .await,
        );
        assert_eq!(
            err,
            (
                540,
                format!("NOT_IMPLEMENTED - queue '{q}' in vhost '/' does not support global qos")
            )
        );
        let conn2 = connect(broker.uri()).await?;
        conn2
            .create_channel()
            .await?
            .queue_delete(q.as_str().into(), Default::default())
            .await?;
        Ok(())
    })
    .await
}

/// Each malformed or out-of-order input gets exactly the reply code RabbitMQ 3.10.8 sends for
/// the same bytes (probed against it with raw frames), or — where RabbitMQ only resets the TCP
/// connection or accepts the frame — the code the README lists as a deliberate difference.
#[tokio::test]
async fn malformed_input_gets_rabbitmqs_reply_code() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let open = || {
            raw::frame(
                raw::FRAME_METHOD,
                1,
                &raw::Args::method(20, 10).shortstr("").0,
            )
        };
        let with_open = |rest: Vec<u8>| {
            let mut b = open();
            b.extend(rest);
            b
        };
        let header = |size: u64| {
            let mut p = Vec::new();
            p.extend(60u16.to_be_bytes());
            p.extend(0u16.to_be_bytes());
            p.extend(size.to_be_bytes());
            p.extend(0u16.to_be_bytes());
            raw::frame(raw::FRAME_HEADER, 1, &p)
        };
        let publish_on = |channel: u16| {
            let args = raw::Args::method(60, 40)
                .u16(0)
                .shortstr("")
                .shortstr("q")
                .u8(0);
            raw::frame(raw::FRAME_METHOD, channel, &args.0)
        };
        let publish = publish_on(1);
        let mut bad_end = open();
        *bad_end.last_mut().unwrap() = 0;
        let cases: Vec<(&str, Vec<u8>, u16)> = vec![
            ("bad frame-end octet", bad_end, 501),
            (
                "unknown frame type",
                with_open(raw::frame(9, 1, b"abc")),
                501,
            ),
            (
                "content header without a publish",
                with_open(header(5)),
                505,
            ),
            (
                "content body without a publish",
                with_open(raw::frame(raw::FRAME_BODY, 1, b"x")),
                505,
            ),
            ("method on an unopened channel", publish_on(5), 504),
            // Deliberate differences (README): RabbitMQ resets the connection.
            (
                "unknown class",
                with_open(raw::frame(
                    raw::FRAME_METHOD,
                    1,
                    &raw::Args::method(99, 10).0,
                )),
                502,
            ),
            (
                "unknown method",
                with_open(raw::frame(
                    raw::FRAME_METHOD,
                    1,
                    &raw::Args::method(60, 99).0,
                )),
                502,
            ),
            // RabbitMQ opens the channel; the spec says channel_max bounds it.
            (
                "channel above channel_max",
                raw::frame(
                    raw::FRAME_METHOD,
                    3000,
                    &raw::Args::method(20, 10).shortstr("").0,
                ),
                530,
            ),
            (
                "body longer than the header's size",
                with_open([publish, header(3), raw::frame(raw::FRAME_BODY, 1, b"hello")].concat()),
                501,
            ),
        ];
        for (what, bytes, code) in cases {
            let r = abuse_after_handshake(broker.uri(), &bytes, &[code]).await?;
            assert_eq!(r.map(|(c, _)| c), Some(code), "{what}");
        }
        Ok(())
    })
    .await
}

/// A method on a closing channel (the server sent channel.close, the client has not
/// answered close-ok yet) is discarded, as RabbitMQ 3.10.8 does (AMQP 0-9-1 §4.2.5:
/// after channel.close, only close-ok counts): no connection error, and once close-ok
/// is sent the channel number opens again.
#[tokio::test]
async fn method_on_a_closing_channel_is_discarded() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let t = Duration::from_secs(10);
        let mut c = RawConn::handshake(broker.uri()).await?;
        c.send_method(1, raw::Args::method(20, 10).shortstr(""))
            .await?;
        let ok = c.read_method(t).await?.expect("channel.open-ok");
        assert_eq!(ok.method(), Some((20, 11)));
        // queue.declare passive of a missing queue: the server closes channel 1 (404).
        let missing = unique("q.missing");
        let passive = || {
            raw::Args::method(50, 10)
                .u16(0)
                .shortstr(&missing)
                .u8(0b0000_0001)
                .empty_table()
        };
        c.send_method(1, passive()).await?;
        let close = c.read_method(t).await?.expect("channel.close");
        assert_eq!(close.method(), Some((20, 40)), "{close:?}");
        // Before close-ok: another method on the closing channel must be ignored.
        c.send_method(1, passive()).await?;
        c.send_method(1, raw::Args::method(20, 41)).await?;
        c.send_method(1, raw::Args::method(20, 10).shortstr(""))
            .await?;
        let reopened = c.read_method(t).await?.expect("a reply");
        assert_eq!(
            reopened.method(),
            Some((20, 11)),
            "expected channel.open-ok, got {reopened:?} {:?}",
            reopened.close_reason()
        );
        Ok(())
    })
    .await
}

/// A header value nested `depth` levels deep counting the headers table
/// itself: arrays and tables in turn, with a scalar beside each level.
fn nested_headers(depth: usize) -> FieldTable {
    use lapin::types::{AMQPValue, FieldArray};
    let mut value = AMQPValue::LongString("leaf".into());
    for level in 1..depth {
        value = if level % 2 == 1 {
            AMQPValue::FieldArray(FieldArray::from(vec![AMQPValue::LongInt(1), value]))
        } else {
            AMQPValue::FieldTable(table(&[("n", AMQPValue::Boolean(true)), ("x", value)]))
        };
    }
    table(&[("k", value)])
}

/// Field tables nested deeper than 64 levels (`nesting::MAX_DEPTH`) close the
/// connection with 502 SYNTAX_ERROR; before the limit, client properties
/// nested 25,000 deep in one 125 KB frame, sent before authentication,
/// overflowed a worker's stack and aborted the broker. Headers 64 deep are
/// delivered intact. RabbitMQ has no limit: a deliberate difference (README).
#[tokio::test]
async fn tables_nested_too_deep_are_502_and_the_broker_stays_up() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let t = Duration::from_secs(10);
        // Before authentication: connection.start-ok.
        let mut value = b"A\0\0\0\0".to_vec();
        for _ in 0..25_000 {
            let mut outer = vec![b'A'];
            outer.extend((value.len() as u32).to_be_bytes());
            outer.extend(value);
            value = outer;
        }
        let mut client_properties = vec![1, b'k'];
        client_properties.extend(value);
        let mut start_ok = raw::Args::method(10, 11).u32(client_properties.len() as u32);
        start_ok.0.extend(client_properties);
        let start_ok = start_ok
            .shortstr("PLAIN")
            .longstr(b"\0guest\0guest")
            .shortstr("en_US");
        let mut c = RawConn::connect(broker.uri()).await?;
        c.send(raw::PROTOCOL_HEADER).await?;
        let start = c.read_method(t).await?;
        assert_eq!(start.and_then(|f| f.method()), Some((10, 10)));
        let _ = c.send_method(0, start_ok).await;
        assert!(c.wait_eof(t).await, "socket should close");

        // After it, from a real client: the broker is still up.
        let conn = connect(broker.uri()).await?;
        let ch = confirm_channel(&conn).await?;
        let q = unique("deep");
        ch.queue_declare(q.as_str().into(), durable(), quorum_args(&[]))
            .await?;
        let deepest = nested_headers(64);
        let props = BasicProperties::default().with_headers(deepest.clone());
        publish_confirmed(&ch, "", &q, b"deep", props).await?;
        let got = ch
            .basic_get(q.as_str().into(), Default::default())
            .await?
            .expect("the message");
        let headers = got.delivery.properties.headers().clone().expect("headers");
        assert_eq!(headers.inner().get("k"), deepest.inner().get("k"));

        let props = BasicProperties::default().with_headers(nested_headers(65));
        let pc = ch
            .basic_publish(
                "".into(),
                q.as_str().into(),
                Default::default(),
                b"x",
                props,
            )
            .await;
        let err = match pc {
            Ok(confirm) => expect_amqp_error(confirm.await),
            Err(e) => amqp_error(&e).expect("an AMQP error"),
        };
        assert_eq!(err.0, 502, "{err:?}");
        assert!(
            err.1.starts_with("SYNTAX_ERROR - ") && err.1.contains("nested deeper than 64"),
            "{}",
            err.1
        );

        let conn = connect(broker.uri()).await?;
        let ch = conn.create_channel().await?;
        let args = nested_headers(65);
        let err = expect_amqp_error(
            ch.queue_declare(unique("deep").as_str().into(), durable(), args)
                .await,
        );
        assert_eq!(err.0, 502, "{err:?}");
        let conn = connect(broker.uri()).await?;
        let ch = conn.create_channel().await?;
        ch.queue_delete(q.as_str().into(), QueueDeleteOptions::default())
            .await?;
        close_connection(&conn).await
    })
    .await
}
