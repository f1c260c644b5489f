//! The fault-injection suite: a 3-node quorumq cluster in network
//! namespaces (or, without them, behind forwarding proxies), workloads with confirms and dead-lettering on every node,
//! seeded nemesis schedules, and total-queue / dead-letter checkers.
//!
//! [`run`] takes the workloads one after another on one cluster. For each:
//! start its clients, inject its faults (inject, hold, heal, quiet), heal
//! everything, stop publishing, drain until its queues are empty (or report
//! it stuck after [`DRAIN_TIMEOUT`]), stop consuming, check the history.
//! The results folder gets `history-<workload>.jsonl`, `verdict.json` and
//! each node's log. Used by the `quorumq-faults` binary
//! (`cluster-tests/faults/run.sh`).

pub mod checker;
pub mod history;
pub mod nemesis;
pub mod net;
pub mod proxy;
pub mod rng;
pub mod workload;

use crate::cluster::{Cluster, Placement};
use anyhow::Context;
use checker::Verdict;
use history::History;
use nemesis::{Disk, Injector, Links};
use net::Net;
use proxy::Proxies;
use rng::Rng;
use serde::Serialize;
use std::{path::PathBuf, sync::Arc, time::Duration};

/// How long a workload's queues may take to drain once every fault is healed.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(120);
/// Size of the disk node's tmpfs (bytes).
const DISK_BYTES: u64 = 256 << 20;
/// WAL segment size of every node (bytes): the log keeps about four segments before it
/// rewrites idle groups out of the oldest, so the default 64 MiB would need the whole tmpfs.
const WAL_SEGMENT_BYTES: u64 = 16 << 20;
/// The node whose data directory is the tmpfs.
const DISK_NODE: u64 = 3;
/// Nodes in the cluster.
const NODES: usize = 3;

/// How a run's faults are scheduled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// The nemesis kinds dealt round-robin over the workloads (every kind once), short holds.
    Short,
    /// Random kinds for `time` per workload.
    Long,
}

/// A run's parameters.
#[derive(Debug, Clone)]
pub struct Options {
    /// Schedule profile.
    pub profile: Profile,
    /// Nemesis phase per workload ([`Profile::Long`]).
    pub time: Duration,
    /// Workloads, run in this order.
    pub workloads: Vec<workload::Kind>,
    /// Nemesis kinds to draw from.
    pub nemeses: Vec<nemesis::Kind>,
    /// Seed of every random choice.
    pub seed: u64,
    /// Publish rate per publisher (msg/s; one publisher per node).
    pub rate: u64,
    /// Folder receiving this run's files.
    pub results: PathBuf,
    /// Use the forwarding proxies on 127.0.0.x even where namespaces work.
    pub proxies: bool,
    /// Nemesis kinds the caller excluded on purpose (`--exclude`); listed in
    /// the report. A kind in `nemeses` that this machine cannot run fails
    /// the run instead.
    pub excluded: Vec<nemesis::Kind>,
}

/// One fault in a schedule: quiet time before, the kind, how long it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// Fault-free time before the fault (ms).
    pub quiet_ms: u64,
    /// The fault.
    pub kind: nemesis::Kind,
    /// Time the fault holds before it is healed (ms).
    pub hold_ms: u64,
}

/// The per-workload fault schedules of a run: a pure function of the seed,
/// the profile, the workloads and the kinds available.
pub fn schedule(opts: &Options, kinds: &[nemesis::Kind]) -> Vec<Vec<Step>> {
    let mut rng = Rng::new(opts.seed);
    let n = opts.workloads.len().max(1);
    let mut out = vec![Vec::new(); opts.workloads.len()];
    if kinds.is_empty() || out.is_empty() {
        return out;
    }
    match opts.profile {
        Profile::Short => {
            let mut dealt = kinds.to_vec();
            rng.shuffle(&mut dealt);
            for (i, kind) in dealt.into_iter().enumerate() {
                let step = Step {
                    quiet_ms: rng.range(2000, 3000),
                    kind,
                    hold_ms: rng.range(3000, 5000),
                };
                out[i % n].push(step);
            }
        }
        Profile::Long => {
            let budget = opts.time.as_millis() as u64;
            for steps in &mut out {
                let mut used = 0;
                while used < budget {
                    let step = Step {
                        quiet_ms: rng.range(2000, 6000),
                        kind: *rng.pick(kinds),
                        hold_ms: rng.range(3000, 12000),
                    };
                    used += step.quiet_ms + step.hold_ms;
                    steps.push(step);
                }
            }
        }
    }
    out
}

/// A run's outcome.
#[derive(Debug, Serialize)]
pub struct Report {
    /// The seed.
    pub seed: u64,
    /// How the nodes were connected.
    pub network: String,
    /// Nemesis kinds asked for that this machine cannot run: the run fails.
    pub skipped: Vec<String>,
    /// Nemesis kinds excluded on purpose (`--exclude`).
    pub excluded: Vec<String>,
    /// One per workload.
    pub verdicts: Vec<Verdict>,
}

impl Report {
    /// Every workload passed and every nemesis kind asked for could run.
    pub fn passed(&self) -> bool {
        self.skipped.is_empty()
            && !self.verdicts.is_empty()
            && self.verdicts.iter().all(Verdict::passed)
    }
}

/// Runs the suite. Every fault is healed and every node stopped before it returns.
///
/// Errors: the cluster could not start, or a fault could not be injected or
/// healed (the cluster is still torn down).
pub async fn run(opts: &Options) -> anyhow::Result<Report> {
    std::fs::create_dir_all(&opts.results)?;
    let root = tempfile::Builder::new()
        .prefix("quorumq-faults-")
        .tempdir()?;
    let namespaces = if opts.proxies {
        Err(anyhow::anyhow!("--network proxy"))
    } else {
        Net::setup(NODES)
    };
    let (links, network, places): (Links, String, Vec<Placement>) = match namespaces {
        Ok(net) => {
            let netem = if net.has_netem() {
                "netem"
            } else {
                "no sch_netem: delay = tbf + loss"
            };
            let desc = format!("network namespaces on {} ({netem})", net.subnet());
            let places = net.placements();
            (Links::Namespaces(net), desc, places)
        }
        Err(e) => {
            let ports = crate::cluster::distinct_free_ports(2)?;
            let proxies = Proxies::start(NODES, ports[1])
                .await
                .context("starting the fallback proxies")?;
            let desc = format!("no network namespaces ({e:#}): nodes on 127.0.0.1x behind forwarding proxies on 127.0.0.2x");
            let places = (1..=NODES as u64)
                .map(|i| Placement {
                    host: proxy::node_ip(i),
                    amqp_port: ports[0],
                    cluster_port: ports[1],
                    netns: None,
                    advertise: Some(format!("{}:{}", proxy::proxy_ip(i), ports[1])),
                    join: None,
                })
                .collect();
            (Links::Proxies(proxies), desc, places)
        }
    };
    eprintln!("network: {network}");
    let disk_dir = root.path().join("data").join(format!("node-{DISK_NODE}"));
    let disk = match Disk::mount(DISK_NODE, &disk_dir, DISK_BYTES) {
        Ok(d) => Some(d),
        Err(e) => {
            eprintln!("disk-full skipped: {e:#}");
            None
        }
    };
    let cluster = Arc::new(
        Cluster::start_placed_with_args(
            root,
            places,
            &["--wal-segment-bytes", &WAL_SEGMENT_BYTES.to_string()],
        )
        .await
        .context("starting the cluster")?,
    );
    let mut injector = Injector {
        cluster: cluster.clone(),
        net: Some(links),
        disk,
        rng: Rng::new(opts.seed ^ 0x5eed),
    };
    let kinds: Vec<nemesis::Kind> = opts
        .nemeses
        .iter()
        .copied()
        .filter(|k| injector.supports(*k))
        .collect();
    let skipped = opts
        .nemeses
        .iter()
        .filter(|k| !injector.supports(**k))
        .map(|k| k.name().to_string())
        .collect();
    let plan = schedule(opts, &kinds);
    let mut verdicts = Vec::new();
    let mut failure = None;
    for (kind, steps) in opts.workloads.iter().zip(plan) {
        match run_workload(*kind, &steps, opts, &cluster, &mut injector).await {
            Ok(v) => verdicts.push(v),
            Err(e) => {
                failure = Some(e.context(format!("workload {}", kind.name())));
                break;
            }
        }
    }
    let _ = injector.heal_all().await;
    if let Err(e) = cluster.copy_logs(&opts.results) {
        eprintln!("node logs not kept: {e:#}");
    }
    for id in cluster.ids() {
        cluster.kill9(id);
    }
    // Unmount before the cluster's temporary directory is removed, then drop the namespaces.
    injector.disk = None;
    injector.net = None;
    drop(injector);
    drop(cluster);
    if let Some(e) = failure {
        return Err(e);
    }
    let report = Report {
        seed: opts.seed,
        network,
        skipped,
        excluded: opts.excluded.iter().map(|k| k.name().to_string()).collect(),
        verdicts,
    };
    std::fs::write(
        opts.results.join("verdict.json"),
        serde_json::to_vec_pretty(&report)?,
    )?;
    Ok(report)
}

async fn run_workload(
    kind: workload::Kind,
    steps: &[Step],
    opts: &Options,
    cluster: &Arc<Cluster>,
    injector: &mut Injector,
) -> anyhow::Result<Verdict> {
    let history = Arc::new(History::create(
        &opts.results.join(format!("history-{}.jsonl", kind.name())),
    )?);
    eprintln!("workload {}: {} faults", kind.name(), steps.len());
    let mut w = workload::Workload::start(kind, cluster, history.clone(), opts.rate).await?;
    let queue = kind.source();
    for step in steps {
        tokio::time::sleep(Duration::from_millis(step.quiet_ms)).await;
        let active = injector.inject(step.kind, &queue, &history).await?;
        tokio::time::sleep(Duration::from_millis(step.hold_ms)).await;
        injector.heal(active, &history).await?;
        eprintln!("  {} healed at {} ms", step.kind.name(), history.now_ms());
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    // The last heal's recovery is judged too: publish until a confirm
    // follows it (or the checker's bound has passed).
    if let Some(last) = history
        .records()
        .iter()
        .rev()
        .find(|r| matches!(r.op, history::Op::Healed { .. }))
        .map(|r| r.t_ms)
    {
        let deadline =
            tokio::time::Instant::now() + Duration::from_millis(checker::RECOVERY_BOUND_MS);
        while !checker::confirmed_since(&history.records(), last)
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    injector.heal_all().await?;
    w.stop_publishing().await;
    let stuck = drain(cluster, &w.queues())
        .await
        .err()
        .map(|e| format!("{e:#}"));
    w.stop_consuming().await;
    history.flush()?;
    let expect = checker::Expect {
        faults: steps.len() as u64,
        ..kind.expect()
    };
    let mut v = checker::check(kind.name(), &history.records(), &expect);
    v.stuck = stuck;
    Ok(v)
}

/// Waits until every queue in `queues` shows no ready, unacked or held
/// message on two polls a second apart.
///
/// Errors: not drained within [`DRAIN_TIMEOUT`] (with the last counts).
async fn drain(cluster: &Cluster, queues: &[String]) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + DRAIN_TIMEOUT;
    let mut empty_polls = 0;
    let mut last = String::new();
    while empty_polls < 2 {
        if tokio::time::Instant::now() > deadline {
            anyhow::bail!("not drained {DRAIN_TIMEOUT:?} after healing: {last}");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let mut total = 0;
        last.clear();
        for q in queues {
            match cluster.queue_view(1, q).await {
                Ok(v) => {
                    total += v.messages_ready + v.messages_unacknowledged + v.dead_letter_held;
                    last += &format!(
                        "{q}: ready {} unacked {} held {} leader {:?}; ",
                        v.messages_ready, v.messages_unacknowledged, v.dead_letter_held, v.leader
                    );
                }
                Err(e) => {
                    total += 1;
                    last += &format!("{q}: {e:#}; ");
                }
            }
        }
        empty_polls = if total == 0 { empty_polls + 1 } else { 0 };
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(profile: Profile, seed: u64) -> Options {
        Options {
            profile,
            time: Duration::from_secs(60),
            workloads: workload::Kind::ALL.to_vec(),
            nemeses: nemesis::Kind::ALL.to_vec(),
            seed,
            rate: 100,
            results: PathBuf::new(),
            proxies: false,
            excluded: Vec::new(),
        }
    }

    #[test]
    fn the_short_profile_runs_every_kind_once_spread_over_every_workload() {
        let plan = schedule(&opts(Profile::Short, 9), &nemesis::Kind::ALL);
        assert_eq!(plan.len(), 4);
        assert!(plan.iter().all(|steps| !steps.is_empty()));
        let mut kinds: Vec<_> = plan.iter().flatten().map(|s| s.kind).collect();
        kinds.sort();
        assert_eq!(kinds, nemesis::Kind::ALL.to_vec());
    }

    #[test]
    fn the_same_seed_replays_the_same_schedule() {
        for profile in [Profile::Short, Profile::Long] {
            let a = schedule(&opts(profile, 5), &nemesis::Kind::ALL);
            assert_eq!(a, schedule(&opts(profile, 5), &nemesis::Kind::ALL));
            assert_ne!(a, schedule(&opts(profile, 6), &nemesis::Kind::ALL));
        }
    }

    #[test]
    fn the_long_profile_fills_its_time() {
        let plan = schedule(&opts(Profile::Long, 1), &nemesis::Kind::ALL);
        for steps in plan {
            let ms: u64 = steps.iter().map(|s| s.quiet_ms + s.hold_ms).sum();
            assert!((60_000..60_000 + 18_000).contains(&ms), "{ms}");
        }
    }
}
