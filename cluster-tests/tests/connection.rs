//! Connection and channel lifecycle: open/close both ways, SASL PLAIN and
//! AMQPLAIN, refused logins, heartbeat negotiation, channel.flow.
//! Reference behaviour: RabbitMQ 3.10.8 (texts asserted verbatim).

use cluster_tests::{
    raw::{self, RawConn},
    *,
};
use lapin::{
    options::{BasicGetOptions, ChannelFlowOptions, ExchangeDeclareOptions},
    types::FieldTable,
    BasicProperties, ExchangeKind,
};
use std::time::Duration;

const T: Duration = TEST_TIMEOUT;

/// `uri` with `user:pass` replaced and a query string appended.
fn with_login(uri: &str, user: &str, pass: &str, query: &str) -> String {
    let (scheme, rest) = uri.split_once("://").expect("uri scheme");
    let rest = rest.rsplit_once('@').map(|(_, r)| r).unwrap_or(rest);
    let base = rest.split('?').next().unwrap_or(rest);
    let sep = if query.is_empty() { "" } else { "?" };
    format!("{scheme}://{user}:{pass}@{base}{sep}{query}")
}

#[tokio::test]
async fn client_initiated_close() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        assert!(conn.status().connected());
        let ch = conn.create_channel().await?;
        assert!(ch.status().connected());
        ch.close(200, "OK".into()).await?;
        assert!(!ch.status().connected());
        close_connection(&conn).await?;
        assert!(conn.status().closed());
        // the broker still serves new connections
        let again = connect(broker.uri()).await?;
        let _ch2 = again.create_channel().await?;
        close_connection(&again).await?;
        Ok(())
    })
    .await
}

#[tokio::test]
async fn server_initiated_close_on_hard_error() -> anyhow::Result<()> {
    // An unknown exchange type is a connection-level error in RabbitMQ:
    // connection.close 503 COMMAND_INVALID.
    bounded(T, async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let ch = conn.create_channel().await?;
        let name = unique("ex.badtype");
        let err = expect_amqp_error(
            ch.exchange_declare(
                name.as_str().into(),
                ExchangeKind::Custom("x-no-such-type".into()),
                ExchangeDeclareOptions::default(),
                FieldTable::default(),
            )
            .await,
        );
        assert_eq!(
            err,
            (
                503,
                "COMMAND_INVALID - unknown exchange type 'x-no-such-type'".to_string()
            )
        );
        // the whole connection is gone, not just the channel
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while conn.status().connected() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(!conn.status().connected());
        assert!(conn.create_channel().await.is_err());
        let again = connect(broker.uri()).await?;
        close_connection(&again).await?;
        Ok(())
    })
    .await
}

#[tokio::test]
async fn server_close_is_answered_and_socket_closed_raw() -> anyhow::Result<()> {
    // A channel-class method on channel 0: connection.close 504
    // "CHANNEL_ERROR - unexpected method in connection state running".
    bounded(T, async {
        let broker = Broker::start().await?;
        let mut c = RawConn::handshake(broker.uri()).await?;
        c.send_method(0, raw::Args::method(20, 10).shortstr(""))
            .await?;
        let reason = c.expect_connection_close(Duration::from_secs(10)).await?;
        let (code, text) = reason.expect("connection.close expected, got a dropped socket");
        assert_eq!(
            (code, text.as_str()),
            (
                504,
                "CHANNEL_ERROR - unexpected method in connection state running"
            )
        );
        assert!(
            c.wait_eof(Duration::from_secs(10)).await,
            "socket still open after close-ok"
        );
        // the broker is still serving
        RawConn::handshake(broker.uri()).await?;
        Ok(())
    })
    .await
}

#[tokio::test]
async fn client_close_gets_close_ok_raw() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let mut c = RawConn::handshake(broker.uri()).await?;
        c.send_method(1, raw::Args::method(20, 10).shortstr(""))
            .await?;
        let open_ok = c
            .read_method(Duration::from_secs(10))
            .await?
            .expect("channel.open-ok");
        assert_eq!((open_ok.channel, open_ok.method()), (1, Some((20, 11))));
        c.send_method(
            0,
            raw::Args::method(10, 50)
                .u16(200)
                .shortstr("bye")
                .u16(0)
                .u16(0),
        )
        .await?;
        let ok = c
            .read_method(Duration::from_secs(10))
            .await?
            .expect("connection.close-ok");
        assert_eq!((ok.channel, ok.method()), (0, Some((10, 51))));
        // The initiator closes the socket after close-ok (RabbitMQ waits for it).
        Ok(())
    })
    .await
}

#[tokio::test]
async fn plain_auth() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let conn = connect(&with_login(
            broker.uri(),
            "guest",
            "guest",
            "auth_mechanism=plain",
        ))
        .await?;
        let _ch = conn.create_channel().await?;
        close_connection(&conn).await?;
        Ok(())
    })
    .await
}

#[tokio::test]
async fn amqplain_auth() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let conn = connect(&with_login(
            broker.uri(),
            "guest",
            "guest",
            "auth_mechanism=amqplain",
        ))
        .await?;
        let _ch = conn.create_channel().await?;
        close_connection(&conn).await?;
        Ok(())
    })
    .await
}

#[tokio::test]
async fn bad_password_is_refused_with_403() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        for mech in ["plain", "amqplain"] {
            let uri = with_login(broker.uri(), "guest", "wrong-password", &format!("auth_mechanism={mech}"));
            let r = lapin::Connection::connect(&uri, lapin::ConnectionProperties::default()).await;
            let (code, text) = expect_amqp_error(r.map(|_| ()));
            assert_eq!(code, 403, "{mech}: {text}");
            assert_eq!(
                text,
                format!(
                    "ACCESS_REFUSED - Login was refused using authentication mechanism {}. For details see the broker logfile.",
                    mech.to_uppercase()
                )
            );
        }
        let r = lapin::Connection::connect(&with_login(broker.uri(), "no-such-user", "x", ""), Default::default()).await;
        assert_eq!(expect_amqp_error(r.map(|_| ())).0, 403);
        // still accepting good logins
        close_connection(&connect(broker.uri()).await?).await?;
        Ok(())
    })
    .await
}

/// connection.start-ok with PLAIN guest/`password`, optionally advertising
/// the `authentication_failure_close` client capability.
fn start_ok(password: &str, failure_close: bool) -> raw::Args {
    let mut props = Vec::new();
    if failure_close {
        let mut caps = Vec::new();
        caps.push(b"authentication_failure_close".len() as u8);
        caps.extend_from_slice(b"authentication_failure_close");
        caps.extend_from_slice(b"t\x01");
        props.push(b"capabilities".len() as u8);
        props.extend_from_slice(b"capabilities");
        props.push(b'F');
        props.extend_from_slice(&(caps.len() as u32).to_be_bytes());
        props.extend_from_slice(&caps);
    }
    let mut a = raw::Args::method(10, 11).u32(props.len() as u32);
    a.0.extend_from_slice(&props);
    a.shortstr("PLAIN")
        .longstr(format!("\0guest\0{password}").as_bytes())
        .shortstr("en_US")
}

#[tokio::test]
async fn bad_login_raw_gets_connection_close_403() -> anyhow::Result<()> {
    // RabbitMQ sends connection.close 403 only to clients that advertise the
    // `authentication_failure_close` capability; others just see the socket close.
    bounded(T, async {
        let broker = Broker::start().await?;
        for failure_close in [true, false] {
            let mut c = RawConn::connect(broker.uri()).await?;
            c.send(raw::PROTOCOL_HEADER).await?;
            let start = c.read_method(Duration::from_secs(10)).await?.expect("connection.start");
            assert_eq!(start.method(), Some((10, 10)));
            // connection.start: version-major 0, version-minor 9
            assert_eq!(&start.payload[4..6], &[0, 9]);
            c.send_method(0, start_ok("nope", failure_close)).await?;
            let reason = c.expect_connection_close(Duration::from_secs(10)).await?;
            if failure_close {
                assert_eq!(
                    reason,
                    Some((403, "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. For details see the broker logfile.".into()))
                );
            } else {
                assert_eq!(reason, None, "expected a plain socket close");
            }
            assert!(c.wait_eof(Duration::from_secs(10)).await);
        }
        // a good login on the same path works
        let mut c = RawConn::connect(broker.uri()).await?;
        c.send(raw::PROTOCOL_HEADER).await?;
        c.read_method(Duration::from_secs(10)).await?.expect("connection.start");
        c.send_method(0, start_ok("guest", true)).await?;
        let tune = c.read_method(Duration::from_secs(10)).await?.expect("connection.tune");
        assert_eq!(tune.method(), Some((10, 30)));
        Ok(())
    })
    .await
}

#[tokio::test]
async fn heartbeat_is_negotiated() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        // The server proposes its heartbeat in connection.tune (RabbitMQ: 60 s).
        let c = RawConn::handshake(broker.uri()).await?;
        assert_eq!(c.server_heartbeat, 60);
        assert!(c.frame_max >= 4096, "frame_max {}", c.frame_max);
        // lapin asks for 10 s; both non-zero: the lower wins.
        let sep = if broker.uri().contains('?') { "&" } else { "?" };
        let conn = connect(&format!("{}{sep}heartbeat=10", broker.uri())).await?;
        assert_eq!(conn.configuration().heartbeat(), 10);
        close_connection(&conn).await?;
        Ok(())
    })
    .await
}

/// A client that negotiated heartbeats and then goes silent (a half-open TCP
/// connection) is dropped after two missed intervals, as RabbitMQ does (TCP
/// close, no connection.close), and the message it held unacked is returned
/// to the queue, redelivered.
#[tokio::test]
async fn a_silent_client_is_dropped_and_its_unacked_messages_return() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let ch = confirm_channel(&conn).await?;
        let q = unique("hb.silent");
        ch.queue_declare(q.as_str().into(), durable(), quorum_args(&[]))
            .await?;
        publish_confirmed(&ch, "", &q, b"held", BasicProperties::default()).await?;

        let mut silent = RawConn::handshake_with_heartbeat(broker.uri(), 1).await?;
        silent
            .send_method(1, raw::Args::method(20, 10).shortstr(""))
            .await?;
        let consume = raw::Args::method(60, 20)
            .u16(0)
            .shortstr(&q)
            .shortstr("silent")
            .u8(0)
            .empty_table();
        silent.send_method(1, consume).await?;
        let mut delivered = false;
        while let Some(f) = silent.read_frame(Duration::from_secs(10)).await? {
            if f.method() == Some((60, 60)) {
                delivered = true;
                break;
            }
        }
        assert!(delivered, "the silent client got its delivery");
        let since = std::time::Instant::now();
        assert!(
            silent.wait_eof(Duration::from_secs(10)).await,
            "a client missing heartbeats must be disconnected"
        );
        let after = since.elapsed();
        assert!(
            after >= Duration::from_millis(1500),
            "dropped after {after:?}"
        );

        let mut back = None;
        for _ in 0..100 {
            back = ch
                .basic_get(q.as_str().into(), BasicGetOptions { no_ack: true })
                .await?;
            if back.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let back = back.expect("the unacked message returned to the queue");
        assert_eq!(back.delivery.data, b"held");
        assert!(back.delivery.redelivered);
        ch.queue_delete(q.as_str().into(), Default::default())
            .await?;
        close_connection(&conn).await?;
        Ok(())
    })
    .await
}

#[tokio::test]
async fn heartbeats_keep_an_idle_connection_alive() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let sep = if broker.uri().contains('?') { "&" } else { "?" };
        let conn = connect(&format!("{}{sep}heartbeat=1", broker.uri())).await?;
        assert_eq!(conn.configuration().heartbeat(), 1);
        let ch = conn.create_channel().await?;
        // idle for 3.5 heartbeat intervals; a missed heartbeat would kill it
        tokio::time::sleep(Duration::from_millis(3500)).await;
        assert!(conn.status().connected());
        let q = ch
            .queue_declare(
                "".into(),
                lapin::options::QueueDeclareOptions {
                    exclusive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await?;
        assert!(q.name().as_str().starts_with("amq.gen-"));
        close_connection(&conn).await?;
        Ok(())
    })
    .await
}

#[tokio::test]
async fn channels_open_and_close_independently() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let mut chans = Vec::new();
        for _ in 0..20 {
            chans.push(conn.create_channel().await?);
        }
        let mut ids: Vec<u16> = chans.iter().map(|c| c.id()).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), 20);
        for c in chans.iter().step_by(2) {
            c.close(200, "OK".into()).await?;
        }
        for (i, c) in chans.iter().enumerate() {
            assert_eq!(c.status().connected(), i % 2 == 1);
        }
        // the survivors still work
        for c in chans.iter().skip(1).step_by(2) {
            c.queue_declare(
                "".into(),
                lapin::options::QueueDeclareOptions {
                    exclusive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await?;
        }
        close_connection(&conn).await?;
        Ok(())
    })
    .await
}

#[tokio::test]
async fn channel_flow() -> anyhow::Result<()> {
    // RabbitMQ 3.10 answers channel.flow active=true with flow-ok true and
    // refuses active=false with connection.close 540 NOT_IMPLEMENTED.
    bounded(T, async {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let ch = conn.create_channel().await?;
        assert!(ch.channel_flow(ChannelFlowOptions { active: true }).await?);
        let err = expect_amqp_error(ch.channel_flow(ChannelFlowOptions { active: false }).await);
        assert_eq!(err, (540, "NOT_IMPLEMENTED - active=false".to_string()));
        Ok(())
    })
    .await
}

/// A client may write connection.open and channel.open back to back (one TCP
/// segment, no wait for open-ok); both are answered, in order, without the
/// client sending anything more. RabbitMQ 3.10.8 does.
#[tokio::test]
async fn pipelined_connection_open_and_channel_open() -> anyhow::Result<()> {
    bounded(T, async {
        let broker = Broker::start().await?;
        let t = Duration::from_secs(10);
        let mut c = RawConn::connect(broker.uri()).await?;
        c.send(raw::PROTOCOL_HEADER).await?;
        let start = c.read_method(t).await?.expect("connection.start");
        assert_eq!(start.method(), Some((10, 10)));
        let start_ok = raw::Args::method(10, 11)
            .empty_table()
            .shortstr("PLAIN")
            .longstr(b"\0guest\0guest")
            .shortstr("en_US");
        c.send_method(0, start_ok).await?;
        let tune = c.read_method(t).await?.expect("connection.tune");
        assert_eq!(tune.method(), Some((10, 30)));
        let mut burst = raw::frame(
            raw::FRAME_METHOD,
            0,
            &raw::Args::method(10, 31).u16(16).u32(131_072).u16(0).0,
        );
        burst.extend(raw::frame(
            raw::FRAME_METHOD,
            0,
            &raw::Args::method(10, 40).shortstr("/").shortstr("").u8(0).0,
        ));
        burst.extend(raw::frame(
            raw::FRAME_METHOD,
            1,
            &raw::Args::method(20, 10).shortstr("").0,
        ));
        c.send(&burst).await?;
        let open_ok = c.read_method(t).await?.expect("connection.open-ok");
        assert_eq!((open_ok.channel, open_ok.method()), (0, Some((10, 41))));
        let ch_ok = c.read_method(t).await?.expect("channel.open-ok");
        assert_eq!((ch_ok.channel, ch_ok.method()), (1, Some((20, 11))));
        Ok(())
    })
    .await
}
