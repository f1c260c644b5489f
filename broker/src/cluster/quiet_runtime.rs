//! openraft's async runtime for quorumq's groups: tokio, except that the tick
//! task of a quiescent group (a queue group, `enable_tick: false`, never
//! switched on) sleeps an hour between wakeups instead of 1.5 ×
//! `heartbeat_interval`. openraft 0.9 runs that task in every group even with
//! ticks off, where each wakeup does nothing but sleep again: at 10,000 queue
//! replicas a node woke 67,000 times a second for nothing, a cost that grew
//! with every queue declared (issue 31).
//!
//! How the tick task is told apart: it is the only caller of
//! [`AsyncRuntime::sleep_until`] in openraft 0.9.25 (`core/tick.rs`; the
//! rest of openraft uses `sleep` and timeouts), and a group's tasks are
//! spawned while `Raft::new` is polled, which [`quiescent`] marks. Shutdown is
//! unaffected: the tick task also waits on its cancel signal.

use std::future::Future;
use std::time::Duration;

use openraft::{AsyncRuntime, OptionalSend, TokioRuntime};

/// How long a quiescent group's tick task sleeps between its no-op wakeups.
pub const QUIET_TICK: Duration = Duration::from_secs(3600);

tokio::task_local! {
    /// Set while a quiescent group's `Raft::new` is polled ([`quiescent`]).
    static CREATING_QUIET: ();
    /// Set in the tasks that `Raft::new` of a quiescent group spawned.
    static QUIET: ();
}

/// Runs `raft_new` (a queue group's `Raft::new`) so that the group's tick
/// task sleeps [`QUIET_TICK`] at a time. Only for groups whose ticks stay
/// off (`enable_tick: false`, never switched on at runtime).
pub async fn quiescent<F: Future>(raft_new: F) -> F::Output {
    CREATING_QUIET.scope((), raft_new).await
}

/// True inside a task spawned by a quiescent group's `Raft::new`.
fn in_quiet_task() -> bool {
    QUIET.try_with(|_| ()).is_ok()
}

/// [`TokioRuntime`] with quiet tick tasks for quiescent groups (see the module).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct QuietRuntime;

type Tokio = TokioRuntime;

impl AsyncRuntime for QuietRuntime {
    type JoinError = <Tokio as AsyncRuntime>::JoinError;
    type JoinHandle<T: OptionalSend + 'static> = <Tokio as AsyncRuntime>::JoinHandle<T>;
    type Sleep = <Tokio as AsyncRuntime>::Sleep;
    type Instant = <Tokio as AsyncRuntime>::Instant;
    type TimeoutError = <Tokio as AsyncRuntime>::TimeoutError;
    type Timeout<R, T: Future<Output = R> + OptionalSend> = <Tokio as AsyncRuntime>::Timeout<R, T>;
    type ThreadLocalRng = <Tokio as AsyncRuntime>::ThreadLocalRng;
    type OneshotSender<T: OptionalSend> = <Tokio as AsyncRuntime>::OneshotSender<T>;
    type OneshotReceiverError = <Tokio as AsyncRuntime>::OneshotReceiverError;
    type OneshotReceiver<T: OptionalSend> = <Tokio as AsyncRuntime>::OneshotReceiver<T>;

    fn spawn<T>(future: T) -> Self::JoinHandle<T::Output>
    where
        T: Future + OptionalSend + 'static,
        T::Output: OptionalSend + 'static,
    {
        if CREATING_QUIET.try_with(|_| ()).is_ok() {
            tokio::spawn(QUIET.scope((), future))
        } else {
            tokio::spawn(future)
        }
    }

    fn sleep(duration: Duration) -> Self::Sleep {
        Tokio::sleep(duration)
    }

    fn sleep_until(deadline: Self::Instant) -> Self::Sleep {
        if in_quiet_task() {
            Tokio::sleep_until(deadline + QUIET_TICK)
        } else {
            Tokio::sleep_until(deadline)
        }
    }

    fn timeout<R, F: Future<Output = R> + OptionalSend>(
        duration: Duration,
        future: F,
    ) -> Self::Timeout<R, F> {
        Tokio::timeout(duration, future)
    }

    fn timeout_at<R, F: Future<Output = R> + OptionalSend>(
        deadline: Self::Instant,
        future: F,
    ) -> Self::Timeout<R, F> {
        Tokio::timeout_at(deadline, future)
    }

    fn is_panic(join_error: &Self::JoinError) -> bool {
        Tokio::is_panic(join_error)
    }

    fn thread_rng() -> Self::ThreadLocalRng {
        Tokio::thread_rng()
    }

    fn oneshot<T>() -> (Self::OneshotSender<T>, Self::OneshotReceiver<T>)
    where
        T: OptionalSend,
    {
        Tokio::oneshot()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tasks spawned while a quiescent group is created sleep until an hour
    /// past the deadline they ask for; every other task keeps its deadline.
    #[tokio::test]
    // The creations below return a task's JoinHandle on purpose: the task is what is tested.
    #[allow(clippy::async_yields_async)]
    async fn only_tasks_spawned_by_a_quiescent_creation_sleep_long() {
        let deadline = tokio::time::Instant::now() + Duration::from_millis(150);
        let asked = |d| async move { QuietRuntime::sleep_until(d).deadline() };
        let quiet = quiescent(async { QuietRuntime::spawn(asked(deadline)) })
            .await
            .await
            .unwrap();
        assert_eq!(quiet, deadline + QUIET_TICK);
        let normal = QuietRuntime::spawn(asked(deadline)).await.unwrap();
        assert_eq!(normal, deadline);
        // Inside the creating task itself (not a spawned one): normal.
        let direct = quiescent(asked(deadline)).await;
        assert_eq!(direct, deadline);
        // A task spawned by a quiet task is not quiet (openraft's core spawns
        // replication and snapshot tasks later).
        let nested = quiescent(async {
            QuietRuntime::spawn(async move { QuietRuntime::spawn(asked(deadline)).await })
        })
        .await
        .await
        .unwrap()
        .unwrap();
        assert_eq!(nested, deadline);
    }
}
