//! [`Case`]: what every dead-letter test case opens and names, shared by
//! `tests/dead_lettering.rs` and `tests/dlx_integration.rs`. Each suite wraps it
//! in its own small `Ctx` that adds the suite's queue names (the Erlang suites'
//! `queue_name` / `source`, ...) and its `end_per_testcase`.

use std::cell::Cell;

use anyhow::bail;
use lapin::{
    options::{
        BasicNackOptions, BasicRejectOptions, ExchangeDeclareOptions, ExchangeDeleteOptions,
        QueueDeclareOptions, QueueDeleteOptions,
    },
    types::FieldTable,
    BasicProperties, Channel, Connection, ExchangeKind,
};

use super::{
    bind, clear_policy, exact, passive_ready, publish_props, set_policy, wait_for_messages,
    wait_policy_applied, POLL, WAIT,
};
use crate::{close_connection, confirm_channel, connect, unique, Broker};

/// One test case's broker ([`Broker::start`]: spawned, or `QUORUMQ_TEST_URI`'s), its
/// connection and confirm channel, and the names it owns.
pub struct Case {
    /// The broker under test.
    pub broker: Broker,
    /// The case's connection.
    pub conn: Connection,
    /// A channel on it in confirm mode.
    pub ch: Channel,
    /// The case's unique name prefix ([`unique`] of the name given to [`Case::start`]).
    pub base: String,
    /// The case's policy name, `<base>_policy`.
    pub policy: String,
    /// Whether [`Case::set_policy`] ran (so [`Case::end_checked`] clears it).
    policy_set: Cell<bool>,
}

impl Case {
    /// Starts the broker, connects and opens a confirm channel; names start with a
    /// unique prefix made from `name`.
    ///
    /// Errors: the broker does not start, or the connection or channel fails.
    pub async fn start(name: &str) -> anyhow::Result<Case> {
        let broker = Broker::start().await?;
        let conn = connect(broker.uri()).await?;
        let ch = confirm_channel(&conn).await?;
        let base = unique(name);
        Ok(Case {
            broker,
            conn,
            ch,
            policy: format!("{base}_policy"),
            base,
            policy_set: Cell::new(false),
        })
    }

    /// A durable queue.declare of `q` with arguments `a`.
    ///
    /// Errors: the broker refuses (it closes the channel).
    pub async fn declare(&self, q: &str, a: FieldTable) -> anyhow::Result<()> {
        self.ch
            .queue_declare(
                q.into(),
                QueueDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                a,
            )
            .await?;
        Ok(())
    }

    /// exchange.declare of `x` of `kind`, default options (transient), no arguments.
    ///
    /// Errors: the broker refuses (it closes the channel).
    pub async fn exchange(&self, x: &str, kind: ExchangeKind) -> anyhow::Result<()> {
        self.ch
            .exchange_declare(
                x.into(),
                kind,
                ExchangeDeclareOptions::default(),
                FieldTable::default(),
            )
            .await?;
        Ok(())
    }

    /// queue.bind `q` to exchange `x` with routing key `key`, no arguments.
    ///
    /// Errors: the broker refuses (it closes the channel).
    pub async fn bind(&self, q: &str, x: &str, key: &str) -> anyhow::Result<()> {
        bind(&self.ch, q, x, key).await
    }

    /// Polls until queue `q` shows `[messages, ready, unacked] == want`
    /// ([`wait_for_messages`]).
    ///
    /// Errors: not so within [`WAIT`].
    pub async fn wait(&self, q: &str, want: [u64; 3]) -> anyhow::Result<()> {
        wait_for_messages(&self.broker, q, want).await
    }

    /// The suites' `wait_for_messages_ready`: polls the ready count of `q` (passive
    /// declare) until it is `n`.
    ///
    /// Errors: not so within [`WAIT`]; `q` does not exist.
    pub async fn wait_ready(&self, q: &str, n: u32) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let got = passive_ready(&self.ch, q).await?;
            if got == n {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                bail!("{q}: expected {n} ready messages, got {got}");
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// basic.nack of delivery `tag`.
    ///
    /// Errors: the channel is closed.
    pub async fn nack(&self, tag: u64, multiple: bool, requeue: bool) -> anyhow::Result<()> {
        Ok(self
            .ch
            .basic_nack(tag, BasicNackOptions { multiple, requeue })
            .await?)
    }

    /// basic.reject of delivery `tag`.
    ///
    /// Errors: the channel is closed.
    pub async fn reject(&self, tag: u64, requeue: bool) -> anyhow::Result<()> {
        Ok(self
            .ch
            .basic_reject(tag, BasicRejectOptions { requeue })
            .await?)
    }

    /// Publishes `body` to `""`/`q` with per-message TTL `expiration` (ms, as text) and
    /// waits for the confirm.
    ///
    /// Errors: nacked, or no confirm within 10 s.
    pub async fn publish_expiring(
        &self,
        q: &str,
        body: &str,
        expiration: &str,
    ) -> anyhow::Result<()> {
        publish_props(
            &self.ch,
            q,
            &[body],
            BasicProperties::default().with_expiration(expiration.into()),
        )
        .await
    }

    /// Sets the case's policy, matching exactly queue `q`, to definition `json`
    /// (applied to queues).
    ///
    /// Errors: the control tool fails or refuses the policy.
    pub async fn set_policy(&self, q: &str, json: &str) -> anyhow::Result<()> {
        self.policy_set.set(true);
        set_policy(&self.broker, &self.policy, &exact(q), json).await
    }

    /// Waits until queue `q` lists the case's policy as its effective policy.
    ///
    /// Errors: not so within [`WAIT`].
    pub async fn wait_policy_applied(&self, q: &str) -> anyhow::Result<()> {
        wait_policy_applied(&self.broker, q, &self.policy).await
    }

    /// `end_per_testcase` of `dead_lettering_SUITE`: deletes `queues` and `exchanges` and
    /// clears the policy, each whatever its outcome, then closes the connection.
    pub async fn end(self, queues: &[&str], exchanges: &[&str]) -> anyhow::Result<()> {
        let ch = self.conn.create_channel().await?;
        for q in queues {
            let _ = ch
                .queue_delete((*q).into(), QueueDeleteOptions::default())
                .await;
        }
        for x in exchanges {
            let _ = ch
                .exchange_delete((*x).into(), ExchangeDeleteOptions::default())
                .await;
        }
        let _ = clear_policy(&self.broker, &self.policy).await;
        let _ = close_connection(&self.conn).await;
        Ok(())
    }

    /// `end_per_testcase` of `rabbit_fifo_dlx_integration_SUITE`: deletes every queue, each
    /// must be empty (`#'queue.delete_ok'{message_count = 0}`), then the exchanges; clears
    /// the policy if one was set; closes the connection.
    ///
    /// Errors: a queue.delete fails, or clearing the policy does. Panics (test failure)
    /// when a deleted queue still held messages (leftovers or duplicates).
    pub async fn end_checked(self, queues: &[&str], exchanges: &[&str]) -> anyhow::Result<()> {
        let ch = self.conn.create_channel().await?;
        let mut leftovers = vec![];
        for q in queues {
            match ch
                .queue_delete((*q).into(), QueueDeleteOptions::default())
                .await
            {
                Ok(n) if n != 0 => leftovers.push(format!("{q}: {n}")),
                Ok(_) => {}
                Err(e) => bail!("queue.delete {q}: {e}"),
            }
        }
        for x in exchanges {
            let _ = ch
                .exchange_delete((*x).into(), ExchangeDeleteOptions::default())
                .await;
        }
        if self.policy_set.get() {
            clear_policy(&self.broker, &self.policy).await?;
        }
        let _ = close_connection(&self.conn).await;
        assert!(
            leftovers.is_empty(),
            "queue.delete-ok message_count must be 0 (no leftovers/duplicates): {leftovers:?}"
        );
        Ok(())
    }
}
