//! Node configuration: TOML file, overridden by command-line flags.

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Settings of one node. Defaults give a single node on 127.0.0.1 with
/// data under `./data`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Node id (u64, unique in the cluster, never reused for a wiped node).
    pub node_id: u64,
    /// Root of the node's data (Raft WAL, snapshots and message segments under `node-<id>/`).
    pub data_dir: PathBuf,
    /// AMQP 0-9-1 listener.
    pub amqp_listen: String,
    /// Cluster gRPC listener (Raft transport and admin API).
    pub cluster_listen: String,
    /// HTTP listener of the management API, `/metrics` and the health probes
    /// (`crate::http`). None (default) = [`crate::http::DEFAULT_LISTEN`], 127.0.0.1:15672,
    /// where a port already taken only logs a warning (a second node on one machine, or
    /// RabbitMQ's management plugin); an empty string = no HTTP listener; an address given
    /// explicitly must bind.
    pub http_listen: Option<String>,
    /// Cluster address other nodes use to reach this one (`host:port`);
    /// default: `cluster_listen`.
    pub advertise: Option<String>,
    /// AMQP address reported to operators (`quorumqctl cluster_status`);
    /// default: `amqp_listen`.
    pub amqp_advertise: Option<String>,
    /// Static cluster membership: `"ID=HOST:PORT"` for every node (this one
    /// included). Empty = a single node, or the cluster reached by `join`.
    pub peers: Vec<String>,
    /// Cluster address of a running node to join (`host:port`), used on the
    /// first start only; a restarted node rejoins from its own data.
    pub join: Option<String>,
    /// A node this one replaces (its disk died or its log is corrupt; issue 11): once this
    /// node is a member, the cluster forgets that node (`forget_cluster_node`) and adds this
    /// node to every queue it was a member of, whose leaders bring it up to date. Repeating
    /// it on later starts is harmless (a forgotten node is skipped).
    pub replaces: Option<u64>,
    /// Shortest time between two write-ahead-log syncs (`fdatasync`) while the node is busy,
    /// in µs: Raft appends of every queue that arrive meanwhile share one sync — fewer, larger
    /// log writes for up to this much extra commit latency. A lone writer waiting for each
    /// commit (a publisher waiting for every confirm) is never delayed. 0 = always sync as
    /// soon as anything is waiting.
    pub sync_interval_us: u64,
    /// Type of a durable queue declared without `x-queue-type` (RabbitMQ's vhost
    /// `default_queue_type`): `quorum` (default) or `classic`, so applications written for
    /// classic queues run unchanged (their durable queues are still replicated, but behave
    /// as classic toward clients: no `x-delivery-count`, classic-only arguments and
    /// `queue.delete` conditions). Set the same on every node: it is applied by the node a
    /// client declares through.
    pub default_queue_type: String,
    /// Memory high watermark as a fraction of total memory (RabbitMQ
    /// `vm_memory_high_watermark.relative`, default 0.4): resident memory at or above it
    /// blocks publishers (`connection.blocked`).
    pub vm_memory_high_watermark: f64,
    /// Memory high watermark in bytes (RabbitMQ `vm_memory_high_watermark.absolute`);
    /// overrides the fraction when set.
    pub vm_memory_high_watermark_bytes: Option<u64>,
    /// Free disk space under which publishers are blocked, bytes (RabbitMQ
    /// `disk_free_limit.absolute`, default 50 MB), measured on the data directory's
    /// filesystem.
    pub disk_free_limit_bytes: u64,
    /// Most client connections this node accepts (RabbitMQ `connection_max`); one more
    /// gets 530 NOT_ALLOWED at connection.open. None (default) = no limit.
    pub connection_max: Option<u64>,
    /// Channels per connection offered in connection.tune (RabbitMQ `channel_max`, default
    /// 2047; 0 = 65535, the protocol's maximum). A channel number above the negotiated
    /// maximum closes the connection with 530.
    pub channel_max: u16,
    /// Most consumers on one channel (RabbitMQ 3.12+ `consumer_max_per_channel`); one more
    /// basic.consume closes the connection with 530 NOT_ALLOWED. None (default) = no limit.
    pub consumer_max_per_channel: Option<u64>,
    /// Consumer timeout in ms (RabbitMQ `consumer_timeout`, default 1,800,000 = 30 min; 0 =
    /// none): a consumer holding a delivery unacknowledged longer is cancelled and its
    /// messages return to the queue. The lowest-precedence source: a `basic.consume`
    /// `x-consumer-timeout` argument wins, then the queue's (`x-consumer-timeout` argument
    /// and `consumer-timeout` policy, the smaller). Applied by the node the consumer's
    /// connection is on.
    pub consumer_timeout: u64,
    /// File holding the cluster secret every cluster/admin call must carry (Erlang's
    /// cookie; `cluster::secret`). Default: `$QUORUMQ_CLUSTER_SECRET_FILE`, else
    /// `$HOME/.quorumq.cookie`; created on the first start when missing.
    pub cluster_secret_file: Option<PathBuf>,
    /// Users who may connect only from a loopback address (RabbitMQ `loopback_users`,
    /// default `["guest"]`): the default guest/guest login is not reachable from the
    /// network. Empty = every user from anywhere.
    pub loopback_users: Vec<String>,
    /// The node's TLS certificate chain (PEM). With `tls_key_file` it turns on AMQPS on
    /// `amqps_listen` (RabbitMQ `ssl_options.certfile`) and is the node's identity on the
    /// cluster port when `cluster_tls` is on.
    pub tls_cert_file: Option<PathBuf>,
    /// The private key of `tls_cert_file` (PEM; RabbitMQ `ssl_options.keyfile`).
    pub tls_key_file: Option<PathBuf>,
    /// CA certificates (PEM) that sign client certificates and other nodes' certificates
    /// (RabbitMQ `ssl_options.cacertfile`).
    pub tls_ca_file: Option<PathBuf>,
    /// AMQPS listener (RabbitMQ `listeners.ssl.default`), used when `tls_cert_file` and
    /// `tls_key_file` are set; default 127.0.0.1:5671.
    pub amqps_listen: Option<String>,
    /// Ask AMQPS clients for a certificate and check it against `tls_ca_file` (RabbitMQ
    /// `ssl_options.verify = verify_peer`); a verified certificate's common name may log in
    /// with the EXTERNAL mechanism. Default false.
    pub tls_verify_peer: bool,
    /// With `tls_verify_peer`: refuse AMQPS clients without a certificate (RabbitMQ
    /// `ssl_options.fail_if_no_peer_cert`). Default false.
    pub tls_fail_if_no_peer_cert: bool,
    /// Mutual TLS on the cluster port: the node serves and calls with `tls_cert_file`,
    /// and accepts only peers and quorumqctl clients whose certificate `tls_ca_file`
    /// signed. Every node of a cluster must agree. Default false (the cluster secret still
    /// guards the port).
    pub cluster_tls: bool,
    /// A queue group takes a snapshot every this many Raft log entries (default 4096, Ra's
    /// default); the log before it is then purged. Lower values shorten the log (and
    /// recovery) at the cost of more snapshot writes. Minimum 1.
    pub snapshot_interval: u64,
    /// Threads serving clients, queues and the cluster (the async runtime's workers). None
    /// (default): `TOKIO_WORKER_THREADS` if set, else one less than the CPUs the node may
    /// use, at least one (see [`default_worker_threads`]). Minimum 1.
    pub worker_threads: Option<usize>,
    /// Size at which the Raft write-ahead log starts a new segment file, in bytes (default
    /// 64 MiB; at least 1 MiB). The WAL keeps up to about four segments before it rewrites
    /// idle queues' few entries out of the oldest one, so a node's log needs about
    /// 4 × this on disk; a smaller value suits a small data volume, at the cost of more
    /// segment rolls (each writes a checkpoint of every queue). The counterpart of Ra's
    /// `wal_max_size_bytes` (RabbitMQ `raft.wal_max_size_bytes`, default 512 MiB).
    pub wal_segment_bytes: u64,
    /// `--wal-truncate-at` (command line only, never read from the file: a one-off repair):
    /// `(segment id, byte offset)` of a corrupt WAL record where recovery may cut the log
    /// (raft-log `StoreOptions::wal_truncate_at`).
    #[serde(skip)]
    pub wal_truncate_at: Option<(u64, u64)>,
}

/// Default of [`Config::wal_segment_bytes`]: 64 MiB.
pub const DEFAULT_WAL_SEGMENT_BYTES: u64 = 64 << 20;

/// Smallest [`Config::wal_segment_bytes`] accepted: 1 MiB.
pub const MIN_WAL_SEGMENT_BYTES: u64 = 1 << 20;

/// Default of [`Config::sync_interval_us`]: 300 µs. Measured with `quorumq-perf` (1 KiB,
/// confirm 256, prefetch 256) on the 2-core dev VM. Before the WAL was preallocated: 0 µs →
/// ~16k msg/s consumed at 42 µs of broker CPU per message, 1000 µs → ~26k msg/s at 17 µs.
/// With preallocated segments (2026-11-25, 1000 / 300 / 200 / 0 µs): 100k plain 118–121k /
/// 144–146k / 150–160k / 153k msg/s at 7.2–7.9 ms of CPU per 1k messages for all; a fixed
/// 10k msg/s e2e p50 1.43 / 0.49–0.51 / 0.40–0.44 / 0.44 ms at 27–30 / 34–36 / 37 / 43 µs of
/// CPU per message (README "Benchmark").
pub const DEFAULT_SYNC_INTERVAL_US: u64 = 300;

/// Default of [`Config::consumer_timeout`]: 30 minutes, as RabbitMQ.
pub const DEFAULT_CONSUMER_TIMEOUT_MS: u64 = 1_800_000;

/// Default of [`Config::channel_max`]: channels per connection, RabbitMQ's default
/// `channel_max` (2047). The AMQP front end starts a connection with it before tuning.
pub const DEFAULT_CHANNEL_MAX: u16 = 2047;

/// Default of [`Config::worker_threads`]: one less than `cpus` (the CPUs the node may use),
/// at least one. The rest of a node's work runs outside the runtime's workers: the WAL's
/// flusher thread (record writes and `fdatasync`), the kernel's TCP and block I/O. Workers
/// that outnumber the CPUs left for them take turns on one CPU and wake each other for every
/// task one hands the other (tokio unparks an idle worker to steal the work), so a message
/// crosses threads several times on its way to its confirm.
///
/// Measured on the 2-core VM (2026-11-25), 1 worker vs 2, same binary, alternating runs:
/// a lone pika publisher 3.96–4.15k vs 3.20–3.44k msg/s (RabbitMQ 2.0–2.1k); 100k plain
/// 153–169k vs 118–125k msg/s; dead-letter arrival 78k vs 74–82k msg/s; a fixed 2k msg/s
/// e2e p50 0.28 vs 0.34–0.35 ms at 56 % of the CPU.
pub fn default_worker_threads(cpus: usize) -> usize {
    cpus.saturating_sub(1).max(1)
}

impl Config {
    /// Worker threads to build the node's runtime with: [`Config::worker_threads`] (at least
    /// 1); else, unless `TOKIO_WORKER_THREADS` is set (`env_set`: the runtime builder reads it
    /// itself), [`default_worker_threads`] of `cpus`.
    pub fn runtime_workers(&self, env_set: bool, cpus: usize) -> Option<usize> {
        self.worker_threads
            .map(|n| n.max(1))
            .or_else(|| (!env_set).then(|| default_worker_threads(cpus)))
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            node_id: 1,
            data_dir: PathBuf::from("./data"),
            amqp_listen: "127.0.0.1:5672".into(),
            cluster_listen: "127.0.0.1:5680".into(),
            http_listen: None,
            advertise: None,
            amqp_advertise: None,
            peers: Vec::new(),
            join: None,
            replaces: None,
            sync_interval_us: DEFAULT_SYNC_INTERVAL_US,
            wal_truncate_at: None,
            wal_segment_bytes: DEFAULT_WAL_SEGMENT_BYTES,
            snapshot_interval: crate::cluster::DEFAULT_SNAPSHOT_INTERVAL,
            worker_threads: None,
            default_queue_type: "quorum".into(),
            vm_memory_high_watermark: crate::alarms::DEFAULT_MEMORY_HIGH_WATERMARK,
            vm_memory_high_watermark_bytes: None,
            disk_free_limit_bytes: crate::alarms::DEFAULT_DISK_FREE_LIMIT_BYTES,
            connection_max: None,
            channel_max: DEFAULT_CHANNEL_MAX,
            consumer_max_per_channel: None,
            consumer_timeout: DEFAULT_CONSUMER_TIMEOUT_MS,
            loopback_users: vec!["guest".into()],
            cluster_secret_file: None,
            tls_cert_file: None,
            tls_key_file: None,
            tls_ca_file: None,
            amqps_listen: None,
            tls_verify_peer: false,
            tls_fail_if_no_peer_cert: false,
            cluster_tls: false,
        }
    }
}

/// Default of [`Config::amqps_listen`] (RabbitMQ's AMQPS port, loopback only).
pub const DEFAULT_AMQPS_LISTEN: &str = "127.0.0.1:5671";

impl Config {
    /// The node's TLS files, loaded, when `tls_cert_file` and `tls_key_file` are set.
    ///
    /// Errors: only one of the two set; a file unreadable or without PEM content.
    pub fn tls_files(&self) -> Result<Option<crate::tls::TlsFiles>, crate::tls::TlsError> {
        match (&self.tls_cert_file, &self.tls_key_file) {
            (Some(cert), Some(key)) => Ok(Some(crate::tls::TlsFiles::load(
                cert,
                key,
                self.tls_ca_file.as_deref(),
            )?)),
            (None, None) => Ok(None),
            _ => Err(crate::tls::TlsError::Config(
                "tls_cert_file and tls_key_file go together".into(),
            )),
        }
    }

    /// The client TLS toward peers' cluster ports when `cluster_tls` is on.
    ///
    /// Errors: `cluster_tls` without certificate, key and CA files.
    pub fn cluster_client_tls(
        &self,
    ) -> Result<Option<tonic::transport::ClientTlsConfig>, crate::tls::TlsError> {
        if !self.cluster_tls {
            return Ok(None);
        }
        let files = self.tls_files()?.ok_or_else(|| {
            crate::tls::TlsError::Config(
                "cluster_tls needs tls_cert_file, tls_key_file and tls_ca_file".into(),
            )
        })?;
        files.cluster_client().map(Some)
    }
}

/// Errors reading a configuration file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("parsing {path}: {source}")]
    Parse {
        path: PathBuf,
        source: toml::de::Error,
    },
}

/// A peer of the static cluster list (`--peers ID=HOST:PORT,...`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// Node id.
    pub id: u64,
    /// Cluster gRPC address (`host:port`).
    pub addr: String,
}

impl Config {
    /// The cluster address peers dial: `advertise`, else `cluster_listen`.
    pub fn advertised(&self) -> String {
        self.advertise
            .clone()
            .unwrap_or_else(|| self.cluster_listen.clone())
    }

    /// The AMQP address reported to operators: `amqp_advertise`, else `amqp_listen`.
    pub fn amqp_advertised(&self) -> String {
        self.amqp_advertise
            .clone()
            .unwrap_or_else(|| self.amqp_listen.clone())
    }

    /// The memory high watermark in bytes: the absolute setting, else the fraction of this
    /// machine's total memory (`u64::MAX`, never reached, when total memory is unknown).
    pub fn memory_limit_bytes(&self) -> u64 {
        self.vm_memory_high_watermark_bytes.unwrap_or_else(|| {
            crate::alarms::total_memory_bytes().map_or(u64::MAX, |t| {
                (t as f64 * self.vm_memory_high_watermark) as u64
            })
        })
    }

    /// The channel maximum offered to clients: [`Config::channel_max`], 0 meaning 65535.
    pub fn offered_channel_max(&self) -> u16 {
        match self.channel_max {
            0 => u16::MAX,
            n => n,
        }
    }

    /// True when untyped durable queues are declared classic ([`Config::default_queue_type`]).
    ///
    /// Errors: a type other than `quorum` or `classic`.
    pub fn classic_by_default(&self) -> Result<bool, String> {
        match self.default_queue_type.as_str() {
            "quorum" => Ok(false),
            "classic" => Ok(true),
            other => Err(format!(
                "default_queue_type '{other}': expected 'quorum' or 'classic'"
            )),
        }
    }

    /// Parses `peers` (`ID=HOST:PORT` each).
    ///
    /// Errors: a text naming the malformed entry, or a duplicate id.
    pub fn parsed_peers(&self) -> Result<Vec<Peer>, String> {
        let mut out: Vec<Peer> = Vec::new();
        for p in &self.peers {
            let (id, addr) = p
                .split_once('=')
                .ok_or_else(|| format!("peer '{p}': expected ID=HOST:PORT"))?;
            let id: u64 = id
                .trim()
                .parse()
                .map_err(|_| format!("peer '{p}': node id must be a positive integer"))?;
            if id == 0 {
                return Err(format!("peer '{p}': node id 0 is reserved"));
            }
            let addr = addr.trim();
            if !addr.contains(':') {
                return Err(format!("peer '{p}': expected HOST:PORT"));
            }
            if out.iter().any(|q| q.id == id) {
                return Err(format!("peer id {id} listed twice"));
            }
            out.push(Peer {
                id,
                addr: addr.to_string(),
            });
        }
        out.sort_by_key(|p| p.id);
        Ok(out)
    }

    /// Loads a TOML file (keys as the struct fields).
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.into(),
            source,
        })?;
        toml::from_str(&text).map_err(|source| ConfigError::Parse {
            path: path.into(),
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_threads_leave_a_cpu_to_the_flusher_and_the_kernel() {
        assert_eq!(default_worker_threads(0), 1);
        assert_eq!(default_worker_threads(1), 1);
        assert_eq!(default_worker_threads(2), 1);
        assert_eq!(default_worker_threads(8), 7);
        let c: Config = toml::from_str("worker_threads = 3").expect("partial config");
        assert_eq!(c.worker_threads, Some(3));
        assert_eq!(c.runtime_workers(true, 2), Some(3), "the setting wins");
        let d = Config::default();
        assert_eq!(d.worker_threads, None);
        assert_eq!(d.runtime_workers(false, 2), Some(1));
        assert_eq!(
            d.runtime_workers(true, 2),
            None,
            "TOKIO_WORKER_THREADS decides"
        );
        let zero: Config = toml::from_str("worker_threads = 0").expect("partial config");
        assert_eq!(zero.runtime_workers(false, 8), Some(1));
    }

    #[test]
    fn example_config_parses_and_defaults_fill_the_rest() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/quorumq.toml");
        let c = Config::load(&path).expect("deploy/quorumq.toml parses");
        assert_eq!(c.amqp_listen, "127.0.0.1:5672");
        assert_eq!(c.sync_interval_us, DEFAULT_SYNC_INTERVAL_US);
        let c: Config = toml::from_str("sync_interval_us = 0").expect("partial config");
        assert_eq!((c.sync_interval_us, c.node_id), (0, 1));
        assert_eq!(c.data_dir, PathBuf::from("./data"));
        assert_eq!(c.wal_segment_bytes, DEFAULT_WAL_SEGMENT_BYTES);
        let c: Config = toml::from_str("wal_segment_bytes = 16777216").expect("segment size");
        assert_eq!(c.wal_segment_bytes, 16 << 20);
    }

    #[test]
    fn peers_parse_sorted_and_malformed_ones_are_refused() {
        let c = Config {
            peers: vec!["2=127.0.0.1:5681".into(), "1=127.0.0.1:5680".into()],
            ..Config::default()
        };
        let p = c.parsed_peers().expect("peers");
        assert_eq!(p.iter().map(|p| p.id).collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(p[1].addr, "127.0.0.1:5681");
        for bad in ["x=1:2", "1", "0=h:1", "3=nohost"] {
            let c = Config {
                peers: vec![bad.into()],
                ..Config::default()
            };
            assert!(c.parsed_peers().is_err(), "{bad}");
        }
        let c = Config {
            peers: vec!["1=a:1".into(), "1=b:2".into()],
            ..Config::default()
        };
        assert!(c.parsed_peers().is_err());
    }

    #[test]
    fn a_misspelt_key_is_an_error_not_ignored() {
        let err = toml::from_str::<Config>("sync_interval = 5").expect_err("unknown key");
        assert!(err.to_string().contains("sync_interval"), "{err}");
    }
}
