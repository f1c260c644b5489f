//! AMQP field-table decoding (headers, queue arguments, client properties): any bytes
//! decode or fail cleanly, and what decodes re-encodes to bytes that decode and re-encode the same.
#![no_main]
use amq_protocol::types::{generation::gen_field_table, parsing::parse_field_table};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok((_, table)) = parse_field_table(data) else {
        return;
    };
    let Ok(bytes) = cookie_factory::gen_simple(gen_field_table(&table), Vec::new()) else {
        return;
    };
    let (_, again) = parse_field_table(&bytes[..]).expect("a generated table parses");
    // Bytes, not values: a NaN double is not equal to itself.
    let twice = cookie_factory::gen_simple(gen_field_table(&again), Vec::new())
        .expect("a parsed table generates");
    assert_eq!(twice, bytes);
});
