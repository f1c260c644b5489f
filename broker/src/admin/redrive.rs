//! Redrive (`quorumqctl redrive`, `POST /api/queues/{vhost}/{name}/redrive`):
//! moves the ready messages of a queue — typically a dead-letter queue —
//! back to the queue each one last died in, or to one destination, as SQS
//! `StartMessageMoveTask` and RabbitMQ's "move messages" (shovel) do.
//!
//! Runs on the queue's leader (another node forwards the request once, as
//! [`super::inspect::queue_read`] does). It walks the ready messages once,
//! in delivery order, from the ids ready when it starts (messages arriving
//! later are not moved; skipped ones are not looked at again), in batches:
//! 1. the batch's bodies are read from the leader's body store;
//! 2. each message is enqueued directly into its destination queue (not
//!    republished through an exchange), keeping its stored bytes, so the
//!    broker's death history goes with it and a second death counts on
//!    (x-death `count` 2); [`enqueue_committed`] waits for the destination's
//!    commit;
//! 3. only then are exactly the committed ids removed from the queue
//!    (`QueueCommand::Remove`).
//!
//! Nothing is removed before its copy is committed. The enqueue is
//! de-duplicated per (redriven queue, message id) in the destination, so a
//! lost reply retried, or a crash or leader change between 2 and 3 followed
//! by another redrive, does not enqueue a second copy (while the
//! destination's window still holds the id: `queue/dedup.rs`). A message a consumer has taken (unacknowledged)
//! when its batch is read is skipped; one taken between that read and the
//! removal may end up in both places.
//!
//! Skipped messages stay in the queue, counted by reason ([`Skip`]).
//!
//! **A leader change mid-way is followed.** The node the caller asked keeps
//! the redrive going: when the queue's leader (this node or the one it
//! forwarded to) stops leading or dies, it waits for the new leader (up to
//! [`RETRY_FOR`]) and continues there with what is left of `max`. The new
//! walk starts from the ids ready then. Thanks to the de-duplicated enqueue
//! the batch in flight is not enqueued twice; `moved` may under-count by
//! the batches whose progress the dead leader never reported (each message
//! is still in exactly one place), and `skipped` is the last walk's.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use amq_protocol::protocol::basic;
use quorumq_proto::v1::{JsonReply, RedriveRequest};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::inspect::{from_reply, ReadError, ReadResult};
use crate::cluster::membership::admin_client;
use crate::dead_letter::summary::last_death;
use crate::message::TrackedMessage;
use crate::meta::QueueKind;
use crate::queue::handle::QueueHandle;
use crate::queue::registry::Queues;
use crate::queue::types::{
    EnqueueMsg, EnqueueOutcome, MsgId, PrioritizedMsg, QueueCommand, QueueReply,
};

/// Messages moved per batch (at most; a paced redrive uses smaller ones).
/// Also the most a crash mid-batch can duplicate.
pub const BATCH: usize = 256;
/// How long one enqueue or removal may keep retrying (leader elections of
/// the destination or of the queue) before the redrive stops with an error.
const RETRY_FOR: Duration = Duration::from_secs(60);
/// One attempt's wait for a commit.
const ATTEMPT: Duration = Duration::from_secs(10);
/// Progress documents are sent at most this often.
const PROGRESS_EVERY: Duration = Duration::from_millis(250);

/// What the caller asked: destination, bound, pace.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Options {
    /// Destination queue (same vhost); None = each message's last death queue.
    pub to: Option<String>,
    /// Move at most this many messages; None = every ready message.
    pub max: Option<u64>,
    /// Messages per second; None = as fast as the destinations commit.
    pub rate: Option<f64>,
}

impl Options {
    /// Errors (400): a rate that is not a positive finite number, an empty `to`.
    pub fn validate(&self) -> Result<(), ReadError> {
        if let Some(r) = self.rate {
            if !(r.is_finite() && r > 0.0) {
                return Err(err(
                    400,
                    "rate must be a positive number of messages per second",
                ));
            }
        }
        if self.to.as_deref() == Some("") {
            return Err(err(400, "destination queue name must not be empty"));
        }
        Ok(())
    }
}

/// Why a message stayed in the queue (the keys of `skipped`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Skip {
    /// The queue it last died in does not exist (any more).
    SourceQueueNotFound,
    /// No death history (broker or `x-death`) and no `--to`.
    NoDeathHistory,
    /// It last died in the queue being redriven: moving it would be a no-op.
    DestinationIsThisQueue,
    /// The destination refused it (overflow `reject-publish`, over its limit).
    DestinationFull,
    /// Its stored body could not be decoded.
    Unreadable,
    /// A consumer took it (unacknowledged) since the redrive started.
    DeliveredToConsumer,
}

impl Skip {
    /// The reason as the summary names it.
    pub fn as_str(self) -> &'static str {
        match self {
            Skip::SourceQueueNotFound => "source_queue_not_found",
            Skip::NoDeathHistory => "no_death_history",
            Skip::DestinationIsThisQueue => "destination_is_this_queue",
            Skip::DestinationFull => "destination_full",
            Skip::Unreadable => "unreadable",
            Skip::DeliveredToConsumer => "delivered_to_consumer",
        }
    }

    /// Every reason.
    pub const ALL: [Skip; 6] = [
        Skip::SourceQueueNotFound,
        Skip::NoDeathHistory,
        Skip::DestinationIsThisQueue,
        Skip::DestinationFull,
        Skip::Unreadable,
        Skip::DeliveredToConsumer,
    ];

    /// The reason named `name` ([`Skip::as_str`]).
    pub fn from_name(name: &str) -> Option<Skip> {
        Skip::ALL.into_iter().find(|s| s.as_str() == name)
    }
}

/// The outcome so far: moved per destination, skipped per reason.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// Messages committed in their destination and removed from the queue.
    pub moved: u64,
    /// Moved messages per destination queue.
    pub by_destination: BTreeMap<String, u64>,
    /// Messages left in the queue, per [`Skip`] reason.
    pub skipped: BTreeMap<Skip, u64>,
}

impl Summary {
    /// The JSON document: `{"queue", "vhost", "moved", "by_destination",
    /// "skipped": {reason: n}, "elapsed_ms", "done"}`.
    pub fn to_json(&self, vhost: &str, queue: &str, elapsed: Duration, done: bool) -> Value {
        let skipped: serde_json::Map<String, Value> = self
            .skipped
            .iter()
            .map(|(k, v)| (k.as_str().to_string(), Value::from(*v)))
            .collect();
        json!({
            "queue": queue,
            "vhost": vhost,
            "moved": self.moved,
            "by_destination": self.by_destination,
            "skipped": skipped,
            "elapsed_ms": elapsed.as_millis() as u64,
            "done": done,
        })
    }

    fn skip(&mut self, why: Skip) {
        *self.skipped.entry(why).or_insert(0) += 1;
    }

    /// The summary of a [`Summary::to_json`] document (progress relayed from
    /// another node); unknown skip reasons are left out.
    pub fn from_json(doc: &Value) -> Summary {
        let count = |v: &Value| v.as_u64().unwrap_or(0);
        let by_destination = doc["by_destination"]
            .as_object()
            .map(|m| m.iter().map(|(k, v)| (k.clone(), count(v))).collect())
            .unwrap_or_default();
        let skipped = doc["skipped"]
            .as_object()
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| Skip::from_name(k).map(|s| (s, count(v))))
                    .collect()
            })
            .unwrap_or_default();
        Summary {
            moved: count(&doc["moved"]),
            by_destination,
            skipped,
        }
    }

    /// This summary (earlier walks) followed by `later`, a walk after a
    /// leader change: moves add up; skips are `later`'s (it looked at every
    /// message still there).
    pub fn then(&self, later: &Summary) -> Summary {
        let mut by_destination = self.by_destination.clone();
        for (d, n) in &later.by_destination {
            *by_destination.entry(d.clone()).or_insert(0) += n;
        }
        Summary {
            moved: self.moved + later.moved,
            by_destination,
            skipped: later.skipped.clone(),
        }
    }
}

fn err(status: u16, text: impl Into<String>) -> ReadError {
    ReadError {
        status,
        text: text.into(),
    }
}

/// Paces moves at `rate` messages per second (a token bucket holding one
/// batch): a batch of `n` goes when the schedule has room for its last
/// message; a redrive that fell behind (slow destination) does not burst
/// to catch up. None = unpaced.
struct Pacer {
    rate: Option<f64>,
    /// The schedule's origin.
    origin: tokio::time::Instant,
    /// Messages scheduled so far.
    sent: u64,
}

impl Pacer {
    fn new(rate: Option<f64>) -> Pacer {
        Pacer {
            rate,
            origin: tokio::time::Instant::now(),
            sent: 0,
        }
    }

    /// The batch size: about 10 batches per second when paced.
    fn batch(&self) -> usize {
        match self.rate {
            Some(r) => ((r / 10.0).round() as usize).clamp(1, BATCH),
            None => BATCH,
        }
    }

    /// Waits until `n` more messages may go.
    async fn wait(&mut self, n: usize) {
        let Some(rate) = self.rate else { return };
        self.sent += n as u64;
        let due = self.origin + Duration::from_secs_f64(self.sent as f64 / rate);
        let now = tokio::time::Instant::now();
        if due > now {
            tokio::time::sleep_until(due).await;
        } else {
            // Behind: move the schedule instead of bursting.
            self.origin += now - due;
        }
    }
}

/// Where progress goes: the latest summary, at most every [`PROGRESS_EVERY`].
pub type Progress = mpsc::Sender<Value>;

/// Redrives queue `vhost`/`name` on its leader: here when this node leads
/// it, else forwarded to the leader (`forwarded`: asked by another node,
/// walk here once and do not forward again). Progress documents go to
/// `progress` (if any); when its receiver is gone the redrive stops after
/// the batch in flight. A leader change mid-way is followed (module docs)
/// by the node the caller asked. Returns the summary ([`Summary::to_json`],
/// `done` true).
///
/// Errors: 400 (bad options, `to` = the queue itself), 404 "Target queue was
/// not found in virtual host '{vhost}'" (the queue or `to`), 503 (no
/// leader at the start, or a destination or the queue stayed unavailable
/// for [`RETRY_FOR`]: the text says how many were moved before).
pub async fn redrive(
    queues: &Arc<Queues>,
    vhost: &str,
    name: &str,
    opts: &Options,
    forwarded: bool,
    progress: Option<&Progress>,
) -> ReadResult {
    opts.validate()?;
    let not_found = || {
        err(
            404,
            format!("Target queue was not found in virtual host '{vhost}'"),
        )
    };
    // Declared through another node a moment ago: found after a catch-up.
    let rec = queues
        .find_record(vhost, name)
        .await
        .ok_or_else(not_found)?;
    if let Some(to) = &opts.to {
        if to == name {
            return Err(err(400, "cannot redrive a queue into itself"));
        }
        queues.find_queue(vhost, to).await.ok_or_else(not_found)?;
    }
    let started = Instant::now();
    let none = Summary::default();
    if forwarded {
        // The leader's side of a forwarded redrive: one walk, progress after
        // every batch (the asking node counts from it); a 503 makes the
        // asking node look for the new leader.
        let mut part = Summary::default();
        let h = match leader_of(queues, &rec) {
            Leader::Here(h) => h,
            _ => return Err(err(503, "the queue's leader moved; try again")),
        };
        let walk = Walk {
            earlier: &none,
            progress,
            every: Duration::ZERO,
        };
        run(queues, vhost, name, &h, opts, &walk, &mut part).await?;
        return Ok(part.to_json(vhost, name, started.elapsed(), true));
    }
    let mut earlier = Summary::default();
    // Set once a walk was interrupted: how long to keep looking for a leader.
    let mut give_up_at: Option<Instant> = None;
    loop {
        let left = Options {
            max: opts.max.map(|m| m.saturating_sub(earlier.moved)),
            ..opts.clone()
        };
        let walk = Walk {
            earlier: &earlier,
            progress,
            every: PROGRESS_EVERY,
        };
        let mut part = Summary::default();
        let outcome = match leader_of(queues, &rec) {
            Leader::Here(h) => run(queues, vhost, name, &h, &left, &walk, &mut part).await,
            Leader::Node(l) => forward(queues, l, vhost, name, &left, &walk, &mut part).await,
            Leader::Nowhere if give_up_at.is_none() => {
                return Err(err(
                    503,
                    format!("queue '{name}' in vhost '{vhost}' has no elected leader"),
                ))
            }
            Leader::Nowhere => Err(err(503, "no elected leader")),
        };
        let total = earlier.then(&part);
        match outcome {
            Ok(()) => return Ok(total.to_json(vhost, name, started.elapsed(), true)),
            Err(e) if e.status == 503 => {
                let now = Instant::now();
                if part.moved > 0 || give_up_at.is_none() {
                    give_up_at = Some(now + RETRY_FOR);
                }
                if give_up_at.is_some_and(|t| now >= t) {
                    return Err(stopped(&total, &e.text));
                }
                tracing::info!(vhost, queue = name, moved = total.moved, why = %e.text, "redrive interrupted; continuing on the queue's leader");
                earlier = total;
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(e) => {
                return Err(ReadError {
                    status: e.status,
                    ..stopped(&total, &e.text)
                })
            }
        }
    }
}

/// Where a queue's leader is, as this node sees it.
enum Leader {
    /// This node leads it (its handle).
    Here(Arc<QueueHandle>),
    /// Another node, alive as far as the failure detector knows.
    Node(u64),
    /// No leader known, or a leader that is down.
    Nowhere,
}

/// The leader of queue `rec` ([`Leader`]).
fn leader_of(queues: &Arc<Queues>, rec: &crate::meta::QueueRecord) -> Leader {
    let handle = queues.queue_by_group(rec.group_id);
    if let Some(h) = handle
        .as_ref()
        .filter(|h| h.has_replica() && h.is_local_leader())
    {
        return Leader::Here(h.clone());
    }
    let leader = match rec.kind {
        QueueKind::Local { node } => Some(node),
        QueueKind::Quorum => handle
            .as_ref()
            .and_then(|h| h.route())
            .and_then(|r| r.leader())
            .filter(|l| queues.detector().is_alive(*l)),
    };
    match leader {
        Some(l) if l != queues.node_id() => Leader::Node(l),
        _ => Leader::Nowhere,
    }
}

/// How one walk reports progress: the moves of earlier walks (added to its
/// own), where to, and how often (at most).
struct Walk<'a> {
    earlier: &'a Summary,
    progress: Option<&'a Progress>,
    every: Duration,
}

/// The admin request of a redrive.
pub fn request(vhost: &str, name: &str, opts: &Options, forwarded: bool) -> RedriveRequest {
    RedriveRequest {
        vhost: vhost.to_string(),
        queue: name.to_string(),
        to: opts.to.clone().unwrap_or_default(),
        max: opts.max,
        rate: opts.rate,
        forwarded,
    }
}

/// The options of an admin request.
pub fn options(r: &RedriveRequest) -> Options {
    Options {
        to: Some(r.to.clone()).filter(|t| !t.is_empty()),
        max: r.max,
        rate: r.rate,
    }
}

/// One streamed admin reply: a progress or final document, or the error.
pub fn to_reply(r: ReadResult) -> JsonReply {
    super::inspect::to_reply(r)
}

/// Asks node `to` (the leader) to walk the queue, relaying its progress
/// (added to `walk.earlier`); `part` follows the leader's own count.
///
/// Errors: the leader's error, or 503 when the call fails or ends without
/// a summary (the leader died or stopped leading); 499 when the caller
/// went away.
async fn forward(
    queues: &Arc<Queues>,
    to: u64,
    vhost: &str,
    name: &str,
    opts: &Options,
    walk: &Walk<'_>,
    part: &mut Summary,
) -> Result<(), ReadError> {
    let started = Instant::now();
    let mut client = admin_client(queues, to).map_err(|e| err(503, e))?;
    let mut stream = client
        .redrive(request(vhost, name, opts, true))
        .await
        .map_err(|e| err(503, format!("node {to}: {}", e.message())))?
        .into_inner();
    loop {
        let next = stream
            .message()
            .await
            .map_err(|e| err(503, format!("node {to}: {}", e.message())))?;
        let Some(reply) = next else {
            return Err(err(
                503,
                format!("node {to} ended the redrive without a summary"),
            ));
        };
        let doc = from_reply(reply)?;
        *part = Summary::from_json(&doc);
        if doc["done"] == Value::Bool(true) {
            return Ok(());
        }
        if let Some(p) = walk.progress {
            if p.is_closed() {
                // Dropping the stream cancels the call: the leader stops too.
                return Err(err(499, "the caller went away"));
            }
            let total = walk.earlier.then(part);
            let _ = p.try_send(total.to_json(vhost, name, started.elapsed(), false));
        }
    }
}

/// A message of the batch on its way: where it goes and what is enqueued.
struct Move {
    id: MsgId,
    msg: PrioritizedMsg,
}

/// One walk of the queue on this node, which leads it (`h`), counting into
/// `summary`. Ends early (Ok) when the caller went away.
///
/// Errors (503): the replica went away, this node stopped leading, or a
/// destination or the removal stayed unavailable for [`RETRY_FOR`].
async fn run(
    queues: &Arc<Queues>,
    vhost: &str,
    name: &str,
    h: &Arc<QueueHandle>,
    opts: &Options,
    walk: &Walk<'_>,
    summary: &mut Summary,
) -> Result<(), ReadError> {
    let started = Instant::now();
    let progress = walk.progress;
    let gone = || err(503, "the queue's replica is gone; try again");
    let max = opts.max.unwrap_or(u64::MAX);
    // The walk: the ids ready now, in delivery order. Skipped ids are never
    // looked at again; messages arriving later are not part of this redrive.
    let ids = h
        .read(|host| host.machine().ready_message_ids(usize::MAX))
        .ok_or_else(gone)?;
    let mut pacer = Pacer::new(opts.rate);
    let mut handles: HashMap<String, Option<Arc<QueueHandle>>> = HashMap::new();
    let mut last_progress = Instant::now();
    let mut cursor = 0;
    while cursor < ids.len() && summary.moved < max {
        if progress.is_some_and(|p| p.is_closed()) {
            break;
        }
        if !h.is_local_leader() {
            return Err(err(503, "this node no longer leads the queue"));
        }
        let room = usize::try_from(max - summary.moved).unwrap_or(usize::MAX);
        let take = pacer.batch().min(room);
        let end = (cursor + take).min(ids.len());
        let chunk = &ids[cursor..end];
        cursor = end;
        let bodies = h
            .read(|host| {
                let m = host.machine();
                chunk
                    .iter()
                    .map(|id| (*id, m.is_checked_out(*id), host.payload(*id)))
                    .collect::<Vec<_>>()
            })
            .ok_or_else(gone)?;
        // Per destination, in delivery order.
        let mut batches: BTreeMap<String, (Arc<QueueHandle>, Vec<Move>)> = BTreeMap::new();
        for (id, delivered, body) in bodies {
            // No body: settled since the walk started (consumed); nothing to move.
            let Some(body) = body else { continue };
            if delivered {
                summary.skip(Skip::DeliveredToConsumer);
                continue;
            }
            let (dest, msg) = match destination(name, opts, &body) {
                Ok(found) => found,
                Err(why) => {
                    summary.skip(why);
                    continue;
                }
            };
            // Once per destination and walk; a queue declared through
            // another node a moment ago is found after a catch-up.
            let dh = match handles.get(&dest) {
                Some(dh) => dh.clone(),
                None => {
                    let dh = queues.find_queue(vhost, &dest).await.map(|(_, h)| h);
                    handles.insert(dest.clone(), dh.clone());
                    dh
                }
            };
            let Some(dh) = dh else {
                summary.skip(Skip::SourceQueueNotFound);
                continue;
            };
            let msg = enqueue_msg(&dh, &body, &msg);
            let b = batches.entry(dest).or_insert_with(|| (dh, Vec::new()));
            b.1.push(Move { id, msg });
        }
        let n: usize = batches.values().map(|(_, m)| m.len()).sum();
        if n == 0 {
            continue;
        }
        pacer.wait(n).await;
        let mut committed: Vec<MsgId> = Vec::with_capacity(n);
        let mut moved: BTreeMap<String, u64> = BTreeMap::new();
        for (dest, (dh, moves)) in batches {
            let msgs = moves.iter().map(|m| (m.id, m.msg.clone())).collect();
            let outcomes = enqueue_committed(&dh, h.group, msgs)
                .await
                .map_err(|e| err(503, format!("queue '{dest}': {e}")))?;
            for (m, o) in moves.iter().zip(outcomes) {
                if o == EnqueueOutcome::Accepted {
                    committed.push(m.id);
                    *moved.entry(dest.clone()).or_insert(0) += 1;
                } else {
                    summary.skip(Skip::DestinationFull);
                }
            }
        }
        if !committed.is_empty() {
            remove_committed(h, committed)
                .await
                .map_err(|e| err(503, format!("removing from '{name}': {e}")))?;
        }
        let batch_moved: u64 = moved.values().sum();
        for (dest, k) in moved {
            *summary.by_destination.entry(dest).or_insert(0) += k;
        }
        summary.moved += batch_moved;
        crate::metrics::COUNTERS.redriven(vhost, name, batch_moved);
        if let Some(p) = progress {
            if last_progress.elapsed() >= walk.every {
                last_progress = Instant::now();
                let total = walk.earlier.then(summary);
                let _ = p.try_send(total.to_json(vhost, name, started.elapsed(), false));
            }
        }
    }
    Ok(())
}

/// The error of a redrive that stopped part-way.
fn stopped(summary: &Summary, why: &str) -> ReadError {
    err(
        503,
        format!(
            "redrive stopped after moving {} messages: {why}; nothing was lost, run it again",
            summary.moved
        ),
    )
}

/// Where the stored message `body` goes: `opts.to`, else the queue of its
/// last death (broker history, else the first `x-death` entry,
/// [`last_death`]), with the message decoded.
fn destination(
    name: &str,
    opts: &Options,
    body: &bytes::Bytes,
) -> Result<(String, TrackedMessage), Skip> {
    let msg = TrackedMessage::decode(body).map_err(|_| Skip::Unreadable)?;
    let dest = match &opts.to {
        Some(to) => to.clone(),
        None => last_death(&msg).ok_or(Skip::NoDeathHistory)?.queue,
    };
    if dest == name {
        return Err(Skip::DestinationIsThisQueue);
    }
    Ok((dest, msg))
}

/// How the stored message `body` (decoded: `msg`) is enqueued into `dest`:
/// the stored bytes as they are (the death history goes along), its TTL
/// and its priority there.
fn enqueue_msg(dest: &QueueHandle, body: &bytes::Bytes, msg: &TrackedMessage) -> PrioritizedMsg {
    let props = basic::parse_properties(&msg.properties[..])
        .map(|(_, p)| p)
        .unwrap_or_default();
    let ttl_ms = props
        .expiration()
        .as_ref()
        .and_then(|e| crate::meta::publish::parse_expiration(e.as_str()).ok());
    PrioritizedMsg {
        msg: EnqueueMsg {
            payload: body.clone(),
            body_size: msg.body.len() as u32,
            ttl_ms,
        },
        priority: dest.message_priority(props.priority().unwrap_or(0)),
    }
}

/// Marks a redrive's source key in the destination's de-duplication
/// window (`EnqueueDeadLetters::source`): the redriven queue's group id with
/// the top bit set, so a redrive never shares ids or a floor with the same
/// queue's dead-letter worker (whose floor would take a redriven id below it
/// for a stale resend).
pub const REDRIVE_SOURCE_BIT: u64 = 1 << 63;

/// Enqueues `msgs` (each with its message id in the redriven queue, whose
/// group id is `source_group`) into `dest` directly and waits for the
/// commit; one outcome per message (Rejected: the destination is full with
/// reject-publish). The enqueue is the de-duplicated `EnqueueDeadLetters`
/// under the source key `REDRIVE_SOURCE_BIT | source_group` with no floor,
/// so an attempt whose reply was lost (timeout, leader change) is proposed
/// again for up to [`RETRY_FOR`] without a second copy: the destination's
/// window answers the copy `Accepted` (bounded per source; past the bound
/// at-least-once again, see `queue/dedup.rs`).
///
/// Errors: the destination stayed unavailable, as text.
pub async fn enqueue_committed(
    dest: &QueueHandle,
    source_group: u64,
    msgs: Vec<(MsgId, PrioritizedMsg)>,
) -> Result<Vec<EnqueueOutcome>, String> {
    let n = msgs.len();
    let cmd = QueueCommand::EnqueueDeadLetters {
        now_ms: crate::now_ms(),
        source: REDRIVE_SOURCE_BIT | source_group,
        settled_below: 0,
        floor_version: 0,
        msgs,
    };
    let deadline = Instant::now() + RETRY_FOR;
    loop {
        let why = match tokio::time::timeout(ATTEMPT, dest.call(cmd.clone())).await {
            Ok(Ok(QueueReply::Enqueued(o))) if o.len() == n => return Ok(o),
            Ok(Ok(other)) => format!("unexpected reply {other:?}"),
            Ok(Err(e)) => e.to_string(),
            Err(_) => "no commit in time".to_string(),
        };
        if Instant::now() >= deadline {
            return Err(why);
        }
        tracing::debug!(queue = %dest.name, error = %why, "redrive enqueue not committed; retrying");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Removes the committed `ids` from the queue (`Remove`, idempotent, so a
/// retry is harmless), retrying for up to [`RETRY_FOR`].
async fn remove_committed(h: &QueueHandle, ids: Vec<MsgId>) -> Result<(), String> {
    let deadline = Instant::now() + RETRY_FOR;
    loop {
        let cmd = QueueCommand::Remove {
            now_ms: crate::now_ms(),
            ids: ids.clone(),
        };
        let why = match tokio::time::timeout(ATTEMPT, h.call(cmd)).await {
            Ok(Ok(_)) => return Ok(()),
            Ok(Err(e)) => e.to_string(),
            Err(_) => "no commit in time".to_string(),
        };
        if Instant::now() >= deadline {
            return Err(why);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_refuse_bad_rates_and_empty_destinations() {
        for rate in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let o = Options {
                rate: Some(rate),
                ..Options::default()
            };
            assert_eq!(o.validate().map_err(|e| e.status), Err(400), "rate {rate}");
        }
        let o = Options {
            to: Some(String::new()),
            ..Options::default()
        };
        assert_eq!(o.validate().map_err(|e| e.status), Err(400));
        assert!(Options::default().validate().is_ok());
    }

    #[test]
    fn request_and_options_round_trip() {
        let o = Options {
            to: Some("q".into()),
            max: Some(5),
            rate: Some(2.5),
        };
        assert_eq!(options(&request("/", "dlq", &o, false)), o);
        assert_eq!(
            options(&request("/", "dlq", &Options::default(), false)),
            Options::default()
        );
    }

    #[test]
    fn summary_json_names_the_skip_reasons() {
        let mut s = Summary {
            moved: 3,
            ..Summary::default()
        };
        s.by_destination.insert("a".into(), 3);
        s.skip(Skip::SourceQueueNotFound);
        s.skip(Skip::SourceQueueNotFound);
        s.skip(Skip::NoDeathHistory);
        let v = s.to_json("/", "dlq", Duration::from_millis(1500), true);
        assert_eq!(v["moved"], 3);
        assert_eq!(v["by_destination"]["a"], 3);
        assert_eq!(v["skipped"]["source_queue_not_found"], 2);
        assert_eq!(v["skipped"]["no_death_history"], 1);
        assert_eq!(v["elapsed_ms"], 1500);
        assert_eq!(v["done"], true);
        assert_eq!(Summary::from_json(&v), s, "relayed progress reads back");
    }

    #[test]
    fn a_later_walk_adds_its_moves_and_replaces_the_skips() {
        let mut first = Summary {
            moved: 5,
            ..Summary::default()
        };
        first.by_destination.insert("a".into(), 5);
        first.skip(Skip::DeliveredToConsumer);
        let mut later = Summary {
            moved: 4,
            ..Summary::default()
        };
        later.by_destination.insert("a".into(), 1);
        later.by_destination.insert("b".into(), 3);
        later.skip(Skip::NoDeathHistory);
        let total = first.then(&later);
        assert_eq!(total.moved, 9);
        assert_eq!(total.by_destination["a"], 6);
        assert_eq!(total.by_destination["b"], 3);
        assert_eq!(
            total.skipped.into_iter().collect::<Vec<_>>(),
            vec![(Skip::NoDeathHistory, 1)]
        );
        for skip in Skip::ALL {
            assert_eq!(Skip::from_name(skip.as_str()), Some(skip));
        }
        assert_eq!(Skip::from_name("nonsense"), None);
    }

    #[test]
    fn paced_batches_are_about_a_tenth_of_the_rate() {
        assert_eq!(Pacer::new(Some(200.0)).batch(), 20);
        assert_eq!(Pacer::new(Some(0.5)).batch(), 1);
        assert_eq!(Pacer::new(Some(1e9)).batch(), BATCH);
        assert_eq!(Pacer::new(None).batch(), BATCH);
    }

    #[tokio::test]
    async fn pacer_holds_the_rate() {
        let mut p = Pacer::new(Some(1000.0));
        let t0 = tokio::time::Instant::now();
        for _ in 0..10 {
            p.wait(20).await;
        }
        // 200 messages at 1,000/s: the last batch goes when its last message is
        // due, 200 ms in (never earlier; the bound above only guards a hang).
        let took = t0.elapsed();
        assert!(
            took >= Duration::from_millis(199) && took < Duration::from_secs(2),
            "{took:?}"
        );
    }
}
