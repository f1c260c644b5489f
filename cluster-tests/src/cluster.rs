//! A multi-node quorumq cluster under test: `n` `quorumq` processes on
//! loopback, one static `--peers` list, one temporary directory for all data
//! (each node uses `DIR/node-I/`) and one stderr log file per node.
//!
//! * [`Cluster::start`] spawns nodes 1..=n and waits for each node's own
//!   `quorumq ready` line (only the part of its log written by this launch);
//!   a node that lost a port race to a parallel test makes the whole cluster
//!   start again on fresh ports (as [`crate::Broker::spawn`] does).
//! * Faults, per node id (1-based): [`Cluster::kill9`], [`Cluster::stop`]
//!   (SIGTERM, ≤ 30 s), [`Cluster::restart`] (same ports, flags and data),
//!   [`Cluster::sigstop`] / [`Cluster::sigcont`].
//! * Observation through `quorumqctl --node http://127.0.0.1:C list_queues
//!   --formatter json`: [`Cluster::queue_view`] ([`QueueView`]),
//!   [`Cluster::wait_queue_leader`]; [`Cluster::set_policy`] through a node;
//!   [`Cluster::quorum_queue_led_by`] declares a queue its node leads.
//! * Waiting: [`wait_for`], [`wait_until_some`], [`retry`].
//! * Every method takes `&self` (process handles sit behind a mutex), so one
//!   `Arc<Cluster>` can be shared by a test's publisher, consumer and fault tasks.
//! * Dropping the cluster SIGCONTs stopped nodes, kills every node and, when
//!   the thread is panicking (a failed assertion), prints each node's log tail.
//!
//! Every wait is bounded: start ([`crate::START_TIMEOUT`] per launch), stop
//! ([`STOP_TIMEOUT`]), quorumqctl calls (15 s), polls (caller's timeout).

use crate::dlx::{self, POLL};
use crate::{
    free_port, log_contains, open_log, quorumq_bin, signal, tail_of, wait_ready_line, BIN_ENV,
};
use anyhow::{anyhow, bail, Context};
use serde::Deserialize;
use std::{
    collections::HashSet,
    future::Future,
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::{Mutex, MutexGuard},
    time::{Duration, Instant},
};

/// Bound on one `quorumqctl` invocation (a SIGSTOPped or electing node may not answer).
const CTL_TIMEOUT: Duration = Duration::from_secs(15);
/// Bound on a graceful stop ([`Cluster::stop`]) before SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// One queue as `quorumqctl list_queues --formatter json` prints it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct QueueView {
    /// Queue name.
    pub name: String,
    /// Virtual host ("/").
    #[serde(default)]
    pub vhost: String,
    /// Queue type ("quorum").
    #[serde(rename = "type", default)]
    pub kind: String,
    /// Node id of the queue's Raft leader, if known to the answering node.
    pub leader: Option<u64>,
    /// Node ids holding a replica (the group's voters).
    pub members: Vec<u64>,
    /// Members that are running as the answering node's failure detector sees them.
    pub online: Vec<u64>,
    /// Ready messages (count).
    pub messages_ready: u64,
    /// Delivered, not yet acknowledged (count).
    pub messages_unacknowledged: u64,
    /// Attached consumers (count).
    pub consumers: u64,
    /// At-least-once dead letters held in the queue (count).
    pub dead_letter_held: u64,
    /// Name of the effective policy, "" when none (absent in the JSON reads as "").
    #[serde(default)]
    pub policy: String,
    /// Delayed-retry messages waiting to be ready again (absent reads as 0).
    #[serde(default)]
    pub messages_delayed: u64,
}

/// A running (or partly killed) cluster of quorumq processes.
pub struct Cluster {
    bin: PathBuf,
    /// Holds `data/` (shared by all nodes) and `node-I.log`; removed on drop.
    root: tempfile::TempDir,
    nodes: Vec<Node>,
}

struct Node {
    id: u64,
    place: Placement,
    proc: Mutex<Proc>,
}

/// Where one node runs: its address (both listeners bind it), its ports and,
/// for the fault suite, the network namespace its process is started in
/// (`ip netns exec NS quorumq ...`, which execs: the pid is quorumq's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// IP address the node binds and peers dial (`127.0.0.1` by default).
    pub host: String,
    /// AMQP port.
    pub amqp_port: u16,
    /// Cluster gRPC port.
    pub cluster_port: u16,
    /// Network namespace to start the process in, if any.
    pub netns: Option<String>,
    /// Cluster address peers dial (`--advertise`, and this node's entry in
    /// every `--peers`), when not `host:cluster_port` (the fault suite's proxies).
    pub advertise: Option<String>,
    /// Start with `--join` to this node (its cluster address) instead of
    /// `--peers`; the `--peers` of the other nodes leave this one out.
    pub join: Option<u64>,
}

impl Placement {
    /// Node on 127.0.0.1 with the given ports, no namespace, no proxy, static peers.
    pub fn loopback(amqp_port: u16, cluster_port: u16) -> Placement {
        Placement {
            host: "127.0.0.1".into(),
            amqp_port,
            cluster_port,
            netns: None,
            advertise: None,
            join: None,
        }
    }
}

#[derive(Default)]
struct Proc {
    child: Option<Child>,
    /// Length of the log file when the current process was launched.
    launched_at: u64,
    /// SIGSTOP sent and no SIGCONT since.
    stopped: bool,
    /// Flags added to the node's command line ([`Cluster::restart_with`]).
    extra_args: Vec<String>,
    /// How the last process that exited on its own ended (not set by [`Cluster::kill9`]).
    exited: Option<std::process::ExitStatus>,
}

impl Cluster {
    /// Spawns nodes 1..=n on fresh loopback ports and waits until each has
    /// logged `quorumq ready` (its listeners are bound; the meta group may
    /// still be electing). Retries on fresh ports (up to 3 attempts) when a
    /// node lost a port race.
    ///
    /// Errors: the binary is missing, a node exited or was not ready within
    /// [`START_TIMEOUT`] (the error carries its log tail).
    pub async fn start(n: usize) -> anyhow::Result<Cluster> {
        if n == 0 {
            bail!("a cluster needs at least one node");
        }
        let bin = quorumq_bin();
        if !bin.exists() {
            bail!(
                "quorumq binary not found at {} (build it with `cargo build --bin quorumq --bin quorumqctl`, \
                 or set {BIN_ENV})",
                bin.display()
            );
        }
        let mut attempt = 0;
        loop {
            attempt += 1;
            let root = tempfile::Builder::new()
                .prefix("quorumq-cluster-")
                .tempdir()?;
            std::fs::create_dir_all(root.path().join("data"))?;
            let ports = distinct_free_ports(2 * n)?;
            let places = (0..n)
                .map(|i| Placement::loopback(ports[2 * i], ports[2 * i + 1]))
                .collect();
            let cluster = Cluster::new(bin.clone(), root, places);
            match cluster.launch_all().await {
                Ok(()) => return Ok(cluster),
                Err(e) if attempt < 3 && cluster.any_log_contains("binding") => {
                    eprintln!("a quorumq node lost a port race, restarting the cluster on fresh ports: {e:#}");
                    // Dropping `cluster` kills the nodes that did start.
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Spawns one node per placement (node i+1 at `places[i]`), keeping all
    /// data under `root/data/node-I/` (the caller may mount a file system
    /// there first) and logs in `root/node-I.log`, and waits until each has
    /// logged `quorumq ready`. No port-race retry: the caller chose the ports.
    ///
    /// Errors: as [`Cluster::start`].
    pub async fn start_placed(
        root: tempfile::TempDir,
        places: Vec<Placement>,
    ) -> anyhow::Result<Cluster> {
        Cluster::start_placed_with_args(root, places, &[]).await
    }

    /// As [`Cluster::start_placed`], with `args` added to every node's command line (at this
    /// start and every restart).
    pub async fn start_placed_with_args(
        root: tempfile::TempDir,
        places: Vec<Placement>,
        args: &[&str],
    ) -> anyhow::Result<Cluster> {
        let bin = quorumq_bin();
        if !bin.exists() {
            bail!("quorumq binary not found at {}", bin.display());
        }
        std::fs::create_dir_all(root.path().join("data"))?;
        let cluster = Cluster::new(bin, root, places);
        for id in cluster.ids() {
            cluster.proc(id).extra_args = args.iter().map(|a| a.to_string()).collect();
        }
        cluster.launch_all().await?;
        Ok(cluster)
    }

    fn new(bin: PathBuf, root: tempfile::TempDir, places: Vec<Placement>) -> Cluster {
        let nodes = places
            .into_iter()
            .enumerate()
            .map(|(i, place)| Node {
                id: i as u64 + 1,
                place,
                proc: Mutex::new(Proc::default()),
            })
            .collect();
        Cluster { bin, root, nodes }
    }

    /// The directory holding `data/` and the node logs.
    pub fn root(&self) -> &std::path::Path {
        self.root.path()
    }

    /// Copies every node's whole log to `dir/node-I.log`.
    ///
    /// Errors: a copy failed.
    pub fn copy_logs(&self, dir: &std::path::Path) -> anyhow::Result<()> {
        for id in self.ids() {
            std::fs::copy(self.log_path(id), dir.join(format!("node-{id}.log")))
                .with_context(|| format!("copying node {id}'s log"))?;
        }
        Ok(())
    }

    async fn launch_all(&self) -> anyhow::Result<()> {
        for id in self.ids() {
            self.spawn_node(id)?;
        }
        for id in self.ids() {
            self.wait_ready(id).await?;
        }
        Ok(())
    }

    /// Node ids, 1..=n.
    pub fn ids(&self) -> impl Iterator<Item = u64> + '_ {
        self.nodes.iter().map(|n| n.id)
    }

    #[track_caller]
    fn node(&self, id: u64) -> &Node {
        id.checked_sub(1)
            .and_then(|i| self.nodes.get(i as usize))
            .unwrap_or_else(|| panic!("no node {id} in a cluster of {}", self.nodes.len()))
    }

    fn proc(&self, id: u64) -> MutexGuard<'_, Proc> {
        // A poisoned lock only means another test thread panicked while holding it;
        // the process handle inside is still valid.
        self.node(id).proc.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// AMQP URI of node `id` (`amqp://guest:guest@127.0.0.1:P/%2f`).
    pub fn uri(&self, id: u64) -> String {
        format!("amqp://guest:guest@{}/%2f", self.amqp_addr(id))
    }

    /// AMQP address of node `id` (`127.0.0.1:P`).
    fn amqp_addr(&self, id: u64) -> String {
        let p = &self.node(id).place;
        format!("{}:{}", p.host, p.amqp_port)
    }

    /// Cluster (gRPC) address of node `id` (`127.0.0.1:C`), as in `--peers`;
    /// quorumqctl's `--node` is `http://` and this.
    pub fn cluster_addr(&self, id: u64) -> String {
        let p = &self.node(id).place;
        format!("{}:{}", p.host, p.cluster_port)
    }

    /// The file receiving node `id`'s stdout and stderr (appended across restarts).
    fn log_path(&self, id: u64) -> PathBuf {
        self.root
            .path()
            .join(format!("node-{}.log", self.node(id).id))
    }

    /// Last `max_bytes` of node `id`'s log.
    pub fn log_tail(&self, id: u64, max_bytes: u64) -> String {
        tail_of(&self.log_path(id), max_bytes)
    }

    /// Prints the last `max_bytes` of every node's log to stderr, and copies
    /// the whole logs to `$QUORUMQ_CLUSTER_LOGS/<pid>-<port>-node-I.log` when
    /// that variable names a directory (the cluster's own is deleted).
    pub fn print_logs(&self, max_bytes: u64) {
        if let Some(dir) = std::env::var_os("QUORUMQ_CLUSTER_LOGS") {
            for id in self.ids() {
                let name = format!(
                    "{}-{}-node-{id}.log",
                    std::process::id(),
                    self.node(1).place.amqp_port
                );
                let to = std::path::Path::new(&dir).join(name);
                match std::fs::copy(self.log_path(id), &to) {
                    Ok(_) => eprintln!("node {id} log kept at {}", to.display()),
                    Err(e) => eprintln!("node {id} log not kept at {}: {e}", to.display()),
                }
            }
        }
        for id in self.ids() {
            eprintln!(
                "---- node {id} log tail ({}) ----\n{}\n---- end node {id} ----",
                self.log_path(id).display(),
                self.log_tail(id, max_bytes)
            );
        }
    }

    fn any_log_contains(&self, needle: &str) -> bool {
        self.ids()
            .any(|id| log_contains(&self.log_path(id), needle))
    }

    /// `--peers` value: every node started without `--join` as
    /// `ID=127.0.0.1:C` (or its advertised address), comma separated.
    fn peers_arg(&self) -> String {
        self.ids()
            .filter(|&id| self.node(id).place.join.is_none())
            .map(|id| {
                let addr = self
                    .node(id)
                    .place
                    .advertise
                    .clone()
                    .unwrap_or_else(|| self.cluster_addr(id));
                format!("{id}={addr}")
            })
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Starts node `id`'s process (it must not be running); does not wait for readiness.
    /// Every node gets the same data dir (it keeps its files in `node-I/`).
    fn spawn_node(&self, id: u64) -> anyhow::Result<()> {
        let (log, launched_at) = open_log(&self.log_path(id))?;
        let extra_args = self.proc(id).extra_args.clone();
        let mut cmd = match &self.node(id).place.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(&self.bin);
                c
            }
            None => Command::new(&self.bin),
        };
        let child = cmd
            .arg("--node-id")
            .arg(id.to_string())
            .arg("--amqp-listen")
            .arg(self.amqp_addr(id))
            .arg("--cluster-listen")
            .arg(self.cluster_addr(id))
            .arg("--data-dir")
            .arg(self.root.path().join("data"))
            .args(match self.node(id).place.join {
                Some(via) => ["--join".to_string(), self.cluster_addr(via)],
                None => ["--peers".to_string(), self.peers_arg()],
            })
            .args(
                self.node(id)
                    .place
                    .advertise
                    .iter()
                    .flat_map(|a| ["--advertise", a.as_str()]),
            )
            // Test clients log in as guest, which by default may only connect via loopback;
            // a node in a network namespace is reached on its own address.
            .args(
                self.node(id)
                    .place
                    .netns
                    .iter()
                    .flat_map(|_| ["--loopback-users", ""]),
            )
            .args(&extra_args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("spawning node {id}: {}", self.bin.display()))?;
        let mut p = self.proc(id);
        p.child = Some(child);
        p.launched_at = launched_at;
        p.stopped = false;
        p.exited = None;
        Ok(())
    }

    /// Waits until node `id`'s current launch logged its ready line; kills it if
    /// that does not happen.
    async fn wait_ready(&self, id: u64) -> anyhow::Result<()> {
        let launched_at = self.proc(id).launched_at;
        let what = format!(
            "node {id} (amqp {}, cluster {})",
            self.amqp_addr(id),
            self.cluster_addr(id)
        );
        let ready = wait_ready_line(&self.log_path(id), launched_at, &what, || {
            let mut p = self.proc(id);
            match p.child.as_mut().map(|c| c.try_wait()) {
                Some(Ok(Some(status))) => {
                    p.child = None;
                    p.exited = Some(status);
                    Some(status.to_string())
                }
                None => Some("no process".to_string()),
                _ => None,
            }
        })
        .await;
        if ready.is_err() {
            self.kill9(id);
        }
        ready
    }

    /// The OS pid of node `id`'s process, if it has one (running or SIGSTOPped).
    pub fn pid(&self, id: u64) -> Option<u32> {
        let mut p = self.proc(id);
        reap(&mut p);
        p.child.as_ref().map(|c| c.id())
    }

    /// How node `id`'s process ended when it exited on its own (a crash, a fail-stop), once
    /// it has: `None` while it runs, and after [`Cluster::kill9`] or a restart.
    pub fn exit_status(&self, id: u64) -> Option<std::process::ExitStatus> {
        let mut p = self.proc(id);
        reap(&mut p);
        if p.child.is_some() {
            return None;
        }
        p.exited
    }

    /// True when node `id`'s process is alive and not SIGSTOPped.
    pub fn is_running(&self, id: u64) -> bool {
        let mut p = self.proc(id);
        reap(&mut p);
        p.child.is_some() && !p.stopped
    }

    /// Ids of the nodes that are running ([`Cluster::is_running`]).
    pub fn running(&self) -> Vec<u64> {
        self.ids().filter(|&id| self.is_running(id)).collect()
    }

    /// SIGKILL node `id` and reap it. No-op when it is not running.
    pub fn kill9(&self, id: u64) {
        let mut p = self.proc(id);
        if let Some(mut child) = p.child.take() {
            // SIGKILL also ends a SIGSTOPped process.
            let _ = child.kill();
            let _ = child.wait();
            p.exited = None;
        }
        p.stopped = false;
    }

    /// SIGTERM node `id` and wait up to [`STOP_TIMEOUT`] for it to exit
    /// (SIGCONT first if it was SIGSTOPped).
    ///
    /// Errors: it did not exit in time (it is SIGKILLed then) or exited non-zero.
    pub async fn stop(&self, id: u64) -> anyhow::Result<()> {
        let Some(pid) = self.pid(id) else {
            return Ok(());
        };
        if self.proc(id).stopped {
            signal(pid, "CONT")?;
        }
        signal(pid, "TERM")?;
        let deadline = Instant::now() + STOP_TIMEOUT;
        loop {
            {
                let mut p = self.proc(id);
                p.stopped = false;
                match p.child.as_mut().map(|c| c.try_wait()) {
                    None => return Ok(()),
                    Some(Ok(Some(status))) => {
                        p.child = None;
                        p.exited = Some(status);
                        if !status.success() {
                            bail!("node {id} exited with {status} after SIGTERM");
                        }
                        return Ok(());
                    }
                    Some(Err(e)) => bail!("waiting for node {id}: {e}"),
                    Some(Ok(None)) => {}
                }
            }
            if Instant::now() > deadline {
                self.kill9(id);
                bail!("node {id} did not exit within {STOP_TIMEOUT:?} of SIGTERM; killed");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Starts node `id` again with the same ports, flags and data dir and waits
    /// for its `quorumq ready` line. A still running process is SIGKILLed first.
    pub async fn restart(&self, id: u64) -> anyhow::Result<()> {
        self.kill9(id);
        self.spawn_node(id)?;
        self.wait_ready(id).await
    }

    /// Starts node `id` again as [`Cluster::restart`] does, with `args` added
    /// to its command line from now on (e.g. `--http-listen 127.0.0.1:P`).
    pub async fn restart_with(&self, id: u64, args: &[&str]) -> anyhow::Result<()> {
        self.proc(id).extra_args = args.iter().map(|a| a.to_string()).collect();
        self.restart(id).await
    }

    /// SIGSTOP node `id` (it stays alive but answers nothing until [`Cluster::sigcont`]).
    pub fn sigstop(&self, id: u64) -> anyhow::Result<()> {
        let pid = self
            .pid(id)
            .ok_or_else(|| anyhow!("node {id} is not running"))?;
        signal(pid, "STOP")?;
        self.proc(id).stopped = true;
        Ok(())
    }

    /// SIGCONT node `id`.
    pub fn sigcont(&self, id: u64) -> anyhow::Result<()> {
        let pid = self
            .pid(id)
            .ok_or_else(|| anyhow!("node {id} is not running"))?;
        signal(pid, "CONT")?;
        self.proc(id).stopped = false;
        Ok(())
    }

    /// Runs `quorumqctl --node <node via> ARGS...` (≤ 15 s) and returns its stdout.
    ///
    /// Errors: non-zero exit (with its output), timeout, binary missing.
    pub async fn ctl(&self, via: u64, args: &[&str]) -> anyhow::Result<String> {
        let admin = format!("http://{}", self.cluster_addr(via));
        dlx::run(dlx::quorumqctl(&admin, args), CTL_TIMEOUT).await
    }

    /// A connection to node `id` once the cluster takes a declare: retries
    /// the connection and the declare of quorum queue `warmup` (kept) for up
    /// to 30 s (a cluster just started may still be electing its meta leader).
    ///
    /// Errors: neither succeeded within 30 s.
    pub async fn ready_connection(
        &self,
        id: u64,
        warmup: &str,
    ) -> anyhow::Result<lapin::Connection> {
        let uri = self.uri(id);
        let conn = retry(Duration::from_secs(30), "connect", || crate::connect(&uri)).await?;
        let ch = conn.create_channel().await?;
        retry(Duration::from_secs(30), "a first declare", || async {
            ch.queue_declare(warmup.into(), crate::durable(), crate::quorum_args(&[]))
                .await?;
            anyhow::Ok(())
        })
        .await?;
        Ok(conn)
    }

    /// Returns `r`, having printed the last `max_bytes` of every node's log
    /// when it is an error (a panic prints them on drop already).
    pub fn logs_on_error<T>(&self, r: anyhow::Result<T>, max_bytes: u64) -> anyhow::Result<T> {
        if r.is_err() {
            self.print_logs(max_bytes);
        }
        r
    }

    /// Queue `name` in vhost "/" as node `via` lists it (`quorumqctl
    /// list_queues --formatter json`). The counts are the queue leader's,
    /// asked over the network when it is elsewhere; the answering node's own
    /// replica only when it leads or no other member is running.
    ///
    /// Errors: quorumqctl failed, its JSON did not parse, or node `via` does
    /// not list the queue.
    pub async fn queue_view(&self, via: u64, name: &str) -> anyhow::Result<QueueView> {
        let out = self
            .ctl(via, &["list_queues", "--formatter", "json"])
            .await?;
        let queues: Vec<QueueView> = serde_json::from_str(&out)
            .with_context(|| format!("parsing list_queues JSON from node {via}: {out}"))?;
        queues
            .into_iter()
            .find(|q| q.name == name && (q.vhost.is_empty() || q.vhost == "/"))
            .ok_or_else(|| anyhow!("node {via} does not list queue {name}"))
    }

    /// `quorumqctl set_policy NAME PATTERN DEFINITION --apply-to queues` through node `via`.
    pub async fn set_policy(
        &self,
        via: u64,
        name: &str,
        pattern: &str,
        definition: &str,
    ) -> anyhow::Result<()> {
        self.ctl(
            via,
            &[
                "set_policy",
                name,
                pattern,
                definition,
                "--apply-to",
                "queues",
            ],
        )
        .await
        .map(|_| ())
    }

    /// Connects to node `id`, declares durable quorum queue `q` through it
    /// ([`declare_durable`]) and waits (≤ 30 s) until node `id` leads it. Returns the
    /// connection and a confirm channel on it.
    ///
    /// Errors: the connection, channel or declare fails; no running leader within
    /// 30 s. Panics (a test failure) when another node leads `q`.
    pub async fn quorum_queue_led_by(
        &self,
        id: u64,
        q: &str,
    ) -> anyhow::Result<(lapin::Connection, lapin::Channel)> {
        let conn = crate::connect(&self.uri(id)).await?;
        let ch = crate::confirm_channel(&conn).await?;
        declare_durable(&ch, q, crate::quorum_args(&[])).await?;
        assert_eq!(
            self.wait_queue_leader(id, q, Duration::from_secs(30))
                .await?,
            id,
            "declared on node {id}, led by it"
        );
        Ok((conn, ch))
    }

    /// Polls node `via` until it reports a leader for queue `name` whose
    /// node is running ([`Cluster::is_running`]); returns that node id.
    ///
    /// Errors: none within `timeout` (with the last view or error seen).
    pub async fn wait_queue_leader(
        &self,
        via: u64,
        name: &str,
        timeout: Duration,
    ) -> anyhow::Result<u64> {
        wait_until_some(timeout, &format!("a running leader of {name} via node {via}"), || async {
            let view = self.queue_view(via, name).await?;
            match view.leader {
                Some(l) if self.is_running(l) => Ok(Some(l)),
                other => Err(anyhow!(
                    "node {via} reports leader {other:?} for {name} (members {:?}, online {:?}; running nodes {:?})",
                    view.members,
                    view.online,
                    self.running()
                )),
            }
        })
        .await
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.print_logs(8000);
        }
        for id in self.ids().collect::<Vec<_>>() {
            let pid = self.pid(id);
            if let (Some(pid), true) = (pid, self.proc(id).stopped) {
                let _ = signal(pid, "CONT");
            }
            self.kill9(id);
        }
    }
}

/// Reaps an exited child so later checks see it gone (keeping its exit status).
fn reap(p: &mut Proc) {
    if let Some(Ok(Some(_)) | Err(_)) = p.child.as_mut().map(|c| c.try_wait()) {
        p.exited = p.child.as_mut().and_then(|c| c.try_wait().ok().flatten());
        p.child = None;
        p.stopped = false;
    }
}

/// `n` distinct ports that were free a moment ago on 127.0.0.1.
pub fn distinct_free_ports(n: usize) -> anyhow::Result<Vec<u16>> {
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(n);
    for _ in 0..n * 20 {
        let p = free_port()?;
        if seen.insert(p) {
            out.push(p);
            if out.len() == n {
                return Ok(out);
            }
        }
    }
    bail!("could not find {n} distinct free ports")
}

/// Polls `pred` every [`POLL`] until it returns true.
///
/// Errors: still false after `timeout` (the message names `what`).
pub async fn wait_for<F, Fut>(timeout: Duration, what: &str, mut pred: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    wait_until_some(timeout, what, || {
        let holds = pred();
        async move { Ok(holds.await.then_some(())) }
    })
    .await
}

/// Polls `f` every [`POLL`] until it returns `Ok(Some(v))`; errors in between
/// are retried (a node may still be electing).
///
/// Errors: no value within `timeout` (with the last error, if any).
pub async fn wait_until_some<T, F, Fut>(
    timeout: Duration,
    what: &str,
    mut f: F,
) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Option<T>>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut last_err: Option<anyhow::Error>;
    loop {
        match f().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => last_err = None,
            Err(e) => last_err = Some(e),
        }
        if tokio::time::Instant::now() > deadline {
            return Err(match last_err {
                Some(e) => e.context(format!("timed out after {timeout:?} waiting for {what}")),
                None => anyhow!("timed out after {timeout:?} waiting for {what}"),
            });
        }
        tokio::time::sleep(POLL).await;
    }
}

/// A durable `queue.declare` of `q` with `args` on `ch`, retried for up to
/// 30 s (the meta group of a cluster that just started may still elect).
///
/// Errors: the declare still failing after 30 s.
pub async fn declare_durable(
    ch: &lapin::Channel,
    q: &str,
    args: lapin::types::FieldTable,
) -> anyhow::Result<()> {
    retry(Duration::from_secs(30), &format!("declare {q}"), || async {
        ch.queue_declare(q.into(), crate::durable(), args.clone())
            .await?;
        anyhow::Ok(())
    })
    .await
}

/// Runs `f` until it succeeds, retrying every 250 ms for up to `timeout`
/// (e.g. a queue.declare while the meta group elects its first leader).
///
/// Errors: the last error, once `timeout` has passed.
pub async fn retry<T, F, Fut>(timeout: Duration, what: &str, mut f: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        match f().await {
            Ok(v) => return Ok(v),
            Err(e) if tokio::time::Instant::now() > deadline => {
                return Err(e.context(format!(
                    "{what}: still failing after {attempts} attempts in {timeout:?}"
                )))
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_quorumqctl_json() {
        let queues: Vec<QueueView> = serde_json::from_str(
            r#"[
{"name":"q1","vhost":"/","type":"quorum","leader":2,"members":[1,2,3],"online":[2,3],
 "messages_ready":7,"messages_unacknowledged":1,"consumers":1,"dead_letter_held":0,"policy":"p"},
{"name":"q2","vhost":"/","type":"quorum","leader":null,"members":[],"online":[],
 "messages_ready":0,"messages_unacknowledged":0,"consumers":0,"dead_letter_held":3}
]"#,
        )
        .expect("list_queues JSON");
        assert_eq!(queues[0].leader, Some(2));
        assert_eq!(queues[0].members, vec![1, 2, 3]);
        assert_eq!(queues[0].kind, "quorum");
        assert_eq!(queues[0].policy, "p");
        assert_eq!((queues[1].leader, queues[1].dead_letter_held), (None, 3));
        assert_eq!(queues[1].policy, "");
    }
}
