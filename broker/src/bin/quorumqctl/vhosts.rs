//! Virtual hosts and their limits (rabbitmqctl `add_vhost`, `delete_vhost`,
//! `list_vhosts`, `set_vhost_limits`, `clear_vhost_limits`, `list_vhost_limits`).

use anyhow::bail;
use quorumq_proto::v1::{
    AddVhostRequest, DeleteVhostRequest, ListVhostLimitsRequest, ListVhostsRequest,
    SetVhostLimitsRequest, VhostLimits,
};
use serde_json::{json, Value};

use crate::output::{banner, emit, listing, Formatter, Row};
use crate::{ok_or_bail, Client};

/// `add_vhost NAME [--default-queue-type quorum|classic]`; on an existing vhost only
/// sets a given default queue type.
///
/// Errors: the call fails, or the node refuses.
pub async fn add(
    c: &mut Client,
    name: String,
    default_queue_type: Option<String>,
) -> anyhow::Result<()> {
    emit(&format!("Adding vhost \"{name}\" ...\n"));
    let r = c
        .add_vhost(AddVhostRequest {
            name,
            default_queue_type: default_queue_type.unwrap_or_default(),
        })
        .await?
        .into_inner();
    ok_or_bail(r)
}

/// `delete_vhost NAME`, with everything in it.
///
/// Errors: the call fails, or the node refuses (no such vhost).
pub async fn delete(c: &mut Client, name: String) -> anyhow::Result<()> {
    emit(&format!("Deleting vhost \"{name}\" ...\n"));
    let r = c
        .delete_vhost(DeleteVhostRequest { name })
        .await?
        .into_inner();
    ok_or_bail(r)
}

/// `list_vhosts`: columns `name`, `default_queue_type`.
///
/// Errors: the call fails.
pub async fn list(c: &mut Client, f: Formatter) -> anyhow::Result<()> {
    let r = c.list_vhosts(ListVhostsRequest {}).await?.into_inner();
    let rows: Vec<Row> = r
        .vhosts
        .iter()
        .map(|v| {
            Row(vec![
                ("name", json!(v.name)),
                ("default_queue_type", json!(v.default_queue_type)),
            ])
        })
        .collect();
    banner(f, "Listing vhosts ...\n");
    emit(&listing(f, &["name", "default_queue_type"], &rows));
    Ok(())
}

/// `set_vhost_limits DEFINITION`: a JSON object with `max-connections` and/or
/// `max-queues` (negative = no limit), replacing `vhost`'s earlier limits.
///
/// Errors: the call fails; `Validation failed` and the node's text for a bad definition.
pub async fn set_limits(c: &mut Client, vhost: String, definition: String) -> anyhow::Result<()> {
    emit(&format!(
        "Setting vhost limits to \"{definition}\" for vhost \"{vhost}\" ...\n"
    ));
    write_limits(c, vhost, definition).await
}

/// `clear_vhost_limits`: removes `vhost`'s limits.
///
/// Errors: the call fails; `Parameter does not exist` when the vhost has no limits (as
/// rabbitmqctl 3.10.8, exit status 69 there).
pub async fn clear_limits(c: &mut Client, vhost: String) -> anyhow::Result<()> {
    emit(&format!("Clearing vhost \"{vhost}\" limits ...\n"));
    let set = c
        .list_vhost_limits(ListVhostLimitsRequest {
            vhost: vhost.clone(),
            global: false,
        })
        .await?
        .into_inner()
        .limits;
    if set.is_empty() {
        // As rabbitmqctl 3.10.8 (exit status 69 there).
        bail!("Parameter does not exist");
    }
    write_limits(c, vhost, "{}".to_string()).await
}

/// Replaces `vhost`'s limits with `definition` (`{}`: none).
async fn write_limits(c: &mut Client, vhost: String, definition: String) -> anyhow::Result<()> {
    let r = c
        .set_vhost_limits(SetVhostLimitsRequest {
            vhost,
            definition_json: definition,
        })
        .await?
        .into_inner();
    if !r.ok {
        bail!("Validation failed\n\n{}", r.error);
    }
    Ok(())
}

/// `list_vhost_limits [--global]`: `vhost`'s limits, or every vhost's.
///
/// Errors: the call fails.
pub async fn list_limits(
    c: &mut Client,
    f: Formatter,
    vhost: String,
    global: bool,
) -> anyhow::Result<()> {
    let limits = c
        .list_vhost_limits(ListVhostLimitsRequest {
            vhost: vhost.clone(),
            global,
        })
        .await?
        .into_inner()
        .limits;
    emit(&vhost_limits_text(f, global, &vhost, &limits));
    Ok(())
}

/// `list_vhost_limits` output: as rabbitmqctl, the definition after a banner for one vhost,
/// a vhost/limits table with `--global`; JSON: `[{"vhost": "/", "limits": {...}}]`.
fn vhost_limits_text(f: Formatter, global: bool, vhost: &str, limits: &[VhostLimits]) -> String {
    let rows: Vec<Row> = limits
        .iter()
        .map(|l| {
            let def: Value = serde_json::from_str(&l.definition_json).unwrap_or(Value::Null);
            Row(vec![("vhost", json!(l.vhost)), ("limits", def)])
        })
        .collect();
    match (f, global) {
        (Formatter::Json, _) | (Formatter::Table, true) => listing(f, &["vhost", "limits"], &rows),
        (Formatter::Table, false) => {
            let mut out = format!("Listing limits for vhost \"{vhost}\" ...\n");
            for l in limits {
                out.push_str(&l.definition_json);
                out.push('\n');
            }
            out
        }
    }
}
