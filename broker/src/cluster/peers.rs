//! The node table of the transport: node id → cluster address, and one
//! lazily connected HTTP/2 channel per peer node, shared by every Raft group
//! and every node-to-node call (architecture: "one tonic channel per peer").

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::RwLock;
use std::time::Duration;

use tonic::transport::Endpoint;

use super::secret::{ClusterSecret, PeerChannel};

/// Largest gRPC message either side accepts (bytes): Raft batches carry
/// message bodies (tonic's default is 4 MiB).
pub const MAX_MESSAGE_BYTES: usize = 256 << 20;

/// Known nodes and their channels.
pub struct Peers {
    me: u64,
    /// Source address of outgoing peer connections (None: the kernel picks).
    local_ip: Option<std::net::IpAddr>,
    cluster_id: AtomicU64,
    addrs: RwLock<BTreeMap<u64, String>>,
    channels: RwLock<HashMap<u64, (String, PeerChannel)>>,
    /// The failure detector's channels ([`Peers::beat_channel`]).
    beat_channels: RwLock<HashMap<u64, (String, PeerChannel)>>,
    /// Sent on every call (cluster authentication, `cluster::secret`).
    secret: ClusterSecret,
    /// Mutual TLS toward peers' cluster ports (`cluster_tls`); None = plain HTTP/2.
    tls: Option<tonic::transport::ClientTlsConfig>,
    /// Raft RPCs multiplexed per peer ([`Peers::frames`]).
    frames: super::frames::FrameLinks,
}

impl Peers {
    /// The table of node `me`; `cluster_id` 0 = not yet known.
    pub fn new(me: u64, cluster_id: u64) -> Self {
        Peers {
            me,
            local_ip: None,
            cluster_id: AtomicU64::new(cluster_id),
            addrs: RwLock::new(BTreeMap::new()),
            channels: RwLock::new(HashMap::new()),
            beat_channels: RwLock::new(HashMap::new()),
            secret: ClusterSecret::unset(),
            tls: None,
            frames: super::frames::FrameLinks::new(),
        }
    }

    /// The frame links to peers: small Raft RPCs of every group on one
    /// stream per peer (`cluster::frames`), over [`Peers::channel`].
    pub fn frames(&self) -> &super::frames::FrameLinks {
        &self.frames
    }

    /// Calls to peers use TLS with `tls` (the node's certificate, peers' checked against
    /// the CA).
    pub fn with_tls(mut self, tls: Option<tonic::transport::ClientTlsConfig>) -> Self {
        self.tls = tls;
        self
    }

    /// An endpoint for the cluster port at `addr` (`host:port`): `https` with the cluster
    /// TLS configuration when it is on, else `http`.
    ///
    /// Errors: an invalid address or TLS configuration.
    pub fn endpoint(&self, addr: &str) -> Result<Endpoint, tonic::transport::Error> {
        match &self.tls {
            Some(tls) => Endpoint::from_shared(format!("https://{addr}"))?.tls_config(tls.clone()),
            None => Endpoint::from_shared(format!("http://{addr}")),
        }
    }

    /// Calls to peers carry `secret`.
    pub fn with_secret(mut self, secret: ClusterSecret) -> Self {
        self.secret = secret;
        self
    }

    /// The cluster secret calls carry.
    pub fn secret(&self) -> &ClusterSecret {
        &self.secret
    }

    /// Outgoing peer connections leave from the IP of `cluster_listen`
    /// (`host:port`) when it names one address (not `0.0.0.0`/`::`), so a
    /// multi-homed node talks to its peers from the address it listens on
    /// and firewall rules (or the fault suite's proxies) see that address.
    pub fn bind_outgoing_to(mut self, cluster_listen: &str) -> Self {
        self.local_ip = cluster_listen
            .parse::<std::net::SocketAddr>()
            .ok()
            .map(|a| a.ip())
            .filter(|ip| !ip.is_unspecified());
        self
    }

    /// This node's id.
    pub fn me(&self) -> u64 {
        self.me
    }

    /// The cluster id (0 until formation fixed it).
    pub fn cluster_id(&self) -> u64 {
        self.cluster_id.load(Ordering::Acquire)
    }

    /// Fixes the cluster id (learned at formation or from the meta group).
    pub fn set_cluster_id(&self, id: u64) {
        self.cluster_id.store(id, Ordering::Release);
    }

    /// A request from cluster `theirs` is acceptable: equal ids, or either
    /// side not yet formed (0).
    pub fn accepts(&self, theirs: u64) -> bool {
        let mine = self.cluster_id();
        mine == 0 || theirs == 0 || mine == theirs
    }

    /// Records (or changes) node `id`'s cluster address (`host:port`).
    pub fn set_addr(&self, id: u64, addr: &str) {
        if let Ok(mut a) = self.addrs.write() {
            if a.get(&id).map(String::as_str) != Some(addr) {
                a.insert(id, addr.to_string());
            }
        }
    }

    /// Node `id`'s cluster address, if known.
    pub fn addr(&self, id: u64) -> Option<String> {
        self.addrs.read().ok()?.get(&id).cloned()
    }

    /// Every known node but this one, by id.
    pub fn others(&self) -> Vec<u64> {
        self.addrs
            .read()
            .map(|a| a.keys().copied().filter(|id| *id != self.me).collect())
            .unwrap_or_default()
    }

    /// Every known node (this one included) with its address, by id.
    pub fn all(&self) -> Vec<(u64, String)> {
        self.addrs
            .read()
            .map(|a| a.iter().map(|(k, v)| (*k, v.clone())).collect())
            .unwrap_or_default()
    }

    /// The channel to node `id` (connected on first use, reconnected by
    /// tonic after failures); None when its address is unknown or invalid.
    pub fn channel(&self, id: u64) -> Option<PeerChannel> {
        self.channel_in(&self.channels, id)
    }

    /// A channel to node `id` on a TCP connection of its own, for the failure detector's
    /// beats: on the shared channel a beat queued behind megabytes of appends (a node
    /// catching up tens of thousands of groups) arrived late, and the peer was taken for
    /// dead (issue 31). None as for [`Peers::channel`].
    pub fn beat_channel(&self, id: u64) -> Option<PeerChannel> {
        self.channel_in(&self.beat_channels, id)
    }

    fn channel_in(
        &self,
        channels: &RwLock<HashMap<u64, (String, PeerChannel)>>,
        id: u64,
    ) -> Option<PeerChannel> {
        let addr = self.addr(id)?;
        if let Some((a, ch)) = channels.read().ok()?.get(&id) {
            if *a == addr {
                return Some(ch.clone());
            }
        }
        let ch = self
            .endpoint(&addr)
            .ok()?
            .connect_timeout(Duration::from_millis(500))
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(5))
            .keep_alive_timeout(Duration::from_secs(5))
            .keep_alive_while_idle(true)
            .local_address(self.local_ip)
            .connect_lazy();
        let ch = self.secret.attach(ch);
        if let Ok(mut c) = channels.write() {
            c.insert(id, (addr, ch.clone()));
        }
        Some(ch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outgoing_connections_bind_the_listen_ip_only_when_it_names_one() {
        let ip = |listen: &str| Peers::new(1, 0).bind_outgoing_to(listen).local_ip;
        assert_eq!(ip("127.0.0.12:5680"), Some("127.0.0.12".parse().unwrap()));
        assert_eq!(ip("[::1]:5680"), Some("::1".parse().unwrap()));
        assert_eq!(ip("0.0.0.0:5680"), None);
        assert_eq!(ip("[::]:5680"), None);
        assert_eq!(ip("node1.example:5680"), None, "a host name binds nothing");
    }
}
