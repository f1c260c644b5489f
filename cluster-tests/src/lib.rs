//! Test harness for quorumq integration, crash and compatibility tests.
//!
//! * [`cluster::Cluster`] starts an n-node quorumq cluster (static `--peers`)
//!   with per-node kill -9 / SIGTERM / SIGSTOP / restart and quorumqctl views.
//! * [`Broker`] starts the `quorumq` binary on a free loopback port with its own
//!   temporary data dir (or, when `QUORUMQ_TEST_URI` is set, hands out that URI
//!   so the same tests run against another broker such as RabbitMQ 3.10.8).
//! * lapin helpers: [`connect`], [`confirm_channel`], [`publish_confirmed`],
//!   [`open_consumer`], [`consume_n`], [`amqp_error`], [`bounded`];
//!   [`assert_none`] for "no id may be in this list" checks.
//! * [`raw`]: a minimal hand-rolled AMQP 0-9-1 frame writer/reader for the tests
//!   that must send bytes no client library would send.
//!
//! Contract for the binary (see the task brief):
//! `quorumq --amqp-listen 127.0.0.1:PORT --data-dir DIR`, logs on stderr,
//! accepts AMQP once the port is open, SIGTERM = graceful stop,
//! guest/guest on vhost "/". Binary: env `QUORUMQ_BIN`, else
//! `<workspace>/target/debug/quorumq`.

use anyhow::{anyhow, bail, Context};
use futures::StreamExt;
use lapin::{
    message::Delivery,
    options::{
        BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, ConfirmSelectOptions,
        QueueDeclareOptions,
    },
    types::{AMQPValue, FieldTable},
    BasicProperties, Channel, Connection, ConnectionProperties, Consumer, ErrorKind,
};
use std::{
    collections::BTreeSet,
    fs::File,
    future::Future,
    io::{Read, Seek, SeekFrom},
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicU64, Ordering},
    sync::Mutex,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

pub mod cluster;
pub mod dlx;
pub mod faults;
pub mod http;
pub mod lean;
pub mod powerfs;
pub mod raw;

/// Env var: when set, every test runs against this AMQP URI instead of a spawned quorumq.
pub const TEST_URI_ENV: &str = "QUORUMQ_TEST_URI";
/// Env var: path of the quorumq binary to spawn.
pub const BIN_ENV: &str = "QUORUMQ_BIN";
/// What quorumq logs once its AMQP and cluster listeners are bound (broker/src/main.rs).
const READY_LINE: &str = "quorumq ready";
/// How long a launch waits for the process's [`READY_LINE`].
pub const START_TIMEOUT: Duration = Duration::from_secs(30);
/// Default per-test bound used by [`bounded`] callers.
pub const TEST_TIMEOUT: Duration = Duration::from_secs(60);

/// A broker under test: either a spawned `quorumq` process or an external URI.
pub struct Broker {
    uri: String,
    spawned: Option<Spawned>,
}

struct Spawned {
    bin: PathBuf,
    port: u16,
    /// Cluster gRPC / admin port (`--cluster-listen`), for quorumqctl.
    admin_port: u16,
    /// Holds the data dir and the stderr log; removed on drop.
    root: tempfile::TempDir,
    child: Option<Child>,
    /// Extra command-line flags of the next launches ([`Broker::restart_with`]).
    extra_args: Vec<String>,
}

impl Broker {
    /// `QUORUMQ_TEST_URI` if set ([`Broker::external`]), else spawn quorumq ([`Broker::spawn`]).
    pub async fn start() -> anyhow::Result<Broker> {
        match std::env::var(TEST_URI_ENV) {
            Ok(uri) if !uri.is_empty() => Ok(Broker::external(uri)),
            _ => Broker::spawn().await,
        }
    }

    /// A broker that is already running somewhere (e.g. RabbitMQ on 5672).
    pub fn external(uri: impl Into<String>) -> Broker {
        Broker {
            uri: uri.into(),
            spawned: None,
        }
    }

    /// Spawns the quorumq binary on a free port with a fresh temporary data dir.
    pub async fn spawn() -> anyhow::Result<Broker> {
        let bin = quorumq_bin();
        if !bin.exists() {
            bail!(
                "quorumq binary not found at {} (build it with `cargo build --bin quorumq`, \
                 set {BIN_ENV}, or set {TEST_URI_ENV} to test an external broker)",
                bin.display()
            );
        }
        // A port free a moment ago can be taken by a parallel test's broker
        // before ours binds it; ours then exits, and we retry on fresh ports.
        let mut attempt = 0;
        loop {
            attempt += 1;
            let root = tempfile::Builder::new().prefix("quorumq-test-").tempdir()?;
            std::fs::create_dir_all(root.path().join("data"))?;
            let port = free_port()?;
            let admin_port = free_port()?;
            let mut broker = Broker {
                uri: format!("amqp://guest:guest@127.0.0.1:{port}/%2f"),
                spawned: Some(Spawned {
                    bin: bin.clone(),
                    port,
                    admin_port,
                    root,
                    child: None,
                    extra_args: Vec::new(),
                }),
            };
            match broker.launch().await {
                Ok(()) => return Ok(broker),
                Err(e)
                    if attempt < 3
                        && broker
                            .log_path()
                            .is_some_and(|p| log_contains(&p, "binding")) =>
                {
                    eprintln!("quorumq lost a port race, retrying on fresh ports: {e:#}");
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The AMQP URI of this broker (`amqp://guest:guest@127.0.0.1:PORT/%2f`).
    pub fn uri(&self) -> &str {
        &self.uri
    }

    /// Admin (cluster gRPC) address of a spawned broker, for quorumqctl's
    /// `--node` (e.g. `http://127.0.0.1:PORT`).
    pub fn admin_addr(&self) -> Option<String> {
        self.spawned
            .as_ref()
            .map(|s| format!("http://127.0.0.1:{}", s.admin_port))
    }

    /// True when the tests talk to an external broker (no kill/restart possible).
    pub fn is_external(&self) -> bool {
        self.spawned.is_none()
    }

    /// The data dir of a spawned broker.
    pub fn data_dir(&self) -> Option<PathBuf> {
        self.spawned.as_ref().map(|s| s.root.path().join("data"))
    }

    /// The file that receives the spawned broker's stderr.
    pub fn log_path(&self) -> Option<PathBuf> {
        self.spawned
            .as_ref()
            .map(|s| s.root.path().join("stderr.log"))
    }

    /// Last `max_bytes` of the broker's stderr log (empty for an external broker).
    pub fn log_tail(&self, max_bytes: u64) -> String {
        self.log_path()
            .map(|p| tail_of(&p, max_bytes))
            .unwrap_or_default()
    }

    async fn launch(&mut self) -> anyhow::Result<()> {
        let log_path = self.log_path().expect("spawned");
        let data_dir = self.data_dir().expect("spawned");
        let (log, launched_at) = open_log(&log_path)?;
        let s = self.spawned.as_mut().expect("spawned");
        let child = Command::new(&s.bin)
            .arg("--amqp-listen")
            .arg(format!("127.0.0.1:{}", s.port))
            .arg("--data-dir")
            .arg(&data_dir)
            .arg("--cluster-listen")
            .arg(format!("127.0.0.1:{}", s.admin_port))
            .args(&s.extra_args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("spawning {}", s.bin.display()))?;
        s.child = Some(child);
        let what = format!("quorumq on port {}", s.port);
        let ready = wait_ready_line(&log_path, launched_at, &what, || {
            let s = self.spawned.as_mut()?;
            let status = s.child.as_mut()?.try_wait().ok().flatten()?;
            s.child = None;
            Some(status.to_string())
        })
        .await;
        if ready.is_err() {
            self.kill9();
        }
        ready
    }

    /// Process id of the spawned broker while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.spawned.as_ref()?.child.as_ref().map(|c| c.id())
    }

    /// SIGKILL the spawned broker and reap it. No-op for an external broker.
    pub fn kill9(&mut self) {
        if let Some(child) = self.spawned.as_mut().and_then(|s| s.child.as_mut()) {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(s) = self.spawned.as_mut() {
            s.child = None;
        }
    }

    /// SIGTERM and wait up to `timeout` for a graceful exit (SIGKILL after that).
    /// Returns the exit status if the process exited by itself.
    pub async fn stop_with_timeout(
        &mut self,
        timeout: Duration,
    ) -> anyhow::Result<Option<std::process::ExitStatus>> {
        let Some(s) = self.spawned.as_mut() else {
            return Ok(None);
        };
        let Some(child) = s.child.as_mut() else {
            return Ok(None);
        };
        let _ = signal(child.id(), "TERM");
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = child.try_wait()? {
                s.child = None;
                return Ok(Some(status));
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                s.child = None;
                bail!("quorumq did not exit within {timeout:?} of SIGTERM; killed");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Graceful stop (SIGTERM, up to 30 s).
    pub async fn stop(&mut self) -> anyhow::Result<()> {
        self.stop_with_timeout(Duration::from_secs(30))
            .await
            .map(|_| ())
    }

    /// Start the binary again on the same port with the same data dir.
    /// The previous process must have been stopped or killed; if it is still
    /// running it is killed first.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        if self.spawned.is_none() {
            bail!("cannot restart an external broker");
        }
        self.kill9();
        self.launch().await
    }

    /// [`Broker::restart`] with `args` added to the command line (for this launch and later
    /// ones until changed). Errors: as `restart`, including a process that exits at start.
    pub async fn restart_with(&mut self, args: &[&str]) -> anyhow::Result<()> {
        if let Some(s) = self.spawned.as_mut() {
            s.extra_args = args.iter().map(|a| a.to_string()).collect();
        }
        self.restart().await
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if self.spawned.is_some() {
            if std::thread::panicking() {
                eprintln!(
                    "---- quorumq stderr tail ({}) ----\n{}\n---- end ----",
                    self.log_path()
                        .map(|p| p.display().to_string())
                        .unwrap_or_default(),
                    self.log_tail(8000)
                );
            }
            self.kill9();
        }
    }
}

/// The quorumq binary: env `QUORUMQ_BIN`, else `<workspace>/target/debug/quorumq`.
pub fn quorumq_bin() -> PathBuf {
    if let Ok(p) = std::env::var(BIN_ENV) {
        return PathBuf::from(p);
    }
    // cluster-tests/ lives directly under the workspace root.
    let ws = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf();
    ws.join("target").join("debug").join("quorumq")
}

/// A port that was free a moment ago on 127.0.0.1, below the kernel's
/// ephemeral range (`/proc/sys/net/ipv4/ip_local_port_range`), and not handed
/// out before by this process. A node's ports stay its own while it is down:
/// an ephemeral port can become the local port of any outgoing connection
/// meanwhile, and the node's restart then failed ("binding cluster listener",
/// `dlx_exactly_once` with its two tests running side by side).
pub fn free_port() -> std::io::Result<u16> {
    static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    const LOWEST: u32 = 10_000;
    let below = ephemeral_start().unwrap_or(32_768);
    if below > LOWEST + 1_000 {
        let span = below - LOWEST;
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let mut x = u64::from(nanos) << 20 ^ u64::from(std::process::id()) | 1;
        let mut handed = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
        for _ in 0..500 {
            // xorshift64: spreads the processes that run at once apart.
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let Ok(port) = u16::try_from(LOWEST + (x % u64::from(span)) as u32) else {
                continue;
            };
            // RabbitMQ's ports in that range: a broker started without
            // `--http-listen` takes 15672 when it is free.
            if [15672, 15692, 25672].contains(&port) {
                continue;
            }
            if !handed.contains(&port) && TcpListener::bind(("127.0.0.1", port)).is_ok() {
                handed.insert(port);
                return Ok(port);
            }
        }
    }
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The first port of the kernel's ephemeral range, if it can be read.
fn ephemeral_start() -> Option<u32> {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    range.split_whitespace().next()?.parse().ok()
}

/// Opens a process's log for appending: the file, and its length now (where
/// this launch's lines start; the log is kept across restarts).
fn open_log(path: &Path) -> anyhow::Result<(File, u64)> {
    let launched_at = std::fs::metadata(path).map_or(0, |m| m.len());
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    Ok((log, launched_at))
}

/// Waits until the log at `log_path` holds [`READY_LINE`] after byte
/// `launched_at` (this launch's lines: "the port answers" could be another
/// process on a reused port number), polling every 50 ms. `exited` is asked
/// each round whether the process is gone (its exit status, as text).
///
/// Errors: the process exited, or no ready line within [`START_TIMEOUT`];
/// both carry the log's tail. The caller kills the process.
async fn wait_ready_line(
    log_path: &Path,
    launched_at: u64,
    what: &str,
    mut exited: impl FnMut() -> Option<String>,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if read_from(log_path, launched_at).contains(READY_LINE) {
            return Ok(());
        }
        if let Some(status) = exited() {
            bail!(
                "{what} exited ({status}) before it was ready; log tail:\n{}",
                tail_of(log_path, 4000)
            );
        }
        if Instant::now() > deadline {
            bail!(
                "{what} was not ready within {START_TIMEOUT:?}; log tail:\n{}",
                tail_of(log_path, 4000)
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `kill -SIG pid` (no libc dependency in this crate).
fn signal(pid: u32, sig: &str) -> anyhow::Result<()> {
    let status = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .with_context(|| format!("kill -{sig} {pid}"))?;
    if !status.success() {
        bail!("kill -{sig} {pid} failed: {status}");
    }
    Ok(())
}

/// True when the log at `path` mentions `needle` anywhere (a node that lost
/// a port race logs `binding …` first; with `RUST_BACKTRACE` set, the
/// backtrace after it pushes that line out of any short tail).
fn log_contains(path: &Path, needle: &str) -> bool {
    read_from(path, 0).contains(needle)
}

fn tail_of(path: &Path, max_bytes: u64) -> String {
    let len = std::fs::metadata(path).map_or(0, |m| m.len());
    read_from(path, len.saturating_sub(max_bytes))
}

/// The file's text from byte `offset` on (empty if unreadable).
fn read_from(path: &Path, offset: u64) -> String {
    let Ok(mut f) = File::open(path) else {
        return String::new();
    };
    let _ = f.seek(SeekFrom::Start(offset));
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    String::from_utf8_lossy(&buf).into_owned()
}

/// Runs `fut` with a time bound; panics (failing the test) if it takes longer.
pub async fn bounded<T>(limit: Duration, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(limit, fut).await {
        Ok(v) => v,
        Err(_) => panic!("test did not finish within {limit:?}"),
    }
}

/// A `key: N kB` line of `/proc/PID/status` (e.g. `"VmRSS:"`, `"VmHWM:"`, the peak), in
/// bytes; None when the process or the line is gone.
pub fn proc_status_bytes(pid: u32, key: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(key))?;
    let kib: u64 = line[key.len()..].split_whitespace().next()?.parse().ok()?;
    Some(kib << 10)
}

/// CPU time (user + system) of process `pid` so far, from `/proc/PID/stat`.
///
/// Errors: the process is gone, or its stat line does not parse.
pub fn cpu_time(pid: u32) -> anyhow::Result<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which is in parentheses).
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .context("malformed /proc stat")?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after ')'.
    let field = |i: usize| -> anyhow::Result<u64> {
        Ok(f.get(i).context("short /proc stat")?.parse::<u64>()?)
    };
    let ticks = field(11)? + field(12)?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Ok(Duration::from_secs_f64(ticks as f64 / hz as f64))
}

/// A name unique to this process and call, e.g. `ct.queue.1712.3.8123`.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "ct.{prefix}.{}.{}.{nanos}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Connects with a 10 s bound.
pub async fn connect(uri: &str) -> anyhow::Result<Connection> {
    tokio::time::timeout(
        Duration::from_secs(10),
        Connection::connect(uri, ConnectionProperties::default()),
    )
    .await
    .map_err(|_| anyhow!("connect to {uri} timed out"))?
    .with_context(|| format!("connect to {uri}"))
}

/// Connects to `uri` expecting a refusal (login or connection.open answered with
/// connection.close); returns its (reply code, text).
///
/// Errors: the connection was accepted, the refusal was not an AMQP close, or no answer
/// within 15 s (a refused login is answered after quorumq's 1 s delay).
pub async fn connect_refusal(uri: &str) -> anyhow::Result<(u16, String)> {
    match tokio::time::timeout(
        Duration::from_secs(15),
        Connection::connect(uri, ConnectionProperties::default()),
    )
    .await
    {
        Err(_) => bail!("connect to {uri} neither succeeded nor was refused in 15 s"),
        Ok(Ok(_)) => bail!("connection to {uri} accepted; expected a refusal"),
        Ok(Err(e)) => amqp_error(&e).ok_or_else(|| anyhow!("not an AMQP refusal: {e:?}")),
    }
}

/// Opens a channel in publisher-confirm mode.
pub async fn confirm_channel(conn: &Connection) -> anyhow::Result<Channel> {
    let ch = conn.create_channel().await?;
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    Ok(ch)
}

/// Publishes and waits for the broker's confirm; errors on a nack or a return.
pub async fn publish_confirmed(
    ch: &Channel,
    exchange: &str,
    routing_key: &str,
    body: &[u8],
    props: BasicProperties,
) -> anyhow::Result<()> {
    let confirm = ch
        .basic_publish(
            exchange.into(),
            routing_key.into(),
            BasicPublishOptions::default(),
            body,
            props,
        )
        .await?
        .await?;
    if !confirm.is_ack() {
        bail!("publish to {exchange:?}/{routing_key:?} was nacked");
    }
    if let Some(ret) = confirm.take_message() {
        bail!(
            "publish to {exchange:?}/{routing_key:?} was returned: {} {}",
            ret.reply_code,
            ret.reply_text
        );
    }
    Ok(())
}

/// Opens a channel on `conn` with basic.qos `prefetch` and a basic.consume
/// (manual acks, server-named tag) on queue `q`.
pub async fn open_consumer(
    conn: &Connection,
    q: &str,
    prefetch: u16,
) -> anyhow::Result<(Channel, Consumer)> {
    let ch = conn.create_channel().await?;
    ch.basic_qos(prefetch, BasicQosOptions::default()).await?;
    let consumer = ch
        .basic_consume(
            q.into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    Ok((ch, consumer))
}

/// Asserts `items` is empty; the failure names `what`, how many there are and
/// the first ten (e.g. `assert_none("confirmed ids never arrived", &missing)`).
#[track_caller]
pub fn assert_none<T: std::fmt::Debug>(what: &str, items: &[T]) {
    assert!(
        items.is_empty(),
        "{what}: {}, e.g. {:?}",
        items.len(),
        &items[..items.len().min(10)]
    );
}

/// Takes exactly `n` deliveries from `consumer` within `limit`.
pub async fn consume_n(
    consumer: &mut Consumer,
    n: usize,
    limit: Duration,
) -> anyhow::Result<Vec<Delivery>> {
    let mut out = Vec::with_capacity(n);
    let deadline = tokio::time::Instant::now() + limit;
    while out.len() < n {
        match tokio::time::timeout_at(deadline, consumer.next()).await {
            Err(_) => bail!("got {} of {n} deliveries within {limit:?}", out.len()),
            Ok(None) => bail!("consumer ended after {} of {n} deliveries", out.len()),
            Ok(Some(Err(e))) => bail!("consumer error after {} of {n} deliveries: {e}", out.len()),
            Ok(Some(Ok(d))) => out.push(d),
        }
    }
    Ok(out)
}

/// Asserts that no delivery arrives on `consumer` within `wait`.
pub async fn expect_no_delivery(consumer: &mut Consumer, wait: Duration) -> anyhow::Result<()> {
    match tokio::time::timeout(wait, consumer.next()).await {
        Err(_) => Ok(()),
        Ok(Some(Ok(d))) => bail!(
            "unexpected delivery tag {} body {:?}",
            d.delivery_tag,
            String::from_utf8_lossy(&d.data)
        ),
        Ok(other) => bail!("unexpected consumer event {other:?}"),
    }
}

/// Waits for the next consumer event and returns the AMQP (code, text) that closed its channel.
pub async fn channel_close_reason(
    consumer: &mut Consumer,
    limit: Duration,
) -> anyhow::Result<(u16, String)> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, consumer.next()).await {
            Err(_) => bail!("channel was not closed within {limit:?}"),
            Ok(None) => bail!("consumer ended without a protocol error"),
            Ok(Some(Ok(_))) => continue,
            Ok(Some(Err(e))) => {
                return amqp_error(&e).ok_or_else(|| anyhow!("not an AMQP error: {e:?}"))
            }
        }
    }
}

/// The (reply code, reply text) of an AMQP error, if `e` is one.
pub fn amqp_error(e: &lapin::Error) -> Option<(u16, String)> {
    match e.kind() {
        ErrorKind::ProtocolError(err) => Some((err.get_id(), err.get_message().to_string())),
        _ => None,
    }
}

/// Unwraps the AMQP error of a result that must have failed.
#[track_caller]
pub fn expect_amqp_error<T: std::fmt::Debug>(r: Result<T, lapin::Error>) -> (u16, String) {
    match r {
        Ok(v) => panic!("expected an AMQP error, got Ok({v:?})"),
        Err(e) => amqp_error(&e).unwrap_or_else(|| panic!("expected an AMQP error, got {e:?}")),
    }
}

/// queue.declare options of a durable queue (quorum queues must be durable).
pub fn durable() -> QueueDeclareOptions {
    QueueDeclareOptions {
        durable: true,
        ..Default::default()
    }
}

/// `{"x-queue-type": "quorum"}` plus `extra`.
pub fn quorum_args(extra: &[(&str, AMQPValue)]) -> FieldTable {
    let mut pairs = vec![("x-queue-type", s("quorum"))];
    pairs.extend_from_slice(extra);
    table(&pairs)
}

/// A field table from pairs, later pairs overriding earlier ones.
pub fn table(pairs: &[(&str, AMQPValue)]) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in pairs {
        t.insert((*k).into(), v.clone());
    }
    t
}

/// Longstr field value.
pub fn s(v: &str) -> AMQPValue {
    AMQPValue::LongString(v.into())
}

/// Closes `conn` with 200 OK and waits (≤ 10 s) until lapin reports it closed.
///
/// lapin 4.12 quirk: if a `Channel` handle was dropped without `close()` just
/// before, `Connection::close` fails with `InvalidChannelState(Closing)` and the
/// connection is never closed; keep channel handles alive until here.
pub async fn close_connection(conn: &Connection) -> anyhow::Result<()> {
    conn.close(200, "OK".into())
        .await
        .context("connection.close")?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !conn.status().closed() {
        if Instant::now() > deadline {
            bail!("connection not closed 10 s after connection.close");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Test ports are bindable, never handed out twice by a process, below
    /// the kernel's ephemeral range (where an outgoing connection could take
    /// a stopped node's port), and never RabbitMQ's.
    #[test]
    fn free_ports_are_unique_and_below_the_ephemeral_range() -> std::io::Result<()> {
        let below = ephemeral_start().unwrap_or(32_768);
        let mut seen = BTreeSet::new();
        for _ in 0..200 {
            let port = free_port()?;
            assert!(seen.insert(port), "port {port} handed out twice");
            // (A range starting below 11,000 leaves no room: ports then come from it.)
            assert!(
                below <= 11_000 || u32::from(port) < below,
                "port {port} in the ephemeral range"
            );
            assert!(![15672, 15692, 25672].contains(&port));
            TcpListener::bind(("127.0.0.1", port))?;
        }
        Ok(())
    }
}
