//! The queue state machine's cost per message, without I/O: what one
//! replica's `apply` spends on each message of a saturated pipeline
//! (`cargo bench -p quorumq --bench machine`). Prints ns per message, best
//! of several runs, for:
//! - `plain`: publish in batches of 64, push to one consumer (prefetch 256),
//!   ack in batches of 64 (the `quorumq-perf` plain row);
//! - `dl`: the same consumer rejects (requeue=false) into the at-least-once
//!   dead-letter area, and the worker settles each batch (`DeadLetterSettled`);
//! - `plain+timeout`: `plain` with a consumer timeout (RabbitMQ's default
//!   node setting, 1,800,000 ms), which every consumer has in practice;
//! - `dl+timeout`: `dl` with the consumer timeout.
//!
//! Numbers, not assertions: compare two builds by running both.

use std::time::Instant;

use bytes::Bytes;
use quorumq::queue::{
    ConsumerId, ConsumerSpec, DeadLetterStrategy, DeadLetterTarget, EnqueueMsg, Overflow,
    QueueCommand, QueueConfig, QueueMachine,
};

const BATCH: u64 = 64;
const MESSAGES: u64 = 200_000;
const RUNS: usize = 7;

/// One pipeline run; returns ns per message.
fn run(dead_letter: bool, timeout_ms: Option<u64>) -> f64 {
    let mut config = QueueConfig::default();
    if dead_letter {
        config.dead_letter = Some(DeadLetterTarget {
            exchange: "dlx".into(),
            routing_key: None,
        });
        config.strategy = DeadLetterStrategy::AtLeastOnce;
        config.overflow = Overflow::RejectPublish;
    }
    let mut q = QueueMachine::new(config);
    let consumer = ConsumerId {
        node: 1,
        epoch: 1,
        seq: 1,
    };
    let payload = Bytes::from_static(&[0u8; 16]);
    let start = Instant::now();
    q.apply(QueueCommand::Subscribe {
        now_ms: 0,
        consumer,
        spec: ConsumerSpec {
            prefetch: 256,
            timeout_ms,
            ..ConsumerSpec::default()
        },
    });
    let mut next = 0u64;
    let mut now_ms = 1u64;
    while next < MESSAGES {
        let msgs = (0..BATCH)
            .map(|_| EnqueueMsg {
                payload: payload.clone(),
                body_size: 1024,
                ttl_ms: None,
            })
            .collect();
        q.apply(QueueCommand::Enqueue { now_ms, msgs });
        let ids: Vec<u64> = (next..next + BATCH).collect();
        next += BATCH;
        now_ms += 1;
        if dead_letter {
            q.apply(QueueCommand::Discard {
                now_ms,
                consumer,
                ids: ids.clone(),
            });
            q.apply(QueueCommand::DeadLetterSettled { now_ms, ids });
        } else {
            q.apply(QueueCommand::Settle {
                now_ms,
                consumer,
                ids,
            });
        }
    }
    start.elapsed().as_nanos() as f64 / MESSAGES as f64
}

fn main() {
    let cases: [(&str, bool, Option<u64>); 4] = [
        ("plain", false, None),
        ("dl", true, None),
        ("plain+timeout", false, Some(1_800_000)),
        ("dl+timeout", true, Some(1_800_000)),
    ];
    for (name, dead_letter, timeout_ms) in cases {
        let best = (0..RUNS)
            .map(|_| run(dead_letter, timeout_ms))
            .fold(f64::INFINITY, f64::min);
        println!("machine {name:<14} {best:8.1} ns/message (best of {RUNS})");
    }
}
