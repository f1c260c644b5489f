//! Restarting a queue's background task after a panic. A panic in a
//! per-queue task (the leader runtime: expiry timers, x-expires, at-most-once
//! dead-lettering; the at-least-once dead-letter worker) used to end it
//! silently while the queue still took publishes: expiry and dead-lettering
//! for that queue stopped for good (issue 14). Now the panic is logged and
//! the task starts again after [`RESTART_DELAY`].

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures::FutureExt;

/// Pause before a panicked task starts again (a panic that repeats at once
/// costs one log line and one restart per pause, not a busy loop).
pub const RESTART_DELAY: Duration = Duration::from_millis(200);

/// Runs `make(restarts)` until one run returns; a run that panics is logged
/// (`what` and `queue` name the task) and started again, with `restarts` the
/// number of panics so far (a restarted task re-derives what it lost, e.g.
/// the runtime re-arms its expiry timer).
pub async fn supervise<F, Fut>(what: &'static str, queue: &str, mut make: F)
where
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = ()>,
{
    let mut restarts = 0u32;
    loop {
        match AssertUnwindSafe(make(restarts)).catch_unwind().await {
            Ok(()) => return,
            Err(panic) => {
                restarts = restarts.saturating_add(1);
                tracing::error!(
                    queue,
                    task = what,
                    panic = %panic_text(&panic),
                    restarts,
                    "queue task panicked; restarting it"
                );
                tokio::time::sleep(RESTART_DELAY).await;
            }
        }
    }
}

fn panic_text(panic: &Box<dyn Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-text panic".to_string()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    use super::supervise;

    #[tokio::test]
    async fn a_panicking_task_is_restarted_until_it_returns() {
        let runs = Arc::new(AtomicU32::new(0));
        let seen = runs.clone();
        supervise("test", "q", move |restarts| {
            let runs = seen.clone();
            async move {
                let n = runs.fetch_add(1, Ordering::SeqCst);
                assert_eq!(n, restarts, "each run is told how many panics came before");
                if n < 2 {
                    panic!("run {n} fails");
                }
            }
        })
        .await;
        assert_eq!(runs.load(Ordering::SeqCst), 3);
    }
}
