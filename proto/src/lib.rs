//! Generated gRPC code for quorumq's cluster internals: the group-tagged Raft
//! transport, node-to-node cluster calls and the operator (admin) API.
#![allow(clippy::all, missing_docs)]

/// Package `quorumq.v1`: `RaftTransport`, `Cluster` and `Admin` services.
pub mod v1 {
    tonic::include_proto!("quorumq.v1");
}
