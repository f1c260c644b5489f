//! `GET /api/overview` (totals of what the caller may read, listeners) and
//! `GET /api/whoami`.

use axum::routing::get;
use axum::Router;
use serde_json::{json, Value};

use super::queues::{queue_records, statuses};
use super::vhosts::readable_vhosts;
use super::{ok, ApiResult};
use crate::http::rates::RATES;
use crate::http::{node_name, Api, Started};

/// The overview routes.
pub(super) fn routes() -> Router<Started> {
    Router::new()
        .route("/api/overview", get(overview))
        .route("/api/whoami", get(whoami))
}

pub(super) async fn overview(api: Api) -> ApiResult {
    let b = &api.broker;
    let vhosts = readable_vhosts(&api);
    let records = queue_records(b, &vhosts);
    let statuses = statuses(b, &records).await;
    let (ready, unacked): (u64, u64) = statuses.iter().fold((0, 0), |(r, u), s| {
        (r + s.messages_ready, u + s.messages_unacknowledged)
    });
    let consumers: u64 = statuses.iter().map(|s| s.consumers).sum();
    let exchanges = b
        .with_topology(|t| vhosts.iter().map(|v| t.exchanges(v).count()).sum::<usize>())
        .unwrap_or(0);
    let me = node_name(b.node_id());
    let cfg = b.config();
    let listener = |protocol: &str, addr: &str| {
        let (ip, port) = addr.rsplit_once(':').unwrap_or((addr, "0"));
        json!({"node": me, "protocol": protocol, "ip_address": ip,
               "port": port.parse::<u16>().unwrap_or(0)})
    };
    let mut listeners = vec![
        listener("amqp", &cfg.amqp_listen),
        listener("clustering", &cfg.cluster_listen),
    ];
    if let Some(h) = cfg.http_listen.as_deref().filter(|h| !h.is_empty()) {
        listeners.push(listener("http", h));
    }
    let exchange_types: Vec<Value> = ["direct", "fanout", "headers", "topic"]
        .iter()
        .map(|t| json!({"name": t, "enabled": true}))
        .collect();
    ok(json!({
        "management_version": env!("CARGO_PKG_VERSION"),
        "product_name": "quorumq",
        "product_version": env!("CARGO_PKG_VERSION"),
        "rabbitmq_version": "3.10.8",
        "rates_mode": "basic",
        "cluster_name": format!("quorumq-{:016x}", b.peers().cluster_id()),
        "node": me,
        "exchange_types": exchange_types,
        "object_totals": {
            "connections": b.connections().total(),
            "channels": b.tracking().channel_count(),
            "consumers": consumers,
            "exchanges": exchanges,
            "queues": records.len(),
        },
        "queue_totals": {
            "messages": ready + unacked,
            "messages_ready": ready,
            "messages_unacknowledged": unacked,
        },
        "listeners": listeners,
        "message_stats": RATES.node_message_stats(b.tracking().counts()),
    }))
}

pub(super) async fn whoami(api: Api) -> ApiResult {
    ok(json!({"name": api.caller.user, "tags": api.caller.tags}))
}
