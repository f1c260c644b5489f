//! The node-level failure detector (Ra's aten, CockroachDB's liveness): one
//! long-lived `Heartbeat` stream per node pair (dialled by the lower node
//! id, on a TCP connection of its own: [`Peers::beat_channel`]) carries a beat every
//! [`BEAT_MS`] in both directions. A peer is down when its stream breaks (a
//! killed process closes its connections: noticed at once) or when no beat
//! arrived for [`DEAD_AFTER_MS`] (a paused or partitioned node). Idle Raft
//! groups send nothing; this detector is what starts their elections
//! (`cluster::elections`). A beat also carries the peer's boot epoch, so a
//! restart is seen even when it was quicker than the detector.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use quorumq_proto::v1::cluster_client::ClusterClient;
use quorumq_proto::v1::Beat;
use tokio::sync::watch;

use super::peers::Peers;

/// Interval between two beats on a stream (ms).
pub const BEAT_MS: u64 = 100;
/// A peer with no beat for this long is down (ms).
pub const DEAD_AFTER_MS: u64 = 800;

/// Why a peer is down when its beats stopped (its stream still open).
const SILENT: &str = "no beat";
/// How long a timer lateness counts in [`Detector::lag`] (ms).
const LAG_WINDOW_MS: u64 = 5000;
/// The most that lateness (this node's and a peer's together) adds to [`DEAD_AFTER_MS`] (ms):
/// a node that is silent this much longer is down however loaded anyone is.
const MAX_LAG_ALLOWANCE_MS: u64 = 10_000;

#[derive(Debug, Clone)]
struct PeerState {
    alive: bool,
    epoch: u32,
    last_seen: Instant,
    amqp_addr: String,
    /// The peer said it drains (its beats carry it).
    draining: bool,
    /// Down only because its beats stopped arriving: its stream is still
    /// open (paused, partitioned, or behind a slow link).
    silent: bool,
    /// How late its timers ran lately, as its last beat said (ms).
    lag_ms: u64,
}

/// Liveness of every peer as this node sees it.
pub struct Detector {
    me: u64,
    epoch: u32,
    amqp_addr: String,
    cluster_addr: String,
    peers: Arc<Peers>,
    state: Mutex<HashMap<u64, PeerState>>,
    changes: watch::Sender<u64>,
    /// When this detector started: a peer not heard from within
    /// [`UNHEARD_AFTER_MS`] of it counts as down.
    started: Instant,
    /// Resource alarms: ours go out on every beat, peers' come in (cluster-wide alarms).
    alarms: Arc<crate::alarms::Alarms>,
    /// Client connection counts: ours go out on every beat, peers' come in (vhost
    /// connection limits are cluster-wide).
    connections: Arc<crate::connections::Connections>,
    /// Lateness of this node's detector timer (when, ms late), the last [`LAG_WINDOW_MS`]:
    /// a node whose runtime is behind (tens of thousands of groups starting, a saturated
    /// CPU) handles beats late too, and must not take a live peer's silence for death
    /// (Lifeguard's local health awareness, HashiCorp memberlist).
    lag: Mutex<std::collections::VecDeque<(Instant, u64)>>,
    /// This node is draining (`quorumqctl drain`, SIGTERM): alive, but it
    /// leads nothing — it appends no more as a leader, answers forwarded
    /// proposals with "no leader here" and does not campaign
    /// (`cluster::drain`).
    draining: std::sync::atomic::AtomicBool,
}

/// A peer never heard from since this node started is down after this
/// long (ms): two silences, time for every live peer's stream to connect.
pub const UNHEARD_AFTER_MS: u64 = 2 * DEAD_AFTER_MS;

/// What this node's detector knows of a peer's liveness.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// Beating, in boot `epoch`.
    Up { epoch: u32 },
    /// Its stream closed, it went silent, or it was never heard from
    /// within [`UNHEARD_AFTER_MS`] of this node's start.
    Down,
    /// Not heard from yet, and this node started too recently to tell.
    Unknown,
}

/// A stream of beats (the server side's reply stream).
pub type BeatStream = Pin<Box<dyn Stream<Item = Result<Beat, tonic::Status>> + Send + 'static>>;

impl Detector {
    /// The detector of node `me` in boot `epoch`, advertising its addresses.
    pub fn new(
        me: u64,
        epoch: u32,
        amqp_addr: String,
        cluster_addr: String,
        peers: Arc<Peers>,
        alarms: Arc<crate::alarms::Alarms>,
        connections: Arc<crate::connections::Connections>,
    ) -> Arc<Self> {
        Arc::new(Detector {
            me,
            epoch,
            amqp_addr,
            cluster_addr,
            peers,
            state: Mutex::new(HashMap::new()),
            changes: watch::Sender::new(0),
            started: Instant::now(),
            alarms,
            connections,
            lag: Mutex::new(std::collections::VecDeque::new()),
            draining: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Starts dialling every known peer with a higher id (and such peers
    /// learnt later); lower ids dial this node.
    pub fn spawn(self: &Arc<Self>) {
        let me = self.clone();
        tokio::spawn(async move {
            let mut dialling = std::collections::HashSet::new();
            let mut check = tokio::time::interval(Duration::from_millis(BEAT_MS / 2));
            loop {
                let due = check.tick().await;
                if Arc::strong_count(&me) == 1 {
                    return;
                }
                me.note_lag(tokio::time::Instant::now().saturating_duration_since(due));
                // One stream per node pair: the lower id dials, both beat on it.
                for peer in me.peers.others() {
                    if peer > me.me && dialling.insert(peer) {
                        tokio::spawn(dial(Arc::downgrade(&me), peer));
                    }
                }
                me.expire();
            }
        });
    }

    /// How long ago this node's detector (the node) started.
    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    /// Marks this node draining (true) or serving again (false).
    pub fn set_draining(&self, on: bool) {
        self.draining
            .store(on, std::sync::atomic::Ordering::Release);
        self.changes.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// True while this node is draining (see [`Detector::set_draining`]).
    pub fn is_draining(&self) -> bool {
        self.draining.load(std::sync::atomic::Ordering::Acquire)
    }

    /// True when `node` can lead a group now: it is alive (this node, or a
    /// peer that answers beats) and not draining (this node's flag, or the
    /// peer's last beat). Proposals go only to such a leader, leaderships
    /// are handed only to such a node, and only such voters take election
    /// turns. One lock, where `is_alive` + a draining check took two.
    pub fn may_lead(&self, node: u64) -> bool {
        if node == self.me {
            return !self.is_draining();
        }
        self.state
            .lock()
            .map(|s| s.get(&node).is_some_and(|p| p.alive && !p.draining))
            .unwrap_or(false)
    }

    /// True when `node` is this node or answers beats.
    pub fn is_alive(&self, node: u64) -> bool {
        node == self.me
            || self
                .state
                .lock()
                .map(|s| s.get(&node).is_some_and(|p| p.alive))
                .unwrap_or(false)
    }

    /// True when `node` is down only because its beats stopped arriving
    /// within [`DEAD_AFTER_MS`]: its stream did not close, so it may be
    /// alive behind a slow link (or paused, or partitioned).
    pub fn is_silent(&self, node: u64) -> bool {
        node != self.me
            && self
                .state
                .lock()
                .map(|s| s.get(&node).is_some_and(|p| !p.alive && p.silent))
                .unwrap_or(false)
    }

    /// True when `node` was seen and is now down with its stream closed
    /// (killed, stopped, restarting): not alive and not merely silent. A
    /// node never heard from since this one started is not down (it may be
    /// starting).
    pub fn is_down(&self, node: u64) -> bool {
        node != self.me
            && self
                .state
                .lock()
                .map(|s| s.get(&node).is_some_and(|p| !p.alive && !p.silent))
                .unwrap_or(false)
    }

    /// Milliseconds since this node last heard a beat from `node` (0 for
    /// itself; None if never heard from since this node started).
    pub fn last_seen_ms(&self, node: u64) -> Option<u64> {
        if node == self.me {
            return Some(0);
        }
        let s = self.state.lock().ok()?;
        s.get(&node)
            .map(|p| u64::try_from(p.last_seen.elapsed().as_millis()).unwrap_or(u64::MAX))
    }

    /// The boot epoch `node` last reported (this node's own for itself).
    pub fn epoch_of(&self, node: u64) -> Option<u32> {
        if node == self.me {
            return Some(self.epoch);
        }
        self.state.lock().ok()?.get(&node).map(|p| p.epoch)
    }

    /// `node`'s liveness as this node sees it (this node is always up).
    pub fn liveness(&self, node: u64) -> Liveness {
        if node == self.me {
            return Liveness::Up { epoch: self.epoch };
        }
        let known = self
            .state
            .lock()
            .ok()
            .and_then(|s| s.get(&node).map(|p| (p.alive, p.epoch)));
        match known {
            Some((true, epoch)) => Liveness::Up { epoch },
            Some((false, _)) => Liveness::Down,
            None if self.started.elapsed() >= Duration::from_millis(UNHEARD_AFTER_MS) => {
                Liveness::Down
            }
            None => Liveness::Unknown,
        }
    }

    /// The AMQP address `node` reported, if it ever beat.
    pub fn amqp_addr_of(&self, node: u64) -> Option<String> {
        if node == self.me {
            return Some(self.amqp_addr.clone());
        }
        self.state
            .lock()
            .ok()?
            .get(&node)
            .map(|p| p.amqp_addr.clone())
    }

    /// Bumped whenever a peer goes up or down or restarts.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Waits until `node` is seen down (returns at once if it is).
    pub async fn wait_down(&self, node: u64) {
        let mut rx = self.subscribe();
        loop {
            if !self.is_alive(node) {
                return;
            }
            if rx.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    }

    fn beat(&self) -> Beat {
        let alarm = self.alarms.local();
        Beat {
            node_id: self.me,
            epoch: self.epoch,
            cluster_id: self.peers.cluster_id(),
            amqp_addr: self.amqp_addr.clone(),
            cluster_addr: self.cluster_addr.clone(),
            memory_alarm: alarm.memory,
            disk_alarm: alarm.disk,
            draining: self.is_draining(),
            connections: self.connections.local(),
            lag_ms: u32::try_from(self.lag_ms()).unwrap_or(u32::MAX),
        }
    }

    /// A beat arrived (either direction).
    pub fn on_beat(&self, b: &Beat) {
        if b.node_id == self.me || b.node_id == 0 {
            return;
        }
        if !b.cluster_addr.is_empty() && self.peers.addr(b.node_id).is_none() {
            self.peers.set_addr(b.node_id, &b.cluster_addr);
        }
        self.alarms.set_remote(
            b.node_id,
            crate::alarms::Alarm {
                memory: b.memory_alarm,
                disk: b.disk_alarm,
            },
        );
        self.connections
            .set_remote(b.node_id, b.connections.clone());
        let changed = {
            let Ok(mut s) = self.state.lock() else { return };
            let now = Instant::now();
            let p = s.entry(b.node_id).or_insert(PeerState {
                alive: false,
                epoch: b.epoch,
                last_seen: now,
                amqp_addr: String::new(),
                draining: false,
                silent: false,
                lag_ms: 0,
            });
            let changed = !p.alive || p.epoch != b.epoch;
            if changed {
                tracing::info!(
                    node = b.node_id,
                    epoch = b.epoch,
                    restarted = p.epoch != b.epoch,
                    "peer up"
                );
            }
            p.alive = true;
            p.silent = false;
            p.epoch = p.epoch.max(b.epoch);
            p.last_seen = now;
            p.amqp_addr = b.amqp_addr.clone();
            p.draining = b.draining;
            p.lag_ms = u64::from(b.lag_ms);
            changed
        };
        if changed {
            self.changes.send_modify(|g| *g += 1);
        }
    }

    /// `node`'s stream broke: down at once.
    fn mark_down(&self, node: u64, why: &str) {
        // A node that is gone blocks nobody (RabbitMQ clears a down node's alarms).
        self.alarms
            .set_remote(node, crate::alarms::Alarm::default());
        self.connections.forget(node);
        let changed = self
            .state
            .lock()
            .map(|mut s| match s.get_mut(&node) {
                Some(p) if p.alive => {
                    p.alive = false;
                    p.silent = why == SILENT;
                    true
                }
                _ => false,
            })
            .unwrap_or(false);
        if changed {
            tracing::warn!(node, why, "peer down");
            self.changes.send_modify(|g| *g += 1);
        }
    }

    /// Records how late this node's detector timer ran (`late`).
    fn note_lag(&self, late: Duration) {
        let Ok(mut lag) = self.lag.lock() else { return };
        let now = Instant::now();
        while lag
            .front()
            .is_some_and(|(at, _)| now.duration_since(*at) > Duration::from_millis(LAG_WINDOW_MS))
        {
            lag.pop_front();
        }
        let ms = u64::try_from(late.as_millis()).unwrap_or(u64::MAX);
        // Only the lateness that matters is kept: a few ms is scheduling noise.
        if ms >= 10 {
            lag.push_back((now, ms));
        }
    }

    /// The largest lateness of this node's detector timer in the last [`LAG_WINDOW_MS`] (ms;
    /// [`Detector::note_lag`] keeps only that window).
    pub fn lag_ms(&self) -> u64 {
        self.lag
            .lock()
            .map(|l| l.iter().map(|(_, ms)| *ms).max().unwrap_or(0))
            .unwrap_or(0)
    }

    /// How long `peer` may be silent before it is down: [`allowance`] of this node's and
    /// the peer's recent lateness (as its last beat said).
    fn silence_allowed(&self, peer: u64) -> Duration {
        let peer_lag = self
            .state
            .lock()
            .ok()
            .and_then(|s| s.get(&peer).map(|p| p.lag_ms))
            .unwrap_or(0);
        allowance(self.lag_ms(), peer_lag)
    }

    /// Marks down every peer silent for longer than [`DEAD_AFTER_MS`] (plus the lateness of
    /// its timers and of this node's, [`allowance`]).
    fn expire(&self) {
        let own = self.lag_ms();
        let silent: Vec<u64> = self
            .state
            .lock()
            .map(|s| {
                s.iter()
                    .filter(|(_, p)| p.alive && p.last_seen.elapsed() > allowance(own, p.lag_ms))
                    .map(|(id, _)| *id)
                    .collect()
            })
            .unwrap_or_default();
        for node in silent {
            self.mark_down(node, SILENT);
        }
    }

    /// Server side of a peer's `Heartbeat` stream: its beats in, ours out.
    pub fn serve(self: &Arc<Self>, mut inbound: tonic::Streaming<Beat>) -> BeatStream {
        let me = self.clone();
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Beat, tonic::Status>>(4);
        tokio::spawn(async move {
            let mut from = None;
            let mut tick = tokio::time::interval(Duration::from_millis(BEAT_MS));
            loop {
                tokio::select! {
                    b = inbound.next() => match b {
                        Some(Ok(b)) => {
                            if !me.peers.accepts(b.cluster_id) {
                                tracing::error!(node = b.node_id, theirs = b.cluster_id, ours = me.peers.cluster_id(), "refusing a node of another cluster");
                                let _ = tx.send(Err(tonic::Status::failed_precondition("cluster id mismatch"))).await;
                                return;
                            }
                            from = Some(b.node_id);
                            me.on_beat(&b);
                        }
                        _ => {
                            if let Some(n) = from { me.mark_down(n, "stream closed"); }
                            return;
                        }
                    },
                    _ = tick.tick() => {
                        if tx.send(Ok(me.beat())).await.is_err() {
                            return;
                        }
                    }
                }
            }
        });
        Box::pin(futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|v| (v, rx))
        }))
    }
}

/// How long a peer may be silent before it is down when this node's timers ran `own_ms`
/// late and the peer's `peer_ms` (ms): [`DEAD_AFTER_MS`] plus both, at most
/// [`MAX_LAG_ALLOWANCE_MS`] more.
fn allowance(own_ms: u64, peer_ms: u64) -> Duration {
    let extra = own_ms.saturating_add(peer_ms).min(MAX_LAG_ALLOWANCE_MS);
    Duration::from_millis(DEAD_AFTER_MS + extra)
}

/// Keeps one outbound `Heartbeat` stream to `peer` open while the detector lives.
async fn dial(detector: std::sync::Weak<Detector>, peer: u64) {
    loop {
        let Some(d) = detector.upgrade() else { return };
        if let Some(ch) = d.peers.beat_channel(peer) {
            let mut client = ClusterClient::new(ch);
            let beats = {
                let d = Arc::downgrade(&d);
                futures::stream::unfold((), move |()| {
                    let d = d.clone();
                    async move {
                        tokio::time::sleep(Duration::from_millis(BEAT_MS)).await;
                        d.upgrade().map(|d| (d.beat(), ()))
                    }
                })
            };
            let first = futures::stream::iter([d.beat()]);
            let call = client.heartbeat(first.chain(beats));
            drop(d);
            match tokio::time::timeout(Duration::from_millis(DEAD_AFTER_MS), call).await {
                Ok(Ok(resp)) => {
                    let mut inbound = resp.into_inner();
                    loop {
                        // The same allowance as `expire`: a stream broken sooner for a
                        // loaded peer's silence would take it for dead ("stream closed").
                        let Some(allowed) = detector.upgrade().map(|d| d.silence_allowed(peer))
                        else {
                            return;
                        };
                        match tokio::time::timeout(allowed, inbound.next()).await {
                            Ok(Some(Ok(b))) => match detector.upgrade() {
                                Some(d) => d.on_beat(&b),
                                None => return,
                            },
                            Ok(Some(Err(status)))
                                if status.code() == tonic::Code::FailedPrecondition =>
                            {
                                tracing::error!(peer, "peer refused us: {}", status.message());
                                break;
                            }
                            _ => break,
                        }
                    }
                    if let Some(d) = detector.upgrade() {
                        d.mark_down(peer, "stream closed");
                    }
                }
                Ok(Err(_)) | Err(_) => {
                    if let Some(d) = detector.upgrade() {
                        d.mark_down(peer, "unreachable");
                    }
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(BEAT_MS)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn detector() -> Arc<Detector> {
        Detector::new(
            1,
            7,
            "127.0.0.1:5672".into(),
            "127.0.0.1:5680".into(),
            Arc::new(Peers::new(1, 0)),
            crate::alarms::Alarms::new(u64::MAX, 0),
            crate::connections::Connections::new(),
        )
    }

    /// Makes `node` last heard `ago` ago.
    fn heard_ago(d: &Detector, node: u64, ago: Duration) {
        if let Ok(mut s) = d.state.lock() {
            if let Some(p) = s.get_mut(&node) {
                p.last_seen = Instant::now() - ago;
            }
        }
    }

    #[test]
    fn silence_is_death_after_dead_after_ms_unless_someone_runs_late() {
        let d = detector();
        d.on_beat(&beat(2, false));
        d.on_beat(&Beat {
            lag_ms: 1500,
            ..beat(3, false)
        });
        let silent = Duration::from_millis(DEAD_AFTER_MS + 700);
        heard_ago(&d, 2, silent);
        heard_ago(&d, 3, silent);
        d.expire();
        assert!(!d.is_alive(2), "no one late: down");
        assert!(d.is_alive(3), "its own timers ran 1.5 s late: not yet");

        // This node's own runtime ran 1 s late: a peer's silence of DEAD_AFTER + 0.7 s is ours.
        let d = detector();
        d.on_beat(&beat(2, false));
        d.note_lag(Duration::from_millis(1000));
        assert_eq!(d.lag_ms(), 1000);
        assert_eq!(d.beat().lag_ms, 1000, "beats carry it");
        heard_ago(&d, 2, silent);
        d.expire();
        assert!(d.is_alive(2));
        heard_ago(&d, 2, Duration::from_millis(DEAD_AFTER_MS + 1100));
        d.expire();
        assert!(!d.is_alive(2) && d.is_silent(2));
    }

    #[test]
    fn lateness_allows_at_most_max_lag_allowance_ms_more() {
        assert_eq!(allowance(0, 0), Duration::from_millis(DEAD_AFTER_MS));
        assert_eq!(
            allowance(300, 200),
            Duration::from_millis(DEAD_AFTER_MS + 500)
        );
        assert_eq!(
            allowance(u64::MAX, 5),
            Duration::from_millis(DEAD_AFTER_MS + MAX_LAG_ALLOWANCE_MS)
        );
        let d = detector();
        d.note_lag(Duration::from_millis(5));
        assert_eq!(d.lag_ms(), 0, "a few ms is noise");
    }

    fn beat(node: u64, draining: bool) -> Beat {
        Beat {
            node_id: node,
            epoch: 3,
            draining,
            ..Default::default()
        }
    }

    /// Draining travels in the beats: a peer that says it drains may not
    /// lead until a beat says otherwise; this node's own flag goes out.
    #[test]
    fn draining_is_learnt_from_beats_and_sent_in_them() {
        let d = detector();
        assert!(!d.may_lead(2), "a peer never heard from is not alive");
        d.on_beat(&beat(2, true));
        assert!(d.is_alive(2));
        assert!(!d.may_lead(2), "alive but draining");
        d.on_beat(&beat(3, false));
        assert!(d.may_lead(3));
        d.on_beat(&beat(2, false));
        assert!(d.may_lead(2));

        assert!(d.may_lead(1) && !d.beat().draining);
        d.set_draining(true);
        assert!(!d.may_lead(1) && d.beat().draining);
        assert!(d.may_lead(2), "only this node drains");
        d.set_draining(false);
        assert!(d.may_lead(1));
    }

    /// A peer is silent only while it is down for want of beats: a closed
    /// stream is not silence, and a beat ends both.
    #[test]
    fn silence_is_told_apart_from_a_closed_stream() {
        let d = detector();
        d.on_beat(&beat(2, false));
        d.on_beat(&beat(3, false));
        assert!(!d.is_silent(2), "alive");
        d.mark_down(2, SILENT);
        d.mark_down(3, "stream closed");
        assert!(!d.is_alive(2) && d.is_silent(2));
        assert!(!d.is_alive(3) && !d.is_silent(3), "its stream closed");
        d.on_beat(&beat(2, false));
        assert!(d.is_alive(2) && !d.is_silent(2));
        assert!(!d.is_silent(1), "this node is never silent");
        assert!(!d.is_silent(9), "a node never heard from is not silent");
    }
}
