//! The write-ahead log's recovery on arbitrary segment bytes (torn, corrupt, hostile): it
//! must open, refuse with an error, or cut a tail — never panic or allocate unboundedly.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    raft_log::fuzzing::recover_segments(data);
});
