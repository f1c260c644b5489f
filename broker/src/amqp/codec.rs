//! AMQP 0-9-1 frame reading and writing on top of `amq-protocol`.
//!
//! `amq-protocol` parses a frame's payload but reads a hostile size field
//! before any check, so the 7-byte frame header, the `frame_max` limit and
//! the 0xCE frame-end octet are checked here first (research §4.2). Content
//! header properties are kept as the raw bytes the client sent, so they are
//! delivered byte-exact.

use amq_protocol::frame::AMQPFrame;
use amq_protocol::protocol::{basic::AMQPProperties, AMQPClass};
use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::nesting;
use super::output::Output;

/// Frame type octets (AMQP 0-9-1 §4.2.3).
const FRAME_METHOD: u8 = 1;
const FRAME_HEADER: u8 = 2;
const FRAME_BODY: u8 = 3;
const FRAME_HEARTBEAT: u8 = 8;
const FRAME_END: u8 = 0xCE;

/// The protocol header a 0-9-1 client sends first, and that the server sends
/// back before closing when it sees any other header (AMQP 0-9-1 §4.2.2).
pub const PROTOCOL_HEADER: &[u8; 8] = b"AMQP\x00\x00\x09\x01";

/// A frame read from a client.
// One per frame on the publish path: boxing the properties would cost an allocation each.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum InFrame {
    Method(u16, AMQPClass),
    /// Content header: class id, body size (bytes), parsed properties and the
    /// raw property bytes (flags + fields) as received.
    Header {
        channel: u16,
        class_id: u16,
        body_size: u64,
        properties: AMQPProperties,
        raw_properties: Bytes,
    },
    Body(u16, Bytes),
    Heartbeat(u16),
}

/// Why a byte stream is not valid AMQP; each maps to a connection.close code.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    /// Frame payload above the negotiated frame_max: 501 FRAME_ERROR.
    #[error("frame size {size} exceeds frame_max {max}")]
    TooLarge { size: u32, max: u32 },
    /// Missing 0xCE frame-end octet: 501 FRAME_ERROR.
    #[error("invalid frame end octet {0:#04x}")]
    BadFrameEnd(u8),
    /// Unknown frame type octet: 501 FRAME_ERROR.
    #[error("unknown frame type {0}")]
    UnknownType(u8),
    /// Payload that does not parse as a method or content header: 502 SYNTAX_ERROR.
    #[error("malformed {0} frame")]
    Syntax(&'static str),
    /// Field tables nested deeper than `nesting::MAX_DEPTH`: 502 SYNTAX_ERROR
    /// (a limit RabbitMQ does not have; see `nesting`).
    #[error("{0} frame with field tables nested deeper than {max} levels", max = nesting::MAX_DEPTH)]
    TooDeep(&'static str),
}

impl FrameError {
    /// AMQP reply code RabbitMQ uses for this error.
    pub fn reply_code(&self) -> u16 {
        match self {
            FrameError::Syntax(_) | FrameError::TooDeep(_) => 502,
            _ => 501,
        }
    }
}

/// Incremental frame parser over a growable buffer.
pub struct FrameReader {
    buf: BytesMut,
    /// Max total frame size in bytes (payload + 8), 0 = unlimited.
    frame_max: u32,
}

impl Default for FrameReader {
    fn default() -> Self {
        Self::new()
    }
}

impl FrameReader {
    /// New reader; until tune-ok the limit is the spec minimum of 4096 bytes
    /// plus headroom for clients that send large start-ok tables.
    pub fn new() -> Self {
        FrameReader {
            buf: BytesMut::with_capacity(64 * 1024),
            frame_max: 131_072,
        }
    }

    /// Sets the negotiated frame_max (bytes, total frame size; 0 = none).
    pub fn set_frame_max(&mut self, frame_max: u32) {
        self.frame_max = frame_max;
    }

    /// Buffer to read socket bytes into.
    pub fn buffer(&mut self) -> &mut BytesMut {
        &mut self.buf
    }

    /// Takes the 8-byte protocol header if complete: `Some(Ok(()))` when it
    /// is AMQP 0-9-1, `Some(Err(()))` for anything else.
    pub fn take_protocol_header(&mut self) -> Option<Result<(), ()>> {
        if self.buf.len() < 8 {
            // A non-AMQP prefix can be refused early.
            if !self.buf.is_empty() && !PROTOCOL_HEADER.starts_with(&self.buf[..]) {
                return Some(Err(()));
            }
            return None;
        }
        let ok = &self.buf[..8] == PROTOCOL_HEADER;
        self.buf.advance(8);
        Some(if ok { Ok(()) } else { Err(()) })
    }

    /// Next complete frame, `Ok(None)` if more bytes are needed.
    pub fn next_frame(&mut self) -> Result<Option<InFrame>, FrameError> {
        if self.buf.len() < 7 {
            return Ok(None);
        }
        let kind = self.buf[0];
        let channel = u16::from_be_bytes([self.buf[1], self.buf[2]]);
        let size = u32::from_be_bytes([self.buf[3], self.buf[4], self.buf[5], self.buf[6]]);
        if !matches!(
            kind,
            FRAME_METHOD | FRAME_HEADER | FRAME_BODY | FRAME_HEARTBEAT
        ) {
            return Err(FrameError::UnknownType(kind));
        }
        if self.frame_max != 0 && u64::from(size) + 8 > u64::from(self.frame_max) {
            return Err(FrameError::TooLarge {
                size,
                max: self.frame_max,
            });
        }
        let total = size as usize + 8;
        if self.buf.len() < total {
            self.buf.reserve(total - self.buf.len());
            return Ok(None);
        }
        let end = self.buf[total - 1];
        if end != FRAME_END {
            return Err(FrameError::BadFrameEnd(end));
        }
        let mut frame = self.buf.split_to(total).freeze();
        frame.advance(7);
        let payload = frame.slice(..size as usize);
        Ok(Some(match kind {
            FRAME_METHOD => {
                if !nesting::method_within_limit(&payload) {
                    return Err(FrameError::TooDeep("method"));
                }
                let (rest, class) = amq_protocol::protocol::parse_class(&payload[..])
                    .map_err(|_| FrameError::Syntax("method"))?;
                if !rest.is_empty() {
                    return Err(FrameError::Syntax("method"));
                }
                InFrame::Method(channel, class)
            }
            FRAME_HEADER => {
                if payload.len() < 14 {
                    return Err(FrameError::Syntax("content header"));
                }
                if !nesting::properties_within_limit(&payload) {
                    return Err(FrameError::TooDeep("content header"));
                }
                let class_id = u16::from_be_bytes([payload[0], payload[1]]);
                let body_size = u64::from_be_bytes(
                    payload[4..12]
                        .try_into()
                        .map_err(|_| FrameError::Syntax("content header"))?,
                );
                let raw_properties = payload.slice(12..);
                let (rest, properties) =
                    amq_protocol::protocol::basic::parse_properties(&raw_properties[..])
                        .map_err(|_| FrameError::Syntax("content header"))?;
                if !rest.is_empty() {
                    return Err(FrameError::Syntax("content header"));
                }
                InFrame::Header {
                    channel,
                    class_id,
                    body_size,
                    properties,
                    raw_properties,
                }
            }
            FRAME_BODY => InFrame::Body(channel, payload),
            _ => InFrame::Heartbeat(channel),
        }))
    }
}

/// Appends a method frame to `out`.
pub fn write_method(out: &mut Output, channel: u16, method: AMQPClass) {
    let frame = AMQPFrame::Method(channel, method);
    match cookie_factory::gen_simple(amq_protocol::frame::gen_frame(&frame), Vec::new()) {
        Ok(bytes) => out.frames().extend_from_slice(&bytes),
        // Generation only fails on oversized short strings, which our own
        // methods never carry; log rather than panic.
        Err(e) => tracing::error!(error = %e, "failed to encode method frame"),
    }
}

/// Appends a heartbeat frame.
pub fn write_heartbeat(out: &mut Output) {
    out.frames()
        .extend_from_slice(&[FRAME_HEARTBEAT, 0, 0, 0, 0, 0, 0, FRAME_END]);
}

/// Appends the server's protocol header (sent on a version mismatch).
pub fn protocol_header() -> &'static [u8] {
    PROTOCOL_HEADER
}

/// Encodes basic properties to raw property bytes (flags + fields).
pub fn encode_properties(props: &AMQPProperties) -> Bytes {
    // Sized for typical properties so the table writer does not regrow the buffer.
    match cookie_factory::gen_simple(
        amq_protocol::protocol::basic::gen_properties(props),
        Vec::with_capacity(512),
    ) {
        Ok(v) => Bytes::from(v),
        Err(e) => {
            tracing::error!(error = %e, "failed to encode properties");
            Bytes::from_static(&[0, 0])
        }
    }
}

/// Bodies at least this big (bytes) go out as slices of the message's own buffer; smaller
/// ones are copied next to their frame headers (one piece for many small deliveries).
const SHARED_BODY_BYTES: usize = 64 << 10;

/// Appends a content header frame (class basic) with raw property bytes and
/// the body split into frames of at most `frame_max - 8` bytes. A body of
/// [`SHARED_BODY_BYTES`] or more is not copied: its frames carry slices of `body`.
pub fn write_content(
    out: &mut Output,
    channel: u16,
    raw_properties: &[u8],
    body: &Bytes,
    frame_max: u32,
) {
    let shared = body.len() >= SHARED_BODY_BYTES;
    let header_len = 12 + raw_properties.len();
    let chunk = if frame_max == 0 {
        body.len().max(1)
    } else {
        (frame_max as usize).saturating_sub(8).max(1)
    };
    let frames = out.frames();
    if shared {
        frames.reserve(header_len + 8 + 8 * body.len().div_ceil(chunk).min(64));
    } else {
        frames.reserve(header_len + 8 + body.len() + 8 * body.len().div_ceil(chunk));
    }
    frames.put_u8(FRAME_HEADER);
    frames.put_u16(channel);
    frames.put_u32(header_len as u32);
    frames.put_u16(60);
    frames.put_u16(0);
    frames.put_u64(body.len() as u64);
    frames.put_slice(raw_properties);
    frames.put_u8(FRAME_END);
    let mut at = 0;
    while at < body.len() {
        let end = (at + chunk).min(body.len());
        let frames = out.frames();
        frames.put_u8(FRAME_BODY);
        frames.put_u16(channel);
        frames.put_u32((end - at) as u32);
        if shared {
            out.push_shared(body.slice(at..end));
        } else {
            frames.put_slice(&body[at..end]);
        }
        out.frames().put_u8(FRAME_END);
        at = end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use amq_protocol::protocol::{basic, channel};

    fn encode(channel: u16, class: AMQPClass) -> Vec<u8> {
        let mut out = Output::default();
        write_method(&mut out, channel, class);
        out.to_vec()
    }

    #[test]
    fn method_round_trip_byte_at_a_time() {
        let bytes = encode(
            3,
            AMQPClass::Channel(channel::AMQPMethod::Open(channel::Open {})),
        );
        let mut r = FrameReader::new();
        let mut got = None;
        for b in bytes.iter() {
            r.buffer().put_u8(*b);
            if let Some(f) = r.next_frame().expect("valid") {
                got = Some(f);
            }
        }
        assert!(matches!(
            got,
            Some(InFrame::Method(
                3,
                AMQPClass::Channel(channel::AMQPMethod::Open(_))
            ))
        ));
    }

    /// Writes a content header and body with `write_content` and reads them back.
    fn content_round_trip(size: usize, frame_max: u32) -> Result<(), FrameError> {
        let props = basic::AMQPProperties::default()
            .with_delivery_mode(2)
            .with_message_id("m1".into());
        let raw = encode_properties(&props);
        let body: Bytes = (0..size)
            .map(|i| (i % 251) as u8)
            .collect::<Vec<u8>>()
            .into();
        let mut out = Output::default();
        write_content(&mut out, 1, &raw, &body, frame_max);
        let mut r = FrameReader::new();
        r.set_frame_max(frame_max);
        r.buffer().extend_from_slice(&out.to_vec());
        let Some(InFrame::Header {
            raw_properties,
            properties,
            body_size,
            ..
        }) = r.next_frame()?
        else {
            panic!("expected header")
        };
        assert_eq!(raw_properties, raw);
        assert_eq!(body_size, size as u64);
        assert_eq!(properties.delivery_mode(), &Some(2));
        let mut got = Vec::new();
        while let Some(InFrame::Body(1, b)) = r.next_frame()? {
            assert!(b.len() <= frame_max as usize - 8);
            got.extend_from_slice(&b);
        }
        assert_eq!(got, body);
        Ok(())
    }

    #[test]
    fn content_round_trip_keeps_raw_properties() -> Result<(), FrameError> {
        content_round_trip(10_000, 4096)?;
        content_round_trip(0, 4096)?;
        // Shared bodies: exactly one frame, several, and a short last frame.
        content_round_trip(SHARED_BODY_BYTES, 131_072)?;
        content_round_trip(131_072 - 8, 131_072)?;
        content_round_trip(3 << 20, 131_072)?;
        content_round_trip((3 << 20) + 5, 131_072)
    }

    /// A big body's frames are slices of the body: the bytes taken for the socket include
    /// pieces that point into the body's own memory, and nothing near the body's size is
    /// copied into the frame buffer.
    #[test]
    fn a_big_body_is_not_copied() {
        let body = Bytes::from(vec![9u8; 1 << 20]);
        let mut out = Output::default();
        write_content(&mut out, 1, &[0, 0], &body, 131_072);
        let pieces = out.take();
        let inside = |p: &Bytes| {
            let start = body.as_ptr() as usize;
            (start..start + body.len()).contains(&(p.as_ptr() as usize))
        };
        let shared: usize = pieces.iter().filter(|p| inside(p)).map(Bytes::len).sum();
        assert_eq!(shared, body.len());
        let copied: usize = pieces.iter().filter(|p| !inside(p)).map(Bytes::len).sum();
        assert!(copied < 1024, "{copied} bytes of frame headers");
    }

    #[test]
    fn oversize_and_bad_end_and_unknown_type_are_errors() {
        let mut r = FrameReader::new();
        r.set_frame_max(4096);
        r.buffer().extend_from_slice(&[1, 0, 1, 0, 1, 0, 0]);
        assert!(matches!(r.next_frame(), Err(FrameError::TooLarge { .. })));
        let mut r = FrameReader::new();
        r.buffer().extend_from_slice(&[8, 0, 0, 0, 0, 0, 0, 0xAB]);
        assert_eq!(r.next_frame().unwrap_err(), FrameError::BadFrameEnd(0xAB));
        let mut r = FrameReader::new();
        r.buffer().extend_from_slice(&[9, 0, 0, 0, 0, 0, 0, 0xCE]);
        assert_eq!(r.next_frame().unwrap_err(), FrameError::UnknownType(9));
        let mut r = FrameReader::new();
        r.buffer()
            .extend_from_slice(&[1, 0, 0, 0, 0, 0, 2, 0xFF, 0xFF, 0xCE]);
        assert!(matches!(r.next_frame(), Err(FrameError::Syntax(_))));
    }

    #[test]
    fn protocol_header_detection() {
        let mut r = FrameReader::new();
        r.buffer().extend_from_slice(b"AMQP");
        assert_eq!(r.take_protocol_header(), None);
        r.buffer().extend_from_slice(&[0, 0, 9, 1]);
        assert_eq!(r.take_protocol_header(), Some(Ok(())));
        let mut r = FrameReader::new();
        r.buffer().extend_from_slice(b"GET / HTTP/1.1\r\n");
        assert_eq!(r.take_protocol_header(), Some(Err(())));
    }

    /// A `connection.start-ok` whose client properties hold `depth - 1`
    /// arrays nested in each other: five bytes a level.
    fn deep_start_ok(depth: usize) -> Vec<u8> {
        let mut table = vec![1, b'k'];
        table.extend_from_slice(&nesting::nested_arrays(depth - 1));
        let mut payload = vec![0, 10, 0, 11];
        payload.extend_from_slice(&(table.len() as u32).to_be_bytes());
        payload.extend_from_slice(&table);
        payload.extend_from_slice(b"\x05PLAIN\0\0\0\x0c\0guest\0guest\x05en_US");
        let mut frame = vec![FRAME_METHOD, 0, 0];
        frame.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        frame.extend_from_slice(&payload);
        frame.push(FRAME_END);
        frame
    }

    /// Reads one frame on a thread with a tokio worker's 2 MiB stack.
    fn read_on_worker_stack(frame: Vec<u8>) -> Result<bool, FrameError> {
        std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn(move || {
                let mut r = FrameReader::new();
                r.buffer().extend_from_slice(&frame);
                r.next_frame().map(|f| f.is_some())
            })
            .expect("spawn")
            .join()
            .expect("no panic")
    }

    #[test]
    fn tables_nested_too_deep_are_a_syntax_error_not_a_stack_overflow() {
        // 25,000 levels in 125 KB, under the pre-tune frame_max: before the
        // nesting limit this aborted the process with a stack overflow.
        let frame = deep_start_ok(25_000);
        assert!(frame.len() < 131_072);
        let err = read_on_worker_stack(frame).unwrap_err();
        assert_eq!(err, FrameError::TooDeep("method"));
        assert_eq!(err.reply_code(), 502);
        assert_eq!(
            read_on_worker_stack(deep_start_ok(nesting::MAX_DEPTH + 1)),
            Err(FrameError::TooDeep("method"))
        );
        assert_eq!(
            read_on_worker_stack(deep_start_ok(nesting::MAX_DEPTH)),
            Ok(true)
        );
    }

    proptest::proptest! {
        #[test]
        fn random_bytes_never_panic(data in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            let mut r = FrameReader::new();
            r.buffer().extend_from_slice(&data);
            for _ in 0..64 {
                match r.next_frame() { Ok(Some(_)) => continue, _ => break }
            }
        }
    }
}
