//! `quorumq`: starts one broker node (single-node by default, data under
//! `./data`, AMQP on 127.0.0.1:5672).

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use quorumq::config::Config;
use quorumq::node::Broker;

/// Global allocator: mimalloc. The broker allocates and frees a few buffers per
/// message (frames, bodies, Raft entries) across threads; glibc malloc spent
/// ~17 % of broker CPU in a dead-letter benchmark (perf, 50k × 1 KiB).
/// Built with `no_thp` (Cargo.toml): openraft 0.9 preallocates a
/// 4,096-command queue per Raft group (~620 KiB, untouched while idle), and
/// with transparent huge pages on mimalloc's arenas touching any byte made
/// 2 MiB resident: 788 KiB RSS per idle queue, 87 KiB without
/// (cluster-tests/bench/idle.sh, one node, 500 queues).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Command-line flags; they override the config file.
#[derive(Parser, Debug)]
#[command(
    name = "quorumq",
    version,
    about = "RabbitMQ-compatible broker with Raft-replicated quorum queues"
)]
struct Args {
    /// TOML configuration file (see deploy/quorumq.toml).
    #[arg(long)]
    config: Option<PathBuf>,
    /// AMQP 0-9-1 listen address.
    #[arg(long)]
    amqp_listen: Option<String>,
    /// Data directory.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Cluster gRPC (Raft transport + admin API) listen address.
    #[arg(long)]
    cluster_listen: Option<String>,
    /// Node id.
    #[arg(long)]
    node_id: Option<u64>,
    /// HTTP management API (/api), Prometheus /metrics and health probes
    /// (/health/live, /health/ready); default 127.0.0.1:15672 (skipped with a warning when
    /// taken), "" = off.
    #[arg(long, value_name = "HOST:PORT")]
    http_listen: Option<String>,
    /// Cluster address peers dial to reach this node (default: --cluster-listen).
    #[arg(long)]
    advertise: Option<String>,
    /// AMQP address reported by cluster_status (default: --amqp-listen).
    #[arg(long)]
    amqp_advertise: Option<String>,
    /// Static cluster: every node as ID=HOST:PORT (cluster address), comma-separated.
    #[arg(long, value_delimiter = ',')]
    peers: Option<Vec<String>>,
    /// Join the cluster of the node at HOST:PORT (its cluster address).
    #[arg(long)]
    join: Option<String>,
    /// Replace node N (down for good: dead disk, corrupt log): forget it and take its place
    /// in every queue it was a member of.
    #[arg(long, value_name = "N")]
    replaces: Option<u64>,
    /// Type of durable queues declared without x-queue-type: quorum (default) or classic.
    #[arg(long, value_name = "TYPE")]
    default_queue_type: Option<String>,
    /// Memory high watermark, fraction of total memory (default 0.4): publishers are blocked
    /// while resident memory is at or above it.
    #[arg(long, value_name = "FRACTION")]
    vm_memory_high_watermark: Option<f64>,
    /// Memory high watermark in bytes (overrides the fraction).
    #[arg(long, value_name = "BYTES")]
    vm_memory_high_watermark_bytes: Option<u64>,
    /// Free disk space (bytes) under which publishers are blocked (default 50000000).
    #[arg(long, value_name = "BYTES")]
    disk_free_limit: Option<u64>,
    /// Most client connections this node accepts (default: no limit).
    #[arg(long, value_name = "N")]
    connection_max: Option<u64>,
    /// Channels per connection offered to clients (default 2047; 0 = 65535).
    #[arg(long, value_name = "N")]
    channel_max: Option<u16>,
    /// Raft write-ahead-log segment size in bytes (default 67108864 = 64 MiB, at least
    /// 1 MiB; the log needs about four segments of disk).
    #[arg(long, value_name = "BYTES")]
    wal_segment_bytes: Option<u64>,
    /// Snapshot a queue every N Raft log entries (default 4096).
    #[arg(long, value_name = "N")]
    snapshot_interval: Option<u64>,
    /// Worker threads of the node's async runtime (default: TOKIO_WORKER_THREADS if set,
    /// else one less than the CPUs, at least 1).
    #[arg(long, value_name = "N")]
    worker_threads: Option<usize>,
    /// Most consumers per channel (default: no limit).
    #[arg(long, value_name = "N")]
    consumer_max_per_channel: Option<u64>,
    /// Consumer timeout in ms (RabbitMQ `consumer_timeout`, default 1800000; 0 = none):
    /// a delivery left unacknowledged longer cancels its consumer.
    #[arg(long, value_name = "MS")]
    consumer_timeout: Option<u64>,
    /// Users who may connect only from loopback, comma-separated (default: guest; an
    /// empty value lets every user connect from anywhere).
    #[arg(long, value_name = "USERS", value_delimiter = ',')]
    loopback_users: Option<Vec<String>>,
    /// File of the cluster secret (default: $QUORUMQ_CLUSTER_SECRET_FILE, else
    /// ~/.quorumq.cookie; created when missing). Every node and quorumqctl need the same.
    #[arg(long, value_name = "FILE")]
    cluster_secret_file: Option<PathBuf>,
    /// TLS certificate chain (PEM): with --tls-key-file turns on AMQPS (--amqps-listen).
    #[arg(long, value_name = "FILE")]
    tls_cert_file: Option<PathBuf>,
    /// TLS private key (PEM) of --tls-cert-file.
    #[arg(long, value_name = "FILE")]
    tls_key_file: Option<PathBuf>,
    /// CA certificates (PEM) of client and node certificates.
    #[arg(long, value_name = "FILE")]
    tls_ca_file: Option<PathBuf>,
    /// AMQPS listen address (default 127.0.0.1:5671 when TLS files are given).
    #[arg(long, value_name = "HOST:PORT")]
    amqps_listen: Option<String>,
    /// Ask AMQPS clients for a certificate signed by --tls-ca-file (EXTERNAL login).
    #[arg(long)]
    tls_verify_peer: bool,
    /// With --tls-verify-peer, refuse AMQPS clients without a certificate.
    #[arg(long)]
    tls_fail_if_no_peer_cert: bool,
    /// Mutual TLS on the cluster port (every node, and quorumqctl, with a certificate
    /// signed by --tls-ca-file).
    #[arg(long)]
    cluster_tls: bool,
    /// Repair a corrupt write-ahead log: cut it at SEGMENT:OFFSET, exactly as the refusal to
    /// start named it, dropping every record from there on (for this start only).
    #[arg(long, value_name = "SEGMENT:OFFSET")]
    wal_truncate_at: Option<String>,
}

/// mimalloc's `mi_option_purge_delay` (mimalloc.h, v3: 15; default 10 ms).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Memory-pressure hook ([`quorumq::alarms::on_memory_pressure`]): under a memory alarm,
/// freed pages go back to the OS at once (purge delay 0); afterwards the default 10 ms.
fn purge_freed_memory_at_once(on: bool) {
    // SAFETY: mi_option_set only stores an option value; mimalloc reads options atomically.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, if on { 0 } else { 10 }) }
}

fn main() -> anyhow::Result<()> {
    {
        use tracing_subscriber::filter::FilterExt;
        use tracing_subscriber::layer::{Layer, SubscriberExt};
        use tracing_subscriber::util::SubscriberInitExt;
        let env = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| "info,openraft=warn,sled=warn".into());
        // A repeating condition is logged a few times a second, then summarised
        // (issue 31); QUORUMQ_LOG_UNLIMITED=1 logs every line.
        let unlimited = std::env::var_os("QUORUMQ_LOG_UNLIMITED").is_some_and(|v| v == "1");
        let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
        if unlimited {
            tracing_subscriber::registry()
                .with(fmt.with_filter(env))
                .init();
        } else {
            let limit = quorumq::cluster::log_limit::RateLimit::with_summaries();
            tracing_subscriber::registry()
                .with(fmt.with_filter(env.and(limit)))
                .init();
        }
    }
    let args = Args::parse();
    let mut config = match &args.config {
        Some(p) => Config::load(p)?,
        None => Config::default(),
    };
    if let Some(v) = args.amqp_listen {
        config.amqp_listen = v;
    }
    if let Some(v) = args.data_dir {
        config.data_dir = v;
    }
    if let Some(v) = args.cluster_listen {
        config.cluster_listen = v;
    }
    if let Some(v) = args.node_id {
        config.node_id = v;
    }
    if let Some(v) = args.http_listen {
        config.http_listen = Some(v);
    }
    if let Some(v) = args.advertise {
        config.advertise = Some(v);
    }
    if let Some(v) = args.amqp_advertise {
        config.amqp_advertise = Some(v);
    }
    if let Some(v) = args.peers {
        config.peers = v;
    }
    if let Some(v) = args.join {
        config.join = Some(v);
    }
    if let Some(v) = args.replaces {
        config.replaces = Some(v);
    }
    if let Some(v) = args.default_queue_type {
        config.default_queue_type = v;
    }
    config
        .classic_by_default()
        .map_err(|e| anyhow::anyhow!("--default-queue-type: {e}"))?;
    if let Some(v) = args.vm_memory_high_watermark {
        config.vm_memory_high_watermark = v;
    }
    if let Some(v) = args.vm_memory_high_watermark_bytes {
        config.vm_memory_high_watermark_bytes = Some(v);
    }
    if let Some(v) = args.disk_free_limit {
        config.disk_free_limit_bytes = v;
    }
    if let Some(v) = args.connection_max {
        config.connection_max = Some(v);
    }
    if let Some(v) = args.channel_max {
        config.channel_max = v;
    }
    if let Some(v) = args.wal_segment_bytes {
        config.wal_segment_bytes = v;
    }
    if let Some(v) = args.snapshot_interval {
        config.snapshot_interval = v.max(1);
    }
    if let Some(v) = args.worker_threads {
        config.worker_threads = Some(v);
    }
    if let Some(v) = args.consumer_max_per_channel {
        config.consumer_max_per_channel = Some(v);
    }
    if let Some(v) = args.consumer_timeout {
        config.consumer_timeout = v;
    }
    if let Some(v) = args.loopback_users {
        config.loopback_users = v.into_iter().filter(|u| !u.is_empty()).collect();
    }
    if let Some(v) = args.cluster_secret_file {
        config.cluster_secret_file = Some(v);
    }
    if let Some(v) = args.tls_cert_file {
        config.tls_cert_file = Some(v);
    }
    if let Some(v) = args.tls_key_file {
        config.tls_key_file = Some(v);
    }
    if let Some(v) = args.tls_ca_file {
        config.tls_ca_file = Some(v);
    }
    if let Some(v) = args.amqps_listen {
        config.amqps_listen = Some(v);
    }
    config.tls_verify_peer |= args.tls_verify_peer;
    config.tls_fail_if_no_peer_cert |= args.tls_fail_if_no_peer_cert;
    config.cluster_tls |= args.cluster_tls;
    if let Some(v) = args.wal_truncate_at {
        config.wal_truncate_at = Some(
            raft_log::parse_truncate_at(&v)
                .map_err(|e| anyhow::anyhow!("--wal-truncate-at: {e}"))?,
        );
    }
    config
        .parsed_peers()
        .map_err(|e| anyhow::anyhow!("--peers: {e}"))?;
    quorumq::alarms::on_memory_pressure(purge_freed_memory_at_once);
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let env_set = std::env::var_os("TOKIO_WORKER_THREADS").is_some();
    if let Some(n) = config.runtime_workers(env_set, cpus) {
        rt.worker_threads(n);
    }
    let rt = rt.enable_all().build()?;
    rt.block_on(run(config))
}

/// Longest a graceful stop waits for each queue's leadership to move to
/// another member (a stop under a supervisor should allow ~60 s).
const DRAIN_FOR: std::time::Duration = std::time::Duration::from_secs(15);

async fn run(config: Config) -> anyhow::Result<()> {
    let amqp = tokio::net::TcpListener::bind(&config.amqp_listen)
        .await
        .with_context(|| format!("binding AMQP listener {}", config.amqp_listen))?;
    let cluster_addr: SocketAddr = config
        .cluster_listen
        .parse()
        .context("cluster_listen must be host:port")?;
    let cluster = tokio::net::TcpListener::bind(cluster_addr)
        .await
        .with_context(|| format!("binding cluster listener {cluster_addr}"))?;
    let tls = config.tls_files().context("TLS files")?;
    let amqps = match &tls {
        Some(files) => {
            let addr = config
                .amqps_listen
                .clone()
                .unwrap_or_else(|| quorumq::config::DEFAULT_AMQPS_LISTEN.to_owned());
            let server = files
                .amqps_config(config.tls_verify_peer, config.tls_fail_if_no_peer_cert)
                .context("AMQPS")?;
            let listener = tokio::net::TcpListener::bind(&addr)
                .await
                .with_context(|| format!("binding AMQPS listener {addr}"))?;
            Some((listener, tokio_rustls::TlsAcceptor::from(server), addr))
        }
        None => None,
    };
    let cluster_tls = match (&tls, config.cluster_tls) {
        (Some(files), true) => Some(files.cluster_server().context("cluster TLS")?),
        (None, true) => {
            anyhow::bail!("--cluster-tls needs --tls-cert-file, --tls-key-file and --tls-ca-file")
        }
        _ => None,
    };
    let started: quorumq::http::Started = Default::default();
    let http_addr = config
        .http_listen
        .clone()
        .unwrap_or_else(|| quorumq::http::DEFAULT_LISTEN.to_owned());
    if !http_addr.is_empty() {
        match tokio::net::TcpListener::bind(&http_addr).await {
            Ok(http) => {
                let started = started.clone();
                tokio::spawn(async move {
                    if let Err(e) = quorumq::http::serve(http, started).await {
                        tracing::error!(error = %e, "HTTP endpoint failed");
                    }
                });
            }
            Err(e) if config.http_listen.is_none() => {
                tracing::warn!(addr = %http_addr, error = %e, "default HTTP listener (management API, /metrics) not started; set --http-listen");
            }
            Err(e) => {
                return Err(e).with_context(|| format!("binding HTTP listener {http_addr}"));
            }
        }
    }
    let (broker, services) = Broker::open(config.clone())
        .await
        .context("starting node")?;
    let admin = quorumq::admin::AdminService::server(broker.clone());
    let (raft, cluster_svc) = services.servers();
    let mut grpc_server = tonic::transport::Server::builder()
        .http2_max_pending_accept_reset_streams(Some(
            quorumq::cluster::server::MAX_PENDING_ACCEPT_RESETS,
        ));
    if let Some(tls) = cluster_tls {
        grpc_server = grpc_server.tls_config(tls).context("cluster TLS")?;
    }
    let grpc = tokio::spawn(
        grpc_server
            .layer(tonic::service::InterceptorLayer::new(
                broker.peers().secret().server_check(),
            ))
            .add_service(admin)
            .add_service(raft)
            .add_service(cluster_svc)
            .serve_with_incoming(tokio_stream_incoming(cluster)),
    );
    broker.start().await.context("starting node")?;
    tracing::info!(amqp = %config.amqp_listen, cluster = %cluster_addr, data = %config.data_dir.display(), node = config.node_id, "quorumq ready");
    let server = tokio::spawn(quorumq::amqp::server::run(amqp, broker.clone()));
    let amqps_server = amqps.map(|(listener, acceptor, addr)| {
        tracing::info!(amqps = %addr, "AMQPS listener");
        tokio::spawn(quorumq::amqp::server::run_tls(
            listener,
            acceptor,
            broker.clone(),
        ))
    });
    let _ = started.set(broker.clone());
    shutdown_signal().await;
    // Hand queue leaderships to other members first (a rolling restart then
    // costs each queue one hand-over, not a failure detection + election).
    tracing::info!("shutting down: draining");
    quorumq::cluster::drain::drain(broker.queues(), DRAIN_FOR).await;
    tracing::info!("shutting down");
    server.abort();
    if let Some(s) = amqps_server {
        s.abort();
    }
    grpc.abort();
    broker.shutdown().await;
    Ok(())
}

/// The cluster listener's connections, with Nagle off: a Raft reply held back
/// for delayed-ACK adds up to 40 ms to every commit (the server builder's own
/// `tcp_nodelay` applies only to listeners it binds itself).
fn tokio_stream_incoming(
    listener: tokio::net::TcpListener,
) -> impl futures_core::Stream<Item = Result<tokio::net::TcpStream, std::io::Error>> {
    futures::stream::unfold(listener, |l| async move {
        let r = l.accept().await.and_then(|(s, _)| {
            s.set_nodelay(true)?;
            Ok(s)
        });
        Some((r, l))
    })
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;

    /// Cluster connections are accepted with Nagle off (a missing
    /// `set_nodelay` put a delayed-ACK wait of up to 40 ms into commits).
    #[tokio::test]
    async fn cluster_connections_are_accepted_with_nodelay() -> std::io::Result<()> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let _client = tokio::net::TcpStream::connect(addr).await?;
        let incoming = super::tokio_stream_incoming(listener);
        futures::pin_mut!(incoming);
        let accepted = incoming.next().await.expect("a connection")?;
        assert!(
            accepted.nodelay()?,
            "accepted cluster connection has TCP_NODELAY"
        );
        Ok(())
    }
}
