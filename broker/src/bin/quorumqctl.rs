//! `quorumqctl`: operator CLI over the admin gRPC API, shaped like
//! rabbitmqctl (`set_policy NAME PATTERN DEFINITION [--priority N]
//! [--apply-to queues|exchanges|all]`, `clear_policy`, `list_policies`,
//! `list_queues`, `cluster_status`, `status`).
//!
//! `--formatter table|json` (anywhere on the line, default `table`) picks the
//! output of the listing commands: `table` is tab-separated with a header
//! line; `json` is what rabbitmqctl's json formatter prints — one JSON array
//! of objects for lists (`list_queues`, `list_policies`), one object for
//! `cluster_status` and `status`.

use std::io::Write;

use anyhow::bail;
use clap::{Parser, Subcommand, ValueEnum};
use quorumq_proto::v1::admin_client::AdminClient;
use quorumq_proto::v1::{
    ClearPolicyRequest, ClusterStatusReply, ClusterStatusRequest, ListPoliciesRequest,
    ListQueuesRequest, Policy, QueueInfo, SetPolicyRequest, StatusReply, StatusRequest,
};
use serde::Serialize;
use serde_json::Value;

#[derive(Parser, Debug)]
#[command(name = "quorumqctl", version, about = "Operate a quorumq node")]
struct Args {
    /// Node's cluster/admin address.
    #[arg(long, default_value = "http://127.0.0.1:5680", env = "QUORUMQ_ADMIN")]
    node: String,
    /// Virtual host.
    #[arg(short = 'p', long, default_value = "/")]
    vhost: String,
    /// Output format of listing and status commands (rabbitmqctl `--formatter`).
    #[arg(long, value_enum, default_value_t = Formatter::Table, global = true)]
    formatter: Formatter,
    #[command(subcommand)]
    cmd: Cmd,
}

/// Output format (rabbitmqctl `--formatter`); other values are refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Formatter {
    /// Tab-separated columns after a header line.
    Table,
    /// JSON: an array of objects for lists, an object otherwise.
    Json,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Node status.
    Status,
    /// Sets a policy: NAME PATTERN DEFINITION(JSON).
    #[command(name = "set_policy")]
    SetPolicy {
        name: String,
        pattern: String,
        definition: String,
        #[arg(long, default_value_t = 0)]
        priority: i32,
        #[arg(long = "apply-to", default_value = "all")]
        apply_to: String,
    },
    /// Clears a policy.
    #[command(name = "clear_policy")]
    ClearPolicy { name: String },
    /// Lists policies.
    #[command(name = "list_policies")]
    ListPolicies,
    /// Lists queues: type, message counts, leader and replicas.
    #[command(name = "list_queues")]
    ListQueues,
    /// Cluster nodes, which of them run, and the meta leader.
    #[command(name = "cluster_status")]
    ClusterStatus,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let node = if args.node.starts_with("http") {
        args.node.clone()
    } else {
        format!("http://{}", args.node)
    };
    let mut c = AdminClient::connect(node).await?;
    match args.cmd {
        Cmd::Status => {
            let s = c.status(StatusRequest {}).await?.into_inner();
            emit(&match args.formatter {
                Formatter::Json => format!("{}\n", status_json(&s)),
                Formatter::Table => format!(
                    "node_id: {}\nversion: {}\nqueues: {}\nmembers: {:?}\n",
                    s.node_id, s.version, s.queues, s.members
                ),
            });
        }
        Cmd::ClusterStatus => {
            let r = c
                .cluster_status(ClusterStatusRequest {})
                .await?
                .into_inner();
            emit(&match args.formatter {
                Formatter::Json => format!("{}\n", cluster_status_json(&r)),
                Formatter::Table => cluster_status_table(&r),
            });
        }
        Cmd::SetPolicy {
            name,
            pattern,
            definition,
            priority,
            apply_to,
        } => {
            emit(&format!("Setting policy \"{name}\" for pattern \"{pattern}\" to \"{definition}\" with priority \"{priority}\" for vhost \"{}\" ...\n", args.vhost));
            let policy = Policy {
                vhost: args.vhost,
                name,
                pattern,
                definition_json: definition,
                priority,
                apply_to,
            };
            let r = c
                .set_policy(SetPolicyRequest {
                    policy: Some(policy),
                })
                .await?
                .into_inner();
            if !r.ok {
                bail!("{}", r.error);
            }
        }
        Cmd::ClearPolicy { name } => {
            emit(&format!(
                "Clearing policy \"{name}\" on vhost \"{}\" ...\n",
                args.vhost
            ));
            let r = c
                .clear_policy(ClearPolicyRequest {
                    vhost: args.vhost,
                    name,
                })
                .await?
                .into_inner();
            if !r.ok {
                bail!("{}", r.error);
            }
        }
        Cmd::ListPolicies => {
            let r = c
                .list_policies(ListPoliciesRequest {
                    vhost: args.vhost.clone(),
                })
                .await?
                .into_inner();
            emit(&match args.formatter {
                Formatter::Json => format!("{}\n", json_array(&policy_rows(&r.policies))),
                Formatter::Table => policies_table(&r.policies),
            });
        }
        Cmd::ListQueues => {
            let r = c
                .list_queues(ListQueuesRequest { vhost: args.vhost })
                .await?
                .into_inner();
            emit(&match args.formatter {
                Formatter::Json => format!("{}\n", json_array(&queue_rows(&r.queues))),
                Formatter::Table => queues_table(&r.queues),
            });
        }
    }
    Ok(())
}

/// Writes `text` to stdout. A closed stdout (`quorumqctl list_queues | head`)
/// ends the process quietly (status 0) instead of panicking as `println!` does.
fn emit(text: &str) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("quorumqctl: writing to stdout: {e}");
        std::process::exit(1);
    }
}

/// `list_policies` table: a header line, then one tab-separated line per policy.
fn policies_table(policies: &[Policy]) -> String {
    let mut out = String::from("vhost\tname\tpattern\tapply-to\tdefinition\tpriority\n");
    for p in policies {
        out.push_str(&format!(
            "{}\t{}\t{}\t{}\t{}\t{}\n",
            p.vhost, p.name, p.pattern, p.apply_to, p.definition_json, p.priority
        ));
    }
    out
}

/// Node ids as `1,2,3` (table cells).
fn id_list(ids: &[u64]) -> String {
    ids.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
}

/// One JSON value on one line, keys in declaration order.
fn to_json<T: Serialize>(v: &T) -> String {
    // Serializing plain structs, strings, numbers and `Value`s cannot fail.
    serde_json::to_string(v).unwrap_or_else(|_| "null".into())
}

/// A JSON array laid out as rabbitmqctl's json formatter does: `[`, one
/// object per line (comma-separated), `]`; `[]` when empty.
fn json_array<T: Serialize>(rows: &[T]) -> String {
    if rows.is_empty() {
        return "[]".into();
    }
    let lines: Vec<String> = rows.iter().map(to_json).collect();
    format!("[\n{}\n]", lines.join(",\n"))
}

/// One queue of `list_queues --formatter json`.
#[derive(Serialize)]
struct QueueRow<'a> {
    name: &'a str,
    vhost: &'a str,
    /// "quorum" or "classic".
    #[serde(rename = "type")]
    kind: &'a str,
    /// Node id of the Raft leader; null while unknown.
    leader: Option<u64>,
    /// Node ids holding a replica.
    members: &'a [u64],
    /// Members the answering node sees running.
    online: &'a [u64],
    messages_ready: u64,
    messages_unacknowledged: u64,
    consumers: u64,
    dead_letter_held: u64,
    /// Effective policy name, "" for none.
    policy: &'a str,
}

/// `list_queues --formatter json` rows, in this key order: `name`, `vhost`,
/// `type` ("quorum" | "classic"), `leader` (node id, null while unknown),
/// `members` and `online` (node id arrays), `messages_ready`,
/// `messages_unacknowledged`, `consumers`, `dead_letter_held` (counts),
/// `policy` (effective policy name, "" for none).
fn queue_rows(queues: &[QueueInfo]) -> Vec<QueueRow<'_>> {
    queues
        .iter()
        .map(|q| QueueRow {
            name: &q.name,
            vhost: &q.vhost,
            kind: &q.queue_type,
            leader: q.leader,
            members: &q.members,
            online: &q.online,
            messages_ready: q.messages_ready,
            messages_unacknowledged: q.messages_unacknowledged,
            consumers: q.consumers,
            dead_letter_held: q.dead_letter_held,
            policy: &q.policy,
        })
        .collect()
}

/// `list_queues` table: a header line, then one tab-separated line per queue.
/// The first seven columns keep their historical order (test harnesses read
/// them by position); `leader` ("" while unknown), `members` and `online`
/// (comma-separated node ids) come last.
fn queues_table(queues: &[QueueInfo]) -> String {
    let mut out = String::from(
        "name\ttype\tmessages_ready\tmessages_unacknowledged\tconsumers\tdead_letter_held\tpolicy\tleader\tmembers\tonline\n",
    );
    for q in queues {
        out.push_str(&format!(
            "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\n",
            q.name,
            q.queue_type,
            q.messages_ready,
            q.messages_unacknowledged,
            q.consumers,
            q.dead_letter_held,
            q.policy,
            q.leader.map(|l| l.to_string()).unwrap_or_default(),
            id_list(&q.members),
            id_list(&q.online),
        ));
    }
    out
}

/// One node of `cluster_status --formatter json`.
#[derive(Serialize)]
struct NodeRow<'a> {
    id: u64,
    cluster_addr: &'a str,
    /// "" while unknown.
    amqp_addr: &'a str,
    running: bool,
}

/// `cluster_status --formatter json`.
#[derive(Serialize)]
struct ClusterView<'a> {
    /// Every node, sorted by id.
    nodes: Vec<NodeRow<'a>>,
    /// Ids of the running nodes, sorted.
    running_nodes: Vec<u64>,
    /// Meta group leader; null while unknown.
    meta_leader: Option<u64>,
}

/// `cluster_status --formatter json`: `{"nodes":[{"id","cluster_addr",
/// "amqp_addr","running"}...],"running_nodes":[ids],"meta_leader":id|null}`,
/// nodes sorted by id, on one line.
fn cluster_status_json(r: &ClusterStatusReply) -> String {
    let mut nodes: Vec<NodeRow<'_>> = r
        .nodes
        .iter()
        .map(|n| NodeRow {
            id: n.id,
            cluster_addr: &n.cluster_addr,
            amqp_addr: &n.amqp_addr,
            running: n.running,
        })
        .collect();
    nodes.sort_by_key(|n| n.id);
    let running_nodes = nodes.iter().filter(|n| n.running).map(|n| n.id).collect();
    to_json(&ClusterView {
        nodes,
        running_nodes,
        meta_leader: r.meta_leader,
    })
}

/// `cluster_status` table: the answering node and meta leader ("unknown"
/// while none), then one tab-separated line per node, sorted by id.
fn cluster_status_table(r: &ClusterStatusReply) -> String {
    let mut nodes = r.nodes.clone();
    nodes.sort_by_key(|n| n.id);
    let leader = r
        .meta_leader
        .map(|l| l.to_string())
        .unwrap_or_else(|| "unknown".into());
    let mut out = format!(
        "Cluster status of node {} ...\nmeta_leader: {leader}\nid\tcluster_addr\tamqp_addr\trunning\n",
        r.node_id
    );
    for n in nodes {
        out.push_str(&format!(
            "{}\t{}\t{}\t{}\n",
            n.id, n.cluster_addr, n.amqp_addr, n.running
        ));
    }
    out
}

/// `status --formatter json`.
#[derive(Serialize)]
struct StatusView<'a> {
    node_id: u64,
    version: &'a str,
    /// Queues with a replica on the answering node (count).
    queues: u64,
    /// Node ids of the cluster.
    members: &'a [u64],
    /// Meta group leader; null while unknown.
    meta_leader: Option<u64>,
}

/// `status --formatter json`: `{"node_id","version","queues","members",
/// "meta_leader"}` (`meta_leader` null while unknown).
fn status_json(s: &StatusReply) -> String {
    to_json(&StatusView {
        node_id: s.node_id,
        version: &s.version,
        queues: s.queues,
        members: &s.members,
        meta_leader: (s.meta_leader != 0).then_some(s.meta_leader),
    })
}

/// One policy of `list_policies --formatter json`, keyed as rabbitmqctl's.
#[derive(Serialize)]
struct PolicyRow<'a> {
    vhost: &'a str,
    name: &'a str,
    pattern: &'a str,
    #[serde(rename = "apply-to")]
    apply_to: &'a str,
    /// The policy's JSON object (its text if it does not parse).
    definition: Value,
    priority: i32,
}

/// `list_policies --formatter json` rows: `vhost`, `name`, `pattern`,
/// `apply-to`, `definition` (a JSON object), `priority`.
fn policy_rows(policies: &[Policy]) -> Vec<PolicyRow<'_>> {
    policies
        .iter()
        .map(|p| PolicyRow {
            vhost: &p.vhost,
            name: &p.name,
            pattern: &p.pattern,
            apply_to: &p.apply_to,
            definition: serde_json::from_str(&p.definition_json)
                .unwrap_or_else(|_| Value::String(p.definition_json.clone())),
            priority: p.priority,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use quorumq_proto::v1::ClusterStatusNode;
    use serde_json::json;

    fn queue(name: &str, leader: Option<u64>, members: &[u64], online: &[u64]) -> QueueInfo {
        QueueInfo {
            vhost: "/".into(),
            name: name.into(),
            queue_type: "quorum".into(),
            messages_ready: 3,
            messages_unacknowledged: 2,
            consumers: 1,
            dead_letter_held: 4,
            group_id: 7,
            policy: "DLX".into(),
            leader,
            members: members.to_vec(),
            online: online.to_vec(),
        }
    }

    fn node(id: u64, running: bool) -> ClusterStatusNode {
        ClusterStatusNode {
            id,
            cluster_addr: format!("127.0.0.1:{}", 5679 + id),
            amqp_addr: format!("127.0.0.1:{}", 5671 + id),
            running,
        }
    }

    fn parse(text: &str) -> Value {
        serde_json::from_str(text).unwrap_or_else(|e| panic!("invalid JSON ({e}): {text}"))
    }

    #[test]
    fn list_queues_json_is_an_array_of_one_object_per_queue_with_placement() {
        let text = json_array(&queue_rows(&[
            queue("q1", Some(2), &[1, 2, 3], &[2, 3]),
            queue("q2", None, &[1], &[]),
        ]));
        assert_eq!(text.lines().count(), 4, "[, two rows, ]: {text}");
        assert_eq!(
            parse(&text),
            json!([
                {
                    "name": "q1", "vhost": "/", "type": "quorum", "leader": 2,
                    "members": [1, 2, 3], "online": [2, 3],
                    "messages_ready": 3, "messages_unacknowledged": 2, "consumers": 1,
                    "dead_letter_held": 4, "policy": "DLX",
                },
                {
                    "name": "q2", "vhost": "/", "type": "quorum", "leader": null,
                    "members": [1], "online": [],
                    "messages_ready": 3, "messages_unacknowledged": 2, "consumers": 1,
                    "dead_letter_held": 4, "policy": "DLX",
                },
            ])
        );
        // Keys in a reader's order, not alphabetical.
        assert!(
            text.starts_with(
                "[\n{\"name\":\"q1\",\"vhost\":\"/\",\"type\":\"quorum\",\"leader\":2,"
            ),
            "{text}"
        );
        assert_eq!(json_array::<QueueRow>(&[]), "[]");
    }

    #[test]
    fn list_queues_table_keeps_the_old_columns_and_appends_placement() {
        let t = queues_table(&[
            queue("q1", Some(2), &[1, 2, 3], &[2, 3]),
            queue("q2", None, &[], &[]),
        ]);
        let lines: Vec<Vec<&str>> = t.lines().map(|l| l.split('\t').collect()).collect();
        assert_eq!(
            lines[0],
            [
                "name",
                "type",
                "messages_ready",
                "messages_unacknowledged",
                "consumers",
                "dead_letter_held",
                "policy",
                "leader",
                "members",
                "online"
            ]
        );
        assert_eq!(
            lines[1],
            ["q1", "quorum", "3", "2", "1", "4", "DLX", "2", "1,2,3", "2,3"]
        );
        assert_eq!(
            lines[2],
            ["q2", "quorum", "3", "2", "1", "4", "DLX", "", "", ""]
        );
    }

    #[test]
    fn cluster_status_json_lists_nodes_by_id_and_the_running_ones() {
        let r = ClusterStatusReply {
            nodes: vec![node(3, true), node(1, true), node(2, false)],
            meta_leader: Some(1),
            node_id: 1,
        };
        let text = cluster_status_json(&r);
        assert_eq!(text.lines().count(), 1, "{text}");
        assert_eq!(
            parse(&text),
            json!({
                "nodes": [
                    {"id": 1, "cluster_addr": "127.0.0.1:5680", "amqp_addr": "127.0.0.1:5672", "running": true},
                    {"id": 2, "cluster_addr": "127.0.0.1:5681", "amqp_addr": "127.0.0.1:5673", "running": false},
                    {"id": 3, "cluster_addr": "127.0.0.1:5682", "amqp_addr": "127.0.0.1:5674", "running": true},
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
            parse(&cluster_status_json(&none))["meta_leader"],
            Value::Null
        );
    }

    #[test]
    fn cluster_status_table_shows_leader_and_one_line_per_node() {
        let r = ClusterStatusReply {
            nodes: vec![node(2, false), node(1, true)],
            meta_leader: None,
            node_id: 2,
        };
        let t = cluster_status_table(&r);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "Cluster status of node 2 ...");
        assert_eq!(lines[1], "meta_leader: unknown");
        assert_eq!(lines[2], "id\tcluster_addr\tamqp_addr\trunning");
        assert_eq!(lines[3], "1\t127.0.0.1:5680\t127.0.0.1:5672\ttrue");
        assert_eq!(lines[4], "2\t127.0.0.1:5681\t127.0.0.1:5673\tfalse");
    }

    #[test]
    fn status_and_policies_json() {
        let s = StatusReply {
            node_id: 1,
            version: "0.1.0".into(),
            queues: 2,
            connections: 0,
            members: vec![1],
            meta_leader: 0,
        };
        assert_eq!(
            parse(&status_json(&s)),
            json!({"node_id": 1, "version": "0.1.0", "queues": 2, "members": [1], "meta_leader": null})
        );
        let p = Policy {
            vhost: "/".into(),
            name: "DLX".into(),
            pattern: ".*".into(),
            definition_json: r#"{"dead-letter-exchange":"dlx"}"#.into(),
            priority: 1,
            apply_to: "queues".into(),
        };
        assert_eq!(
            parse(&json_array(&policy_rows(&[p]))),
            json!([{"vhost": "/", "name": "DLX", "pattern": ".*", "apply-to": "queues",
                    "definition": {"dead-letter-exchange": "dlx"}, "priority": 1}])
        );
    }

    #[test]
    fn formatter_is_table_by_default_json_anywhere_and_nothing_else() {
        let a = Args::try_parse_from(["quorumqctl", "list_queues"]).expect("parses");
        assert_eq!(a.formatter, Formatter::Table);
        let a = Args::try_parse_from(["quorumqctl", "list_queues", "--formatter", "json"])
            .expect("parses");
        assert_eq!(a.formatter, Formatter::Json);
        assert!(matches!(a.cmd, Cmd::ListQueues));
        let a = Args::try_parse_from(["quorumqctl", "--formatter", "json", "cluster_status"])
            .expect("parses");
        assert_eq!(a.formatter, Formatter::Json);
        assert!(matches!(a.cmd, Cmd::ClusterStatus));
        let a = Args::try_parse_from(["quorumqctl", "cluster_status", "--formatter", "table"])
            .expect("parses");
        assert_eq!(a.formatter, Formatter::Table);
        let err = Args::try_parse_from(["quorumqctl", "list_queues", "--formatter", "xml"])
            .expect_err("unknown formatter");
        assert_eq!(err.kind(), clap::error::ErrorKind::InvalidValue);
    }
}
