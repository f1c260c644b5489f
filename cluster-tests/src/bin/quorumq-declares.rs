//! Declares (or deletes) many durable quorum queues from several connections
//! at once, one channel each, each waiting for its declare-ok (delete-ok)
//! before the next; prints the rate, the latency of one operation (p50, p99,
//! max: send to ok) and this client's CPU per operation.
//! Issue 31's bar: ≥ 2,000 declares/s from 8 channels on three nodes.
//!
//! It uses the lean client (`cluster_tests::lean`): pika, the Python client
//! `cluster-tests/bench/many_queues.sh` also drives, spends ~0.4 ms of CPU
//! per declare, which on this project's 2-core box is CPU the brokers do not
//! get. Queues are named `PREFIX{i}` for `i` in `FIRST..FIRST+QUEUES`,
//! dealt to the connections round-robin.
//!
//!   quorumq-declares --uri amqp://guest:guest@127.0.0.1:5672/%2f --queues 3000 --connections 8
//!   quorumq-declares --op delete --queues 3000 --connections 8

use std::time::Instant;

use clap::{Parser, ValueEnum};
use cluster_tests::cpu_time;
use cluster_tests::lean::LeanConn;

/// What each connection does to its queues.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    /// queue.declare, durable, x-queue-type=quorum.
    Declare,
    /// queue.delete.
    Delete,
}

#[derive(Parser, Debug)]
#[command(about = "Queue declares or deletes from several connections at once")]
struct Args {
    /// AMQP URI of the node to connect to.
    #[arg(long, default_value = "amqp://guest:guest@127.0.0.1:5672/%2f")]
    uri: String,
    /// Queues to declare or delete (count).
    #[arg(long, default_value_t = 1000)]
    queues: u64,
    /// Index of the first queue.
    #[arg(long, default_value_t = 0)]
    first: u64,
    /// Connections (one channel each) working at once.
    #[arg(long, default_value_t = 8)]
    connections: u64,
    /// Queue name prefix.
    #[arg(long, default_value = "mq.")]
    prefix: String,
    /// Declare or delete.
    #[arg(long, value_enum, default_value_t = Op::Declare)]
    op: Op,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut conns = Vec::new();
    for _ in 0..args.connections {
        conns.push(LeanConn::connect(&args.uri).await?);
    }
    let started = Instant::now();
    let me = std::process::id();
    let cpu_before = cpu_time(me)?;
    let mut tasks = tokio::task::JoinSet::new();
    for (k, mut conn) in conns.into_iter().enumerate() {
        let names: Vec<String> = (args.first..args.first + args.queues)
            .skip(k)
            .step_by(args.connections as usize)
            .map(|i| format!("{}{i}", args.prefix))
            .collect();
        let op = args.op;
        tasks.spawn(async move {
            let mut took = Vec::with_capacity(names.len());
            for name in &names {
                let sent = Instant::now();
                match op {
                    Op::Declare => conn.declare_quorum(name).await?,
                    Op::Delete => conn.delete_queue(name).await?,
                }
                took.push(sent.elapsed());
            }
            conn.close().await;
            anyhow::Ok(took)
        });
    }
    let mut took = Vec::new();
    while let Some(done) = tasks.join_next().await {
        took.extend(done??);
    }
    took.sort_unstable();
    let pct = |p: f64| {
        took.get(((took.len() as f64 * p) as usize).min(took.len().saturating_sub(1)))
            .map_or(0.0, |d| d.as_secs_f64() * 1e3)
    };
    let secs = started.elapsed().as_secs_f64();
    let cpu_ms = cpu_time(me)?.saturating_sub(cpu_before).as_secs_f64() * 1e3;
    println!(
        "{:?} {} queues from {} connections: {:.0}/s ({:.2} s; p50 {:.2} ms, p99 {:.2} ms, \
         max {:.2} ms; client CPU {:.3} ms per queue)",
        args.op,
        args.queues,
        args.connections,
        args.queues as f64 / secs,
        secs,
        pct(0.5),
        pct(0.99),
        pct(1.0),
        cpu_ms / args.queues.max(1) as f64,
    );
    Ok(())
}
