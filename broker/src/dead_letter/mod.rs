//! Dead-lettering: the message rewrite (x-death & co, spec §3), cycle
//! detection (spec §4), the at-most-once publisher (spec §5.2) and the
//! at-least-once worker (spec §5.4-5.5) with why it holds what it holds
//! (`held`).

pub mod at_most_once;
pub mod cycle;
pub mod held;
pub mod rewrite;
pub mod summary;
pub mod worker;
