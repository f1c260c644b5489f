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

/// The node's metrics now, in the OpenMetrics text format.
pub async fn scrape(broker: &Broker) -> String {
    let mut reg = Registry::default();
    COUNTERS.register(&mut reg);
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
    gauge(
        &mut reg,
        "rabbitmq_queues",
        "Queues in the cluster",
        broker
            .with_topology(|t| t.queues().count() as u64)
            .unwrap_or(0),
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
    let term = Family::<Labels, Counter<u64, AtomicU64>>::default();
    let written = PerObject::new();
    let applied = PerObject::new();
    let snapshot = PerObject::new();
    let leader = PerObject::new();
    let me = broker.node_id();
    let mut all_consumers = 0;
    for h in broker.queue_handles() {
        let labels: Labels = vec![("vhost", h.vhost.clone()), ("queue", h.name.clone())];
        if let Some(raft) = h.route().and_then(|r| r.raft()) {
            let m = raft.metrics().borrow().clone();
            term.get_or_create(&labels).inc_by(m.current_term);
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
            "Raft log last written index",
            written,
        ),
        (
            "rabbitmq_raft_log_last_applied_index",
            "Raft log last applied index",
            applied,
        ),
        (
            "rabbitmq_raft_log_snapshot_index",
            "Raft log snapshot index",
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
    reg.register("rabbitmq_raft_term", "Current Raft term number", term);
    let mut out = String::new();
    if let Err(e) = encode(&mut out, &reg) {
        tracing::warn!(error = %e, "encoding metrics failed");
    }
    out
}
