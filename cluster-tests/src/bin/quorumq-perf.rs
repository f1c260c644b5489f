//! quorumq-perf: a RabbitMQ-PerfTest-shaped load client (lapin).
//!
//! Producers publish `--messages` each (body: producer id u32, sequence u64,
//! send time ns u64, zero padding up to `--size` bytes) to queues named
//! `<prefix>-<n>`; consumers ack every delivery and record end-to-end latency.
//! With `--dead-letter`, producers publish to `<prefix>-src-<n>` (quorum,
//! at-least-once dead-lettering, reject-publish), one consumer set rejects
//! every message (requeue=false), and the measured rate is the *arrival* of
//! the dead letters in `<prefix>-dlq-<n>`: the targets' message count (passive
//! queue.declare every 5 ms) reaching the confirmed count. Consumers then drain
//! the targets to count losses and duplicates. With `--consume-target`, target
//! consumers run during the measurement instead and the rate is their receipt.
//!
//! `--client lean` (the default) drives producers and consumers with
//! [`cluster_tests::lean`], a single-task-per-connection client on
//! amq-protocol framing; `--client lapin` uses lapin, whose per-connection
//! I/O thread costs more client CPU than the broker spends per message on a
//! small box. Queue setup and the depth polling use lapin either way.
//!
//! With `--retry`, a retry pipeline: every message fails `--retry-fails`
//! times before it is acked (basic.nack requeue=true, the queue delaying each
//! retry with `x-delayed-retry-type=all`, `x-delayed-retry-min` =
//! `--retry-min` ms, RabbitMQ 4.3); `--retry-via ttl-dlx` runs the RabbitMQ
//! 3.10 equivalent instead: the consumer republishes a failed message to
//! delay queue k (`x-message-ttl` = k × `--retry-min`, dead-lettered back to
//! the work queue) and acks it. Reports the completion rate (messages acked
//! after their last retry, per second from the start), publish-to-completion
//! latency, and the broker's CPU time per message when `--broker-pid` names
//! the broker process (its /proc/PID/stat, one node; sum the nodes of a
//! cluster yourself).
//!
//! Reports publish and consume rates (msg/s), end-to-end latency (publish to
//! delivery) and, with the lean client and confirms, publish-to-confirm
//! latency, each as p50/p90/p99/p99.9/max in ms from an HDR histogram,
//! lost messages (confirmed, or published when `--confirm 0`, but never
//! received) and duplicates. Exit code 2 when messages were lost.

use anyhow::{bail, Context};
use clap::{Parser, ValueEnum};
use cluster_tests::lean::{self, ConfirmBook, LeanConn, PublishTemplate};
use futures::{FutureExt, StreamExt};
use hdrhistogram::Histogram;
use lapin::{
    options::{
        BasicAckOptions, BasicConsumeOptions, BasicQosOptions, BasicRejectOptions,
        ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
    },
    types::{AMQPValue, FieldTable},
    BasicProperties, Channel, Confirmation, Connection, ConnectionProperties,
};
use std::{
    collections::HashSet,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

const HEADER_LEN: usize = 4 + 8 + 8;

#[derive(Parser, Debug, Clone)]
#[command(
    name = "quorumq-perf",
    about = "PerfTest-shaped AMQP 0-9-1 load client"
)]
struct Args {
    /// AMQP URI of the broker.
    #[arg(long, default_value = "amqp://guest:guest@127.0.0.1:5672/%2f")]
    uri: String,
    /// Number of producers (one connection each).
    #[arg(long, default_value_t = 1)]
    producers: usize,
    /// Number of consumers (one connection each; in --dead-letter mode, this many rejecters and this many DLQ consumers).
    #[arg(long, default_value_t = 1)]
    consumers: usize,
    /// Number of queues; producer/consumer i uses queue i % queues.
    #[arg(long, default_value_t = 1)]
    queues: usize,
    /// Message body size in bytes (at least 20: id, sequence, timestamp).
    #[arg(long, default_value_t = 1024)]
    size: usize,
    /// Max in-flight unconfirmed publishes per producer; 0 = no publisher confirms.
    #[arg(long, default_value_t = 0)]
    confirm: usize,
    /// Consumer prefetch (basic.qos); 0 = unlimited.
    #[arg(long, default_value_t = 0)]
    prefetch: u16,
    /// Messages per second per producer; 0 = unlimited.
    #[arg(long, default_value_t = 0)]
    rate: u64,
    /// Messages per producer.
    #[arg(long, default_value_t = 100_000)]
    messages: u64,
    /// Queue argument key=value (repeatable); integers are sent as long, true/false as bool.
    #[arg(long = "queue-args", value_parser = parse_kv)]
    queue_args: Vec<(String, String)>,
    /// Queue name prefix.
    #[arg(long, default_value = "quorumq-perf")]
    queue_prefix: String,
    /// Dead-letter mode (see the crate docs).
    #[arg(long)]
    dead_letter: bool,
    /// Dead-letter mode: consume the target queues during the run and measure receipt there
    /// (default: measure arrival by the targets' message count, drain afterwards).
    #[arg(long)]
    consume_target: bool,
    /// Stop waiting for deliveries this many seconds after the last one arrived.
    #[arg(long, default_value_t = 10)]
    idle_timeout: u64,
    /// Overall bound on the run, seconds.
    #[arg(long, default_value_t = 600)]
    timeout: u64,
    /// Keep the queues after the run (they are deleted and re-declared at start either way).
    #[arg(long)]
    keep_queues: bool,
    /// Client library for producers and consumers.
    #[arg(long, value_enum, default_value_t = Client::Lean)]
    client: Client,
    /// Backlog mode: consumers start only after every message is published
    /// (measures a deep queue, e.g. RSS with 1M ready messages, then the drain).
    #[arg(long)]
    backlog: bool,
    /// Retry mode (see the crate docs): every message fails --retry-fails times first.
    #[arg(long)]
    retry: bool,
    /// Retry mode: failures per message before it is acked.
    #[arg(long, default_value_t = 2)]
    retry_fails: u32,
    /// Retry mode: delay of the first retry, ms (the k-th waits k times this).
    #[arg(long, default_value_t = 50)]
    retry_min: u64,
    /// Retry mode: how retries wait.
    #[arg(long, value_enum, default_value_t = RetryVia::Delayed)]
    retry_via: RetryVia,
    /// Pid of the broker process: its CPU time over the run is reported (Linux /proc).
    #[arg(long)]
    broker_pid: Option<u32>,
}

/// How the retry mode delays a failed message.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum RetryVia {
    /// basic.nack requeue=true into a queue with delayed retry (RabbitMQ 4.3, quorumq).
    Delayed,
    /// Republish to a TTL delay queue per attempt that dead-letters back (RabbitMQ 3.x).
    TtlDlx,
}

/// Which AMQP client drives the producers and consumers.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum Client {
    /// `cluster_tests::lean`: one task per connection, batched socket writes.
    Lean,
    /// lapin (an I/O thread per connection).
    Lapin,
}

fn parse_kv(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("expected key=value, got {s}"))
}

fn arg_value(v: &str) -> AMQPValue {
    if let Ok(i) = v.parse::<i64>() {
        AMQPValue::LongLongInt(i)
    } else if v == "true" || v == "false" {
        AMQPValue::Boolean(v == "true")
    } else {
        AMQPValue::LongString(v.into())
    }
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// Records one delivery of a benchmark message (latency, duplicates, receipt times).
fn record(shared: &Shared, data: &[u8]) -> anyhow::Result<()> {
    if data.len() < HEADER_LEN {
        return Ok(());
    }
    let id = u32::from_be_bytes(data[..4].try_into()?);
    let seq = u64::from_be_bytes(data[4..12].try_into()?);
    let sent = u64::from_be_bytes(data[12..20].try_into()?);
    let lat = now_ns().saturating_sub(sent) / 1000;
    let now = Instant::now();
    let mut r = shared.receipts.lock().unwrap();
    let _ = r.latency_us.record(lat.max(1));
    if !r.received.insert((id, seq)) {
        r.duplicates += 1;
    }
    r.first.get_or_insert(now);
    r.last = Some(now);
    Ok(())
}

/// What consumers recorded, under one lock (one lock per delivery).
struct Receipts {
    received: HashSet<(u32, u64)>,
    duplicates: u64,
    latency_us: Histogram<u64>,
    first: Option<Instant>,
    last: Option<Instant>,
}

impl Receipts {
    fn new() -> anyhow::Result<Self> {
        Ok(Receipts {
            received: HashSet::new(),
            duplicates: 0,
            latency_us: Histogram::new_with_bounds(1, 3_600_000_000, 3)?,
            first: None,
            last: None,
        })
    }
}

struct Shared {
    published: AtomicU64,
    confirmed: Mutex<HashSet<(u32, u64)>>,
    /// Publish-to-confirm time (µs) of every acked publish (lean client).
    confirm_us: Mutex<Histogram<u64>>,
    nacked: AtomicU64,
    rejected: AtomicU64,
    receipts: Mutex<Receipts>,
}

/// Poll the summed message count of `queues` (passive queue.declare every 5 ms) until it
/// reaches `expected` or stops growing for `--idle-timeout`; returns the last count and when
/// it was seen.
async fn wait_for_depth(
    args: &Args,
    queues: &[String],
    expected: u64,
) -> anyhow::Result<(u64, Instant)> {
    let conn = connect(&args.uri).await?;
    let ch = conn.create_channel().await?;
    let idle = Duration::from_secs(args.idle_timeout);
    let (mut last, mut last_change) = (0, Instant::now());
    loop {
        let mut depth = 0u64;
        for q in queues {
            let opts = QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            };
            let decl = ch
                .queue_declare(q.as_str().into(), opts, FieldTable::default())
                .await?;
            depth += u64::from(decl.message_count());
        }
        let now = Instant::now();
        if depth >= expected {
            let _ = conn.close(200, "OK".into()).await;
            return Ok((depth, now));
        }
        if depth != last {
            (last, last_change) = (depth, now);
        } else if last_change.elapsed() > idle {
            eprintln!("dead-letter target depth stuck at {depth} of {expected}");
            let _ = conn.close(200, "OK".into()).await;
            return Ok((depth, last_change));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn connect(uri: &str) -> anyhow::Result<Connection> {
    Connection::connect(uri, ConnectionProperties::default())
        .await
        .with_context(|| format!("connecting to {uri}"))
}

async fn declare(ch: &Channel, name: &str, args: FieldTable) -> anyhow::Result<()> {
    ch.queue_delete(name.into(), QueueDeleteOptions::default())
        .await?;
    ch.queue_declare(
        name.into(),
        QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
        args,
    )
    .await?;
    Ok(())
}

async fn producer(args: Args, id: u32, queue: String, shared: Arc<Shared>) -> anyhow::Result<()> {
    let conn = connect(&args.uri).await?;
    let ch = conn.create_channel().await?;
    let confirms = args.confirm > 0;
    if confirms {
        ch.confirm_select(ConfirmSelectOptions::default()).await?;
    }
    let window = args.confirm.max(1);
    let mut body = vec![0u8; args.size.max(HEADER_LEN)];
    body[..4].copy_from_slice(&id.to_be_bytes());
    let start = Instant::now();
    // Outstanding confirms, polled in this task (no task or permit per message).
    let mut waiting = futures::stream::FuturesUnordered::new();
    let settle = |(seq, r): (u64, lapin::Result<Confirmation>)| -> anyhow::Result<()> {
        match r? {
            c if c.is_ack() => {
                shared.confirmed.lock().unwrap().insert((id, seq));
            }
            _ => {
                shared.nacked.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(())
    };
    for seq in 0..args.messages {
        if args.rate > 0 {
            let due = start + Duration::from_secs_f64(seq as f64 / args.rate as f64);
            tokio::time::sleep_until(due.into()).await;
        }
        if confirms {
            while waiting.len() >= window {
                if let Some(done) = waiting.next().await {
                    settle(done)?;
                }
            }
            while let Some(Some(done)) = waiting.next().now_or_never() {
                settle(done)?;
            }
        }
        body[4..12].copy_from_slice(&seq.to_be_bytes());
        body[12..20].copy_from_slice(&now_ns().to_be_bytes());
        let pc = ch
            .basic_publish(
                "".into(),
                queue.as_str().into(),
                Default::default(),
                &body,
                BasicProperties::default().with_delivery_mode(2),
            )
            .await?;
        shared.published.fetch_add(1, Ordering::Relaxed);
        if confirms {
            waiting.push(async move { (seq, pc.await) });
        }
    }
    while let Some(done) = waiting.next().await {
        settle(done)?;
    }
    let _ = conn.close(200, "OK".into()).await;
    Ok(())
}

/// Consumes `queue`; in `reject` mode rejects every delivery (requeue=false), else records and acks.
async fn consumer(
    args: Args,
    queue: String,
    reject: bool,
    shared: Arc<Shared>,
    stop: Arc<tokio::sync::Notify>,
) -> anyhow::Result<()> {
    let conn = connect(&args.uri).await?;
    let ch = conn.create_channel().await?;
    if args.prefetch > 0 {
        ch.basic_qos(args.prefetch, BasicQosOptions::default())
            .await?;
    }
    let mut c = ch
        .basic_consume(
            queue.as_str().into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    // Acks and rejects are not awaited one by one (as PerfTest, which does not block on
    // them): the client library can then write several in one socket write.
    let mut settling = futures::stream::FuturesUnordered::new();
    loop {
        let d = tokio::select! {
            _ = stop.notified() => break,
            Some(r) = settling.next(), if !settling.is_empty() => {
                r?;
                continue;
            }
            d = c.next() => d,
        };
        let Some(d) = d else { break };
        let d = d?;
        let acker = d.acker.clone();
        if reject {
            settling.push(Box::pin(async move {
                acker.reject(BasicRejectOptions { requeue: false }).await
            })
                as futures::future::BoxFuture<'static, lapin::Result<bool>>);
            shared.rejected.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        record(&shared, &d.data)?;
        settling.push(Box::pin(async move {
            acker.ack(BasicAckOptions::default()).await
        }));
    }
    while let Some(r) = settling.next().await {
        r?;
    }
    let _ = conn.close(200, "OK".into()).await;
    Ok(())
}

/// Runs a producer on the client `--client` chose.
async fn any_producer(
    args: Args,
    id: u32,
    queue: String,
    shared: Arc<Shared>,
) -> anyhow::Result<()> {
    match args.client {
        Client::Lean => lean_producer(args, id, queue, shared).await,
        Client::Lapin => producer(args, id, queue, shared).await,
    }
}

/// Runs a consumer (acking, or rejecting in `reject` mode) on the client `--client` chose.
async fn any_consumer(
    args: Args,
    queue: String,
    reject: bool,
    shared: Arc<Shared>,
    stop: Arc<tokio::sync::Notify>,
) -> anyhow::Result<()> {
    match args.client {
        Client::Lean => lean_consumer(args, queue, reject, shared, stop).await,
        Client::Lapin => consumer(args, queue, reject, shared, stop).await,
    }
}

/// Producer on the lean client: publishes in batches of up to 64 frames per
/// socket write within the confirm window, reading confirms between batches.
async fn lean_producer(
    args: Args,
    id: u32,
    queue: String,
    shared: Arc<Shared>,
) -> anyhow::Result<()> {
    let mut conn = LeanConn::connect(&args.uri).await?;
    let confirms = args.confirm > 0;
    if confirms {
        conn.confirm_select().await?;
    }
    let mut body = vec![0u8; args.size.max(HEADER_LEN)];
    body[..4].copy_from_slice(&id.to_be_bytes());
    let template = PublishTemplate::new(&queue, &body, conn.frame_max)?;
    let window = args.confirm.max(1) as u64;
    let mut book = ConfirmBook::new(args.messages);
    let mut out = Vec::with_capacity(64 * (body.len() + 128));
    let mut seq = 0u64;
    // Send time (ns) per sequence number, and the next one whose confirm is not yet timed.
    let mut sent_ns: Vec<u64> = Vec::with_capacity(args.messages as usize);
    let mut timed = 0usize;
    let mut confirm_us = Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3)?;
    let start = Instant::now();
    let read_confirms = |conn: &mut LeanConn, book: &mut ConfirmBook| -> anyhow::Result<()> {
        while let Some(frame) = conn.reader.buffered()? {
            if let amq_protocol::frame::AMQPFrame::Method(_, m) = frame {
                use amq_protocol::protocol::{basic::AMQPMethod as B, AMQPClass as C};
                match &m {
                    C::Basic(B::Ack(a)) => {
                        book.settle(a.delivery_tag, a.multiple, ConfirmBook::ACK)?
                    }
                    C::Basic(B::Nack(n)) => {
                        book.settle(n.delivery_tag, n.multiple, ConfirmBook::NACK)?
                    }
                    m => lean::closed(m)?,
                }
            }
        }
        Ok(())
    };
    loop {
        let in_flight = seq - book.settled;
        if seq < args.messages && (!confirms || in_flight < window) {
            let room = if confirms { window - in_flight } else { 64 };
            let batch = if args.rate > 0 { 1 } else { room.min(64) }.min(args.messages - seq);
            for _ in 0..batch {
                if args.rate > 0 {
                    let due = start + Duration::from_secs_f64(seq as f64 / args.rate as f64);
                    // Read confirms while waiting, so each is timed when it arrives.
                    loop {
                        let read = tokio::select! {
                            _ = tokio::time::sleep_until(due.into()) => None,
                            r = conn.reader.fill(), if confirms => Some(r),
                        };
                        let Some(r) = read else { break };
                        r?;
                        read_confirms(&mut conn, &mut book)?;
                        time_confirms(&book, &sent_ns, &mut timed, &mut confirm_us);
                    }
                }
                let mut patch = [0u8; 16];
                let sent = now_ns();
                sent_ns.push(sent);
                patch[..8].copy_from_slice(&seq.to_be_bytes());
                patch[8..].copy_from_slice(&sent.to_be_bytes());
                // Sequence and send time follow the 4-byte producer id.
                template.append(&mut out, 4, &patch);
                seq += 1;
            }
            conn.write(&out).await?;
            out.clear();
            shared.published.fetch_add(batch, Ordering::Relaxed);
            if confirms && conn.reader.try_fill()? {
                read_confirms(&mut conn, &mut book)?;
                time_confirms(&book, &sent_ns, &mut timed, &mut confirm_us);
            }
            continue;
        }
        if !confirms || book.settled == args.messages {
            break;
        }
        conn.reader.fill().await?;
        read_confirms(&mut conn, &mut book)?;
        time_confirms(&book, &sent_ns, &mut timed, &mut confirm_us);
    }
    shared.confirm_us.lock().unwrap().add(&confirm_us)?;
    {
        let mut confirmed = shared.confirmed.lock().unwrap();
        for (s, state) in book.state.iter().enumerate() {
            match *state {
                ConfirmBook::ACK => {
                    confirmed.insert((id, s as u64));
                }
                ConfirmBook::NACK => {
                    shared.nacked.fetch_add(1, Ordering::Relaxed);
                }
                _ => {}
            }
        }
    }
    conn.close().await;
    Ok(())
}

/// Records the publish-to-confirm time of the acks read since the last call, in sequence
/// order (quorumq and RabbitMQ confirm in order; one settled out of order is timed when the
/// gap before it closes).
fn time_confirms(book: &ConfirmBook, sent_ns: &[u64], timed: &mut usize, h: &mut Histogram<u64>) {
    let now = now_ns();
    while *timed < sent_ns.len() && book.state[*timed] != ConfirmBook::PENDING {
        if book.state[*timed] == ConfirmBook::ACK {
            let _ = h.record((now.saturating_sub(sent_ns[*timed]) / 1000).max(1));
        }
        *timed += 1;
    }
}

/// Latency percentiles of `h` (µs) in ms: p50, p90, p99, p99.9, max.
fn percentiles(h: &Histogram<u64>) -> String {
    let ms = |v: u64| v as f64 / 1000.0;
    format!(
        "p50 {:.3} ms, p90 {:.3} ms, p99 {:.3} ms, p99.9 {:.3} ms, max {:.3} ms (n={})",
        ms(h.value_at_quantile(0.50)),
        ms(h.value_at_quantile(0.90)),
        ms(h.value_at_quantile(0.99)),
        ms(h.value_at_quantile(0.999)),
        ms(h.max()),
        h.len()
    )
}

/// Consumer on the lean client: acks (or rejects, requeue=false) every
/// delivery, one socket write per batch of frames read.
async fn lean_consumer(
    args: Args,
    queue: String,
    reject: bool,
    shared: Arc<Shared>,
    stop: Arc<tokio::sync::Notify>,
) -> anyhow::Result<()> {
    use amq_protocol::protocol::{basic, AMQPClass};
    let mut conn = LeanConn::connect(&args.uri).await?;
    if args.prefetch > 0 {
        conn.qos(args.prefetch).await?;
    }
    let stopped = stop.notified();
    tokio::pin!(stopped);
    stopped.as_mut().enable();
    conn.consume(&queue).await?;
    let mut assembler = lean::Assembler::default();
    let mut out = Vec::with_capacity(64 * 1024);
    loop {
        while let Some(frame) = conn.reader.buffered()? {
            let (tag, data) = match assembler.feed(frame) {
                Ok(Some(done)) => done,
                Ok(None) => continue,
                Err(m) => {
                    lean::closed(&m)?;
                    continue;
                }
            };
            let settle = if reject {
                shared.rejected.fetch_add(1, Ordering::Relaxed);
                basic::AMQPMethod::Reject(basic::Reject {
                    delivery_tag: tag,
                    requeue: false,
                })
            } else {
                record(&shared, &data)?;
                basic::AMQPMethod::Ack(basic::Ack {
                    delivery_tag: tag,
                    multiple: false,
                })
            };
            lean::encode_method(&mut out, AMQPClass::Basic(settle))?;
        }
        if !out.is_empty() {
            conn.write(&out).await?;
            out.clear();
        }
        tokio::select! {
            _ = &mut stopped => break,
            r = conn.reader.fill() => r?,
        }
    }
    conn.close().await;
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.queues == 0 || args.producers == 0 || args.consumers == 0 {
        bail!("--producers, --consumers and --queues must be at least 1");
    }
    let overall = Duration::from_secs(args.timeout);
    if args.retry {
        return match tokio::time::timeout(overall, retry::run(args)).await {
            Ok(r) => r,
            Err(_) => bail!("run exceeded --timeout {overall:?}"),
        };
    }
    match tokio::time::timeout(overall, run(args)).await {
        Ok(r) => r,
        Err(_) => bail!("run exceeded --timeout {overall:?}"),
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    let mut user_args = FieldTable::default();
    user_args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    for (k, v) in &args.queue_args {
        user_args.insert(k.as_str().into(), arg_value(v));
    }
    let admin = connect(&args.uri).await?;
    let ach = admin.create_channel().await?;
    let mut publish_queues = Vec::new();
    let mut measure_queues = Vec::new();
    let mut all_queues = Vec::new();
    for n in 0..args.queues {
        if args.dead_letter {
            let src = format!("{}-src-{n}", args.queue_prefix);
            let dlq = format!("{}-dlq-{n}", args.queue_prefix);
            declare(&ach, &dlq, user_args.clone()).await?;
            let mut a = user_args.clone();
            a.insert(
                "x-dead-letter-exchange".into(),
                AMQPValue::LongString("".into()),
            );
            a.insert(
                "x-dead-letter-routing-key".into(),
                AMQPValue::LongString(dlq.as_str().into()),
            );
            a.insert(
                "x-dead-letter-strategy".into(),
                AMQPValue::LongString("at-least-once".into()),
            );
            a.insert(
                "x-overflow".into(),
                AMQPValue::LongString("reject-publish".into()),
            );
            declare(&ach, &src, a).await?;
            publish_queues.push(src.clone());
            measure_queues.push(dlq.clone());
            all_queues.extend([src, dlq]);
        } else {
            let q = format!("{}-{n}", args.queue_prefix);
            declare(&ach, &q, user_args.clone()).await?;
            publish_queues.push(q.clone());
            measure_queues.push(q.clone());
            all_queues.push(q);
        }
    }

    let shared = Arc::new(Shared {
        published: AtomicU64::new(0),
        confirmed: Mutex::new(HashSet::new()),
        confirm_us: Mutex::new(Histogram::new_with_bounds(1, 3_600_000_000, 3)?),
        nacked: AtomicU64::new(0),
        rejected: AtomicU64::new(0),
        receipts: Mutex::new(Receipts::new()?),
    });
    let stop = Arc::new(tokio::sync::Notify::new());
    // Arrival in the dead-letter targets is measured by their depth, not by consuming them.
    let measure_depth = args.dead_letter && !args.consume_target;
    let spawn_consumers = |measured: bool, rejecters: bool| {
        let mut consumers = Vec::new();
        for i in 0..args.consumers {
            if measured {
                consumers.push(tokio::spawn(any_consumer(
                    args.clone(),
                    measure_queues[i % args.queues].clone(),
                    false,
                    shared.clone(),
                    stop.clone(),
                )));
            }
            if args.dead_letter && rejecters {
                consumers.push(tokio::spawn(any_consumer(
                    args.clone(),
                    publish_queues[i % args.queues].clone(),
                    true,
                    shared.clone(),
                    stop.clone(),
                )));
            }
        }
        consumers
    };
    let mut consumers = if args.backlog {
        Vec::new()
    } else {
        spawn_consumers(!measure_depth, true)
    };
    let start = Instant::now();
    let mut producers = Vec::new();
    for i in 0..args.producers {
        producers.push(tokio::spawn(any_producer(
            args.clone(),
            i as u32,
            publish_queues[i % args.queues].clone(),
            shared.clone(),
        )));
    }
    for p in producers {
        p.await??;
    }
    let publish_elapsed = start.elapsed();
    if args.backlog {
        println!(
            "backlog published in {:.2} s; starting consumers",
            publish_elapsed.as_secs_f64()
        );
        consumers = spawn_consumers(!measure_depth, true);
    }
    let confirms = args.confirm > 0;
    let expected = if confirms {
        shared.confirmed.lock().unwrap().len() as u64
    } else {
        shared.published.load(Ordering::Relaxed)
    };
    let arrival = if measure_depth {
        let arrived = wait_for_depth(&args, &measure_queues, expected).await?;
        let span = arrived.1.saturating_duration_since(start);
        consumers.extend(spawn_consumers(true, false));
        Some((arrived.0, span.max(Duration::from_millis(1))))
    } else {
        None
    };
    // Wait until everything expected arrived, or nothing new arrived for --idle-timeout.
    let idle = Duration::from_secs(args.idle_timeout);
    let mut last_count = 0;
    let mut last_change = Instant::now();
    loop {
        let got = shared.receipts.lock().unwrap().received.len() as u64;
        if got >= expected {
            break;
        }
        if got != last_count {
            last_count = got;
            last_change = Instant::now();
        } else if last_change.elapsed() > idle {
            eprintln!("no new deliveries for {idle:?}; stopping with {got} of {expected}");
            break;
        }
        if consumers.iter().any(|c| c.is_finished()) {
            eprintln!("a consumer stopped early");
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.notify_waiters();
    for c in consumers {
        match tokio::time::timeout(Duration::from_secs(10), c).await {
            Ok(r) => r??,
            Err(_) => eprintln!("a consumer did not stop within 10 s"),
        }
    }

    let published = shared.published.load(Ordering::Relaxed);
    // The consumers have stopped: take what they recorded.
    let Receipts {
        received,
        duplicates,
        latency_us: h,
        first,
        last,
    } = std::mem::replace(&mut *shared.receipts.lock().unwrap(), Receipts::new()?);
    let lost = if confirms {
        shared
            .confirmed
            .lock()
            .unwrap()
            .difference(&received)
            .count() as u64
    } else {
        published.saturating_sub(received.len() as u64)
    };
    let first = first.unwrap_or(start);
    let last = last.unwrap_or(start);
    let consume_span = last
        .saturating_duration_since(start)
        .max(Duration::from_millis(1));
    let mode = if args.dead_letter {
        "dead-letter"
    } else {
        "plain"
    };
    println!(
        "quorumq-perf mode={mode} client={:?} uri={} producers={} consumers={} queues={} size={}B confirm={} prefetch={} rate={} messages/producer={} queue-args={:?}",
        args.client, args.uri, args.producers, args.consumers, args.queues, args.size, args.confirm, args.prefetch, args.rate, args.messages, args.queue_args
    );
    println!(
        "publish: {published} sent, {} confirmed, {} nacked in {:.2} s = {:.0} msg/s",
        if confirms {
            shared.confirmed.lock().unwrap().len().to_string()
        } else {
            "n/a".into()
        },
        shared.nacked.load(Ordering::Relaxed),
        publish_elapsed.as_secs_f64(),
        published as f64 / publish_elapsed.as_secs_f64()
    );
    if args.dead_letter {
        println!(
            "rejected (requeue=false) at source: {}",
            shared.rejected.load(Ordering::Relaxed)
        );
    }
    if let Some((count, span)) = arrival {
        println!(
            "dead-letter arrival (target depth): {count} in {:.2} s from start = {:.0} msg/s",
            span.as_secs_f64(),
            count as f64 / span.as_secs_f64()
        );
    }
    println!(
        "consume{}: {} received in {:.2} s from start (first after {:.3} s) = {:.0} msg/s",
        if measure_depth {
            " (dead-letter target, drained after the arrival measurement)"
        } else if args.dead_letter {
            " (dead-letter target)"
        } else {
            ""
        },
        received.len(),
        consume_span.as_secs_f64(),
        first.saturating_duration_since(start).as_secs_f64(),
        received.len() as f64 / consume_span.as_secs_f64()
    );
    if measure_depth {
        println!("latency: n/a (targets drained after the arrival measurement)");
    } else {
        println!("latency: {}", percentiles(&h));
    }
    let confirm_line = {
        let confirm_us = shared.confirm_us.lock().unwrap();
        (!confirm_us.is_empty()).then(|| percentiles(&confirm_us))
    };
    if let Some(line) = confirm_line {
        println!("confirm latency: {line}");
    }
    println!("lost: {lost}  duplicates: {}", duplicates);
    if !args.keep_queues {
        for q in &all_queues {
            let _ = ach
                .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
                .await;
        }
    }
    let _ = admin.close(200, "OK".into()).await;
    if lost > 0 {
        std::process::exit(2);
    }
    Ok(())
}

/// `--retry`: the retry pipeline benchmark.
mod retry {
    use super::*;
    use std::collections::HashMap;

    /// What the retry consumers share: failures so far per message, and
    /// the completions.
    struct Book {
        attempts: Mutex<HashMap<(u32, u64), u32>>,
        done: Mutex<Receipts>,
    }

    async fn consumer(
        args: Args,
        queue: String,
        delay_queues: Vec<String>,
        book: Arc<Book>,
        stop: Arc<tokio::sync::Notify>,
    ) -> anyhow::Result<()> {
        let conn = connect(&args.uri).await?;
        let ch = conn.create_channel().await?;
        let prefetch = if args.prefetch == 0 {
            200
        } else {
            args.prefetch
        };
        ch.basic_qos(prefetch, BasicQosOptions::default()).await?;
        let mut c = ch
            .basic_consume(
                queue.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        let stopped = stop.notified();
        tokio::pin!(stopped);
        loop {
            let d = tokio::select! {
                _ = &mut stopped => break,
                d = c.next() => match d {
                    Some(d) => d?,
                    None => break,
                },
            };
            if d.data.len() < HEADER_LEN {
                d.ack(BasicAckOptions::default()).await?;
                continue;
            }
            let id = u32::from_be_bytes(d.data[..4].try_into()?);
            let seq = u64::from_be_bytes(d.data[4..12].try_into()?);
            let failures = {
                let mut a = book.attempts.lock().unwrap();
                let n = a.entry((id, seq)).or_default();
                *n += 1;
                *n - 1
            };
            if failures < args.retry_fails {
                match args.retry_via {
                    RetryVia::Delayed => {
                        d.nack(lapin::options::BasicNackOptions {
                            requeue: true,
                            ..Default::default()
                        })
                        .await?;
                    }
                    RetryVia::TtlDlx => {
                        ch.basic_publish(
                            "".into(),
                            delay_queues[failures as usize].as_str().into(),
                            Default::default(),
                            &d.data,
                            BasicProperties::default().with_delivery_mode(2),
                        )
                        .await?;
                        d.ack(BasicAckOptions::default()).await?;
                    }
                }
            } else {
                d.ack(BasicAckOptions::default()).await?;
                record_done(&book, &d.data)?;
            }
        }
        let _ = conn.close(200, "OK".into()).await;
        Ok(())
    }

    /// Records a completed message (publish-to-completion latency, duplicates).
    fn record_done(book: &Book, data: &[u8]) -> anyhow::Result<()> {
        let id = u32::from_be_bytes(data[..4].try_into()?);
        let seq = u64::from_be_bytes(data[4..12].try_into()?);
        let sent = u64::from_be_bytes(data[12..20].try_into()?);
        let lat = now_ns().saturating_sub(sent) / 1000;
        let now = Instant::now();
        let mut r = book.done.lock().unwrap();
        let _ = r.latency_us.record(lat.max(1));
        if !r.received.insert((id, seq)) {
            r.duplicates += 1;
        }
        r.first.get_or_insert(now);
        r.last = Some(now);
        Ok(())
    }

    pub(super) async fn run(args: Args) -> anyhow::Result<()> {
        let mut base = FieldTable::default();
        base.insert(
            "x-queue-type".into(),
            AMQPValue::LongString("quorum".into()),
        );
        for (k, v) in &args.queue_args {
            base.insert(k.as_str().into(), arg_value(v));
        }
        let admin = connect(&args.uri).await?;
        let ach = admin.create_channel().await?;
        let work = format!("{}-retry", args.queue_prefix);
        let mut all = vec![work.clone()];
        let mut delay_queues = Vec::new();
        let mut wargs = base.clone();
        match args.retry_via {
            RetryVia::Delayed => {
                let max = args.retry_min * u64::from(args.retry_fails.max(1));
                wargs.insert(
                    "x-delayed-retry-type".into(),
                    AMQPValue::LongString("all".into()),
                );
                wargs.insert(
                    "x-delayed-retry-min".into(),
                    AMQPValue::LongLongInt(args.retry_min as i64),
                );
                wargs.insert(
                    "x-delayed-retry-max".into(),
                    AMQPValue::LongLongInt(max as i64),
                );
            }
            RetryVia::TtlDlx => {
                for k in 1..=args.retry_fails {
                    let dq = format!("{}-delay-{k}", args.queue_prefix);
                    let mut a = base.clone();
                    a.insert(
                        "x-message-ttl".into(),
                        AMQPValue::LongLongInt((args.retry_min * u64::from(k)) as i64),
                    );
                    a.insert(
                        "x-dead-letter-exchange".into(),
                        AMQPValue::LongString("".into()),
                    );
                    a.insert(
                        "x-dead-letter-routing-key".into(),
                        AMQPValue::LongString(work.as_str().into()),
                    );
                    declare(&ach, &dq, a).await?;
                    delay_queues.push(dq.clone());
                    all.push(dq);
                }
            }
        }
        declare(&ach, &work, wargs).await?;

        let book = Arc::new(Book {
            attempts: Mutex::new(HashMap::new()),
            done: Mutex::new(Receipts::new()?),
        });
        let shared = Arc::new(Shared {
            published: AtomicU64::new(0),
            confirmed: Mutex::new(HashSet::new()),
            confirm_us: Mutex::new(Histogram::new_with_bounds(1, 3_600_000_000, 3)?),
            nacked: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            receipts: Mutex::new(Receipts::new()?),
        });
        let stop = Arc::new(tokio::sync::Notify::new());
        let cpu0 = args.broker_pid.map(cluster_tests::cpu_time).transpose()?;
        let start = Instant::now();
        let mut consumers = Vec::new();
        for _ in 0..args.consumers {
            consumers.push(tokio::spawn(consumer(
                args.clone(),
                work.clone(),
                delay_queues.clone(),
                book.clone(),
                stop.clone(),
            )));
        }
        let mut producers = Vec::new();
        for i in 0..args.producers {
            producers.push(tokio::spawn(producer(
                args.clone(),
                i as u32,
                work.clone(),
                shared.clone(),
            )));
        }
        for p in producers {
            p.await??;
        }
        let publish_elapsed = start.elapsed();
        let expected = if args.confirm > 0 {
            shared.confirmed.lock().unwrap().len() as u64
        } else {
            shared.published.load(Ordering::Relaxed)
        };
        let idle = Duration::from_secs(args.idle_timeout);
        let (mut last, mut last_change) = (0, Instant::now());
        loop {
            let got = book.done.lock().unwrap().received.len() as u64;
            if got >= expected {
                break;
            }
            if got != last {
                (last, last_change) = (got, Instant::now());
            } else if last_change.elapsed() > idle {
                eprintln!("no completion for {idle:?}; stopping with {got} of {expected}");
                break;
            }
            if consumers.iter().any(|c| c.is_finished()) {
                eprintln!("a consumer stopped early");
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let end = Instant::now();
        let cpu1 = args.broker_pid.map(cluster_tests::cpu_time).transpose()?;
        stop.notify_waiters();
        for c in consumers {
            match tokio::time::timeout(Duration::from_secs(10), c).await {
                Ok(r) => r??,
                Err(_) => eprintln!("a consumer did not stop within 10 s"),
            }
        }
        let done = std::mem::replace(&mut *book.done.lock().unwrap(), Receipts::new()?);
        let completed = done.received.len() as u64;
        let span = done
            .last
            .unwrap_or(end)
            .saturating_duration_since(start)
            .max(Duration::from_millis(1));
        let failures: u64 = book
            .attempts
            .lock()
            .unwrap()
            .values()
            .map(|n| u64::from(*n).saturating_sub(1))
            .sum();
        println!(
            "quorumq-perf mode=retry via={:?} uri={} producers={} consumers={} size={}B confirm={} prefetch={} messages/producer={} fails/message={} retry-min={} ms queue-args={:?}",
            args.retry_via, args.uri, args.producers, args.consumers, args.size, args.confirm, args.prefetch, args.messages, args.retry_fails, args.retry_min, args.queue_args
        );
        println!(
            "publish: {} sent in {:.2} s = {:.0} msg/s",
            shared.published.load(Ordering::Relaxed),
            publish_elapsed.as_secs_f64(),
            shared.published.load(Ordering::Relaxed) as f64 / publish_elapsed.as_secs_f64()
        );
        println!(
            "completed (acked after {} failures): {completed} of {expected} in {:.2} s from start = {:.0} msg/s ({failures} retries)",
            args.retry_fails,
            span.as_secs_f64(),
            completed as f64 / span.as_secs_f64()
        );
        println!(
            "publish-to-completion latency: {}",
            percentiles(&done.latency_us)
        );
        match (cpu0, cpu1) {
            (Some(a), Some(b)) => {
                let cpu = b.saturating_sub(a);
                println!(
                    "broker CPU (pid {}): {:.2} s over {:.2} s = {:.0} us/message ({:.0}% of one core)",
                    args.broker_pid.unwrap_or(0),
                    cpu.as_secs_f64(),
                    (end - start).as_secs_f64(),
                    cpu.as_secs_f64() * 1e6 / completed.max(1) as f64,
                    100.0 * cpu.as_secs_f64() / (end - start).as_secs_f64()
                );
            }
            _ => println!("broker CPU: n/a (pass --broker-pid PID of the broker)"),
        }
        println!("duplicates: {}", done.duplicates);
        if !args.keep_queues {
            for q in &all {
                let _ = ach
                    .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
                    .await;
            }
        }
        let _ = admin.close(200, "OK".into()).await;
        if completed < expected {
            std::process::exit(2);
        }
        Ok(())
    }
}
