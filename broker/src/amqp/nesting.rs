//! The nesting limit on field tables and arrays a client sends.
//!
//! `amq-protocol` parses field tables recursively, one Rust call chain per
//! level, and a table nested in an array nested in a table costs only five
//! bytes a level: a 15 KiB `connection.start-ok`, sent before any
//! authentication, overflowed a tokio worker's 2 MiB stack and aborted the
//! whole broker. Every table a client can send is walked here first, without
//! recursion, and a frame whose tables nest deeper than [`MAX_DEPTH`] is
//! refused before the parser sees it (`codec::FrameReader`; the AMQPLAIN
//! login table in `connection`).
//!
//! RabbitMQ 3.10.8 has no such limit (its parser runs on an Erlang process
//! heap); real tables nest a few levels (an `x-death` header is three).

/// The deepest nesting of field tables and arrays accepted, counting the
/// outermost table as 1. A deeper frame is a 502 SYNTAX_ERROR.
pub const MAX_DEPTH: usize = 64;

/// The fewest bytes a field table nested deeper than [`MAX_DEPTH`] takes:
/// its length (4), one key (1), then a type octet and a length (5) for each
/// of `MAX_DEPTH` containers below it.
const SMALLEST_TOO_DEEP: usize = 4 + 1 + 5 * MAX_DEPTH;

/// Where the tables sit in a frame payload, so that they can be walked
/// before `amq-protocol` parses them.
enum Field {
    /// 16-bit integer (the `reserved-1` ticket).
    Short,
    /// Length-prefixed short string.
    ShortStr,
    /// One octet: packed bits, or a version number.
    Octet,
    /// Field table: walked for depth.
    Table,
}

/// The fields that precede and include the field table of every AMQP 0-9-1
/// method with one (class id, method id), per `amq-protocol`'s generated
/// parsers; methods without a table are `None`.
fn method_layout(class: u16, method: u16) -> Option<&'static [Field]> {
    use Field::*;
    Some(match (class, method) {
        // connection.start: version-major, version-minor, server-properties.
        (10, 10) => &[Octet, Octet, Table],
        // connection.start-ok: client-properties first.
        (10, 11) => &[Table],
        // exchange.declare: ticket, exchange, type, flags, arguments.
        (40, 10) => &[Short, ShortStr, ShortStr, Octet, Table],
        // exchange.bind / exchange.unbind: ticket, destination, source, routing key, no-wait, arguments.
        (40, 30) | (40, 40) => &[Short, ShortStr, ShortStr, ShortStr, Octet, Table],
        // queue.declare: ticket, queue, flags, arguments.
        (50, 10) => &[Short, ShortStr, Octet, Table],
        // queue.bind: ticket, queue, exchange, routing key, no-wait, arguments.
        (50, 20) => &[Short, ShortStr, ShortStr, ShortStr, Octet, Table],
        // queue.unbind: ticket, queue, exchange, routing key, arguments (no no-wait).
        (50, 50) => &[Short, ShortStr, ShortStr, ShortStr, Table],
        // basic.consume: ticket, queue, consumer tag, flags, arguments.
        (60, 20) => &[Short, ShortStr, ShortStr, Octet, Table],
        _ => return None,
    })
}

/// Whether the tables in a method frame's payload (class id, method id,
/// arguments) nest at most [`MAX_DEPTH`] deep.
///
/// `false` only for a frame that nests too deep. A payload malformed before
/// it gets too deep is `true`: the parser refuses it with a syntax error
/// without going deeper than this walk did.
pub fn method_within_limit(payload: &[u8]) -> bool {
    let [c0, c1, m0, m1, ..] = *payload else {
        return true;
    };
    let Some(layout) = method_layout(u16::from_be_bytes([c0, c1]), u16::from_be_bytes([m0, m1]))
    else {
        return true;
    };
    let mut pos = 4;
    for field in layout {
        let next = match field {
            Field::Short => Some(pos + 2),
            Field::Octet => Some(pos + 1),
            Field::ShortStr => payload.get(pos).map(|&n| pos + 1 + usize::from(n)),
            Field::Table => return payload.get(pos..).is_none_or(table_within_limit),
        };
        match next {
            Some(n) if n <= payload.len() => pos = n,
            _ => return true,
        }
    }
    true
}

/// Whether a content header payload's `headers` table (class basic, after
/// content-type and content-encoding) nests at most [`MAX_DEPTH`] deep.
/// `payload` is the whole header payload: class id, weight, body size, then
/// the property flags and fields. Malformed input is `true`, as for
/// [`method_within_limit`].
pub fn properties_within_limit(payload: &[u8]) -> bool {
    let Some(props) = payload.get(12..) else {
        return true;
    };
    let [f0, f1, ..] = *props else {
        return true;
    };
    let flags = u16::from_be_bytes([f0, f1]);
    if flags & (1 << 13) == 0 {
        return true;
    }
    let mut pos = 2;
    // content-type (bit 15) and content-encoding (bit 14), both short strings.
    for bit in [15, 14] {
        if flags & (1 << bit) != 0 {
            match props.get(pos) {
                Some(&n) => pos += 1 + usize::from(n),
                None => return true,
            }
        }
    }
    props.get(pos..).is_none_or(table_within_limit)
}

/// Whether the field table at the start of `bytes` (its 4-byte length
/// first) nests at most [`MAX_DEPTH`] deep; for tables parsed outside a
/// frame, such as an AMQPLAIN login response.
///
/// Walks the table depth first, in the order the parser reads it, with an
/// explicit stack: `false` as soon as a table or array opens more than
/// [`MAX_DEPTH`] levels down, `true` when the walk ends or meets bytes the
/// parser would refuse at the same point.
pub fn table_within_limit(bytes: &[u8]) -> bool {
    // Each level below the table costs at least 5 bytes (type octet and
    // length): a table in fewer bytes than this cannot nest too deep, and
    // most headers are that small, so the walk is skipped on their publishes.
    if bytes.len() < SMALLEST_TOO_DEEP {
        return true;
    }
    /// An open container: where its bytes end, and whether its entries have keys.
    struct Open {
        end: usize,
        table: bool,
    }
    let long = |pos: usize| -> Option<usize> {
        let b = bytes.get(pos..pos + 4)?;
        Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
    };
    let Some(len) = long(0) else {
        return true;
    };
    let mut stack = vec![Open {
        end: 4 + len,
        table: true,
    }];
    let mut pos = 4;
    while let Some(open) = stack.last() {
        if open.end > bytes.len() {
            // The parser cannot take the container's bytes: it stops here.
            return true;
        }
        if pos == open.end {
            stack.pop();
            continue;
        }
        let end = open.end;
        if open.table {
            // The key: a short string.
            let key_len = usize::from(bytes[pos]);
            pos += 1 + key_len;
        }
        let Some(&kind) = bytes.get(pos).filter(|_| pos < end) else {
            return true;
        };
        pos += 1;
        let size = match kind {
            b'V' => 0,
            b't' | b'b' | b'B' => 1,
            b's' | b'U' | b'u' => 2,
            b'I' | b'i' | b'f' => 4,
            b'D' => 5,
            b'L' | b'l' | b'd' | b'T' => 8,
            b'S' | b'x' => match long(pos) {
                Some(n) => 4 + n,
                None => return true,
            },
            b'A' | b'F' => {
                let Some(n) = long(pos) else {
                    return true;
                };
                if stack.len() == MAX_DEPTH {
                    return false;
                }
                pos += 4;
                if pos + n > end {
                    return true;
                }
                stack.push(Open {
                    end: pos + n,
                    table: kind == b'F',
                });
                continue;
            }
            // An unknown type octet: the parser refuses it.
            _ => return true,
        };
        pos += size;
        if pos > end {
            return true;
        }
    }
    true
}

/// A field value of `levels` empty-ended arrays, each holding the next:
/// five bytes a level, the cheapest nesting a client can send.
#[cfg(test)]
pub(crate) fn nested_arrays(levels: usize) -> Vec<u8> {
    let mut value = b"A\0\0\0\0".to_vec();
    for _ in 1..levels {
        let mut outer = vec![b'A'];
        outer.extend_from_slice(&(value.len() as u32).to_be_bytes());
        outer.extend_from_slice(&value);
        value = outer;
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;
    use amq_protocol::protocol::{basic, queue, AMQPClass};
    use amq_protocol::types::{AMQPValue, FieldArray, FieldTable, LongString};

    /// A table whose key `k` holds `depth - 1` levels of alternately nested
    /// arrays and tables (so the whole value is `depth` deep).
    fn nested(depth: usize) -> FieldTable {
        let mut value = AMQPValue::LongString(LongString::from("leaf"));
        for level in 1..depth {
            value = if level % 2 == 1 {
                AMQPValue::FieldArray(FieldArray::from(vec![AMQPValue::Boolean(true), value]))
            } else {
                let mut t = FieldTable::default();
                t.insert("n".into(), AMQPValue::LongLongInt(7));
                t.insert("x".into(), value);
                AMQPValue::FieldTable(t)
            };
        }
        let mut table = FieldTable::default();
        table.insert("a".into(), AMQPValue::Double(1.5));
        table.insert("k".into(), value);
        table
    }

    fn declare(args: FieldTable) -> Vec<u8> {
        let class = AMQPClass::Queue(queue::AMQPMethod::Declare(queue::Declare {
            queue: "q".into(),
            durable: true,
            arguments: args,
            ..Default::default()
        }));
        cookie_factory::gen_simple(amq_protocol::protocol::gen_class(&class), Vec::new())
            .expect("encodes")
    }

    fn header(headers: FieldTable) -> Vec<u8> {
        let props = basic::AMQPProperties::default()
            .with_content_type("text/plain".into())
            .with_headers(headers)
            .with_delivery_mode(2);
        let mut payload = vec![0, 60, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5];
        payload.extend_from_slice(&crate::amqp::codec::encode_properties(&props));
        payload
    }

    #[test]
    fn the_limit_is_exact_for_methods_and_content_headers() {
        assert!(method_within_limit(&declare(nested(MAX_DEPTH))));
        assert!(!method_within_limit(&declare(nested(MAX_DEPTH + 1))));
        assert!(properties_within_limit(&header(nested(MAX_DEPTH))));
        assert!(!properties_within_limit(&header(nested(MAX_DEPTH + 1))));
    }

    #[test]
    fn the_smallest_table_too_deep_is_walked_and_refused() {
        // An empty key, then `levels` arrays in each other.
        let table = |levels| {
            let inner = nested_arrays(levels);
            let mut table = ((1 + inner.len()) as u32).to_be_bytes().to_vec();
            table.push(0);
            table.extend_from_slice(&inner);
            table
        };
        let too_deep = table(MAX_DEPTH);
        assert_eq!(too_deep.len(), SMALLEST_TOO_DEEP);
        assert!(!table_within_limit(&too_deep));
        // One level less fits, and is one level (5 bytes) shorter.
        assert!(table_within_limit(&table(MAX_DEPTH - 1)));
    }

    #[test]
    fn every_method_with_a_table_is_walked_where_its_table_is() {
        use amq_protocol::protocol::{connection, exchange};
        let deep = || nested(MAX_DEPTH + 1);
        let methods = [
            AMQPClass::Connection(connection::AMQPMethod::Start(connection::Start {
                version_major: 0,
                version_minor: 9,
                server_properties: deep(),
                mechanisms: "PLAIN".into(),
                locales: "en_US".into(),
            })),
            AMQPClass::Connection(connection::AMQPMethod::StartOk(connection::StartOk {
                client_properties: deep(),
                mechanism: "PLAIN".into(),
                response: "\0guest\0guest".into(),
                locale: "en_US".into(),
            })),
            AMQPClass::Exchange(exchange::AMQPMethod::Declare(exchange::Declare {
                exchange: "e".into(),
                kind: "topic".into(),
                arguments: deep(),
                ..Default::default()
            })),
            AMQPClass::Exchange(exchange::AMQPMethod::Bind(exchange::Bind {
                destination: "d".into(),
                source: "s".into(),
                routing_key: "r".into(),
                nowait: false,
                arguments: deep(),
            })),
            AMQPClass::Exchange(exchange::AMQPMethod::Unbind(exchange::Unbind {
                destination: "d".into(),
                source: "s".into(),
                routing_key: "r".into(),
                nowait: false,
                arguments: deep(),
            })),
            AMQPClass::Queue(queue::AMQPMethod::Declare(queue::Declare {
                queue: "q".into(),
                arguments: deep(),
                ..Default::default()
            })),
            AMQPClass::Queue(queue::AMQPMethod::Bind(queue::Bind {
                queue: "q".into(),
                exchange: "e".into(),
                routing_key: "r".into(),
                nowait: false,
                arguments: deep(),
            })),
            AMQPClass::Queue(queue::AMQPMethod::Unbind(queue::Unbind {
                queue: "q".into(),
                exchange: "e".into(),
                routing_key: "r".into(),
                arguments: deep(),
            })),
            AMQPClass::Basic(basic::AMQPMethod::Consume(basic::Consume {
                queue: "q".into(),
                consumer_tag: "c".into(),
                no_local: false,
                no_ack: true,
                exclusive: false,
                nowait: false,
                arguments: deep(),
            })),
        ];
        for class in methods {
            let bytes =
                cookie_factory::gen_simple(amq_protocol::protocol::gen_class(&class), Vec::new())
                    .expect("encodes");
            assert!(!method_within_limit(&bytes), "{class:?} passed the walk");
        }
    }

    #[test]
    fn every_value_type_is_stepped_over() {
        use amq_protocol::types::{ByteArray, DecimalValue};
        let mut t = FieldTable::default();
        for (i, v) in [
            AMQPValue::Boolean(true),
            AMQPValue::ShortShortInt(-1),
            AMQPValue::ShortShortUInt(1),
            AMQPValue::ShortInt(-2),
            AMQPValue::ShortUInt(2),
            AMQPValue::LongInt(-3),
            AMQPValue::LongUInt(3),
            AMQPValue::LongLongInt(-4),
            AMQPValue::Float(1.0),
            AMQPValue::Double(2.0),
            AMQPValue::DecimalValue(DecimalValue { scale: 1, value: 5 }),
            AMQPValue::LongString("s".into()),
            AMQPValue::Timestamp(6),
            AMQPValue::ByteArray(ByteArray::from(vec![1, 2, 3])),
            AMQPValue::Void,
        ]
        .into_iter()
        .enumerate()
        {
            t.insert(format!("v{i}").into(), v);
        }
        // Every scalar before the deep value: a mis-sized step would lose the way to it.
        let deep = nested(MAX_DEPTH + 1);
        let deep_value = deep.inner().get("k").expect("the nested value").clone();
        t.insert("zz".into(), deep_value);
        assert!(!method_within_limit(&declare(t)));
    }

    #[test]
    fn malformed_bytes_are_left_to_the_parser() {
        let good = declare(nested(3));
        for cut in 0..good.len() {
            assert!(method_within_limit(&good[..cut]));
        }
        let mut unknown = declare(nested(3));
        let at = unknown
            .iter()
            .rposition(|&b| b == b'S')
            .expect("a long string");
        unknown[at] = b'?';
        assert!(method_within_limit(&unknown));
        assert!(properties_within_limit(&[0, 60]));
    }

    proptest::proptest! {
        /// Whatever the bytes, the walk ends without a panic.
        #[test]
        fn the_walk_never_panics(data in proptest::collection::vec(proptest::num::u8::ANY, 0..256)) {
            let _ = method_within_limit(&data);
            let _ = properties_within_limit(&data);
            let _ = table_within_limit(&data);
        }
    }
}
