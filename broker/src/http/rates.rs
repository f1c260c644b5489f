//! Message rates for the management API's `message_stats` (RabbitMQ's
//! `rabbit_mgmt_data` with its default `rates_mode: basic`): every
//! [`SAMPLE_INTERVAL`] the sampler reads the node's, each connection's and each channel's
//! message counts ([`crate::tracking::MessageCounts`]), and a rate is the change over the
//! last sample interval, per second. The counting is relaxed atomic adds on the message
//! path; the sampler's cost is one walk over the open channels every 5 s.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};

use crate::tracking::Tracking;

/// How often counts are sampled (RabbitMQ's `collect_statistics_interval`, 5 s).
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(5);

/// What a rate is kept for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RateKey {
    /// The whole node (overview, vhosts).
    Node,
    /// A connection by id.
    Connection(u64),
    /// A channel by (connection id, channel key).
    Channel(u64, u64),
    /// A queue by Raft group id (counts through this node).
    Queue(u64),
    /// An exchange by a hash of (vhost, name); counts in the first two places.
    Exchange(u64),
    /// Messages dead-lettered by the queues this node leads; the count in the first place.
    DeadLettered,
}

/// The [`RateKey`] of exchange `name` in `vhost`.
pub fn exchange_key(vhost: &str, name: &str) -> RateKey {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (vhost, name).hash(&mut h);
    RateKey::Exchange(h.finish())
}

#[derive(Debug, Clone, Copy)]
struct Sample {
    at: Instant,
    counts: [u64; 5],
}

/// The last two samples of each object's counts.
#[derive(Default)]
pub struct Rates {
    samples: Mutex<HashMap<RateKey, (Sample, Option<Sample>)>>,
}

/// The `message_stats` field names, in [`crate::tracking::MessageCounts::snapshot`] order.
const FIELDS: [&str; 5] = ["publish", "deliver_get", "redeliver", "ack", "confirm"];

impl Rates {
    /// An empty table.
    pub fn new() -> Arc<Rates> {
        Arc::new(Rates::default())
    }

    /// Samples every object of `tracking` and the `queues` now; objects gone since are
    /// forgotten.
    pub fn sample(&self, tracking: &Tracking, queues: &[(u64, [u64; 5])]) {
        let at = Instant::now();
        let mut now: Vec<(RateKey, [u64; 5])> = vec![
            (RateKey::Node, tracking.counts()),
            (
                RateKey::DeadLettered,
                [crate::metrics::dead_lettered_total(), 0, 0, 0, 0],
            ),
        ];
        now.extend(queues.iter().map(|(g, c)| (RateKey::Queue(*g), *c)));
        now.extend(
            tracking
                .all_exchange_counts()
                .into_iter()
                .map(|(v, n, [i, o])| (exchange_key(&v, &n), [i, o, 0, 0, 0])),
        );
        for c in tracking.connections() {
            now.push((RateKey::Connection(c.info.id), c.counts()));
            for (key, ch) in c.channels() {
                now.push((RateKey::Channel(c.info.id, key), ch.counts.snapshot()));
            }
        }
        let mut m = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        let mut next = HashMap::with_capacity(now.len());
        for (k, counts) in now {
            let s = Sample { at, counts };
            let prev = m.remove(&k).map(|(cur, _)| cur);
            next.insert(k, (s, prev));
        }
        *m = next;
    }

    /// RabbitMQ's `message_stats` of `key` given its `counts` now: each count and its
    /// `*_details: {"rate": r}` (messages per second over the last sample interval; 0.0
    /// before two samples).
    pub fn message_stats(&self, key: RateKey, counts: [u64; 5]) -> Value {
        stats_json(counts, self.rates(key))
    }

    /// The node's `message_stats` (overview) with quorumq's `dead_lettered` count and
    /// its `dead_lettered_details.rate` (messages dead-lettered by the queues this node
    /// leads, per second) added to RabbitMQ's fields.
    pub fn node_message_stats(&self, counts: [u64; 5]) -> Value {
        let mut v = self.message_stats(RateKey::Node, counts);
        let dl = crate::metrics::dead_lettered_total();
        let rate = (self.rates(RateKey::DeadLettered)[0] * 10.0).round() / 10.0;
        if let Value::Object(m) = &mut v {
            m.insert("dead_lettered".into(), json!(dl));
            m.insert("dead_lettered_details".into(), json!({ "rate": rate }));
        }
        v
    }

    /// The sum of several objects' `message_stats` (a vhost: its connections'), given
    /// each one's key and counts now.
    pub fn message_stats_sum(&self, objects: &[(RateKey, [u64; 5])]) -> Value {
        let mut counts = [0u64; 5];
        let mut rates = [0f64; 5];
        for (key, c) in objects {
            let r = self.rates(*key);
            for i in 0..5 {
                counts[i] += c[i];
                rates[i] += r[i];
            }
        }
        stats_json(counts, rates)
    }

    /// Per-second rates of `key` over its last sample interval (0 before two samples).
    fn rates(&self, key: RateKey) -> [f64; 5] {
        let m = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        match m.get(&key) {
            Some((cur, Some(prev))) => {
                let secs = cur.at.duration_since(prev.at).as_secs_f64();
                std::array::from_fn(|i| {
                    if secs > 0.0 {
                        cur.counts[i].saturating_sub(prev.counts[i]) as f64 / secs
                    } else {
                        0.0
                    }
                })
            }
            _ => [0.0; 5],
        }
    }
}

/// An exchange's `message_stats`: `publish_in`, `publish_out` and their rates.
pub fn exchange_stats(vhost: &str, name: &str, counts: [u64; 2]) -> Value {
    let r = RATES.rates(exchange_key(vhost, name));
    let round = |x: f64| (x * 10.0).round() / 10.0;
    json!({
        "publish_in": counts[0],
        "publish_in_details": {"rate": round(r[0])},
        "publish_out": counts[1],
        "publish_out_details": {"rate": round(r[1])},
    })
}

/// `{"publish": n, "publish_details": {"rate": r}, ...}`.
pub fn stats_json(counts: [u64; 5], rates: [f64; 5]) -> Value {
    let mut m = Map::new();
    for i in 0..5 {
        m.insert(FIELDS[i].to_owned(), json!(counts[i]));
        // Rounded as RabbitMQ's rates are shown (one decimal).
        let r = (rates[i] * 10.0).round() / 10.0;
        m.insert(format!("{}_details", FIELDS[i]), json!({ "rate": r }));
    }
    Value::Object(m)
}

/// The node's rates (one broker per process, as the metrics' counters).
pub static RATES: std::sync::LazyLock<Arc<Rates>> = std::sync::LazyLock::new(Rates::new);

/// Samples the node's tracking into [`RATES`] every [`SAMPLE_INTERVAL`] once the broker
/// started, until the process ends.
pub async fn run_sampler(started: super::Started) {
    let mut tick = tokio::time::interval(SAMPLE_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Some(b) = started.get() {
            let began = Instant::now();
            let queues: Vec<(u64, [u64; 5])> = b
                .queue_handles()
                .iter()
                .map(|h| (h.group, h.stats.snapshot()))
                .collect();
            RATES.sample(b.tracking(), &queues);
            crate::metrics::COUNTERS.stats_sampled(began.elapsed());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tracking::{ConnectionInfo, MessageCounts};

    #[test]
    fn rates_are_the_change_over_the_last_interval() {
        let t = Tracking::new();
        let (_g, _rx) = t.open_connection(ConnectionInfo {
            id: 1,
            peer: None,
            local: None,
            tls: false,
            user: "guest".into(),
            vhost: "/".into(),
            auth_mechanism: "PLAIN".into(),
            client_properties: Default::default(),
            connected_at_ms: 0,
            frame_max: 0,
            channel_max: 0,
            heartbeat_s: 0,
        });
        let ch = t.open_channel(1, 1, 1);
        let r = Rates::new();
        r.sample(&t, &[]);
        let v = r.message_stats(RateKey::Node, t.counts());
        assert_eq!(v["publish_details"]["rate"], 0.0, "one sample: no rate yet");
        MessageCounts::add(&ch.stats.counts.publish, 100);
        std::thread::sleep(Duration::from_millis(50));
        r.sample(&t, &[]);
        for key in [
            RateKey::Node,
            RateKey::Connection(1),
            RateKey::Channel(1, 1),
        ] {
            let v = r.message_stats(key, t.counts());
            assert_eq!(v["publish"], 100);
            let rate = v["publish_details"]["rate"].as_f64().unwrap();
            assert!(rate > 100.0, "100 messages in ~50 ms: {rate}");
            assert_eq!(v["ack_details"]["rate"], 0.0);
        }
    }
}
