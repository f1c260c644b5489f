//! Resource alarms, as RabbitMQ's "Memory and Disk Alarms" (rabbitmq.com/docs/alarms): when
//! the node's resident memory passes the memory high watermark, or the free space of the
//! filesystem holding its data directory falls below the disk free limit, every connection
//! that publishes is blocked (it gets `connection.blocked` if it announced the capability, and
//! the broker stops reading from its socket) until the alarm clears (`connection.unblocked`).
//! Consumers keep draining, so memory and disk come back; nothing is refused or lost.
//! As in RabbitMQ, an alarm is cluster-wide: each node's own alarms travel on the failure
//! detector's beats, and a node blocks its publishers while any live node has an alarm.
//!
//! Defaults are RabbitMQ 3.10.8's: watermark 0.4 of total memory
//! (`vm_memory_high_watermark.relative`), disk free limit 50 MB (`disk_free_limit.absolute`).
//! Memory is measured every 100 ms, and every 10 ms from half the watermark on; disk every
//! second (RabbitMQ: memory every 2.5 s, disk every 10 s or faster when close to the limit).
//! The memory alarm rises at the watermark, as RabbitMQ's, and also ahead of it when memory
//! grows fast: when [`LOOKAHEAD_MS`] of the fastest growth of the last second would reach it
//! ([`memory_alarm`]). Once raised, it clears when memory plus [`LOOKAHEAD_MS`] of the fastest
//! growth of the last [`CLEAR_WINDOW`] is [`CLEAR_MARGIN_PERCENT`] under the watermark: a
//! publisher released as soon as memory paused sent what its socket held and passed the
//! watermark. So a publisher flooding at hundreds of MB/s is blocked while resident memory is
//! still under the watermark, not one interval after it passed it (issue 14's must-show:
//! "broker RSS stays under the limit"; what it had in flight still lands, see
//! `cluster-tests/tests/alarms.rs`).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

/// Default memory high watermark: fraction of total memory (RabbitMQ's 0.4).
pub const DEFAULT_MEMORY_HIGH_WATERMARK: f64 = 0.4;
/// Default disk free limit in bytes (RabbitMQ's 50 MB).
pub const DEFAULT_DISK_FREE_LIMIT_BYTES: u64 = 50_000_000;
/// How often memory is measured (reading /proc/self/status: microseconds).
const CHECK_EVERY: Duration = Duration::from_millis(100);
/// How often memory is measured at or above [`CLOSE_PERCENT`] of the watermark.
const CHECK_CLOSE_EVERY: Duration = Duration::from_millis(10);
/// From this percentage of the watermark on, memory is measured every [`CHECK_CLOSE_EVERY`].
const CLOSE_PERCENT: u64 = 50;
/// How often disk free space is measured.
const DISK_EVERY: Duration = Duration::from_secs(1);
/// The memory alarm rises when memory growing at the fastest rate of [`RAISE_WINDOW`] would
/// reach the watermark within this many ms ([`memory_alarm`]): what publishers already sent
/// is still in flight (frames read, proposals being written) when their connections stop
/// reading (measured: 13 MB after a flood of ~150 MB/s was blocked, debug build).
pub const LOOKAHEAD_MS: u64 = 100;
/// A raised memory alarm clears once resident memory, projected as for raising it, is this
/// percentage of the watermark under it.
pub const CLEAR_MARGIN_PERCENT: u64 = 5;
/// The growth that raises the alarm is the fastest of this window.
const RAISE_WINDOW: Duration = Duration::from_secs(1);
/// The growth that keeps a raised alarm up is the fastest of this window: a publisher blocked
/// mid-flood is released only once memory held still that long (or fell well under the
/// watermark), not at the first pause between two measurements.
const CLEAR_WINDOW: Duration = Duration::from_secs(10);

/// Whether the memory alarm is on for resident memory `rss` (bytes) growing by
/// `growth_per_ms` (bytes per ms; the fastest of [`RAISE_WINDOW`] while the alarm is off, of
/// [`CLEAR_WINDOW`] while it is on), with the watermark `limit` (bytes), the alarm being `on`
/// before this measurement. Off, it rises when `rss` plus [`LOOKAHEAD_MS`] of that growth
/// reaches the watermark (with no growth: at the watermark, RabbitMQ's rule); on, it stays up
/// until that projection is [`CLEAR_MARGIN_PERCENT`] under the watermark.
pub fn memory_alarm(rss: u64, growth_per_ms: u64, limit: u64, on: bool) -> bool {
    let projected = rss.saturating_add(growth_per_ms.saturating_mul(LOOKAHEAD_MS));
    if on {
        projected >= limit - limit / 100 * CLEAR_MARGIN_PERCENT
    } else {
        projected >= limit
    }
}

/// Called with `true` when this node's memory alarm rises and `false` when it clears (set
/// once by the binary: the allocator returns freed memory to the OS at once while it is on).
static MEMORY_PRESSURE_HOOK: std::sync::OnceLock<fn(bool)> = std::sync::OnceLock::new();

/// Installs the memory-pressure hook (first call wins). quorumq's `main` sets mimalloc's
/// purge delay to 0 under the alarm: freed pages otherwise stay resident while worker threads
/// idle, and the alarm would never clear after consumers drained (measured: RSS flat at the
/// flood's peak for 20 s with the default 10 ms delay; back under the watermark within a
/// second with 0).
pub fn on_memory_pressure(hook: fn(bool)) {
    let _ = MEMORY_PRESSURE_HOOK.set(hook);
}

/// Which alarms are raised.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Alarm {
    /// Resident memory at or above the high watermark.
    pub memory: bool,
    /// Free disk space below the limit.
    pub disk: bool,
}

impl Alarm {
    /// True when publishers must be blocked.
    pub fn any(&self) -> bool {
        self.memory || self.disk
    }

    /// The `connection.blocked` reason, as rabbit_reader formats it ("low on memory",
    /// "low on disk", both joined by " & ").
    pub fn reason(&self) -> String {
        let mut parts = Vec::new();
        if self.memory {
            parts.push("low on memory");
        }
        if self.disk {
            parts.push("low on disk");
        }
        parts.join(" & ")
    }
}

/// The node's alarm state and limits. Connections watch [`Alarms::subscribe`].
pub struct Alarms {
    /// The effective alarms: this node's and every live peer's.
    tx: watch::Sender<Alarm>,
    /// This node's own measurement.
    local: std::sync::Mutex<Alarm>,
    /// Live peers' own alarms, as their beats last said.
    remote: std::sync::Mutex<std::collections::HashMap<u64, Alarm>>,
    /// Memory high watermark, bytes of resident memory.
    memory_limit: AtomicU64,
    /// Disk free limit, bytes.
    disk_limit: AtomicU64,
    /// The last memory measurement (bytes) and when it was taken, and the growth rates
    /// (bytes per ms) measured in the last [`CLEAR_WINDOW`], for [`memory_alarm`].
    growth: std::sync::Mutex<Growth>,
}

impl Alarms {
    /// Alarms with the given limits (bytes), none raised yet.
    pub fn new(memory_limit_bytes: u64, disk_free_limit_bytes: u64) -> Arc<Alarms> {
        Arc::new(Alarms {
            tx: watch::Sender::new(Alarm::default()),
            local: std::sync::Mutex::new(Alarm::default()),
            remote: std::sync::Mutex::new(std::collections::HashMap::new()),
            memory_limit: AtomicU64::new(memory_limit_bytes),
            disk_limit: AtomicU64::new(disk_free_limit_bytes),
            growth: std::sync::Mutex::new(Growth::default()),
        })
    }

    /// A receiver that sees every change of the alarm state.
    pub fn subscribe(&self) -> watch::Receiver<Alarm> {
        self.tx.subscribe()
    }

    /// The alarms in force now (this node's or any live peer's).
    pub fn current(&self) -> Alarm {
        *self.tx.borrow()
    }

    /// This node's own alarms (what its beats carry).
    pub fn local(&self) -> Alarm {
        self.local.lock().map(|a| *a).unwrap_or_default()
    }

    /// Live peers' own alarms, by node id, as their beats last said.
    pub fn remote(&self) -> std::collections::HashMap<u64, Alarm> {
        self.remote.lock().map(|r| r.clone()).unwrap_or_default()
    }

    /// A peer's own alarms, from its beat; `Alarm::default()` when it went down.
    pub fn set_remote(&self, node: u64, alarm: Alarm) {
        let changed = self
            .remote
            .lock()
            .map(|mut r| {
                let before = r.get(&node).copied().unwrap_or_default();
                if alarm.any() {
                    r.insert(node, alarm);
                } else {
                    r.remove(&node);
                }
                before != alarm
            })
            .unwrap_or(false);
        if changed {
            if alarm.any() {
                tracing::warn!(node, reason = %alarm.reason(), "resource alarm on a peer: publishers are blocked cluster-wide");
            }
            self.publish();
        }
    }

    /// Recomputes the effective alarms and tells the connections if they changed.
    fn publish(&self) {
        let mut all = self.local();
        if let Ok(r) = self.remote.lock() {
            for a in r.values() {
                all.memory |= a.memory;
                all.disk |= a.disk;
            }
        }
        self.tx.send_if_modified(|cur| {
            let changed = *cur != all;
            *cur = all;
            changed
        });
    }

    /// The memory high watermark (bytes) and the disk free limit (bytes).
    pub fn limits(&self) -> (u64, u64) {
        (
            self.memory_limit.load(Ordering::Relaxed),
            self.disk_limit.load(Ordering::Relaxed),
        )
    }

    /// Sets the memory high watermark (bytes) from now on (rabbitmqctl
    /// `set_vm_memory_high_watermark`; not kept across a restart). The next measurement, within
    /// 100 ms, raises or clears the alarm.
    pub fn set_memory_limit(&self, bytes: u64) {
        self.memory_limit.store(bytes, Ordering::Relaxed);
        tracing::info!(limit = bytes, "memory high watermark set");
    }

    /// Compares one measurement with the limits and raises or clears alarms (logged as
    /// RabbitMQ logs them; memory by [`memory_alarm`], from this and the last measurement).
    /// `rss`/`disk_free`: bytes, `None` when unmeasurable (no alarm).
    pub fn check(&self, rss: Option<u64>, disk_free: Option<u64>) {
        self.check_at(rss, disk_free, std::time::Instant::now());
    }

    /// [`Alarms::check`] of a measurement taken at `at`.
    fn check_at(&self, rss: Option<u64>, disk_free: Option<u64>, at: std::time::Instant) {
        let (mem_limit, disk_limit) = self.limits();
        let before = self.local();
        let window = if before.memory {
            CLEAR_WINDOW
        } else {
            RAISE_WINDOW
        };
        let growth_per_ms = self
            .growth
            .lock()
            .map(|mut g| g.measure(rss, at, window))
            .unwrap_or(0);
        let now = Alarm {
            memory: rss.is_some_and(|r| memory_alarm(r, growth_per_ms, mem_limit, before.memory)),
            disk: disk_free.is_some_and(|f| f < disk_limit),
        };
        if now == before {
            return;
        }
        if now.memory != before.memory {
            if let Some(hook) = MEMORY_PRESSURE_HOOK.get() {
                hook(now.memory);
            }
            if now.memory {
                tracing::warn!(
                    rss = rss.unwrap_or(0),
                    limit = mem_limit,
                    "memory resource limit alarm set: publishers are blocked until memory falls"
                );
            } else {
                tracing::info!(
                    rss = rss.unwrap_or(0),
                    limit = mem_limit,
                    "memory resource limit alarm cleared"
                );
            }
        }
        if now.disk != before.disk {
            if now.disk {
                tracing::warn!(
                    free = disk_free.unwrap_or(0),
                    limit = disk_limit,
                    "disk resource limit alarm set: free disk space is low, publishers are blocked"
                );
            } else {
                tracing::info!(
                    free = disk_free.unwrap_or(0),
                    limit = disk_limit,
                    "disk resource limit alarm cleared"
                );
            }
        }
        if let Ok(mut l) = self.local.lock() {
            *l = now;
        }
        self.publish();
    }

    /// Measures until the runtime stops: resident memory of this process every
    /// [`CHECK_EVERY`] (every [`CHECK_CLOSE_EVERY`] from [`CLOSE_PERCENT`] of the watermark
    /// on), free space of the filesystem holding `data_dir` every [`DISK_EVERY`].
    pub fn spawn_monitor(self: &Arc<Self>, data_dir: PathBuf) {
        let me = self.clone();
        tokio::spawn(async move {
            let mut disk = None;
            let mut disk_at: Option<tokio::time::Instant> = None;
            loop {
                if disk_at.is_none_or(|t| t.elapsed() >= DISK_EVERY) {
                    disk_at = Some(tokio::time::Instant::now());
                    let dir = data_dir.clone();
                    disk = tokio::task::spawn_blocking(move || disk_free_bytes(&dir))
                        .await
                        .ok()
                        .flatten();
                }
                let rss = rss_bytes();
                me.check(rss, disk);
                let close = rss.is_some_and(|r| {
                    u128::from(r) * 100 >= u128::from(me.limits().0) * u128::from(CLOSE_PERCENT)
                });
                tokio::time::sleep(if close {
                    CHECK_CLOSE_EVERY
                } else {
                    CHECK_EVERY
                })
                .await;
            }
        });
    }
}

/// Memory measurements for [`memory_alarm`]'s growth.
#[derive(Default)]
struct Growth {
    /// The last measurement (bytes) and when it was taken.
    last: Option<(u64, std::time::Instant)>,
    /// Growth rates (bytes per ms) of the last [`CLEAR_WINDOW`], by when measured.
    rates: std::collections::VecDeque<(std::time::Instant, u64)>,
}

impl Growth {
    /// Takes measurement `rss` (bytes, None: unmeasurable) at `at` and returns the fastest
    /// growth (bytes per ms) measured within `window` of `at`.
    fn measure(&mut self, rss: Option<u64>, at: std::time::Instant, window: Duration) -> u64 {
        if let (Some(r), Some((l, t))) = (rss, self.last) {
            let ms = at.saturating_duration_since(t).as_millis().max(1) as u64;
            let rate = r.saturating_sub(l) / ms;
            if rate > 0 {
                self.rates.push_back((at, rate));
            }
        }
        self.last = rss.map(|r| (r, at));
        while self
            .rates
            .front()
            .is_some_and(|(t, _)| at.saturating_duration_since(*t) > CLEAR_WINDOW)
        {
            self.rates.pop_front();
        }
        self.rates
            .iter()
            .filter(|(t, _)| at.saturating_duration_since(*t) <= window)
            .map(|(_, r)| *r)
            .max()
            .unwrap_or(0)
    }
}

/// Resident memory of this process in bytes (`VmRSS` of /proc/self/status), if readable.
pub fn rss_bytes() -> Option<u64> {
    proc_kib("/proc/self/status", "VmRSS:")
}

/// Total memory of the machine in bytes (`MemTotal` of /proc/meminfo), if readable.
pub fn total_memory_bytes() -> Option<u64> {
    proc_kib("/proc/meminfo", "MemTotal:")
}

/// Bytes available to this user on the filesystem holding `dir`, if measurable.
pub fn disk_free_bytes(dir: &Path) -> Option<u64> {
    fs2::available_space(dir).ok()
}

/// A `key: N kB` line of a /proc file, in bytes.
fn proc_kib(path: &str, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    let line = text.lines().find(|l| l.starts_with(key))?;
    let kib: u64 = line[key.len()..].split_whitespace().next()?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alarms_rise_and_clear_with_the_measurements() {
        let a = Alarms::new(1000, 500);
        let mut rx = a.subscribe();
        a.check(Some(999), Some(500));
        assert_eq!(a.current(), Alarm::default());
        assert!(!rx.has_changed().unwrap());
        a.check(Some(1000), Some(500));
        assert_eq!(a.current().reason(), "low on memory");
        assert!(rx.has_changed().unwrap());
        rx.mark_unchanged();
        a.check(Some(1000), Some(499));
        assert_eq!(a.current().reason(), "low on memory & low on disk");
        a.check(Some(10), Some(499));
        assert_eq!(a.current().reason(), "low on disk");
        a.check(None, None);
        assert!(!a.current().any(), "nothing measurable raises nothing");
    }

    #[test]
    fn fast_growth_raises_the_memory_alarm_before_the_watermark() {
        // At the watermark, whatever the growth (RabbitMQ's rule).
        assert!(memory_alarm(1000, 0, 1000, false));
        // Below it: when LOOKAHEAD_MS of the growth would reach it.
        assert!(!memory_alarm(999, 0, 1000, false), "not growing");
        let per_ms = 100 / LOOKAHEAD_MS;
        assert!(!memory_alarm(899, per_ms, 1000, false), "899 + 100 < 1000");
        assert!(memory_alarm(900, per_ms, 1000, false), "900 + 100 = 1000");
        assert!(
            memory_alarm(u64::MAX - 1, u64::MAX, u64::MAX, false),
            "saturates"
        );
    }

    #[test]
    fn a_raised_memory_alarm_clears_under_the_margin_only() {
        let limit = 10_000;
        let margin = limit / 100 * CLEAR_MARGIN_PERCENT;
        assert!(
            memory_alarm(limit - margin, 0, limit, true),
            "within the margin: stays on"
        );
        assert!(
            !memory_alarm(limit - margin, 0, limit, false),
            "but does not rise there"
        );
        assert!(
            !memory_alarm(limit - margin - 1, 0, limit, true),
            "under it: clears"
        );
        assert!(
            memory_alarm(limit - margin - 1, 1, limit, true),
            "unless growing back"
        );
    }

    #[test]
    fn a_fast_climb_raises_the_alarm_which_holds_until_memory_held_still_or_fell() {
        let a = Alarms::new(100_000, 0);
        let t = std::time::Instant::now();
        let ms = |n| t + Duration::from_millis(n);
        a.check_at(Some(50_000), None, ms(0));
        // 100 bytes per ms: 51,000 + 100 × LOOKAHEAD_MS stays under 100,000.
        a.check_at(Some(51_000), None, ms(10));
        assert!(!a.current().memory);
        // 1,000 bytes per ms: 61,000 + 1,000 × LOOKAHEAD_MS passes it.
        a.check_at(Some(61_000), None, ms(20));
        assert!(
            a.current().memory,
            "blocked while still under the watermark"
        );
        // Memory pauses: the growth of the last CLEAR_WINDOW still counts.
        a.check_at(Some(61_000), None, ms(30));
        assert!(a.current().memory, "not released at the first pause");
        a.check_at(Some(61_000), None, ms(5_000));
        assert!(a.current().memory);
        // Held still for CLEAR_WINDOW, well under the watermark: released.
        a.check_at(Some(61_000), None, ms(10_100));
        assert!(!a.current().memory, "cleared");
        // Off again, only the last RAISE_WINDOW's growth counts.
        a.check_at(Some(62_000), None, ms(12_100));
        assert!(!a.current().memory, "1 byte per ms");
    }

    #[test]
    fn growth_is_the_fastest_of_its_window() {
        let mut g = Growth::default();
        let t = std::time::Instant::now();
        let ms = |n| t + Duration::from_millis(n);
        assert_eq!(
            g.measure(Some(1_000), ms(0), RAISE_WINDOW),
            0,
            "first measurement"
        );
        assert_eq!(g.measure(Some(3_000), ms(10), RAISE_WINDOW), 200);
        assert_eq!(
            g.measure(Some(2_000), ms(20), RAISE_WINDOW),
            200,
            "falling adds nothing"
        );
        assert_eq!(
            g.measure(Some(2_000), ms(1_500), RAISE_WINDOW),
            0,
            "out of the window"
        );
        assert_eq!(
            g.measure(Some(2_000), ms(1_600), CLEAR_WINDOW),
            200,
            "still in the longer one"
        );
        assert_eq!(
            g.measure(None, ms(1_700), CLEAR_WINDOW),
            200,
            "unmeasurable"
        );
        assert_eq!(
            g.measure(Some(9_000), ms(1_800), CLEAR_WINDOW),
            200,
            "no last measurement"
        );
    }

    #[test]
    fn a_peer_alarm_blocks_here_until_it_clears_or_the_peer_goes() {
        let a = Alarms::new(1000, 500);
        let disk = Alarm {
            memory: false,
            disk: true,
        };
        a.set_remote(2, disk);
        assert_eq!(a.current(), disk);
        assert!(!a.local().any(), "beats carry only this node's own alarms");
        a.check(Some(2000), Some(1000));
        assert_eq!(a.current().reason(), "low on memory & low on disk");
        a.set_remote(2, Alarm::default());
        assert_eq!(a.current().reason(), "low on memory");
        a.check(Some(1), Some(1000));
        assert!(!a.current().any());
    }

    #[test]
    fn this_process_and_machine_are_measurable() {
        assert!(rss_bytes().is_some_and(|r| r > 0));
        assert!(total_memory_bytes().is_some_and(|t| t > rss_bytes().unwrap()));
        assert!(disk_free_bytes(Path::new(".")).is_some());
    }
}
