//! Permissions of users in a vhost (rabbitmqctl `set_permissions`,
//! `clear_permissions`, `list_permissions`).

use quorumq_proto::v1::{ListPermissionsRequest, PermissionRequest};
use serde_json::json;

use crate::output::{banner, emit, listing, Formatter, Row};
use crate::{ok_or_bail, Client};

/// `set_permissions [-p VHOST] USER CONF WRITE READ`: `req.user`'s configure, write and
/// read regexes in `req.vhost`.
///
/// Errors: the call fails, or the node refuses (no such user or vhost, a bad regex).
pub async fn set(c: &mut Client, req: PermissionRequest) -> anyhow::Result<()> {
    emit(&format!(
        "Setting permissions for user \"{}\" in vhost \"{}\" ...\n",
        req.user, req.vhost
    ));
    ok_or_bail(c.set_permissions(req).await?.into_inner())
}

/// `clear_permissions [-p VHOST] USER`.
///
/// Errors: the call fails, or the node refuses.
pub async fn clear(c: &mut Client, vhost: String, user: String) -> anyhow::Result<()> {
    emit(&format!(
        "Clearing permissions for user \"{user}\" in vhost \"{vhost}\" ...\n"
    ));
    let r = c
        .clear_permissions(PermissionRequest {
            vhost,
            user,
            ..Default::default()
        })
        .await?
        .into_inner();
    ok_or_bail(r)
}

/// `list_permissions [-p VHOST]`: columns `user`, `configure`, `write`, `read`.
///
/// Errors: the call fails.
pub async fn list(c: &mut Client, f: Formatter, vhost: String) -> anyhow::Result<()> {
    let r = c
        .list_permissions(ListPermissionsRequest {
            vhost: vhost.clone(),
        })
        .await?
        .into_inner();
    let rows: Vec<Row> = r
        .permissions
        .iter()
        .map(|p| {
            Row(vec![
                ("user", json!(p.user)),
                ("configure", json!(p.configure)),
                ("write", json!(p.write)),
                ("read", json!(p.read)),
            ])
        })
        .collect();
    banner(
        f,
        &format!("Listing permissions for vhost \"{vhost}\" ...\n"),
    );
    emit(&listing(f, &["user", "configure", "write", "read"], &rows));
    Ok(())
}
