//! Users, their tags and their per-vhost permissions, as RabbitMQ's internal
//! authentication backend keeps them (`rabbit_auth_backend_internal`), and the
//! permission checks of `rabbit_access_control`. Pure: password hashes are made
//! by the caller (with a random salt) before a command is proposed, so every
//! replica applies the same bytes.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::error::AmqpError;

/// One user: `password_hash` is RabbitMQ's `rabbit_password_hashing_sha256`
/// layout — 4 salt bytes followed by SHA-256(salt ++ password) — so definitions
/// exported from RabbitMQ (base64 of these bytes) import as they are. An empty
/// hash refuses every password (RabbitMQ: a user without a password).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct User {
    pub name: String,
    pub password_hash: Vec<u8>,
    /// `administrator`, `monitoring`, `management`, ... (RabbitMQ user tags).
    pub tags: Vec<String>,
}

/// A user's permissions in one vhost: three regular expressions over resource
/// names (unanchored, as RabbitMQ's `re:run`; an empty one grants nothing).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Permission {
    pub configure: String,
    pub write: String,
    pub read: String,
}

/// What an operation needs on a resource (`rabbit_access_control:check_resource_access`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Perm {
    Configure,
    Write,
    Read,
}

/// Users and permissions of the cluster (in the meta group's state).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Access {
    users: BTreeMap<String, User>,
    /// user → vhost → permission.
    permissions: BTreeMap<String, BTreeMap<String, Permission>>,
}

/// The salt of the default `guest` user's hash. Fixed so every node's initial
/// state is the same bytes (RabbitMQ draws it on its first boot); change the
/// password (`quorumqctl change_password guest …`) or delete guest in production.
const GUEST_SALT: [u8; 4] = [0x71, 0x71, 0x6d, 0x71];

/// RabbitMQ's `rabbit_password_hashing_sha256` hash of `password` with `salt`.
pub fn hash_password(salt: [u8; 4], password: &[u8]) -> Vec<u8> {
    let mut h = Sha256::new();
    h.update(salt);
    h.update(password);
    let mut out = salt.to_vec();
    out.extend_from_slice(&h.finalize());
    out
}

/// Checks `password` against a stored hash (salt ++ SHA-256). A hash of another
/// length (none set) matches nothing.
pub fn password_matches(hash: &[u8], password: &[u8]) -> bool {
    if hash.len() != 4 + 32 {
        return false;
    }
    let salt = [hash[0], hash[1], hash[2], hash[3]];
    let expected = hash_password(salt, password);
    // Constant-time comparison: no early exit on the first differing byte.
    expected
        .iter()
        .zip(hash)
        .fold(0u8, |acc, (a, b)| acc | (a ^ b))
        == 0
}

/// True when `pattern` (unanchored) matches `name`; an empty pattern grants nothing.
/// Compiled regexes are cached per thread (every publish checks a permission).
fn regex_grants(pattern: &str, name: &str) -> bool {
    thread_local! {
        static CACHE: std::cell::RefCell<std::collections::HashMap<String, Option<regex::Regex>>> =
            Default::default();
    }
    match pattern {
        "" => false,
        ".*" => true,
        _ => CACHE.with(|c| {
            let mut c = c.borrow_mut();
            if c.len() > 1024 {
                c.clear();
            }
            c.entry(pattern.to_owned())
                .or_insert_with(|| regex::Regex::new(pattern).ok())
                .as_ref()
                .is_some_and(|r| r.is_match(name))
        }),
    }
}

impl Access {
    /// The default of a fresh cluster, as RabbitMQ's first boot: user `guest`
    /// (password `guest`, tag `administrator`) with all permissions on `/`.
    pub fn with_guest() -> Access {
        let mut a = Access::default();
        a.users.insert(
            "guest".into(),
            User {
                name: "guest".into(),
                password_hash: hash_password(GUEST_SALT, b"guest"),
                tags: vec!["administrator".into()],
            },
        );
        a.permissions.entry("guest".into()).or_default().insert(
            "/".into(),
            Permission {
                configure: ".*".into(),
                write: ".*".into(),
                read: ".*".into(),
            },
        );
        a
    }

    /// The user, if any.
    pub fn user(&self, name: &str) -> Option<&User> {
        self.users.get(name)
    }

    /// Every user, by name.
    pub fn users(&self) -> impl Iterator<Item = &User> {
        self.users.values()
    }

    /// `add_user`. Errors: 406 when the user exists (`user_already_exists`).
    pub fn add_user(&mut self, user: User) -> Result<(), AmqpError> {
        if self.users.contains_key(&user.name) {
            return Err(AmqpError::precondition_failed(format!(
                "user '{}' already exists",
                user.name
            )));
        }
        self.users.insert(user.name.clone(), user);
        Ok(())
    }

    /// `delete_user`: the user and all its permissions. Errors: 404 when missing.
    pub fn delete_user(&mut self, name: &str) -> Result<(), AmqpError> {
        self.users.remove(name).ok_or_else(|| no_such_user(name))?;
        self.permissions.remove(name);
        Ok(())
    }

    /// `change_password` (a new hash, or empty for none). Errors: 404 when missing.
    pub fn set_password_hash(&mut self, name: &str, hash: Vec<u8>) -> Result<(), AmqpError> {
        self.users
            .get_mut(name)
            .ok_or_else(|| no_such_user(name))?
            .password_hash = hash;
        Ok(())
    }

    /// `set_user_tags` (replaces them). Errors: 404 when missing.
    pub fn set_tags(&mut self, name: &str, tags: Vec<String>) -> Result<(), AmqpError> {
        self.users
            .get_mut(name)
            .ok_or_else(|| no_such_user(name))?
            .tags = tags;
        Ok(())
    }

    /// `set_permissions -p VHOST USER CONF WRITE READ` (the caller checked the vhost).
    ///
    /// Errors: 404 for an unknown user; 406 for a pattern that is not a valid regex.
    pub fn set_permissions(
        &mut self,
        user: &str,
        vhost: &str,
        p: Permission,
    ) -> Result<(), AmqpError> {
        if !self.users.contains_key(user) {
            return Err(no_such_user(user));
        }
        for r in [&p.configure, &p.write, &p.read] {
            if let Err(e) = regex::Regex::new(r) {
                return Err(AmqpError::precondition_failed(format!(
                    "invalid regular expression '{r}': {e}"
                )));
            }
        }
        self.permissions
            .entry(user.to_owned())
            .or_default()
            .insert(vhost.to_owned(), p);
        Ok(())
    }

    /// `clear_permissions -p VHOST USER` (no-op when none were set).
    pub fn clear_permissions(&mut self, user: &str, vhost: &str) {
        if let Some(by_vhost) = self.permissions.get_mut(user) {
            by_vhost.remove(vhost);
            if by_vhost.is_empty() {
                self.permissions.remove(user);
            }
        }
    }

    /// Drops every permission on `vhost` (the vhost was deleted).
    pub fn forget_vhost(&mut self, vhost: &str) {
        for by_vhost in self.permissions.values_mut() {
            by_vhost.remove(vhost);
        }
        self.permissions.retain(|_, by_vhost| !by_vhost.is_empty());
    }

    /// Every permission as (user, vhost, permission), ordered by user then vhost.
    pub fn permissions(&self) -> impl Iterator<Item = (&str, &str, &Permission)> {
        self.permissions.iter().flat_map(|(u, by_vhost)| {
            by_vhost
                .iter()
                .map(move |(v, p)| (u.as_str(), v.as_str(), p))
        })
    }

    fn permission(&self, user: &str, vhost: &str) -> Option<&Permission> {
        self.permissions.get(user)?.get(vhost)
    }

    /// connection.open: the user needs permissions (any) on the vhost.
    ///
    /// Errors: 530 `NOT_ALLOWED - access to vhost 'v' refused for user 'u'`
    /// (RabbitMQ 3.10.8 `rabbit_access_control:check_vhost_access`).
    pub fn check_vhost_access(&self, user: &str, vhost: &str) -> Result<(), AmqpError> {
        if self.permission(user, vhost).is_some() {
            Ok(())
        } else {
            Err(AmqpError::not_allowed(format!(
                "access to vhost '{vhost}' refused for user '{user}'"
            )))
        }
    }

    /// `rabbit_access_control:check_resource_access`: `perm` on resource `name` of
    /// `kind` (`queue` / `exchange`; the default exchange is `amq.default`).
    ///
    /// Errors: 403 `ACCESS_REFUSED - access to exchange 'x' in vhost '/' refused for
    /// user 'u'` (a channel error).
    pub fn check_resource(
        &self,
        user: &str,
        vhost: &str,
        kind: &str,
        name: &str,
        perm: Perm,
    ) -> Result<(), AmqpError> {
        let name = if kind == "exchange" && name.is_empty() {
            "amq.default"
        } else {
            name
        };
        let granted = self.permission(user, vhost).is_some_and(|p| {
            regex_grants(
                match perm {
                    Perm::Configure => &p.configure,
                    Perm::Write => &p.write,
                    Perm::Read => &p.read,
                },
                name,
            )
        });
        if granted {
            Ok(())
        } else {
            Err(AmqpError::access_refused(format!(
                "access to {kind} '{name}' in vhost '{vhost}' refused for user '{user}'"
            )))
        }
    }
}

fn no_such_user(name: &str) -> AmqpError {
    AmqpError::not_found(format!("no user '{name}'"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_are_rabbitmqs_sha256_layout() {
        // RabbitMQ definitions store base64(salt ++ sha256(salt ++ password)).
        let h = hash_password([1, 2, 3, 4], b"secret");
        assert_eq!(h.len(), 36);
        assert_eq!(&h[..4], &[1, 2, 3, 4]);
        assert!(password_matches(&h, b"secret"));
        assert!(!password_matches(&h, b"Secret"));
        assert!(
            !password_matches(&[], b""),
            "no password set matches nothing"
        );
        let guest = Access::with_guest();
        assert!(password_matches(
            &guest.user("guest").unwrap().password_hash,
            b"guest"
        ));
    }

    #[test]
    fn permissions_are_unanchored_regexes_and_empty_grants_nothing() {
        let mut a = Access::with_guest();
        a.add_user(User {
            name: "bob".into(),
            password_hash: vec![],
            tags: vec![],
        })
        .unwrap();
        assert!(a
            .add_user(User {
                name: "bob".into(),
                password_hash: vec![],
                tags: vec![]
            })
            .is_err());
        assert_eq!(
            a.check_vhost_access("bob", "/").unwrap_err().text,
            "NOT_ALLOWED - access to vhost '/' refused for user 'bob'"
        );
        a.set_permissions(
            "bob",
            "/",
            Permission {
                configure: "^bob\\.".into(),
                write: "".into(),
                read: "work".into(),
            },
        )
        .unwrap();
        assert!(a.check_vhost_access("bob", "/").is_ok());
        assert!(a
            .check_resource("bob", "/", "queue", "bob.q", Perm::Configure)
            .is_ok());
        assert!(a
            .check_resource("bob", "/", "queue", "x.bob.q", Perm::Configure)
            .is_err());
        assert!(
            a.check_resource("bob", "/", "queue", "my-work-q", Perm::Read)
                .is_ok(),
            "unanchored"
        );
        let e = a
            .check_resource("bob", "/", "exchange", "", Perm::Write)
            .unwrap_err();
        assert_eq!(e.code, 403);
        assert_eq!(
            e.text,
            "ACCESS_REFUSED - access to exchange 'amq.default' in vhost '/' refused for user 'bob'"
        );
        assert!(a
            .set_permissions(
                "bob",
                "/",
                Permission {
                    configure: "(".into(),
                    write: "".into(),
                    read: "".into()
                }
            )
            .is_err());
        a.set_permissions(
            "bob",
            "v",
            Permission {
                configure: ".*".into(),
                write: ".*".into(),
                read: ".*".into(),
            },
        )
        .unwrap();
        a.forget_vhost("v");
        assert!(
            a.check_vhost_access("bob", "v").is_err(),
            "a deleted vhost's permissions go"
        );
        a.delete_user("bob").unwrap();
        assert!(a.check_vhost_access("bob", "/").is_err());
        assert_eq!(
            a.permissions().count(),
            1,
            "bob's permissions went with him"
        );
    }
}
