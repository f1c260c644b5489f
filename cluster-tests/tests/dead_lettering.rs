//! Mirror of RabbitMQ's `deps/rabbit/test/dead_lettering_SUITE.erl` (tag v3.10.8),
//! groups `quorum_queue/at_most_once` (module `at_most_once`) and
//! `quorum_queue/at_least_once` (module `at_least_once`). Each test is named after
//! the Erlang case it mirrors and follows its flow step by step: the source queue is a
//! durable quorum queue declared with the group's `queue_args`
//! (`x-queue-type: quorum` + `x-dead-letter-strategy`, and `x-overflow: reject-publish`
//! for at-least-once); dead-letter queues are declared as in the suite (durable, no
//! type, i.e. classic on RabbitMQ and quorum on quorumq, whose durable queues are
//! always quorum). `wait_for_messages` checks `[messages, messages_ready,
//! messages_unacknowledged]` through `rabbitmqctl list_queues` / `quorumqctl list_queues`
//! (see `cluster_tests::dlx`). Publishes use publisher confirms (the suite publishes
//! without confirms on one channel; the order is the same).
//!
//! Run against RabbitMQ 3.10.8 with `QUORUMQ_TEST_URI=amqp://guest:guest@127.0.0.1:5672/%2f`
//! (needs `dead_letter_worker_publisher_confirm_timeout` lowered in advanced.config, as
//! the suite does, and feature flag `stream_queue` for at-least-once).
//!
//! Differences from the Erlang suite:
//! * the global counter assertions (`counted(messages_dead_lettered_*_total)`) are left
//!   out: they read `rabbit_global_counters` over Erlang RPC, which neither an AMQP
//!   client nor quorumq exposes;
//! * where the Erlang test casts a nack and immediately basic.gets from the DLQ (relying
//!   on timing), the mirror first waits for the DLQ's counters (a sync point, no new
//!   expectation); the `timer:sleep(1000)` after `set_policy` in `dead_letter_policy`
//!   is replaced by waiting until the queue lists the policy as applied;
//! * `dead_letter_headers` additionally checks the delivery's exchange (the DLX) and
//!   routing key (the DLRK), spec §3.1; `dead_letter_headers_BCC` uses the main-branch
//!   variant (CC `[cc 1, cc 2]`, BCC `[DLQ, bcc 2]`, x-death routing-keys = source + CC
//!   keys), a superset of the 3.10.8 assertions;
//! * `dead_letter_routing_key_cycle_ttl` at-least-once: the 3.10.8 suite waits for the
//!   source to show `[0,0,0]`, but 3.10.8 actually holds both cycling dead letters
//!   (`[2,0,0]`); the suite only passes because `rabbitmqctl list_queues` reports QQ
//!   counters from the last stats tick (`quorum_tick_interval`, 5 s by default). The
//!   mirror expects `[2,0,0]` held (main moved this case to integration test `cycle`).
//!   Run RabbitMQ with `{quorum_tick_interval, 256}` too, as `rabbit_fifo_dlx_integration_SUITE`
//!   does, or the counters lag by seconds;
//! * known RabbitMQ 3.10.8 bugs the strict expectation is relaxed for, against an
//!   external broker only: the at-least-once self-cycle of `dead_letter_headers_cycle` /
//!   `dead_letter_routing_key_cycle_with_reject` (3.10.8 keeps a stuck held copy, PR
//!   #8799; see `Ctx::wait_self_requeued`), and the second round of
//!   `dead_letter_reject_expire_expire` (3.10.8 drops it);
//! * four cases exist only in the main-branch suite and are mirrored here because the
//!   3.10.8 reference passes them: `dead_letter_reject_expire_expire`,
//!   `dead_letter_nack_requeue_nack_norequeue_basic_get`,
//!   `dead_letter_nack_requeue_nack_norequeue_basic_consume`,
//!   `dead_letter_headers_should_be_appended_for_each_event`.
//!
//! Skipped cases, and why:
//! * groups `classic_queue` and `mirrored_queue` (classic / mirrored classic source
//!   queues), including `dead_letter_max_length_reject_publish_dlx` (classic-only in
//!   3.10.8, where quorum queues treat `reject-publish-dlx` as drop-head; quorumq's
//!   quorum-queue version is `tests/reject_publish_dlx.rs`);
//! * `metric_maxlen`, `metric_rejected`, `metric_expired_queue_msg_ttl`,
//!   `metric_expired_per_msg_msg_ttl` (group `disabled`): they only assert global
//!   counters read over Erlang RPC;
//! * `dead_letter_extra_bcc`: sets the internal `extra_bcc` queue option over Erlang RPC
//!   (no AMQP or CLI way to do it);
//! * at-least-once variants of `dead_letter_max_length_drop_head`,
//!   `dead_letter_routing_key_cycle_max_length`, `dead_letter_headers_reason_maxlen` and
//!   `dead_letter_missing_exchange`: excluded by the suite itself (at-least-once needs
//!   reject-publish; the missing-exchange case is `dlx_missing` in `dlx_integration.rs`);
//! * main-branch only: `dead_letter_headers_should_not_be_appended_for_republish`
//!   (asserts 4.x semantics, client x-death ignored, which 3.10.8 does not have, and
//!   republishes from a second node) and `stream` (stream target queue).

#![allow(non_snake_case)]

use cluster_tests::dlx::*;
// The suite names its strategy parameter `s`; longstr values are `ls` here.
use cluster_tests::s as ls;
use cluster_tests::*;
use futures::StreamExt;
use lapin::{
    options::{
        BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions,
        QueueBindOptions,
    },
    types::{AMQPValue, FieldTable},
    BasicProperties, ExchangeKind,
};
use std::time::Duration;

const T: Duration = Duration::from_secs(90);

/// A case of the suite: the shared [`Case`] and the suite's names.
struct Ctx {
    case: Case,
    s: Strategy,
    /// `queue_name`
    q: String,
    /// `queue_name_dlx`
    dlq: String,
    /// `queue_name_dlx_2`
    dlq2: String,
    /// `dlx_exchange`
    dlx: String,
    extra_queues: Vec<String>,
    extra_exchanges: Vec<String>,
}

impl std::ops::Deref for Ctx {
    type Target = Case;

    fn deref(&self) -> &Case {
        &self.case
    }
}

impl Ctx {
    async fn new(case: &str, s: Strategy) -> anyhow::Result<Ctx> {
        let group = match s {
            Strategy::AtMostOnce => "at_most_once",
            Strategy::AtLeastOnce => "at_least_once",
        };
        let case = Case::start(&format!("{group}_{case}")).await?;
        let base = case.base.clone();
        Ok(Ctx {
            case,
            s,
            q: base.clone(),
            dlq: format!("{base}_2"),
            dlq2: format!("{base}_3"),
            dlx: format!("{base}_dlx_exchange"),
            extra_queues: vec![],
            extra_exchanges: vec![],
        })
    }

    /// The group's queue_args plus `extra` (the suite's `DeadLetterArgs ++ Args ++ ExtraArgs`).
    fn qargs(&self, dl: &[(&str, AMQPValue)], extra: &[(&str, AMQPValue)]) -> FieldTable {
        let mut v: Vec<(&str, AMQPValue)> = dl.to_vec();
        v.extend(self.s.queue_args());
        v.extend(extra.iter().cloned());
        table(&v)
    }

    /// The suite's `declare_dead_letter_queues/5`.
    async fn declare_dead_letter_queues(&self, extra: &[(&str, AMQPValue)]) -> anyhow::Result<()> {
        self.exchange(&self.dlx, ExchangeKind::Direct).await?;
        let a = self.qargs(
            &[
                ("x-dead-letter-exchange", s(&self.dlx)),
                ("x-dead-letter-routing-key", s(&self.dlq)),
            ],
            extra,
        );
        self.declare(&self.q, a).await?;
        self.declare(&self.dlq, FieldTable::default()).await?;
        self.bind(&self.dlq, &self.dlx, &self.dlq).await
    }

    /// After a rejection that dead-letters a message back into its own source queue
    /// (DLX "" without DLRK): the source holds it as one ready message, `[1,1,0]`.
    /// Known RabbitMQ 3.10 bug (rabbitmq-server PR #8799, fixed in 3.11/3.12 only): an
    /// at-least-once worker whose target is its own source queue never gets the
    /// confirm, so 3.10.8 keeps a stuck held copy and lists `[2,1,0]` forever. Against an
    /// external broker in at-least-once mode only ready=1/unacked=0 is checked; against
    /// quorumq the full `[1,1,0]` is required.
    async fn wait_self_requeued(&self, q: &str) -> anyhow::Result<()> {
        if self.s == Strategy::AtLeastOnce && self.broker.is_external() {
            let deadline = tokio::time::Instant::now() + WAIT;
            loop {
                let got = queue_counts(&self.broker, q).await?;
                if matches!(got, Some([_, 1, 0])) {
                    return Ok(());
                }
                if tokio::time::Instant::now() > deadline {
                    anyhow::bail!("queue {q}: expected ready=1 unacked=0, got {got:?}");
                }
                tokio::time::sleep(POLL).await;
            }
        }
        self.wait(q, [1, 1, 0]).await
    }

    /// The suite's `end_per_testcase`: delete the queues and the exchange, clear the policy.
    async fn cleanup(self) -> anyhow::Result<()> {
        let queues: Vec<&str> = [&self.q, &self.dlq, &self.dlq2]
            .into_iter()
            .chain(self.extra_queues.iter())
            .map(String::as_str)
            .collect();
        let exchanges: Vec<&str> = std::iter::once(&self.dlx)
            .chain(self.extra_exchanges.iter())
            .map(String::as_str)
            .collect();
        self.case.end(&queues, &exchanges).await
    }
}

fn props_headers(pairs: &[(&str, AMQPValue)]) -> BasicProperties {
    BasicProperties::default().with_headers(table(pairs))
}

fn tags(ds: &[lapin::message::Delivery]) -> Vec<u64> {
    ds.iter().map(|d| d.delivery_tag).collect()
}

#[track_caller]
fn assert_field(t: &FieldTable, key: &str, want: AMQPValue) {
    assert_eq!(field(t, key), Some(&want), "x-death field {key:?} in {t:?}");
}

// ---------------------------------------------------------------- rejections

/// nack(P3, multiple=false) dead-letters P3 only; then P1, P2 in that order.
async fn dead_letter_nack(s: Strategy) -> anyhow::Result<()> {
    let c = Ctx::new("dead_letter_nack", s).await?;
    c.declare_dead_letter_queues(&[]).await?;
    publish(&c.ch, &c.q, &["msg1", "msg2", "msg3"]).await?;
    c.wait(&c.q, [3, 3, 0]).await?;
    let t = tags(&consume(&c.ch, &c.q, &["msg1", "msg2", "msg3"]).await?);
    c.nack(t[2], false, false).await?;
    c.wait(&c.dlq, [1, 1, 0]).await?;
    consume_empty(&c.ch, &c.q).await?;
    consume(&c.ch, &c.dlq, &["msg3"]).await?;
    consume_empty(&c.ch, &c.dlq).await?;
    c.nack(t[0], false, false).await?;
    c.nack(t[1], false, false).await?;
    consume_empty(&c.ch, &c.q).await?;
    c.wait(&c.dlq, [3, 2, 1]).await?;
    consume(&c.ch, &c.dlq, &["msg1", "msg2"]).await?;
    consume_empty(&c.ch, &c.dlq).await?;
    c.cleanup().await
}

/// nack(tag3, multiple=true) dead-letters P1, P2, P3 in order.
async fn dead_letter_multiple_nack(s: Strategy) -> anyhow::Result<()> {
    let c = Ctx::new("dead_letter_multiple_nack", s).await?;
    c.declare_dead_letter_queues(&[]).await?;
    publish(&c.ch, &c.q, &["msg1", "msg2", "msg3"]).await?;
    c.wait(&c.q, [3, 3, 0]).await?;
    let t = tags(&consume(&c.ch, &c.q, &["msg1", "msg2", "msg3"]).await?);
    c.nack(t[2], true, false).await?;
    c.wait(&c.dlq, [3, 3, 0]).await?;
    consume(&c.ch, &c.dlq, &["msg1", "msg2", "msg3"]).await?;
    consume_empty(&c.ch, &c.dlq).await?;
    consume_empty(&c.ch, &c.q).await?;
    c.cleanup().await
}

/// nack(P3, requeue=true): no dead-lettering, P3 is back in the source.
async fn dead_letter_nack_requeue(s: Strategy) -> anyhow::Result<()> {
    let c = Ctx::new("dead_letter_nack_requeue", s).await?;
    c.declare_dead_letter_queues(&[]).await?;
    publish(&c.ch, &c.q, &["msg1", "msg2", "msg3"]).await?;
    c.wait(&c.q, [3, 3, 0]).await?;
    let t = tags(&consume(&c.ch, &c.q, &["msg1", "msg2", "msg3"]).await?);
    consume_empty(&c.ch, &c.q).await?;
    c.nack(t[2], false, true).await?;
    c.wait(&c.q, [3, 1, 2]).await?;
    consume(&c.ch, &c.q, &["msg3"]).await?;
    consume_empty(&c.ch, &c.q).await?;
    consume_empty(&c.ch, &c.dlq).await?;
    c.cleanup().await
}

/// nack(tag3, multiple=true, requeue=true): all three back, redelivered P1, P2, P3.
async fn dead_letter_nack_requeue_multiple(s: Strategy) -> anyhow::Result<()> {
    let c = Ctx::new("dead_letter_nack_requeue_multiple", s).await?;
    c.declare_dead_letter_queues(&[]).await?;
    publish(&c.ch, &c.q, &["msg1", "msg2", "msg3"]).await?;
    c.wait(&c.q, [3, 3, 0]).await?;
    let t = tags(&consume(&c.ch, &c.q, &["msg1", "msg2", "msg3"]).await?);
    consume_empty(&c.ch, &c.q).await?;
    c.nack(t[2], true, true).await?;
    c.wait(&c.q, [3, 3, 0]).await?;
    consume(&c.ch, &c.q, &["msg1", "msg2", "msg3"]).await?;
    consume_empty(&c.ch, &c.q).await?;
    consume_empty(&c.ch, &c.dlq).await?;
    c.cleanup().await
}

/// reject(P1, requeue=false) dead-letters P1; P2, P3 stay.
async fn dead_letter_reject(s: Strategy) -> anyhow::Result<()> {
    let c = Ctx::new("dead_letter_reject", s).await?;
    c.declare_dead_letter_queues(&[]).await?;
    publish(&c.ch, &c.q, &["msg1", "msg2", "msg3"]).await?;
    c.wait(&c.q, [3, 3, 0]).await?;
    let t = tags(&consume(&c.ch, &c.q, &["msg1"]).await?);
    c.reject(t[0], false).await?;
    c.wait(&c.dlq, [1, 1, 0]).await?;
    consume(&c.ch, &c.dlq, &["msg1"]).await?;
    consume_empty(&c.ch, &c.dlq).await?;
    consume(&c.ch, &c.q, &["msg2", "msg3"]).await?;
    consume_empty(&c.ch, &c.q).await?;
    c.cleanup().await
}

/// 100 messages rejected one by one by a push consumer reach the DLQ in publish order.
async fn dead_letter_reject_many(s: Strategy) -> anyhow::Result<()> {
    let c = Ctx::new("dead_letter_reject_many", s).await?;
    c.declare_dead_letter_queues(&[]).await?;
    let payloads: Vec<String> = (1..=100).map(|i| i.to_string()).collect();
    let p: Vec<&str> = payloads.iter().map(String::as_str).collect();
    for chunk in p.chunks(100) {
        for m in chunk {
            c.ch.basic_publish(
                "".into(),
                c.q.as_str().into(),
                Default::default(),
                m.as_bytes(),
                BasicProperties::default(),
            )
            .await?;
        }
        let nacked = c.ch.wait_for_confirms().await?;
        assert!(
            nacked.is_empty(),
            "publishes nacked or returned: {}",
            nacked.len()
        );
    }
    c.wait(&c.q, [100, 100, 0]).await?;
    let mut consumer =
        c.ch.basic_consume(
            c.q.as_str().into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    for want in &p {
        let d = match tokio::time::timeout(Duration::from_secs(5), consumer.next()).await {
            Ok(Some(Ok(d))) => d,
            other => anyhow::bail!("expected delivery {want:?}, got {other:?}"),
        };
        assert_eq!(body(&d), *want, "push consumer delivery order");
        c.reject(d.delivery_tag, false).await?;
    }
    c.ch.basic_cancel(consumer.tag(), BasicCancelOptions::default())
        .await?;
    c.wait(&c.dlq, [100, 100, 0]).await?;
    consume(&c.ch, &c.dlq, &p).await?;
    consume_empty(&c.ch, &c.dlq).await?;
    c.cleanup().await
}

/// Policy delivery-limit 50 (requeue to the head); reject(P1, requeue=true): P1, P2, P3.
async fn dead_letter_reject_requeue(s: Strategy) -> anyhow::Result<()> {
    let c = Ctx::new("dead_letter_reject_requeue", s).await?;
    c.declare_dead_letter_queues(&[]).await?;
    c.set_policy(&c.q, r#"{"delivery-limit": 50}"#).await?;
    c.wait_policy_applied(&c.q).await?;
    publish(&c.ch, &c.q, &["msg1", "msg2", "msg3"]).await?;
    c.wait(&c.q, [3, 3, 0]).await?;
    let t = tags(&consume(&c.ch, &c.q, &["msg1"]).await?);
    c.reject(t[0], true).await?;
    c.wait(&c.q, [3, 3, 0]).await?;
    consume(&c.ch, &c.q, &["msg1", "msg2", "msg3"]).await?;
    consume_empty(&c.ch, &c.q).await?;
    consume_empty(&c.ch, &c.dlq).await?;
    c.cleanup().await
}

/// rabbitmq-server#4940: reject requeue=true (no limit), then reject requeue=false.
async fn dead_letter_reject_requeue_reject_norequeue(s: Strategy) -> anyhow::Result<()> {
    let c = Ctx::new("dead_letter_reject_requeue_reject_norequeue", s).await?;
    c.declare_dead_letter_queues(&[]).await?;
    publish(&c.ch, &c.q, &["msg"]).await?;
    c.wait(&c.q, [1, 1, 0]).await?;
    let t0 = tags(&consume(&c.ch, &c.q, &["msg"]).await?)[0];
    c.wait(&c.q, [1, 0, 1]).await?;
    c.reject(t0, true).await?;
    c.wait(&c.q, [1, 1, 0]).await?;
    let t1 = tags(&consume(&c.ch, &c.q, &["msg"]).await?)[0];
    c.wait(&c.q, [1, 0, 1]).await?;
    c.reject(t1, false).await?;
    c.wait(&c.dlq, [1, 1, 0]).await?;
    consume(&c.ch, &c.dlq, &["msg"]).await?;
    consume_empty(&c.ch, &c.dlq).await?;
    consume_empty(&c.ch, &c.q).await?;
    c.cleanup().await
}

/// (main-branch case) Policy limit 50; get 3; nack(tag2, multiple, requeue); get P1, P2
/// again; nack(tag5, multiple, requeue=false): DLQ order P3, P1, P2.
async fn dead_letter_nack_requeue_nack_norequeue_basic_get(s: Strategy) -> anyhow::Result<()> {
    let c = Ctx::new("dead_letter_nack_requeue_nack_norequeue_basic_get", s).await?;
    c.set_policy(&c.q, r#"{"delivery-limit": 50}"#).await?;
    c.declare_dead_letter_queues(&[]).await?;
    c.wait_policy_applied(&c.q).await?;
    publish(&c.ch, &c.q, &["msg1", "msg2", "msg3"]).await?;
    c.wait(&c.q, [3, 3, 0]).await?;
    let t = tags(&consume(&c.ch, &c.q, &["msg1", "msg2", "msg3"]).await?);
    c.wait(&c.q, [3, 0, 3]).await?;
    c.nack(t[1], true, true).await?;
    c.wait(&c.q, [3, 2, 1]).await?;
    let t2 = tags(&consume(&c.ch, &c.q, &["msg1", "msg2"]).await?);
    c.wait(&c.q, [3, 0, 3]).await?;
    c.nack(t2[1], true, false).await?;
    c.wait(&c.dlq, [3, 3, 0]).await?;
    consume(&c.ch, &c.dlq, &["msg3", "msg1", "msg2"]).await?;
    consume_empty(&c.ch, &c.dlq).await?;
    consume_empty(&c.ch, &c.q).await?;
    c.cleanup().await
}

/// (main-branch case) Same with basic.consume: redelivery m1, m2; DLQ order m3, m1, m2.
async fn dead_letter_nack_requeue_nack_norequeue_basic_consume(s: Strategy) -> anyhow::Result<()> {
    let c = Ctx::new("dead_letter_nack_requeue_nack_norequeue_basic_consume", s).await?;
    c.set_policy(&c.q, r#"{"delivery-limit": 50}"#).await?;
    c.declare_dead_letter_queues(&[]).await?;
    c.wait_policy_applied(&c.q).await?;
    publish(&c.ch, &c.q, &["m1", "m2", "m3"]).await?;
    let cch = c.conn.create_channel().await?;
    let mut c1 = cch
        .basic_consume(
            c.q.as_str().into(),
            "ctag 1".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let mut c2 = cch
        .basic_consume(
            c.dlq.as_str().into(),
            "ctag 2".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let first = consume_n(&mut c1, 3, Duration::from_secs(10)).await?;
    assert_eq!(
        first.iter().map(body).collect::<Vec<_>>(),
        ["m1", "m2", "m3"]
    );
    c.wait(&c.q, [3, 0, 3]).await?;
    cch.basic_nack(
        first[1].delivery_tag,
        BasicNackOptions {
            multiple: true,
            requeue: true,
        },
    )
    .await?;
    let again = consume_n(&mut c1, 2, Duration::from_secs(10)).await?;
    assert_eq!(
        again.iter().map(body).collect::<Vec<_>>(),
        ["m1", "m2"],
        "redelivery order"
    );
    cch.basic_nack(
        again[1].delivery_tag,
        BasicNackOptions {
            multiple: true,
            requeue: false,
        },
    )
    .await?;
    let dl = consume_n(&mut c2, 3, Duration::from_secs(10)).await?;
    assert_eq!(
        dl.iter().map(body).collect::<Vec<_>>(),
        ["m3", "m1", "m2"],
        "dead-letter order"
    );
    c.wait(&c.dlq, [3, 0, 3]).await?;
    cch.basic_ack(dl[2].delivery_tag, BasicAckOptions { multiple: true })
        .await?;
    c.wait(&c.q, [0, 0, 0]).await?;
    c.wait(&c.dlq, [0, 0, 0]).await?;
    c.cleanup().await
}

/// (main-branch case, #11159) Q1 -rejected-> Q2 (TTL 5) -expired-> Q3 (TTL 5) -expired-> Q1, twice.
async fn dead_letter_reject_expire_expire(s: Strategy) -> anyhow::Result<()> {
    let mut c = Ctx::new("dead_letter_reject_expire_expire", s).await?;
    let (q1, q2, q3) = (
        format!("{}_b", c.q),
        format!("{}_a2", c.q),
        format!("{}_a3", c.q),
    );
    c.extra_queues.extend([q1.clone(), q2.clone(), q3.clone()]);
    let dl = |rk: &str| {
        vec![
            ("x-dead-letter-exchange", ls("")),
            ("x-dead-letter-routing-key", ls(rk)),
        ]
    };
    c.declare(&q1, c.qargs(&[], &dl(&q2))).await?;
    c.declare(
        &q2,
        c.qargs(&[], &[dl(&q3), vec![("x-message-ttl", long(5))]].concat()),
    )
    .await?;
    c.declare(
        &q3,
        c.qargs(&[], &[dl(&q1), vec![("x-message-ttl", long(5))]].concat()),
    )
    .await?;
    publish(&c.ch, &q1, &["msg"]).await?;
    c.wait(&q1, [1, 1, 0]).await?;
    let t1 = tags(&consume(&c.ch, &q1, &["msg"]).await?)[0];
    c.reject(t1, false).await?;
    c.wait(&q1, [1, 1, 0]).await?;
    if c.broker.is_external() {
        // RabbitMQ 3.10.8 drops the message on the second round: it reorders the older
        // x-death entries on every death (spec §10.1), so the cycle check at Q2 -> Q3 sees
        // the Q3 entry before the Q1 `rejected` one and drops it (the #11159 symptom; the
        // test exists in the main-branch suite only). The first round is still checked.
        return c.cleanup().await;
    }
    let d2 = consume(&c.ch, &q1, &["msg"]).await?.remove(0);
    c.reject(d2.delivery_tag, false).await?;
    c.wait(&q1, [1, 1, 0]).await?;
    c.cleanup().await
}

// ------------------------------------------------------------ length / ttl

/// x-max-length 1: P3 kept, P1 then P2 dead-lettered.
async fn dead_letter_max_length_drop_head(s: Strategy) -> anyhow::Result<()> {
    let c = Ctx::new("dead_letter_max_length_drop_head", s).await?;
    c.declare_dead_letter_queues(&[("x-max-length", long(1))])
        .await?;
    publish(&c.ch, &c.q, &["msg1", "msg2", "msg3"]).await?;
    c.wait(&c.q, [1, 1, 0]).await?;
    consume(&c.ch, &c.q, &["msg3"]).await?;
    consume_empty(&c.ch, &c.q).await?;
    c.wait(&c.dlq, [2, 2, 0]).await?;
    consume(&c.ch, &c.dlq, &["msg1", "msg2"]).await?;
    consume_empty(&c.ch, &c.dlq).await?;
    c.cleanup().await
}

/// x-message-ttl 1: the message reaches the DLQ.
async fn dead_letter_ttl(s: Strategy) -> anyhow::Result<()> {
    let c = Ctx::new("dead_letter_ttl", s).await?;
    c.declare_dead_letter_queues(&[("x-message-ttl", long(1))])
        .await?;
    publish(&c.ch, &c.q, &["msg1"]).await?;
    c.wait(&c.dlq, [1, 1, 0]).await?;
    consume_empty(&c.ch, &c.q).await?;
    consume(&c.ch, &c.dlq, &["msg1"]).await?;
    c.cleanup().await
}

/// The DLX does not exist: the rejected message vanishes; after declaring and binding
/// it, the next rejection arrives.
async fn dead_letter_missing_exchange(s: Strategy) -> anyhow::Result<()> {
    let mut c = Ctx::new("dead_letter_missing_exchange", s).await?;
    let x = format!("{}_dlx-exchange-2", c.q);
    c.extra_exchanges.push(x.clone());
    let a = c.qargs(
        &[
            ("x-max-length", long(1)),
            ("x-dead-letter-exchange", ls(&x)),
            ("x-dead-letter-routing-key", ls(&c.dlq)),
        ],
        &[],
    );
    c.declare(&c.q, a).await?;
    c.declare(&c.dlq, FieldTable::default()).await?;
    publish(&c.ch, &c.q, &["msg1"]).await?;
    c.wait(&c.q, [1, 1, 0]).await?;
    let t = tags(&consume(&c.ch, &c.q, &["msg1"]).await?)[0];
    c.reject(t, false).await?;
    c.wait(&c.q, [0, 0, 0]).await?;
    consume_empty(&c.ch, &c.dlq).await?;
    c.exchange(&x, ExchangeKind::Direct).await?;
    c.bind(&c.dlq, &x, &c.dlq).await?;
    publish(&c.ch, &c.q, &["msg2"]).await?;
    c.wait(&c.q, [1, 1, 0]).await?;
    let t = tags(&consume(&c.ch, &c.q, &["msg2"]).await?)[0];
    c.reject(t, false).await?;
    c.wait(&c.dlq, [1, 1, 0]).await?;
    consume(&c.ch, &c.dlq, &["msg2"]).await?;
    consume_empty(&c.ch, &c.dlq).await?;
    c.cleanup().await
}

// ---------------------------------------------------------------- routing

/// No DLRK, DLQ not bound: MO loses P1, LO holds it; after binding the DLQ with the
/// source queue name, MO delivers P2 only, LO delivers P1 and P2.
async fn dead_letter_routing_key(s: Strategy) -> anyhow::Result<()> {
    let c = Ctx::new("dead_letter_routing_key", s).await?;
    c.exchange(&c.dlx, ExchangeKind::Direct).await?;
    c.declare(
        &c.q,
        c.qargs(&[("x-dead-letter-exchange", ls(&c.dlx))], &[]),
    )
    .await?;
    c.declare(&c.dlq, FieldTable::default()).await?;
    publish(&c.ch, &c.q, &["msg1"]).await?;
    c.wait(&c.q, [1, 1, 0]).await?;
    let t = tags(&consume(&c.ch, &c.q, &["msg1"]).await?)[0];
    c.nack(t, false, false).await?;
    match s {
        Strategy::AtMostOnce => c.wait(&c.q, [0, 0, 0]).await?,
        Strategy::AtLeastOnce => c.wait(&c.q, [1, 0, 0]).await?,
    }
    consume_empty(&c.ch, &c.q).await?;
    consume_empty(&c.ch, &c.dlq).await?;
    c.bind(&c.dlq, &c.dlx, &c.q).await?;
    publish(&c.ch, &c.q, &["msg2"]).await?;
    c.wait(&c.q, [1, 1, 0]).await?;
    let t = tags(&consume(&c.ch, &c.q, &["msg2"]).await?)[0];
    c.nack(t, false, false).await?;
    match s {
        Strategy::AtMostOnce => {
            c.wait(&c.dlq, [1, 1, 0]).await?;
            consume(&c.ch, &c.dlq, &["msg2"]).await?;
        }
        Strategy::AtLeastOnce => {
            c.wait(&c.dlq, [2, 2, 0]).await?;
            consume(&c.ch, &c.dlq, &["msg1", "msg2"]).await?;
        }
    }
    consume_empty(&c.ch, &c.q).await?;
    c.cleanup().await
}

async fn routing_key_header(c: Ctx, hdr: &str) -> anyhow::Result<()> {
    c.exchange(&c.dlx, ExchangeKind::Direct).await?;
    c.declare(&c.q, c.qargs(&[("x-dead-letter-exchange", s(&c.dlx))], &[]))
        .await?;
    c.declare(&c.dlq, FieldTable::default()).await?;
    c.bind(&c.dlq, &c.dlx, &c.dlq).await?;
    publish(&c.ch, &c.q, &["msg1"]).await?;
    publish_props(
        &c.ch,
        &c.q,
        &["msg2"],
        props_headers(&[(hdr, ls_array(&[&c.dlq]))]),
    )
    .await?;
    c.wait(&c.q, [2, 2, 0]).await?;
    let t = tags(&consume(&c.ch, &c.q, &["msg1", "msg2"]).await?);
    // P2 is also in the DLQ via the default exchange (sender-selected distribution).
    consume(&c.ch, &c.dlq, &["msg2"]).await?;
    c.nack(t[1], true, false).await?;
    // The second message is routed to the DLQ through the DLX with the CC/BCC key.
    c.wait(&c.dlq, [2, 1, 1]).await?;
    consume_empty(&c.ch, &c.q).await?;
    consume(&c.ch, &c.dlq, &["msg2"]).await?;
    consume_empty(&c.ch, &c.dlq).await?;
    c.cleanup().await
}

/// No DLRK; P2 published with CC=[DLQ]: after nack the DLX routes it with the CC key.
async fn dead_letter_routing_key_header_CC(s: Strategy) -> anyhow::Result<()> {
    routing_key_header(
        Ctx::new("dead_letter_routing_key_header_CC", s).await?,
        "CC",
    )
    .await
}

/// Same with BCC=[DLQ].
async fn dead_letter_routing_key_header_BCC(s: Strategy) -> anyhow::Result<()> {
    routing_key_header(
        Ctx::new("dead_letter_routing_key_header_BCC", s).await?,
        "BCC",
    )
    .await
}

// ---------------------------------------------------------------- cycles

/// x-max-length 1, DLX "" without DLRK: P1 would cycle into the same queue and is dropped.
async fn dead_letter_routing_key_cycle_max_length(s: Strategy) -> anyhow::Result<()> {
    let c = Ctx::new("dead_letter_routing_key_cycle_max_length", s).await?;
    c.declare(
        &c.q,
        c.qargs(
            &[
                ("x-max-length", long(1)),
                ("x-dead-letter-exchange", ls("")),
            ],
            &[],
        ),
    )
    .await?;
    publish(&c.ch, &c.q, &["msg1", "msg2"]).await?;
    c.wait(&c.q, [1, 1, 0]).await?;
    let t = tags(&consume(&c.ch, &c.q, &["msg2"]).await?)[0];
    consume_empty(&c.ch, &c.q).await?;
    c.ch.basic_ack(t, BasicAckOptions::default()).await?;
    c.wait(&c.q, [0, 0, 0]).await?;
    consume_empty(&c.ch, &c.q).await?;
    c.cleanup().await
}

/// TTL 1, DLX "" without DLRK: both messages expire and the cycle drops them.
async fn dead_letter_routing_key_cycle_ttl(s: Strategy) -> anyhow::Result<()> {
    let c = Ctx::new("dead_letter_routing_key_cycle_ttl", s).await?;
    c.declare(
        &c.q,
        c.qargs(
            &[
                ("x-message-ttl", long(1)),
                ("x-dead-letter-exchange", ls("")),
            ],
            &[],
        ),
    )
    .await?;
    publish(&c.ch, &c.q, &["msg1", "msg2"]).await?;
    match s {
        Strategy::AtMostOnce => c.wait(&c.q, [0, 0, 0]).await?,
        // at-least-once never drops a cycling dead letter: both stay held (spec §4, as in
        // the integration case `cycle`). The 3.10.8 suite expects [0,0,0] here, which only
        // passes because `messages` is read before the queue's stats tick (see file doc).
        Strategy::AtLeastOnce => {
            c.wait(&c.q, [2, 0, 0]).await?;
            consistently_messages(&c.broker, &c.q, [2, 0, 0], Duration::from_secs(2)).await?;
        }
    }
    consume_empty(&c.ch, &c.q).await?;
    c.cleanup().await
}

/// DLX "" without DLRK: nack requeue=false re-enqueues into the same queue, twice.
async fn dead_letter_routing_key_cycle_with_reject(s: Strategy) -> anyhow::Result<()> {
    let c = Ctx::new("dead_letter_routing_key_cycle_with_reject", s).await?;
    c.declare(&c.q, c.qargs(&[("x-dead-letter-exchange", ls(""))], &[]))
        .await?;
    publish(&c.ch, &c.q, &["msg1"]).await?;
    c.wait(&c.q, [1, 1, 0]).await?;
    let t = tags(&consume(&c.ch, &c.q, &["msg1"]).await?)[0];
    c.nack(t, false, false).await?;
    c.wait_self_requeued(&c.q).await?;
    let t = tags(&consume(&c.ch, &c.q, &["msg1"]).await?)[0];
    c.nack(t, false, false).await?;
    c.wait_self_requeued(&c.q).await?;
    consume(&c.ch, &c.q, &["msg1"]).await?;
    c.cleanup().await
}

// ---------------------------------------------------------------- policies

/// No DL arguments: the first nack drops; after a policy sets DLX + DLRK the second
/// nack reaches the DLQ.
async fn dead_letter_policy(s: Strategy) -> anyhow::Result<()> {
    let c = Ctx::new("dead_letter_policy", s).await?;
    // Declaring with x-dead-letter-strategy but without a DLX fails: drop the strategy.
    let a: Vec<(&str, AMQPValue)> = s
        .queue_args()
        .into_iter()
        .filter(|(k, _)| *k != "x-dead-letter-strategy")
        .collect();
    c.exchange(&c.dlx, ExchangeKind::Direct).await?;
    c.declare(&c.q, table(&a)).await?;
    c.declare(&c.dlq, FieldTable::default()).await?;
    c.bind(&c.dlq, &c.dlx, &c.dlq).await?;
    publish(&c.ch, &c.q, &["msg1", "msg2"]).await?;
    c.wait(&c.q, [2, 2, 0]).await?;
    let t = tags(&consume(&c.ch, &c.q, &["msg1", "msg2"]).await?);
    c.nack(t[0], false, false).await?;
    c.wait(&c.q, [1, 0, 1]).await?;
    consume_empty(&c.ch, &c.q).await?;
    consume_empty(&c.ch, &c.dlq).await?;
    c.set_policy(
        &c.q,
        &format!(
            r#"{{"dead-letter-exchange": "{}", "dead-letter-routing-key": "{}"}}"#,
            c.dlx, c.dlq
        ),
    )
    .await?;
    c.wait_policy_applied(&c.q).await?;
    c.nack(t[1], false, false).await?;
    c.wait(&c.q, [0, 0, 0]).await?;
    consume_empty(&c.ch, &c.q).await?;
    c.wait(&c.dlq, [1, 1, 0]).await?;
    consume(&c.ch, &c.dlq, &["msg2"]).await?;
    consume_empty(&c.ch, &c.dlq).await?;
    c.cleanup().await
}

/// Policy DLX "" + DLRK=source set first; the declare arguments win.
async fn dead_letter_override_policy(s: Strategy) -> anyhow::Result<()> {
    let c = Ctx::new("dead_letter_override_policy", s).await?;
    c.set_policy(
        &c.q,
        &format!(
            r#"{{"dead-letter-exchange": "", "dead-letter-routing-key": "{}"}}"#,
            c.q
        ),
    )
    .await?;
    c.declare_dead_letter_queues(&[]).await?;
    c.wait_policy_applied(&c.q).await?;
    publish(&c.ch, &c.q, &["msg1"]).await?;
    c.wait(&c.q, [1, 1, 0]).await?;
    let t = tags(&consume(&c.ch, &c.q, &["msg1"]).await?)[0];
    c.nack(t, false, false).await?;
    c.wait(&c.dlq, [1, 1, 0]).await?;
    consume_empty(&c.ch, &c.q).await?;
    consume(&c.ch, &c.dlq, &["msg1"]).await?;
    c.cleanup().await
}

/// Arguments first, policy afterwards: the arguments still win.
async fn dead_letter_ignore_policy(s: Strategy) -> anyhow::Result<()> {
    let c = Ctx::new("dead_letter_ignore_policy", s).await?;
    c.declare_dead_letter_queues(&[]).await?;
    c.set_policy(
        &c.q,
        &format!(
            r#"{{"dead-letter-exchange": "", "dead-letter-routing-key": "{}"}}"#,
            c.q
        ),
    )
    .await?;
    c.wait_policy_applied(&c.q).await?;
    publish(&c.ch, &c.q, &["msg1"]).await?;
    c.wait(&c.q, [1, 1, 0]).await?;
    let t = tags(&consume(&c.ch, &c.q, &["msg1"]).await?)[0];
    c.nack(t, false, false).await?;
    c.wait(&c.dlq, [1, 1, 0]).await?;
    consume(&c.ch, &c.dlq, &["msg1"]).await?;
    consume_empty(&c.ch, &c.q).await?;
    c.cleanup().await
}

// ---------------------------------------------------------------- headers

/// One x-death entry: queue, reason rejected, time (timestamp), exchange "", count 1
/// (long), routing-keys [source].
async fn dead_letter_headers(s: Strategy) -> anyhow::Result<()> {
    let c = Ctx::new("dead_letter_headers", s).await?;
    c.declare_dead_letter_queues(&[]).await?;
    publish(&c.ch, &c.q, &["msg1"]).await?;
    c.wait(&c.q, [1, 1, 0]).await?;
    let t = tags(&consume(&c.ch, &c.q, &["msg1"]).await?)[0];
    c.nack(t, false, false).await?;
    c.wait(&c.dlq, [1, 1, 0]).await?;
    let d = consume(&c.ch, &c.dlq, &["msg1"]).await?.remove(0);
    assert_eq!(d.exchange.as_str(), c.dlx, "basic.get-ok exchange = DLX");
    assert_eq!(
        d.routing_key.as_str(),
        c.dlq,
        "basic.get-ok routing key = DLRK"
    );
    let deaths = x_death(&d);
    assert_eq!(deaths.len(), 1, "x-death: {deaths:?}");
    let death = &deaths[0];
    assert_field(death, "queue", ls(&c.q));
    assert_field(death, "reason", ls("rejected"));
    assert!(
        matches!(field(death, "time"), Some(AMQPValue::Timestamp(_))),
        "time must be a timestamp: {death:?}"
    );
    assert_field(death, "exchange", ls(""));
    assert_field(death, "count", long(1));
    assert_field(death, "routing-keys", ls_array(&[&c.q]));
    c.cleanup().await
}

/// Queue TTL: reason expired, no original-expiration.
async fn dead_letter_headers_reason_expired(s: Strategy) -> anyhow::Result<()> {
    let c = Ctx::new("dead_letter_headers_reason_expired", s).await?;
    c.declare_dead_letter_queues(&[("x-message-ttl", long(1))])
        .await?;
    publish(&c.ch, &c.q, &["msg1"]).await?;
    c.wait(&c.dlq, [1, 1, 0]).await?;
    let d = consume(&c.ch, &c.dlq, &["msg1"]).await?.remove(0);
    let deaths = x_death(&d);
    assert_eq!(deaths.len(), 1, "x-death: {deaths:?}");
    assert_field(&deaths[0], "reason", ls("expired"));
    assert_eq!(
        field(&deaths[0], "original-expiration"),
        None,
        "no original-expiration for queue TTL"
    );
    c.cleanup().await
}

/// Per-message expiration "1" (plus a second message to trigger expiry): reason expired,
/// original-expiration "1".
async fn dead_letter_headers_reason_expired_per_message(s: Strategy) -> anyhow::Result<()> {
    let c = Ctx::new("dead_letter_headers_reason_expired_per_message", s).await?;
    c.declare_dead_letter_queues(&[]).await?;
    publish_props(
        &c.ch,
        &c.q,
        &["msg1"],
        BasicProperties::default().with_expiration("1".into()),
    )
    .await?;
    publish(&c.ch, &c.q, &["msg2"]).await?;
    c.wait(&c.dlq, [1, 1, 0]).await?;
    let d = consume(&c.ch, &c.dlq, &["msg1"]).await?.remove(0);
    let deaths = x_death(&d);
    assert_eq!(deaths.len(), 1, "x-death: {deaths:?}");
    assert_field(&deaths[0], "reason", ls("expired"));
    assert_field(&deaths[0], "original-expiration", ls("1"));
    c.cleanup().await
}

/// x-max-length 1, publish 2: the dead-lettered P1 has reason maxlen.
async fn dead_letter_headers_reason_maxlen(s: Strategy) -> anyhow::Result<()> {
    let c = Ctx::new("dead_letter_headers_reason_maxlen", s).await?;
    c.declare_dead_letter_queues(&[("x-max-length", long(1))])
        .await?;
    publish(&c.ch, &c.q, &["msg1", "msg2"]).await?;
    c.wait(&c.dlq, [1, 1, 0]).await?;
    let d = consume(&c.ch, &c.dlq, &["msg1"]).await?.remove(0);
    let deaths = x_death(&d);
    assert_eq!(deaths.len(), 1, "x-death: {deaths:?}");
    assert_field(&deaths[0], "reason", ls("maxlen"));
    c.cleanup().await
}

/// DLX "" without DLRK: one entry with count 1, then still one entry with count 2.
async fn dead_letter_headers_cycle(s: Strategy) -> anyhow::Result<()> {
    let c = Ctx::new("dead_letter_headers_cycle", s).await?;
    c.declare(&c.q, c.qargs(&[("x-dead-letter-exchange", ls(""))], &[]))
        .await?;
    publish(&c.ch, &c.q, &["msg1"]).await?;
    c.wait(&c.q, [1, 1, 0]).await?;
    let t = tags(&consume(&c.ch, &c.q, &["msg1"]).await?)[0];
    c.nack(t, false, false).await?;
    c.wait_self_requeued(&c.q).await?;
    let d1 = consume(&c.ch, &c.q, &["msg1"]).await?.remove(0);
    let deaths = x_death(&d1);
    assert_eq!(deaths.len(), 1, "x-death after 1st nack: {deaths:?}");
    assert_field(&deaths[0], "count", long(1));
    c.nack(d1.delivery_tag, false, false).await?;
    c.wait_self_requeued(&c.q).await?;
    let d2 = consume(&c.ch, &c.q, &["msg1"]).await?.remove(0);
    let deaths = x_death(&d2);
    assert_eq!(deaths.len(), 1, "x-death after 2nd nack: {deaths:?}");
    assert_field(&deaths[0], "count", long(2));
    c.cleanup().await
}

/// No DLRK: the DL copy keeps CC=[DLQ] and has x-death.
async fn dead_letter_headers_CC(s: Strategy) -> anyhow::Result<()> {
    headers_cc_case("dead_letter_headers_CC", s, false).await
}

/// DLRK set: the DL copy has no CC header (3.10.8 removes it; 3.13+ keeps it) and has x-death.
async fn dead_letter_headers_CC_with_routing_key(s: Strategy) -> anyhow::Result<()> {
    headers_cc_case("dead_letter_headers_CC_with_routing_key", s, true).await
}

/// Publish with CC=[DLQ] into a queue dead-lettering to the DLQ (with the DLQ's name as DLRK
/// when `dlrk`): both copies arrive without x-death; the nacked one reaches the DLQ with
/// x-death, and keeps its CC header only without a DLRK.
async fn headers_cc_case(name: &str, s: Strategy, dlrk: bool) -> anyhow::Result<()> {
    let c = Ctx::new(name, s).await?;
    c.exchange(&c.dlx, ExchangeKind::Direct).await?;
    let mut dl = vec![("x-dead-letter-exchange", ls(&c.dlx))];
    if dlrk {
        dl.insert(0, ("x-dead-letter-routing-key", ls(&c.dlq)));
    }
    c.declare(&c.q, c.qargs(&dl, &[])).await?;
    c.declare(&c.dlq, FieldTable::default()).await?;
    c.bind(&c.dlq, &c.dlx, &c.dlq).await?;
    publish_props(
        &c.ch,
        &c.q,
        &["msg1"],
        props_headers(&[("CC", ls_array(&[&c.dlq]))]),
    )
    .await?;
    c.wait(&c.q, [1, 1, 0]).await?;
    let d1 = consume(&c.ch, &c.q, &["msg1"]).await?.remove(0);
    let d2 = consume(&c.ch, &c.dlq, &["msg1"]).await?.remove(0);
    assert_eq!(header(&d1, "x-death"), None);
    assert_eq!(header(&d2, "x-death"), None);
    c.nack(d1.delivery_tag, false, false).await?;
    c.wait(&c.dlq, [2, 1, 1]).await?;
    let d3 = consume(&c.ch, &c.dlq, &["msg1"]).await?.remove(0);
    consume_empty(&c.ch, &c.q).await?;
    if dlrk {
        assert_eq!(
            header(&d3, "CC"),
            None,
            "CC removed when a DLRK is configured (3.10.8)"
        );
    } else {
        assert_eq!(
            header(&d3, "CC"),
            Some(&ls_array(&[&c.dlq])),
            "CC kept without DLRK"
        );
    }
    assert!(
        matches!(header(&d3, "x-death"), Some(AMQPValue::FieldArray(_))),
        "x-death array"
    );
    c.cleanup().await
}

/// CC=[cc 1, cc 2], BCC=[DLQ, bcc 2]: no x-death before; after DL no BCC header, one
/// entry whose routing-keys (sorted) = [source, cc 1, cc 2].
async fn dead_letter_headers_BCC(s: Strategy) -> anyhow::Result<()> {
    let c = Ctx::new("dead_letter_headers_BCC", s).await?;
    c.exchange(&c.dlx, ExchangeKind::Direct).await?;
    c.declare(
        &c.q,
        c.qargs(&[("x-dead-letter-exchange", ls(&c.dlx))], &[]),
    )
    .await?;
    c.declare(&c.dlq, FieldTable::default()).await?;
    c.bind(&c.dlq, &c.dlx, &c.dlq).await?;
    let h = props_headers(&[
        ("CC", ls_array(&["cc 1", "cc 2"])),
        ("BCC", ls_array(&[&c.dlq, "bcc 2"])),
    ]);
    publish_props(&c.ch, &c.q, &["msg1"], h).await?;
    c.wait(&c.q, [1, 1, 0]).await?;
    let d1 = consume(&c.ch, &c.q, &["msg1"]).await?.remove(0);
    let d2 = consume(&c.ch, &c.dlq, &["msg1"]).await?.remove(0);
    assert_eq!(header(&d1, "x-death"), None);
    assert_eq!(header(&d2, "x-death"), None);
    c.nack(d1.delivery_tag, false, false).await?;
    c.wait(&c.dlq, [2, 1, 1]).await?;
    let d3 = consume(&c.ch, &c.dlq, &["msg1"]).await?.remove(0);
    consume_empty(&c.ch, &c.q).await?;
    assert_eq!(header(&d3, "BCC"), None, "BCC never delivered");
    let deaths = x_death(&d3);
    assert_eq!(deaths.len(), 1, "x-death: {deaths:?}");
    let mut keys: Vec<String> = match field(&deaths[0], "routing-keys") {
        Some(AMQPValue::FieldArray(a)) => a
            .as_slice()
            .iter()
            .map(|v| match v {
                AMQPValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
                other => panic!("routing key not a longstr: {other:?}"),
            })
            .collect(),
        other => panic!("routing-keys: {other:?}"),
    };
    keys.sort();
    let mut want = vec![c.q.clone(), "cc 1".to_string(), "cc 2".to_string()];
    want.sort();
    assert_eq!(keys, want, "x-death routing-keys include CC, exclude BCC");
    c.cleanup().await
}

/// Loop Q -> DLQ (DLX "", DLRK Q) -> Q: x-first-death-* set at the first hop, unchanged after the second.
async fn dead_letter_headers_first_death(s: Strategy) -> anyhow::Result<()> {
    let c = Ctx::new("dead_letter_headers_first_death", s).await?;
    c.exchange(&c.dlx, ExchangeKind::Direct).await?;
    let a = c.qargs(
        &[
            ("x-dead-letter-routing-key", ls(&c.dlq)),
            ("x-dead-letter-exchange", ls(&c.dlx)),
        ],
        &[],
    );
    c.declare(&c.q, a).await?;
    c.declare(
        &c.dlq,
        table(&[
            ("x-dead-letter-routing-key", ls(&c.q)),
            ("x-dead-letter-exchange", ls("")),
        ]),
    )
    .await?;
    c.bind(&c.dlq, &c.dlx, &c.dlq).await?;
    publish(&c.ch, &c.q, &["msg1"]).await?;
    c.wait(&c.q, [1, 1, 0]).await?;
    let t = tags(&consume(&c.ch, &c.q, &["msg1"]).await?)[0];
    c.nack(t, false, false).await?;
    c.wait(&c.dlq, [1, 1, 0]).await?;
    let d = consume(&c.ch, &c.dlq, &["msg1"]).await?.remove(0);
    assert_eq!(header(&d, "x-first-death-reason"), Some(&ls("rejected")));
    assert_eq!(header(&d, "x-first-death-queue"), Some(&ls(&c.q)));
    assert_eq!(header(&d, "x-first-death-exchange"), Some(&ls("")));
    c.nack(d.delivery_tag, false, false).await?;
    c.wait(&c.q, [1, 1, 0]).await?;
    let d2 = consume(&c.ch, &c.q, &["msg1"]).await?.remove(0);
    assert_eq!(header(&d2, "x-first-death-reason"), Some(&ls("rejected")));
    assert_eq!(header(&d2, "x-first-death-queue"), Some(&ls(&c.q)));
    assert_eq!(header(&d2, "x-first-death-exchange"), Some(&ls("")));
    c.cleanup().await
}

/// Headers-exchange DLX routing on x-first-death-* with x-match all-with-x / any-with-x.
async fn dead_letter_headers_first_death_route(s: Strategy) -> anyhow::Result<()> {
    let mut c = Ctx::new("dead_letter_headers_first_death_route", s).await?;
    let q1 = c.q.clone();
    let q2 = format!("{}_source_queue_2", c.q);
    c.extra_queues.push(q2.clone());
    let (expired_q, rejected_q) = (c.dlq.clone(), c.dlq2.clone());
    c.exchange(&c.dlx, ExchangeKind::Headers).await?;
    c.declare(&q1, c.qargs(&[("x-dead-letter-exchange", ls(&c.dlx))], &[]))
        .await?;
    c.declare(&q2, c.qargs(&[("x-dead-letter-exchange", ls(&c.dlx))], &[]))
        .await?;
    c.declare(&expired_q, FieldTable::default()).await?;
    c.declare(&rejected_q, FieldTable::default()).await?;
    c.ch.queue_bind(
        expired_q.as_str().into(),
        c.dlx.as_str().into(),
        "".into(),
        QueueBindOptions::default(),
        table(&[
            ("x-match", ls("all-with-x")),
            ("x-first-death-reason", ls("expired")),
            ("x-first-death-queue", ls(&q1)),
        ]),
    )
    .await?;
    c.ch.queue_bind(
        rejected_q.as_str().into(),
        c.dlx.as_str().into(),
        "".into(),
        QueueBindOptions::default(),
        table(&[
            ("x-match", ls("any-with-x")),
            ("x-first-death-reason", ls("rejected")),
        ]),
    )
    .await?;
    // 1st message expires from Q1 and is routed to the expired-DLQ.
    publish_props(
        &c.ch,
        &q1,
        &["msg1"],
        BasicProperties::default().with_expiration("0".into()),
    )
    .await?;
    c.wait(&expired_q, [1, 1, 0]).await?;
    consume(&c.ch, &expired_q, &["msg1"]).await?;
    consume_empty(&c.ch, &expired_q).await?;
    c.wait(&q1, [0, 0, 0]).await?;
    // 2nd message expires from Q2: no binding matches.
    publish_props(
        &c.ch,
        &q2,
        &["msg2"],
        BasicProperties::default().with_expiration("0".into()),
    )
    .await?;
    let until = tokio::time::Instant::now() + Duration::from_secs(3);
    while tokio::time::Instant::now() < until {
        consume_empty(&c.ch, &expired_q).await?;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // 3rd message is rejected from Q2 and routed to the rejected-DLQ.
    publish(&c.ch, &q2, &["msg3"]).await?;
    match s {
        Strategy::AtMostOnce => c.wait(&q2, [1, 1, 0]).await?,
        // msg2 stays held (unroutable) in Q2.
        Strategy::AtLeastOnce => c.wait(&q2, [2, 1, 0]).await?,
    }
    let t = tags(&consume(&c.ch, &q2, &["msg3"]).await?)[0];
    c.reject(t, false).await?;
    c.wait(&rejected_q, [1, 1, 0]).await?;
    consume(&c.ch, &rejected_q, &["msg3"]).await?;
    consume_empty(&c.ch, &rejected_q).await?;
    c.cleanup().await
}

/// (main-branch case) Q -nack-> DLQ1 -nack-> DLQ2 (all quorum, DLX ""): at DLQ2 x-death
/// has 2 entries, the most recent (queue DLQ1) first.
async fn dead_letter_headers_should_be_appended_for_each_event(s: Strategy) -> anyhow::Result<()> {
    let c = Ctx::new("dead_letter_headers_should_be_appended_for_each_event", s).await?;
    let dl = |rk: &str| {
        vec![
            ("x-dead-letter-exchange", ls("")),
            ("x-dead-letter-routing-key", ls(rk)),
        ]
    };
    c.declare(&c.q, c.qargs(&dl(&c.dlq), &[])).await?;
    c.declare(&c.dlq, c.qargs(&dl(&c.dlq2), &[])).await?;
    c.declare(&c.dlq2, c.qargs(&[], &[])).await?;
    publish(&c.ch, &c.q, &["msg1"]).await?;
    c.wait(&c.q, [1, 1, 0]).await?;
    let t = tags(&consume(&c.ch, &c.q, &["msg1"]).await?)[0];
    c.wait(&c.q, [1, 0, 1]).await?;
    c.nack(t, false, false).await?;
    c.wait(&c.dlq, [1, 1, 0]).await?;
    let d1 = consume(&c.ch, &c.dlq, &["msg1"]).await?.remove(0);
    let deaths = x_death(&d1);
    assert_eq!(deaths.len(), 1, "x-death at DLQ1: {deaths:?}");
    assert_field(&deaths[0], "queue", ls(&c.q));
    c.wait(&c.dlq, [1, 0, 1]).await?;
    c.nack(d1.delivery_tag, false, false).await?;
    c.wait(&c.dlq2, [1, 1, 0]).await?;
    let d2 = consume(&c.ch, &c.dlq2, &["msg1"]).await?.remove(0);
    let deaths = x_death(&d2);
    assert_eq!(deaths.len(), 2, "x-death at DLQ2: {deaths:?}");
    assert_field(&deaths[0], "queue", ls(&c.dlq));
    assert_field(&deaths[1], "queue", ls(&c.q));
    c.cleanup().await
}

// ---------------------------------------------------------------- test entries

macro_rules! group {
    ($strategy:ident, $($case:ident),* $(,)?) => {
        $(
            #[tokio::test]
            #[allow(non_snake_case)]
            async fn $case() -> anyhow::Result<()> {
                bounded(super::T, super::$case(Strategy::$strategy)).await
            }
        )*
    };
}

/// Group `quorum_queue/at_most_once`.
mod at_most_once {
    use super::*;
    group!(
        AtMostOnce,
        dead_letter_nack,
        dead_letter_multiple_nack,
        dead_letter_nack_requeue,
        dead_letter_nack_requeue_multiple,
        dead_letter_reject,
        dead_letter_reject_expire_expire,
        dead_letter_reject_many,
        dead_letter_reject_requeue,
        dead_letter_max_length_drop_head,
        dead_letter_reject_requeue_reject_norequeue,
        dead_letter_nack_requeue_nack_norequeue_basic_get,
        dead_letter_nack_requeue_nack_norequeue_basic_consume,
        dead_letter_missing_exchange,
        dead_letter_routing_key,
        dead_letter_headers_should_be_appended_for_each_event,
        dead_letter_routing_key_header_CC,
        dead_letter_routing_key_header_BCC,
        dead_letter_routing_key_cycle_max_length,
        dead_letter_routing_key_cycle_with_reject,
        dead_letter_policy,
        dead_letter_override_policy,
        dead_letter_ignore_policy,
        dead_letter_headers,
        dead_letter_headers_reason_maxlen,
        dead_letter_headers_cycle,
        dead_letter_headers_BCC,
        dead_letter_headers_CC,
        dead_letter_headers_CC_with_routing_key,
        dead_letter_headers_first_death,
        dead_letter_headers_first_death_route,
        dead_letter_ttl,
        dead_letter_routing_key_cycle_ttl,
        dead_letter_headers_reason_expired,
        dead_letter_headers_reason_expired_per_message,
    );
}

/// Group `quorum_queue/at_least_once` (the suite's list minus the drop-head cases and
/// `dead_letter_missing_exchange`).
mod at_least_once {
    use super::*;
    group!(
        AtLeastOnce,
        dead_letter_nack,
        dead_letter_multiple_nack,
        dead_letter_nack_requeue,
        dead_letter_nack_requeue_multiple,
        dead_letter_reject,
        dead_letter_reject_expire_expire,
        dead_letter_reject_many,
        dead_letter_reject_requeue,
        dead_letter_reject_requeue_reject_norequeue,
        dead_letter_nack_requeue_nack_norequeue_basic_get,
        dead_letter_nack_requeue_nack_norequeue_basic_consume,
        dead_letter_routing_key,
        dead_letter_headers_should_be_appended_for_each_event,
        dead_letter_routing_key_header_CC,
        dead_letter_routing_key_header_BCC,
        dead_letter_routing_key_cycle_with_reject,
        dead_letter_policy,
        dead_letter_override_policy,
        dead_letter_ignore_policy,
        dead_letter_headers,
        dead_letter_headers_cycle,
        dead_letter_headers_BCC,
        dead_letter_headers_CC,
        dead_letter_headers_CC_with_routing_key,
        dead_letter_headers_first_death,
        dead_letter_headers_first_death_route,
        dead_letter_ttl,
        dead_letter_routing_key_cycle_ttl,
        dead_letter_headers_reason_expired,
        dead_letter_headers_reason_expired_per_message,
    );
}
