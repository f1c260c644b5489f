//! A message as `quorumqctl peek` prints it: one item of RabbitMQ's
//! `POST /api/queues/{vhost}/{name}/get` reply (`rabbit_mgmt_wm_queue_get`
//! with `encoding: auto`; properties as `rabbit_mgmt_format:basic_properties/1`).

use amq_protocol::protocol::basic::{self, AMQPProperties};
use amq_protocol::types::{AMQPValue, FieldTable};
use base64::Engine;
use serde_json::{json, Map, Value};

use crate::http::json::table_to_json;
use crate::message::StoredMessage;

/// The JSON of `msg` at a peeked position: `payload_bytes`, `redelivered`
/// (`delivery_count` > 0), `exchange`, `routing_key`, `message_count`
/// (ready messages behind it: what a basic.get of it would report),
/// `properties` (with `headers`; a quorum queue adds `x-delivery-count`,
/// as RabbitMQ's peek and basic.get do when `counts_deliveries`),
/// `payload` (UTF-8 text when the body is, else base64) and
/// `payload_encoding` (`string` or `base64`). Property bytes that do not
/// parse give empty properties.
pub fn message_json(
    msg: &StoredMessage,
    delivery_count: u32,
    message_count: u64,
    counts_deliveries: bool,
) -> Value {
    get_item_json(
        msg,
        delivery_count,
        message_count,
        counts_deliveries,
        PayloadEncoding::Auto,
        None,
    )
}

/// How a `get` reply writes the payload (`encoding` of `POST /api/queues/{vhost}/{name}/get`,
/// RabbitMQ 3.10.8 `rabbit_mgmt_wm_queue_get:payload_part/2`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadEncoding {
    /// UTF-8 text as it is (`payload_encoding: string`), other bytes as base64.
    Auto,
    /// Always base64.
    Base64,
}

/// As [`message_json`], with the payload written as `encoding` asks and cut to its first
/// `truncate` bytes (`payload_bytes` stays the whole body's size; a cut inside a UTF-8
/// character makes the text base64, as RabbitMQ's `is_utf8` check of the cut bytes).
pub fn get_item_json(
    msg: &StoredMessage,
    delivery_count: u32,
    message_count: u64,
    counts_deliveries: bool,
    encoding: PayloadEncoding,
    truncate: Option<usize>,
) -> Value {
    let mut props = basic::parse_properties(&msg.properties[..])
        .map(|(_, p)| p)
        .unwrap_or_default();
    if counts_deliveries {
        let mut headers = props.headers().clone().unwrap_or_default();
        headers.insert(
            "x-delivery-count".into(),
            AMQPValue::LongLongInt(i64::from(delivery_count)),
        );
        props = props.with_headers(headers);
    }
    let body = match truncate {
        Some(n) if n < msg.body.len() => &msg.body[..n],
        _ => &msg.body[..],
    };
    let text = match encoding {
        PayloadEncoding::Auto => std::str::from_utf8(body).ok(),
        PayloadEncoding::Base64 => None,
    };
    let (payload, encoding) = match text {
        Some(text) => (text.to_string(), "string"),
        None => (
            base64::engine::general_purpose::STANDARD.encode(body),
            "base64",
        ),
    };
    json!({
        "payload_bytes": msg.body.len(),
        "redelivered": delivery_count > 0,
        "exchange": msg.exchange,
        "routing_key": msg.routing_key,
        "message_count": message_count,
        "properties": properties_json(&props),
        "payload": payload,
        "payload_encoding": encoding,
    })
}

/// The set basic properties by their management API names (unset ones left out;
/// `rabbit_mgmt_format:basic_properties/1`).
pub fn properties_json(p: &AMQPProperties) -> Value {
    let mut m = Map::new();
    let mut put = |k: &str, v: Option<Value>| {
        if let Some(v) = v {
            m.insert(k.to_string(), v);
        }
    };
    let s =
        |v: &Option<amq_protocol::types::ShortString>| v.as_ref().map(|s| Value::from(s.as_str()));
    put("content_type", s(p.content_type()));
    put("content_encoding", s(p.content_encoding()));
    put("headers", p.headers().as_ref().map(headers_json));
    put("delivery_mode", p.delivery_mode().map(Value::from));
    put("priority", p.priority().map(Value::from));
    put("correlation_id", s(p.correlation_id()));
    put("reply_to", s(p.reply_to()));
    put("expiration", s(p.expiration()));
    put("message_id", s(p.message_id()));
    put("timestamp", p.timestamp().map(Value::from));
    put("type", s(p.kind()));
    put("user_id", s(p.user_id()));
    put("app_id", s(p.app_id()));
    put("cluster_id", s(p.cluster_id()));
    Value::Object(m)
}

fn headers_json(h: &FieldTable) -> Value {
    table_to_json(h)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::amqp::codec::encode_properties;
    use bytes::Bytes;

    fn stored(body: &'static [u8], props: AMQPProperties) -> StoredMessage {
        StoredMessage {
            exchange: "ex".into(),
            routing_key: "rk".into(),
            bcc: Vec::new(),
            properties: encode_properties(&props),
            body: Bytes::from_static(body),
        }
    }

    #[test]
    fn text_body_with_headers_and_delivery_count() {
        let mut h = FieldTable::default();
        h.insert("n".into(), AMQPValue::LongInt(7));
        let p = AMQPProperties::default()
            .with_content_type("text/plain".into())
            .with_headers(h);
        let v = message_json(&stored(b"hello", p), 2, 5, true);
        assert_eq!(v["payload"], "hello");
        assert_eq!(v["payload_encoding"], "string");
        assert_eq!(v["payload_bytes"], 5);
        assert_eq!(v["redelivered"], true);
        assert_eq!(v["exchange"], "ex");
        assert_eq!(v["routing_key"], "rk");
        assert_eq!(v["message_count"], 5);
        assert_eq!(v["properties"]["content_type"], "text/plain");
        assert_eq!(v["properties"]["headers"]["n"], 7);
        assert_eq!(v["properties"]["headers"]["x-delivery-count"], 2);
    }

    #[test]
    fn binary_body_is_base64_and_classic_has_no_delivery_count() {
        let v = message_json(
            &stored(&[0xff, 0x00], AMQPProperties::default()),
            0,
            0,
            false,
        );
        assert_eq!(v["payload"], "/wA=");
        assert_eq!(v["payload_encoding"], "base64");
        assert_eq!(v["redelivered"], false);
        assert!(v["properties"].get("headers").is_none());
    }

    #[test]
    fn base64_encoding_and_truncation() {
        let m = stored("héllo".as_bytes(), AMQPProperties::default());
        let v = get_item_json(&m, 0, 0, false, PayloadEncoding::Base64, None);
        assert_eq!(v["payload"], "aMOpbGxv");
        assert_eq!(v["payload_encoding"], "base64");
        let v = get_item_json(&m, 0, 0, false, PayloadEncoding::Auto, Some(4));
        assert_eq!(v["payload"], "hél");
        assert_eq!(v["payload_bytes"], 6, "the whole body's size");
        // A cut inside `é` is not UTF-8 text any more.
        let v = get_item_json(&m, 0, 0, false, PayloadEncoding::Auto, Some(2));
        assert_eq!(v["payload_encoding"], "base64");
        assert_eq!(v["payload"], "aMM=");
    }
}
