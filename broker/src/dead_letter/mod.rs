//! Dead-lettering: the message rewrite (x-death & co, spec §3), cycle
//! detection (spec §4), the at-most-once publisher (spec §5.2) and the
//! at-least-once worker (spec §5.4-5.5).

pub mod at_most_once;
pub mod cycle;
pub mod rewrite;
pub mod worker;
