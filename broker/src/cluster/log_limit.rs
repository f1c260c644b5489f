//! Rate-limited logging: a condition that repeats (a lagging member, a node
//! that is down, a group not open yet) is logged a few times, then counted
//! and summarised, so a node never logs faster than [`BURST`] lines per
//! [`WINDOW`] from one place in the code (one tracing callsite: openraft's
//! "error replication to target", our transport's warnings, ...), however
//! many groups hit it. At 10,000 queues anything logged per group per retry
//! was a storm (issue 31: 23.6 million lines in 9 minutes).
//!
//! [`RateLimit`] is a `tracing_subscriber` per-layer filter: events past the
//! burst of their callsite's window are dropped and counted; once a window
//! ends with drops, one summary line goes to stderr ("12345 more lines like
//! 'error replication to target' (openraft::replication, WARN) suppressed in
//! the last 5 s"), written by a background thread every [`SUMMARY_EVERY`].

use std::collections::HashMap;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tracing::callsite::Identifier;
use tracing::{Event, Metadata};
use tracing_subscriber::layer::{Context, Filter};

/// Lines one callsite may log per [`WINDOW`].
pub const BURST: u32 = 5;
/// The window of [`BURST`].
pub const WINDOW: Duration = Duration::from_secs(1);
/// How often suppressed counts are summarised (at most one line per
/// callsite per period).
pub const SUMMARY_EVERY: Duration = Duration::from_secs(5);

struct Bucket {
    meta: &'static Metadata<'static>,
    window_start: Instant,
    in_window: u32,
    /// Dropped since the last summary.
    suppressed: u64,
}

#[derive(Default)]
struct State {
    buckets: HashMap<Identifier, Bucket>,
}

/// The per-callsite limiter (see the module docs). Cheap to clone.
#[derive(Clone, Default)]
pub struct RateLimit {
    state: Arc<Mutex<State>>,
}

impl RateLimit {
    /// A limiter whose summaries a background thread writes to stderr every
    /// [`SUMMARY_EVERY`] (the thread ends with the process).
    pub fn with_summaries() -> RateLimit {
        let limit = RateLimit::default();
        let weak = Arc::downgrade(&limit.state);
        let spawned = std::thread::Builder::new()
            .name("log-limit".into())
            .spawn(move || loop {
                std::thread::sleep(SUMMARY_EVERY);
                let Some(state) = weak.upgrade() else { return };
                let lines = summaries(&state, SUMMARY_EVERY);
                drop(state);
                if !lines.is_empty() {
                    let mut err = std::io::stderr().lock();
                    for l in lines {
                        let _ = writeln!(err, "{l}");
                    }
                }
            });
        if let Err(e) = spawned {
            eprintln!("log-limit: no summary thread ({e}); suppressed lines are not summarised");
        }
        limit
    }

    /// True when an event of `meta` may be logged now (and counts it).
    pub fn admit(&self, meta: &'static Metadata<'static>, now: Instant) -> bool {
        let Ok(mut s) = self.state.lock() else {
            return true;
        };
        let b = s.buckets.entry(meta.callsite()).or_insert_with(|| Bucket {
            meta,
            window_start: now,
            in_window: 0,
            suppressed: 0,
        });
        if now.duration_since(b.window_start) >= WINDOW {
            b.window_start = now;
            b.in_window = 0;
        }
        if b.in_window < BURST {
            b.in_window += 1;
            true
        } else {
            b.suppressed += 1;
            false
        }
    }

    /// The summary lines of what was dropped since the last call (and
    /// resets the counts); `period` names the span in the text.
    pub fn take_summaries(&self, period: Duration) -> Vec<String> {
        summaries(&self.state, period)
    }
}

fn summaries(state: &Mutex<State>, period: Duration) -> Vec<String> {
    let Ok(mut s) = state.lock() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for b in s.buckets.values_mut() {
        if b.suppressed > 0 {
            out.push(format!(
                "{} WARN log_limit: {} more {} lines from {} ({}:{}) suppressed in the last {} s",
                now_rfc3339(),
                b.suppressed,
                b.meta.level(),
                b.meta.target(),
                short_path(b.meta.file().unwrap_or("?")),
                b.meta.line().unwrap_or(0),
                period.as_secs()
            ));
            b.suppressed = 0;
        }
    }
    // Callsites quiet for a while are forgotten (a bounded table).
    let now = Instant::now();
    s.buckets
        .retain(|_, b| now.duration_since(b.window_start) < Duration::from_secs(60));
    out
}

/// A source path from its crate directory on (`openraft-0.9.25/src/...`):
/// dependencies' paths start with the cargo registry's.
fn short_path(file: &str) -> &str {
    match file.rfind("/src/") {
        Some(i) => {
            let start = file[..i].rfind('/').map_or(0, |j| j + 1);
            &file[start..]
        }
        None => file,
    }
}

/// Wall-clock time as tracing's default format prints it (UTC, µs).
fn now_rfc3339() -> String {
    crate::utc::rfc3339_micros(std::time::SystemTime::now())
}

impl<S> Filter<S> for RateLimit {
    fn enabled(&self, _meta: &Metadata<'_>, _cx: &Context<'_, S>) -> bool {
        true
    }

    fn event_enabled(&self, event: &Event<'_>, _cx: &Context<'_, S>) -> bool {
        self.admit(event.metadata(), Instant::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_callsite_logs_its_burst_per_window_and_the_rest_is_summarised() {
        let limit = RateLimit::default();
        static CS: tracing::callsite::DefaultCallsite =
            tracing::callsite::DefaultCallsite::new(&META);
        static META: Metadata<'static> = tracing::metadata!(
            name: "replication error",
            target: "openraft::replication",
            level: tracing::Level::WARN,
            fields: &[],
            callsite: &CS,
            kind: tracing::metadata::Kind::EVENT,
        );
        let t0 = Instant::now();
        let admitted = (0..1000).filter(|_| limit.admit(&META, t0)).count();
        assert_eq!(admitted, BURST as usize);
        let lines = limit.take_summaries(SUMMARY_EVERY);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].contains("995 more WARN lines from openraft::replication"),
            "{lines:?}"
        );
        assert!(
            limit.take_summaries(SUMMARY_EVERY).is_empty(),
            "counts reset"
        );
        // The next window admits a new burst.
        let t1 = t0 + WINDOW;
        let admitted = (0..10).filter(|_| limit.admit(&META, t1)).count();
        assert_eq!(admitted, BURST as usize);
    }

    #[test]
    fn short_paths_start_at_the_crate() {
        assert_eq!(
            short_path("/root/.cargo/registry/src/index.crates.io-1/openraft-0.9.25/src/replication/mod.rs"),
            "openraft-0.9.25/src/replication/mod.rs"
        );
        assert_eq!(
            short_path("broker/src/cluster/x.rs"),
            "broker/src/cluster/x.rs"
        );
    }
}
