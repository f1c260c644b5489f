//! Quorum queue membership, as rabbitmq-queues: `add_member`, `delete_member`,
//! `grow`, `shrink`, `rebalance`.

use anyhow::bail;
use quorumq_proto::v1::{
    GrowRequest, MemberRequest, MemberResult, RebalanceRequest, ShrinkRequest,
};
use serde_json::json;

use crate::output::{banner, emit, listing, Formatter, Row};
use crate::Client;

/// `add_member [VHOST] QUEUE NODE`: a replica of the queue on NODE (VHOST defaults to
/// `default_vhost`).
///
/// Errors: a bad target, the call fails, or the node refuses (its result text).
pub async fn add(
    c: &mut Client,
    f: Formatter,
    target: &[String],
    default_vhost: &str,
) -> anyhow::Result<()> {
    change(c, f, member_target(target, default_vhost)?, true).await
}

/// `delete_member [VHOST] QUEUE NODE`: removes the queue's replica on NODE (never the
/// last one).
///
/// Errors: a bad target, the call fails, or the node refuses (its result text).
pub async fn delete(
    c: &mut Client,
    f: Formatter,
    target: &[String],
    default_vhost: &str,
) -> anyhow::Result<()> {
    change(c, f, member_target(target, default_vhost)?, false).await
}

/// Adds (`add`) or removes one replica and prints the result row.
async fn change(c: &mut Client, f: Formatter, req: MemberRequest, add: bool) -> anyhow::Result<()> {
    let (verb, prep) = if add {
        ("Adding a replica for", "on")
    } else {
        ("Removing a replica of", "from")
    };
    banner(
        f,
        &format!(
            "{verb} queue {} in vhost {} {prep} node {}...\n",
            req.queue, req.vhost, req.node
        ),
    );
    let r = if add {
        c.add_member(req).await?
    } else {
        c.delete_member(req).await?
    }
    .into_inner();
    if !r.ok {
        bail!("{}", r.result);
    }
    emit_member_results(f, &[r]);
    Ok(())
}

/// `grow NODE all|even [--vhost-pattern RE] [--queue-pattern RE]`: a replica on NODE for
/// every matching quorum queue (`even`: those with an even number of members). Exits
/// with status 1 after printing when any change failed.
///
/// Errors: the call fails.
pub async fn grow(c: &mut Client, f: Formatter, req: GrowRequest) -> anyhow::Result<()> {
    let GrowRequest {
        node,
        strategy,
        vhost_pattern,
        queue_pattern,
    } = &req;
    banner(f, &format!(
        "Growing {strategy} quorum queues matching {queue_pattern} in vhosts matching {vhost_pattern} to node {node}...\n"
    ));
    let r = c.grow(req).await?.into_inner();
    if !emit_member_results(f, &r.results) {
        std::process::exit(1);
    }
    Ok(())
}

/// `shrink NODE [--errors-only]`: removes NODE's replica from every quorum queue. Exits
/// with status 1 after printing when any change failed.
///
/// Errors: the call fails.
pub async fn shrink(
    c: &mut Client,
    f: Formatter,
    node: u64,
    errors_only: bool,
) -> anyhow::Result<()> {
    banner(
        f,
        &format!("Shrinking all quorum queues on node {node}...\n"),
    );
    let r = c
        .shrink(ShrinkRequest { node, errors_only })
        .await?
        .into_inner();
    if !emit_member_results(f, &r.results) {
        std::process::exit(1);
    }
    Ok(())
}

/// `rebalance quorum|all [--vhost-pattern RE] [--queue-pattern RE]`: spreads leaders
/// evenly; prints the moves (table only) and the leaders per node.
///
/// Errors: the call fails.
pub async fn rebalance(
    c: &mut Client,
    f: Formatter,
    kind: &str,
    req: RebalanceRequest,
) -> anyhow::Result<()> {
    banner(f, &format!("Re-balancing leaders of {kind} queues...\n"));
    let r = c.rebalance(req).await?.into_inner();
    if f == Formatter::Table {
        for m in &r.moved {
            emit(&format!("moved {m}\n"));
        }
    }
    let rows: Vec<Row> = r
        .nodes
        .iter()
        .map(|n| {
            Row(vec![
                ("node_name", json!(n.node)),
                ("number_of_quorum_leaders", json!(n.leaders)),
            ])
        })
        .collect();
    emit(&listing(
        f,
        &["node_name", "number_of_quorum_leaders"],
        &rows,
    ));
    Ok(())
}

/// VHOST QUEUE NODE, or QUEUE NODE in `default_vhost`.
fn member_target(target: &[String], default_vhost: &str) -> anyhow::Result<MemberRequest> {
    let (vhost, queue, node) = match target {
        [q, n] => (default_vhost.to_string(), q.clone(), n),
        [v, q, n] => (v.clone(), q.clone(), n),
        _ => bail!("expected [VHOST] QUEUE NODE"),
    };
    let node = node
        .parse()
        .map_err(|_| anyhow::anyhow!("NODE must be a node id, not '{node}'"))?;
    Ok(MemberRequest {
        vhost,
        queue,
        node,
        forwarded: false,
    })
}

/// The columns of grow / shrink / add_member / delete_member results
/// (rabbitmq-queues grow and shrink).
const MEMBER_COLUMNS: &[&str] = &["vhost", "name", "size", "result"];

/// Prints membership result rows; true when every change succeeded.
pub fn emit_member_results(formatter: Formatter, results: &[MemberResult]) -> bool {
    let rows: Vec<Row> = results.iter().map(member_row).collect();
    emit(&listing(formatter, MEMBER_COLUMNS, &rows));
    results.iter().all(|r| r.ok)
}

fn member_row(r: &MemberResult) -> Row {
    Row(vec![
        ("vhost", json!(r.vhost)),
        ("name", json!(r.name)),
        ("size", json!(r.size)),
        ("result", json!(r.result)),
    ])
}
