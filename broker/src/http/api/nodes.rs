//! `GET /api/nodes`: every node of the cluster, its addresses and alarms; the answering
//! node adds its uptime, memory, disk and drain state.

use axum::routing::get;
use axum::Router;
use serde_json::{json, Value};

use super::{ok, ApiResult};
use crate::http::{node_name, Api, Started};

/// The node routes.
pub(super) fn routes() -> Router<Started> {
    Router::new().route("/api/nodes", get(nodes))
}

pub(super) async fn nodes(api: Api) -> ApiResult {
    let b = &api.broker;
    let me = b.node_id();
    let cluster = b.cluster_status();
    let (memory_limit, disk_limit) = b.alarms().limits();
    let local = b.alarms().local();
    let remote = b.alarms().remote();
    let list: Vec<Value> = cluster
        .nodes
        .iter()
        .map(|n| {
            let mut v = json!({
                "name": node_name(n.id),
                "type": "disc",
                "running": n.running,
                "cluster_addr": n.cluster_addr,
                "amqp_addr": n.amqp_addr,
                "mem_alarm": remote.get(&n.id).is_some_and(|a| a.memory),
                "disk_free_alarm": remote.get(&n.id).is_some_and(|a| a.disk),
            });
            if n.id == me {
                let extra = json!({
                    "uptime": b.detector().uptime().as_millis() as u64,
                    "mem_used": crate::alarms::rss_bytes(),
                    "mem_limit": memory_limit,
                    "mem_alarm": local.memory,
                    "disk_free": crate::alarms::disk_free_bytes(&b.config().data_dir),
                    "disk_free_limit": disk_limit,
                    "disk_free_alarm": local.disk,
                    "os_pid": std::process::id().to_string(),
                    "processors": std::thread::available_parallelism().map_or(1, |n| n.get()),
                    "being_drained": b.detector().is_draining(),
                });
                merge(&mut v, extra);
            }
            v
        })
        .collect();
    ok(Value::Array(list))
}

fn merge(into: &mut Value, from: Value) {
    if let (Value::Object(a), Value::Object(b)) = (into, from) {
        a.extend(b);
    }
}
