//! This node's live AMQP connections, their channels and the channels' consumers, for
//! the management API's `/api/connections`, `/api/channels` and `/api/consumers`
//! (RabbitMQ's `rabbit_connection_tracking` and the management agent's channel and
//! consumer statistics) and the `rabbitmq_{connections,channels}_{opened,closed}_total`
//! metrics.
//!
//! A connection registers once its connection.open succeeded and a channel when it opens;
//! each holds a guard that unregisters it on drop. A channel publishes its state
//! (consumers, prefetch, unacknowledged count, modes) into its [`ChannelStats`] at the end
//! of each run of frames, and counts its messages (publish, deliver/get, ack, redeliver,
//! confirm) with relaxed atomic adds: no lock on the per-message path.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use amq_protocol::types::FieldTable;
use tokio::sync::oneshot;

/// What a connection was when it opened.
#[derive(Debug, Clone)]
pub struct ConnectionInfo {
    /// Node-unique connection id.
    pub id: u64,
    /// The client's address.
    pub peer: Option<SocketAddr>,
    /// The broker's address of the connection (listener address and port).
    pub local: Option<SocketAddr>,
    /// The connection came through the TLS listener.
    pub tls: bool,
    /// The authenticated user.
    pub user: String,
    /// The vhost of connection.open.
    pub vhost: String,
    /// The mechanism the client logged in with (`PLAIN`, `AMQPLAIN`, `EXTERNAL`).
    pub auth_mechanism: String,
    /// connection.start-ok's client properties.
    pub client_properties: FieldTable,
    /// When connection.open succeeded, ms since the Unix epoch.
    pub connected_at_ms: u64,
    /// Negotiated largest frame, bytes.
    pub frame_max: u32,
    /// Negotiated channel limit.
    pub channel_max: u16,
    /// Negotiated heartbeat, seconds (0 = none).
    pub heartbeat_s: u16,
}

impl ConnectionInfo {
    /// RabbitMQ's connection name: `"PEER_IP:PEER_PORT -> LOCAL_IP:LOCAL_PORT"`.
    pub fn name(&self) -> String {
        let addr = |a: &Option<SocketAddr>| {
            a.map_or_else(
                || "unknown".to_owned(),
                |a| format!("{}:{}", a.ip(), a.port()),
            )
        };
        format!("{} -> {}", addr(&self.peer), addr(&self.local))
    }
}

/// Message counts of a channel (or summed over a connection's channels), as RabbitMQ's
/// `message_stats`: every field only grows.
#[derive(Debug, Default)]
pub struct MessageCounts {
    /// basic.publish received.
    pub publish: AtomicU64,
    /// Deliveries to consumers and basic.get answers (`deliver_get`).
    pub deliver_get: AtomicU64,
    /// Of those, redelivered ones.
    pub redeliver: AtomicU64,
    /// basic.ack received (messages acknowledged).
    pub ack: AtomicU64,
    /// Publishes confirmed to the publisher.
    pub confirm: AtomicU64,
}

impl MessageCounts {
    /// Adds `n` to `field` (relaxed: statistics).
    pub fn add(field: &AtomicU64, n: u64) {
        field.fetch_add(n, Ordering::Relaxed);
    }

    /// (publish, deliver_get, redeliver, ack, confirm) now.
    pub fn snapshot(&self) -> [u64; 5] {
        [
            self.publish.load(Ordering::Relaxed),
            self.deliver_get.load(Ordering::Relaxed),
            self.redeliver.load(Ordering::Relaxed),
            self.ack.load(Ordering::Relaxed),
            self.confirm.load(Ordering::Relaxed),
        ]
    }
}

/// One consumer of a channel as `/api/consumers` shows it.
#[derive(Debug, Clone)]
pub struct ConsumerInfo {
    /// The consumer tag.
    pub tag: String,
    /// The queue's vhost.
    pub vhost: String,
    /// The queue's name.
    pub queue: String,
    /// Not `no_ack`.
    pub ack_required: bool,
    /// basic.consume's `exclusive`.
    pub exclusive: bool,
    /// The channel's prefetch when the consumer was seen (0 = unlimited).
    pub prefetch_count: u32,
    /// basic.consume's arguments.
    pub arguments: FieldTable,
}

/// A channel's state as the channel last published it.
#[derive(Debug, Default)]
pub struct ChannelStats {
    /// The channel number.
    pub number: u16,
    /// Unacknowledged deliveries.
    pub unacked: AtomicU64,
    /// basic.qos prefetch count (0 = unlimited).
    pub prefetch: AtomicU32,
    /// basic.qos with global = true.
    pub global_prefetch: AtomicU32,
    /// Confirm mode (confirm.select).
    pub confirm: AtomicBool,
    /// Transactional (tx.select).
    pub transactional: AtomicBool,
    /// Publishes not confirmed yet.
    pub unconfirmed: AtomicU64,
    /// The channel's consumers.
    pub consumers: Mutex<Vec<ConsumerInfo>>,
    /// Message counts.
    pub counts: MessageCounts,
}

/// A registered connection.
pub struct TrackedConnection {
    /// What it was when it opened.
    pub info: ConnectionInfo,
    channels: Mutex<BTreeMap<u64, Arc<ChannelStats>>>,
    /// Asks the connection to close with a reason (taken once).
    close: Mutex<Option<oneshot::Sender<String>>>,
    /// Counts of its channels that closed already.
    closed_counts: [AtomicU64; 5],
}

impl TrackedConnection {
    /// Its open channels with their connection-unique keys, by number.
    pub fn channels(&self) -> Vec<(u64, Arc<ChannelStats>)> {
        let mut v: Vec<_> = lock(&self.channels)
            .iter()
            .map(|(k, c)| (*k, c.clone()))
            .collect();
        v.sort_by_key(|(_, c)| c.number);
        v
    }

    /// Message counts of the connection: its channels' (open and closed ones).
    pub fn counts(&self) -> [u64; 5] {
        let mut sum: [u64; 5] =
            std::array::from_fn(|i| self.closed_counts[i].load(Ordering::Relaxed));
        for c in lock(&self.channels).values() {
            for (s, n) in sum.iter_mut().zip(c.counts.snapshot()) {
                *s += n;
            }
        }
        sum
    }
}

/// The live connections of this node.
#[derive(Default)]
pub struct Tracking {
    conns: RwLock<BTreeMap<u64, Arc<TrackedConnection>>>,
    /// Connections opened / closed since the node started.
    pub connections_opened: AtomicU64,
    /// See `connections_opened`.
    pub connections_closed: AtomicU64,
    /// Channels opened / closed since the node started.
    pub channels_opened: AtomicU64,
    /// See `channels_opened`.
    pub channels_closed: AtomicU64,
    /// Message counts of connections that closed.
    closed_counts: [AtomicU64; 5],
    /// Publishes into each exchange through this node, by vhost and name.
    exchanges: RwLock<HashMap<String, HashMap<String, Arc<ExchangeCounts>>>>,
}

/// Publishes into an exchange (`publish_in`) and those it routed to at least one queue
/// (`publish_out`; RabbitMQ counts one per queue reached, quorumq one per routed
/// publish).
#[derive(Debug, Default)]
pub struct ExchangeCounts {
    /// Publishes received.
    pub publish_in: AtomicU64,
    /// Publishes routed.
    pub publish_out: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Unregisters its connection when dropped.
pub struct ConnectionGuard {
    tracking: Arc<Tracking>,
    id: u64,
}

/// Unregisters its channel when dropped.
pub struct ChannelGuard {
    tracking: Arc<Tracking>,
    conn: u64,
    key: u64,
    /// The channel's statistics, for it to update.
    pub stats: Arc<ChannelStats>,
}

impl Tracking {
    /// An empty registry.
    pub fn new() -> Arc<Tracking> {
        Arc::new(Tracking::default())
    }

    /// Registers an open connection; the receiver gets the reason when the management API
    /// closes it ([`Tracking::close`]).
    pub fn open_connection(
        self: &Arc<Self>,
        info: ConnectionInfo,
    ) -> (ConnectionGuard, oneshot::Receiver<String>) {
        let (tx, rx) = oneshot::channel();
        let id = info.id;
        let conn = Arc::new(TrackedConnection {
            info,
            channels: Mutex::new(BTreeMap::new()),
            close: Mutex::new(Some(tx)),
            closed_counts: Default::default(),
        });
        if let Ok(mut m) = self.conns.write() {
            m.insert(id, conn);
        }
        self.connections_opened.fetch_add(1, Ordering::Relaxed);
        (
            ConnectionGuard {
                tracking: self.clone(),
                id,
            },
            rx,
        )
    }

    /// Registers channel `number` (connection-unique `key`) of connection `conn`.
    pub fn open_channel(self: &Arc<Self>, conn: u64, number: u16, key: u64) -> ChannelGuard {
        let stats = Arc::new(ChannelStats {
            number,
            ..Default::default()
        });
        if let Some(c) = self.connection(conn) {
            lock(&c.channels).insert(key, stats.clone());
        }
        self.channels_opened.fetch_add(1, Ordering::Relaxed);
        ChannelGuard {
            tracking: self.clone(),
            conn,
            key,
            stats,
        }
    }

    /// Connection `id`, if it is open.
    pub fn connection(&self, id: u64) -> Option<Arc<TrackedConnection>> {
        self.conns.read().ok().and_then(|m| m.get(&id).cloned())
    }

    /// Every open connection, oldest first.
    pub fn connections(&self) -> Vec<Arc<TrackedConnection>> {
        self.conns
            .read()
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }

    /// The open connection named `name` ([`ConnectionInfo::name`]).
    pub fn by_name(&self, name: &str) -> Option<Arc<TrackedConnection>> {
        self.connections()
            .into_iter()
            .find(|c| c.info.name() == name)
    }

    /// Open channels on this node.
    pub fn channel_count(&self) -> u64 {
        self.connections()
            .iter()
            .map(|c| lock(&c.channels).len() as u64)
            .sum()
    }

    /// Asks connection `id` to close with `reason` (RabbitMQ's 320 CONNECTION_FORCED
    /// text follows the `CONNECTION_FORCED - ` prefix). False when it is not open or
    /// already asked.
    pub fn close(&self, id: u64, reason: String) -> bool {
        let Some(c) = self.connection(id) else {
            return false;
        };
        let tx = lock(&c.close).take();
        tx.is_some_and(|tx| tx.send(reason).is_ok())
    }

    /// Counts a publish into `exchange` of `vhost`, `routed` when it reached a queue.
    pub fn exchange_published(&self, vhost: &str, exchange: &str, routed: bool) {
        let found = self
            .exchanges
            .read()
            .ok()
            .and_then(|m| m.get(vhost).and_then(|e| e.get(exchange)).cloned());
        let c = match found {
            Some(c) => c,
            None => match self.exchanges.write() {
                Ok(mut m) => m
                    .entry(vhost.to_owned())
                    .or_default()
                    .entry(exchange.to_owned())
                    .or_default()
                    .clone(),
                Err(_) => return,
            },
        };
        c.publish_in.fetch_add(1, Ordering::Relaxed);
        if routed {
            c.publish_out.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// (publish_in, publish_out) of `exchange` in `vhost` through this node.
    pub fn exchange_counts(&self, vhost: &str, exchange: &str) -> [u64; 2] {
        self.exchanges
            .read()
            .ok()
            .and_then(|m| {
                m.get(vhost).and_then(|e| e.get(exchange)).map(|c| {
                    [
                        c.publish_in.load(Ordering::Relaxed),
                        c.publish_out.load(Ordering::Relaxed),
                    ]
                })
            })
            .unwrap_or([0, 0])
    }

    /// Every exchange's (vhost, name, [publish_in, publish_out]).
    pub fn all_exchange_counts(&self) -> Vec<(String, String, [u64; 2])> {
        let Ok(m) = self.exchanges.read() else {
            return Vec::new();
        };
        m.iter()
            .flat_map(|(v, e)| {
                e.iter().map(move |(n, c)| {
                    (
                        v.clone(),
                        n.clone(),
                        [
                            c.publish_in.load(Ordering::Relaxed),
                            c.publish_out.load(Ordering::Relaxed),
                        ],
                    )
                })
            })
            .collect()
    }

    /// Message counts of every connection since the node started, summed.
    pub fn counts(&self) -> [u64; 5] {
        let mut sum: [u64; 5] =
            std::array::from_fn(|i| self.closed_counts[i].load(Ordering::Relaxed));
        for c in self.connections() {
            for (s, n) in sum.iter_mut().zip(c.counts()) {
                *s += n;
            }
        }
        sum
    }
}

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        let gone = self
            .tracking
            .conns
            .write()
            .ok()
            .and_then(|mut m| m.remove(&self.id));
        if let Some(c) = gone {
            for (i, n) in c.counts().into_iter().enumerate() {
                self.tracking.closed_counts[i].fetch_add(n, Ordering::Relaxed);
            }
        }
        self.tracking
            .connections_closed
            .fetch_add(1, Ordering::Relaxed);
    }
}

impl Drop for ChannelGuard {
    fn drop(&mut self) {
        if let Some(c) = self.tracking.connection(self.conn) {
            lock(&c.channels).remove(&self.key);
            for (i, n) in self.stats.counts.snapshot().into_iter().enumerate() {
                c.closed_counts[i].fetch_add(n, Ordering::Relaxed);
            }
        }
        self.tracking
            .channels_closed
            .fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(id: u64) -> ConnectionInfo {
        ConnectionInfo {
            id,
            peer: "127.0.0.1:54321".parse().ok(),
            local: "127.0.0.1:5672".parse().ok(),
            tls: false,
            user: "guest".into(),
            vhost: "/".into(),
            auth_mechanism: "PLAIN".into(),
            client_properties: FieldTable::default(),
            connected_at_ms: 1,
            frame_max: 131072,
            channel_max: 2047,
            heartbeat_s: 60,
        }
    }

    #[test]
    fn connections_and_channels_register_count_and_close() {
        let t = Tracking::new();
        let (g, mut rx) = t.open_connection(info(7));
        assert_eq!(
            t.connections()[0].info.name(),
            "127.0.0.1:54321 -> 127.0.0.1:5672"
        );
        assert!(t.by_name("127.0.0.1:54321 -> 127.0.0.1:5672").is_some());
        let ch = t.open_channel(7, 1, 1);
        MessageCounts::add(&ch.stats.counts.publish, 3);
        assert_eq!(t.channel_count(), 1);
        assert_eq!(t.counts()[0], 3);
        drop(ch);
        assert_eq!(t.channel_count(), 0);
        assert_eq!(
            t.counts()[0],
            3,
            "a closed channel's counts stay with its connection"
        );
        assert!(t.close(7, "bye".into()));
        assert!(!t.close(7, "again".into()), "asked once");
        assert_eq!(rx.try_recv().ok().as_deref(), Some("bye"));
        drop(g);
        assert!(t.connections().is_empty());
        assert_eq!(
            t.counts()[0],
            3,
            "a closed connection's counts stay with the node"
        );
        assert_eq!(t.connections_opened.load(Ordering::Relaxed), 1);
        assert_eq!(t.connections_closed.load(Ordering::Relaxed), 1);
        assert_eq!(t.channels_closed.load(Ordering::Relaxed), 1);
    }
}
