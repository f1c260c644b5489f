//! The AMQP frame reader fed arbitrary socket bytes in arbitrary chunks: it must return
//! frames or a `FrameError` (a reply code), never panic, loop or over-allocate.
#![no_main]
use libfuzzer_sys::fuzz_target;
use quorumq::amqp::codec::FrameReader;

fuzz_target!(|data: &[u8]| {
    let Some((&chunk, rest)) = data.split_first() else {
        return;
    };
    let chunk = usize::from(chunk.max(1));
    let mut reader = FrameReader::new();
    let mut header_done = false;
    for piece in rest.chunks(chunk) {
        reader.buffer().extend_from_slice(piece);
        if !header_done {
            match reader.take_protocol_header() {
                None => continue,
                Some(Err(())) => return,
                Some(Ok(())) => header_done = true,
            }
        }
        loop {
            match reader.next_frame() {
                Ok(Some(_frame)) => {}
                Ok(None) => break,
                Err(e) => {
                    assert!(matches!(e.reply_code(), 501 | 502 | 505));
                    return;
                }
            }
        }
    }
});
