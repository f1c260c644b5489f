//! Record framing of the node-wide write-ahead log (one format for every segment file).
//!
//! ```text
//! | len: u32 LE | crc: u32 LE | kind: u8 | group: u64 LE | index: u64 LE | payload: len bytes |
//! ```
//!
//! `crc` is CRC-32 (IEEE, `crc32fast`) over `kind..payload`. A record whose header or payload runs
//! past the end of the file, or whose CRC does not match, is *bad*. A bad record in the last
//! sync round's writes is a torn tail (a crash interrupted the write; nothing after it was ever
//! acknowledged, see `Wal::sync`); one that a later round's [`Kind::Mark`] follows was synced,
//! so it is corruption (see `Wal::open`).

use crate::GroupId;

/// Bytes before the payload.
pub(crate) const HEADER_BYTES: usize = 4 + 4 + 1 + 8 + 8;

/// Largest payload accepted when reading (guards recovery against a garbage length): 1 GiB.
const MAX_PAYLOAD: usize = 1 << 30;

/// What a record says. Per group, later records override earlier ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `index` is a log index; payload = codec(`openraft::Entry`). Replaces entries `>= index`.
    Entry = 1,
    /// Remove the entries `>= index` (openraft `truncate`). Empty payload.
    Truncate = 2,
    /// Remove the entries `<= index`; payload = codec(`LogId`) of the last purged entry.
    Purge = 3,
    /// Payload = codec(`Vote`).
    Vote = 4,
    /// Payload = codec(`Option<LogId>`), the committed log id.
    Committed = 5,
    /// The group is deleted with everything it had. Empty payload.
    Drop = 6,
    /// First record of every segment: the state of every live group (see `Checkpoint`); group
    /// and index are 0. Supersedes every non-entry record of earlier segments.
    Checkpoint = 7,
    /// All entries of the group, moved here (compaction): replaces every entry it had; `index`
    /// is the first one; payload = for each entry in order, `len: u32 LE` + codec(`Entry`).
    Rewrite = 8,
    /// First record of each sync round (after the segment's checkpoint when the round starts a
    /// segment): `index` = the round's ordinal, payload = the WAL incarnation's nonce (8 bytes
    /// LE, random per open, never sent to clients). A round's writes start only after the
    /// previous round's `fdatasync` returned, so a valid mark after a bad record proves the bad
    /// record was synced: corruption, not a torn tail. Group 0.
    Mark = 9,
}

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Entry,
            2 => Kind::Truncate,
            3 => Kind::Purge,
            4 => Kind::Vote,
            5 => Kind::Committed,
            6 => Kind::Drop,
            7 => Kind::Checkpoint,
            8 => Kind::Rewrite,
            9 => Kind::Mark,
            _ => return None,
        })
    }
}

/// Append one framed record to `buf`; returns the offset of its payload within `buf`.
///
/// Panics only if `payload` is larger than [`MAX_PAYLOAD_BYTES`]; `State::push` refuses such
/// entries first.
/// Largest record payload (bytes): the length field is 32 bits.
pub const MAX_PAYLOAD_BYTES: usize = u32::MAX as usize;

pub(crate) fn frame(
    buf: &mut Vec<u8>,
    kind: Kind,
    group: GroupId,
    index: u64,
    payload: &[u8],
) -> usize {
    buf.reserve(HEADER_BYTES + payload.len());
    let at = frame_header(buf, kind, group, index, payload);
    buf.extend_from_slice(payload);
    at
}

/// Append only the header of the record [`frame`] would append (its CRC covers `payload`),
/// for a payload written from where it already is; returns the offset `payload` must follow
/// at in `buf`'s stream.
///
/// Panics only if `payload` is larger than [`MAX_PAYLOAD_BYTES`].
pub(crate) fn frame_header(
    buf: &mut Vec<u8>,
    kind: Kind,
    group: GroupId,
    index: u64,
    payload: &[u8],
) -> usize {
    let len = u32::try_from(payload.len()).expect("WAL record payload of 4 GiB or more");
    let start = buf.len();
    buf.extend_from_slice(&len.to_le_bytes());
    buf.extend_from_slice(&[0; 4]);
    buf.push(kind as u8);
    buf.extend_from_slice(&group.to_le_bytes());
    buf.extend_from_slice(&index.to_le_bytes());
    let mut crc = crc32fast::Hasher::new();
    crc.update(&buf[start + 8..]);
    crc.update(payload);
    buf[start + 4..start + 8].copy_from_slice(&crc.finalize().to_le_bytes());
    start + HEADER_BYTES
}

/// One decoded record, borrowing its payload from the segment bytes.
#[derive(Debug)]
pub(crate) struct Record<'a> {
    pub kind: Kind,
    pub group: GroupId,
    pub index: u64,
    pub payload: &'a [u8],
    /// Offset of the payload in the segment.
    pub payload_at: usize,
    /// Offset of the next record.
    pub next: usize,
}

/// Parse the record at `at`. `Ok(None)` at the clean end (`at == buf.len()`); `Err(())` if the
/// record is torn (short, bad length, unknown kind or CRC mismatch).
pub(crate) fn parse(buf: &[u8], at: usize) -> Result<Option<Record<'_>>, ()> {
    if at == buf.len() {
        return Ok(None);
    }
    let head = buf.get(at..at + HEADER_BYTES).ok_or(())?;
    let le_u64 = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
    let len = u32::from_le_bytes(head[0..4].try_into().expect("4 bytes")) as usize;
    let crc = u32::from_le_bytes(head[4..8].try_into().expect("4 bytes"));
    if len > MAX_PAYLOAD {
        return Err(());
    }
    let end = at + HEADER_BYTES + len;
    let body = buf.get(at + 8..end).ok_or(())?;
    if crc32fast::hash(body) != crc {
        return Err(());
    }
    let kind = Kind::from_u8(head[8]).ok_or(())?;
    Ok(Some(Record {
        kind,
        group: le_u64(&head[9..17]),
        index: le_u64(&head[17..25]),
        payload: &buf[at + HEADER_BYTES..end],
        payload_at: at + HEADER_BYTES,
        next: end,
    }))
}

/// Payload bytes of a [`Kind::Mark`] record.
pub(crate) const MARK_PAYLOAD_BYTES: usize = 8;

/// The `(ordinal, nonce)` of a [`Kind::Mark`] record.
pub(crate) fn mark_of(r: &Record<'_>) -> Option<(u64, u64)> {
    (r.kind == Kind::Mark && r.group == 0)
        .then(|| <[u8; MARK_PAYLOAD_BYTES]>::try_from(r.payload).ok())
        .flatten()
        .map(|n| (r.index, u64::from_le_bytes(n)))
}

/// The first valid [`Kind::Mark`] record starting at an offset in `from..` of `buf` whose nonce
/// is one of `nonces`, found byte by byte (the record framing after a bad record is unknown):
/// `(offset, ordinal)`. Only candidates with a mark's kind, group and length are CRC-checked,
/// so the scan is linear; the nonce keeps mark-shaped bytes inside a client's message from
/// counting.
pub(crate) fn find_mark(buf: &[u8], from: usize, nonces: &[u64]) -> Option<(usize, u64)> {
    let mark_len = (MARK_PAYLOAD_BYTES as u32).to_le_bytes();
    let last = buf.len().checked_sub(HEADER_BYTES + MARK_PAYLOAD_BYTES)?;
    (from..=last)
        .filter(|&at| buf[at + 8] == Kind::Mark as u8 && buf[at..at + 4] == mark_len)
        .filter(|&at| buf[at + 9..at + 17] == [0; 8])
        .find_map(|at| {
            let r = parse(buf, at).ok()??;
            let (ordinal, nonce) = mark_of(&r)?;
            nonces.contains(&nonce).then_some((at, ordinal))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_parse_back_and_damage_is_torn() {
        let mut buf = Vec::new();
        let p1 = frame(&mut buf, Kind::Entry, 7, 42, b"hello");
        let p2 = frame(&mut buf, Kind::Drop, 9, 0, b"");
        let r1 = parse(&buf, 0).unwrap().unwrap();
        assert_eq!(
            (r1.kind, r1.group, r1.index, r1.payload),
            (Kind::Entry, 7, 42, &b"hello"[..])
        );
        assert_eq!(r1.payload_at, p1);
        let r2 = parse(&buf, r1.next).unwrap().unwrap();
        assert_eq!((r2.kind, r2.group, r2.payload_at), (Kind::Drop, 9, p2));
        assert!(parse(&buf, r2.next).unwrap().is_none());

        // every truncation of the second record is torn
        for cut in r1.next + 1..buf.len() {
            assert!(parse(&buf[..cut], r1.next).is_err(), "cut at {cut}");
        }
        // any flipped bit is torn
        for i in 0..r1.next {
            let mut bad = buf.clone();
            bad[i] ^= 0x10;
            assert!(parse(&bad, 0).is_err(), "flip at {i} went unnoticed");
        }
        // zero fill (an extended but unwritten file tail) is torn
        assert!(parse(&[0u8; 64], 0).is_err());
    }

    /// The scan finds a mark of a known nonce at any byte offset, skips marks of other nonces
    /// and damaged ones, and finds nothing in a message payload that merely holds a mark's bytes
    /// under another nonce.
    #[test]
    fn find_mark_needs_a_known_nonce_and_a_valid_crc() {
        let mut buf = vec![0xAB; 7];
        frame(&mut buf, Kind::Entry, 3, 1, b"payload");
        let forged_at = buf.len();
        frame(&mut buf, Kind::Mark, 0, 99, &5u64.to_le_bytes());
        let real_at = buf.len();
        frame(&mut buf, Kind::Mark, 0, 12, &42u64.to_le_bytes());
        assert_eq!(find_mark(&buf, 0, &[42]), Some((real_at, 12)));
        assert_eq!(find_mark(&buf, 0, &[5, 42]), Some((forged_at, 99)));
        assert_eq!(find_mark(&buf, real_at + 1, &[42]), None);
        assert_eq!(find_mark(&buf, 0, &[7]), None);
        let mut bad = buf.clone();
        bad[real_at + HEADER_BYTES] ^= 1;
        assert_eq!(
            find_mark(&bad, 0, &[42]),
            None,
            "a damaged mark is no evidence"
        );
        assert_eq!(find_mark(&buf[..real_at + 3], 0, &[42]), None);
    }
}
