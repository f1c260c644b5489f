//! `quorumqctl`: operator CLI over the admin gRPC API, shaped like
//! rabbitmqctl (`set_policy NAME PATTERN DEFINITION [--priority N]
//! [--apply-to queues|exchanges|all]`, `clear_policy`, `list_policies`,
//! `list_queues`, `cluster_status`, `status`, `forget_cluster_node`,
//! `add_user`, `delete_user`, `change_password`, `set_user_tags`,
//! `list_users`, `set_permissions`, `clear_permissions`, `list_permissions`,
//! `add_vhost`, `delete_vhost`, `list_vhosts`, `set_vhost_limits`,
//! `clear_vhost_limits`, `list_vhost_limits`), the
//! queue membership verbs of rabbitmq-queues (`add_member`, `delete_member`,
//! `grow`, `shrink`, `rebalance`), and rabbitmq-upgrade's `drain` / `revive`
//! (maintenance mode of the node asked with `--node`).
//!
//! Every call carries the cluster secret (`--cluster-secret-file`, else
//! `$QUORUMQ_CLUSTER_SECRET_FILE`, else `~/.quorumq.cookie`: the node's own file, as
//! rabbitmqctl reads the Erlang cookie); a node refuses calls without it.
//!
//! `--formatter table|json` (anywhere on the line, default `table`) picks the
//! output of the listing commands: `table` is tab-separated with a header
//! line; `json` is what rabbitmqctl's json formatter prints — one JSON array
//! of objects for lists (`list_queues`, `list_policies`), one object for
//! `cluster_status` and `status`.

use std::io::Write;

use anyhow::bail;
use clap::{Parser, Subcommand, ValueEnum};
use quorumq::cluster::secret::ClusterSecret;
use quorumq_proto::v1::admin_client::AdminClient;
use quorumq_proto::v1::{
    AddVhostRequest, ClearPolicyRequest, ClusterStatusReply, ClusterStatusRequest,
    DeleteVhostRequest, DrainRequest, ForgetRequest, GrowRequest, ListPoliciesRequest,
    ListQueuesRequest, ListVhostLimitsRequest, ListVhostsRequest, MemberRequest, MemberResult,
    Policy, QueueInfo, RebalanceRequest, ReviveRequest, SetPolicyRequest, SetVhostLimitsRequest,
    ShrinkRequest, StatusReply, StatusRequest, VhostLimits,
};
use quorumq_proto::v1::{ListPermissionsRequest, ListUsersRequest, PermissionRequest, UserRequest};
use serde::Serialize;
use serde_json::{json, Value};

#[derive(Parser, Debug)]
#[command(name = "quorumqctl", version, about = "Operate a quorumq node")]
struct Args {
    /// Node's cluster/admin address.
    #[arg(long, default_value = "http://127.0.0.1:5680", env = "QUORUMQ_ADMIN")]
    node: String,
    /// File of the cluster secret the node checks (default: $QUORUMQ_CLUSTER_SECRET_FILE,
    /// else ~/.quorumq.cookie, as the node finds it).
    #[arg(long, value_name = "FILE", global = true)]
    cluster_secret_file: Option<std::path::PathBuf>,
    /// CA certificate (PEM) of a node whose cluster port runs TLS (`cluster_tls`); with it
    /// the node address defaults to https.
    #[arg(long, value_name = "FILE", env = "QUORUMQ_TLS_CA_FILE", global = true)]
    tls_ca_file: Option<std::path::PathBuf>,
    /// Client certificate (PEM) for a TLS cluster port (signed by the cluster's CA).
    #[arg(
        long,
        value_name = "FILE",
        env = "QUORUMQ_TLS_CERT_FILE",
        global = true
    )]
    tls_cert_file: Option<std::path::PathBuf>,
    /// Key (PEM) of --tls-cert-file.
    #[arg(long, value_name = "FILE", env = "QUORUMQ_TLS_KEY_FILE", global = true)]
    tls_key_file: Option<std::path::PathBuf>,
    /// Virtual host.
    #[arg(short = 'p', long, default_value = "/", global = true)]
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
    /// Creates a virtual host (rabbitmqctl add_vhost); on an existing one only sets a given
    /// default queue type.
    #[command(name = "add_vhost")]
    AddVhost {
        name: String,
        /// Type of durable queues declared without x-queue-type in this vhost: quorum or
        /// classic (default: the node's default_queue_type).
        #[arg(long = "default-queue-type", value_parser = ["quorum", "classic"])]
        default_queue_type: Option<String>,
    },
    /// Deletes a virtual host and everything in it (rabbitmqctl delete_vhost).
    #[command(name = "delete_vhost")]
    DeleteVhost { name: String },
    /// Lists virtual hosts with their default queue type (rabbitmqctl list_vhosts).
    #[command(name = "list_vhosts")]
    ListVhosts,
    /// Adds a user (rabbitmqctl add_user USER PASSWORD); no permissions, no tags.
    #[command(name = "add_user")]
    AddUser { name: String, password: String },
    /// Deletes a user and its permissions (rabbitmqctl delete_user).
    #[command(name = "delete_user")]
    DeleteUser { name: String },
    /// Changes a user's password (rabbitmqctl change_password USER PASSWORD).
    #[command(name = "change_password")]
    ChangePassword { name: String, password: String },
    /// Replaces a user's tags (rabbitmqctl set_user_tags USER [TAG ...]).
    #[command(name = "set_user_tags")]
    SetUserTags { name: String, tags: Vec<String> },
    /// Lists users and their tags (rabbitmqctl list_users).
    #[command(name = "list_users")]
    ListUsers,
    /// Grants USER in the vhost: configure, write and read regexes (rabbitmqctl
    /// set_permissions [-p VHOST] USER CONF WRITE READ).
    #[command(name = "set_permissions")]
    SetPermissions {
        user: String,
        configure: String,
        write: String,
        read: String,
    },
    /// Revokes USER's permissions in the vhost (rabbitmqctl clear_permissions).
    #[command(name = "clear_permissions")]
    ClearPermissions { user: String },
    /// Lists the vhost's permissions (rabbitmqctl list_permissions [-p VHOST]).
    #[command(name = "list_permissions")]
    ListPermissions,
    /// Sets the vhost's limits (rabbitmqctl set_vhost_limits): a JSON object with
    /// `max-connections` and/or `max-queues` (negative = no limit), replacing earlier ones.
    #[command(name = "set_vhost_limits")]
    SetVhostLimits { definition: String },
    /// Clears the vhost's limits (rabbitmqctl clear_vhost_limits).
    #[command(name = "clear_vhost_limits")]
    ClearVhostLimits,
    /// Shows the vhost's limits, or every vhost's with --global (rabbitmqctl
    /// list_vhost_limits).
    #[command(name = "list_vhost_limits")]
    ListVhostLimits {
        #[arg(long)]
        global: bool,
    },
    /// Lists queues: type, message counts, leader and replicas.
    #[command(name = "list_queues")]
    ListQueues,
    /// Cluster nodes, which of them run, and the meta leader.
    #[command(name = "cluster_status")]
    ClusterStatus,
    /// Adds a replica of a quorum queue on a node: [VHOST] QUEUE NODE
    /// (rabbitmq-queues add_member; VHOST defaults to --vhost).
    #[command(name = "add_member")]
    AddMember {
        #[arg(num_args = 2..=3, value_names = ["VHOST", "QUEUE", "NODE"])]
        target: Vec<String>,
    },
    /// Removes a quorum queue's replica from a node: [VHOST] QUEUE NODE
    /// (rabbitmq-queues delete_member; never the last one).
    #[command(name = "delete_member")]
    DeleteMember {
        #[arg(num_args = 2..=3, value_names = ["VHOST", "QUEUE", "NODE"])]
        target: Vec<String>,
    },
    /// Adds a replica on NODE to every matching quorum queue (`all`), or to
    /// those with an even number of members (`even`) (rabbitmq-queues grow).
    Grow {
        node: u64,
        #[arg(value_parser = ["all", "even"])]
        strategy: String,
        /// Regex on vhost names.
        #[arg(long = "vhost-pattern", default_value = ".*")]
        vhost_pattern: String,
        /// Regex on queue names.
        #[arg(long = "queue-pattern", default_value = ".*")]
        queue_pattern: String,
    },
    /// Spreads quorum queue leaders evenly over the nodes (rabbitmq-queues
    /// rebalance; TYPE is `quorum` or `all`).
    Rebalance {
        #[arg(value_parser = ["quorum", "all"])]
        kind: String,
        /// Regex on vhost names.
        #[arg(long = "vhost-pattern", default_value = ".*")]
        vhost_pattern: String,
        /// Regex on queue names.
        #[arg(long = "queue-pattern", default_value = ".*")]
        queue_pattern: String,
    },
    /// Removes a stopped node from the cluster and from every queue it was a
    /// member of (rabbitmqctl forget_cluster_node).
    #[command(name = "forget_cluster_node")]
    ForgetClusterNode { node: u64 },
    /// Puts the node asked (`--node`) in maintenance mode: it hands every
    /// queue leadership it holds to another member and leads nothing until
    /// `revive` (rabbitmq-upgrade drain). A graceful stop drains first too.
    Drain,
    /// Ends maintenance mode on the node asked (rabbitmq-upgrade revive).
    Revive,
    /// Removes NODE's replica from every quorum queue (rabbitmq-queues shrink).
    Shrink {
        node: u64,
        /// List only the queues whose change failed.
        #[arg(long = "errors-only")]
        errors_only: bool,
    },
}

/// `list_vhost_limits` output: as rabbitmqctl, the definition after a banner for one vhost,
/// a vhost/limits table with `--global`; JSON: `[{"vhost": "/", "limits": {...}}]`.
fn vhost_limits_text(f: Formatter, global: bool, vhost: &str, limits: &[VhostLimits]) -> String {
    let rows: Vec<Row> = limits
        .iter()
        .map(|l| {
            let def: Value = serde_json::from_str(&l.definition_json).unwrap_or(Value::Null);
            Row(vec![("vhost", json!(l.vhost)), ("limits", def)])
        })
        .collect();
    match (f, global) {
        (Formatter::Json, _) | (Formatter::Table, true) => listing(f, &["vhost", "limits"], &rows),
        (Formatter::Table, false) => {
            let mut out = format!("Listing limits for vhost \"{vhost}\" ...\n");
            for l in limits {
                out.push_str(&l.definition_json);
                out.push('\n');
            }
            out
        }
    }
}

/// Errors: the node's refusal of an admin request, as its text.
fn ok_or_bail(r: quorumq_proto::v1::AdminReply) -> anyhow::Result<()> {
    if !r.ok {
        bail!("{}", r.error);
    }
    Ok(())
}

/// Prints a progress line before a result table (not in JSON output,
/// which must stay one JSON document).
fn banner(formatter: Formatter, text: &str) {
    if formatter == Formatter::Table {
        emit(text);
    }
}

/// VHOST QUEUE NODE, or QUEUE NODE in `default_vhost`.
fn member_target(target: &[String], default_vhost: &str) -> anyhow::Result<MemberRequest> {
    let (vhost, queue, node) = match target {
        [q, n] => (default_vhost.to_string(), q.clone(), n),
        [v, q, n] => (v.clone(), q.clone(), n),
        _ => bail!("expected [VHOST] QUEUE NODE"),
    };
    let node = node
        .parse()
        .map_err(|_| anyhow::anyhow!("NODE must be a node id, not '{node}'"))?;
    Ok(MemberRequest {
        vhost,
        queue,
        node,
        forwarded: false,
    })
}

/// The columns of grow / shrink / add_member / delete_member results
/// (rabbitmq-queues grow and shrink).
const MEMBER_COLUMNS: &[&str] = &["vhost", "name", "size", "result"];

/// Prints membership result rows; true when every change succeeded.
fn emit_member_results(formatter: Formatter, results: &[MemberResult]) -> bool {
    let rows: Vec<Row> = results.iter().map(member_row).collect();
    emit(&listing(formatter, MEMBER_COLUMNS, &rows));
    results.iter().all(|r| r.ok)
}

fn member_row(r: &MemberResult) -> Row {
    Row(vec![
        ("vhost", json!(r.vhost)),
        ("name", json!(r.name)),
        ("size", json!(r.size)),
        ("result", json!(r.result)),
    ])
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let tls = args.tls_ca_file.is_some();
    let node = if args.node.starts_with("http") {
        args.node.clone()
    } else if tls {
        format!("https://{}", args.node)
    } else {
        format!("http://{}", args.node)
    };
    let node = match node.strip_prefix("http://") {
        Some(rest) if tls => format!("https://{rest}"),
        _ => node,
    };
    let secret_file = ClusterSecret::path(args.cluster_secret_file.as_deref());
    let secret = ClusterSecret::read(&secret_file).map_err(|e| {
        anyhow::anyhow!("{e} (a node writes it on its first start; use the same file as the node, or --cluster-secret-file)")
    })?;
    let mut endpoint = tonic::transport::Endpoint::from_shared(node)?;
    if let Some(ca) = &args.tls_ca_file {
        let read = |p: &std::path::Path| {
            std::fs::read(p).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))
        };
        let identity = match (&args.tls_cert_file, &args.tls_key_file) {
            (Some(c), Some(k)) => Some((read(c)?, read(k)?)),
            (None, None) => None,
            _ => anyhow::bail!("--tls-cert-file and --tls-key-file go together"),
        };
        endpoint = endpoint.tls_config(quorumq::tls::cluster_client_config(
            Some(read(ca)?),
            identity,
        )?)?;
    }
    let channel = endpoint.connect().await?;
    let mut c = AdminClient::new(secret.attach(channel));
    let f = args.formatter;
    match args.cmd {
        Cmd::Status => {
            let s = c.status(StatusRequest {}).await?.into_inner();
            emit(&status_text(f, &s));
        }
        Cmd::ClusterStatus => {
            let r = c.cluster_status(ClusterStatusRequest {}).await?;
            emit(&cluster_status_text(f, r.into_inner()));
        }
        Cmd::Drain => {
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
        }
        Cmd::Revive => {
            banner(f, "Will take node out of maintenance mode...\n");
            let r = c.revive(ReviveRequest {}).await?.into_inner();
            if !r.ok {
                bail!("{}", r.error);
            }
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
                .list_policies(ListPoliciesRequest { vhost: args.vhost })
                .await?;
            let rows: Vec<Row> = r.into_inner().policies.iter().map(policy_row).collect();
            emit(&listing(f, POLICY_COLUMNS, &rows));
        }
        Cmd::SetVhostLimits { .. } | Cmd::ClearVhostLimits => {
            let definition = match &args.cmd {
                Cmd::SetVhostLimits { definition } => {
                    emit(&format!(
                        "Setting vhost limits to \"{definition}\" for vhost \"{}\" ...\n",
                        args.vhost
                    ));
                    definition.clone()
                }
                _ => {
                    emit(&format!("Clearing vhost \"{}\" limits ...\n", args.vhost));
                    let set = c
                        .list_vhost_limits(ListVhostLimitsRequest {
                            vhost: args.vhost.clone(),
                            global: false,
                        })
                        .await?
                        .into_inner()
                        .limits;
                    if set.is_empty() {
                        // As rabbitmqctl 3.10.8 (exit status 69 there).
                        bail!("Parameter does not exist");
                    }
                    "{}".to_string()
                }
            };
            let r = c
                .set_vhost_limits(SetVhostLimitsRequest {
                    vhost: args.vhost.clone(),
                    definition_json: definition,
                })
                .await?
                .into_inner();
            if !r.ok {
                bail!("Validation failed\n\n{}", r.error);
            }
        }
        Cmd::AddUser { name, password } => {
            emit(&format!("Adding user \"{name}\" ...\n"));
            let req = UserRequest {
                name,
                password,
                tags: vec![],
            };
            ok_or_bail(c.add_user(req).await?.into_inner())?;
        }
        Cmd::DeleteUser { name } => {
            emit(&format!("Deleting user \"{name}\" ...\n"));
            let req = UserRequest {
                name,
                ..Default::default()
            };
            ok_or_bail(c.delete_user(req).await?.into_inner())?;
        }
        Cmd::ChangePassword { name, password } => {
            emit(&format!("Changing password for user \"{name}\" ...\n"));
            let req = UserRequest {
                name,
                password,
                tags: vec![],
            };
            ok_or_bail(c.change_password(req).await?.into_inner())?;
        }
        Cmd::SetUserTags { name, tags } => {
            emit(&format!(
                "Setting tags for user \"{name}\" to [{}] ...\n",
                tags.join(", ")
            ));
            let req = UserRequest {
                name,
                password: String::new(),
                tags,
            };
            ok_or_bail(c.set_user_tags(req).await?.into_inner())?;
        }
        Cmd::ListUsers => {
            let r = c.list_users(ListUsersRequest {}).await?.into_inner();
            let rows: Vec<Row> = r
                .users
                .iter()
                .map(|u| Row(vec![("user", json!(u.name)), ("tags", json!(u.tags))]))
                .collect();
            banner(f, "Listing users ...\n");
            emit(&listing(f, &["user", "tags"], &rows));
        }
        Cmd::SetPermissions {
            user,
            configure,
            write,
            read,
        } => {
            emit(&format!(
                "Setting permissions for user \"{user}\" in vhost \"{}\" ...\n",
                args.vhost
            ));
            let r = c
                .set_permissions(PermissionRequest {
                    vhost: args.vhost,
                    user,
                    configure,
                    write,
                    read,
                })
                .await?
                .into_inner();
            if !r.ok {
                bail!("{}", r.error);
            }
        }
        Cmd::ClearPermissions { user } => {
            emit(&format!(
                "Clearing permissions for user \"{user}\" in vhost \"{}\" ...\n",
                args.vhost
            ));
            let r = c
                .clear_permissions(PermissionRequest {
                    vhost: args.vhost,
                    user,
                    ..Default::default()
                })
                .await?
                .into_inner();
            if !r.ok {
                bail!("{}", r.error);
            }
        }
        Cmd::ListPermissions => {
            let r = c
                .list_permissions(ListPermissionsRequest {
                    vhost: args.vhost.clone(),
                })
                .await?
                .into_inner();
            let rows: Vec<Row> = r
                .permissions
                .iter()
                .map(|p| {
                    Row(vec![
                        ("user", json!(p.user)),
                        ("configure", json!(p.configure)),
                        ("write", json!(p.write)),
                        ("read", json!(p.read)),
                    ])
                })
                .collect();
            banner(
                f,
                &format!("Listing permissions for vhost \"{}\" ...\n", args.vhost),
            );
            emit(&listing(f, &["user", "configure", "write", "read"], &rows));
        }
        Cmd::AddVhost {
            name,
            default_queue_type,
        } => {
            emit(&format!("Adding vhost \"{name}\" ...\n"));
            let r = c
                .add_vhost(AddVhostRequest {
                    name,
                    default_queue_type: default_queue_type.unwrap_or_default(),
                })
                .await?
                .into_inner();
            if !r.ok {
                bail!("{}", r.error);
            }
        }
        Cmd::DeleteVhost { name } => {
            emit(&format!("Deleting vhost \"{name}\" ...\n"));
            let r = c
                .delete_vhost(DeleteVhostRequest { name })
                .await?
                .into_inner();
            if !r.ok {
                bail!("{}", r.error);
            }
        }
        Cmd::ListVhosts => {
            let r = c.list_vhosts(ListVhostsRequest {}).await?.into_inner();
            let rows: Vec<Row> = r
                .vhosts
                .iter()
                .map(|v| {
                    Row(vec![
                        ("name", json!(v.name)),
                        ("default_queue_type", json!(v.default_queue_type)),
                    ])
                })
                .collect();
            banner(f, "Listing vhosts ...\n");
            emit(&listing(f, &["name", "default_queue_type"], &rows));
        }
        Cmd::ListVhostLimits { global } => {
            let limits = c
                .list_vhost_limits(ListVhostLimitsRequest {
                    vhost: args.vhost.clone(),
                    global,
                })
                .await?
                .into_inner()
                .limits;
            emit(&vhost_limits_text(f, global, &args.vhost, &limits));
        }
        Cmd::AddMember { ref target } | Cmd::DeleteMember { ref target } => {
            let add = matches!(args.cmd, Cmd::AddMember { .. });
            let req = member_target(target, &args.vhost)?;
            let (verb, prep) = if add {
                ("Adding a replica for", "on")
            } else {
                ("Removing a replica of", "from")
            };
            banner(
                f,
                &format!(
                    "{verb} queue {} in vhost {} {prep} node {}...\n",
                    req.queue, req.vhost, req.node
                ),
            );
            let r = if add {
                c.add_member(req).await?
            } else {
                c.delete_member(req).await?
            }
            .into_inner();
            if !r.ok {
                bail!("{}", r.result);
            }
            emit_member_results(f, &[r]);
        }
        Cmd::Grow {
            node,
            strategy,
            vhost_pattern,
            queue_pattern,
        } => {
            banner(f, &format!(
                "Growing {strategy} quorum queues matching {queue_pattern} in vhosts matching {vhost_pattern} to node {node}...\n"
            ));
            let r = c
                .grow(GrowRequest {
                    node,
                    strategy,
                    vhost_pattern,
                    queue_pattern,
                })
                .await?
                .into_inner();
            if !emit_member_results(f, &r.results) {
                std::process::exit(1);
            }
        }
        Cmd::Shrink { node, errors_only } => {
            banner(
                f,
                &format!("Shrinking all quorum queues on node {node}...\n"),
            );
            let r = c
                .shrink(ShrinkRequest { node, errors_only })
                .await?
                .into_inner();
            if !emit_member_results(f, &r.results) {
                std::process::exit(1);
            }
        }
        Cmd::ForgetClusterNode { node } => {
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
        }
        Cmd::Rebalance {
            kind,
            vhost_pattern,
            queue_pattern,
        } => {
            banner(f, &format!("Re-balancing leaders of {kind} queues...\n"));
            let r = c
                .rebalance(RebalanceRequest {
                    vhost_pattern,
                    queue_pattern,
                })
                .await?
                .into_inner();
            if f == Formatter::Table {
                for m in &r.moved {
                    emit(&format!("moved {m}\n"));
                }
            }
            let rows: Vec<Row> = r
                .nodes
                .iter()
                .map(|n| {
                    Row(vec![
                        ("node_name", json!(n.node)),
                        ("number_of_quorum_leaders", json!(n.leaders)),
                    ])
                })
                .collect();
            emit(&listing(
                f,
                &["node_name", "number_of_quorum_leaders"],
                &rows,
            ));
        }
        Cmd::ListQueues => {
            let r = c
                .list_queues(ListQueuesRequest { vhost: args.vhost })
                .await?;
            let rows: Vec<Row> = r.into_inner().queues.iter().map(queue_row).collect();
            emit(&listing(f, QUEUE_COLUMNS, &rows));
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

/// One listed item (a queue, a policy, a node): keys and values in output
/// order. JSON prints it as an object with the keys in this order (a
/// `serde_json::Map` would sort them); the table picks its cells by key.
struct Row(Vec<(&'static str, Value)>);

impl Serialize for Row {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(k, v)| (k, v)))
    }
}

impl Row {
    /// Table cell of `key` ("" when the row has no such key).
    fn cell(&self, key: &str) -> String {
        self.0
            .iter()
            .find(|(k, _)| *k == key)
            .map_or_else(String::new, |(_, v)| cell(v))
    }
}

/// A value as a table cell: strings as they are, arrays comma-separated
/// (`1,2,3`), null empty, anything else as JSON.
fn cell(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        Value::Array(a) => a.iter().map(cell).collect::<Vec<_>>().join(","),
        v => v.to_string(),
    }
}

/// One JSON value on one line.
fn to_json<T: Serialize>(v: &T) -> String {
    // Serializing rows, strings, numbers and `Value`s cannot fail.
    serde_json::to_string(v).unwrap_or_else(|_| "null".into())
}

/// A listing command's output. JSON: laid out as rabbitmqctl's json
/// formatter does — `[`, one object per line (comma-separated), `]`; `[]`
/// when empty. Table: a header line of `columns`, then one tab-separated line
/// of those cells per row.
fn listing(formatter: Formatter, columns: &[&str], rows: &[Row]) -> String {
    match formatter {
        Formatter::Json if rows.is_empty() => "[]\n".into(),
        Formatter::Json => {
            let lines: Vec<String> = rows.iter().map(to_json).collect();
            format!("[\n{}\n]\n", lines.join(",\n"))
        }
        Formatter::Table => {
            let mut out = columns.join("\t") + "\n";
            for row in rows {
                let cells: Vec<String> = columns.iter().map(|c| row.cell(c)).collect();
                out += &cells.join("\t");
                out.push('\n');
            }
            out
        }
    }
}

/// `list_queues` table columns. The first seven keep their historical order
/// (test harnesses read them by position); the placement comes last.
const QUEUE_COLUMNS: &[&str] = &[
    "name",
    "type",
    "messages_ready",
    "messages_unacknowledged",
    "consumers",
    "dead_letter_held",
    "policy",
    "leader",
    "members",
    "online",
    "unreadable_bodies",
    "below_quorum",
];

/// One queue of `list_queues`: `name`, `vhost`, `type` ("quorum" |
/// "classic"), `leader` (node id, null while unknown), `members` (node ids
/// holding a replica), `online` (those the answering node sees running),
/// `messages_ready`, `messages_unacknowledged`, `consumers`,
/// `dead_letter_held` (counts), `policy` (effective policy name, "" for none),
/// `unreadable_bodies` (bodies the leader could not read back intact; > 0 =
/// unhealthy), `below_quorum` (fewer members online than a majority of
/// `members`: the queue takes no publishes, acks or deliveries until enough
/// return; RabbitMQ lists such queues in `rabbitmq-queues
/// check_if_node_is_quorum_critical`).
fn queue_row(q: &QueueInfo) -> Row {
    let below_quorum = !q.members.is_empty() && q.online.len() < q.members.len() / 2 + 1;
    Row(vec![
        ("name", json!(q.name)),
        ("vhost", json!(q.vhost)),
        ("type", json!(q.queue_type)),
        ("leader", json!(q.leader)),
        ("members", json!(q.members)),
        ("online", json!(q.online)),
        ("messages_ready", json!(q.messages_ready)),
        ("messages_unacknowledged", json!(q.messages_unacknowledged)),
        ("consumers", json!(q.consumers)),
        ("dead_letter_held", json!(q.dead_letter_held)),
        ("policy", json!(q.policy)),
        ("unreadable_bodies", json!(q.unreadable_bodies)),
        ("below_quorum", json!(below_quorum)),
    ])
}

/// `list_policies` columns (table and JSON alike), keyed as rabbitmqctl's.
const POLICY_COLUMNS: &[&str] = &[
    "vhost",
    "name",
    "pattern",
    "apply-to",
    "definition",
    "priority",
];

/// One policy of `list_policies`; `definition` is the policy's JSON object
/// (its text if it does not parse).
fn policy_row(p: &Policy) -> Row {
    let definition = serde_json::from_str(&p.definition_json)
        .unwrap_or_else(|_| Value::String(p.definition_json.clone()));
    Row(vec![
        ("vhost", json!(p.vhost)),
        ("name", json!(p.name)),
        ("pattern", json!(p.pattern)),
        ("apply-to", json!(p.apply_to)),
        ("definition", definition),
        ("priority", json!(p.priority)),
    ])
}

/// `cluster_status` node columns (table and JSON alike).
/// `version` … `draining` are the node's own `status` (null when it is not
/// running or did not answer): uptime in seconds, quorum queues it leads,
/// replicas it holds.
const NODE_COLUMNS: &[&str] = &[
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
fn cluster_status_text(formatter: Formatter, mut r: ClusterStatusReply) -> String {
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
fn status_text(formatter: Formatter, s: &StatusReply) -> String {
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
    use quorumq_proto::v1::ClusterStatusNode;

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
            unreadable_bodies: 0,
        }
    }

    fn queues_text(f: Formatter, queues: &[QueueInfo]) -> String {
        let rows: Vec<Row> = queues.iter().map(queue_row).collect();
        listing(f, QUEUE_COLUMNS, &rows)
    }

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

    fn policy() -> Policy {
        Policy {
            vhost: "/".into(),
            name: "DLX".into(),
            pattern: ".*".into(),
            definition_json: r#"{"dead-letter-exchange":"dlx"}"#.into(),
            priority: 1,
            apply_to: "queues".into(),
        }
    }

    fn parse(text: &str) -> Value {
        serde_json::from_str(text).unwrap_or_else(|e| panic!("invalid JSON ({e}): {text}"))
    }

    /// Table lines split into cells.
    fn cells(text: &str) -> Vec<Vec<&str>> {
        text.lines().map(|l| l.split('\t').collect()).collect()
    }

    #[test]
    fn list_queues_json_is_an_array_of_one_object_per_queue_with_placement() {
        let text = queues_text(
            Formatter::Json,
            &[
                queue("q1", Some(2), &[1, 2, 3], &[2, 3]),
                queue("q2", None, &[1], &[]),
            ],
        );
        assert_eq!(text.lines().count(), 4, "[, two rows, ]: {text}");
        assert_eq!(
            parse(&text),
            json!([
                {
                    "name": "q1", "vhost": "/", "type": "quorum", "leader": 2,
                    "members": [1, 2, 3], "online": [2, 3],
                    "messages_ready": 3, "messages_unacknowledged": 2, "consumers": 1,
                    "dead_letter_held": 4, "policy": "DLX", "unreadable_bodies": 0,
                    "below_quorum": false,
                },
                {
                    "name": "q2", "vhost": "/", "type": "quorum", "leader": null,
                    "members": [1], "online": [],
                    "messages_ready": 3, "messages_unacknowledged": 2, "consumers": 1,
                    "dead_letter_held": 4, "policy": "DLX", "unreadable_bodies": 0,
                    "below_quorum": true,
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
        assert_eq!(queues_text(Formatter::Json, &[]), "[]\n");
    }

    #[test]
    fn list_queues_table_keeps_the_old_columns_and_appends_placement() {
        let t = queues_text(
            Formatter::Table,
            &[
                queue("q1", Some(2), &[1, 2, 3], &[2, 3]),
                queue("q2", None, &[], &[]),
            ],
        );
        let lines = cells(&t);
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
                "online",
                "unreadable_bodies",
                "below_quorum"
            ]
        );
        assert_eq!(
            lines[1],
            ["q1", "quorum", "3", "2", "1", "4", "DLX", "2", "1,2,3", "2,3", "0", "false"]
        );
        assert_eq!(
            lines[2],
            ["q2", "quorum", "3", "2", "1", "4", "DLX", "", "", "", "0", "false"]
        );
        assert_eq!(lines.len(), 3, "{t}");
        // Every table column is a key of the row (a typo would print "").
        let keys: Vec<&str> = queue_row(&queue("q", None, &[], &[]))
            .0
            .iter()
            .map(|(k, _)| *k)
            .collect();
        assert!(QUEUE_COLUMNS.iter().all(|c| keys.contains(c)), "{keys:?}");
        assert_eq!(
            queues_text(Formatter::Table, &[]).lines().count(),
            1,
            "header only"
        );
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

    #[test]
    fn list_policies_json_and_table() {
        let rows = [policy_row(&policy())];
        let text = listing(Formatter::Json, POLICY_COLUMNS, &rows);
        assert_eq!(
            parse(&text),
            json!([{"vhost": "/", "name": "DLX", "pattern": ".*", "apply-to": "queues",
                    "definition": {"dead-letter-exchange": "dlx"}, "priority": 1}])
        );
        assert!(
            text.starts_with("[\n{\"vhost\":\"/\",\"name\":\"DLX\","),
            "{text}"
        );
        let t = listing(Formatter::Table, POLICY_COLUMNS, &rows);
        assert_eq!(
            cells(&t),
            [
                [
                    "vhost",
                    "name",
                    "pattern",
                    "apply-to",
                    "definition",
                    "priority"
                ],
                [
                    "/",
                    "DLX",
                    ".*",
                    "queues",
                    r#"{"dead-letter-exchange":"dlx"}"#,
                    "1"
                ],
            ]
        );
        // A definition that is not JSON is shown as its text.
        let mut bad = policy();
        bad.definition_json = "{oops".into();
        let rows = [policy_row(&bad)];
        assert_eq!(
            parse(&listing(Formatter::Json, POLICY_COLUMNS, &rows))[0]["definition"],
            "{oops"
        );
        assert_eq!(
            cells(&listing(Formatter::Table, POLICY_COLUMNS, &rows))[1][4],
            "{oops"
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
