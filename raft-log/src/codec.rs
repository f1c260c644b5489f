//! The one place the on-disk/on-wire byte format of `raft-log` lives: bincode 2.0.1 with
//! `bincode::config::standard()` (varint, little-endian) over serde.
//!
//! bincode 2 cannot decode `deserialize_any` shapes (`#[serde(untagged)]`, `#[serde(flatten)]`);
//! openraft 0.9.25 types only use those under its `compat` feature, which we do not enable
//! (architecture-anchors §2.6). Persisted records that may evolve are versioned enums.

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::StoreError;

/// Encode `v` with the bincode 2 standard config.
///
/// Errors: [`StoreError::Encode`] if serde/bincode rejects the value.
pub fn encode<T: Serialize>(v: &T) -> Result<Vec<u8>, StoreError> {
    Ok(bincode::serde::encode_to_vec(
        v,
        bincode::config::standard(),
    )?)
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
