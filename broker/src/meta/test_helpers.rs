//! Helpers shared by the meta unit tests: argument tables and header values in
//! the shapes clients send them.

use amq_protocol::types::{AMQPValue, FieldTable, LongString, ShortString};

/// A field table of `pairs` (queue.declare arguments, message headers); a later
/// pair replaces an earlier one with the same key.
pub(crate) fn t(pairs: &[(&str, AMQPValue)]) -> FieldTable {
    let mut f = FieldTable::default();
    for (k, v) in pairs {
        f.insert(ShortString::from(*k), v.clone());
    }
    f
}

/// A longstr value, as clients send text arguments and headers.
pub(crate) fn s(x: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(x))
}
