//! Frames on their way to a client's socket. Small frames are written into one buffer; the
//! body frames of a big message carry slices of the message's own `Bytes` instead of a copy
//! (issue 32: a delivery of a 25 MiB body copied it whole into the connection's buffer, and
//! the consume phase of the big-bodies test reached 1.2 GB). The socket writer sends the
//! pieces with vectored writes ([`write_all`]).

use std::collections::VecDeque;
use std::io::IoSlice;

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncWrite, AsyncWriteExt};

/// Capacity the frame buffer keeps for reuse (bytes). A buffer past this (a burst of small
/// deliveries) leaves with its frames and is freed once written: an idle connection held
/// 190 MB after its consumer had acked everything when it kept its biggest buffer
/// (2026-11-27), and a memory alarm raised by the burst never cleared.
pub const KEEP_BYTES: usize = 256 << 10;

/// Initial capacity of a connection's frame buffer (bytes).
const INITIAL_BYTES: usize = 64 << 10;

/// Most pieces handed to one vectored write (Linux's `IOV_MAX` is 1024).
const MAX_IOV: usize = 64;

/// Pending output: `pieces` (in order), then the frames being written in `frames`.
#[derive(Default)]
pub struct Output {
    /// Finished pieces: frozen frame bytes and shared body slices, in order.
    pieces: Vec<Bytes>,
    /// Total bytes in `pieces`.
    pieces_len: usize,
    /// Frames written since the last piece.
    frames: BytesMut,
}

impl Output {
    /// An empty output whose frame buffer has room for `capacity` bytes.
    pub fn with_capacity(capacity: usize) -> Output {
        Output {
            frames: BytesMut::with_capacity(capacity),
            ..Output::default()
        }
    }

    /// The frame buffer: frames written here go out after everything already pending.
    pub fn frames(&mut self) -> &mut BytesMut {
        &mut self.frames
    }

    /// Appends `piece` (a slice of a body) without copying it.
    pub fn push_shared(&mut self, piece: Bytes) {
        self.seal();
        self.pieces_len += piece.len();
        self.pieces.push(piece);
    }

    /// Pending bytes.
    pub fn len(&self) -> usize {
        self.pieces_len + self.frames.len()
    }

    /// True when nothing is pending.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Moves everything pending in `other` after what is pending here; `other` is left
    /// empty (keeping a frame buffer of at most [`KEEP_BYTES`]).
    pub fn append(&mut self, other: &mut Output) {
        if !other.pieces.is_empty() {
            self.seal();
            self.pieces_len += other.pieces_len;
            self.pieces.append(&mut other.pieces);
            other.pieces_len = 0;
        }
        self.frames.extend_from_slice(&other.frames);
        if other.frames.capacity() > KEEP_BYTES {
            other.frames = BytesMut::new();
        } else {
            other.frames.clear();
        }
    }

    /// Takes everything pending, in order, for the socket writer. The frame buffer's
    /// allocation stays for the next frames only while it is at most [`KEEP_BYTES`]
    /// (`BytesMut::split` would share a bigger one, and the next reserve would take it back
    /// whole once the writer let go).
    pub fn take(&mut self) -> Vec<Bytes> {
        self.seal();
        if self.frames.capacity() > KEEP_BYTES {
            self.frames = BytesMut::with_capacity(INITIAL_BYTES);
        }
        self.pieces_len = 0;
        std::mem::take(&mut self.pieces)
    }

    /// Everything pending as one contiguous buffer (tests).
    #[cfg(test)]
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len());
        for p in &self.pieces {
            v.extend_from_slice(p);
        }
        v.extend_from_slice(&self.frames);
        v
    }

    /// Ends the current frame bytes as a piece.
    fn seal(&mut self) {
        if !self.frames.is_empty() {
            let done = if self.frames.capacity() > KEEP_BYTES {
                std::mem::take(&mut self.frames)
            } else {
                self.frames.split()
            };
            self.pieces_len += done.len();
            self.pieces.push(done.freeze());
        }
    }
}

/// Writes `pieces` in order with vectored writes (a writer without them, such as TLS, gets
/// one piece per call).
///
/// Errors: the writer's, or `WriteZero` when it takes nothing.
pub async fn write_all<W: AsyncWrite + Unpin>(
    wr: &mut W,
    pieces: &mut VecDeque<Bytes>,
) -> std::io::Result<()> {
    while !pieces.is_empty() {
        let slices: Vec<IoSlice<'_>> = pieces
            .iter()
            .take(MAX_IOV)
            .map(|p| IoSlice::new(p))
            .collect();
        let mut n = wr.write_vectored(&slices).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        while n > 0 {
            let Some(first) = pieces.front_mut() else {
                return Err(std::io::Error::other(
                    "the writer reported more bytes written than it was given",
                ));
            };
            if n >= first.len() {
                n -= first.len();
                pieces.pop_front();
            } else {
                first.advance(n);
                n = 0;
            }
        }
        while pieces.front().is_some_and(|p| p.is_empty()) {
            pieces.pop_front();
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_and_frames_keep_their_order() {
        let mut out = Output::with_capacity(16);
        out.frames().extend_from_slice(b"ab");
        out.push_shared(Bytes::from_static(b"cd"));
        out.frames().extend_from_slice(b"e");
        let mut other = Output::default();
        other.frames().extend_from_slice(b"f");
        other.push_shared(Bytes::from_static(b"gh"));
        other.frames().extend_from_slice(b"i");
        out.append(&mut other);
        assert!(other.is_empty());
        assert_eq!(out.len(), 9);
        assert_eq!(out.to_vec(), b"abcdefghi");
        let taken: Vec<u8> = out.take().concat();
        assert_eq!(taken, b"abcdefghi");
        assert!(out.is_empty());
    }

    /// A body pushed as a piece is the body's own memory, not a copy.
    #[test]
    fn a_shared_piece_is_not_copied() {
        let body = Bytes::from(vec![7u8; 1 << 20]);
        let mut out = Output::default();
        out.push_shared(body.slice(..));
        let taken = out.take();
        assert_eq!(taken.len(), 1);
        assert_eq!(taken[0].as_ptr(), body.as_ptr());
    }

    /// A burst leaves with its frames: what the output keeps afterwards is small.
    #[test]
    fn a_big_frame_buffer_is_not_kept_after_it_is_taken() {
        let mut out = Output::with_capacity(INITIAL_BYTES);
        out.frames().extend_from_slice(&vec![1u8; 4 << 20]);
        let taken = out.take();
        assert_eq!(taken.iter().map(Bytes::len).sum::<usize>(), 4 << 20);
        assert!(
            out.frames().capacity() <= KEEP_BYTES,
            "kept {}",
            out.frames().capacity()
        );
        drop(taken);
        // The next frames do not take the freed burst's allocation back.
        out.frames().reserve(100);
        assert!(out.frames().capacity() <= KEEP_BYTES);

        let mut channel = Output::default();
        channel
            .frames()
            .extend_from_slice(&vec![1u8; KEEP_BYTES + 1]);
        out.append(&mut channel);
        assert!(channel.frames().capacity() <= KEEP_BYTES);
    }

    /// A small output keeps one allocation across turns (no allocation per flush).
    #[test]
    fn a_small_frame_buffer_is_reused() {
        let mut out = Output::with_capacity(INITIAL_BYTES);
        out.frames().extend_from_slice(b"heartbeat");
        drop(out.take());
        out.frames().extend_from_slice(b"x");
        assert!(out.frames().capacity() >= INITIAL_BYTES - 16);
    }

    /// A writer that takes at most 5 bytes per call: pieces are finished across calls.
    struct Trickle(Vec<u8>);

    impl AsyncWrite for Trickle {
        fn poll_write(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            let n = buf.len().min(5);
            self.0.extend_from_slice(&buf[..n]);
            std::task::Poll::Ready(Ok(n))
        }
        fn poll_flush(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
        fn poll_shutdown(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn partial_writes_send_every_byte_in_order() {
        let mut pieces: VecDeque<Bytes> = (0..200u8)
            .map(|i| Bytes::from(vec![i; usize::from(i % 13)]))
            .collect();
        let want: Vec<u8> = pieces.iter().flat_map(|p| p.to_vec()).collect();
        let mut w = Trickle(Vec::new());
        write_all(&mut w, &mut pieces).await.expect("written");
        assert!(pieces.is_empty());
        assert_eq!(w.0, want);
        // And through a real vectored writer.
        let mut pieces: VecDeque<Bytes> = (0..300u16)
            .map(|i| Bytes::from(vec![i as u8; usize::from(i % 7) * 1000]))
            .collect();
        let want: Vec<u8> = pieces.iter().flat_map(|p| p.to_vec()).collect();
        let (mut a, mut b) = tokio::io::duplex(4096);
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            tokio::io::AsyncReadExt::read_to_end(&mut b, &mut got)
                .await
                .map(|_| got)
        });
        write_all(&mut a, &mut pieces).await.expect("written");
        drop(a);
        assert_eq!(reader.await.expect("joined").expect("read"), want);
    }
}
