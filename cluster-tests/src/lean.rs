//! A lean AMQP 0-9-1 client for the `quorumq-perf` benchmark: one TCP
//! connection, one channel (1), driven by the task that owns it, frames
//! encoded and parsed with `amq-protocol`.
//!
//! lapin runs an I/O thread per connection and hands every frame between
//! threads; on this 2-core box that costs ~40 µs of client CPU per
//! dead-lettered message (perf: context switches and futex wake-ups on top),
//! more than the broker spends. This client batches frames into one socket
//! write per read or per publish window and wakes no other thread, so a
//! benchmark measures the broker rather than the client library. It speaks
//! only what the benchmark needs: PLAIN login, no heartbeats, basic.publish
//! with confirms, basic.consume with ack/reject.

use amq_protocol::frame::{gen_frame, parse_frame, AMQPContentHeader, AMQPFrame};
use amq_protocol::protocol::{basic, channel, confirm, connection, queue, AMQPClass};
use amq_protocol::types::FieldTable;
use amq_protocol::uri::AMQPUri;
use anyhow::{anyhow, bail, Context};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

use crate::raw::{FRAME_END, PROTOCOL_HEADER};

/// The channel every lean connection uses.
pub const CHANNEL: u16 = 1;
/// frame_max this client asks for (bytes, whole frame).
const FRAME_MAX: u32 = 131_072;

/// Appends one encoded frame to `out`.
///
/// Errors: amq-protocol's generator refusing the frame (a short string over
/// 255 bytes).
pub fn encode(out: &mut Vec<u8>, frame: &AMQPFrame) -> anyhow::Result<()> {
    let buf = std::mem::take(out);
    *out = cookie_factory::gen_simple(gen_frame(frame), buf)
        .map_err(|e| anyhow!("encoding {frame:?}: {e}"))?;
    Ok(())
}

/// Appends a method frame on [`CHANNEL`].
pub fn encode_method(out: &mut Vec<u8>, method: AMQPClass) -> anyhow::Result<()> {
    encode(out, &AMQPFrame::Method(CHANNEL, method))
}

/// Appends a connection-class method frame (channel 0).
fn encode_connection(out: &mut Vec<u8>, method: connection::AMQPMethod) -> anyhow::Result<()> {
    encode(out, &AMQPFrame::Method(0, AMQPClass::Connection(method)))
}

/// The read side of a lean connection: whole frames out of a byte buffer.
pub struct FrameReader {
    rd: OwnedReadHalf,
    buf: Vec<u8>,
    /// Start of the unparsed bytes in `buf`.
    pos: usize,
}

impl FrameReader {
    /// The next complete frame already buffered, if any (no I/O).
    ///
    /// Errors: a malformed frame (bad frame-end octet, unparsable payload).
    pub fn buffered(&mut self) -> anyhow::Result<Option<AMQPFrame>> {
        let avail = &self.buf[self.pos..];
        if avail.len() < 7 {
            return Ok(None);
        }
        let size = u32::from_be_bytes([avail[3], avail[4], avail[5], avail[6]]) as usize;
        let total = size + 8;
        if avail.len() < total {
            return Ok(None);
        }
        if avail[total - 1] != FRAME_END {
            bail!("frame without the 0xCE frame-end octet");
        }
        let (_, frame) = parse_frame(&avail[..total])
            .map_err(|e| anyhow!("unparsable frame from the broker: {e:?}"))?;
        self.pos += total;
        Ok(Some(frame))
    }

    /// Reads more bytes from the socket (waits for at least one). Cancel-safe:
    /// bytes are appended only when a read completes.
    ///
    /// Errors: the socket failed or the broker closed it.
    pub async fn fill(&mut self) -> anyhow::Result<()> {
        self.compact();
        let n = self
            .rd
            .read_buf(&mut self.buf)
            .await
            .context("reading from the broker")?;
        if n == 0 {
            bail!("the broker closed the connection");
        }
        Ok(())
    }

    /// Reads whatever the socket has without waiting; `false` if nothing.
    ///
    /// Errors: the socket failed or the broker closed it.
    pub fn try_fill(&mut self) -> anyhow::Result<bool> {
        self.compact();
        match self.rd.try_read_buf(&mut self.buf) {
            Ok(0) => bail!("the broker closed the connection"),
            Ok(_) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(false),
            Err(e) => Err(e).context("reading from the broker"),
        }
    }

    /// Drops parsed bytes once they are half the buffer and keeps room to read into.
    fn compact(&mut self) {
        if self.pos > 0 && self.pos * 2 >= self.buf.len() {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        self.buf.reserve(64 * 1024);
    }

    /// The next frame, reading as needed.
    pub async fn next(&mut self) -> anyhow::Result<AMQPFrame> {
        loop {
            if let Some(f) = self.buffered()? {
                return Ok(f);
            }
            self.fill().await?;
        }
    }

    /// Reads frames until a method `want` accepts; a connection.close or
    /// channel.close from the broker is an error carrying its reply.
    pub async fn expect<T>(
        &mut self,
        what: &str,
        mut want: impl FnMut(&AMQPClass) -> Option<T>,
    ) -> anyhow::Result<T> {
        loop {
            if let AMQPFrame::Method(_, m) = self.next().await? {
                if let Some(t) = want(&m) {
                    return Ok(t);
                }
                closed(&m).with_context(|| format!("waiting for {what}"))?;
            }
        }
    }
}

/// Fails with the broker's reply when `m` is a connection.close or channel.close.
pub fn closed(m: &AMQPClass) -> anyhow::Result<()> {
    match m {
        AMQPClass::Connection(connection::AMQPMethod::Close(c)) => {
            bail!("connection.close {} {}", c.reply_code, c.reply_text)
        }
        AMQPClass::Channel(channel::AMQPMethod::Close(c)) => {
            bail!("channel.close {} {}", c.reply_code, c.reply_text)
        }
        _ => Ok(()),
    }
}

/// One open connection with channel 1 open.
pub struct LeanConn {
    pub reader: FrameReader,
    pub wr: OwnedWriteHalf,
    /// Negotiated frame_max (bytes, whole frame).
    pub frame_max: u32,
}

impl LeanConn {
    /// Connects to `uri` (amqp://user:pass@host:port/vhost), logs in with
    /// PLAIN, disables heartbeats and opens channel 1.
    ///
    /// Errors: bad URI, refused connection, refused login or vhost.
    pub async fn connect(uri: &str) -> anyhow::Result<LeanConn> {
        let uri: AMQPUri = uri.parse().map_err(|e| anyhow!("bad URI {uri}: {e}"))?;
        let a = &uri.authority;
        let stream = TcpStream::connect((a.host.as_str(), a.port))
            .await
            .with_context(|| format!("connecting to {}:{}", a.host, a.port))?;
        stream.set_nodelay(true)?;
        let (rd, mut wr) = stream.into_split();
        let mut reader = FrameReader {
            rd,
            buf: Vec::with_capacity(128 * 1024),
            pos: 0,
        };
        wr.write_all(PROTOCOL_HEADER).await?;
        reader
            .expect("connection.start", |m| {
                matches!(m, AMQPClass::Connection(connection::AMQPMethod::Start(_))).then_some(())
            })
            .await?;
        let login = format!("\0{}\0{}", a.userinfo.username, a.userinfo.password);
        let mut out = Vec::new();
        let start_ok = connection::StartOk {
            client_properties: FieldTable::default(),
            mechanism: "PLAIN".into(),
            response: login.as_str().into(),
            locale: "en_US".into(),
        };
        encode_connection(&mut out, connection::AMQPMethod::StartOk(start_ok))?;
        wr.write_all(&out).await?;
        let tune = reader
            .expect("connection.tune", |m| match m {
                AMQPClass::Connection(connection::AMQPMethod::Tune(t)) => Some(t.clone()),
                _ => None,
            })
            .await?;
        let frame_max = match tune.frame_max {
            0 => FRAME_MAX,
            m => m.min(FRAME_MAX),
        };
        out.clear();
        let tune_ok = connection::TuneOk {
            channel_max: 1,
            frame_max,
            heartbeat: 0,
        };
        encode_connection(&mut out, connection::AMQPMethod::TuneOk(tune_ok))?;
        let open = connection::Open {
            virtual_host: uri.vhost.as_str().into(),
        };
        encode_connection(&mut out, connection::AMQPMethod::Open(open))?;
        encode_method(
            &mut out,
            AMQPClass::Channel(channel::AMQPMethod::Open(channel::Open {})),
        )?;
        wr.write_all(&out).await?;
        reader
            .expect("channel.open-ok", |m| {
                matches!(m, AMQPClass::Channel(channel::AMQPMethod::OpenOk(_))).then_some(())
            })
            .await?;
        Ok(LeanConn {
            reader,
            wr,
            frame_max,
        })
    }

    /// Writes already-encoded frames.
    ///
    /// Errors: the socket failed.
    pub async fn write(&mut self, frames: &[u8]) -> anyhow::Result<()> {
        self.wr
            .write_all(frames)
            .await
            .context("writing to the broker")
    }

    /// Sends one method on channel 1.
    pub async fn send(&mut self, method: AMQPClass) -> anyhow::Result<()> {
        let mut out = Vec::new();
        encode_method(&mut out, method)?;
        self.wr.write_all(&out).await?;
        Ok(())
    }

    /// Sends `method` and waits for the reply `ok` accepts (`what` names it
    /// in errors).
    ///
    /// Errors: the broker closed the channel or connection instead.
    async fn call<T>(
        &mut self,
        method: AMQPClass,
        what: &str,
        ok: impl FnMut(&AMQPClass) -> Option<T>,
    ) -> anyhow::Result<T> {
        self.send(method).await?;
        self.reader.expect(what, ok).await
    }

    /// queue.declare of `queue`, waiting for declare-ok: its ready message count.
    async fn declare(
        &mut self,
        queue: &str,
        passive: bool,
        arguments: FieldTable,
    ) -> anyhow::Result<u32> {
        let declare = queue::Declare {
            queue: queue.into(),
            passive,
            durable: !passive,
            exclusive: false,
            auto_delete: false,
            nowait: false,
            arguments,
        };
        self.call(
            AMQPClass::Queue(queue::AMQPMethod::Declare(declare)),
            "queue.declare-ok",
            |m| match m {
                AMQPClass::Queue(queue::AMQPMethod::DeclareOk(ok)) => Some(ok.message_count),
                _ => None,
            },
        )
        .await
    }

    /// confirm.select, waiting for select-ok.
    pub async fn confirm_select(&mut self) -> anyhow::Result<()> {
        self.call(
            AMQPClass::Confirm(confirm::AMQPMethod::Select(confirm::Select {
                nowait: false,
            })),
            "confirm.select-ok",
            |m| matches!(m, AMQPClass::Confirm(confirm::AMQPMethod::SelectOk(_))).then_some(()),
        )
        .await
    }

    /// basic.qos (per-consumer prefetch count), waiting for qos-ok.
    pub async fn qos(&mut self, prefetch: u16) -> anyhow::Result<()> {
        self.call(
            AMQPClass::Basic(basic::AMQPMethod::Qos(basic::Qos {
                prefetch_count: prefetch,
                global: false,
            })),
            "basic.qos-ok",
            |m| matches!(m, AMQPClass::Basic(basic::AMQPMethod::QosOk(_))).then_some(()),
        )
        .await
    }

    /// basic.consume on `queue` (manual acks), waiting for consume-ok.
    pub async fn consume(&mut self, queue: &str) -> anyhow::Result<()> {
        let consume = basic::Consume {
            queue: queue.into(),
            consumer_tag: "".into(),
            no_local: false,
            no_ack: false,
            exclusive: false,
            nowait: false,
            arguments: FieldTable::default(),
        };
        self.call(
            AMQPClass::Basic(basic::AMQPMethod::Consume(consume)),
            "basic.consume-ok",
            |m| matches!(m, AMQPClass::Basic(basic::AMQPMethod::ConsumeOk(_))).then_some(()),
        )
        .await
    }

    /// Passive queue.declare: the queue's ready message count.
    pub async fn message_count(&mut self, queue: &str) -> anyhow::Result<u32> {
        self.declare(queue, true, FieldTable::default()).await
    }

    /// queue.declare of durable quorum queue `name`: waits for its declare-ok.
    ///
    /// Errors: the broker closed the channel or connection instead.
    pub async fn declare_quorum(&mut self, name: &str) -> anyhow::Result<()> {
        let mut arguments = FieldTable::default();
        arguments.insert(
            "x-queue-type".into(),
            amq_protocol::types::AMQPValue::LongString("quorum".into()),
        );
        self.declare(name, false, arguments).await.map(|_| ())
    }

    /// queue.delete of `name`: waits for its delete-ok.
    ///
    /// Errors: the broker closed the channel or connection instead.
    pub async fn delete_queue(&mut self, name: &str) -> anyhow::Result<()> {
        self.call(
            AMQPClass::Queue(queue::AMQPMethod::Delete(queue::Delete {
                queue: name.into(),
                if_unused: false,
                if_empty: false,
                nowait: false,
            })),
            "queue.delete-ok",
            |m| matches!(m, AMQPClass::Queue(queue::AMQPMethod::DeleteOk(_))).then_some(()),
        )
        .await
    }

    /// connection.close, waiting (briefly) for close-ok.
    pub async fn close(mut self) {
        let mut out = Vec::new();
        let close = connection::Close {
            reply_code: 200,
            reply_text: "OK".into(),
            class_id: 0,
            method_id: 0,
        };
        if encode_connection(&mut out, connection::AMQPMethod::Close(close)).is_ok()
            && self.wr.write_all(&out).await.is_ok()
        {
            let wait = self.reader.expect("connection.close-ok", |m| {
                matches!(m, AMQPClass::Connection(connection::AMQPMethod::CloseOk(_))).then_some(())
            });
            let _ = tokio::time::timeout(std::time::Duration::from_secs(5), wait).await;
        }
    }
}

/// Pre-encoded basic.publish + content header + body frames for one routing
/// key and one body size, so each publish is a copy plus a patch of the
/// body's first bytes.
pub struct PublishTemplate {
    frames: Vec<u8>,
    /// Offset of the body's first byte in `frames`.
    body_at: usize,
}

impl PublishTemplate {
    /// Encodes a persistent (delivery-mode 2) publish of `body` to the default
    /// exchange with `routing_key`, split into body frames of at most
    /// `frame_max - 8` bytes.
    ///
    /// Errors: a routing key over 255 bytes.
    pub fn new(routing_key: &str, body: &[u8], frame_max: u32) -> anyhow::Result<Self> {
        let mut frames = Vec::new();
        encode_method(
            &mut frames,
            AMQPClass::Basic(basic::AMQPMethod::Publish(basic::Publish {
                exchange: "".into(),
                routing_key: routing_key.into(),
                mandatory: false,
                immediate: false,
            })),
        )?;
        encode(
            &mut frames,
            &AMQPFrame::Header(
                CHANNEL,
                AMQPContentHeader {
                    class_id: 60,
                    body_size: body.len() as u64,
                    properties: basic::AMQPProperties::default().with_delivery_mode(2),
                },
            ),
        )?;
        let body_at = frames.len() + 7;
        let chunk = (frame_max as usize).saturating_sub(8).max(1);
        for part in body.chunks(chunk) {
            encode(&mut frames, &AMQPFrame::Body(CHANNEL, part.to_vec()))?;
        }
        Ok(PublishTemplate { frames, body_at })
    }

    /// Appends one publish to `out`, with `patch` written over the body from
    /// byte `offset` (it must lie in the first body frame).
    pub fn append(&self, out: &mut Vec<u8>, offset: usize, patch: &[u8]) {
        let at = out.len() + self.body_at + offset;
        out.extend_from_slice(&self.frames);
        out[at..at + patch.len()].copy_from_slice(patch);
    }
}

/// Publisher-confirm bookkeeping of one producer: per sequence number
/// (delivery tag - 1) pending, acked or nacked.
pub struct ConfirmBook {
    /// Per sequence number: [`ConfirmBook::PENDING`], `ACK` or `NACK`.
    pub state: Vec<u8>,
    /// Lowest sequence number that may still be pending.
    low: usize,
    /// How many sequence numbers are acked or nacked.
    pub settled: u64,
}

impl ConfirmBook {
    /// Not confirmed yet.
    pub const PENDING: u8 = 0;
    /// basic.ack received.
    pub const ACK: u8 = 1;
    /// basic.nack received.
    pub const NACK: u8 = 2;

    /// Book for `messages` publishes, all pending.
    pub fn new(messages: u64) -> Self {
        ConfirmBook {
            state: vec![Self::PENDING; messages as usize],
            low: 0,
            settled: 0,
        }
    }

    /// Applies a basic.ack / basic.nack for `tag` (`multiple`: every tag up to it).
    /// Tags already settled stay as they were.
    ///
    /// Errors: a tag of 0 or beyond the book.
    pub fn settle(&mut self, tag: u64, multiple: bool, outcome: u8) -> anyhow::Result<()> {
        let end = tag as usize;
        if end == 0 || end > self.state.len() {
            bail!("confirm for unknown delivery tag {tag}");
        }
        let from = if multiple { self.low } else { end - 1 };
        for s in &mut self.state[from.min(end)..end] {
            if *s == Self::PENDING {
                *s = outcome;
                self.settled += 1;
            }
        }
        while self.low < self.state.len() && self.state[self.low] != Self::PENDING {
            self.low += 1;
        }
        Ok(())
    }
}

/// One delivery being assembled from its deliver, header and body frames.
#[derive(Default)]
pub struct Assembler {
    tag: u64,
    expected: Option<u64>,
    body: Vec<u8>,
}

impl Assembler {
    /// Feeds a frame; returns (delivery tag, body) when a delivery is complete.
    /// Other methods are returned as `Err(method)` for the caller to handle.
    pub fn feed(&mut self, frame: AMQPFrame) -> Result<Option<(u64, Vec<u8>)>, AMQPClass> {
        match frame {
            AMQPFrame::Method(_, AMQPClass::Basic(basic::AMQPMethod::Deliver(d))) => {
                self.tag = d.delivery_tag;
                self.expected = None;
                self.body.clear();
                Ok(None)
            }
            AMQPFrame::Method(_, m) => Err(m),
            AMQPFrame::Header(_, h) => {
                self.expected = Some(h.body_size);
                Ok(self.complete())
            }
            AMQPFrame::Body(_, part) => {
                if self.body.is_empty() {
                    self.body = part;
                } else {
                    self.body.extend_from_slice(&part);
                }
                Ok(self.complete())
            }
            _ => Ok(None),
        }
    }

    fn complete(&mut self) -> Option<(u64, Vec<u8>)> {
        match self.expected {
            Some(n) if self.body.len() as u64 >= n => {
                self.expected = None;
                Some((self.tag, std::mem::take(&mut self.body)))
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn confirm_book_single_multiple_and_nack() {
        let mut b = ConfirmBook::new(6);
        b.settle(2, false, ConfirmBook::ACK).unwrap();
        assert_eq!((b.settled, b.low), (1, 0));
        b.settle(3, true, ConfirmBook::ACK).unwrap();
        assert_eq!((b.settled, b.low), (3, 3));
        b.settle(5, false, ConfirmBook::NACK).unwrap();
        b.settle(6, true, ConfirmBook::ACK).unwrap();
        assert_eq!(b.settled, 6);
        assert_eq!(b.state, vec![1, 1, 1, 1, 2, 1]);
        // A repeated confirm changes nothing.
        b.settle(6, true, ConfirmBook::NACK).unwrap();
        assert_eq!((b.settled, b.state[4], b.state[5]), (6, 2, 1));
        assert!(b.settle(0, false, ConfirmBook::ACK).is_err());
        assert!(b.settle(7, false, ConfirmBook::ACK).is_err());
    }

    fn parse_all(bytes: &[u8]) -> Vec<AMQPFrame> {
        let mut rest = bytes;
        let mut frames = Vec::new();
        while !rest.is_empty() {
            let (r, f) = parse_frame(rest).expect("frame parses");
            frames.push(f);
            rest = r;
        }
        frames
    }

    #[test]
    fn publish_template_patches_the_body_and_splits_frames() {
        let body: Vec<u8> = (0..300u32).map(|i| i as u8).collect();
        let t = PublishTemplate::new("q", &body, 136).unwrap();
        let mut out = Vec::new();
        t.append(&mut out, 4, &[0xAA, 0xBB]);
        let frames = parse_all(&out);
        // method, header, then 300 bytes in frames of 128.
        assert_eq!(frames.len(), 2 + 3);
        match &frames[1] {
            AMQPFrame::Header(CHANNEL, h) => {
                assert_eq!(h.body_size, 300);
                assert_eq!(h.properties.delivery_mode(), &Some(2));
            }
            f => panic!("expected a content header, got {f:?}"),
        }
        let mut got = Vec::new();
        for f in &frames[2..] {
            match f {
                AMQPFrame::Body(CHANNEL, part) => {
                    assert!(part.len() <= 128);
                    got.extend_from_slice(part);
                }
                f => panic!("expected a body frame, got {f:?}"),
            }
        }
        let mut want = body.clone();
        want[4..6].copy_from_slice(&[0xAA, 0xBB]);
        assert_eq!(got, want);
    }

    #[test]
    fn assembler_joins_body_frames_and_passes_other_methods() {
        let body: Vec<u8> = (0..300u32).map(|i| (i * 7) as u8).collect();
        let t = PublishTemplate::new("q", &body, 136).unwrap();
        let mut out = Vec::new();
        t.append(&mut out, 0, &[]);
        let mut frames = parse_all(&out);
        // Replace the publish by a deliver with tag 9.
        frames[0] = AMQPFrame::Method(
            CHANNEL,
            AMQPClass::Basic(basic::AMQPMethod::Deliver(basic::Deliver {
                consumer_tag: "c".into(),
                delivery_tag: 9,
                redelivered: false,
                exchange: "".into(),
                routing_key: "q".into(),
            })),
        );
        let mut a = Assembler::default();
        let n = frames.len();
        for (i, f) in frames.into_iter().enumerate() {
            let r = a.feed(f).unwrap();
            if i + 1 < n {
                assert!(r.is_none());
            } else {
                assert_eq!(r, Some((9, body.clone())));
            }
        }
        let other = AMQPFrame::Method(
            CHANNEL,
            AMQPClass::Basic(basic::AMQPMethod::Ack(basic::Ack {
                delivery_tag: 1,
                multiple: false,
            })),
        );
        assert!(a.feed(other).is_err());
    }
}
