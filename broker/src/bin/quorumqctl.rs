//! `quorumqctl`: operator CLI over the admin gRPC API, shaped like
//! rabbitmqctl (`set_policy NAME PATTERN DEFINITION [--priority N]
//! [--apply-to queues|exchanges|all]`, `clear_policy`, `list_policies`,
//! `list_queues`, `status`).

use anyhow::bail;
use clap::{Parser, Subcommand};
use quorumq_proto::v1::admin_client::AdminClient;
use quorumq_proto::v1::{
    ClearPolicyRequest, ListPoliciesRequest, ListQueuesRequest, Policy, SetPolicyRequest,
    StatusRequest,
};

#[derive(Parser, Debug)]
#[command(name = "quorumqctl", version, about = "Operate a quorumq node")]
struct Args {
    /// Node's cluster/admin address.
    #[arg(long, default_value = "http://127.0.0.1:5680", env = "QUORUMQ_ADMIN")]
    node: String,
    /// Virtual host.
    #[arg(short = 'p', long, default_value = "/")]
    vhost: String,
    #[command(subcommand)]
    cmd: Cmd,
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
    /// Lists queues with message counts.
    #[command(name = "list_queues")]
    ListQueues,
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
            println!(
                "node_id: {}\nversion: {}\nqueues: {}\nmembers: {:?}",
                s.node_id, s.version, s.queues, s.members
            );
        }
        Cmd::SetPolicy {
            name,
            pattern,
            definition,
            priority,
            apply_to,
        } => {
            println!("Setting policy \"{name}\" for pattern \"{pattern}\" to \"{definition}\" with priority \"{priority}\" for vhost \"{}\" ...", args.vhost);
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
            println!("Clearing policy \"{name}\" on vhost \"{}\" ...", args.vhost);
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
            println!("vhost\tname\tpattern\tapply-to\tdefinition\tpriority");
            for p in r.policies {
                println!(
                    "{}\t{}\t{}\t{}\t{}\t{}",
                    p.vhost, p.name, p.pattern, p.apply_to, p.definition_json, p.priority
                );
            }
        }
        Cmd::ListQueues => {
            let r = c
                .list_queues(ListQueuesRequest { vhost: args.vhost })
                .await?
                .into_inner();
            println!("name\ttype\tmessages_ready\tmessages_unacknowledged\tconsumers\tdead_letter_held\tpolicy");
            for q in r.queues {
                println!(
                    "{}\t{}\t{}\t{}\t{}\t{}\t{}",
                    q.name,
                    q.queue_type,
                    q.messages_ready,
                    q.messages_unacknowledged,
                    q.consumers,
                    q.dead_letter_held,
                    q.policy
                );
            }
        }
    }
    Ok(())
}
