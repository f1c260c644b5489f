//! The x-death rewrite on arbitrary client headers (counts at i64::MAX, wrong types, nested
//! tables, CC/BCC of any shape): it must produce a well-formed message, never panic.
#![no_main]
use amq_protocol::protocol::basic::AMQPProperties;
use amq_protocol::types::parsing::parse_field_table;
use libfuzzer_sys::fuzz_target;
use quorumq::amqp::codec::encode_properties;
use quorumq::dead_letter::rewrite::rewrite;
use quorumq::message::StoredMessage;
use quorumq::queue::types::{DeadLetterReason, DeadLetterTarget};

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let reason = match sel % 4 {
        0 => DeadLetterReason::Rejected,
        1 => DeadLetterReason::Expired,
        2 => DeadLetterReason::Maxlen,
        _ => DeadLetterReason::DeliveryLimit,
    };
    // Either raw property bytes or a header table built from the input.
    let properties = if sel & 0x80 != 0 {
        bytes::Bytes::copy_from_slice(rest)
    } else {
        let Ok((_, headers)) = parse_field_table(rest) else {
            return;
        };
        encode_properties(&AMQPProperties::default().with_headers(headers))
    };
    let msg = StoredMessage {
        exchange: "ex".into(),
        routing_key: "rk".into(),
        bcc: vec!["bcc".into()],
        properties,
        body: bytes::Bytes::from_static(b"body"),
    };
    let target = DeadLetterTarget {
        exchange: "dlx".into(),
        routing_key: (sel & 0x40 != 0).then(|| "dlrk".into()),
    };
    let out = rewrite(&msg.into(), "source-queue", reason, &target, u64::from(sel) << 20);
    assert!(!out.routing_keys.is_empty());
    assert!(!out.deaths.is_empty(), "the new death is recorded");
    let _ = amq_protocol::protocol::basic::parse_properties(&out.message.properties[..])
        .expect("rewritten properties parse");
});
