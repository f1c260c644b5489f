//! A queue as the rest of the node sees it: propose commands, read counts.
//! Quorum queues propose through their Raft group; a proposer task batches
//! whatever arrived meanwhile into one `Batch` entry (group commit: one log
//! append and one flush for many publishes and acks). Local queues apply
//! directly under their lock.

use std::sync::{Arc, Mutex};

use raft_log::BusyHint;
use tokio::sync::{mpsc, oneshot};

use super::host::{QueueContext, QueueHost};
use super::types::{QueueCommand, QueueReply};
use super::QueueMachine;
use crate::cluster::types::{GroupCommand, GroupReply, Origin, Raft};

/// Most commands folded into one Raft entry.
const MAX_BATCH: usize = 1024;
/// Proposals waiting for the proposer before `propose` applies backpressure.
const QUEUE_DEPTH: usize = 8192;

/// Why a proposal failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum QueueError {
    /// The queue's group is shut down (queue deleted or node stopping).
    #[error("queue is unavailable")]
    Unavailable,
    /// Raft refused or lost the write (e.g. leadership lost).
    #[error("raft write failed: {0}")]
    Raft(String),
}

/// A reply that will arrive once the command is committed and applied.
pub type PendingReply = oneshot::Receiver<Result<QueueReply, QueueError>>;

struct Proposal {
    cmd: QueueCommand,
    reply: oneshot::Sender<Result<QueueReply, QueueError>>,
}

enum Backend {
    Raft {
        raft: Raft,
        tx: mpsc::Sender<Proposal>,
    },
    Local,
}

/// Handle to one queue on this node.
pub struct QueueHandle {
    /// Group id (fresh per queue incarnation).
    pub group: u64,
    /// vhost of the queue.
    pub vhost: String,
    /// Queue name.
    pub name: String,
    host: Arc<Mutex<QueueHost>>,
    ctx: Arc<QueueContext>,
    backend: Backend,
    usage: Mutex<ConsumerUse>,
}

impl QueueHandle {
    /// A quorum queue over a started Raft group; spawns its proposer.
    pub fn raft(
        vhost: String,
        name: String,
        raft: Raft,
        host: Arc<Mutex<QueueHost>>,
        ctx: Arc<QueueContext>,
        origin: Origin,
        busy: BusyHint,
    ) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE_DEPTH);
        tokio::spawn(run_proposer(raft.clone(), rx, origin, busy));
        QueueHandle {
            group: ctx.group,
            vhost,
            name,
            host,
            ctx,
            backend: Backend::Raft { raft, tx },
            usage: Mutex::default(),
        }
    }

    /// A local (non-replicated) queue.
    pub fn local(
        vhost: String,
        name: String,
        host: Arc<Mutex<QueueHost>>,
        ctx: Arc<QueueContext>,
    ) -> Self {
        QueueHandle {
            group: ctx.group,
            vhost,
            name,
            host,
            ctx,
            backend: Backend::Local,
            usage: Mutex::default(),
        }
    }

    /// True for a Raft-replicated quorum queue.
    pub fn is_quorum(&self) -> bool {
        matches!(self.backend, Backend::Raft { .. })
    }

    /// The queue's shared context (leader effects, consumers).
    pub fn context(&self) -> &Arc<QueueContext> {
        &self.ctx
    }

    /// Queues a command; commands proposed through one handle are applied in
    /// the order `propose` was called. Waits only for room in the proposer.
    pub async fn propose(&self, cmd: QueueCommand) -> PendingReply {
        let (reply, rx) = oneshot::channel();
        match &self.backend {
            Backend::Raft { tx, .. } => {
                if let Err(mpsc::error::SendError(p)) = tx.send(Proposal { cmd, reply }).await {
                    let _ = p.reply.send(Err(QueueError::Unavailable));
                }
            }
            Backend::Local => {
                let r = match self.host.lock() {
                    Ok(mut h) => Ok(h.apply(cmd, true)),
                    Err(_) => Err(QueueError::Unavailable),
                };
                let _ = reply.send(r);
            }
        }
        rx
    }

    /// Proposes and waits for the reply.
    pub async fn call(&self, cmd: QueueCommand) -> Result<QueueReply, QueueError> {
        self.propose(cmd)
            .await
            .await
            .unwrap_or(Err(QueueError::Unavailable))
    }

    /// Reads the local replica's machine.
    pub fn read<R>(&self, f: impl FnOnce(&QueueHost) -> R) -> Option<R> {
        self.host.lock().ok().map(|h| f(&h))
    }

    /// Ready, unacked and consumer counts from the local replica.
    pub fn counts(&self) -> (u64, u64, u64) {
        self.read(|h| {
            let m: &QueueMachine = h.machine();
            (m.ready_count(), m.unacked_count(), m.consumer_count())
        })
        .unwrap_or_default()
    }

    /// Stops the group (queue deleted or node stopping).
    pub async fn shutdown(&self) {
        self.ctx
            .closed
            .store(true, std::sync::atomic::Ordering::Release);
        if let Backend::Raft { raft, .. } = &self.backend {
            if let Err(e) = raft.shutdown().await {
                tracing::warn!(group = self.group, error = %e, "raft shutdown failed");
            }
        }
    }
}

/// Raft writes a queue's proposer keeps in flight. With one, a batch waits for the previous
/// batch's apply and reply; with two, the next batch's log append overlaps with them. (Measured
/// on the 2-core VM: 1 and 2 within run-to-run noise; 4 was slower — smaller batches, more
/// syncs per message.) Replies still arrive in log order.
const PIPELINE_DEPTH: usize = 2;

type Replies = Vec<oneshot::Sender<Result<QueueReply, QueueError>>>;

async fn run_proposer(
    raft: Raft,
    mut rx: mpsc::Receiver<Proposal>,
    origin: Origin,
    busy: BusyHint,
) {
    use futures::stream::{FuturesOrdered, StreamExt};
    let mut batch: Vec<Proposal> = Vec::with_capacity(64);
    let mut inflight = FuturesOrdered::new();
    let mut open = true;
    while open || !inflight.is_empty() {
        tokio::select! {
            Some((result, replies)) = inflight.next(), if !inflight.is_empty() => {
                deliver(result, replies);
            }
            first = rx.recv(), if open && inflight.len() < PIPELINE_DEPTH => {
                let Some(first) = first else {
                    open = false;
                    continue;
                };
                batch.push(first);
                while batch.len() < MAX_BATCH {
                    match rx.try_recv() {
                        Ok(p) => batch.push(p),
                        Err(_) => break,
                    }
                }
                if batch.len() > 1 {
                    // Commands queued up while earlier writes were in flight.
                    busy.note();
                }
                let (cmds, replies): (Vec<_>, Replies) =
                    batch.drain(..).map(|p| (p.cmd, p.reply)).unzip();
                let cmd = if cmds.len() == 1 {
                    cmds.into_iter().next().unwrap_or(QueueCommand::Batch(Vec::new()))
                } else {
                    QueueCommand::Batch(cmds)
                };
                let n = replies.len();
                let started = std::time::Instant::now();
                let submitted = raft.client_write_ff(GroupCommand::Queue { origin, cmd }).await;
                inflight.push_back(async move {
                    let result = match submitted {
                        Ok(rx) => match rx.await {
                            Ok(Ok(resp)) => Ok(resp.data),
                            Ok(Err(e)) => Err(e.to_string()),
                            Err(_) => Err("raft dropped the write".to_string()),
                        },
                        Err(e) => Err(e.to_string()),
                    };
                    tracing::trace!(
                        commands = n,
                        elapsed_us = started.elapsed().as_micros() as u64,
                        "raft write"
                    );
                    (result, replies)
                });
            }
        }
    }
}

/// Hand each proposal of one batch its reply (or the batch's error).
fn deliver(result: Result<GroupReply, String>, replies: Replies) {
    match result {
        Ok(data) => {
            let reply = match data {
                GroupReply::Queue(r) => r,
                _ => QueueReply::Ok,
            };
            if replies.len() == 1 {
                if let Some(tx) = replies.into_iter().next() {
                    let _ = tx.send(Ok(reply));
                }
            } else if let QueueReply::Batch(rs) = reply {
                for (tx, r) in replies.into_iter().zip(rs) {
                    let _ = tx.send(Ok(r));
                }
            } else {
                for tx in replies {
                    let _ = tx.send(Err(QueueError::Raft("unexpected batch reply".into())));
                }
            }
        }
        Err(msg) => {
            for tx in replies {
                let _ = tx.send(Err(QueueError::Raft(msg.clone())));
            }
        }
    }
}

/// Node-local consumer bookkeeping of a queue: exclusive consumers
/// (basic.consume exclusive=true) and auto-delete.
#[derive(Debug, Default)]
pub struct ConsumerUse {
    /// Active consumers attached through this node.
    pub count: usize,
    /// One of them is exclusive.
    pub exclusive: bool,
    /// The queue has had a consumer (auto-delete fires only after one).
    pub had_consumer: bool,
}

impl QueueHandle {
    /// Registers a consumer; false if that breaks exclusivity
    /// (403 ACCESS_REFUSED "in exclusive use").
    pub fn try_add_consumer(&self, exclusive: bool) -> bool {
        let Ok(mut u) = self.usage.lock() else {
            return false;
        };
        if u.exclusive || (exclusive && u.count > 0) {
            return false;
        }
        u.count += 1;
        u.exclusive = exclusive;
        u.had_consumer = true;
        true
    }

    /// A consumer left (cancel, channel or connection closed).
    pub fn remove_consumer(&self, exclusive: bool) {
        if let Ok(mut u) = self.usage.lock() {
            u.count = u.count.saturating_sub(1);
            if exclusive {
                u.exclusive = false;
            }
        }
    }

    /// True when an auto-delete queue has lost its last consumer.
    pub fn unused_after_consumers(&self) -> bool {
        self.usage
            .lock()
            .map(|u| u.had_consumer && u.count == 0)
            .unwrap_or(false)
    }
}
