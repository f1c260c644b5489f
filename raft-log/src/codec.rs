//! The one place the on-disk/on-wire byte format of `raft-log` lives: bincode 2.0.1 with
//! `bincode::config::standard()` (varint, little-endian) over serde.
//!
//! bincode 2 cannot decode `deserialize_any` shapes (`#[serde(untagged)]`, `#[serde(flatten)]`);
//! openraft 0.9.25 types only use those under its `compat` feature, which we do not enable
//! (architecture-anchors §2.6). Persisted records that may evolve are versioned enums.

use std::cell::RefCell;

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::StoreError;

/// Byte fields of at least this many bytes decoded by [`decode_shared`] are
/// slices of its buffer; smaller ones are copied (a small slice would keep a
/// whole batch's buffer alive).
pub const SHARE_MIN_BYTES: usize = 64 * 1024;

thread_local! {
    /// The buffer [`decode_shared`] is decoding on this thread.
    static SOURCE: RefCell<Option<Bytes>> = const { RefCell::new(None) };
}

thread_local! {
    /// While [`encode_rope`] runs on this thread: the big [`shared_bytes`] field being
    /// serialized, whose bytes the rope takes by reference instead of copying.
    static ROPE_FIELD: RefCell<Option<Bytes>> = const { RefCell::new(None) };
    /// [`encode_rope`] is running on this thread.
    static ROPE_ACTIVE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Restores the previous [`SOURCE`] when a decode ends, also on panic.
struct SourceGuard(Option<Bytes>);

impl Drop for SourceGuard {
    fn drop(&mut self) {
        let prev = self.0.take();
        SOURCE.with(|s| *s.borrow_mut() = prev);
    }
}

/// Decode a value that must occupy all of `b`, as [`decode`] does, except
/// that its [`shared_bytes`] fields of at least [`SHARE_MIN_BYTES`] are
/// slices of `b` rather than copies: a 100 MiB message body read from the
/// WAL or received in an append is not copied again to be replicated,
/// applied or stored.
///
/// Errors: as [`decode`].
pub fn decode_shared<T: DeserializeOwned>(b: &Bytes) -> Result<T, StoreError> {
    let _restore = SourceGuard(SOURCE.with(|s| s.replace(Some(b.clone()))));
    let (v, used): (T, usize) =
        bincode::serde::borrow_decode_from_slice(&b[..], bincode::config::standard())?;
    if used != b.len() {
        return Err(StoreError::corrupt(format!(
            "{} trailing bytes after value",
            b.len() - used
        )));
    }
    Ok(v)
}

/// `#[serde(with = "raft_log::codec::shared_bytes")]` for a `Bytes` field:
/// the same bytes on the wire as `Bytes`' own serde; decoded by
/// [`decode_shared`] it is a slice of the buffer being decoded (from
/// [`SHARE_MIN_BYTES`] up), otherwise a copy.
pub mod shared_bytes {
    use super::{Bytes, SHARE_MIN_BYTES, SOURCE};
    use serde::de::{Error, SeqAccess, Visitor};
    use serde::{Deserializer, Serializer};

    /// Writes `b` as serde bytes.
    ///
    /// Errors: the serializer's.
    pub fn serialize<S: Serializer>(b: &Bytes, s: S) -> Result<S::Ok, S::Error> {
        super::offer_to_rope(b);
        s.serialize_bytes(b)
    }

    /// Reads serde bytes, sharing the decode buffer where it can.
    ///
    /// Errors: the deserializer's.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Bytes, D::Error> {
        d.deserialize_bytes(SharedVisitor)
    }

    /// `v` as a slice of the buffer being decoded on this thread, when it lies within it and is
    /// large enough; else a copy.
    pub(super) fn share(v: &[u8]) -> Bytes {
        if v.len() >= SHARE_MIN_BYTES {
            let shared = SOURCE.with(|s| {
                let s = s.borrow();
                let src = s.as_ref()?;
                let (lo, p) = (src.as_ptr() as usize, v.as_ptr() as usize);
                (p >= lo && p + v.len() <= lo + src.len()).then(|| src.slice_ref(v))
            });
            if let Some(b) = shared {
                return b;
            }
        }
        Bytes::copy_from_slice(v)
    }

    pub(super) struct SharedVisitor;

    impl<'de> Visitor<'de> for SharedVisitor {
        type Value = Bytes;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("bytes")
        }

        fn visit_borrowed_bytes<E: Error>(self, v: &'de [u8]) -> Result<Bytes, E> {
            Ok(share(v))
        }

        fn visit_bytes<E: Error>(self, v: &[u8]) -> Result<Bytes, E> {
            Ok(Bytes::copy_from_slice(v))
        }

        fn visit_byte_buf<E: Error>(self, v: Vec<u8>) -> Result<Bytes, E> {
            Ok(Bytes::from(v))
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Bytes, A::Error> {
            let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
            while let Some(b) = seq.next_element::<u8>()? {
                out.push(b);
            }
            Ok(Bytes::from(out))
        }
    }
}

/// [`shared_bytes`] for an `Option<Bytes>` field.
pub mod shared_bytes_opt {
    use super::shared_bytes::SharedVisitor;
    use super::Bytes;
    use serde::de::Visitor;
    use serde::{Deserializer, Serializer};

    /// Writes `b` as an optional serde bytes value.
    ///
    /// Errors: the serializer's.
    pub fn serialize<S: Serializer>(b: &Option<Bytes>, s: S) -> Result<S::Ok, S::Error> {
        match b {
            // `Bytes` serializes as serde bytes.
            Some(b) => {
                super::offer_to_rope(b);
                s.serialize_some(b)
            }
            None => s.serialize_none(),
        }
    }

    /// Reads an optional serde bytes value, sharing the decode buffer where it can.
    ///
    /// Errors: the deserializer's.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Bytes>, D::Error> {
        struct OptVisitor;
        impl<'de> Visitor<'de> for OptVisitor {
            type Value = Option<Bytes>;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("optional bytes")
            }

            fn visit_none<E: serde::de::Error>(self) -> Result<Option<Bytes>, E> {
                Ok(None)
            }

            fn visit_unit<E: serde::de::Error>(self) -> Result<Option<Bytes>, E> {
                Ok(None)
            }

            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Option<Bytes>, D::Error> {
                d.deserialize_bytes(SharedVisitor).map(Some)
            }
        }
        d.deserialize_option(OptVisitor)
    }
}

/// Work on at least this many bytes (an encode, a WAL append) runs off the
/// async worker thread ([`off_worker`]).
pub const HEAVY_BYTES: usize = 1 << 20;

/// Runs `f` where it cannot stall the node's other tasks: on a tokio
/// multi-thread worker, through `block_in_place` (the worker's other tasks
/// move to another thread meanwhile); anywhere else (a current-thread
/// runtime, a blocking thread, no runtime), right here. On this 2-core box
/// a node has one worker thread, and a 100 MiB body copied or encoded on it
/// held up the failure detector's beats past their 800 ms deadline: every
/// node declared every other down, and elections went on for ever.
pub fn off_worker<R>(f: impl FnOnce() -> R) -> R {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current() {
        Ok(h) if h.runtime_flavor() == RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// Appends to a `Vec` reserved up front at the encoded size.
struct VecWriter(Vec<u8>);

impl bincode::enc::write::Writer for VecWriter {
    fn write(&mut self, bytes: &[u8]) -> Result<(), bincode::error::EncodeError> {
        self.0.extend_from_slice(bytes);
        Ok(())
    }
}

/// Encode `v` with the bincode 2 standard config, into a buffer of exactly
/// the encoded size (measured first, without copying: a 100 MiB body is
/// not copied again each time the buffer doubles). From [`HEAVY_BYTES`] up
/// the encode runs [`off_worker`].
///
/// Errors: [`StoreError::Encode`] if serde/bincode rejects the value.
pub fn encode<T: Serialize + ?Sized>(v: &T) -> Result<Vec<u8>, StoreError> {
    let config = bincode::config::standard();
    let mut size = bincode::enc::write::SizeWriter::default();
    bincode::serde::encode_into_writer(v, &mut size, config)?;
    let n = size.bytes_written;
    let run = || -> Result<Vec<u8>, StoreError> {
        let mut out = VecWriter(Vec::with_capacity(n));
        bincode::serde::encode_into_writer(v, &mut out, config)?;
        Ok(out.0)
    };
    if n >= HEAVY_BYTES {
        off_worker(run)
    } else {
        run()
    }
}

/// While [`encode_rope`] runs on this thread, marks `b` (a big [`shared_bytes`] field about to
/// be serialized) as the next bytes the rope takes by reference.
fn offer_to_rope(b: &Bytes) {
    if b.len() >= SHARE_MIN_BYTES && ROPE_ACTIVE.with(|a| a.get()) {
        ROPE_FIELD.with(|f| *f.borrow_mut() = Some(b.clone()));
    }
}

/// Ends [`encode_rope`]'s mode on this thread, also on panic.
struct RopeGuard;

impl Drop for RopeGuard {
    fn drop(&mut self) {
        ROPE_ACTIVE.with(|a| a.set(false));
        ROPE_FIELD.with(|f| *f.borrow_mut() = None);
    }
}

/// Collects an encoding as pieces: runs of small writes copied into owned buffers, and the
/// bytes of each big [`shared_bytes`] field as a clone of its `Bytes` (no copy).
struct RopeWriter {
    pieces: Vec<Bytes>,
    small: Vec<u8>,
    len: usize,
}

impl bincode::enc::write::Writer for RopeWriter {
    fn write(&mut self, bytes: &[u8]) -> Result<(), bincode::error::EncodeError> {
        self.len += bytes.len();
        // Only a big write can be a shared field's bytes: small ones skip the thread-local.
        let field = (bytes.len() >= SHARE_MIN_BYTES)
            .then(|| {
                ROPE_FIELD.with(|f| {
                    let mut f = f.borrow_mut();
                    match f.as_ref() {
                        // bincode writes a byte field's bytes in one call, right after its length.
                        Some(b) if b.as_ptr() == bytes.as_ptr() && b.len() == bytes.len() => {
                            f.take()
                        }
                        _ => None,
                    }
                })
            })
            .flatten();
        match field {
            Some(b) => {
                if !self.small.is_empty() {
                    self.pieces
                        .push(Bytes::from(std::mem::take(&mut self.small)));
                }
                self.pieces.push(b);
            }
            None => self.small.extend_from_slice(bytes),
        }
        Ok(())
    }
}

/// Encode `v` exactly as [`encode`] does, but as a list of pieces whose concatenation is the
/// encoding: the bytes of every [`shared_bytes`] / [`shared_bytes_opt`] field of at least
/// [`SHARE_MIN_BYTES`] are the field's own `Bytes` (shared, not copied), the rest is copied
/// into a few small buffers. Returns the pieces and their total length in bytes.
///
/// For sending a big value in chunks without copying it whole (a 100 MiB body replicated to
/// two followers was encoded twice, and copied twice more into the HTTP/2 buffers).
///
/// Errors: [`StoreError::Encode`] if serde/bincode rejects the value.
pub fn encode_rope<T: Serialize + ?Sized>(v: &T) -> Result<(Vec<Bytes>, usize), StoreError> {
    let _end = RopeGuard;
    ROPE_ACTIVE.with(|a| a.set(true));
    let mut out = RopeWriter {
        pieces: Vec::new(),
        small: Vec::new(),
        len: 0,
    };
    bincode::serde::encode_into_writer(v, &mut out, bincode::config::standard())?;
    if !out.small.is_empty() {
        out.pieces.push(Bytes::from(out.small));
    }
    Ok((out.pieces, out.len))
}

/// Decode a value that must occupy all of `b`.
///
/// Errors: [`StoreError::Decode`] on malformed bytes, [`StoreError::Corrupt`] if bytes remain
/// after the value.
pub fn decode<T: DeserializeOwned>(b: &[u8]) -> Result<T, StoreError> {
    let (v, used) = decode_prefix(b)?;
    if used != b.len() {
        return Err(StoreError::corrupt(format!(
            "{} trailing bytes after value",
            b.len() - used
        )));
    }
    Ok(v)
}

/// Decode a value from the start of `b`; returns it and the number of bytes it used.
///
/// Errors: [`StoreError::Decode`] on malformed bytes.
pub fn decode_prefix<T: DeserializeOwned>(b: &[u8]) -> Result<(T, usize), StoreError> {
    Ok(bincode::serde::decode_from_slice(
        b,
        bincode::config::standard(),
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Msg {
        n: u32,
        #[serde(with = "shared_bytes")]
        body: Bytes,
        #[serde(with = "shared_bytes_opt")]
        extra: Option<Bytes>,
        plain: Bytes,
    }

    fn within(outer: &Bytes, inner: &Bytes) -> bool {
        let (lo, p) = (outer.as_ptr() as usize, inner.as_ptr() as usize);
        p >= lo && p + inner.len() <= lo + outer.len()
    }

    #[test]
    fn a_rope_is_the_encoding_in_pieces_with_big_shared_fields_by_reference() {
        let big = Bytes::from(vec![7u8; SHARE_MIN_BYTES + 1]);
        let other = Bytes::from(vec![9u8; SHARE_MIN_BYTES * 2]);
        let m = Msg {
            n: 3,
            body: big.clone(),
            extra: Some(other.clone()),
            plain: big.clone(),
        };
        let (pieces, len) = encode_rope(&m).unwrap();
        let flat: Vec<u8> = pieces.iter().flat_map(|p| p.iter().copied()).collect();
        assert_eq!(flat, encode(&m).unwrap(), "the same bytes as encode");
        assert_eq!(len, flat.len());
        let by_ref = |b: &Bytes| pieces.iter().any(|p| p.as_ptr() == b.as_ptr());
        assert!(by_ref(&big), "the shared field's bytes are not copied");
        assert!(by_ref(&other), "nor the optional one's");
        assert_eq!(
            pieces.iter().filter(|p| p.as_ptr() == big.as_ptr()).count(),
            1,
            "the plain Bytes field with the same bytes is copied"
        );
        // Small shared fields are copied; the mode ends with the encode.
        let m = Msg {
            n: 1,
            body: Bytes::from_static(b"small"),
            extra: None,
            plain: Bytes::new(),
        };
        let (pieces, len) = encode_rope(&m).unwrap();
        assert_eq!(pieces.len(), 1);
        assert_eq!(&pieces[0][..], &encode(&m).unwrap()[..]);
        assert_eq!(len, pieces[0].len());
        assert!(!ROPE_ACTIVE.with(|a| a.get()));
        let after = Msg {
            n: 2,
            body: big.clone(),
            extra: None,
            plain: Bytes::new(),
        };
        let wire = encode(&after).unwrap();
        assert!(
            ROPE_FIELD.with(|f| f.borrow().is_none()),
            "encode leaves no field offered"
        );
        assert_eq!(decode::<Msg>(&wire).unwrap(), after);
    }

    #[test]
    fn shared_fields_decode_as_slices_of_the_buffer_and_keep_the_wire_format() {
        let big = Bytes::from(vec![7u8; SHARE_MIN_BYTES + 1]);
        let small = Bytes::from_static(b"small");
        let m = Msg {
            n: 3,
            body: big.clone(),
            extra: Some(big.clone()),
            plain: big.clone(),
        };
        let wire = Bytes::from(encode(&m).unwrap());
        // The same bytes as Bytes' own serde (older nodes read them).
        let own = encode(&(3u32, &big, Some(&big), &big)).unwrap();
        assert_eq!(&wire[..], &own[..]);
        let shared: Msg = decode_shared(&wire).unwrap();
        assert_eq!(shared, m);
        assert!(within(&wire, &shared.body), "a big shared field is a slice");
        assert!(within(&wire, shared.extra.as_ref().unwrap()));
        assert!(
            !within(&wire, &shared.plain),
            "a plain Bytes field is a copy"
        );
        // The plain decoder reads the same value.
        assert_eq!(decode::<Msg>(&wire).unwrap(), m);
        // Small ones are copied, so they do not keep the whole buffer alive.
        let m = Msg {
            n: 1,
            body: small.clone(),
            extra: None,
            plain: small,
        };
        let wire = Bytes::from(encode(&m).unwrap());
        let d: Msg = decode_shared(&wire).unwrap();
        assert_eq!(d, m);
        assert!(!within(&wire, &d.body));
        // Outside decode_shared nothing is shared (the source is cleared).
        assert!(SOURCE.with(|s| s.borrow().is_none()));
        let mut trailing = encode(&m).unwrap();
        trailing.push(0);
        assert!(matches!(
            decode_shared::<Msg>(&Bytes::from(trailing)),
            Err(StoreError::Corrupt(_))
        ));
    }

    #[test]
    fn a_heavy_encode_is_the_same_bytes_on_any_runtime_and_exactly_sized() {
        let big = (5u32, Bytes::from(vec![9u8; HEAVY_BYTES + 3]));
        let want = bincode::serde::encode_to_vec(&big, bincode::config::standard()).unwrap();
        let got = encode(&big).unwrap();
        assert_eq!(got, want);
        assert_eq!(got.capacity(), got.len(), "reserved at the encoded size");
        let multi = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .unwrap();
        let b = big.clone();
        assert_eq!(multi.block_on(async move { encode(&b).unwrap() }), want);
        let b = big.clone();
        let w = want.clone();
        multi.block_on(async move {
            // On a worker, and on a blocking thread.
            let on_worker = tokio::spawn(async move { encode(&b).unwrap() })
                .await
                .unwrap();
            assert_eq!(on_worker, w);
            let b = big.clone();
            let blocking = tokio::task::spawn_blocking(move || encode(&b).unwrap())
                .await
                .unwrap();
            assert_eq!(blocking, w);
        });
        let current = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let b = (5u32, Bytes::from(vec![9u8; HEAVY_BYTES + 3]));
        assert_eq!(current.block_on(async move { encode(&b).unwrap() }), want);
    }

    #[test]
    fn off_worker_lets_the_workers_other_tasks_run_meanwhile() {
        // One worker thread: run inline, `f` would wait for a task that
        // cannot be polled until `f` returns.
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .unwrap();
        let other_ran = rt.block_on(async {
            tokio::spawn(async {
                let (tx, rx) = std::sync::mpsc::channel();
                tokio::spawn(async move {
                    let _ = tx.send(());
                });
                off_worker(|| rx.recv_timeout(std::time::Duration::from_secs(5)).is_ok())
            })
            .await
            .unwrap()
        });
        assert!(
            other_ran,
            "the worker's other task ran while off_worker blocked"
        );
    }

    #[test]
    fn round_trip_and_trailing_bytes() {
        let v: (u64, String) = (7, "q".into());
        let mut b = encode(&v).unwrap();
        assert_eq!(decode::<(u64, String)>(&b).unwrap(), v);
        b.push(0);
        assert!(matches!(
            decode::<(u64, String)>(&b),
            Err(StoreError::Corrupt(_))
        ));
        assert!(decode::<(u64, String)>(&b[..1]).is_err());
    }
}
