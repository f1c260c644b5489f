//! The node and its cluster: `status`, `cluster_status`, rabbitmqctl
//! `forget_cluster_node`, and rabbitmq-upgrade's `drain` / `revive` (maintenance
//! mode of the node asked with `--node`).

use anyhow::bail;
use quorumq_proto::v1::{
    ClusterStatusReply, ClusterStatusRequest, DrainRequest, ForgetRequest, ReviveRequest,
    StatusReply, StatusRequest,
};
use serde::Serialize;
use serde_json::{json, Value};

use crate::membership::emit_member_results;
use crate::output::{banner, emit, listing, to_json, Formatter, Row};
use crate::{ok_or_bail, Client};

/// `status` of the node asked ([`status_text`]).
///
/// Errors: the call fails.
pub async fn status(c: &mut Client, f: Formatter) -> anyhow::Result<()> {
    let s = c.status(StatusRequest {}).await?.into_inner();
    emit(&status_text(f, &s));
    Ok(())
}

/// `cluster_status` as the node asked sees it ([`cluster_status_text`]).
///
/// Errors: the call fails.
pub async fn cluster_status(c: &mut Client, f: Formatter) -> anyhow::Result<()> {
    let r = c.cluster_status(ClusterStatusRequest {}).await?;
    emit(&cluster_status_text(f, r.into_inner()));
    Ok(())
}

/// `drain`: maintenance mode; prints how many queue leaderships moved, stayed (no other
/// member online) and failed.
///
/// Errors: the call fails; some leadership did not move (after printing).
pub async fn drain(c: &mut Client, f: Formatter) -> anyhow::Result<()> {
    banner(f, "Will put node into maintenance mode. The node will transfer its queue leaderships to other members and lead nothing until revived...\n");
    let r = c.drain(DrainRequest {}).await?.into_inner();
    let row = Row(vec![
        ("moved", json!(r.moved)),
        ("kept", json!(r.kept)),
        ("failed", json!(r.failed)),
    ]);
    emit(&match f {
        Formatter::Json => format!("{}\n", to_json(&row)),
        Formatter::Table => format!(
            "leaderships moved: {}\nleaderships kept (no other member online): {}\n{}",
            r.moved,
            r.kept,
            r.failed
                .iter()
                .map(|e| format!("not moved: {e}\n"))
                .collect::<String>()
        ),
    });
    if !r.failed.is_empty() {
        bail!("{} queue leadership(s) did not move", r.failed.len());
    }
    Ok(())
}

/// `revive`: ends maintenance mode.
///
/// Errors: the call fails, or the node refuses.
pub async fn revive(c: &mut Client, f: Formatter) -> anyhow::Result<()> {
    banner(f, "Will take node out of maintenance mode...\n");
    ok_or_bail(c.revive(ReviveRequest {}).await?.into_inner())
}

/// `forget_cluster_node NODE`: removes a stopped node from the cluster and from every
/// queue it was a member of; prints the queues changed.
///
/// Errors: the call fails, or the node refuses (NODE still runs, is unknown).
pub async fn forget(c: &mut Client, f: Formatter, node: u64) -> anyhow::Result<()> {
    banner(f, &format!("Removing node {node} from the cluster\n"));
    let r = c
        .forget_cluster_node(ForgetRequest {
            node,
            forwarded: false,
        })
        .await?
        .into_inner();
    if !r.ok {
        bail!("{}", r.error);
    }
    emit_member_results(f, &r.queues);
    Ok(())
}

/// `cluster_status` node columns (table and JSON alike).
/// `version` … `draining` are the node's own `status` (null when it is not
/// running or did not answer): uptime in seconds, quorum queues it leads,
/// replicas it holds.
pub const NODE_COLUMNS: &[&str] = &[
    "id",
    "cluster_addr",
    "amqp_addr",
    "running",
    "version",
    "uptime_s",
    "leaders",
    "replicas",
    "draining",
];

/// `cluster_status --formatter json`.
#[derive(Serialize)]
struct ClusterView {
    /// Every node (`NODE_COLUMNS`), sorted by id.
    nodes: Vec<Row>,
    /// Ids of the running nodes, sorted.
    running_nodes: Vec<u64>,
    /// Meta group leader; null while unknown.
    meta_leader: Option<u64>,
}

/// `cluster_status`, nodes sorted by id (`amqp_addr` "" while unknown).
/// JSON, on one line: `{"nodes":[{NODE_COLUMNS...}...],"running_nodes":
/// [ids],"meta_leader":id|null}`. Table: the answering node and meta leader
/// ("unknown" while none), then the nodes.
pub fn cluster_status_text(formatter: Formatter, mut r: ClusterStatusReply) -> String {
    r.nodes.sort_by_key(|n| n.id);
    let nodes: Vec<Row> = r
        .nodes
        .iter()
        .map(|n| {
            Row(vec![
                ("id", json!(n.id)),
                ("cluster_addr", json!(n.cluster_addr)),
                ("amqp_addr", json!(n.amqp_addr)),
                ("running", json!(n.running)),
                ("version", json!(n.version)),
                ("uptime_s", json!(n.uptime_s)),
                ("leaders", json!(n.leaders)),
                ("replicas", json!(n.replicas)),
                ("draining", json!(n.draining)),
            ])
        })
        .collect();
    match formatter {
        Formatter::Json => {
            let running_nodes = r.nodes.iter().filter(|n| n.running).map(|n| n.id);
            let view = ClusterView {
                nodes,
                running_nodes: running_nodes.collect(),
                meta_leader: r.meta_leader,
            };
            format!("{}\n", to_json(&view))
        }
        Formatter::Table => {
            let leader = r.meta_leader.map_or("unknown".into(), |l| l.to_string());
            format!(
                "Cluster status of node {} ...\nmeta_leader: {leader}\n{}",
                r.node_id,
                listing(formatter, NODE_COLUMNS, &nodes)
            )
        }
    }
}

/// `status`. JSON: `{"node_id","version","queues","members","meta_leader"}`
/// (`queues` counts those with a replica on the answering node; `members`
/// are the cluster's node ids; `meta_leader` null while unknown). Table:
/// `key: value` lines.
pub fn status_text(formatter: Formatter, s: &StatusReply) -> String {
    let row = Row(vec![
        ("node_id", json!(s.node_id)),
        ("version", json!(s.version)),
        ("uptime_s", json!(s.uptime_s)),
        ("queues", json!(s.queues)),
        ("leaders", json!(s.leaders)),
        ("replicas", json!(s.replicas)),
        ("draining", json!(s.draining)),
        ("members", json!(s.members)),
        ("meta_leader", json!(s.meta_leader)),
    ]);
    match formatter {
        Formatter::Json => format!("{}\n", to_json(&row)),
        Formatter::Table => row
            .0
            .iter()
            .map(|(k, v)| match v {
                Value::String(text) => format!("{k}: {text}\n"),
                v => format!("{k}: {v}\n"),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::testing::parse;
    use quorumq_proto::v1::ClusterStatusNode;

    fn node(id: u64, running: bool) -> ClusterStatusNode {
        ClusterStatusNode {
            id,
            cluster_addr: format!("127.0.0.1:{}", 5679 + id),
            amqp_addr: format!("127.0.0.1:{}", 5671 + id),
            running,
            version: running.then(|| "0.1.0".into()),
            uptime_s: running.then_some(60),
            leaders: running.then_some(id),
            replicas: running.then_some(3),
            draining: running.then_some(false),
        }
    }

    #[test]
    fn cluster_status_json_lists_nodes_by_id_and_the_running_ones() {
        let r = ClusterStatusReply {
            nodes: vec![node(3, true), node(1, true), node(2, false)],
            meta_leader: Some(1),
            node_id: 1,
        };
        let text = cluster_status_text(Formatter::Json, r);
        assert_eq!(text.lines().count(), 1, "{text}");
        assert_eq!(
            parse(&text),
            json!({
                "nodes": [
                    {"id": 1, "cluster_addr": "127.0.0.1:5680", "amqp_addr": "127.0.0.1:5672", "running": true,
                     "version": "0.1.0", "uptime_s": 60, "leaders": 1, "replicas": 3, "draining": false},
                    {"id": 2, "cluster_addr": "127.0.0.1:5681", "amqp_addr": "127.0.0.1:5673", "running": false,
                     "version": null, "uptime_s": null, "leaders": null, "replicas": null, "draining": null},
                    {"id": 3, "cluster_addr": "127.0.0.1:5682", "amqp_addr": "127.0.0.1:5674", "running": true,
                     "version": "0.1.0", "uptime_s": 60, "leaders": 3, "replicas": 3, "draining": false},
                ],
                "running_nodes": [1, 3],
                "meta_leader": 1,
            })
        );
        assert!(text.starts_with("{\"nodes\":[{\"id\":1,"), "{text}");
        let none = ClusterStatusReply {
            nodes: vec![node(1, true)],
            meta_leader: None,
            node_id: 1,
        };
        assert_eq!(
            parse(&cluster_status_text(Formatter::Json, none))["meta_leader"],
            Value::Null
        );
    }

    #[test]
    fn cluster_status_table_shows_leader_and_one_line_per_node() {
        let mut unknown = node(3, false);
        unknown.amqp_addr.clear();
        let r = ClusterStatusReply {
            nodes: vec![node(2, false), node(1, true), unknown],
            meta_leader: None,
            node_id: 2,
        };
        let t = cluster_status_text(Formatter::Table, r);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines,
            [
                "Cluster status of node 2 ...",
                "meta_leader: unknown",
                "id\tcluster_addr\tamqp_addr\trunning\tversion\tuptime_s\tleaders\treplicas\tdraining",
                "1\t127.0.0.1:5680\t127.0.0.1:5672\ttrue\t0.1.0\t60\t1\t3\tfalse",
                "2\t127.0.0.1:5681\t127.0.0.1:5673\tfalse\t\t\t\t\t",
                "3\t127.0.0.1:5682\t\tfalse\t\t\t\t\t",
            ]
        );
        let led = ClusterStatusReply {
            nodes: vec![node(1, true)],
            meta_leader: Some(1),
            node_id: 1,
        };
        assert!(
            cluster_status_text(Formatter::Table, led).contains("\nmeta_leader: 1\n"),
            "leader shown"
        );
    }

    #[test]
    fn status_json_and_table() {
        let mut s = StatusReply {
            node_id: 1,
            version: "0.1.0".into(),
            queues: 2,
            connections: 0,
            members: vec![1, 2],
            meta_leader: None,
            uptime_s: 42,
            leaders: 1,
            replicas: 2,
            draining: false,
        };
        assert_eq!(
            parse(&status_text(Formatter::Json, &s)),
            json!({"node_id": 1, "version": "0.1.0", "uptime_s": 42, "queues": 2, "leaders": 1,
                   "replicas": 2, "draining": false, "members": [1, 2], "meta_leader": null})
        );
        s.meta_leader = Some(2);
        s.draining = true;
        assert_eq!(
            status_text(Formatter::Json, &s),
            "{\"node_id\":1,\"version\":\"0.1.0\",\"uptime_s\":42,\"queues\":2,\"leaders\":1,\"replicas\":2,\"draining\":true,\"members\":[1,2],\"meta_leader\":2}\n"
        );
        assert_eq!(
            status_text(Formatter::Table, &s),
            "node_id: 1\nversion: 0.1.0\nuptime_s: 42\nqueues: 2\nleaders: 1\nreplicas: 2\ndraining: true\nmembers: [1,2]\nmeta_leader: 2\n"
        );
    }
}
