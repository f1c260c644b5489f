//! Prometheus metrics of the node (`GET /metrics` on the HTTP listener, no auth, scraped
//! by `crate::http::metrics`), in the
//! OpenMetrics text format via `prometheus-client`. Names follow RabbitMQ 3.10.8's
//! `rabbitmq_prometheus` where it has one (checked against the installed 3.10.8's
//! `/metrics` and `/metrics/per-object`); quorumq's own are `quorumq_…`:
//!
//! - node-wide counters (`rabbitmq_global_messages_received_total`, `…_routed_total`,
//!   `…_confirmed_total`, `…_delivered_total`, `…_redelivered_total`,
//!   `…_acknowledged_total`), dead-lettering by reason
//!   (`rabbitmq_global_messages_dead_lettered_{rejected,expired,maxlen,delivery_limit}_total`
//!   with `queue_type` and `dead_letter_strategy` labels, and
//!   `rabbitmq_global_messages_dead_lettered_confirmed_total`), counted where the queue
//!   leader carries the dead-lettering out, and the same by queue
//!   (`quorumq_queue_messages_dead_lettered_total{vhost,queue,reason,dead_letter_strategy}`);
//! - gauges at scrape time: `rabbitmq_connections`, `rabbitmq_channels`,
//!   `rabbitmq_consumers`, `rabbitmq_queues`, `rabbitmq_process_resident_memory_bytes`,
//!   `rabbitmq_process_open_fds`; per queue this node leads `rabbitmq_queue_messages_ready`,
//!   `…_unacked`, `rabbitmq_queue_messages`, `rabbitmq_queue_consumers`,
//!   `quorumq_queue_messages_dlx` (at-least-once dead letters held); per Raft group with a
//!   replica here `rabbitmq_raft_term` (a gauge), `rabbitmq_raft_commit_index`,
//!   `rabbitmq_raft_last_written_index`, `rabbitmq_raft_last_applied`,
//!   `rabbitmq_raft_snapshot_index` (RabbitMQ 4.2's names) and the same under 3.x's
//!   `rabbitmq_raft_log_{commit,last_written,last_applied,snapshot}_index` (the dashboards
//!   query both; openraft 0.9's metrics carry no commit index: on a leader the applied
//!   index trails it only by the apply queue), `quorumq_raft_leader` (1 on the leader);
//! - `quorumq_wal_fsync_seconds`: histogram of the write-ahead log's write + `fdatasync`
//!   rounds;
//! - `quorumq_meta_writes_forwarded_total{via}` (meta writes forwarded to the meta
//!   leader as a `frame` or a unary `call`) and `quorumq_meta_commit_hints_total`
//!   (commit hints the meta leader queued, `cluster::commit_hints`);
//! - `rabbitmq_message_size_bytes{protocol}`: histogram of the bodies received from
//!   publishers, RabbitMQ 4.x's buckets (`rabbit_msg_size_metrics`: 100 B .. 100 MB),
//!   written by [`Counters::encode_message_sizes`] with RabbitMQ's `le` spellings;
//! - `quorumq_stats_sampling_seconds_total`: time the management statistics' sampler
//!   spent (its `rate()` is the share of a core the sampling costs);
//! - the commit latency of each Raft group this node leads ([`Counters::commit_latency`]),
//!   served as `rabbitmq_raft_commit_latency_seconds`.
//!
//! The counters are process-wide, as RabbitMQ's `rabbit_global_counters` are node-wide.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::queue::types::{DeadLetterReason, DeadLetterStrategy};

/// Label pairs of one series.
pub type Labels = Vec<(&'static str, String)>;

/// The `dead_letter_strategy` label (RabbitMQ's atoms); None = no dead-letter exchange.
fn strategy_label(s: Option<DeadLetterStrategy>) -> &'static str {
    match s {
        None => "disabled",
        Some(DeadLetterStrategy::AtMostOnce) => "at_most_once",
        Some(DeadLetterStrategy::AtLeastOnce) => "at_least_once",
    }
}

const AMQP: &str = "amqp091";
const QUORUM: &str = "rabbit_quorum_queue";

/// The node's counters (process-wide).
pub struct Counters {
    received: Family<Labels, Counter>,
    routed: Family<Labels, Counter>,
    confirmed: Family<Labels, Counter>,
    delivered: Family<Labels, Counter>,
    redelivered: Family<Labels, Counter>,
    acknowledged: Family<Labels, Counter>,
    /// One family per reason, labels queue_type + dead_letter_strategy.
    dead_lettered: [Family<Labels, Counter>; 4],
    dead_lettered_confirmed: Family<Labels, Counter>,
    dead_lettered_by_queue: Family<Labels, Counter>,
    /// Messages moved by redrive, labels vhost + queue (the queue moved from).
    redriven: Family<Labels, Counter>,
    wal_fsync: Histogram,
    /// Meta writes this node forwarded to the meta leader, label `via`:
    /// `frame` (`cluster::frames::PROPOSE`) or `call` (unary `Propose`).
    meta_forwarded: Family<Labels, Counter>,
    /// Commit hints the meta leader queued for followers whose append was
    /// in flight (`cluster::commit_hints`).
    commit_hints: Counter,
    channels: Gauge<i64, AtomicI64>,
    /// Observations per [`MESSAGE_SIZE_BUCKETS`] bucket (not cumulative; the last is
    /// +Inf), then the sum of the sizes in bytes.
    message_sizes: [AtomicU64; MESSAGE_SIZE_BUCKETS.len() + 2],
    /// Raft group → seconds its last local write took from proposal to commit.
    commit_latency: Mutex<HashMap<u64, f64>>,
    /// Nanoseconds the management statistics' sampler spent sampling.
    stats_sampling_ns: AtomicU64,
}

/// Upper bounds (bytes) of `rabbitmq_message_size_bytes`'s buckets and their `le` label
/// as RabbitMQ writes them (rabbitmq-server `deps/rabbit/src/rabbit_msg_size_metrics.erl`;
/// the RabbitMQ-Overview dashboard queries these exact strings).
pub const MESSAGE_SIZE_BUCKETS: [(u64, &str); 8] = [
    (100, "100.0"),
    (1_000, "1000.0"),
    (10_000, "10000.0"),
    (100_000, "100000.0"),
    (1_000_000, "1e+06"),
    (10_000_000, "1e+07"),
    (50_000_000, "5e+07"),
    (100_000_000, "1e+08"),
];

/// One open AMQP channel, counted in `rabbitmq_channels` from creation to drop.
pub struct OpenChannel(());

impl Default for OpenChannel {
    fn default() -> Self {
        COUNTERS.channels.inc();
        OpenChannel(())
    }
}

impl Drop for OpenChannel {
    fn drop(&mut self) {
        COUNTERS.channels.dec();
    }
}

/// Messages dead-lettered by the queues this node leads, every reason (count); the
/// management API's node `message_stats.dead_lettered` (quorumq's own field).
static DEAD_LETTERED_TOTAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// [`DEAD_LETTERED_TOTAL`] now.
pub fn dead_lettered_total() -> u64 {
    DEAD_LETTERED_TOTAL.load(std::sync::atomic::Ordering::Relaxed)
}

/// The node's counters.
pub static COUNTERS: LazyLock<Counters> = LazyLock::new(Counters::new);

impl Counters {
    /// Counters at zero (the node has one, [`COUNTERS`]; tests make their own).
    fn new() -> Counters {
        Counters {
            received: Family::default(),
            routed: Family::default(),
            confirmed: Family::default(),
            delivered: Family::default(),
            redelivered: Family::default(),
            acknowledged: Family::default(),
            dead_lettered: Default::default(),
            dead_lettered_confirmed: Family::default(),
            dead_lettered_by_queue: Family::default(),
            redriven: Family::default(),
            // 50 µs .. ~0.8 s.
            wal_fsync: Histogram::new(exponential_buckets(0.00005, 2.0, 15)),
            meta_forwarded: Family::default(),
            commit_hints: Counter::default(),
            channels: Gauge::default(),
            message_sizes: Default::default(),
            commit_latency: Mutex::new(HashMap::new()),
            stats_sampling_ns: AtomicU64::new(0),
        }
    }
}

fn amqp() -> Labels {
    vec![("protocol", AMQP.into())]
}

fn reason_index(r: DeadLetterReason) -> usize {
    match r {
        DeadLetterReason::Rejected => 0,
        DeadLetterReason::Expired => 1,
        DeadLetterReason::Maxlen => 2,
        DeadLetterReason::DeliveryLimit => 3,
    }
}

const REASONS: [DeadLetterReason; 4] = [
    DeadLetterReason::Rejected,
    DeadLetterReason::Expired,
    DeadLetterReason::Maxlen,
    DeadLetterReason::DeliveryLimit,
];

impl Counters {
    /// A basic.publish arrived complete (RabbitMQ `messages_received`), `routed` when it
    /// reached at least one queue.
    pub fn published(&self, routed: bool) {
        self.received.get_or_create(&amqp()).inc();
        if routed {
            self.routed.get_or_create(&amqp()).inc();
        }
    }

    /// A publisher's message body of `bytes` arrived (RabbitMQ `rabbit_msg_size_metrics`,
    /// observed for every publish, routed or not).
    pub fn message_received(&self, bytes: usize) {
        let bytes = bytes as u64;
        let bucket = MESSAGE_SIZE_BUCKETS
            .iter()
            .position(|&(upper, _)| bytes <= upper)
            .unwrap_or(MESSAGE_SIZE_BUCKETS.len());
        self.message_sizes[bucket].fetch_add(1, Ordering::Relaxed);
        self.message_sizes[MESSAGE_SIZE_BUCKETS.len() + 1].fetch_add(bytes, Ordering::Relaxed);
    }

    /// `rabbitmq_message_size_bytes{protocol="amqp091"}` in the text exposition format
    /// (HELP, TYPE, cumulative `_bucket` lines, `_sum`, `_count`), with RabbitMQ's `le`
    /// spellings (`100.0` .. `1e+08`, `+Inf`), which `prometheus-client` would write
    /// otherwise (`1000000.0`) and Prometheus 2 stores verbatim.
    pub fn encode_message_sizes(&self, out: &mut String) {
        use std::fmt::Write;
        let name = "rabbitmq_message_size_bytes";
        let _ = writeln!(
            out,
            "# HELP {name} Size of messages received from publishers.\n# TYPE {name} histogram\n# UNIT {name} bytes"
        );
        let mut cumulative = 0;
        let les = MESSAGE_SIZE_BUCKETS
            .iter()
            .map(|&(_, le)| le)
            .chain(std::iter::once("+Inf"));
        for (i, le) in les.enumerate() {
            cumulative += self.message_sizes[i].load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "{name}_bucket{{protocol=\"{AMQP}\",le=\"{le}\"}} {cumulative}"
            );
        }
        let sum = self.message_sizes[MESSAGE_SIZE_BUCKETS.len() + 1].load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_sum{{protocol=\"{AMQP}\"}} {sum}");
        let _ = writeln!(out, "{name}_count{{protocol=\"{AMQP}\"}} {cumulative}");
    }

    /// A write proposed by this node to Raft group `group` was committed (and applied)
    /// `took` after it was proposed (RabbitMQ/Ra `commit_latency`: the last sample).
    pub fn commit_latency(&self, group: u64, took: std::time::Duration) {
        if let Ok(mut m) = self.commit_latency.lock() {
            m.insert(group, took.as_secs_f64());
        }
    }

    /// The last commit latency of `group` in seconds, if this node proposed to it.
    pub fn commit_latency_of(&self, group: u64) -> Option<f64> {
        self.commit_latency.lock().ok()?.get(&group).copied()
    }

    /// Forgets the commit latency of groups not in `live` (deleted queues).
    pub fn retain_commit_latency(&self, live: &std::collections::HashSet<u64>) {
        if let Ok(mut m) = self.commit_latency.lock() {
            m.retain(|g, _| live.contains(g));
        }
    }

    /// One round of the management statistics' sampler (`crate::http::rates`) took `d`.
    pub fn stats_sampled(&self, d: std::time::Duration) {
        self.stats_sampling_ns.fetch_add(
            u64::try_from(d.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// `n` publishes confirmed (basic.ack to the publisher).
    pub fn confirmed(&self, n: u64) {
        self.confirmed.get_or_create(&amqp()).inc_by(n);
    }

    /// A message went to a client (basic.deliver or basic.get-ok), `redelivered` flag set.
    pub fn delivered(&self, redelivered: bool) {
        self.delivered.get_or_create(&amqp()).inc();
        if redelivered {
            self.redelivered.get_or_create(&amqp()).inc();
        }
    }

    /// `n` deliveries acknowledged by a client.
    pub fn acknowledged(&self, n: u64) {
        self.acknowledged.get_or_create(&amqp()).inc_by(n);
    }

    /// The queue `vhost`/`queue`'s leader dead-lettered one message for `reason`.
    pub fn dead_lettered(
        &self,
        vhost: &str,
        queue: &str,
        reason: DeadLetterReason,
        strategy: Option<DeadLetterStrategy>,
    ) {
        DEAD_LETTERED_TOTAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.dead_lettered[reason_index(reason)]
            .get_or_create(&vec![
                ("queue_type", QUORUM.into()),
                ("dead_letter_strategy", strategy_label(strategy).into()),
            ])
            .inc();
        self.dead_lettered_by_queue
            .get_or_create(&vec![
                ("vhost", vhost.into()),
                ("queue", queue.into()),
                ("reason", reason.as_str().into()),
                ("dead_letter_strategy", strategy_label(strategy).into()),
            ])
            .inc();
    }

    /// `n` at-least-once dead letters were confirmed by their targets and settled.
    pub fn dead_letters_confirmed(&self, n: u64) {
        self.dead_lettered_confirmed
            .get_or_create(&vec![
                ("queue_type", QUORUM.into()),
                ("dead_letter_strategy", "at_least_once".into()),
            ])
            .inc_by(n);
    }

    /// Redrive moved `n` messages out of queue `vhost`/`queue` (committed in
    /// their destinations and removed).
    pub fn redriven(&self, vhost: &str, queue: &str, n: u64) {
        self.redriven
            .get_or_create(&vec![("vhost", vhost.into()), ("queue", queue.into())])
            .inc_by(n);
    }

    /// This node forwarded a meta write to the meta leader `via` a frame
    /// (`"frame"`) or a unary call (`"call"`).
    pub fn meta_write_forwarded(&self, via: &'static str) {
        self.meta_forwarded
            .get_or_create(&vec![("via", via.into())])
            .inc();
    }

    /// The meta leader queued `n` commit hints (`cluster::commit_hints`).
    pub fn commit_hints_queued(&self, n: u64) {
        self.commit_hints.inc_by(n);
    }

    /// One WAL write + `fdatasync` round took `d`.
    pub fn wal_synced(&self, d: std::time::Duration) {
        self.wal_fsync.observe(d.as_secs_f64());
    }

    /// AMQP channels open on this node now (count).
    pub fn open_channels(&self) -> i64 {
        self.channels.get()
    }

    /// Registers the counters and the WAL histogram in `reg` (a scrape, `crate::http::metrics`).
    pub fn register(&self, reg: &mut Registry) {
        // Every strategy/reason series exists from the start (RabbitMQ lists zeros too).
        for reason in REASONS {
            for strategy in [
                None,
                Some(DeadLetterStrategy::AtMostOnce),
                Some(DeadLetterStrategy::AtLeastOnce),
            ] {
                let _ = self.dead_lettered[reason_index(reason)].get_or_create(&vec![
                    ("queue_type", QUORUM.into()),
                    ("dead_letter_strategy", strategy_label(strategy).into()),
                ]);
            }
        }
        self.dead_letters_confirmed(0);
        for f in [
            &self.received,
            &self.routed,
            &self.confirmed,
            &self.delivered,
            &self.redelivered,
            &self.acknowledged,
        ] {
            let _ = f.get_or_create(&amqp());
        }
        let global = [
            (
                "rabbitmq_global_messages_received",
                "Total number of messages received from publishers",
                &self.received,
            ),
            (
                "rabbitmq_global_messages_routed",
                "Total number of messages routed to queues",
                &self.routed,
            ),
            (
                "rabbitmq_global_messages_confirmed",
                "Total number of messages confirmed to publishers",
                &self.confirmed,
            ),
            (
                "rabbitmq_global_messages_delivered",
                "Total number of messages delivered to consumers",
                &self.delivered,
            ),
            (
                "rabbitmq_global_messages_redelivered",
                "Total number of messages redelivered to consumers",
                &self.redelivered,
            ),
            (
                "rabbitmq_global_messages_acknowledged",
                "Total number of messages acknowledged by consumers",
                &self.acknowledged,
            ),
        ];
        for (name, help, f) in global {
            reg.register(name, help, f.clone());
        }
        for reason in REASONS {
            reg.register(
                format!("rabbitmq_global_messages_dead_lettered_{}", reason.as_str()),
                format!(
                    "Total number of messages dead-lettered with reason {}",
                    reason.as_str()
                ),
                self.dead_lettered[reason_index(reason)].clone(),
            );
        }
        reg.register(
            "rabbitmq_global_messages_dead_lettered_confirmed",
            "Total number of messages dead-lettered and confirmed by target queues",
            self.dead_lettered_confirmed.clone(),
        );
        reg.register(
            "quorumq_queue_messages_dead_lettered",
            "Messages dead-lettered by this node's queue leaders, by queue, reason and strategy",
            self.dead_lettered_by_queue.clone(),
        );
        reg.register(
            "quorumq_dead_letters_redriven",
            "Messages moved by redrive (quorumqctl redrive) out of a queue, by vhost and queue",
            self.redriven.clone(),
        );
        let sampling: Counter<f64, AtomicU64> = Counter::default();
        sampling.inc_by(self.stats_sampling_ns.load(Ordering::Relaxed) as f64 / 1e9);
        reg.register(
            "quorumq_stats_sampling_seconds",
            "Time the management statistics' sampler spent sampling message counts (rate(...) = its share of a core)",
            sampling,
        );
        reg.register(
            "quorumq_wal_fsync_seconds",
            "Write-ahead log write + fdatasync rounds",
            self.wal_fsync.clone(),
        );
        reg.register(
            "quorumq_meta_writes_forwarded",
            "Meta writes this node forwarded to the meta group's leader, by frame or unary call",
            self.meta_forwarded.clone(),
        );
        reg.register(
            "quorumq_meta_commit_hints",
            "Commit hints the meta leader queued for followers whose append was in flight",
            self.commit_hints.clone(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_sizes_fall_in_rabbitmqs_buckets_cumulatively() {
        let c = Counters::new();
        for bytes in [0, 100, 101, 1_000, 1_000_000, 100_000_001] {
            c.message_received(bytes);
        }
        let mut out = String::new();
        c.encode_message_sizes(&mut out);
        let sample = |le: &str| {
            let prefix =
                format!("rabbitmq_message_size_bytes_bucket{{protocol=\"amqp091\",le=\"{le}\"}} ");
            out.lines()
                .find_map(|l| l.strip_prefix(prefix.as_str()))
                .unwrap_or_else(|| panic!("no bucket {le} in {out}"))
                .to_owned()
        };
        // Upper bounds are inclusive (RabbitMQ: Size =< Bucket).
        assert_eq!(sample("100.0"), "2");
        assert_eq!(sample("1000.0"), "4");
        assert_eq!(sample("100000.0"), "4");
        assert_eq!(sample("1e+06"), "5");
        assert_eq!(sample("1e+08"), "5");
        assert_eq!(sample("+Inf"), "6");
        assert!(out.contains("rabbitmq_message_size_bytes_sum{protocol=\"amqp091\"} 101001202\n"));
        assert!(out.contains("rabbitmq_message_size_bytes_count{protocol=\"amqp091\"} 6\n"));
        assert!(out.starts_with("# HELP rabbitmq_message_size_bytes "));
    }

    #[test]
    fn commit_latency_is_the_last_sample_and_forgotten_with_the_group() {
        let c = Counters::new();
        c.commit_latency(7, std::time::Duration::from_millis(30));
        c.commit_latency(7, std::time::Duration::from_millis(4));
        c.commit_latency(8, std::time::Duration::from_millis(1));
        assert_eq!(c.commit_latency_of(7), Some(0.004));
        c.retain_commit_latency(&[7].into_iter().collect());
        assert_eq!(c.commit_latency_of(8), None);
        assert_eq!(c.commit_latency_of(7), Some(0.004));
    }
}
