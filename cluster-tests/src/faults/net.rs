//! The fault suite's network: one Linux network namespace per node, each with
//! a veth pair whose host end sits on a bridge in the root namespace, so the
//! nodes talk over real interfaces and a partition is real packet drops.
//!
//! Layout for run `R` (the harness's pid, then `xK` for its K-th network, so
//! that tests of one binary run at once) and node `i`: namespace `qfRni`,
//! host-side veth `qfRvi`, bridge `qfRbr` holding `10.(213+K).S.1/24` (S from
//! the pid), node address `10.(213+K).S.(10+i)` on the namespace's `eth0`. The test
//! clients run in the root namespace and reach every node through the bridge;
//! partitions only drop node-to-node traffic (as Jepsen's do), so clients
//! keep talking to the nodes on both sides.
//!
//! Faults: [`Net::block`] (iptables DROP in both namespaces of a pair),
//! [`Net::lossy`] (iptables `statistic` random drop on a node's `eth0`),
//! [`Net::delay`] (tc netem delay + reorder when the kernel has `sch_netem`,
//! else a tbf rate limit plus loss, reported by [`Net::has_netem`]);
//! [`Net::heal`] clears them all. Dropping a [`Net`] deletes everything it
//! made; [`Net::setup`] first removes what runs of dead processes left.
//! Needs root, `ip` (iproute2), `iptables` and `tc`.

use crate::cluster::Cluster;
use anyhow::{bail, Context};
use std::process::{Command, Stdio};

/// Every namespace, veth and bridge this module makes starts with this.
const PREFIX: &str = "qf";

/// The namespaces, veths and bridge of one run.
pub struct Net {
    tag: String,
    subnet: String,
    nodes: usize,
    netem: bool,
}

impl Net {
    /// Makes the bridge and `nodes` namespaces.
    ///
    /// Errors: not root, a tool is missing, or the kernel refused a step (the
    /// message names the command); whatever was made is removed again.
    pub fn setup(nodes: usize) -> anyhow::Result<Net> {
        for tool in ["ip", "iptables", "tc"] {
            if Command::new(tool)
                .arg("-V")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_err()
            {
                bail!("`{tool}` is not installed");
            }
        }
        remove_stale();
        let pid = std::process::id();
        // Several tests of one process (one test binary) run at once: each
        // gets its own names and subnet.
        static SETUPS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = SETUPS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 32;
        let net = Net {
            tag: format!("{PREFIX}{pid}x{n}"),
            subnet: format!("10.{}.{}", 213 + n, pid % 250),
            nodes,
            netem: false,
        };
        let bridge = net.bridge();
        sh(&["ip", "link", "add", &bridge, "type", "bridge"])?;
        // From here on, Drop cleans up after a failed step.
        let mut net = net;
        sh(&[
            "ip",
            "addr",
            "add",
            &format!("{}.1/24", net.subnet),
            "dev",
            &bridge,
        ])?;
        sh(&["ip", "link", "set", &bridge, "up"])?;
        for i in 1..=nodes as u64 {
            let (ns, veth) = (net.ns(i), net.veth(i));
            sh(&["ip", "netns", "add", &ns])?;
            sh(&[
                "ip", "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &ns,
            ])?;
            sh(&["ip", "link", "set", &veth, "master", &bridge, "up"])?;
            net.in_ns(
                i,
                &[
                    "ip",
                    "addr",
                    "add",
                    &format!("{}/24", net.addr(i)),
                    "dev",
                    "eth0",
                ],
            )?;
            net.in_ns(i, &["ip", "link", "set", "eth0", "up"])?;
            net.in_ns(i, &["ip", "link", "set", "lo", "up"])?;
        }
        net.netem = net
            .in_ns(
                1,
                &[
                    "tc", "qdisc", "add", "dev", "eth0", "root", "netem", "delay", "1ms",
                ],
            )
            .is_ok();
        if net.netem {
            net.in_ns(1, &["tc", "qdisc", "del", "dev", "eth0", "root"])?;
        }
        Ok(net)
    }

    /// Node `id`'s namespace name.
    pub fn ns(&self, id: u64) -> String {
        format!("{}n{id}", self.tag)
    }

    /// Node `id`'s address (`10.(213+K).S.(10+id)`).
    pub fn addr(&self, id: u64) -> String {
        format!("{}.{}", self.subnet, 10 + id)
    }

    /// Where each node runs: node `i` in its namespace at [`Net::addr`],
    /// AMQP on 5672 and the cluster on 5680, static peers.
    pub fn placements(&self) -> Vec<crate::cluster::Placement> {
        (1..=self.nodes as u64)
            .map(|i| crate::cluster::Placement {
                host: self.addr(i),
                netns: Some(self.ns(i)),
                ..crate::cluster::Placement::loopback(5672, 5680)
            })
            .collect()
    }

    /// A new [`Net`] of `nodes` namespaces and a [`Cluster`] of `nodes` nodes placed in
    /// them ([`Net::placements`]), its data and logs in a new temporary directory whose
    /// name starts with `prefix`. Bind it as `let (net, cluster) = ...`: the cluster goes
    /// (its nodes killed) before the namespaces do.
    ///
    /// Errors: as [`Net::setup`] (with a note that the test needs root), the temporary
    /// directory cannot be made, or as [`Cluster::start_placed`].
    pub async fn start_cluster(nodes: usize, prefix: &str) -> anyhow::Result<(Net, Cluster)> {
        let net = Net::setup(nodes)
            .map_err(|e| e.context("this test makes network namespaces and needs root"))?;
        let root = tempfile::Builder::new().prefix(prefix).tempdir()?;
        let cluster = Cluster::start_placed(root, net.placements()).await?;
        Ok((net, cluster))
    }

    /// The subnet, e.g. `10.213.7.0/24`.
    pub fn subnet(&self) -> String {
        format!("{}.0/24", self.subnet)
    }

    /// True when the kernel has `sch_netem` ([`Net::delay`] then delays and reorders).
    pub fn has_netem(&self) -> bool {
        self.netem
    }

    fn bridge(&self) -> String {
        format!("{}br", self.tag)
    }

    fn veth(&self, id: u64) -> String {
        format!("{}v{id}", self.tag)
    }

    /// Runs `cmd` inside node `id`'s namespace.
    fn in_ns(&self, id: u64, cmd: &[&str]) -> anyhow::Result<()> {
        let ns = self.ns(id);
        let mut full = vec!["ip", "netns", "exec", &ns];
        full.extend_from_slice(cmd);
        sh(&full)
    }

    /// Drops all traffic between nodes `a` and `b`, both directions, in both namespaces.
    ///
    /// Errors: iptables failed.
    pub fn block(&self, a: u64, b: u64) -> anyhow::Result<()> {
        for (me, other) in [(a, b), (b, a)] {
            let o = self.addr(other);
            self.in_ns(me, &["iptables", "-A", "INPUT", "-s", &o, "-j", "DROP"])?;
            self.in_ns(me, &["iptables", "-A", "OUTPUT", "-d", &o, "-j", "DROP"])?;
        }
        Ok(())
    }

    /// Drops each packet in and out of node `id`'s `eth0` with probability `p` (0..1).
    ///
    /// Errors: iptables failed.
    pub fn lossy(&self, id: u64, p: f64) -> anyhow::Result<()> {
        let p = format!("{p:.3}");
        self.in_ns(
            id,
            &[
                "iptables",
                "-A",
                "INPUT",
                "-i",
                "eth0",
                "-m",
                "statistic",
                "--mode",
                "random",
                "--probability",
                &p,
                "-j",
                "DROP",
            ],
        )?;
        self.in_ns(
            id,
            &[
                "iptables",
                "-A",
                "OUTPUT",
                "-o",
                "eth0",
                "-m",
                "statistic",
                "--mode",
                "random",
                "--probability",
                &p,
                "-j",
                "DROP",
            ],
        )
    }

    /// Slows node `id`'s outgoing packets: netem `delay MS MS/2 reorder 10%`
    /// when the kernel has it, else a tbf limit of 256 kbit/s plus 10 % loss
    /// (retransmission timeouts are the delay). Returns what was applied.
    ///
    /// Errors: tc or iptables failed.
    pub fn delay(&self, id: u64, ms: u64) -> anyhow::Result<String> {
        if self.netem {
            let (d, j) = (format!("{ms}ms"), format!("{}ms", ms / 2));
            self.in_ns(
                id,
                &[
                    "tc", "qdisc", "add", "dev", "eth0", "root", "netem", "delay", &d, &j,
                    "reorder", "10%",
                ],
            )?;
            Ok(format!("netem delay {d} ±{j} reorder 10%"))
        } else {
            self.in_ns(
                id,
                &[
                    "tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", "256kbit", "burst",
                    "16kbit", "latency", "400ms",
                ],
            )?;
            self.lossy(id, 0.10)?;
            Ok("tbf 256 kbit/s + 10% loss (no sch_netem in this kernel)".into())
        }
    }

    /// Limits the traffic *into* node `id` to `kbit` kbit/s (a tbf on the
    /// host end of its veth): what every peer sends it crawls, what it sends
    /// does not. No loss, no delay beyond the queueing.
    ///
    /// Errors: tc failed.
    pub fn throttle_inbound(&self, id: u64, kbit: u32) -> anyhow::Result<()> {
        let rate = format!("{kbit}kbit");
        sh(&[
            "tc",
            "qdisc",
            "add",
            "dev",
            &self.veth(id),
            "root",
            "tbf",
            "rate",
            &rate,
            "burst",
            "16kbit",
            "latency",
            "400ms",
        ])
    }

    /// Node `id` behind a slow, lossy link both ways: what it sends and what
    /// it is sent are limited to `kbit` kbit/s (tbf in its namespace and on
    /// the host end of its veth) and each packet is dropped with
    /// probability `loss` (0..1) on the way in and out.
    ///
    /// Errors: tc or iptables failed.
    pub fn slow_link(&self, id: u64, kbit: u32, loss: f64) -> anyhow::Result<()> {
        let rate = format!("{kbit}kbit");
        self.in_ns(
            id,
            &[
                "tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", &rate, "burst",
                "16kbit", "latency", "400ms",
            ],
        )?;
        self.throttle_inbound(id, kbit)?;
        self.lossy(id, loss)
    }

    /// Removes every partition, loss and delay rule from every node.
    ///
    /// Errors: iptables failed (a missing qdisc is not an error).
    pub fn heal(&self) -> anyhow::Result<()> {
        for id in 1..=self.nodes as u64 {
            self.in_ns(id, &["iptables", "-F"])?;
            let _ = self.in_ns(id, &["tc", "qdisc", "del", "dev", "eth0", "root"]);
            let _ = sh(&["tc", "qdisc", "del", "dev", &self.veth(id), "root"]);
        }
        Ok(())
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for id in 1..=self.nodes as u64 {
            let _ = sh(&["ip", "netns", "del", &self.ns(id)]);
        }
        let _ = sh(&["ip", "link", "del", &self.bridge()]);
    }
}

/// Runs a command, quietly.
///
/// Errors: it could not start or exited non-zero (with its stderr).
fn sh(cmd: &[&str]) -> anyhow::Result<()> {
    let out = Command::new(cmd[0])
        .args(&cmd[1..])
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {}", cmd.join(" ")))?;
    if !out.status.success() {
        bail!(
            "`{}` failed ({}): {}",
            cmd.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Deletes namespaces and bridges left by runs whose process is gone
/// (names `qf<pid>n<i>`, `qf<pid>br`, `qf<pid>v<i>`).
fn remove_stale() {
    let dead = |name: &str| -> bool {
        let digits: String = name
            .strip_prefix(PREFIX)
            .unwrap_or("")
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        !digits.is_empty() && !std::path::Path::new(&format!("/proc/{digits}")).exists()
    };
    if let Ok(out) = Command::new("ip").args(["netns", "list"]).output() {
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let name = line.split_whitespace().next().unwrap_or("");
            if dead(name) {
                let _ = sh(&["ip", "netns", "del", name]);
            }
        }
    }
    if let Ok(out) = Command::new("ip").args(["-o", "link", "show"]).output() {
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            // "7: qf123br: <...>" or "8: qf123v1@if2: <...>"
            let name = line
                .split(": ")
                .nth(1)
                .unwrap_or("")
                .split('@')
                .next()
                .unwrap_or("");
            if dead(name) {
                let _ = sh(&["ip", "link", "del", name]);
            }
        }
    }
}
