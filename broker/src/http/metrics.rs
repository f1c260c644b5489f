//! `GET /metrics`: the node's Prometheus metrics now, in the OpenMetrics text
//! format — the process-wide counters of `crate::metrics` and gauges read at
//! scrape time from the node (connections, channels, queues, and per queue
//! and Raft group with a replica here). Names: see `crate::metrics`.

use std::sync::atomic::{AtomicI64, AtomicU64};

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::metrics::{Labels, COUNTERS};
use crate::node::Broker;

fn gauge(reg: &mut Registry, name: &str, help: &str, v: u64) {
    let g: Gauge<i64, AtomicI64> = Gauge::default();
    g.set(i64::try_from(v).unwrap_or(i64::MAX));
    reg.register(name, help, g);
}

/// Per-queue or per-group gauges: one family, set at scrape time.
#[derive(Clone)]
struct PerObject {
    family: Family<Labels, Gauge<i64, AtomicI64>>,
}

impl PerObject {
    fn new() -> Self {
        PerObject {
            family: Family::default(),
        }
    }

    fn set(&self, labels: &Labels, v: u64) {
        self.family
            .get_or_create(labels)
            .set(i64::try_from(v).unwrap_or(i64::MAX));
    }
}

/// Open file descriptors of this process (entries of `/proc/self/fd`).
fn open_fds() -> Option<u64> {
    std::fs::read_dir("/proc/self/fd")
        .ok()
        .map(|d| d.count() as u64)
}

/// `quorumq_queue_dead_letters_held{vhost,queue,reason}` of a queue this node leads
/// holding `total` dead letters: the worker's leader-local record per reason
/// (`crate::dead_letter::held`, no body is read), the rest `pending`.
fn held_by_reason(
    family: &PerObject,
    labels: &Labels,
    h: &crate::queue::handle::QueueHandle,
    total: u64,
) {
    use crate::dead_letter::held::{HoldReason, PENDING};
    let counts = h.held_reasons().counts();
    let mut known = 0;
    for r in HoldReason::ALL {
        let n = counts.get(&r).copied().unwrap_or(0);
        known += n;
        let mut l = labels.clone();
        l.push(("reason", r.as_str().to_string()));
        family.set(&l, n);
    }
    let mut l = labels.clone();
    l.push(("reason", PENDING.to_string()));
    family.set(&l, total.saturating_sub(known));
}

/// When the process started serving HTTP (its uptime's origin; forced in
/// [`crate::http::serve`] at process start).
pub static STARTED: std::sync::LazyLock<std::time::Instant> =
    std::sync::LazyLock::new(std::time::Instant::now);

/// The process's open file limit (`Max open files` of `/proc/self/limits`, soft).
fn max_fds() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// Which endpoint is scraped: the `rabbitmq_endpoint` label of `rabbitmq_identity_info`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `/metrics`: `rabbitmq_endpoint="aggregated"`, RabbitMQ's label for its default
    /// endpoint (which sorts before `detailed`, so the dashboards' hidden `$endpoint`
    /// variable picks it when both are scraped); quorumq serves its per-object series
    /// here too.
    Default,
    /// `/metrics/per-object`: the same series.
    PerObject,
    /// `/metrics/detailed`: only the asked families, `rabbitmq_detailed_` names.
    Detailed,
}

fn gauge_f(reg: &mut Registry, name: &str, help: &str, v: f64) {
    let g: Gauge<f64, AtomicU64> = Gauge::default();
    g.set(v);
    reg.register(name, help, g);
}

fn identity(reg: &mut Registry, broker: &Broker, endpoint: Endpoint) {
    let cluster = format!("quorumq-{:016x}", broker.peers().cluster_id());
    let info: Family<Labels, Gauge<i64, AtomicI64>> = Family::default();
    info.get_or_create(&vec![
        ("rabbitmq_node", crate::http::node_name(broker.node_id())),
        ("rabbitmq_cluster", cluster.clone()),
        ("rabbitmq_cluster_permanent_id", cluster),
        (
            "rabbitmq_endpoint",
            match endpoint {
                Endpoint::Default => "aggregated",
                Endpoint::PerObject => "per-object",
                Endpoint::Detailed => "detailed",
            }
            .to_owned(),
        ),
    ])
    .set(1);
    reg.register(
        "rabbitmq_identity_info",
        "RabbitMQ node & cluster identity info",
        info,
    );
}

/// The node's metrics now, in the OpenMetrics text format (`/metrics`).
pub async fn scrape(broker: &Broker) -> String {
    scrape_endpoint(broker, Endpoint::Default)
}

/// `/metrics/detailed?family=F&family=G` (RabbitMQ `rabbitmq_prometheus`): identity and
/// the asked families under `rabbitmq_detailed_` names. Families served:
/// `queue_coarse_metrics` (ready, unacked, total messages per queue),
/// `queue_consumer_count`, `connection_churn_metrics` (connections, channels and queues
/// opened/closed/declared/created/deleted), `ra_metrics` (Raft term and indexes). Others
/// give no series, as an unknown family does on RabbitMQ.
pub fn scrape_detailed(broker: &Broker, families: &[String]) -> String {
    let full = scrape_endpoint(broker, Endpoint::Detailed);
    let mut names: Vec<&str> = Vec::new();
    for f in families {
        names.extend(match f.as_str() {
            "queue_coarse_metrics" => &[
                "rabbitmq_queue_messages_ready",
                "rabbitmq_queue_messages_unacked",
                "rabbitmq_queue_messages",
            ][..],
            "queue_consumer_count" => &["rabbitmq_queue_consumers"][..],
            "connection_churn_metrics" => &[
                "rabbitmq_connections_opened",
                "rabbitmq_connections_closed",
                "rabbitmq_channels_opened",
                "rabbitmq_channels_closed",
                "rabbitmq_queues_declared",
                "rabbitmq_queues_created",
                "rabbitmq_queues_deleted",
            ][..],
            "ra_metrics" => &[
                "rabbitmq_raft_term",
                "rabbitmq_raft_commit_index",
                "rabbitmq_raft_last_written_index",
                "rabbitmq_raft_last_applied",
                "rabbitmq_raft_snapshot_index",
                "rabbitmq_raft_log_commit_index",
                "rabbitmq_raft_log_last_written_index",
                "rabbitmq_raft_log_last_applied_index",
                "rabbitmq_raft_log_snapshot_index",
                "rabbitmq_raft_commit_latency_seconds",
            ][..],
            _ => &[][..],
        });
    }
    names.push("rabbitmq_identity_info");
    let mut out = String::new();
    for line in full.lines() {
        let name = line
            .strip_prefix("# HELP ")
            .or_else(|| line.strip_prefix("# TYPE "))
            .or_else(|| line.strip_prefix("# UNIT "))
            .unwrap_or(line);
        let name = name.split([' ', '{']).next().unwrap_or("");
        let family = name.strip_suffix("_total").unwrap_or(name);
        if line == "# EOF" {
            out.push_str(line);
            out.push('\n');
        } else if names.contains(&family) {
            if family == "rabbitmq_identity_info" {
                out.push_str(line);
            } else {
                out.push_str(&line.replacen("rabbitmq_", "rabbitmq_detailed_", 1));
            }
            out.push('\n');
        }
    }
    out
}

/// The node's metrics for `endpoint` (`/metrics`, `/metrics/per-object`).
pub fn scrape_endpoint(broker: &Broker, endpoint: Endpoint) -> String {
    let mut reg = Registry::default();
    COUNTERS.register(&mut reg);
    identity(&mut reg, broker, endpoint);
    let build: Family<Labels, Gauge<i64, AtomicI64>> = Family::default();
    build
        .get_or_create(&vec![
            ("rabbitmq_version", "3.10.8".to_owned()),
            ("prometheus_plugin_version", "3.10.8".to_owned()),
            (
                "prometheus_client_version",
                "prometheus-client (Rust)".to_owned(),
            ),
            (
                "erlang_version",
                format!("quorumq {}", env!("CARGO_PKG_VERSION")),
            ),
        ])
        .set(1);
    reg.register(
        "rabbitmq_build_info",
        "RabbitMQ & Erlang/OTP version info",
        build,
    );
    gauge_f(
        &mut reg,
        "rabbitmq_erlang_uptime_seconds",
        "Node uptime",
        STARTED.elapsed().as_secs_f64(),
    );
    for (name, help, v) in crate::node_counters::NODE.families() {
        if name.starts_with("rabbitmq_global_") {
            // RabbitMQ's global counters carry the protocol; the dashboards subtract
            // one from another (received_confirm - confirmed), matching on it.
            let f: Family<Labels, Counter<u64, AtomicU64>> = Family::default();
            f.get_or_create(&vec![("protocol", "amqp091".to_owned())])
                .inc_by(v);
            reg.register(name, help, f);
        } else {
            let c: Counter<u64, AtomicU64> = Counter::default();
            c.inc_by(v);
            reg.register(name, help, c);
        }
    }
    let t = broker.tracking();
    for (name, help, v) in [
        (
            "rabbitmq_connections_opened",
            "Total number of connections opened",
            &t.connections_opened,
        ),
        (
            "rabbitmq_connections_closed",
            "Total number of connections closed or terminated",
            &t.connections_closed,
        ),
        (
            "rabbitmq_channels_opened",
            "Total number of channels opened",
            &t.channels_opened,
        ),
        (
            "rabbitmq_channels_closed",
            "Total number of channels closed",
            &t.channels_closed,
        ),
    ] {
        let c: Counter<u64, AtomicU64> = Counter::default();
        c.inc_by(v.load(std::sync::atomic::Ordering::Relaxed));
        reg.register(name, help, c);
    }
    let (mut publishers, mut channel_consumers) = (0u64, 0u64);
    for c in t.connections() {
        for (_, ch) in c.channels() {
            if ch.counts.publish.load(std::sync::atomic::Ordering::Relaxed) > 0 {
                publishers += 1;
            }
            channel_consumers += ch.consumers.lock().map(|v| v.len() as u64).unwrap_or(0);
        }
    }
    for (name, help, v) in [
        (
            "rabbitmq_global_publishers",
            "Current number of publishers",
            publishers,
        ),
        (
            "rabbitmq_global_consumers",
            "Current number of consumers",
            channel_consumers,
        ),
    ] {
        let f: Family<Labels, Gauge<i64, AtomicI64>> = Family::default();
        f.get_or_create(&vec![("protocol", "amqp091".to_owned())])
            .set(i64::try_from(v).unwrap_or(i64::MAX));
        reg.register(name, help, f);
    }
    gauge(
        &mut reg,
        "rabbitmq_resident_memory_limit_bytes",
        "Memory high watermark in bytes",
        broker.alarms().limits().0,
    );
    if let Some(free) = crate::alarms::disk_free_bytes(&broker.config().data_dir) {
        gauge(
            &mut reg,
            "rabbitmq_disk_space_available_bytes",
            "Disk space available in bytes",
            free,
        );
    }
    gauge(
        &mut reg,
        "rabbitmq_disk_space_available_limit_bytes",
        "Free disk space low watermark in bytes",
        broker.config().disk_free_limit_bytes,
    );
    if let Some(max) = max_fds() {
        gauge(
            &mut reg,
            "rabbitmq_process_max_fds",
            "Open file descriptors limit",
            max,
        );
    }
    gauge(
        &mut reg,
        "rabbitmq_connections",
        "Connections currently open on this node",
        broker
            .connections()
            .local()
            .values()
            .map(|&n| u64::from(n))
            .sum(),
    );
    gauge(
        &mut reg,
        "rabbitmq_channels",
        "Channels currently open on this node",
        u64::try_from(COUNTERS.open_channels()).unwrap_or(0),
    );
    let led_here = broker
        .queue_handles()
        .iter()
        .filter(|h| h.is_local_leader() || (h.route().is_none() && h.has_replica()))
        .count() as u64;
    gauge(
        &mut reg,
        "rabbitmq_queues",
        "Queues available (led by this node, as RabbitMQ counts a node's queues)",
        led_here,
    );
    if let Some(rss) = crate::alarms::rss_bytes() {
        gauge(
            &mut reg,
            "rabbitmq_process_resident_memory_bytes",
            "Memory used in bytes",
            rss,
        );
    }
    if let Some(fds) = open_fds() {
        gauge(
            &mut reg,
            "rabbitmq_process_open_fds",
            "Open file descriptors",
            fds,
        );
    }
    let ready = PerObject::new();
    let unacked = PerObject::new();
    let total = PerObject::new();
    let consumers = PerObject::new();
    let dlx = PerObject::new();
    let delayed = PerObject::new();
    let held = PerObject::new();
    let term = PerObject::new();
    let commit = PerObject::new();
    let latency: Family<Labels, Gauge<f64, AtomicU64>> = Family::default();
    let written = PerObject::new();
    let applied = PerObject::new();
    let snapshot = PerObject::new();
    let leader = PerObject::new();
    let me = broker.node_id();
    let mut all_consumers = 0;
    let mut groups = std::collections::HashSet::new();
    for h in broker.queue_handles() {
        let labels: Labels = vec![("vhost", h.vhost.clone()), ("queue", h.name.clone())];
        groups.insert(h.group);
        if let Some(raft) = h.route().and_then(|r| r.raft()) {
            let m = raft.metrics().borrow().clone();
            term.set(&labels, m.current_term);
            // openraft 0.9 reports no commit index: the applied index stands in (on a
            // leader it trails the commit index only by the apply queue).
            commit.set(&labels, m.last_applied.map_or(0, |l| l.index));
            if let Some(s) = COUNTERS.commit_latency_of(h.group) {
                latency.get_or_create(&labels).set(s);
            }
            written.set(&labels, m.last_log_index.unwrap_or(0));
            applied.set(&labels, m.last_applied.map_or(0, |l| l.index));
            snapshot.set(&labels, m.snapshot.map_or(0, |l| l.index));
            leader.set(&labels, u64::from(m.current_leader == Some(me)));
        }
        let leads_here = h.is_local_leader() || (h.route().is_none() && h.has_replica());
        if let Some(st) = h.local_status().filter(|_| leads_here || !h.is_quorum()) {
            ready.set(&labels, st.messages_ready);
            unacked.set(&labels, st.messages_unacknowledged);
            total.set(
                &labels,
                st.messages_ready + st.messages_unacknowledged + st.messages_delayed,
            );
            delayed.set(&labels, st.messages_delayed);
            consumers.set(&labels, st.consumers);
            dlx.set(&labels, st.dead_letter_held);
            if st.dead_letter_held > 0 {
                held_by_reason(&held, &labels, &h, st.dead_letter_held);
            }
            all_consumers += st.consumers;
        }
    }
    gauge(
        &mut reg,
        "rabbitmq_consumers",
        "Consumers on the queues this node leads",
        all_consumers,
    );
    for (name, help, f) in [
        (
            "rabbitmq_queue_messages_ready",
            "Messages ready to be delivered to consumers",
            ready,
        ),
        (
            "rabbitmq_queue_messages_unacked",
            "Messages delivered to consumers but not yet acknowledged",
            unacked,
        ),
        (
            "rabbitmq_queue_messages",
            "Sum of ready, unacknowledged and delayed messages - total queue depth",
            total,
        ),
        (
            "rabbitmq_queue_messages_delayed",
            "Messages waiting for their delayed retry before they are ready again",
            delayed,
        ),
        (
            "rabbitmq_queue_consumers",
            "Consumers on a queue",
            consumers,
        ),
        (
            "quorumq_queue_messages_dlx",
            "At-least-once dead letters held by the queue until their targets confirm",
            dlx,
        ),
        (
            "quorumq_queue_dead_letters_held",
            "At-least-once dead letters held by the queue, by why its worker last could not forward them (pending: not tried since this node leads)",
            held,
        ),
        (
            "rabbitmq_raft_log_last_written_index",
            "Raft log last written index (RabbitMQ 3.x name of rabbitmq_raft_last_written_index)",
            written.clone(),
        ),
        (
            "rabbitmq_raft_log_last_applied_index",
            "Raft log last applied index (RabbitMQ 3.x name of rabbitmq_raft_last_applied)",
            applied.clone(),
        ),
        (
            "rabbitmq_raft_log_snapshot_index",
            "Raft log snapshot index (RabbitMQ 3.x name of rabbitmq_raft_snapshot_index)",
            snapshot.clone(),
        ),
        (
            "rabbitmq_raft_log_commit_index",
            "Raft log commit index (RabbitMQ 3.x name of rabbitmq_raft_commit_index; quorumq: the last applied index)",
            commit.clone(),
        ),
        (
            "rabbitmq_raft_last_written_index",
            "Last fully written and fsynced index of the log",
            written,
        ),
        (
            "rabbitmq_raft_last_applied",
            "Last applied index",
            applied,
        ),
        (
            "rabbitmq_raft_snapshot_index",
            "Current snapshot index",
            snapshot,
        ),
        (
            "quorumq_raft_leader",
            "1 when this node leads the queue's Raft group",
            leader,
        ),
    ] {
        reg.register(name, help, f.family);
    }
    reg.register(
        "rabbitmq_raft_term",
        "Current Raft term number",
        term.family,
    );
    reg.register(
        "rabbitmq_raft_commit_index",
        "Raft commit index (quorumq: the last applied index)",
        commit.family,
    );
    reg.register(
        "rabbitmq_raft_commit_latency_seconds",
        "Time the last write this node proposed to the queue took from proposal to commit (and apply)",
        latency,
    );
    COUNTERS.retain_commit_latency(&groups);
    let mut out = String::new();
    if let Err(e) = encode(&mut out, &reg) {
        tracing::warn!(error = %e, "encoding metrics failed");
    }
    // The message size histogram with RabbitMQ's `le` spellings, before `# EOF`.
    let eof = out.rfind("# EOF").unwrap_or(out.len());
    let mut sizes = String::new();
    COUNTERS.encode_message_sizes(&mut sizes);
    out.insert_str(eof, &sizes);
    out
}
