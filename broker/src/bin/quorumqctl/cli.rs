//! The command line: global options and one subcommand per verb, named as
//! rabbitmqctl, rabbitmq-queues and rabbitmq-upgrade name them.

use clap::{Parser, Subcommand};

use crate::output::Formatter;

// The options and the verb (no doc comment: clap would print it as the long help).
#[derive(Parser, Debug)]
#[command(name = "quorumqctl", version, about = "Operate a quorumq node")]
pub struct Args {
    /// Node's cluster/admin address.
    #[arg(long, default_value = "http://127.0.0.1:5680", env = "QUORUMQ_ADMIN")]
    pub node: String,
    /// File of the cluster secret the node checks (default: $QUORUMQ_CLUSTER_SECRET_FILE,
    /// else ~/.quorumq.cookie, as the node finds it).
    #[arg(long, value_name = "FILE", global = true)]
    pub cluster_secret_file: Option<std::path::PathBuf>,
    /// CA certificate (PEM) of a node whose cluster port runs TLS (`cluster_tls`); with it
    /// the node address defaults to https.
    #[arg(long, value_name = "FILE", env = "QUORUMQ_TLS_CA_FILE", global = true)]
    pub tls_ca_file: Option<std::path::PathBuf>,
    /// Client certificate (PEM) for a TLS cluster port (signed by the cluster's CA).
    #[arg(
        long,
        value_name = "FILE",
        env = "QUORUMQ_TLS_CERT_FILE",
        global = true
    )]
    pub tls_cert_file: Option<std::path::PathBuf>,
    /// Key (PEM) of --tls-cert-file.
    #[arg(long, value_name = "FILE", env = "QUORUMQ_TLS_KEY_FILE", global = true)]
    pub tls_key_file: Option<std::path::PathBuf>,
    /// Virtual host.
    #[arg(short = 'p', long, default_value = "/", global = true)]
    pub vhost: String,
    /// Output format of listing and status commands (rabbitmqctl `--formatter`).
    #[arg(long, value_enum, default_value_t = Formatter::Table, global = true)]
    pub formatter: Formatter,
    #[command(subcommand)]
    pub cmd: Cmd,
}

// One variant per verb; a variant's doc comment is its help text.
#[derive(Subcommand, Debug)]
pub enum Cmd {
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
    /// Shows the ready message at 1-based POSITION in delivery order without
    /// removing or redelivering it (rabbitmq-queues peek).
    Peek {
        queue: String,
        #[arg(allow_negative_numbers = true)]
        position: i64,
    },
    /// Summarises the dead letters QUEUE holds (by reason and source queue of
    /// their last death) and, for a source queue, its held at-least-once dead
    /// letters by why they are held; consumes nothing.
    #[command(name = "inspect_dead_letters")]
    InspectDeadLetters { queue: String },
    /// Moves QUEUE's ready messages back to the queue each one last died in (or to
    /// --to DEST), at-least-once: each is committed in its destination before it is
    /// removed from QUEUE. Messages that cannot go anywhere stay and are reported.
    Redrive {
        queue: String,
        /// Destination queue (same vhost) for every message.
        #[arg(long)]
        to: Option<String>,
        /// Move at most N messages.
        #[arg(long)]
        max: Option<u64>,
        /// Move at most this many messages per second.
        #[arg(long)]
        rate: Option<f64>,
    },
    /// Raft status of every member of a quorum queue (rabbitmq-queues quorum_status).
    #[command(name = "quorum_status")]
    QuorumStatus { queue: String },
    /// Exits 69 listing the quorum queues that would lose their majority if NODE
    /// (default: the node asked) stopped (rabbitmq-queues check_if_node_is_quorum_critical).
    #[command(name = "check_if_node_is_quorum_critical")]
    CheckIfNodeIsQuorumCritical { node: Option<u64> },
    /// Exits 69 listing the quorum queues matching PATTERN (default: all) without an
    /// elected, reachable leader (rabbitmq-diagnostics 4.1).
    #[command(name = "check_for_quorum_queues_without_an_elected_leader")]
    CheckForQuorumQueuesWithoutAnElectedLeader {
        #[arg(default_value = ".*")]
        pattern: String,
        /// Every vhost, not only --vhost.
        #[arg(long = "across-all-vhosts")]
        across_all_vhosts: bool,
    },
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
    /// Sets the memory high watermark of the node asked until it restarts
    /// (rabbitmqctl set_vm_memory_high_watermark): FRACTION of total memory (0 blocks
    /// publishers at once), or `absolute LIMIT` in bytes or with a unit (k, KiB, M, MiB, G,
    /// GiB = powers of 1024; kB, MB, GB = of 1000).
    #[command(name = "set_vm_memory_high_watermark")]
    SetVmMemoryHighWatermark {
        #[arg(num_args = 1..=2, value_name = "FRACTION | absolute LIMIT", allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Removes NODE's replica from every quorum queue (rabbitmq-queues shrink).
    Shrink {
        node: u64,
        /// List only the queues whose change failed.
        #[arg(long = "errors-only")]
        errors_only: bool,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

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
