//! Where a new quorum queue's replicas go (RabbitMQ's `client-local`
//! leader locator and its balanced member placement).

use amq_protocol::types::FieldTable;

use super::detector::Detector;
use super::meta_group::MetaGroup;
use super::peers::Peers;

/// Default `x-quorum-initial-group-size` (RabbitMQ: 3, capped at the cluster size).
const DEFAULT_GROUP_SIZE: u64 = 3;

/// Replica placement of a new quorum queue declared on this node:
/// `x-quorum-initial-group-size` nodes (default 3, capped at the
/// cluster size), this node first (its preferred leader, RabbitMQ's
/// `client-local` leader locator), then the nodes holding the fewest
/// replicas, live ones before down ones, lower ids first.
///
/// `peers`: the nodes known here; `detector`: which of them are alive;
/// `meta`: the queue records whose members count as load.
pub fn place(
    me: u64,
    arguments: &FieldTable,
    peers: &Peers,
    detector: &Detector,
    meta: &MetaGroup,
) -> Vec<u64> {
    let size = match arguments.inner().get("x-quorum-initial-group-size") {
        Some(v) => crate::meta::value::as_integer(v)
            .and_then(|n| u64::try_from(n).ok())
            .unwrap_or(DEFAULT_GROUP_SIZE),
        None => DEFAULT_GROUP_SIZE,
    };
    let mut nodes: Vec<u64> = peers.all().into_iter().map(|(id, _)| id).collect();
    if !nodes.contains(&me) {
        nodes.push(me);
    }
    let size = (size.max(1) as usize).min(nodes.len());
    let mut others: Vec<u64> = nodes.into_iter().filter(|n| *n != me).collect();
    // The topology keeps the replicas per node as records change: no walk over
    // every queue per declare (issue 31).
    let load: Vec<(u64, usize)> = meta
        .with_topology(|t| others.iter().map(|n| (*n, t.replicas_on(*n))).collect())
        .unwrap_or_default();
    let load_of = |n: u64| load.iter().find(|(m, _)| *m == n).map_or(0, |(_, l)| *l);
    others.sort_by_key(|n| (!detector.is_alive(*n), load_of(*n), *n));
    let mut members = vec![me];
    members.extend(others.into_iter().take(size - 1));
    members
}
