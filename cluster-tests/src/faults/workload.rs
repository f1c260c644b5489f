//! The fault suite's workloads: lapin publishers and consumers on every node,
//! each recording what it did in the [`History`].
//!
//! * `total-queue`: publish unique ids with confirms, consumers ack.
//! * `dead-letter`: consumers basic.reject (requeue = false) everything into
//!   an at-least-once DLX; a second set of consumers acks the DLX target.
//! * `delivery-limit`: consumers basic.nack (requeue = true); with
//!   `x-delivery-limit` 2 every message is dead-lettered with reason
//!   `delivery_limit` on its third return.
//! * `expiry`: no consumer on the source; per-message TTL 200 ms; every
//!   message expires into the DLX target with reason `expired`.
//!
//! Every dead-letter source is declared as RabbitMQ requires for
//! at-least-once (`x-dead-letter-strategy`, `x-overflow` reject-publish) and
//! dead-letters through the default exchange to its target.
//!
//! Clients reconnect to the same node after any error (every wait bounded:
//! connect 10 s, confirm [`CONFIRM_TIMEOUT`]); a publish with no answer is
//! recorded `unknown`.

use super::{
    checker::Expect,
    history::{Action, Death, History, Op},
};
use crate::{cluster::Cluster, confirm_channel, connect, open_consumer, table};
use futures::StreamExt;
use lapin::{
    message::Delivery,
    options::{
        BasicAckOptions, BasicNackOptions, BasicPublishOptions, BasicRejectOptions,
        QueueDeclareOptions,
    },
    types::{AMQPValue, FieldTable},
    BasicProperties,
};
use std::{
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};
use tokio::task::JoinHandle;

/// How long a publisher waits for a confirm before it records `unknown` and reconnects.
pub const CONFIRM_TIMEOUT: Duration = Duration::from_secs(5);
/// Consumer prefetch (basic.qos).
const PREFETCH: u16 = 20;
/// Pause between reconnect attempts.
const RECONNECT_PAUSE: Duration = Duration::from_millis(250);

/// A workload kind, as named on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Publish, consume, ack.
    TotalQueue,
    /// Reject everything into an at-least-once DLX.
    DeadLetter,
    /// Requeue everything until `x-delivery-limit` dead-letters it.
    DeliveryLimit,
    /// Per-message TTL into an at-least-once DLX.
    Expiry,
}

impl Kind {
    /// Every workload, in the order a run takes them.
    pub const ALL: [Kind; 4] = [
        Kind::TotalQueue,
        Kind::DeadLetter,
        Kind::DeliveryLimit,
        Kind::Expiry,
    ];

    /// Its command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Kind::TotalQueue => "total-queue",
            Kind::DeadLetter => "dead-letter",
            Kind::DeliveryLimit => "delivery-limit",
            Kind::Expiry => "expiry",
        }
    }

    /// The kind named `s`.
    pub fn parse(s: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == s)
    }

    /// The queue publishers write to.
    pub fn source(self) -> String {
        format!("qf.{}", self.name())
    }

    /// The DLX target, for dead-letter workloads.
    pub fn target(self) -> Option<String> {
        (self != Kind::TotalQueue).then(|| format!("qf.{}.dlx", self.name()))
    }

    /// What the checker expects of the deliveries (`faults`: 0; the runner
    /// sets the schedule's count).
    pub fn expect(self) -> Expect {
        let reason = match self {
            Kind::TotalQueue => None,
            Kind::DeadLetter => Some("rejected"),
            Kind::DeliveryLimit => Some("delivery_limit"),
            Kind::Expiry => Some("expired"),
        };
        Expect {
            queue: self.target().unwrap_or_else(|| self.source()),
            death: reason.map(|r| (r.to_string(), self.source())),
            faults: 0,
        }
    }

    /// What source-queue consumers do; None = no consumer on the source.
    fn source_action(self) -> Option<Action> {
        match self {
            Kind::TotalQueue => Some(Action::Ack),
            Kind::DeadLetter => Some(Action::Reject),
            Kind::DeliveryLimit => Some(Action::Requeue),
            Kind::Expiry => None,
        }
    }

    fn source_args(self) -> FieldTable {
        let mut args = vec![("x-queue-type", AMQPValue::LongString("quorum".into()))];
        if let Some(target) = self.target() {
            args.push(("x-dead-letter-exchange", AMQPValue::LongString("".into())));
            args.push((
                "x-dead-letter-routing-key",
                AMQPValue::LongString(target.as_str().into()),
            ));
            args.push((
                "x-dead-letter-strategy",
                AMQPValue::LongString("at-least-once".into()),
            ));
            args.push(("x-overflow", AMQPValue::LongString("reject-publish".into())));
        }
        if self == Kind::DeliveryLimit {
            args.push(("x-delivery-limit", AMQPValue::LongLongInt(2)));
        }
        table(&args)
    }
}

/// One running workload: its clients and the flags that stop them.
pub struct Workload {
    /// Which workload.
    pub kind: Kind,
    history: Arc<History>,
    next_id: Arc<AtomicU64>,
    publishing: Arc<AtomicBool>,
    consuming: Arc<AtomicBool>,
    publishers: Vec<JoinHandle<()>>,
    consumers: Vec<JoinHandle<()>>,
}

impl Workload {
    /// Declares the workload's queues through node 1 (retried while the
    /// cluster elects) and starts one publisher per node (`rate` msg/s each)
    /// and consumers on every node.
    ///
    /// Errors: the queues could not be declared within 60 s.
    pub async fn start(
        kind: Kind,
        cluster: &Cluster,
        history: Arc<History>,
        rate: u64,
    ) -> anyhow::Result<Workload> {
        let uri = cluster.uri(1);
        crate::cluster::retry(
            Duration::from_secs(60),
            "declaring the workload's queues",
            || async {
                let conn = connect(&uri).await?;
                let ch = conn.create_channel().await?;
                let durable = QueueDeclareOptions {
                    durable: true,
                    ..Default::default()
                };
                if let Some(target) = kind.target() {
                    let targs = table(&[("x-queue-type", AMQPValue::LongString("quorum".into()))]);
                    ch.queue_declare(target.as_str().into(), durable, targs)
                        .await?;
                }
                ch.queue_declare(kind.source().as_str().into(), durable, kind.source_args())
                    .await?;
                let _ = conn.close(200, "OK".into()).await;
                anyhow::Ok(())
            },
        )
        .await?;
        let mut w = Workload {
            kind,
            history,
            next_id: Arc::new(AtomicU64::new(1)),
            publishing: Arc::new(AtomicBool::new(true)),
            consuming: Arc::new(AtomicBool::new(true)),
            publishers: Vec::new(),
            consumers: Vec::new(),
        };
        for node in cluster.ids() {
            let uri = cluster.uri(node);
            w.publishers.push(tokio::spawn(publisher(
                kind,
                node,
                uri.clone(),
                rate,
                w.history.clone(),
                w.next_id.clone(),
                w.publishing.clone(),
            )));
            if let Some(action) = kind.source_action() {
                w.consumers.push(tokio::spawn(consumer(
                    kind.source(),
                    action,
                    node,
                    uri.clone(),
                    w.history.clone(),
                    w.consuming.clone(),
                )));
            }
            if let Some(target) = kind.target() {
                w.consumers.push(tokio::spawn(consumer(
                    target,
                    Action::Ack,
                    node,
                    uri,
                    w.history.clone(),
                    w.consuming.clone(),
                )));
            }
        }
        Ok(w)
    }

    /// Stops the publishers and waits for them (each ends within [`CONFIRM_TIMEOUT`] + 10 s).
    pub async fn stop_publishing(&mut self) {
        self.publishing.store(false, Ordering::SeqCst);
        for p in self.publishers.drain(..) {
            let _ = p.await;
        }
    }

    /// Stops the consumers and waits for them.
    pub async fn stop_consuming(&mut self) {
        self.consuming.store(false, Ordering::SeqCst);
        for c in self.consumers.drain(..) {
            let _ = c.await;
        }
    }

    /// The queues to watch for draining: the source and, if any, the DLX target.
    pub fn queues(&self) -> Vec<String> {
        let mut qs = vec![self.kind.source()];
        qs.extend(self.kind.target());
        qs
    }
}

/// Publishes ids through `node` at up to `rate` msg/s, one confirm at a time,
/// until `publishing` is cleared.
async fn publisher(
    kind: Kind,
    node: u64,
    uri: String,
    rate: u64,
    history: Arc<History>,
    next_id: Arc<AtomicU64>,
    publishing: Arc<AtomicBool>,
) {
    let period = Duration::from_micros(1_000_000 / rate.max(1));
    let mut props = BasicProperties::default().with_delivery_mode(2);
    if kind == Kind::Expiry {
        props = props.with_expiration("200".into());
    }
    let source = kind.source();
    while publishing.load(Ordering::SeqCst) {
        let Ok(conn) = connect(&uri).await else {
            tokio::time::sleep(RECONNECT_PAUSE).await;
            continue;
        };
        let Ok(Ok(ch)) =
            tokio::time::timeout(Duration::from_secs(10), confirm_channel(&conn)).await
        else {
            tokio::time::sleep(RECONNECT_PAUSE).await;
            continue;
        };
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while publishing.load(Ordering::SeqCst) {
            tick.tick().await;
            let id = next_id.fetch_add(1, Ordering::SeqCst);
            history.log(Op::Publish { id, node });
            let body = id.to_string();
            let sent = tokio::time::timeout(CONFIRM_TIMEOUT, async {
                ch.basic_publish(
                    "".into(),
                    source.as_str().into(),
                    BasicPublishOptions::default(),
                    body.as_bytes(),
                    props.clone(),
                )
                .await?
                .await
            })
            .await;
            match sent {
                Ok(Ok(c)) if c.is_ack() => history.log(Op::Confirmed { id, node }),
                Ok(Ok(_)) => history.log(Op::Nacked { id, node }),
                Ok(Err(e)) => {
                    history.log(Op::Unknown {
                        id,
                        node,
                        error: e.to_string(),
                    });
                    break;
                }
                Err(_) => {
                    history.log(Op::Unknown {
                        id,
                        node,
                        error: "confirm timed out".into(),
                    });
                    break;
                }
            }
        }
        // Best effort: the node may be dead or stopped.
        let _ = tokio::time::timeout(Duration::from_secs(2), conn.close(200, "OK".into())).await;
    }
}

/// Consumes `queue` through `node`, doing `action` to each delivery and
/// recording it, until `consuming` is cleared.
async fn consumer(
    queue: String,
    action: Action,
    node: u64,
    uri: String,
    history: Arc<History>,
    consuming: Arc<AtomicBool>,
) {
    while consuming.load(Ordering::SeqCst) {
        let Ok(conn) = connect(&uri).await else {
            tokio::time::sleep(RECONNECT_PAUSE).await;
            continue;
        };
        let opened = tokio::time::timeout(
            Duration::from_secs(10),
            open_consumer(&conn, &queue, PREFETCH),
        )
        .await;
        let Ok(Ok((_ch, mut deliveries))) = opened else {
            let _ =
                tokio::time::timeout(Duration::from_secs(2), conn.close(200, "OK".into())).await;
            tokio::time::sleep(RECONNECT_PAUSE).await;
            continue;
        };
        while consuming.load(Ordering::SeqCst) {
            let d = match tokio::time::timeout(Duration::from_millis(500), deliveries.next()).await
            {
                Err(_) => continue,
                Ok(Some(Ok(d))) => d,
                Ok(_) => break,
            };
            let settled = tokio::time::timeout(CONFIRM_TIMEOUT, settle(&d, action)).await;
            let done = if matches!(settled, Ok(Ok(()))) {
                action
            } else {
                Action::Failed
            };
            history.log(Op::Delivered {
                id: id_of(&d.data),
                node,
                queue: queue.clone(),
                redelivered: d.redelivered,
                action: done,
                death: first_death(&d),
            });
            if done == Action::Failed {
                break;
            }
        }
        let _ = tokio::time::timeout(Duration::from_secs(2), conn.close(200, "OK".into())).await;
    }
}

async fn settle(d: &Delivery, action: Action) -> lapin::Result<()> {
    // lapin's bool says whether this call settled it (false: already settled); either is fine here.
    match action {
        Action::Ack | Action::Failed => d.ack(BasicAckOptions::default()).await,
        Action::Reject => d.reject(BasicRejectOptions { requeue: false }).await,
        Action::Requeue => {
            d.nack(BasicNackOptions {
                multiple: false,
                requeue: true,
            })
            .await
        }
    }
    .map(|_| ())
}

/// The id in a message body; `u64::MAX` for a body that is not one (counted unexpected).
fn id_of(body: &[u8]) -> u64 {
    std::str::from_utf8(body)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(u64::MAX)
}

/// The first entry of the delivery's `x-death` header, if it has a well-typed one.
fn first_death(d: &Delivery) -> Option<Death> {
    let headers = d.properties.headers().as_ref()?;
    let AMQPValue::FieldArray(deaths) = headers.inner().get("x-death")? else {
        return None;
    };
    let AMQPValue::FieldTable(first) = deaths.as_slice().first()? else {
        return None;
    };
    let text = |k: &str| match first.inner().get(k) {
        Some(AMQPValue::LongString(s)) => Some(s.to_string()),
        Some(AMQPValue::ShortString(s)) => Some(s.to_string()),
        _ => None,
    };
    let count = match first.inner().get("count")? {
        AMQPValue::LongLongInt(v) => *v,
        AMQPValue::LongInt(v) => i64::from(*v),
        AMQPValue::LongUInt(v) => i64::from(*v),
        AMQPValue::ShortInt(v) => i64::from(*v),
        AMQPValue::ShortUInt(v) => i64::from(*v),
        AMQPValue::ShortShortInt(v) => i64::from(*v),
        AMQPValue::ShortShortUInt(v) => i64::from(*v),
        _ => return None,
    };
    Some(Death {
        reason: text("reason")?,
        count,
        queue: text("queue")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_dead_letter_kinds_expect_their_reason() {
        for k in Kind::ALL {
            assert_eq!(Kind::parse(k.name()), Some(k));
        }
        assert_eq!(Kind::parse("nope"), None);
        assert_eq!(Kind::TotalQueue.expect().queue, "qf.total-queue");
        assert!(Kind::TotalQueue.expect().death.is_none());
        let e = Kind::DeliveryLimit.expect();
        assert_eq!(e.queue, "qf.delivery-limit.dlx");
        assert_eq!(
            e.death,
            Some(("delivery_limit".into(), "qf.delivery-limit".into()))
        );
    }

    #[test]
    fn ids_parse_and_garbage_is_unexpected() {
        assert_eq!(id_of(b"42"), 42);
        assert_eq!(id_of(b"x"), u64::MAX);
    }
}
