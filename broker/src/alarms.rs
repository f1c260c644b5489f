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
//! Memory is measured every 100 ms and disk every second (RabbitMQ: memory every 2.5 s, disk
//! every 10 s or faster when close to the limit): a fast publisher (~100 MB/s here) overshoots
//! the watermark by at most one interval's worth.

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
/// Disk free space is measured every this many memory checks (1 s).
const DISK_EVERY: u32 = 10;

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
    /// RabbitMQ logs them). `rss`/`disk_free`: bytes, `None` when unmeasurable (no alarm).
    pub fn check(&self, rss: Option<u64>, disk_free: Option<u64>) {
        let (mem_limit, disk_limit) = self.limits();
        let now = Alarm {
            memory: rss.is_some_and(|r| r >= mem_limit),
            disk: disk_free.is_some_and(|f| f < disk_limit),
        };
        let before = self.local();
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
    /// [`CHECK_EVERY`], free space of the filesystem holding `data_dir` every [`DISK_EVERY`]
    /// of those.
    pub fn spawn_monitor(self: &Arc<Self>, data_dir: PathBuf) {
        let me = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(CHECK_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut disk = None;
            for n in 0u32.. {
                tick.tick().await;
                if n % DISK_EVERY == 0 {
                    let dir = data_dir.clone();
                    disk = tokio::task::spawn_blocking(move || disk_free_bytes(&dir))
                        .await
                        .ok()
                        .flatten();
                }
                me.check(rss_bytes(), disk);
            }
        });
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
