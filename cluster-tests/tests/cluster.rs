//! Three-node cluster tests: quorum queues replicated over real `quorumq`
//! processes (static `--peers`), driven with lapin through different nodes
//! while nodes are `kill -9`ed, stopped and restarted.
//!
//! Each test starts its own [`Cluster`] and runs one at a time (a 2-core CI
//! machine runs three debug brokers per test); each is bounded in time. Bodies
//! carry a unique id (u64 BE) and a filler derived from it, so every drain
//! checks loss, duplicates and body integrity. Leaders are read through
//! `quorumqctl list_queues` ([`Cluster::wait_queue_leader`]); a node is only
//! killed when no client of the test is connected to it at that moment.
//! With QUORUMQ_TEST_URI set these tests print why and return.

use cluster_tests::cluster::{self, Cluster};
use cluster_tests::*;
use futures::StreamExt;
use lapin::{
    options::{BasicAckOptions, BasicRejectOptions},
    types::AMQPValue,
    BasicProperties, Channel, Connection, PublisherConfirm,
};
use std::{
    collections::{HashMap, HashSet, VecDeque},
    future::Future,
    ops::Range,
    sync::{
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

/// How long declares (and other idempotent setup) are retried while the
/// meta group or a queue group elects a leader.
const SETUP_RETRY: Duration = Duration::from_secs(30);
/// How long to wait for a queue to report a running leader.
const LEADER_WAIT: Duration = Duration::from_secs(30);
/// A confirm that takes longer than this is a liveness failure, not a slow publish.
const CONFIRM_WAIT: Duration = Duration::from_secs(30);
/// After every expected id arrived, a drain waits this long for stragglers (duplicates).
const DRAIN_IDLE: Duration = Duration::from_secs(2);
/// Bytes of the id at the start of every body.
const ID_LEN: usize = 8;
/// Small bodies (id + filler), where the test is not about body size.
const SMALL: usize = 64;

/// Cluster tests run one at a time within this test binary.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Starts an `n`-node cluster and runs `body` on it within `limit`; prints
/// every node's log tail when the body fails or times out (a panicking body
/// gets them from [`Cluster`]'s drop).
async fn with_cluster<F, Fut>(test: &str, n: usize, limit: Duration, body: F) -> anyhow::Result<()>
where
    F: FnOnce(Arc<Cluster>) -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    if std::env::var(TEST_URI_ENV).is_ok_and(|v| !v.is_empty()) {
        println!("{test}: {TEST_URI_ENV} is set; cluster tests spawn their own quorumq nodes, returning early");
        return Ok(());
    }
    let _serial = SERIAL.lock().await;
    let started = Instant::now();
    let c = Arc::new(Cluster::start(n).await?);
    eprintln!("{test}: {n} nodes ready after {:?}", started.elapsed());
    match tokio::time::timeout(limit, body(c.clone())).await {
        Ok(Ok(())) => {
            eprintln!("{test}: done in {:?}", started.elapsed());
            Ok(())
        }
        Ok(Err(e)) => {
            c.print_logs(6000);
            Err(e)
        }
        Err(_) => {
            c.print_logs(6000);
            anyhow::bail!("{test} did not finish within {limit:?}")
        }
    }
}

// ---------------------------------------------------------------- bodies

/// Body of message `id`: the id (u64 BE) then a filler derived from it, `size` bytes in all.
fn body(id: u64, size: usize) -> Vec<u8> {
    let mut b = id.to_be_bytes().to_vec();
    b.extend((ID_LEN..size.max(ID_LEN)).map(|i| filler(id, i)));
    b
}

fn filler(id: u64, i: usize) -> u8 {
    ((id as usize).wrapping_mul(31).wrapping_add(i) % 251) as u8
}

/// The id of a body made by [`body`] with `size`, or why it is not intact.
fn parse_body(data: &[u8], size: usize) -> Result<u64, String> {
    let id = u64::from_be_bytes(
        data.get(..ID_LEN)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| format!("body of {} bytes has no id", data.len()))?,
    );
    if data.len() != size.max(ID_LEN) {
        return Err(format!(
            "id {id}: body of {} bytes, expected {size}",
            data.len()
        ));
    }
    match (ID_LEN..data.len()).find(|&i| data[i] != filler(id, i)) {
        Some(i) => Err(format!("id {id}: filler differs at byte {i}")),
        None => Ok(id),
    }
}

/// What a consumer received: deliveries per id, and bodies that were not intact.
#[derive(Default, Debug)]
struct Received {
    counts: HashMap<u64, u32>,
    corrupt: usize,
    first_corrupt: Option<String>,
    /// Times the consumer had to reconnect.
    reconnects: usize,
}

impl Received {
    fn record(&mut self, data: &[u8], size: usize) {
        match parse_body(data, size) {
            Ok(id) => *self.counts.entry(id).or_default() += 1,
            Err(e) => {
                self.corrupt += 1;
                self.first_corrupt.get_or_insert(e);
            }
        }
    }

    /// Deliveries beyond the first of each id.
    fn duplicates(&self) -> u64 {
        self.counts
            .values()
            .map(|&n| u64::from(n.saturating_sub(1)))
            .sum()
    }

    fn has_all(&self, want: &HashSet<u64>) -> bool {
        self.counts.len() >= want.len() && want.iter().all(|id| self.counts.contains_key(id))
    }

    /// Ids of `want` never received, sorted.
    fn missing(&self, want: &HashSet<u64>) -> Vec<u64> {
        sorted(
            want.iter()
                .copied()
                .filter(|id| !self.counts.contains_key(id)),
        )
    }

    /// (id, deliveries) of the ids of `of` received more than once, sorted.
    fn repeated(&self, of: &HashSet<u64>) -> Vec<(u64, u32)> {
        sorted(
            of.iter()
                .filter_map(|id| self.counts.get(id).filter(|&&n| n > 1).map(|&n| (*id, n))),
        )
    }

    /// Ids received that are in none of `known`, sorted.
    fn unknown(&self, known: &[&HashSet<u64>]) -> Vec<u64> {
        sorted(
            self.counts
                .keys()
                .copied()
                .filter(|id| !known.iter().any(|k| k.contains(id))),
        )
    }
}

fn sorted<T: Ord>(items: impl Iterator<Item = T>) -> Vec<T> {
    let mut v: Vec<T> = items.collect();
    v.sort_unstable();
    v
}

/// Asserts every id of `confirmed` arrived and no body was damaged.
#[track_caller]
fn assert_no_loss(what: &str, confirmed: &HashSet<u64>, got: &Received) {
    assert_none(
        &format!(
            "{what}: confirmed ids (of {}) that never arrived",
            confirmed.len()
        ),
        &got.missing(confirmed),
    );
    assert_eq!(
        got.corrupt, 0,
        "{what}: {} damaged bodies, first: {:?}",
        got.corrupt, got.first_corrupt
    );
}

/// [`assert_no_loss`], and no id came twice or was not in `expected`.
#[track_caller]
fn assert_exactly_once(what: &str, expected: &HashSet<u64>, got: &Received) {
    assert_no_loss(what, expected, got);
    assert_none(
        &format!("{what}: ids delivered more than once"),
        &got.repeated(expected),
    );
    assert_none(
        &format!("{what}: ids that should not be there"),
        &got.unknown(&[expected]),
    );
}

// ---------------------------------------------------------------- connections

/// Closes `conn` (≤ 5 s) once a test is done with it, ignoring failures (what
/// the test needs is recorded already). Keep its channel handles alive until
/// this returns (lapin quirk, see [`close_connection`]).
async fn close_quietly(conn: &Connection) {
    let _ = tokio::time::timeout(Duration::from_secs(5), close_connection(conn)).await;
}

/// Gives up on a connection that failed (close ≤ 2 s), then pauses 200 ms
/// before the caller opens a new one.
async fn abandon(conn: &Connection) {
    let _ = tokio::time::timeout(Duration::from_secs(2), conn.close(200, "reconnect".into())).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
}

// ---------------------------------------------------------------- setup

/// Runs `f` on a fresh connection + channel to `uri`, retried for
/// [`SETUP_RETRY`] (only for idempotent setup: declares, binds).
async fn on_channel<T, F, Fut>(uri: &str, what: &str, f: F) -> anyhow::Result<T>
where
    F: Fn(Channel) -> Fut,
    Fut: Future<Output = anyhow::Result<T>>,
{
    cluster::retry(SETUP_RETRY, what, || async {
        let conn = connect(uri).await?;
        let ch = conn.create_channel().await?;
        let r = f(ch.clone()).await;
        close_quietly(&conn).await;
        drop(ch);
        r
    })
    .await
}

/// Declares durable quorum queue `q` (plus `extra` arguments) through `uri`, with retries.
async fn declare_quorum(uri: &str, q: &str, extra: &[(&str, AMQPValue)]) -> anyhow::Result<()> {
    let args = quorum_args(extra);
    on_channel(uri, &format!("declare {q}"), |ch| {
        let args = args.clone();
        async move {
            ch.queue_declare(q.into(), durable(), args).await?;
            Ok(())
        }
    })
    .await
}

/// The first running node that is not in `exclude`.
#[track_caller]
fn other_than(c: &Cluster, exclude: &[u64]) -> u64 {
    c.ids()
        .find(|id| !exclude.contains(id) && c.is_running(*id))
        .unwrap_or_else(|| {
            panic!(
                "no running node outside {exclude:?} (running: {:?})",
                c.running()
            )
        })
}

/// (leader, a follower member) of queue `q` as node `via` reports them.
async fn leader_and_follower(c: &Cluster, via: u64, q: &str) -> anyhow::Result<(u64, u64)> {
    let leader = c.wait_queue_leader(via, q, LEADER_WAIT).await?;
    let v = c.queue_view(via, q).await?;
    let follower = v
        .members
        .iter()
        .copied()
        .find(|&m| m != leader && c.is_running(m))
        .ok_or_else(|| anyhow::anyhow!("queue {q} has no running follower: {v:?}"))?;
    Ok((leader, follower))
}

/// Finds queue `q`'s leader (via node `via`) and `kill -9`s its node. `clients`
/// are the nodes the test's open connections use: killing one of them is a test
/// design error, so it fails instead.
async fn kill_leader(c: &Cluster, via: u64, q: &str, clients: &[u64]) -> anyhow::Result<u64> {
    let leader = c.wait_queue_leader(via, q, LEADER_WAIT).await?;
    if clients.contains(&leader) {
        anyhow::bail!(
            "leader of {q} is node {leader}, which a client of this test is connected to"
        );
    }
    c.kill9(leader);
    eprintln!("kill -9 node {leader} (leader of {q})");
    Ok(leader)
}

/// Leaves `holder` the one member of `q` with every entry, makes it lead and
/// checks its own replica: kills `first`, commits the `extra` ids through
/// `holder` (the two members left must both take them), kills `last` for good
/// and restarts `first`. `first`'s log lacks `extra`, so Raft can only elect
/// `holder`; and `list_queues` through a leader counts its own replica, which
/// must hold every id of `confirmed` and `extra` as ready. What is consumed
/// next comes from `holder`'s own store.
///
/// Returns `confirmed` and the extra ids. Errors: a publish not confirmed, a
/// restart failing, `holder` not leading with them all within [`LEADER_WAIT`].
async fn leave_only_holder(
    c: &Cluster,
    q: &str,
    holder: u64,
    (first, last): (u64, u64),
    mut confirmed: HashSet<u64>,
    extra: Range<u64>,
    size: usize,
) -> anyhow::Result<HashSet<u64>> {
    c.kill9(first);
    eprintln!(
        "kill -9 node {first}; {} more through node {holder}",
        extra.clone().count()
    );
    confirmed.extend(publish_all(&c.uri(holder), q, extra, 8, size).await?);
    c.kill9(last);
    c.restart(first).await?;
    eprintln!("kill -9 node {last}; node {first} restarted without the extra entries");
    let ready = confirmed.len() as u64;
    cluster::wait_until_some(
        LEADER_WAIT,
        &format!("node {holder} leading {q} with {ready} ready in its own replica"),
        || async {
            let v = c.queue_view(holder, q).await?;
            if v.leader == Some(holder) && v.messages_ready == ready {
                Ok(Some(()))
            } else {
                Err(anyhow::anyhow!("node {holder} lists {v:?}"))
            }
        },
    )
    .await?;
    Ok(confirmed)
}

// ---------------------------------------------------------------- publishing

/// What [`publish`] sends.
struct PublishSpec {
    exchange: String,
    routing_key: String,
    /// Body size in bytes (≥ [`ID_LEN`]).
    body_size: usize,
    /// Publishes in flight without a confirm.
    window: usize,
    /// The first id; later ones count up from it.
    first_id: u64,
    /// Ids to confirm: with `republish`, publish fresh ids until this many are
    /// confirmed; without, publish `first_id..first_id + target` once each.
    target: usize,
    /// Replace a nacked/unconfirmed publish with a new id.
    republish: bool,
}

impl PublishSpec {
    /// `ids` once each to queue `q` through the default exchange.
    fn to_queue(q: &str, ids: Range<u64>, window: usize, body_size: usize) -> PublishSpec {
        PublishSpec {
            exchange: String::new(),
            routing_key: q.to_string(),
            body_size,
            window,
            first_id: ids.start,
            target: ids.clone().count(),
            republish: false,
        }
    }
}

/// Shared with a fault-injecting task: confirms so far, and a request to stop.
#[derive(Default)]
struct Progress {
    confirmed: AtomicUsize,
    stop: AtomicBool,
}

impl Progress {
    fn confirmed(&self) -> usize {
        self.confirmed.load(Ordering::Acquire)
    }
    fn stop(&self) {
        self.stop.store(true, Ordering::Release);
    }
}

/// Outcome of [`publish`].
#[derive(Default)]
struct Published {
    confirmed: HashSet<u64>,
    /// Nacked, or in flight when the connection failed.
    unconfirmed: HashSet<u64>,
    nacked: usize,
    reconnects: usize,
}

impl std::fmt::Display for Published {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} confirmed, {} unconfirmed ({} nacked), {} reconnects",
            self.confirmed.len(),
            self.unconfirmed.len(),
            self.nacked,
            self.reconnects
        )
    }
}

async fn open_confirm(uri: &str) -> anyhow::Result<(Connection, Channel)> {
    let conn = connect(uri).await?;
    let ch = confirm_channel(&conn).await?;
    Ok((conn, ch))
}

/// Publishes persistent messages through `uri` per `spec`, keeping up to
/// `spec.window` unconfirmed. A failed connection turns its in-flight
/// publishes into unconfirmed ones and is reopened (≤ 10 times). Stops early
/// when `progress.stop` is set (after collecting the in-flight confirms).
///
/// Errors: a confirm not arriving within [`CONFIRM_WAIT`], too many reconnects.
async fn publish(uri: &str, spec: &PublishSpec, progress: &Progress) -> anyhow::Result<Published> {
    let mut out = Published::default();
    let (mut conn, mut ch) = cluster::retry(SETUP_RETRY, "open a publisher channel", || {
        open_confirm(uri)
    })
    .await?;
    let mut inflight: VecDeque<(u64, PublisherConfirm)> = VecDeque::new();
    let mut next_id = spec.first_id;
    let props = BasicProperties::default().with_delivery_mode(2);
    loop {
        let want_more = !progress.stop.load(Ordering::Acquire)
            && if spec.republish {
                out.confirmed.len() + inflight.len() < spec.target
            } else {
                ((next_id - spec.first_id) as usize) < spec.target
            };
        let mut failed = None;
        if want_more && inflight.len() < spec.window {
            let id = next_id;
            next_id += 1;
            match ch
                .basic_publish(
                    spec.exchange.as_str().into(),
                    spec.routing_key.as_str().into(),
                    Default::default(),
                    &body(id, spec.body_size),
                    props.clone(),
                )
                .await
            {
                Ok(pc) => inflight.push_back((id, pc)),
                Err(e) => {
                    out.unconfirmed.insert(id);
                    failed = Some(e);
                }
            }
        } else {
            let Some((id, pc)) = inflight.pop_front() else {
                break;
            };
            match tokio::time::timeout(CONFIRM_WAIT, pc).await {
                Err(_) => anyhow::bail!(
                    "no publisher confirm for id {id} within {CONFIRM_WAIT:?} ({out} so far)"
                ),
                Ok(Ok(c)) if c.is_ack() => {
                    out.confirmed.insert(id);
                    progress.confirmed.fetch_add(1, Ordering::AcqRel);
                }
                Ok(Ok(c)) if c.is_nack() => {
                    out.nacked += 1;
                    out.unconfirmed.insert(id);
                }
                Ok(Ok(_)) => anyhow::bail!("the channel is not in confirm mode"),
                Ok(Err(e)) => {
                    out.unconfirmed.insert(id);
                    failed = Some(e);
                }
            }
        }
        if let Some(e) = failed {
            out.unconfirmed.extend(inflight.drain(..).map(|(id, _)| id));
            out.reconnects += 1;
            if out.reconnects > 10 {
                anyhow::bail!(
                    "publisher gave up after {} reconnects: {e} ({out})",
                    out.reconnects
                );
            }
            eprintln!("publisher on {uri}: {e}; reconnecting ({out})");
            abandon(&conn).await;
            (conn, ch) = cluster::retry(SETUP_RETRY, "reopen a publisher channel", || {
                open_confirm(uri)
            })
            .await?;
        }
    }
    close_quietly(&conn).await;
    drop(ch);
    Ok(out)
}

/// `ids` once each to `q` through `uri`; fails unless every one is confirmed
/// (for publishes made while no fault is injected).
async fn publish_all(
    uri: &str,
    q: &str,
    ids: Range<u64>,
    window: usize,
    size: usize,
) -> anyhow::Result<HashSet<u64>> {
    let spec = PublishSpec::to_queue(q, ids.clone(), window, size);
    let p = publish(uri, &spec, &Progress::default()).await?;
    anyhow::ensure!(
        p.confirmed.len() == spec.target,
        "publishing ids {ids:?} to {q} without faults: {p}; every publish should be confirmed"
    );
    Ok(p.confirmed)
}

// ---------------------------------------------------------------- consuming

/// Consumes `q` through `uri` (prefetch 500, acking each) until every id of
/// `expect` arrived and then [`DRAIN_IDLE`] passed without a delivery, or
/// `limit` passed. A failed connection is reopened (≤ 5 times). The caller
/// asserts on the result.
async fn drain(
    uri: &str,
    q: &str,
    expect: &HashSet<u64>,
    size: usize,
    limit: Duration,
) -> anyhow::Result<Received> {
    let open = || async {
        let conn = connect(uri).await?;
        let (ch, consumer) = open_consumer(&conn, q, 500).await?;
        anyhow::Ok((conn, ch, consumer))
    };
    let mut got = Received::default();
    let (mut conn, mut ch, mut consumer) =
        cluster::retry(SETUP_RETRY, &format!("consume {q}"), &open).await?;
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let complete = got.has_all(expect);
        let until = if complete {
            (tokio::time::Instant::now() + DRAIN_IDLE).min(deadline)
        } else {
            deadline
        };
        let failure = match tokio::time::timeout_at(until, consumer.next()).await {
            Err(_) => break,
            Ok(Some(Ok(d))) => {
                got.record(&d.data, size);
                d.ack(BasicAckOptions::default())
                    .await
                    .err()
                    .map(|e| e.to_string())
            }
            Ok(Some(Err(e))) => Some(e.to_string()),
            Ok(None) => Some("consumer ended".to_string()),
        };
        if let Some(e) = failure {
            got.reconnects += 1;
            if got.reconnects > 5 {
                anyhow::bail!(
                    "draining {q}: gave up after {} reconnects: {e}",
                    got.reconnects
                );
            }
            eprintln!("draining {q} via {uri}: {e}; reconnecting");
            abandon(&conn).await;
            (conn, ch, consumer) =
                cluster::retry(SETUP_RETRY, &format!("consume {q} again"), &open).await?;
        }
    }
    drop(consumer);
    close_quietly(&conn).await;
    drop(ch);
    Ok(got)
}

/// One consumer on one connection, never reopened: records (and acks) every
/// delivery of `q` into `into` until `stop` is set.
///
/// Errors: the consumer ended or failed (it did not keep receiving).
async fn consume_until_stopped(
    uri: String,
    q: String,
    size: usize,
    into: Arc<Mutex<Received>>,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<()> {
    let conn = connect(&uri).await?;
    let (ch, mut consumer) = open_consumer(&conn, &q, 200).await?;
    while !stop.load(Ordering::Acquire) {
        match tokio::time::timeout(Duration::from_millis(100), consumer.next()).await {
            Err(_) => {}
            Ok(Some(Ok(d))) => {
                lock(&into).record(&d.data, size);
                d.ack(BasicAckOptions::default()).await?;
            }
            Ok(Some(Err(e))) => anyhow::bail!("consumer on {uri} failed: {e}"),
            Ok(None) => anyhow::bail!("consumer on {uri} ended"),
        }
    }
    drop(consumer);
    close_quietly(&conn).await;
    drop(ch);
    Ok(())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

// ---------------------------------------------------------------- tests

/// a. 1000 confirmed through node 1, the queue leader's node is killed, every
/// id is consumed through a surviving node, exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirmed_on_a_survives_leader_kill_and_is_consumed_on_b() -> anyhow::Result<()> {
    with_cluster(
        "confirmed_on_a_survives_leader_kill",
        3,
        Duration::from_secs(120),
        |c| async move {
            let q = unique("cl.kill");
            declare_quorum(&c.uri(1), &q, &[]).await?;
            let confirmed = publish_all(&c.uri(1), &q, 0..1000, 128, SMALL).await?;
            // The publisher's connection is closed: any node may go.
            let killed = kill_leader(&c, 1, &q, &[]).await?;
            let survivor = other_than(&c, &[killed]);
            let got = drain(
                &c.uri(survivor),
                &q,
                &confirmed,
                SMALL,
                Duration::from_secs(60),
            )
            .await?;
            eprintln!(
                "consumed through node {survivor}: {} ids, {} duplicates",
                got.counts.len(),
                got.duplicates()
            );
            // Nothing was delivered before the kill, so nothing may come twice.
            assert_exactly_once("after killing the leader", &confirmed, &got);
            Ok(())
        },
    )
    .await
}

/// b. A consumer on a follower node keeps receiving, without reconnecting,
/// while a publisher on the third node publishes continuously and the
/// leader's node is killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_on_follower_keeps_receiving_across_leader_change() -> anyhow::Result<()> {
    with_cluster(
        "consumer_on_follower_keeps_receiving",
        3,
        Duration::from_secs(180),
        |c| async move {
            let q = unique("cl.follower.consumer");
            declare_quorum(&c.uri(1), &q, &[]).await?;
            let (leader, follower) = leader_and_follower(&c, 1, &q).await?;
            let publisher_node = other_than(&c, &[leader, follower]);
            eprintln!(
                "leader {leader}, consumer on follower {follower}, publisher on {publisher_node}"
            );

            let received = Arc::new(Mutex::new(Received::default()));
            let stop_consumer = Arc::new(AtomicBool::new(false));
            let consumer = tokio::spawn(consume_until_stopped(
                c.uri(follower),
                q.clone(),
                SMALL,
                received.clone(),
                stop_consumer.clone(),
            ));

            let progress = Progress::default();
            let spec = PublishSpec {
                target: usize::MAX,
                republish: true,
                ..PublishSpec::to_queue(&q, 0..0, 64, SMALL)
            };
            let fault = async {
                cluster::wait_for(
                    Duration::from_secs(60),
                    "500 confirms and 100 deliveries",
                    || async { progress.confirmed() >= 500 && lock(&received).counts.len() >= 100 },
                )
                .await?;
                let at_kill = progress.confirmed();
                // Fails if leadership moved to a node a client uses: then no
                // leader change would happen under the consumer.
                kill_leader(&c, follower, &q, &[follower, publisher_node]).await?;
                eprintln!("killed the leader after {at_kill} confirms");
                cluster::wait_for(
                    Duration::from_secs(60),
                    "1000 more confirms after the kill",
                    || async { progress.confirmed() >= at_kill + 1000 },
                )
                .await?;
                anyhow::Ok(at_kill)
            };
            let fault = async {
                let r = fault.await;
                progress.stop();
                r
            };
            let publisher_uri = c.uri(publisher_node);
            let (published, at_kill) =
                tokio::join!(publish(&publisher_uri, &spec, &progress), fault);
            let (published, at_kill) = (published?, at_kill?);
            eprintln!("publisher: {published} ({at_kill} before the kill)");

            let all_in = cluster::wait_for(
                Duration::from_secs(60),
                "every confirmed id at the consumer",
                || async {
                    consumer.is_finished() || lock(&received).has_all(&published.confirmed)
                },
            )
            .await;
            stop_consumer.store(true, Ordering::Release);
            let consumer_result = consumer.await?;
            let got = std::mem::take(&mut *lock(&received));
            eprintln!(
                "consumer on node {follower}: {} distinct ids, {} duplicates",
                got.counts.len(),
                got.duplicates()
            );
            // The consumer never reopens its connection: a failure or an end is an error.
            consumer_result
                .map_err(|e| e.context("the consumer on the follower did not keep receiving"))?;
            all_in?;
            assert_no_loss("consumer on the follower", &published.confirmed, &got);
            Ok(())
        },
    )
    .await
}

/// c. A follower is killed; the others take more than a snapshot interval of
/// 1 KiB messages; the follower returns and catches up by installing a
/// snapshot with the bodies it indexes. Then the third node
/// is killed, 10 more are confirmed (they need the restarted node), the
/// leader is killed and the third node restarted: only the restarted node
/// has every entry, so it leads, and it serves every body intact from its
/// own replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_node_catches_up_and_serves_every_body() -> anyhow::Result<()> {
    with_cluster(
        "killed_node_catches_up_by_snapshot",
        3,
        Duration::from_secs(300),
        |c| async move {
            const N: u64 = 12_000;
            const KIB: usize = 1024;
            let q = unique("cl.snapshot");
            declare_quorum(&c.uri(1), &q, &[]).await?;
            let (leader, victim) = leader_and_follower(&c, 1, &q).await?;
            c.kill9(victim);
            eprintln!("kill -9 node {victim} (follower); leader {leader}");
            // Snapshots come every 4096 Raft entries (256 kept after one). The
            // queue's proposer folds publishes that arrive together into one
            // entry, so a window of 2 still makes at least N/2 = 6000 entries
            // (usually ~N): the leader's log passes a snapshot and purges what the
            // victim lacks, whatever the batching.
            let started = Instant::now();
            let confirmed = publish_all(&c.uri(leader), &q, 0..N, 2, KIB).await?;
            eprintln!(
                "{N} × 1 KiB confirmed through node {leader} in {:?}",
                started.elapsed()
            );

            c.restart(victim).await?;
            // The leader purged what the victim lacks (it keeps 256 entries
            // after a snapshot): the victim can only catch up by installing a
            // snapshot, streamed with the bodies it indexes.
            cluster::wait_for(
                Duration::from_secs(120),
                &format!("node {victim} to install a snapshot"),
                || async { c.log_tail(victim, 4 << 20).contains("installed snapshot") },
            )
            .await?;
            // Through any node these are the leader's counts (see
            // Cluster::queue_view); the victim's own replica is checked below.
            let view = c.queue_view(victim, &q).await?;
            anyhow::ensure!(
                view.online.contains(&victim) && view.messages_ready == N,
                "after the install: {view:?}"
            );

            // The leader (or, if leadership moved to the victim, another
            // node) is killed for good; the third node only for a while.
            let now_leading = c.wait_queue_leader(victim, &q, LEADER_WAIT).await?;
            let last = if now_leading != victim {
                now_leading
            } else {
                other_than(&c, &[victim])
            };
            let first = other_than(&c, &[victim, last]);
            let confirmed =
                leave_only_holder(&c, &q, victim, (first, last), confirmed, N..N + 10, KIB).await?;
            let got = drain(
                &c.uri(victim),
                &q,
                &confirmed,
                KIB,
                Duration::from_secs(120),
            )
            .await?;
            // Nothing was delivered before, so nothing may come twice.
            assert_exactly_once(
                "consumed from the restarted node's replica",
                &confirmed,
                &got,
            );
            Ok(())
        },
    )
    .await
}

/// d. A max-length policy set through node 2 applies to a queue declared
/// through node 1 and published to through node 3; every node lists 5 ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_set_through_one_node_applies_on_all() -> anyhow::Result<()> {
    with_cluster(
        "policy_set_through_one_node_applies_on_all",
        3,
        Duration::from_secs(120),
        |c| async move {
            let q = unique("cl.policy");
            let policy = unique("cl.maxlen");
            let pattern = dlx::exact(&q);
            cluster::retry(SETUP_RETRY, "set_policy through node 2", || {
                c.set_policy(2, &policy, &pattern, r#"{"max-length":5}"#)
            })
            .await?;
            declare_quorum(&c.uri(1), &q, &[]).await?;
            // Window 1: one channel, in order, so drop-head keeps exactly ids 5..=9.
            let confirmed = publish_all(&c.uri(3), &q, 0..10, 1, SMALL).await?;
            assert_eq!(
                confirmed.len(),
                10,
                "drop-head (the default overflow) confirms every publish"
            );
            for via in c.ids() {
                cluster::wait_until_some(
                    Duration::from_secs(30),
                    &format!("5 ready and policy {policy} via node {via}"),
                    || async {
                        let v = c.queue_view(via, &q).await?;
                        if v.messages_ready == 5 && v.policy == policy {
                            Ok(Some(()))
                        } else {
                            Err(anyhow::anyhow!("node {via} lists {v:?}"))
                        }
                    },
                )
                .await?;
            }
            let passive = on_channel(&c.uri(3), "passive declare", |ch| {
                let q = q.clone();
                async move { dlx::passive_ready(&ch, &q).await }
            })
            .await?;
            assert_eq!(passive, 5, "passive declare through node 3");
            let newest: HashSet<u64> = (5..10).collect();
            let got = drain(&c.uri(1), &q, &newest, SMALL, Duration::from_secs(30)).await?;
            assert_exactly_once(
                "max-length 5 with drop-head keeps the newest five",
                &newest,
                &got,
            );
            Ok(())
        },
    )
    .await
}

/// e. A queue declared while node 3 is down still gets node 3 as a member;
/// when node 3 returns it receives the replica: with node 2 then stopped for
/// a while (10 more confirmed by nodes 1 + 3) and node 1 killed, nodes 2 + 3
/// serve all messages, node 3 leading from its own replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_declared_while_node_down_gets_replica_on_return() -> anyhow::Result<()> {
    with_cluster(
        "queue_declared_while_node_down",
        3,
        Duration::from_secs(120),
        |c| async move {
            const N: u64 = 100;
            c.stop(3).await?;
            let q = unique("cl.down");
            declare_quorum(&c.uri(1), &q, &[]).await?;
            let mut members = c.queue_view(1, &q).await?.members;
            members.sort_unstable();
            assert_eq!(
                members,
                vec![1, 2, 3],
                "initial group size 3 in a 3-node cluster includes the stopped node"
            );
            let confirmed = publish_all(&c.uri(1), &q, 0..N, 32, SMALL).await?;
            c.restart(3).await?;
            cluster::wait_until_some(
                Duration::from_secs(60),
                "node 3 online with the replica",
                || async {
                    let v1 = c.queue_view(1, &q).await?;
                    let v3 = c.queue_view(3, &q).await?;
                    if v1.online.contains(&3) && v3.messages_ready == N {
                        Ok(Some(()))
                    } else {
                        Err(anyhow::anyhow!("via 1: {v1:?}; via 3: {v3:?}"))
                    }
                },
            )
            .await?;
            let confirmed =
                leave_only_holder(&c, &q, 3, (2, 1), confirmed, N..N + 10, SMALL).await?;
            let got = drain(&c.uri(3), &q, &confirmed, SMALL, Duration::from_secs(60)).await?;
            assert_exactly_once("consumed through node 3 with node 1 dead", &confirmed, &got);
            Ok(())
        },
    )
    .await
}

/// f. A publisher on a follower (its publishes are forwarded to the leader)
/// publishes 5000 confirmed while the leader's node is killed after ~1500:
/// every confirmed id is in the queue exactly once, unconfirmed ones at most once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarding_from_follower_no_loss_no_duplicates_under_leader_kill() -> anyhow::Result<()> {
    with_cluster(
        "forwarding_from_follower_under_leader_kill",
        3,
        Duration::from_secs(180),
        |c| async move {
            const N: usize = 5_000;
            let q = unique("cl.forward");
            declare_quorum(&c.uri(1), &q, &[]).await?;
            let (leader, follower) = leader_and_follower(&c, 1, &q).await?;
            eprintln!("leader {leader}, publisher on follower {follower}");
            let progress = Progress::default();
            let spec = PublishSpec {
                republish: true,
                ..PublishSpec::to_queue(&q, 0..N as u64, 128, SMALL)
            };
            let fault = async {
                let killed = match cluster::wait_for(
                    Duration::from_secs(90),
                    "1500 confirms",
                    || async { progress.confirmed() >= 1500 },
                )
                .await
                {
                    // Fails if leadership moved to the publisher's node: its
                    // publishes would no longer be forwarded.
                    Ok(()) => kill_leader(&c, follower, &q, &[follower]).await,
                    Err(e) => Err(e),
                };
                if killed.is_err() {
                    progress.stop();
                }
                killed.map(|k| (k, progress.confirmed()))
            };
            let publisher_uri = c.uri(follower);
            let (published, killed) =
                tokio::join!(publish(&publisher_uri, &spec, &progress), fault);
            let published = published?;
            let (killed, at_kill) = killed?;
            eprintln!("publisher: {published}; node {killed} killed at {at_kill} confirms");
            assert_eq!(
                published.confirmed.len(),
                N,
                "the publisher republishes until {N} are confirmed"
            );
            assert!(
                at_kill < N,
                "the leader was killed only after all {N} were confirmed: no publish was in flight"
            );

            let survivor = other_than(&c, &[killed]);
            let got = drain(
                &c.uri(survivor),
                &q,
                &published.confirmed,
                SMALL,
                Duration::from_secs(90),
            )
            .await?;
            let dup_confirmed = got.repeated(&published.confirmed);
            let dup_unconfirmed = got.repeated(&published.unconfirmed);
            let unconfirmed_delivered = published
                .unconfirmed
                .iter()
                .filter(|id| got.counts.contains_key(id))
                .count();
            eprintln!(
                "drained through node {survivor}: {} distinct, {} duplicates ({} of confirmed ids, {} of unconfirmed ids); \
                 {unconfirmed_delivered} of {} unconfirmed ids were enqueued",
                got.counts.len(),
                got.duplicates(),
                dup_confirmed.len(),
                dup_unconfirmed.len(),
                published.unconfirmed.len()
            );
            assert_no_loss("forwarded publishes", &published.confirmed, &got);
            assert_none("confirmed ids enqueued more than once", &dup_confirmed);
            assert_none(
                "unconfirmed ids enqueued more than once (at most once allowed)",
                &dup_unconfirmed,
            );
            assert_none(
                "ids never published that arrived",
                &got.unknown(&[&published.confirmed, &published.unconfirmed]),
            );
            Ok(())
        },
    )
    .await
}

// ---------------------------------------------------------------- g: at-least-once dead-lettering

/// Shared by the reject/collect phases of test g.
#[derive(Default)]
struct DeadLetterRun {
    /// Source deliveries rejected (requeue=false), redeliveries included.
    rejects: AtomicU64,
    /// What arrived in the target.
    target: Mutex<Received>,
    /// Target deliveries whose x-death was checked / was not `rejected` from the source.
    deaths_checked: AtomicU64,
    bad_deaths: Mutex<Vec<String>>,
}

impl DeadLetterRun {
    fn rejects(&self) -> u64 {
        self.rejects.load(Ordering::Acquire)
    }
}

/// Why a target delivery's `x-death` is not one `rejected` death from `source`, if it is not.
fn check_x_death(d: &lapin::message::Delivery, source: &str) -> Result<(), String> {
    let Some(AMQPValue::FieldArray(deaths)) = dlx::header(d, "x-death") else {
        return Err(format!("no x-death array: {:?}", d.properties.headers()));
    };
    let Some(AMQPValue::FieldTable(first)) = deaths.as_slice().first() else {
        return Err(format!("x-death has no table: {deaths:?}"));
    };
    let reason = dlx::field(first, "reason");
    let queue = dlx::field(first, "queue");
    if reason != Some(&s("rejected")) || queue != Some(&s(source)) {
        return Err(format!("x-death[0] reason {reason:?} queue {queue:?}"));
    }
    Ok(())
}

/// One connection: rejects (requeue=false) everything from `source`, acks and
/// records everything from `target`, until `stop` is set.
///
/// Errors: the connection or a consumer failed (e.g. its node died).
async fn reject_and_collect(
    uri: String,
    source: String,
    target: String,
    run: Arc<DeadLetterRun>,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<()> {
    let conn = connect(&uri).await?;
    let (rch, mut rejecter) = open_consumer(&conn, &source, 500).await?;
    let (cch, mut collector) = open_consumer(&conn, &target, 1000).await?;
    while !stop.load(Ordering::Acquire) {
        tokio::select! {
            d = rejecter.next() => match d {
                Some(Ok(d)) => {
                    d.reject(BasicRejectOptions { requeue: false }).await?;
                    run.rejects.fetch_add(1, Ordering::AcqRel);
                }
                Some(Err(e)) => anyhow::bail!("source consumer on {uri}: {e}"),
                None => anyhow::bail!("source consumer on {uri} ended"),
            },
            d = collector.next() => match d {
                Some(Ok(d)) => {
                    lock(&run.target).record(&d.data, SMALL);
                    run.deaths_checked.fetch_add(1, Ordering::AcqRel);
                    if let Err(e) = check_x_death(&d, &source) {
                        lock(&run.bad_deaths).push(e);
                    }
                    d.ack(BasicAckOptions::default()).await?;
                }
                Some(Err(e)) => anyhow::bail!("target consumer on {uri}: {e}"),
                None => anyhow::bail!("target consumer on {uri} ended"),
            },
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
    drop(rejecter);
    drop(collector);
    close_quietly(&conn).await;
    drop((rch, cch));
    Ok(())
}

/// The reject/collect task currently running, and where; restarted on
/// another node when it fails.
struct Phase {
    source: String,
    target: String,
    run: Arc<DeadLetterRun>,
    node: u64,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
    /// Tasks started after one failed.
    restarts: usize,
}

impl Phase {
    fn start(
        c: &Cluster,
        node: u64,
        source: &str,
        target: &str,
        run: &Arc<DeadLetterRun>,
    ) -> Phase {
        let (stop, task) = Phase::spawn(c, node, source, target, run);
        Phase {
            source: source.to_string(),
            target: target.to_string(),
            run: run.clone(),
            node,
            stop,
            task,
            restarts: 0,
        }
    }

    fn spawn(
        c: &Cluster,
        node: u64,
        source: &str,
        target: &str,
        run: &Arc<DeadLetterRun>,
    ) -> (Arc<AtomicBool>, tokio::task::JoinHandle<anyhow::Result<()>>) {
        let stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(reject_and_collect(
            c.uri(node),
            source.to_string(),
            target.to_string(),
            run.clone(),
            stop.clone(),
        ));
        eprintln!("reject/collect phase on node {node}");
        (stop, task)
    }

    /// Stops the task and waits for it; its result (a failed task is an error).
    async fn stop_task(&mut self) -> anyhow::Result<()> {
        self.stop.store(true, Ordering::Release);
        let task = std::mem::replace(&mut self.task, tokio::spawn(async { Ok(()) }));
        tokio::time::timeout(Duration::from_secs(15), task)
            .await
            .map_err(|_| anyhow::anyhow!("phase on node {} did not stop", self.node))??
    }

    /// Runs the task on `node` from now on (the current one must have ended).
    fn move_to(&mut self, c: &Cluster, node: u64) {
        (self.stop, self.task) = Phase::spawn(c, node, &self.source, &self.target, &self.run);
        self.node = node;
    }

    /// Moves the task to a running node outside `avoid` if it runs on one of them.
    async fn move_off(&mut self, c: &Cluster, avoid: &[u64]) {
        if !avoid.contains(&self.node) {
            return;
        }
        if let Err(e) = self.stop_task().await {
            eprintln!("phase ended with {e:#}");
        }
        self.move_to(c, other_than(c, avoid));
    }

    /// Waits until `cond` holds. A task that failed (its node died, its
    /// consumer was cancelled) is restarted on a running node (≤ 5 times).
    async fn wait_until(
        &mut self,
        c: &Cluster,
        what: &str,
        limit: Duration,
        cond: impl Fn(&DeadLetterRun) -> bool,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + limit;
        while !cond(&self.run) {
            if self.task.is_finished() {
                let err = match self.stop_task().await {
                    Ok(()) => anyhow::anyhow!("phase stopped unasked"),
                    Err(e) => e,
                };
                self.restarts += 1;
                if self.restarts > 5 {
                    return Err(err.context(format!(
                        "reject/collect phase failed {} times",
                        self.restarts
                    )));
                }
                eprintln!(
                    "reject/collect phase on node {} failed: {err:#}; restarting",
                    self.node
                );
                let node = if c.is_running(self.node) {
                    self.node
                } else {
                    other_than(c, &[])
                };
                self.move_to(c, node);
            }
            if Instant::now() > deadline {
                anyhow::bail!(
                    "timed out after {limit:?} waiting for {what} ({} rejects, {} distinct in the target)",
                    self.run.rejects(),
                    lock(&self.run.target).counts.len()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }
}

/// g. At-least-once dead-lettering across the cluster: 20,000 confirmed into
/// an at-least-once source, all rejected, while the source's leader node is
/// killed and restarted and then the target's leader node is killed and
/// restarted; every confirmed id must reach the target, and the source must
/// end empty (no dead letter left held).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_least_once_dead_letters_survive_source_and_target_leader_kills() -> anyhow::Result<()> {
    with_cluster(
        "at_least_once_dead_letters_survive_leader_kills",
        3,
        Duration::from_secs(300),
        |c| async move {
            const N: u64 = 20_000;
            let (source, dlx_name, target) = (
                unique("cl.alo.src"),
                unique("cl.alo.dlx"),
                unique("cl.alo.dlq"),
            );
            on_channel(&c.uri(1), "declare the dead-letter topology", |ch| {
                let (source, dlx_name, target) = (source.clone(), dlx_name.clone(), target.clone());
                async move {
                    dlx::fanout(&ch, &dlx_name).await?;
                    ch.queue_declare(target.as_str().into(), durable(), quorum_args(&[]))
                        .await?;
                    dlx::bind(&ch, &target, &dlx_name, "").await?;
                    ch.queue_declare(
                        source.as_str().into(),
                        durable(),
                        quorum_args(&[
                            ("x-dead-letter-exchange", s(&dlx_name)),
                            ("x-dead-letter-strategy", s("at-least-once")),
                            ("x-overflow", s("reject-publish")),
                        ]),
                    )
                    .await?;
                    Ok(())
                }
            })
            .await?;
            let started = Instant::now();
            let confirmed = publish_all(&c.uri(1), &source, 0..N, 256, SMALL).await?;
            eprintln!("{N} confirmed into {source} in {:?}", started.elapsed());

            let run = Arc::new(DeadLetterRun::default());
            let source_leader = c.wait_queue_leader(1, &source, LEADER_WAIT).await?;
            let mut phase =
                Phase::start(&c, other_than(&c, &[source_leader]), &source, &target, &run);
            let all_in = |r: &DeadLetterRun| lock(&r.target).has_all(&confirmed);
            let phase_wait = Duration::from_secs(90);

            phase
                .wait_until(&c, "5000 rejects", phase_wait, |r| r.rejects() >= 5_000)
                .await?;
            // The phase may have moved since it started: keep it off the node to kill.
            let source_leader = c
                .wait_queue_leader(phase.node, &source, LEADER_WAIT)
                .await?;
            phase.move_off(&c, &[source_leader]).await;
            kill_leader(&c, phase.node, &source, &[phase.node]).await?;
            let r0 = run.rejects();
            phase
                .wait_until(
                    &c,
                    "4000 rejects after the source leader's kill",
                    phase_wait,
                    |r| r.rejects() >= r0 + 4_000 || all_in(r),
                )
                .await?;
            c.restart(source_leader).await?;
            eprintln!("node {source_leader} restarted");
            let via = phase.node;
            cluster::wait_for(
                Duration::from_secs(60),
                "the restarted node online for the source",
                || async {
                    c.queue_view(via, &source)
                        .await
                        .is_ok_and(|v| v.online.contains(&source_leader))
                },
            )
            .await?;

            let target_leader = c
                .wait_queue_leader(phase.node, &target, LEADER_WAIT)
                .await?;
            phase.move_off(&c, &[target_leader]).await;
            let r1 = run.rejects();
            phase
                .wait_until(&c, "2000 more rejects", phase_wait, |r| {
                    r.rejects() >= r1 + 2_000 || all_in(r)
                })
                .await?;
            let killed = kill_leader(&c, phase.node, &target, &[phase.node]).await?;
            let r2 = run.rejects();
            phase
                .wait_until(
                    &c,
                    "2000 rejects after the target leader's kill",
                    phase_wait,
                    |r| r.rejects() >= r2 + 2_000 || all_in(r),
                )
                .await?;
            c.restart(killed).await?;
            eprintln!("node {killed} restarted");

            let result = phase
                .wait_until(
                    &c,
                    "every confirmed id in the target",
                    Duration::from_secs(150),
                    all_in,
                )
                .await;
            // Stragglers: redelivered duplicates still on their way.
            tokio::time::sleep(DRAIN_IDLE).await;
            if let Err(e) = phase.stop_task().await {
                eprintln!("last phase ended with {e:#}");
            }
            let got = std::mem::take(&mut *lock(&run.target));
            eprintln!("dead-letter duplicates: {}", got.duplicates());
            eprintln!(
                "{} rejects, {} distinct of {N} in the target, {} phase restarts",
                run.rejects(),
                got.counts.len(),
                phase.restarts
            );
            assert_no_loss("dead letters in the target", &confirmed, &got);
            result?;
            assert!(
                run.deaths_checked.load(Ordering::Acquire) > 0,
                "no target delivery was checked"
            );
            assert_none(
                &format!("target deliveries without x-death reason rejected from {source}"),
                &lock(&run.bad_deaths),
            );
            // At-least-once: a dead letter leaves the source once the target
            // confirmed it, so with every one in the target none is left.
            let via = other_than(&c, &[]);
            cluster::wait_until_some(
                Duration::from_secs(30),
                &format!("{source} empty (no ready, unacked or held dead letters)"),
                || async {
                    let v = c.queue_view(via, &source).await?;
                    if (
                        v.messages_ready,
                        v.messages_unacknowledged,
                        v.dead_letter_held,
                    ) == (0, 0, 0)
                    {
                        Ok(Some(()))
                    } else {
                        Err(anyhow::anyhow!("node {via} lists {v:?}"))
                    }
                },
            )
            .await?;
            Ok(())
        },
    )
    .await
}

/// h. Queues declared back to back through one node all work: each takes a
/// confirmed publish (forwarded from another node) and its passive declare
/// counts it. Regression: the node's topology reconciler compared its queue
/// handles with a topology read taken before it opened other queues, took a
/// queue declared meanwhile for deleted, dropped its group (the leader's
/// log) and reopened it empty; the empty replica then campaigned forever
/// with a shorter log while the others still followed it, and the queue
/// never got a leader again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queues_declared_back_to_back_all_get_a_working_leader() -> anyhow::Result<()> {
    with_cluster(
        "queues_declared_back_to_back_all_get_a_working_leader",
        3,
        Duration::from_secs(240),
        |c| async move {
            const QUEUES: usize = 150;
            let names: Vec<String> = (0..QUEUES)
                .map(|i| unique(&format!("cl.many.{i}")))
                .collect();
            let names2 = names.clone();
            on_channel(&c.uri(1), "declare the queues", move |ch| {
                let names = names2.clone();
                async move {
                    for q in &names {
                        ch.queue_declare(q.as_str().into(), durable(), quorum_args(&[]))
                            .await?;
                    }
                    Ok(())
                }
            })
            .await?;
            let (conn, ch) = open_confirm(&c.uri(2)).await?;
            for q in &names {
                tokio::time::timeout(
                    Duration::from_secs(15),
                    publish_confirmed(&ch, "", q, b"m", BasicProperties::default()),
                )
                .await
                .map_err(|_| anyhow::anyhow!("no confirm from queue {q} within 15 s"))??;
            }
            for q in &names {
                let ready = dlx::passive_ready(&ch, q).await?;
                assert_eq!(ready, 1, "queue {q} holds the confirmed message");
            }
            close_quietly(&conn).await;
            Ok(())
        },
    )
    .await
}

/// i. A new quorum queue is led by the node it was declared through
/// (RabbitMQ's `client-local` leader locator), whichever node that is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_queue_is_led_by_the_declaring_node() -> anyhow::Result<()> {
    with_cluster(
        "a_new_queue_is_led_by_the_declaring_node",
        3,
        Duration::from_secs(120),
        |c| async move {
            for node in 1..=3 {
                let q = unique(&format!("cl.local.{node}"));
                declare_quorum(&c.uri(node), &q, &[]).await?;
                let leader = c.wait_queue_leader(node, &q, LEADER_WAIT).await?;
                assert_eq!(leader, node, "queue {q} declared through node {node}");
            }
            Ok(())
        },
    )
    .await
}
