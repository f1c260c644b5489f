//! Client connection counts for the connection limits: this node's open
//! connections per vhost, and every peer's as its failure-detector beats
//! report them (RabbitMQ's `rabbit_connection_tracking`, cluster-wide and,
//! like it, eventually consistent: a peer's count is at most one beat,
//! 100 ms, old).
//!
//! Two limits are checked when a client sends connection.open (RabbitMQ
//! `rabbit_reader`): the node's `connection_max` (this node's connections)
//! and the vhost's `max-connections` (the cluster's connections to the vhost).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Why a connection.open was refused; `Display` is RabbitMQ's reply text
/// (530 NOT_ALLOWED, closing the connection).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The node's `connection_max` (RabbitMQ 3.11+ text; 3.10.8 stops accepting instead).
    #[error("NOT_ALLOWED - connection refused: node connection limit ({0}) is reached")]
    Node(u64),
    /// The vhost's `max-connections` (RabbitMQ 3.10.8 text, observed).
    #[error("NOT_ALLOWED - access to vhost '{vhost}' refused for user '{user}': connection limit ({limit}) is reached")]
    Vhost {
        vhost: String,
        user: String,
        limit: u64,
    },
}

#[derive(Default)]
struct Counts {
    /// This node's open connections by vhost (entries at 0 removed).
    local: HashMap<String, u32>,
    /// Each live peer's last reported counts.
    remote: HashMap<u64, HashMap<String, u32>>,
}

/// Connection counts of this node and its peers.
#[derive(Default)]
pub struct Connections {
    counts: Mutex<Counts>,
}

/// One counted open connection; dropping it uncounts it.
pub struct Counted {
    registry: Arc<Connections>,
    vhost: String,
}

impl Connections {
    /// An empty registry.
    pub fn new() -> Arc<Connections> {
        Arc::new(Connections::default())
    }

    /// Counts a connection opening `vhost` unless that breaks a limit: this node already
    /// holds `node_max` connections, or the cluster holds `vhost_max` on the vhost. Check
    /// and count are one step, so concurrent opens on this node cannot both pass.
    ///
    /// Errors: the [`Refusal`], node limit first.
    pub fn open(
        self: &Arc<Self>,
        vhost: &str,
        user: &str,
        node_max: Option<u64>,
        vhost_max: Option<u64>,
    ) -> Result<Counted, Refusal> {
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(max) = node_max {
            let here: u64 = c.local.values().map(|&n| u64::from(n)).sum();
            if here >= max {
                return Err(Refusal::Node(max));
            }
        }
        if let Some(max) = vhost_max {
            let on_vhost = |m: &HashMap<String, u32>| u64::from(m.get(vhost).copied().unwrap_or(0));
            let total = on_vhost(&c.local) + c.remote.values().map(on_vhost).sum::<u64>();
            if total >= max {
                return Err(Refusal::Vhost {
                    vhost: vhost.to_owned(),
                    user: user.to_owned(),
                    limit: max,
                });
            }
        }
        *c.local.entry(vhost.to_owned()).or_default() += 1;
        Ok(Counted {
            registry: self.clone(),
            vhost: vhost.to_owned(),
        })
    }

    /// This node's open connections by vhost (what its beats carry).
    pub fn local(&self) -> HashMap<String, u32> {
        self.counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .local
            .clone()
    }

    /// Open connections in the cluster: this node's and those its peers' beats reported.
    pub fn total(&self) -> u64 {
        let c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let sum = |m: &HashMap<String, u32>| m.values().map(|&n| u64::from(n)).sum::<u64>();
        sum(&c.local) + c.remote.values().map(sum).sum::<u64>()
    }

    /// A beat from `node` reported its counts.
    pub fn set_remote(&self, node: u64, counts: HashMap<String, u32>) {
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        c.remote.insert(node, counts);
    }

    /// `node` is down: its connections are gone (RabbitMQ drops a lost node's tracked
    /// connections).
    pub fn forget(&self, node: u64) {
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        c.remote.remove(&node);
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        let mut c = self
            .registry
            .counts
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(n) = c.local.get_mut(&self.vhost) {
            *n -= 1;
            if *n == 0 {
                c.local.remove(&self.vhost);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_limit_counts_this_node_and_frees_on_drop() {
        let r = Connections::new();
        let a = r.open("/", "guest", Some(2), None).unwrap();
        let _b = r.open("other", "guest", Some(2), None).unwrap();
        let e = r.open("/", "guest", Some(2), None).err().unwrap();
        assert_eq!(
            e.to_string(),
            "NOT_ALLOWED - connection refused: node connection limit (2) is reached"
        );
        drop(a);
        assert!(r.open("/", "guest", Some(2), None).is_ok());
        assert_eq!(r.local().get("/"), None, "a dropped count is removed");
        assert_eq!(
            r.open("/", "guest", Some(0), None).err(),
            Some(Refusal::Node(0))
        );
    }

    #[test]
    fn vhost_limit_counts_the_whole_cluster_per_vhost() {
        let r = Connections::new();
        r.set_remote(
            2,
            HashMap::from([("/".to_string(), 1), ("v".to_string(), 5)]),
        );
        let _a = r.open("/", "guest", None, Some(2)).unwrap();
        let e = r.open("/", "bob", None, Some(2)).err().unwrap();
        assert_eq!(
            e.to_string(),
            "NOT_ALLOWED - access to vhost '/' refused for user 'bob': connection limit (2) is reached"
        );
        // Another vhost's connections do not count; a lost peer's are forgotten.
        assert!(r.open("w", "guest", None, Some(1)).is_ok());
        r.forget(2);
        let _b = r.open("/", "guest", None, Some(2)).unwrap();
        assert_eq!(r.local().get("/"), Some(&2));
        assert!(r.open("/", "guest", None, Some(0)).is_err());
    }
}
