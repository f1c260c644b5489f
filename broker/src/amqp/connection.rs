//! One client connection: protocol header, start/tune/open handshake,
//! then a loop over socket frames, channel runs, queue deliveries and
//! publisher-confirm completions. The loop never waits on a channel: it
//! routes each channel's frames to that channel ([`Channel`]) and polls the
//! channel's run beside everything else, so a channel waiting for a Raft
//! commit stalls neither the connection's heartbeats nor its other channels.
//! Socket writes go through a writer task so a slow reader never stalls frame
//! processing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use amq_protocol::protocol::{connection, AMQPClass};
use amq_protocol::types::{AMQPValue, FieldTable, LongString, ShortString};
use bytes::Bytes;
use futures::StreamExt;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use super::channel::{Channel, Escalation, Session};
use super::channels::Channels;
use super::codec::{self, FrameReader, InFrame};
use super::error::ProtocolError;
use super::output::{self, Output};
use crate::consumers::ConnEvent;
use crate::node::Broker;

/// Largest frame we accept and offer (bytes), as RabbitMQ's default.
pub const FRAME_MAX: u32 = 131_072;
/// Heartbeat we offer (seconds), as RabbitMQ's default.
pub const HEARTBEAT: u16 = 60;
/// How long a refused login waits before its answer (slows password guessing).
const LOGIN_REFUSED_DELAY: Duration = Duration::from_secs(1);
/// Time allowed for the handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Output buffers queued for the socket writer before the connection waits for it.
const WRITER_QUEUE: usize = 64;
/// Deliveries a turn of the connection loop writes before it hands them on (bytes; a
/// delivery bigger than this is written whole).
const TURN_OUTPUT_BYTES: usize = 1 << 20;
/// Per-connection state shared by the channel handlers.
pub struct Conn {
    pub(super) broker: Arc<Broker>,
    /// Node-unique connection id (exclusive queue ownership).
    pub(super) id: u64,
    pub(super) vhost: String,
    pub(super) out: Output,
    pub(super) frame_max: u32,
    pub(super) channel_max: u16,
    /// The connection's channels.
    channels: Channels,
    pub(super) mailbox: mpsc::UnboundedSender<ConnEvent>,
    /// Publishing under a resource alarm (RabbitMQ rabbit_reader `connection_state`).
    throttle: Throttle,
    /// The alarms in force, for the `connection.blocked` reason.
    alarm: crate::alarms::Alarm,
    /// A basic.publish arrived since the connection went `Blocking`.
    saw_publish: bool,
    /// The client announced the `connection.blocked` capability.
    blocked_capable: bool,
    /// The client announced the `consumer_cancel_notify` capability.
    cancel_notify: bool,
    /// This connection in the node's connection counts (connection limits), once open.
    counted: Option<crate::connections::Counted>,
    /// The authenticated user (permission checks), once open.
    pub(super) user: String,
    /// The client's address (loopback-only users).
    peer: Option<std::net::SocketAddr>,
    /// The user named by the client's verified TLS certificate (AMQPS with
    /// `tls_verify_peer`): the EXTERNAL mechanism logs in as it.
    cert_user: Option<String>,
    /// connection.start-ok's client properties and mechanism, once logged in.
    client_properties: amq_protocol::types::FieldTable,
    auth_mechanism: String,
}

/// How a resource alarm holds this connection back (rabbit_reader's running / blocking /
/// blocked): `Blocking` while an alarm is raised but the connection has not published since;
/// `Blocked` once it published: the socket is not read until the alarm clears.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Throttle {
    Running,
    Blocking,
    Blocked,
}

enum Step {
    Continue,
    Close,
    /// We answered the client's connection.close: the client closes the
    /// socket (as RabbitMQ, which leaves it to the client); closing first
    /// can make a client see EOF before it reads close-ok.
    Linger,
    /// We sent connection.close for a frame we cannot read past: nothing more
    /// is parsed, and the socket is drained until the client closes it. Closing
    /// with its later frames unread would reset the connection, and a client
    /// can see the reset before it reads connection.close.
    Drain,
}

/// connection.close-ok on channel 0, byte for byte as every client frames it.
const CLOSE_OK: [u8; 12] = [1, 0, 0, 0, 0, 0, 4, 0, 10, 0, 51, 0xCE];

/// Reads and discards until the client closes the socket or sends
/// connection.close-ok (found by its bytes: after a frame error the frames
/// that follow cannot be parsed), for at most 5 s.
async fn drain<R: AsyncRead + Unpin>(rd: &mut R) {
    let mut seen = Vec::with_capacity(8192);
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        let mut sink = [0u8; 4096];
        while let Ok(n @ 1..) = rd.read(&mut sink).await {
            // The last 11 bytes of the previous read, then this one.
            let keep = seen.len().min(CLOSE_OK.len() - 1);
            seen.drain(..seen.len() - keep);
            seen.extend_from_slice(&sink[..n]);
            if seen.windows(CLOSE_OK.len()).any(|w| w == CLOSE_OK) {
                break;
            }
        }
    })
    .await;
}

/// Serves one accepted socket until it closes. Never panics on input.
pub async fn serve(socket: TcpStream, broker: Arc<Broker>, id: u64) {
    let _ = socket.set_nodelay(true);
    let peer = socket.peer_addr().ok();
    let local = socket.local_addr().ok();
    let (rd, wr) = socket.into_split();
    serve_io(rd, wr, (peer, local, false), None, broker, id).await;
}

/// Serves one accepted AMQPS socket: the TLS handshake (≤ 10 s; a client certificate the
/// CA did not sign fails it), then AMQP as [`serve`]. A verified client certificate's
/// common name is offered the EXTERNAL mechanism.
pub async fn serve_tls(
    socket: TcpStream,
    acceptor: tokio_rustls::TlsAcceptor,
    broker: Arc<Broker>,
    id: u64,
) {
    let _ = socket.set_nodelay(true);
    let peer = socket.peer_addr().ok();
    let local = socket.local_addr().ok();
    let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(socket)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::info!(?peer, error = %e, "TLS handshake failed");
            return;
        }
        Err(_) => {
            tracing::info!(?peer, "TLS handshake timed out");
            return;
        }
    };
    let cert_user = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .and_then(crate::tls::certificate_user);
    let (rd, wr) = tokio::io::split(tls);
    serve_io(rd, wr, (peer, local, true), cert_user, broker, id).await;
}

async fn serve_io<R, W>(
    mut rd: R,
    wr: W,
    (peer, local, tls): (
        Option<std::net::SocketAddr>,
        Option<std::net::SocketAddr>,
        bool,
    ),
    cert_user: Option<String>,
    broker: Arc<Broker>,
    id: u64,
) where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (wtx, wrx) = mpsc::channel::<Vec<Bytes>>(WRITER_QUEUE);
    let writer = tokio::spawn(run_writer(wr, wrx));
    let (mtx, mut mrx) = mpsc::unbounded_channel();
    let mut conn = Conn {
        broker,
        id,
        vhost: "/".into(),
        out: Output::with_capacity(64 * 1024),
        frame_max: FRAME_MAX,
        channel_max: crate::config::DEFAULT_CHANNEL_MAX,
        channels: Channels::default(),
        mailbox: mtx,
        throttle: Throttle::Running,
        alarm: crate::alarms::Alarm::default(),
        saw_publish: false,
        blocked_capable: false,
        cancel_notify: false,
        counted: None,
        user: String::new(),
        peer,
        cert_user,
        client_properties: Default::default(),
        auth_mechanism: String::new(),
    };
    let mut reader = FrameReader::new();
    let heartbeat = match tokio::time::timeout(
        HANDSHAKE_TIMEOUT,
        conn.handshake(&mut rd, &mut reader, &wtx),
    )
    .await
    {
        Ok(Ok(Some(hb))) => hb,
        Ok(Ok(None)) | Err(_) => {
            conn.flush(&wtx).await;
            drop(wtx);
            let _ = writer.await;
            return;
        }
        Ok(Err(e)) => {
            tracing::debug!(?peer, error = %e, "handshake failed");
            conn.flush(&wtx).await;
            drop(wtx);
            let _ = writer.await;
            return;
        }
    };
    tracing::debug!(?peer, id, "connection open");
    let (_tracked, mut close_asked) =
        conn.broker
            .tracking()
            .open_connection(crate::tracking::ConnectionInfo {
                id,
                peer,
                local,
                tls,
                user: conn.user.clone(),
                vhost: conn.vhost.clone(),
                auth_mechanism: std::mem::take(&mut conn.auth_mechanism),
                client_properties: std::mem::take(&mut conn.client_properties),
                connected_at_ms: crate::now_ms(),
                frame_max: conn.frame_max,
                channel_max: conn.channel_max,
                heartbeat_s: heartbeat,
            });
    conn.channels.open(Arc::new(Session::new(
        conn.broker.clone(),
        id,
        conn.vhost.clone(),
        conn.user.clone(),
        conn.frame_max,
        conn.mailbox.clone(),
        conn.cancel_notify,
    )));
    let mut alarms = conn.broker.alarms().subscribe();
    let alarm = *alarms.borrow_and_update();
    let mut revoked = conn.broker.subscribe_revocations();
    // A deletion applied between connection.open's checks and this subscription is seen
    // too: the first turn of the loop checks once.
    revoked.mark_changed();
    conn.on_alarm(alarm);
    let hb = if heartbeat == 0 {
        None
    } else {
        Some(Duration::from_secs(u64::from(heartbeat)))
    };
    let mut last_read = Instant::now();
    let mut last_write = Instant::now();
    let mut ticker = tokio::time::interval(hb.map(|d| d / 2).unwrap_or(Duration::from_secs(3600)));
    let mut closing_since: Option<Instant> = None;
    // Frames the client pipelined behind connection.open (e.g. channel.open in
    // the same write) are already buffered: they are served first.
    let mut step = conn.serve_frames(&mut reader, &mut closing_since);
    loop {
        if let Some(since) = closing_since {
            if since.elapsed() > Duration::from_secs(5) {
                conn.flush(&wtx).await;
                break;
            }
        }
        if !conn.out.is_empty() {
            last_write = Instant::now();
            if !conn.flush(&wtx).await {
                break;
            }
        }
        match step {
            Step::Continue => {}
            Step::Close => break,
            Step::Linger => {
                conn.cleanup().await;
                conn.send(
                    0,
                    AMQPClass::Connection(connection::AMQPMethod::CloseOk(connection::CloseOk {})),
                );
                conn.flush(&wtx).await;
                drain(&mut rd).await;
                break;
            }
            Step::Drain => {
                drain(&mut rd).await;
                break;
            }
        }
        step = tokio::select! {
            biased;
            Some((channel, escalation)) = conn.channels.runs.next() => {
                conn.on_run_done(channel, escalation, &mut closing_since, &mut mrx);
                Step::Continue
            }
            r = rd.read_buf(reader.buffer()), if conn.reading() => match r {
                Ok(0) | Err(_) => Step::Close,
                Ok(_) => {
                    last_read = Instant::now();
                    conn.serve_frames(&mut reader, &mut closing_since)
                }
            },
            Some(c) = conn.channels.confirms.next() => {
                conn.channels.on_completions(c, &mut conn.out);
                Step::Continue
            }
            Ok(()) = alarms.changed() => {
                let alarm = *alarms.borrow_and_update();
                if conn.on_alarm(alarm) {
                    // Not read while blocked: heartbeats count from now.
                    last_read = Instant::now();
                }
                Step::Continue
            }
            Ok(reason) = &mut close_asked, if closing_since.is_none() => {
                // DELETE /api/connections/{name} (RabbitMQ `rabbit_networking:close_connection`).
                tracing::info!(conn = conn.id, %reason, "closing connection via the management API");
                conn.close_connection(320, format!("CONNECTION_FORCED - {reason}"), 0, 0);
                closing_since = Some(Instant::now());
                Step::Continue
            }
            Ok(()) = revoked.changed(), if closing_since.is_none() => {
                if let Some(text) = conn.forced_close() {
                    tracing::info!(conn = conn.id, %text, "closing connection");
                    conn.close_connection(320, text, 0, 0);
                    closing_since = Some(Instant::now());
                }
                Step::Continue
            }
            Some(d) = mrx.recv() => {
                conn.channels.on_event(d, &mut conn.out);
                // A turn writes at most TURN_OUTPUT_BYTES of deliveries: the writer's queue
                // (WRITER_QUEUE buffers) then holds the connection back instead of one
                // buffer taking every delivery in the mailbox.
                while conn.out.len() < TURN_OUTPUT_BYTES {
                    let Ok(d) = mrx.try_recv() else { break };
                    conn.channels.on_event(d, &mut conn.out);
                }
                Step::Continue
            }
            _ = ticker.tick() => {
                if let Some(hb) = hb {
                    // A blocked connection's socket is not read (RabbitMQ pauses its
                    // heartbeat monitor too); nor is it while busy channels catch up.
                    if !conn.reading() {
                        last_read = Instant::now();
                    }
                    if last_read.elapsed() > hb * 2 {
                        tracing::info!(?peer, "missed heartbeats from client, closing TCP connection");
                        Step::Close
                    } else {
                        if last_write.elapsed() >= hb / 2 { codec::write_heartbeat(&mut conn.out); }
                        Step::Continue
                    }
                } else { Step::Continue }
            }
        };
    }
    conn.cleanup().await;
    drop(wtx);
    let _ = writer.await;
    tracing::debug!(?peer, id, "connection closed");
}

/// Writes the connection's output to the socket, in order: the pieces of every output
/// already queued behind the first go out in the same vectored writes.
async fn run_writer<W: AsyncWrite + Unpin>(mut wr: W, mut rx: mpsc::Receiver<Vec<Bytes>>) {
    let mut pieces = std::collections::VecDeque::new();
    while let Some(first) = rx.recv().await {
        pieces.extend(first);
        while let Ok(more) = rx.try_recv() {
            pieces.extend(more);
        }
        if output::write_all(&mut wr, &mut pieces).await.is_err() {
            break;
        }
    }
    let _ = wr.shutdown().await;
}

impl Conn {
    /// Follows a change of the node's alarms (rabbit_reader `control_throttle`): raised →
    /// `Blocking`; cleared → `Running`, sending `connection.unblocked` to a blocked client
    /// that has the capability. Returns true when a blocked connection was released.
    fn on_alarm(&mut self, alarm: crate::alarms::Alarm) -> bool {
        self.alarm = alarm;
        match (self.throttle, alarm.any()) {
            (Throttle::Running, true) => {
                self.throttle = Throttle::Blocking;
                self.saw_publish = false;
                false
            }
            (Throttle::Blocking, false) => {
                self.throttle = Throttle::Running;
                false
            }
            (Throttle::Blocked, false) => {
                self.throttle = Throttle::Running;
                if self.blocked_capable {
                    self.send(
                        0,
                        AMQPClass::Connection(connection::AMQPMethod::Unblocked(
                            connection::Unblocked {},
                        )),
                    );
                }
                true
            }
            _ => false,
        }
    }

    /// A `Blocking` connection that published is `Blocked` (rabbit_reader `maybe_block`): it
    /// gets `connection.blocked` with the alarm's reason if it has the capability, and its
    /// socket is not read until the alarm clears.
    fn maybe_block(&mut self) {
        if self.throttle == Throttle::Blocking && self.saw_publish {
            self.throttle = Throttle::Blocked;
            tracing::info!(conn = self.id, reason = %self.alarm.reason(), "publisher blocked by a resource alarm");
            if self.blocked_capable {
                self.send(
                    0,
                    AMQPClass::Connection(connection::AMQPMethod::Blocked(connection::Blocked {
                        reason: self.alarm.reason().into(),
                    })),
                );
            }
        }
    }

    /// Hands pending output to the writer; false if the socket is gone.
    pub(super) async fn flush(&mut self, wtx: &mpsc::Sender<Vec<Bytes>>) -> bool {
        if self.out.is_empty() {
            return true;
        }
        let buf = self.out.take();
        wtx.send(buf).await.is_ok()
    }

    pub(super) fn send(&mut self, channel: u16, method: AMQPClass) {
        codec::write_method(&mut self.out, channel, method);
    }

    /// Runs the handshake; Some(heartbeat seconds) when the connection is open.
    async fn handshake<R: AsyncRead + Unpin>(
        &mut self,
        rd: &mut R,
        reader: &mut FrameReader,
        wtx: &mpsc::Sender<Vec<Bytes>>,
    ) -> Result<Option<u16>, std::io::Error> {
        // Protocol header.
        loop {
            match reader.take_protocol_header() {
                Some(Ok(())) => break,
                Some(Err(())) => {
                    self.out
                        .frames()
                        .extend_from_slice(codec::protocol_header());
                    return Ok(None);
                }
                None => {
                    if rd.read_buf(reader.buffer()).await? == 0 {
                        return Ok(None);
                    }
                }
            }
        }
        self.send(
            0,
            AMQPClass::Connection(connection::AMQPMethod::Start(connection::Start {
                version_major: 0,
                version_minor: 9,
                server_properties: server_properties(),
                mechanisms: LongString::from(if self.cert_user.is_some() {
                    "PLAIN AMQPLAIN EXTERNAL"
                } else {
                    "PLAIN AMQPLAIN"
                }),
                locales: LongString::from("en_US"),
            })),
        );
        self.flush(wtx).await;
        let start_ok = match next_method(rd, reader).await? {
            Some(AMQPClass::Connection(connection::AMQPMethod::StartOk(s))) => s,
            _ => return Ok(None),
        };
        self.blocked_capable = has_capability(&start_ok.client_properties, "connection.blocked");
        self.cancel_notify = has_capability(&start_ok.client_properties, "consumer_cancel_notify");
        let mechanism = start_ok.mechanism.as_str().to_string();
        self.auth_mechanism = mechanism.clone();
        self.client_properties = start_ok.client_properties.clone();
        // rabbit_reader auth_phase: the password, then loopback-only users (guest by
        // default) from another address; both refusals look the same to the client.
        let login = match self.login_credentials(&mechanism, start_ok.response.as_bytes()) {
            None => Err((String::new(), "malformed response or unknown mechanism")),
            Some((user, None)) if !self.broker.user_exists(&user) => {
                Err((user, "EXTERNAL: the certificate's user does not exist"))
            }
            Some((user, Some(pass))) if !self.broker.password_ok(&user, &pass) => {
                Err((user, "unknown user or wrong password"))
            }
            Some((user, _))
                if self.broker.config().loopback_users.contains(&user)
                    && !self.peer.is_some_and(|p| p.ip().is_loopback()) =>
            {
                Err((user, "user can only connect via localhost"))
            }
            Some((user, _)) => Ok(user),
        };
        let user = match login {
            Ok(user) => user,
            Err((user, why)) => {
                tracing::warn!(conn = self.id, peer = ?self.peer, %user, %mechanism, why, "login refused");
                // Slows down password guessing: each refused login costs the client 1 s.
                tokio::time::sleep(LOGIN_REFUSED_DELAY).await;
                // Without the authentication_failure_close capability RabbitMQ
                // just drops the socket.
                if !has_capability(&start_ok.client_properties, "authentication_failure_close") {
                    return Ok(None);
                }
                self.close_connection(403, format!("ACCESS_REFUSED - Login was refused using authentication mechanism {mechanism}. For details see the broker logfile."), 0, 0);
                return Ok(None);
            }
        };
        let offered_channel_max = self.broker.config().offered_channel_max();
        self.send(
            0,
            AMQPClass::Connection(connection::AMQPMethod::Tune(connection::Tune {
                channel_max: offered_channel_max,
                frame_max: FRAME_MAX,
                heartbeat: HEARTBEAT,
            })),
        );
        self.flush(wtx).await;
        let tune_ok = match next_method(rd, reader).await? {
            Some(AMQPClass::Connection(connection::AMQPMethod::TuneOk(t))) => t,
            _ => return Ok(None),
        };
        self.frame_max = match tune_ok.frame_max {
            0 => FRAME_MAX,
            f => f.clamp(4096, FRAME_MAX),
        };
        self.channel_max = match tune_ok.channel_max {
            0 => offered_channel_max,
            c => c.min(offered_channel_max),
        };
        reader.set_frame_max(self.frame_max);
        let open = match next_method(rd, reader).await? {
            Some(AMQPClass::Connection(connection::AMQPMethod::Open(o))) => o,
            _ => return Ok(None),
        };
        let vhost = open.virtual_host.as_str().to_string();
        // RabbitMQ rabbit_reader: the node's connection limit, then the vhost, then its limit.
        let counted = match self.broker.connections().open(
            &vhost,
            &user,
            self.broker.config().connection_max,
            self.broker.vhost_limits(&vhost).connection_limit(),
        ) {
            Ok(counted) => counted,
            Err(refused) => return Ok(self.refuse_open(refused.to_string())),
        };
        if !self
            .broker
            .with_topology(|t| t.has_vhost(&vhost))
            .unwrap_or(false)
        {
            return Ok(self.refuse_open(format!("NOT_ALLOWED - vhost {vhost} not found")));
        }
        if let Some(Err(e)) = self
            .broker
            .with_topology(|t| t.access().check_vhost_access(&user, &vhost))
        {
            return Ok(self.refuse_open(e.text));
        }
        self.counted = Some(counted);
        self.user = user;
        self.vhost = vhost;
        self.send(
            0,
            AMQPClass::Connection(connection::AMQPMethod::OpenOk(connection::OpenOk {})),
        );
        Ok(Some(tune_ok.heartbeat))
    }

    /// Answers connection.open with a 530 connection.close (`text` is the whole reply text);
    /// returns the handshake's "not open" result.
    fn refuse_open(&mut self, text: String) -> Option<u16> {
        tracing::info!(conn = self.id, %text, "connection refused");
        self.close_connection(530, text, 10, 40);
        None
    }

    /// True while the socket is read: not blocked by an alarm, and busy
    /// channels do not hold too many frames ([`Channels::holding_too_much`]).
    fn reading(&self) -> bool {
        self.throttle != Throttle::Blocked && !self.channels.holding_too_much()
    }

    /// A channel's run ended ([`Channels::on_run_done`]); a connection-level
    /// error it raised closes the connection.
    fn on_run_done(
        &mut self,
        channel: Box<Channel>,
        escalation: Option<Escalation>,
        closing_since: &mut Option<Instant>,
        mrx: &mut mpsc::UnboundedReceiver<ConnEvent>,
    ) {
        self.channels.on_run_done(channel, &mut self.out, mrx);
        if let Some(e) = escalation {
            if closing_since.is_none() {
                let (ProtocolError::Channel { code, text }
                | ProtocolError::Connection { code, text }) = e.error;
                tracing::info!(code, %text, "closing connection");
                self.close_connection(code, text, e.class_id, e.method_id);
                *closing_since = Some(Instant::now());
            }
        }
    }

    /// Why the broker must close this open connection: its vhost or its user was deleted
    /// (checked after each vhost or user deletion; RabbitMQ `rabbit_connection_tracking_handler`
    /// closes them with 320 CONNECTION_FORCED and these texts, observed on 3.10.8).
    fn forced_close(&self) -> Option<String> {
        self.broker
            .with_topology(|t| {
                if !t.has_vhost(&self.vhost) {
                    Some(format!(
                        "CONNECTION_FORCED - vhost '{}' is deleted",
                        self.vhost
                    ))
                } else if t.access().user(&self.user).is_none() {
                    Some(format!(
                        "CONNECTION_FORCED - user '{}' is deleted",
                        self.user
                    ))
                } else {
                    None
                }
            })
            .flatten()
    }

    /// Sends connection.close; the caller stops reading soon after.
    pub(super) fn close_connection(
        &mut self,
        code: u16,
        text: String,
        class_id: u16,
        method_id: u16,
    ) {
        let text = ShortString::from(truncate(text));
        self.send(
            0,
            AMQPClass::Connection(connection::AMQPMethod::Close(connection::Close {
                reply_code: code,
                reply_text: text,
                class_id,
                method_id,
            })),
        );
    }

    /// Serves every complete frame buffered in `reader`: connection methods
    /// at once, channel frames handed to their channels, whose runs start.
    fn serve_frames(
        &mut self,
        reader: &mut FrameReader,
        closing_since: &mut Option<Instant>,
    ) -> Step {
        let step = self.on_bytes(reader, closing_since);
        self.maybe_block();
        self.channels.launch_ready();
        step
    }

    fn on_bytes(&mut self, reader: &mut FrameReader, closing_since: &mut Option<Instant>) -> Step {
        loop {
            let frame = match reader.next_frame() {
                Ok(Some(f)) => f,
                Ok(None) => return Step::Continue,
                Err(e) => {
                    tracing::info!(error = %e, "malformed frame, closing connection");
                    let name = if e.reply_code() == 502 {
                        "SYNTAX_ERROR"
                    } else {
                        "FRAME_ERROR"
                    };
                    self.close_connection(e.reply_code(), format!("{name} - {e}"), 0, 0);
                    return Step::Drain;
                }
            };
            tracing::trace!(conn = self.id, ?frame, "frame in");
            if closing_since.is_some() {
                // After our connection.close only close-ok/close matter.
                if let InFrame::Method(0, AMQPClass::Connection(m)) = frame {
                    match m {
                        connection::AMQPMethod::CloseOk(_) => return Step::Close,
                        connection::AMQPMethod::Close(_) => {
                            self.send(
                                0,
                                AMQPClass::Connection(connection::AMQPMethod::CloseOk(
                                    connection::CloseOk {},
                                )),
                            );
                            return Step::Close;
                        }
                        _ => {}
                    }
                }
                continue;
            }
            let (class_id, method_id) = match &frame {
                InFrame::Method(_, m) => (m.get_amqp_class_id(), m.get_amqp_method_id()),
                _ => (0, 0),
            };
            if (class_id, method_id) == (60, 40) {
                self.saw_publish = true;
            }
            let result = match frame {
                InFrame::Heartbeat(0) => Ok(()),
                InFrame::Heartbeat(_) => Err(ProtocolError::connection(
                    501,
                    "FRAME_ERROR - heartbeat on non-zero channel",
                )),
                InFrame::Method(0, AMQPClass::Connection(m)) => match m {
                    connection::AMQPMethod::Close(_) => {
                        // close-ok is sent by the loop once the connection's
                        // resources (exclusive queues, consumers) are gone.
                        return Step::Linger;
                    }
                    connection::AMQPMethod::CloseOk(_) => return Step::Close,

                    connection::AMQPMethod::Blocked(_) | connection::AMQPMethod::Unblocked(_) => {
                        Ok(())
                    }
                    connection::AMQPMethod::UpdateSecret(_) => {
                        self.send(
                            0,
                            AMQPClass::Connection(connection::AMQPMethod::UpdateSecretOk(
                                connection::UpdateSecretOk {},
                            )),
                        );
                        Ok(())
                    }
                    _ => Err(ProtocolError::command_invalid(
                        "unexpected connection method",
                    )),
                },
                InFrame::Method(0, _) => Err(ProtocolError::connection(
                    504,
                    "CHANNEL_ERROR - unexpected method in connection state running",
                )),
                InFrame::Method(ch, _)
                | InFrame::Header { channel: ch, .. }
                | InFrame::Body(ch, _) => {
                    self.channels
                        .route(ch, frame, self.channel_max, &mut self.out)
                }
            };
            if let Err(e) = result {
                match e {
                    // Channel errors are answered inside the channel handlers;
                    // one reaching here has no channel to close, so it escalates.
                    ProtocolError::Channel { code, text }
                    | ProtocolError::Connection { code, text } => {
                        tracing::info!(code, %text, "closing connection");
                        self.close_connection(code, text, class_id, method_id);
                        *closing_since = Some(Instant::now());
                    }
                }
            }
        }
    }

    /// Releases everything the connection held: consumers, unacked
    /// messages (returned to their queues), exclusive queues.
    async fn cleanup(&mut self) {
        self.channels.close_all(&mut self.out).await;
        // Exclusive queues are found in the topology (owner = this
        // connection), not tracked a second time here.
        let owned: Vec<(String, String)> = self
            .broker
            .with_topology(|t| {
                t.queues_owned_by(self.id)
                    .into_iter()
                    .map(|q| (q.vhost.clone(), q.name.clone()))
                    .collect()
            })
            .unwrap_or_default();
        for (vhost, name) in owned {
            if let Err(e) = self.broker.delete_queue(&vhost, &name).await {
                tracing::warn!(queue = %name, error = ?e, "failed to delete exclusive queue");
            }
        }
    }
}

/// Cuts a reply text to the 255 bytes a short string holds, on a char
/// boundary.
pub(super) fn truncate(mut s: String) -> String {
    if s.len() > 255 {
        let mut end = 255;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

async fn next_method<R: AsyncRead + Unpin>(
    rd: &mut R,
    reader: &mut FrameReader,
) -> Result<Option<AMQPClass>, std::io::Error> {
    loop {
        match reader.next_frame() {
            Ok(Some(InFrame::Method(0, m))) => return Ok(Some(m)),
            Ok(Some(InFrame::Heartbeat(_))) => continue,
            Ok(Some(_)) | Err(_) => return Ok(None),
            Ok(None) => {
                if rd.read_buf(reader.buffer()).await? == 0 {
                    return Ok(None);
                }
            }
        }
    }
}

impl Conn {
    /// The (user, password) a connection.start-ok logs in with: [`credentials`], or for
    /// EXTERNAL (offered on AMQPS with a verified client certificate) the certificate's
    /// user and no password (RabbitMQ's rabbitmq_auth_mechanism_ssl with
    /// `ssl_cert_login_from = common_name`).
    fn login_credentials(
        &self,
        mechanism: &str,
        response: &[u8],
    ) -> Option<(String, Option<Vec<u8>>)> {
        if mechanism == "EXTERNAL" {
            return self.cert_user.clone().map(|u| (u, None));
        }
        credentials(mechanism, response).map(|(u, p)| (u, Some(p)))
    }
}

/// The (user, password) of a connection.start-ok response (PLAIN: "\0user\0pass";
/// AMQPLAIN: a field table without its length prefix, LOGIN and PASSWORD); None for
/// another mechanism or a malformed response.
fn credentials(mechanism: &str, response: &[u8]) -> Option<(String, Vec<u8>)> {
    let (user, pass) = match mechanism {
        "PLAIN" => {
            let mut parts = response.split(|b| *b == 0);
            let _authzid = parts.next();
            match (parts.next(), parts.next()) {
                (Some(u), Some(p)) => (u.to_vec(), p.to_vec()),
                _ => return None,
            }
        }
        "AMQPLAIN" => parse_amqplain(response)?,
        _ => return None,
    };
    Some((String::from_utf8(user).ok()?, pass))
}

fn parse_amqplain(response: &[u8]) -> Option<(Vec<u8>, Vec<u8>)> {
    let mut framed = Vec::with_capacity(response.len() + 4);
    framed.extend_from_slice(&(response.len() as u32).to_be_bytes());
    framed.extend_from_slice(response);
    // Parsed before authentication: a deeply nested table would overflow the stack.
    if !super::nesting::table_within_limit(&framed) {
        return None;
    }
    let (_, table) = amq_protocol::types::parsing::parse_field_table(&framed[..]).ok()?;
    let get = |k: &str| match table.inner().get(k) {
        Some(AMQPValue::LongString(s)) => Some(s.as_bytes().to_vec()),
        Some(AMQPValue::ShortString(s)) => Some(s.as_str().as_bytes().to_vec()),
        _ => None,
    };
    Some((get("LOGIN")?, get("PASSWORD")?))
}

/// True if the client's `capabilities` table sets `name` to true.
fn has_capability(client_properties: &FieldTable, name: &str) -> bool {
    match client_properties.inner().get("capabilities") {
        Some(AMQPValue::FieldTable(caps)) => {
            matches!(caps.inner().get(name), Some(AMQPValue::Boolean(true)))
        }
        _ => false,
    }
}

fn server_properties() -> FieldTable {
    let mut caps = FieldTable::default();
    for cap in [
        "publisher_confirms",
        "exchange_exchange_bindings",
        "basic.nack",
        "consumer_cancel_notify",
        "connection.blocked",
        "consumer_priorities",
        "authentication_failure_close",
        "per_consumer_qos",
        "direct_reply_to",
    ] {
        caps.insert(cap.into(), AMQPValue::Boolean(cap != "direct_reply_to"));
    }
    let mut props = FieldTable::default();
    props.insert("capabilities".into(), AMQPValue::FieldTable(caps));
    props.insert("product".into(), AMQPValue::LongString("quorumq".into()));
    props.insert(
        "version".into(),
        AMQPValue::LongString(env!("CARGO_PKG_VERSION").into()),
    );
    props.insert("platform".into(), AMQPValue::LongString("Rust".into()));
    props.insert(
        "cluster_name".into(),
        AMQPValue::LongString("quorumq".into()),
    );
    props.insert(
        "copyright".into(),
        AMQPValue::LongString("quorumq authors".into()),
    );
    props.insert(
        "information".into(),
        AMQPValue::LongString("Licensed under Apache-2.0".into()),
    );
    props
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_credentials() {
        assert_eq!(
            credentials("PLAIN", b"\0guest\0guest"),
            Some(("guest".into(), b"guest".to_vec()))
        );
        assert_eq!(
            credentials("PLAIN", b"\0bob\0nope"),
            Some(("bob".into(), b"nope".to_vec()))
        );
        assert_eq!(credentials("PLAIN", b"garbage"), None);
        assert_eq!(credentials("EXTERNAL", b""), None);
    }

    #[test]
    fn amqplain_credentials() -> Result<(), String> {
        let mut t = FieldTable::default();
        t.insert("LOGIN".into(), AMQPValue::LongString("guest".into()));
        t.insert("PASSWORD".into(), AMQPValue::LongString("guest".into()));
        let bytes = cookie_factory::gen_simple(
            amq_protocol::types::generation::gen_field_table(&t),
            Vec::new(),
        )
        .map_err(|e| format!("{e:?}"))?;
        assert_eq!(
            credentials("AMQPLAIN", &bytes[4..]),
            Some(("guest".into(), b"guest".to_vec()))
        );
        assert_eq!(credentials("AMQPLAIN", &[1, 2, 3]), None);
        Ok(())
    }

    #[test]
    fn an_amqplain_table_nested_too_deep_is_refused_without_a_stack_overflow() {
        // LOGIN, PASSWORD, then 25,000 arrays in each other (five bytes a level).
        let mut response = b"\x05LOGINS\0\0\0\x05guest\x08PASSWORDS\0\0\0\x05guest\x01z".to_vec();
        response.extend_from_slice(&crate::amqp::nesting::nested_arrays(25_000));
        let refused = std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn(move || credentials("AMQPLAIN", &response))
            .expect("spawn")
            .join()
            .expect("no panic");
        assert_eq!(refused, None);
    }
}
