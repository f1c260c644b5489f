//! Users (rabbitmqctl `add_user`, `delete_user`, `change_password`,
//! `set_user_tags`, `list_users`).

use quorumq_proto::v1::{ListUsersRequest, UserRequest};
use serde_json::json;

use crate::output::{banner, emit, listing, Formatter, Row};
use crate::{ok_or_bail, Client};

/// `add_user USER PASSWORD`: no permissions, no tags.
///
/// Errors: the call fails, or the node refuses (the user exists).
pub async fn add(c: &mut Client, name: String, password: String) -> anyhow::Result<()> {
    emit(&format!("Adding user \"{name}\" ...\n"));
    let req = UserRequest {
        name,
        password,
        tags: vec![],
    };
    ok_or_bail(c.add_user(req).await?.into_inner())
}

/// `delete_user USER`, with its permissions.
///
/// Errors: the call fails, or the node refuses (no such user).
pub async fn delete(c: &mut Client, name: String) -> anyhow::Result<()> {
    emit(&format!("Deleting user \"{name}\" ...\n"));
    let req = UserRequest {
        name,
        ..Default::default()
    };
    ok_or_bail(c.delete_user(req).await?.into_inner())
}

/// `change_password USER PASSWORD`.
///
/// Errors: the call fails, or the node refuses (no such user).
pub async fn change_password(c: &mut Client, name: String, password: String) -> anyhow::Result<()> {
    emit(&format!("Changing password for user \"{name}\" ...\n"));
    let req = UserRequest {
        name,
        password,
        tags: vec![],
    };
    ok_or_bail(c.change_password(req).await?.into_inner())
}

/// `set_user_tags USER [TAG ...]`: replaces the user's tags.
///
/// Errors: the call fails, or the node refuses (no such user).
pub async fn set_tags(c: &mut Client, name: String, tags: Vec<String>) -> anyhow::Result<()> {
    emit(&format!(
        "Setting tags for user \"{name}\" to [{}] ...\n",
        tags.join(", ")
    ));
    let req = UserRequest {
        name,
        password: String::new(),
        tags,
    };
    ok_or_bail(c.set_user_tags(req).await?.into_inner())
}

/// `list_users`: columns `user`, `tags`.
///
/// Errors: the call fails.
pub async fn list(c: &mut Client, f: Formatter) -> anyhow::Result<()> {
    let r = c.list_users(ListUsersRequest {}).await?.into_inner();
    let rows: Vec<Row> = r
        .users
        .iter()
        .map(|u| Row(vec![("user", json!(u.name)), ("tags", json!(u.tags))]))
        .collect();
    banner(f, "Listing users ...\n");
    emit(&listing(f, &["user", "tags"], &rows));
    Ok(())
}
