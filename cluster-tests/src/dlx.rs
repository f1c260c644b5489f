//! Helpers shared by the dead-lettering tests (`tests/dead_lettering.rs`,
//! `tests/dlx_integration.rs`), which mirror RabbitMQ's `dead_lettering_SUITE`
//! and `rabbit_fifo_dlx_integration_SUITE`.
//!
//! * policies: [`set_policy`] / [`clear_policy`] run `rabbitmqctl` against an
//!   external broker and `quorumqctl --node <admin addr>` against a spawned quorumq;
//! * queue counters `[messages, messages_ready, messages_unacknowledged]` as the
//!   suites' `wait_for_messages` checks them: [`queue_counts`] / [`wait_for_messages`]
//!   (`rabbitmqctl list_queues`; for quorumq `messages` = ready + unacked + held
//!   dead letters from `quorumqctl list_queues`);
//! * basic.get based `consume` / `consume_empty` as in the Erlang suites;
//! * header accessors for `x-death` and friends;
//! * running the control tools, bounded and killed on timeout: [`run`] /
//!   [`output`] of a [`quorumqctl`] command line ([`quorumqctl_bin`]), also
//!   used by [`crate::cluster`] and `tests/ctl_json.rs`;
//! * [`Case`]: a test case's broker, connection, confirm channel and names, and the
//!   suites' `end_per_testcase`.

mod case;
pub use case::Case;

use crate::{quorumq_bin, s, signal, Broker};
use anyhow::{anyhow, bail, Context};
use lapin::{
    message::Delivery,
    options::{
        BasicGetOptions, BasicPublishOptions, ExchangeDeclareOptions, QueueBindOptions,
        QueueDeclareOptions,
    },
    types::{AMQPValue, FieldTable},
    BasicProperties, Channel, ExchangeKind,
};
use std::{
    path::PathBuf,
    process::{Command, Output, Stdio},
    time::Duration,
};

/// How long the condition-waiting helpers wait by default.
pub const WAIT: Duration = Duration::from_secs(15);
/// Poll interval of the condition-waiting helpers.
pub const POLL: Duration = Duration::from_millis(100);
/// Bound on one `rabbitmqctl` / `quorumqctl` run of these helpers.
pub const CTL_TIMEOUT: Duration = Duration::from_secs(30);

/// The dead-letter strategy group of `dead_lettering_SUITE` (quorum queue groups).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// `x-dead-letter-strategy: at-most-once`.
    AtMostOnce,
    /// `x-dead-letter-strategy: at-least-once` + `x-overflow: reject-publish`.
    AtLeastOnce,
}

impl Strategy {
    /// The suite's `queue_args` for the group: quorum type plus the strategy
    /// (and `x-overflow: reject-publish` for at-least-once).
    pub fn queue_args(self) -> Vec<(&'static str, AMQPValue)> {
        let mut v = vec![("x-queue-type", s("quorum"))];
        match self {
            Strategy::AtMostOnce => v.push(("x-dead-letter-strategy", s("at-most-once"))),
            Strategy::AtLeastOnce => {
                v.push(("x-dead-letter-strategy", s("at-least-once")));
                v.push(("x-overflow", s("reject-publish")));
            }
        }
        v
    }
}

/// Long (`l`, i64) value, as the Erlang suites send `{long, N}`.
pub fn long(v: i64) -> AMQPValue {
    AMQPValue::LongLongInt(v)
}

/// Array of longstr.
pub fn ls_array(vs: &[&str]) -> AMQPValue {
    AMQPValue::FieldArray(vs.iter().map(|v| s(v)).collect::<Vec<_>>().into())
}

/// Regex matching exactly `name` (policies take a regex pattern).
pub fn exact(name: &str) -> String {
    let mut out = String::from("^");
    for c in name.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('$');
    out
}

/// The quorumqctl binary: env `QUORUMQCTL_BIN`, else next to the quorumq
/// binary (`QUORUMQ_BIN`'s directory or `<workspace>/target/debug/`).
pub fn quorumqctl_bin() -> PathBuf {
    if let Ok(p) = std::env::var("QUORUMQCTL_BIN") {
        return PathBuf::from(p);
    }
    quorumq_bin()
        .parent()
        .map_or_else(|| PathBuf::from("quorumqctl"), |d| d.join("quorumqctl"))
}

/// `quorumqctl --node ADMIN ARGS...` as a command line for [`run`] / [`output`]
/// (`admin`: a node's cluster address, e.g. `http://127.0.0.1:PORT`).
pub fn quorumqctl(admin: &str, args: &[&str]) -> Vec<String> {
    let mut cmd = vec![
        quorumqctl_bin().display().to_string(),
        "--node".to_string(),
        admin.to_string(),
    ];
    cmd.extend(args.iter().map(|a| a.to_string()));
    cmd
}

/// Runs `cmd` (program + args, stdin closed) off the async threads and
/// returns its output whatever its exit status. A run still going after
/// `limit` is killed.
///
/// Errors: it could not be started (binary missing), or it timed out.
pub async fn output(cmd: Vec<String>, limit: Duration) -> anyhow::Result<Output> {
    let shown = cmd.join(" ");
    let child = Command::new(&cmd[0])
        .args(&cmd[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| {
            format!("running `{shown}` (built? cargo build --bin quorumq --bin quorumqctl)")
        })?;
    let pid = child.id();
    let waited = tokio::time::timeout(
        limit,
        tokio::task::spawn_blocking(move || child.wait_with_output()),
    )
    .await;
    match waited {
        Ok(joined) => Ok(joined
            .context("joining the waiter thread")?
            .with_context(|| format!("running `{shown}`"))?),
        Err(_) => {
            // The waiter thread reaps it once it is killed.
            let _ = signal(pid, "KILL");
            bail!("`{shown}` did not finish within {limit:?}")
        }
    }
}

/// [`output`] of a run that must exit 0: its stdout.
///
/// Errors: as [`output`]; a non-zero exit (with the run's stdout and stderr).
pub async fn run(cmd: Vec<String>, limit: Duration) -> anyhow::Result<String> {
    let shown = cmd.join(" ");
    let out = output(cmd, limit).await?;
    if !out.status.success() {
        bail!(
            "`{shown}` failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `rabbitmqctl REST...` for an external broker, `quorumqctl --node ADMIN
/// REST...` for a spawned quorumq.
pub fn ctl(broker: &Broker, rest: &[&str]) -> anyhow::Result<Vec<String>> {
    if broker.is_external() {
        let mut v = vec!["rabbitmqctl".to_string()];
        v.extend(rest.iter().map(|s| s.to_string()));
        return Ok(v);
    }
    let admin = broker
        .admin_addr()
        .ok_or_else(|| anyhow!("spawned broker without admin address"))?;
    Ok(quorumqctl(&admin, rest))
}

/// `set_policy NAME PATTERN JSON --apply-to queues` via rabbitmqctl (external
/// broker) or quorumqctl (spawned quorumq).
pub async fn set_policy(
    broker: &Broker,
    name: &str,
    pattern: &str,
    json: &str,
) -> anyhow::Result<()> {
    run(
        ctl(
            broker,
            &["set_policy", name, pattern, json, "--apply-to", "queues"],
        )?,
        CTL_TIMEOUT,
    )
    .await
    .map(|_| ())
}

/// `clear_policy NAME`.
pub async fn clear_policy(broker: &Broker, name: &str) -> anyhow::Result<()> {
    run(ctl(broker, &["clear_policy", name])?, CTL_TIMEOUT)
        .await
        .map(|_| ())
}

/// `[messages, messages_ready, messages_unacknowledged]` of queue `q`, or None if it does not exist.
/// For quorumq `messages` = ready + unacked + held (at-least-once) dead letters,
/// which is what RabbitMQ's `messages` counts.
pub async fn queue_counts(broker: &Broker, q: &str) -> anyhow::Result<Option<[u64; 3]>> {
    if broker.is_external() {
        let out = run(
            ctl(
                broker,
                &[
                    "list_queues",
                    "--quiet",
                    "--no-table-headers",
                    "name",
                    "messages",
                    "messages_ready",
                    "messages_unacknowledged",
                ],
            )?,
            CTL_TIMEOUT,
        )
        .await?;
        for line in out.lines() {
            let f: Vec<&str> = line.split('\t').collect();
            if f.len() == 4 && f[0] == q {
                return Ok(Some([
                    f[1].trim().parse()?,
                    f[2].trim().parse()?,
                    f[3].trim().parse()?,
                ]));
            }
        }
        Ok(None)
    } else {
        // name type messages_ready messages_unacknowledged consumers dead_letter_held policy
        let out = run(ctl(broker, &["list_queues"])?, CTL_TIMEOUT).await?;
        for line in out.lines().skip(1) {
            let f: Vec<&str> = line.split('\t').collect();
            if f.len() >= 6 && f[0] == q {
                let ready: u64 = f[2].trim().parse()?;
                let unacked: u64 = f[3].trim().parse()?;
                let held: u64 = f[5].trim().parse()?;
                return Ok(Some([ready + unacked + held, ready, unacked]));
            }
        }
        Ok(None)
    }
}

/// The suites' `wait_for_messages(Config, [[Q, M, R, U]])`: polls until queue
/// `q` shows `[messages, ready, unacked] == want`, failing after [`WAIT`].
pub async fn wait_for_messages(broker: &Broker, q: &str, want: [u64; 3]) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let got = queue_counts(broker, q).await?;
        if got == Some(want) {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            bail!("queue {q}: expected [messages, ready, unacked] = {want:?}, got {got:?} after {WAIT:?}");
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Asserts that `[messages, ready, unacked]` of `q` stays `want` for `dur` (the suites' `consistently`).
pub async fn consistently_messages(
    broker: &Broker,
    q: &str,
    want: [u64; 3],
    dur: Duration,
) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + dur;
    while tokio::time::Instant::now() < deadline {
        let got = queue_counts(broker, q).await?;
        if got != Some(want) {
            bail!("queue {q}: expected [messages, ready, unacked] to stay {want:?}, got {got:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// Publishes each payload to the default exchange with routing key `q` and waits for
/// the confirms (`ch` must be in confirm mode). Errors if any is nacked.
pub async fn publish(ch: &Channel, q: &str, payloads: &[&str]) -> anyhow::Result<()> {
    publish_props(ch, q, payloads, BasicProperties::default()).await
}

/// [`publish`] with properties.
pub async fn publish_props(
    ch: &Channel,
    q: &str,
    payloads: &[&str],
    props: BasicProperties,
) -> anyhow::Result<()> {
    for p in payloads {
        if !publish_confirm(ch, q, p.as_bytes(), props.clone()).await? {
            bail!("publish of {p:?} to {q} was nacked");
        }
    }
    Ok(())
}

/// Publishes one message to `""`/`q` and returns true on basic.ack, false on basic.nack.
pub async fn publish_confirm(
    ch: &Channel,
    q: &str,
    body: &[u8],
    props: BasicProperties,
) -> anyhow::Result<bool> {
    let confirm = tokio::time::timeout(Duration::from_secs(10), async {
        ch.basic_publish(
            "".into(),
            q.into(),
            BasicPublishOptions::default(),
            body,
            props,
        )
        .await?
        .await
    })
    .await
    .map_err(|_| anyhow!("no publisher confirm from {q} within 10 s"))??;
    Ok(confirm.is_ack())
}

/// basic.get (no_ack=false) once.
pub async fn get(ch: &Channel, q: &str) -> anyhow::Result<Option<Delivery>> {
    Ok(ch
        .basic_get(q.into(), BasicGetOptions { no_ack: false })
        .await?
        .map(|m| m.delivery))
}

/// The suites' `consume`: one basic.get per payload, each must return that payload, in order.
/// Returns the deliveries (tags, headers).
pub async fn consume(ch: &Channel, q: &str, payloads: &[&str]) -> anyhow::Result<Vec<Delivery>> {
    let mut out = Vec::new();
    for (i, p) in payloads.iter().enumerate() {
        match get(ch, q).await? {
            None => bail!(
                "basic.get #{} on {q}: expected {p:?}, got get-empty (after {:?})",
                i + 1,
                bodies(&out)
            ),
            Some(d) => {
                if d.data != p.as_bytes() {
                    bail!(
                        "basic.get #{} on {q}: expected {p:?}, got {:?} (earlier: {:?})",
                        i + 1,
                        body(&d),
                        bodies(&out)
                    );
                }
                out.push(d);
            }
        }
    }
    Ok(out)
}

/// The suites' `consume_empty`: basic.get answers get-empty.
pub async fn consume_empty(ch: &Channel, q: &str) -> anyhow::Result<()> {
    if let Some(d) = get(ch, q).await? {
        bail!("basic.get on {q}: expected get-empty, got {:?}", body(&d));
    }
    Ok(())
}

/// `?awaitMatch({basic.get_ok, payload}, basic.get, ...)`: polls basic.get until a message
/// arrives (within `limit`); it must carry `payload`.
pub async fn get_eventually(
    ch: &Channel,
    q: &str,
    payload: &str,
    limit: Duration,
) -> anyhow::Result<Delivery> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(d) = get(ch, q).await? {
            if d.data != payload.as_bytes() {
                bail!("basic.get on {q}: expected {payload:?}, got {:?}", body(&d));
            }
            return Ok(d);
        }
        if tokio::time::Instant::now() > deadline {
            bail!("no message arrived in {q} within {limit:?} (expected {payload:?})");
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Body as a string.
pub fn body(d: &Delivery) -> String {
    String::from_utf8_lossy(&d.data).into_owned()
}

fn bodies(ds: &[Delivery]) -> Vec<String> {
    ds.iter().map(body).collect()
}

/// A message header.
pub fn header<'a>(d: &'a Delivery, key: &str) -> Option<&'a AMQPValue> {
    d.properties
        .headers()
        .as_ref()
        .and_then(|h| h.inner().get(key))
}

/// A field of a table.
pub fn field<'a>(t: &'a FieldTable, key: &str) -> Option<&'a AMQPValue> {
    t.inner().get(key)
}

/// The `x-death` header as a list of tables; panics (test failure) if it is absent
/// or not an array of tables.
#[track_caller]
pub fn x_death(d: &Delivery) -> Vec<FieldTable> {
    match header(d, "x-death") {
        Some(AMQPValue::FieldArray(a)) => a
            .as_slice()
            .iter()
            .map(|v| match v {
                AMQPValue::FieldTable(t) => t.clone(),
                other => panic!("x-death element is not a table: {other:?}"),
            })
            .collect(),
        other => panic!("x-death: expected an array of tables, got {other:?}"),
    }
}

/// Passive queue.declare: the ready message count.
///
/// Errors: the broker's 404 when the queue does not exist (it closes the channel).
pub async fn passive_ready(ch: &Channel, q: &str) -> anyhow::Result<u32> {
    Ok(ch
        .queue_declare(
            q.into(),
            QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await?
        .message_count())
}

/// The effective policy name of queue `q` (`list_queues name policy`), "" if none.
pub async fn queue_policy(broker: &Broker, q: &str) -> anyhow::Result<Option<String>> {
    let out = if broker.is_external() {
        run(
            ctl(
                broker,
                &[
                    "list_queues",
                    "--quiet",
                    "--no-table-headers",
                    "name",
                    "policy",
                ],
            )?,
            CTL_TIMEOUT,
        )
        .await?
    } else {
        run(ctl(broker, &["list_queues"])?, CTL_TIMEOUT).await?
    };
    // RabbitMQ prints the two asked-for columns; quorumqctl's table has
    // policy 7th (name type ready unacked consumers dead_letter_held policy
    // leader members online).
    let column = if broker.is_external() { 1 } else { 6 };
    Ok(out.lines().find_map(|l| {
        let f: Vec<&str> = l.split('\t').collect();
        (f.len() > column && f[0] == q).then(|| f[column].trim().to_string())
    }))
}

/// Waits (≤ [`WAIT`]) until queue `q` lists `policy` as its effective policy.
pub async fn wait_policy_applied(broker: &Broker, q: &str, policy: &str) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let got = queue_policy(broker, q).await?;
        if got.as_deref() == Some(policy) {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            bail!("policy {policy} not applied to {q} within {WAIT:?} (queue lists {got:?})");
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Declares `x` as a durable fanout exchange (a DLX that routes to every bound queue).
pub async fn fanout(ch: &Channel, x: &str) -> anyhow::Result<()> {
    ch.exchange_declare(
        x.into(),
        ExchangeKind::Fanout,
        ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await?;
    Ok(())
}

/// queue.bind `q` to exchange `x` with routing key `key`, no arguments.
pub async fn bind(ch: &Channel, q: &str, x: &str, key: &str) -> anyhow::Result<()> {
    ch.queue_bind(
        q.into(),
        x.into(),
        key.into(),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await?;
    Ok(())
}
