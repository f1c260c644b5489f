//! Field tables (queue, exchange and binding arguments) as the management API writes and
//! reads them in JSON. Source: RabbitMQ 3.10.8 `rabbit_mgmt_format:amqp_table/1` (AMQP →
//! JSON: numbers, strings, booleans, arrays and objects as they are) and
//! `rabbit_mgmt_util:args/1` (JSON → AMQP: an integer is a `long`, a float a `double`, a
//! string a `longstr`, `null` a `void`).

use amq_protocol::types::{AMQPValue, FieldArray, FieldTable, LongString};
use serde_json::{Map, Number, Value};

/// The JSON object of a field table (keys in the table's order).
pub fn table_to_json(t: &FieldTable) -> Value {
    Value::Object(
        t.inner()
            .iter()
            .map(|(k, v)| (k.as_str().to_owned(), value_to_json(v)))
            .collect::<Map<_, _>>(),
    )
}

/// One field value as JSON: byte strings as (lossy) UTF-8 text, a decimal as its number,
/// a timestamp as seconds, `void` as `null`.
pub fn value_to_json(v: &AMQPValue) -> Value {
    if let Some(i) = crate::meta::value::as_integer(v) {
        return i64::try_from(i)
            .map(Value::from)
            .unwrap_or_else(|_| Value::from(i as u64));
    }
    match v {
        AMQPValue::Boolean(b) => Value::Bool(*b),
        AMQPValue::Float(f) => float(f64::from(*f)),
        AMQPValue::Double(f) => float(*f),
        AMQPValue::DecimalValue(d) => float(f64::from(d.value) / 10f64.powi(i32::from(d.scale))),
        AMQPValue::Timestamp(t) => Value::from(*t),
        AMQPValue::ShortString(s) => Value::String(s.as_str().to_owned()),
        AMQPValue::LongString(s) => {
            Value::String(String::from_utf8_lossy(s.as_bytes()).into_owned())
        }
        AMQPValue::ByteArray(b) => {
            Value::String(String::from_utf8_lossy(b.as_slice()).into_owned())
        }
        AMQPValue::FieldArray(a) => Value::Array(a.as_slice().iter().map(value_to_json).collect()),
        AMQPValue::FieldTable(t) => table_to_json(t),
        _ => Value::Null,
    }
}

fn float(f: f64) -> Value {
    Number::from_f64(f)
        .map(Value::Number)
        .unwrap_or(Value::Null)
}

/// A JSON `arguments` object as a field table; `null` or absent is the empty table.
///
/// Errors: `arguments` is neither an object nor null (the reply text of a 400).
pub fn json_to_table(v: Option<&Value>) -> Result<FieldTable, String> {
    let mut t = FieldTable::default();
    match v {
        None | Some(Value::Null) => {}
        Some(Value::Object(m)) => {
            for (k, v) in m {
                t.insert(k.as_str().into(), json_to_value(v));
            }
        }
        Some(other) => return Err(format!("arguments must be an object, actually was {other}")),
    }
    Ok(t)
}

/// One JSON value as a field value (`rabbit_mgmt_util:args/1` types).
pub fn json_to_value(v: &Value) -> AMQPValue {
    match v {
        Value::Null => AMQPValue::Void,
        Value::Bool(b) => AMQPValue::Boolean(*b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => AMQPValue::LongLongInt(i),
            None => AMQPValue::Double(n.as_f64().unwrap_or(0.0)),
        },
        Value::String(s) => AMQPValue::LongString(LongString::from(s.as_str())),
        Value::Array(a) => AMQPValue::FieldArray(FieldArray::from(
            a.iter().map(json_to_value).collect::<Vec<_>>(),
        )),
        Value::Object(m) => {
            let mut t = FieldTable::default();
            for (k, v) in m {
                t.insert(k.as_str().into(), json_to_value(v));
            }
            AMQPValue::FieldTable(t)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn arguments_round_trip_with_rabbitmqs_types() {
        let j = json!({
            "x-queue-type": "quorum",
            "x-max-length": 10,
            "x-ratio": 0.5,
            "x-flag": true,
            "x-list": ["a", 1],
            "x-nested": {"k": "v"},
            "x-none": null
        });
        let t = json_to_table(Some(&j)).unwrap();
        assert_eq!(
            crate::meta::value::lookup(&t, "x-max-length"),
            Some(&AMQPValue::LongLongInt(10)),
            "an integer is a long"
        );
        assert_eq!(
            crate::meta::value::lookup(&t, "x-queue-type").map(crate::meta::value::type_name),
            Some("longstr")
        );
        assert_eq!(table_to_json(&t), j);
    }

    #[test]
    fn non_object_arguments_are_refused() {
        assert!(json_to_table(Some(&json!([1]))).is_err());
        assert!(json_to_table(Some(&json!(null)))
            .unwrap()
            .inner()
            .is_empty());
        assert!(json_to_table(None).unwrap().inner().is_empty());
    }
}
