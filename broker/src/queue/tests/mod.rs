//! Tests of the queue state machine: unit tests per command and edge case
//! (rabbit_fifo_SUITE style) and property tests against a naive model.

mod helpers;
mod invariants;
mod model;

mod batch;
mod checkout;
mod config;
mod consumer_timeout;
mod consumers;
mod dead_letter;
mod dedup;
mod delayed;
mod dequeue;
mod enqueue;
mod expiry;
mod limits;
mod peek;
mod priorities;
mod props;
mod remove;
mod returns;
mod settle;
mod snapshot;
