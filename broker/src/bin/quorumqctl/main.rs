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
//! (maintenance mode of the node asked with `--node`), `set_vm_memory_high_watermark`; looking into a queue
//! (`peek`, `inspect_dead_letters`), moving dead letters back (`redrive`) and quorum health (`quorum_status`,
//! `check_if_node_is_quorum_critical`,
//! `check_for_quorum_queues_without_an_elected_leader`, exit 69 when failed).
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
//!
//! One module per resource (`queues`, `policies`, `vhosts`, `users`,
//! `permissions`, `membership`, `cluster`), each a function per verb; `cli`
//! holds the command line, `output` the formatters.

mod cli;
mod cluster;
mod dead_letters;
mod health;
mod membership;
mod memory;
mod output;
mod permissions;
mod policies;
mod queues;
mod redrive;
mod users;
mod vhosts;

use anyhow::bail;
use clap::Parser;
use quorumq::cluster::secret::{ClusterSecret, PeerChannel};
use quorumq_proto::v1::admin_client::AdminClient;
use quorumq_proto::v1::{GrowRequest, PermissionRequest, Policy, RebalanceRequest};

use cli::{Args, Cmd};

/// The admin client of the node asked; the cluster secret goes with every call.
pub type Client = AdminClient<PeerChannel>;

/// Errors: the node's refusal of an admin request, as its text.
pub fn ok_or_bail(r: quorumq_proto::v1::AdminReply) -> anyhow::Result<()> {
    if !r.ok {
        bail!("{}", r.error);
    }
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut c = connect(&args).await?;
    let (f, vhost) = (args.formatter, args.vhost);
    match args.cmd {
        Cmd::Status => cluster::status(&mut c, f).await,
        Cmd::ClusterStatus => cluster::cluster_status(&mut c, f).await,
        Cmd::Drain => cluster::drain(&mut c, f).await,
        Cmd::Revive => cluster::revive(&mut c, f).await,
        Cmd::SetVmMemoryHighWatermark { args } => memory::set_watermark(&mut c, f, &args).await,
        Cmd::ForgetClusterNode { node } => cluster::forget(&mut c, f, node).await,
        Cmd::SetPolicy {
            name,
            pattern,
            definition,
            priority,
            apply_to,
        } => {
            let policy = Policy {
                vhost,
                name,
                pattern,
                definition_json: definition,
                priority,
                apply_to,
            };
            policies::set(&mut c, policy).await
        }
        Cmd::ClearPolicy { name } => policies::clear(&mut c, vhost, name).await,
        Cmd::ListPolicies => policies::list(&mut c, f, vhost).await,
        Cmd::AddVhost {
            name,
            default_queue_type,
        } => vhosts::add(&mut c, name, default_queue_type).await,
        Cmd::DeleteVhost { name } => vhosts::delete(&mut c, name).await,
        Cmd::ListVhosts => vhosts::list(&mut c, f).await,
        Cmd::SetVhostLimits { definition } => vhosts::set_limits(&mut c, vhost, definition).await,
        Cmd::ClearVhostLimits => vhosts::clear_limits(&mut c, vhost).await,
        Cmd::ListVhostLimits { global } => vhosts::list_limits(&mut c, f, vhost, global).await,
        Cmd::AddUser { name, password } => users::add(&mut c, name, password).await,
        Cmd::DeleteUser { name } => users::delete(&mut c, name).await,
        Cmd::ChangePassword { name, password } => {
            users::change_password(&mut c, name, password).await
        }
        Cmd::SetUserTags { name, tags } => users::set_tags(&mut c, name, tags).await,
        Cmd::ListUsers => users::list(&mut c, f).await,
        Cmd::SetPermissions {
            user,
            configure,
            write,
            read,
        } => {
            let req = PermissionRequest {
                vhost,
                user,
                configure,
                write,
                read,
            };
            permissions::set(&mut c, req).await
        }
        Cmd::ClearPermissions { user } => permissions::clear(&mut c, vhost, user).await,
        Cmd::ListPermissions => permissions::list(&mut c, f, vhost).await,
        Cmd::ListQueues => queues::list(&mut c, f, vhost).await,
        Cmd::Peek { queue, position } => {
            dead_letters::peek(&mut c, f, &vhost, &queue, position).await
        }
        Cmd::InspectDeadLetters { queue } => dead_letters::inspect(&mut c, f, &vhost, &queue).await,
        Cmd::Redrive {
            queue,
            to,
            max,
            rate,
        } => redrive::redrive(&mut c, f, &vhost, &queue, to, max, rate).await,
        Cmd::QuorumStatus { queue } => health::quorum_status(&mut c, f, &vhost, &queue).await,
        Cmd::CheckIfNodeIsQuorumCritical { node } => health::quorum_critical(&mut c, f, node).await,
        Cmd::CheckForQuorumQueuesWithoutAnElectedLeader {
            pattern,
            across_all_vhosts,
        } => health::without_leader(&mut c, f, &vhost, across_all_vhosts, &pattern).await,
        Cmd::AddMember { target } => membership::add(&mut c, f, &target, &vhost).await,
        Cmd::DeleteMember { target } => membership::delete(&mut c, f, &target, &vhost).await,
        Cmd::Grow {
            node,
            strategy,
            vhost_pattern,
            queue_pattern,
        } => {
            let req = GrowRequest {
                node,
                strategy,
                vhost_pattern,
                queue_pattern,
            };
            membership::grow(&mut c, f, req).await
        }
        Cmd::Shrink { node, errors_only } => membership::shrink(&mut c, f, node, errors_only).await,
        Cmd::Rebalance {
            kind,
            vhost_pattern,
            queue_pattern,
        } => {
            let req = RebalanceRequest {
                vhost_pattern,
                queue_pattern,
            };
            membership::rebalance(&mut c, f, &kind, req).await
        }
    }
}

/// The admin client of `--node` (https with `--tls-ca-file`), carrying the cluster
/// secret.
///
/// Errors: the secret file cannot be read, a TLS file cannot be read or only one of
/// `--tls-cert-file` / `--tls-key-file` is given, the node cannot be reached.
async fn connect(args: &Args) -> anyhow::Result<Client> {
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
    Ok(AdminClient::new(secret.attach(channel)))
}
