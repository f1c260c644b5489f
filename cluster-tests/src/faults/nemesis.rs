//! Nemeses: the faults the suite injects into a running [`Cluster`], each
//! recorded in the [`History`] when it starts (`fault`) and ends (`healed`).
//!
//! | kind | fault | heal |
//! |---|---|---|
//! | `kill` | kill -9 of a random node | restart it |
//! | `kill-leader` | kill -9 of the workload queue's leader | restart it |
//! | `pause` | SIGSTOP of a random node | SIGCONT |
//! | `partition-one` | one random node cut off from the others | rules flushed |
//! | `partition-halves` | a random minority cut off from the majority | rules flushed |
//! | `bridge` | two halves that only a middle node reaches (Jepsen's bridge) | rules flushed |
//! | `partition-leader` | the queue's leader cut off | rules flushed |
//! | `loss` | 5–30 % random packet loss on one node | rules flushed |
//! | `delay` | netem delay + reorder on one node (tbf + loss without netem) | qdisc removed |
//! | `rolling-restart` | SIGTERM + restart of every node in turn | — |
//! | `disk-full` | the disk node's tmpfs filled to the last byte | filler removed, node restarted if it exited |
//! | `slow-link` | one node at 256 kbit/s both ways with 20 % loss (tbf + iptables) | qdiscs and rules removed |
//!
//! Partitions cut node-to-node traffic only; clients reach every node.

use super::{
    history::{History, Op},
    net::Net,
    proxy::Proxies,
    rng::Rng,
};
use crate::cluster::Cluster;
use anyhow::{bail, Context};
use std::{
    io::Write,
    path::{Path, PathBuf},
    process::Command,
    sync::Arc,
    time::Duration,
};

/// A nemesis kind, as named on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// kill -9 of a random node.
    Kill,
    /// kill -9 of the queue's leader.
    KillLeader,
    /// SIGSTOP of a random node.
    Pause,
    /// One node cut off.
    PartitionOne,
    /// A minority cut off from the majority.
    PartitionHalves,
    /// Two sides joined by one node.
    Bridge,
    /// The queue's leader cut off.
    PartitionLeader,
    /// Random packet loss on one node.
    Loss,
    /// Delay and reordering on one node.
    Delay,
    /// Every node restarted in turn.
    RollingRestart,
    /// A node's disk full.
    DiskFull,
    /// One node behind a slow, lossy link both ways (256 kbit/s, 20 % loss;
    /// issue 32's slow follower).
    SlowLink,
}

impl Kind {
    /// Every kind.
    pub const ALL: [Kind; 12] = [
        Kind::Kill,
        Kind::KillLeader,
        Kind::Pause,
        Kind::PartitionOne,
        Kind::PartitionHalves,
        Kind::Bridge,
        Kind::PartitionLeader,
        Kind::Loss,
        Kind::Delay,
        Kind::RollingRestart,
        Kind::DiskFull,
        Kind::SlowLink,
    ];

    /// Its command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Kill => "kill",
            Kind::KillLeader => "kill-leader",
            Kind::Pause => "pause",
            Kind::PartitionOne => "partition-one",
            Kind::PartitionHalves => "partition-halves",
            Kind::Bridge => "bridge",
            Kind::PartitionLeader => "partition-leader",
            Kind::Loss => "loss",
            Kind::Delay => "delay",
            Kind::RollingRestart => "rolling-restart",
            Kind::DiskFull => "disk-full",
            Kind::SlowLink => "slow-link",
        }
    }

    /// The kind named `s`.
    pub fn parse(s: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == s)
    }

    /// Needs link faults (namespaces or proxies).
    pub fn needs_net(self) -> bool {
        matches!(
            self,
            Kind::PartitionOne
                | Kind::PartitionHalves
                | Kind::Bridge
                | Kind::PartitionLeader
                | Kind::Loss
                | Kind::Delay
                | Kind::SlowLink
        )
    }
}

/// How node-to-node traffic is faulted: iptables/tc in network namespaces,
/// or this process's forwarding proxies where namespaces are unavailable.
pub enum Links {
    /// [`Net`]: real packet drops.
    Namespaces(Net),
    /// [`Proxies`]: held bytes.
    Proxies(Proxies),
}

impl Links {
    fn block(&self, a: u64, b: u64) -> anyhow::Result<()> {
        match self {
            Links::Namespaces(n) => n.block(a, b),
            Links::Proxies(p) => {
                p.block(a, b);
                Ok(())
            }
        }
    }

    fn lossy(&self, id: u64, p: f64) -> anyhow::Result<()> {
        match self {
            Links::Namespaces(n) => n.lossy(id, p),
            Links::Proxies(x) => {
                x.lossy(id, p);
                Ok(())
            }
        }
    }

    fn delay(&self, id: u64, ms: u64) -> anyhow::Result<String> {
        match self {
            Links::Namespaces(n) => n.delay(id, ms),
            Links::Proxies(p) => Ok(p.delay(id, ms)),
        }
    }

    /// Node `id` behind a link of `kbit` kbit/s both ways with `loss` (0..1)
    /// packet loss; with proxies (no rate limit there), a 400 ms delay plus
    /// that loss. Returns what was applied.
    ///
    /// Errors: tc or iptables failed.
    fn slow_link(&self, id: u64, kbit: u32, loss: f64) -> anyhow::Result<String> {
        match self {
            Links::Namespaces(n) => {
                n.slow_link(id, kbit, loss)?;
                Ok(format!(
                    "tbf {kbit} kbit/s both ways + {:.0}% loss",
                    loss * 100.0
                ))
            }
            Links::Proxies(p) => {
                p.lossy(id, loss);
                Ok(format!(
                    "{} + {:.0}% loss (proxies: no rate limit)",
                    p.delay(id, 400),
                    loss * 100.0
                ))
            }
        }
    }

    /// Lifts every partition, loss and delay.
    ///
    /// Errors: iptables failed.
    pub fn heal(&self) -> anyhow::Result<()> {
        match self {
            Links::Namespaces(n) => n.heal(),
            Links::Proxies(p) => {
                p.heal();
                Ok(())
            }
        }
    }
}

/// A node data directory on its own small tmpfs, for `disk-full`.
pub struct Disk {
    /// The node whose data directory this is.
    pub node: u64,
    mount: PathBuf,
}

impl Disk {
    /// Mounts a tmpfs of `bytes` at `dir` (created if needed).
    ///
    /// Errors: mount failed (not root, no tmpfs).
    pub fn mount(node: u64, dir: &Path, bytes: u64) -> anyhow::Result<Disk> {
        std::fs::create_dir_all(dir)?;
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(dir)
            .status()
            .context("running mount")?;
        if !status.success() {
            bail!("mount -t tmpfs on {} failed: {status}", dir.display());
        }
        Ok(Disk {
            node,
            mount: dir.to_path_buf(),
        })
    }

    fn filler(&self) -> PathBuf {
        self.mount.join("qf-filler")
    }

    /// Writes zeros to a filler file until the file system is full; returns the bytes written.
    pub fn fill(&self) -> u64 {
        let Ok(mut f) = std::fs::File::create(self.filler()) else {
            return 0;
        };
        let chunk = vec![0u8; 1 << 20];
        let mut written = 0u64;
        while f.write_all(&chunk).is_ok() {
            written += chunk.len() as u64;
        }
        // Fill the last partial megabyte too.
        while f.write_all(&chunk[..4096]).is_ok() {
            written += 4096;
        }
        written
    }

    /// Removes the filler file.
    pub fn clear(&self) {
        let _ = std::fs::remove_file(self.filler());
    }
}

impl Drop for Disk {
    fn drop(&mut self) {
        self.clear();
        let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
    }
}

/// A fault in place, and what heals it.
#[derive(Debug)]
pub struct Active {
    kind: Kind,
    heal: Heal,
}

#[derive(Debug)]
enum Heal {
    Restart(u64),
    Cont(u64),
    Network,
    Disk(u64),
    Nothing,
}

/// Injects and heals faults on one cluster.
pub struct Injector {
    /// The cluster under test.
    pub cluster: Arc<Cluster>,
    /// How links are faulted; None: network kinds are skipped.
    pub net: Option<Links>,
    /// The tmpfs data directory; None when unavailable (`disk-full` is skipped).
    pub disk: Option<Disk>,
    /// The schedule's random source.
    pub rng: Rng,
}

impl Injector {
    /// Whether `kind` can run here.
    pub fn supports(&self, kind: Kind) -> bool {
        (!kind.needs_net() || self.net.is_some()) && (kind != Kind::DiskFull || self.disk.is_some())
    }

    /// Injects `kind` (targets chosen with the seeded random source; leader
    /// kinds use the leader of `queue`), recording a `fault` in `history`.
    /// `rolling-restart` runs to completion here.
    ///
    /// Errors: a signal, iptables or tc step failed, or a node did not restart.
    pub async fn inject(
        &mut self,
        kind: Kind,
        queue: &str,
        history: &History,
    ) -> anyhow::Result<Active> {
        let ids: Vec<u64> = self.cluster.ids().collect();
        let random = *self.rng.pick(&ids);
        let (targets, detail, heal) = match kind {
            Kind::Kill => {
                self.cluster.kill9(random);
                (vec![random], String::new(), Heal::Restart(random))
            }
            Kind::KillLeader => {
                let (l, how) = self.leader(queue, random).await;
                self.cluster.kill9(l);
                (vec![l], how, Heal::Restart(l))
            }
            Kind::Pause => {
                self.cluster.sigstop(random)?;
                (vec![random], String::new(), Heal::Cont(random))
            }
            Kind::PartitionOne => {
                self.isolate(random, &ids)?;
                (vec![random], "isolated".into(), Heal::Network)
            }
            Kind::PartitionLeader => {
                let (l, how) = self.leader(queue, random).await;
                self.isolate(l, &ids)?;
                (vec![l], format!("isolated ({how})"), Heal::Network)
            }
            Kind::PartitionHalves => {
                let mut shuffled = ids.clone();
                self.rng.shuffle(&mut shuffled);
                let (minority, majority) = shuffled.split_at(ids.len() / 2);
                let net = self.net()?;
                for &a in minority {
                    for &b in majority {
                        net.block(a, b)?;
                    }
                }
                (
                    minority.to_vec(),
                    format!("{minority:?} | {majority:?}"),
                    Heal::Network,
                )
            }
            Kind::Bridge => {
                let mut shuffled = ids.clone();
                self.rng.shuffle(&mut shuffled);
                let middle = shuffled[0];
                let rest = &shuffled[1..];
                let (left, right) = rest.split_at(rest.len() / 2);
                let net = self.net()?;
                for &a in left {
                    for &b in right {
                        net.block(a, b)?;
                    }
                }
                (
                    vec![middle],
                    format!("{left:?} | {right:?}, bridged by {middle}"),
                    Heal::Network,
                )
            }
            Kind::Loss => {
                let p = self.rng.range(5, 30) as f64 / 100.0;
                self.net()?.lossy(random, p)?;
                (
                    vec![random],
                    format!("{:.0} % loss", p * 100.0),
                    Heal::Network,
                )
            }
            Kind::Delay => {
                let ms = self.rng.range(20, 80);
                let how = self.net()?.delay(random, ms)?;
                (vec![random], how, Heal::Network)
            }
            Kind::SlowLink => {
                let how = self.net()?.slow_link(random, 256, 0.20)?;
                (vec![random], how, Heal::Network)
            }
            Kind::RollingRestart => {
                history.log(Op::Fault {
                    kind: kind.name().into(),
                    targets: ids.clone(),
                    detail: "SIGTERM, restart, one at a time".into(),
                });
                for &id in &ids {
                    self.cluster
                        .stop(id)
                        .await
                        .with_context(|| format!("stopping node {id}"))?;
                    self.cluster
                        .restart(id)
                        .await
                        .with_context(|| format!("restarting node {id}"))?;
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                return Ok(Active {
                    kind,
                    heal: Heal::Nothing,
                });
            }
            Kind::DiskFull => {
                let disk = self.disk.as_ref().context("no tmpfs data directory")?;
                let node = disk.node;
                let bytes = disk.fill();
                (
                    vec![node],
                    format!("{} MiB written to fill it", bytes >> 20),
                    Heal::Disk(node),
                )
            }
        };
        history.log(Op::Fault {
            kind: kind.name().into(),
            targets,
            detail,
        });
        Ok(Active { kind, heal })
    }

    /// Heals `active`, recording `healed`.
    ///
    /// Errors: a node did not restart, or iptables/tc failed.
    pub async fn heal(&mut self, active: Active, history: &History) -> anyhow::Result<()> {
        match active.heal {
            Heal::Restart(id) => self.cluster.restart(id).await?,
            Heal::Cont(id) => self.cluster.sigcont(id)?,
            Heal::Network => self.net()?.heal()?,
            Heal::Disk(id) => {
                if let Some(d) = &self.disk {
                    d.clear();
                }
                if self.cluster.pid(id).is_none() {
                    self.cluster.restart(id).await?;
                }
            }
            Heal::Nothing => {}
        }
        history.log(Op::Healed {
            kind: active.kind.name().into(),
        });
        Ok(())
    }

    /// Heals whatever may be left: network rules, stopped or dead nodes, a full disk.
    ///
    /// Errors: a node did not restart, or iptables/tc failed.
    pub async fn heal_all(&mut self) -> anyhow::Result<()> {
        if let Some(net) = &self.net {
            net.heal()?;
        }
        if let Some(d) = &self.disk {
            d.clear();
        }
        for id in self.cluster.ids().collect::<Vec<_>>() {
            match self.cluster.pid(id) {
                None => self.cluster.restart(id).await?,
                Some(_) if !self.cluster.is_running(id) => self.cluster.sigcont(id)?,
                Some(_) => {}
            }
        }
        Ok(())
    }

    fn net(&self) -> anyhow::Result<&Links> {
        self.net.as_ref().context("no link faults here")
    }

    fn isolate(&self, node: u64, ids: &[u64]) -> anyhow::Result<()> {
        let net = self.net()?;
        for &other in ids.iter().filter(|&&o| o != node) {
            net.block(node, other)?;
        }
        Ok(())
    }

    /// The running leader of `queue` as a running node reports it (≤ 5 s), else `fallback`.
    async fn leader(&self, queue: &str, fallback: u64) -> (u64, String) {
        let running = self.cluster.running();
        for via in running {
            let found = self
                .cluster
                .wait_queue_leader(via, queue, Duration::from_secs(5))
                .await;
            if let Ok(l) = found {
                return (l, format!("leader of {queue}"));
            }
        }
        (
            fallback,
            format!("leader of {queue} unknown: node {fallback}"),
        )
    }
}
