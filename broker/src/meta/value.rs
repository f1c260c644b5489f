//! Field-table values seen the way RabbitMQ sees them: Erlang type names,
//! integer extraction, Erlang `==` on values, and Erlang `~p`/`~s` printing
//! (for error texts). Source: RabbitMQ 3.10.8 `rabbit_binary_parser` type
//! atoms, `rabbit_misc:type_class/1`, `rabbit_misc:val/1`.

use amq_protocol::types::{AMQPValue, FieldTable};

/// Erlang type atom RabbitMQ gives a field value (`longstr`, `signedint`,
/// `long`, `byte`, `short`, `unsignedbyte`, `unsignedshort`, `unsignedint`,
/// `float`, `double`, `decimal`, `timestamp`, `table`, `array`, `bool`,
/// `void`, `binary`). `ShortString` never comes off the wire; it is treated
/// as `longstr`.
pub fn type_name(v: &AMQPValue) -> &'static str {
    match v {
        AMQPValue::Boolean(_) => "bool",
        AMQPValue::ShortShortInt(_) => "byte",
        AMQPValue::ShortShortUInt(_) => "unsignedbyte",
        AMQPValue::ShortInt(_) => "short",
        AMQPValue::ShortUInt(_) => "unsignedshort",
        AMQPValue::LongInt(_) => "signedint",
        AMQPValue::LongUInt(_) => "unsignedint",
        AMQPValue::LongLongInt(_) => "long",
        AMQPValue::Float(_) => "float",
        AMQPValue::Double(_) => "double",
        AMQPValue::DecimalValue(_) => "decimal",
        AMQPValue::ShortString(_) | AMQPValue::LongString(_) => "longstr",
        AMQPValue::FieldArray(_) => "array",
        AMQPValue::Timestamp(_) => "timestamp",
        AMQPValue::FieldTable(_) => "table",
        AMQPValue::ByteArray(_) => "binary",
        AMQPValue::Void => "void",
    }
}

/// Value of one of RabbitMQ's `?INTEGER_ARG_TYPES` (b B s u I i l); None for
/// every other type (timestamp, float and decimal included). Spec §1.1.
pub fn as_integer(v: &AMQPValue) -> Option<i128> {
    match v {
        AMQPValue::ShortShortInt(x) => Some(i128::from(*x)),
        AMQPValue::ShortShortUInt(x) => Some(i128::from(*x)),
        AMQPValue::ShortInt(x) => Some(i128::from(*x)),
        AMQPValue::ShortUInt(x) => Some(i128::from(*x)),
        AMQPValue::LongInt(x) => Some(i128::from(*x)),
        AMQPValue::LongUInt(x) => Some(i128::from(*x)),
        AMQPValue::LongLongInt(x) => Some(i128::from(*x)),
        _ => None,
    }
}

/// The string content of a `longstr` (or short string) value, lossily decoded.
pub fn as_longstr(v: &AMQPValue) -> Option<String> {
    match v {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_owned()),
        _ => None,
    }
}

/// Looks a key up in a field table.
pub fn lookup<'a>(t: &'a FieldTable, key: &str) -> Option<&'a AMQPValue> {
    t.inner().get(key)
}

/// `rabbit_misc:type_class/1`: integer types and decimal are `int`, float and
/// double are `float`, anything else is its own class.
pub fn type_class(v: &AMQPValue) -> &'static str {
    match v {
        AMQPValue::ShortShortInt(_)
        | AMQPValue::ShortShortUInt(_)
        | AMQPValue::ShortInt(_)
        | AMQPValue::ShortUInt(_)
        | AMQPValue::LongInt(_)
        | AMQPValue::LongUInt(_)
        | AMQPValue::LongLongInt(_)
        | AMQPValue::DecimalValue(_) => "int",
        AMQPValue::Float(_) | AMQPValue::Double(_) => "float",
        other => type_name(other),
    }
}

enum Num {
    Int(i128),
    Float(f64),
}

fn num(v: &AMQPValue) -> Option<Num> {
    match v {
        AMQPValue::Float(f) => Some(Num::Float(f64::from(*f))),
        AMQPValue::Double(f) => Some(Num::Float(*f)),
        AMQPValue::Timestamp(t) => Some(Num::Int(i128::from(*t))),
        other => as_integer(other).map(Num::Int),
    }
}

fn bytes(v: &AMQPValue) -> Option<&[u8]> {
    match v {
        AMQPValue::LongString(s) => Some(s.as_bytes()),
        AMQPValue::ShortString(s) => Some(s.as_str().as_bytes()),
        AMQPValue::ByteArray(b) => Some(b.as_slice()),
        _ => None,
    }
}

/// Erlang `==` on the two *values* (types not compared at the top level):
/// numbers by value (`5 == 5.0`, timestamps are integers), binaries by bytes
/// (longstr and byte-array alike), arrays and tables element-wise including
/// the element types. Used by the headers exchange (`PV == DV`) and by
/// redeclare equivalence after the type-class check.
pub fn erl_eq(a: &AMQPValue, b: &AMQPValue) -> bool {
    if let (Some(x), Some(y)) = (num(a), num(b)) {
        return match (x, y) {
            (Num::Int(x), Num::Int(y)) => x == y,
            (Num::Int(x), Num::Float(y)) | (Num::Float(y), Num::Int(x)) => (x as f64) == y,
            (Num::Float(x), Num::Float(y)) => x == y,
        };
    }
    if let (Some(x), Some(y)) = (bytes(a), bytes(b)) {
        return x == y;
    }
    match (a, b) {
        (AMQPValue::Boolean(x), AMQPValue::Boolean(y)) => x == y,
        (AMQPValue::Void, AMQPValue::Void) => true,
        (AMQPValue::DecimalValue(x), AMQPValue::DecimalValue(y)) => x == y,
        (AMQPValue::FieldArray(x), AMQPValue::FieldArray(y)) => {
            let (x, y) = (x.as_slice(), y.as_slice());
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| typed_eq(p, q))
        }
        (AMQPValue::FieldTable(x), AMQPValue::FieldTable(y)) => tables_eq(x, y),
        _ => false,
    }
}

/// `{Type, Value} == {Type, Value}` in Erlang: same type atom, `==` values.
fn typed_eq(a: &AMQPValue, b: &AMQPValue) -> bool {
    type_name(a) == type_name(b) && erl_eq(a, b)
}

/// Table equality as Erlang compares two (sorted) tables.
pub fn tables_eq(x: &FieldTable, y: &FieldTable) -> bool {
    x.inner().len() == y.inner().len()
        && x.inner()
            .iter()
            .zip(y.inner())
            .all(|((ka, va), (kb, vb))| ka == kb && typed_eq(va, vb))
}

/// Erlang `~p` of a string (a char list): `"abc"` with `"` and `\` escaped;
/// non-printable content prints as a list of integers, as Erlang does.
pub fn erl_string(s: &[u8]) -> String {
    let printable = s
        .iter()
        .all(|&c| (32..127).contains(&c) || c == b'\n' || c == b'\t' || c == b'\r');
    if printable {
        let mut out = String::from("\"");
        for &c in s {
            match c {
                b'"' => out.push_str("\\\""),
                b'\\' => out.push_str("\\\\"),
                b'\n' => out.push_str("\\n"),
                b'\t' => out.push_str("\\t"),
                b'\r' => out.push_str("\\r"),
                c => out.push(char::from(c)),
            }
        }
        out.push('"');
        out
    } else {
        let parts: Vec<String> = s.iter().map(|c| c.to_string()).collect();
        format!("[{}]", parts.join(","))
    }
}

/// Erlang `~p` of a binary: `<<"abc">>` (non-printable: `<<1,2,3>>`).
pub fn erl_binary(s: &[u8]) -> String {
    let p = erl_string(s);
    if p.starts_with('"') {
        format!("<<{p}>>")
    } else {
        let parts: Vec<String> = s.iter().map(|c| c.to_string()).collect();
        format!("<<{}>>", parts.join(","))
    }
}

/// Erlang `~p` of a float (shortest round-trip form, always with a `.`).
pub fn erl_float(f: f64) -> String {
    let s = format!("{f:?}");
    if let Some((m, e)) = s.split_once('e') {
        let m = if m.contains('.') {
            m.to_owned()
        } else {
            format!("{m}.0")
        };
        format!("{m}e{e}")
    } else {
        s
    }
}

/// Erlang `~p` of the value part of a field (binaries as `<<"..">>`,
/// integers, floats, `true`/`false`, arrays and tables as RabbitMQ's
/// `{Type,Value}` lists).
pub fn erl_p(v: &AMQPValue) -> String {
    if let Some(b) = bytes(v) {
        return erl_binary(b);
    }
    match v {
        AMQPValue::Boolean(b) => b.to_string(),
        AMQPValue::Float(f) => erl_float(f64::from(*f)),
        AMQPValue::Double(f) => erl_float(*f),
        AMQPValue::DecimalValue(d) => format!("{{{},{}}}", d.scale, d.value),
        AMQPValue::Timestamp(t) => t.to_string(),
        AMQPValue::Void => "undefined".to_owned(),
        AMQPValue::FieldArray(a) => {
            let parts: Vec<String> = a
                .as_slice()
                .iter()
                .map(|e| format!("{{{},{}}}", type_name(e), erl_p(e)))
                .collect();
            format!("[{}]", parts.join(","))
        }
        AMQPValue::FieldTable(t) => {
            let parts: Vec<String> = t
                .inner()
                .iter()
                .map(|(k, e)| {
                    format!(
                        "{{{},{},{}}}",
                        erl_binary(k.as_str().as_bytes()),
                        type_name(e),
                        erl_p(e)
                    )
                })
                .collect();
            format!("[{}]", parts.join(","))
        }
        other => as_integer(other).map(|i| i.to_string()).unwrap_or_default(),
    }
}

/// The value as `~s` if it is a binary, else `~p` (`rabbit_misc:val/1`).
pub fn erl_s_or_p(v: &AMQPValue) -> String {
    match bytes(v) {
        Some(b) => String::from_utf8_lossy(b).into_owned(),
        None => erl_p(v),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use amq_protocol::types::{FieldArray, LongString};

    #[test]
    fn integers_compare_by_value_across_types() {
        assert!(erl_eq(
            &AMQPValue::ShortShortInt(5),
            &AMQPValue::LongLongInt(5)
        ));
        assert!(erl_eq(&AMQPValue::LongUInt(5), &AMQPValue::Double(5.0)));
        assert!(!erl_eq(
            &AMQPValue::LongInt(5),
            &AMQPValue::LongString(LongString::from("5"))
        ));
        let a1 = AMQPValue::FieldArray(FieldArray::from(vec![AMQPValue::LongInt(1)]));
        let a2 = AMQPValue::FieldArray(FieldArray::from(vec![AMQPValue::LongLongInt(1)]));
        assert!(!erl_eq(&a1, &a2), "array elements keep their type tags");
    }

    #[test]
    fn printing() {
        assert_eq!(erl_string(b"abc"), "\"abc\"");
        assert_eq!(erl_binary(b"foo"), "<<\"foo\">>");
        assert_eq!(erl_float(1.5), "1.5");
        assert_eq!(erl_float(1e21), "1.0e21");
        assert_eq!(erl_p(&AMQPValue::LongInt(-5)), "-5");
    }
}
