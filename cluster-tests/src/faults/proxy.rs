//! The fault suite's network where namespaces are unavailable (not root, no
//! `ip netns`): node `i` listens on `127.0.0.(10+i)` and advertises a proxy
//! on `127.0.0.(20+i)` (same port) that forwards to it, so every connection
//! between nodes passes a proxy of this process. quorumq's outgoing peer
//! connections leave from its listen address (`Peers::bind_outgoing_to`), so
//! a proxy knows which node dialled it from the source IP.
//!
//! Faults act on forwarded bytes, not packets: a blocked pair's connections
//! stall (bytes are held, new connections are accepted and held too, as
//! packets dropped by a partition leave TCP waiting; keepalives then time
//! out as they would); `loss` holds a chunk for 200 ms with probability p
//! (a retransmission timeout); `delay` holds each chunk for the delay ± half
//! (no reordering inside one TCP stream). Clients (AMQP, quorumqctl) talk to
//! the nodes directly, as in the namespaced network.

use super::rng::Rng;
use anyhow::Context;
use std::{
    collections::{HashMap, HashSet},
    net::IpAddr,
    sync::{atomic::AtomicU64, atomic::Ordering, Arc, RwLock},
    time::Duration,
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::watch,
    task::JoinHandle,
};

/// The faults in force.
#[derive(Debug, Default, Clone)]
struct Rules {
    /// Unordered node pairs that cannot talk, stored as (low, high).
    blocked: HashSet<(u64, u64)>,
    /// Per node: probability that a chunk it sends or receives is held 200 ms.
    loss: HashMap<u64, f64>,
    /// Per node: delay of each chunk it sends or receives (ms).
    delay: HashMap<u64, u64>,
}

impl Rules {
    fn blocked(&self, a: u64, b: u64) -> bool {
        self.blocked.contains(&(a.min(b), a.max(b)))
    }
}

struct Shared {
    rules: RwLock<Rules>,
    changed: watch::Sender<u64>,
    seeds: AtomicU64,
}

/// One forwarding proxy per node, and the rules they apply.
pub struct Proxies {
    shared: Arc<Shared>,
    nodes: usize,
    listeners: Vec<JoinHandle<()>>,
}

/// Node `id`'s own address in proxy mode.
pub fn node_ip(id: u64) -> String {
    format!("127.0.0.{}", 10 + id)
}

/// The address of node `id`'s proxy (what it advertises and peers dial).
pub fn proxy_ip(id: u64) -> String {
    format!("127.0.0.{}", 20 + id)
}

impl Proxies {
    /// Starts a proxy for each of `nodes` nodes on `proxy_ip(i):cluster_port`,
    /// forwarding to `node_ip(i):cluster_port`.
    ///
    /// Errors: a proxy address could not be bound.
    pub async fn start(nodes: usize, cluster_port: u16) -> anyhow::Result<Proxies> {
        let (changed, _) = watch::channel(0);
        let shared = Arc::new(Shared {
            rules: RwLock::new(Rules::default()),
            changed,
            seeds: AtomicU64::new(1),
        });
        let mut listeners = Vec::new();
        for id in 1..=nodes as u64 {
            let at = format!("{}:{cluster_port}", proxy_ip(id));
            let listener = TcpListener::bind(&at)
                .await
                .with_context(|| format!("binding proxy {at}"))?;
            let target = format!("{}:{cluster_port}", node_ip(id));
            let shared = shared.clone();
            listeners.push(tokio::spawn(async move {
                while let Ok((inbound, from)) = listener.accept().await {
                    let source = source_node(from.ip(), nodes);
                    tokio::spawn(forward(inbound, source, id, target.clone(), shared.clone()));
                }
            }));
        }
        Ok(Proxies {
            shared,
            nodes,
            listeners,
        })
    }

    fn update(&self, f: impl FnOnce(&mut Rules)) {
        f(&mut self.shared.rules.write().unwrap_or_else(|p| p.into_inner()));
        self.shared.changed.send_modify(|n| *n += 1);
    }

    /// Holds all traffic between nodes `a` and `b`.
    pub fn block(&self, a: u64, b: u64) {
        self.update(|r| {
            r.blocked.insert((a.min(b), a.max(b)));
        });
    }

    /// Holds each chunk to or from node `id` for 200 ms with probability `p`.
    pub fn lossy(&self, id: u64, p: f64) {
        self.update(|r| {
            r.loss.insert(id, p);
        });
    }

    /// Delays each chunk to or from node `id` by `ms` ± `ms/2`; returns what was applied.
    pub fn delay(&self, id: u64, ms: u64) -> String {
        self.update(|r| {
            r.delay.insert(id, ms);
        });
        format!("proxy delay {ms}ms ±{}ms", ms / 2)
    }

    /// Lifts every rule; held bytes flow again.
    pub fn heal(&self) {
        self.update(|r| *r = Rules::default());
    }

    /// Nodes behind proxies.
    pub fn nodes(&self) -> usize {
        self.nodes
    }
}

impl Drop for Proxies {
    fn drop(&mut self) {
        for l in &self.listeners {
            l.abort();
        }
    }
}

/// The node whose address `ip` is (`127.0.0.(10+i)`), or 0 for anyone else (never blocked).
fn source_node(ip: IpAddr, nodes: usize) -> u64 {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, c, d] = v4.octets();
            let id = u64::from(d).wrapping_sub(10);
            if [a, b, c] == [127, 0, 0] && (1..=nodes as u64).contains(&id) {
                id
            } else {
                0
            }
        }
        IpAddr::V6(_) => 0,
    }
}

async fn forward(inbound: TcpStream, from: u64, to: u64, target: String, shared: Arc<Shared>) {
    let Ok(outbound) = TcpStream::connect(&target).await else {
        return;
    };
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    let (ri, wi) = inbound.into_split();
    let (ro, wo) = outbound.into_split();
    let seed = shared.seeds.fetch_add(1, Ordering::Relaxed);
    let up = tokio::spawn(pump(ri, wo, from, to, shared.clone(), Rng::new(seed)));
    let down = tokio::spawn(pump(ro, wi, from, to, shared, Rng::new(seed ^ 0xA5A5)));
    let _ = tokio::join!(up, down);
}

/// Copies `r` to `w` chunk by chunk, holding each chunk while the pair is
/// blocked and delaying it as the rules say. Ends when either side closes.
async fn pump(
    mut r: impl AsyncReadExt + Unpin,
    mut w: impl AsyncWriteExt + Unpin,
    a: u64,
    b: u64,
    shared: Arc<Shared>,
    mut rng: Rng,
) {
    let mut buf = vec![0u8; 64 << 10];
    let mut changed = shared.changed.subscribe();
    loop {
        let n = match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        loop {
            let rules = shared
                .rules
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            if rules.blocked(a, b) {
                if changed.changed().await.is_err() {
                    return;
                }
                continue;
            }
            let delay = rules
                .delay
                .get(&a)
                .or(rules.delay.get(&b))
                .copied()
                .unwrap_or(0);
            let loss = rules
                .loss
                .get(&a)
                .or(rules.loss.get(&b))
                .copied()
                .unwrap_or(0.0);
            let mut hold = if delay > 0 {
                rng.range(delay / 2, delay + delay / 2)
            } else {
                0
            };
            if loss > 0.0 && (rng.next_u64() % 10_000) < (loss * 10_000.0) as u64 {
                hold += 200;
            }
            if hold > 0 {
                tokio::time::sleep(Duration::from_millis(hold)).await;
            }
            break;
        }
        if w.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = w.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_are_known_by_their_address() {
        assert_eq!(source_node("127.0.0.12".parse().unwrap(), 3), 2);
        assert_eq!(source_node("127.0.0.14".parse().unwrap(), 3), 0);
        assert_eq!(source_node("127.0.0.1".parse().unwrap(), 3), 0);
        assert_eq!(source_node("::1".parse().unwrap(), 3), 0);
    }

    #[tokio::test]
    async fn a_blocked_pair_stalls_until_healed_and_others_flow() {
        // An echo server standing in for node 1's cluster port.
        let port = crate::cluster::distinct_free_ports(1).unwrap()[0];
        let echo = TcpListener::bind(format!("{}:{port}", node_ip(1)))
            .await
            .unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = echo.accept().await {
                tokio::spawn(async move {
                    let mut b = [0u8; 16];
                    while let Ok(n) = s.read(&mut b).await {
                        if n == 0 || s.write_all(&b[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        let proxies = Proxies::start(2, port).await.unwrap();
        let dial = |from: u64| async move {
            let sock = tokio::net::TcpSocket::new_v4().unwrap();
            sock.bind(format!("{}:0", node_ip(from)).parse().unwrap())
                .unwrap();
            sock.connect(format!("{}:{port}", proxy_ip(1)).parse().unwrap())
                .await
                .unwrap()
        };
        let echo_once = |mut s: TcpStream| async move {
            s.write_all(b"ping").await.unwrap();
            let mut b = [0u8; 4];
            let got = tokio::time::timeout(Duration::from_millis(500), s.read_exact(&mut b)).await;
            (s, got.is_ok())
        };
        proxies.block(1, 2);
        let (from2, flowed) = echo_once(dial(2).await).await;
        assert!(!flowed, "node 2 -> node 1 is blocked");
        let (_, flowed) = echo_once(dial(1).await).await;
        assert!(flowed, "node 1's own connection is not blocked");
        proxies.heal();
        let mut from2 = from2;
        let mut b = [0u8; 4];
        tokio::time::timeout(Duration::from_secs(2), from2.read_exact(&mut b))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&b, b"ping", "the held bytes arrive after the heal");
    }
}
