//! Cluster authentication with a shared secret, as Erlang's cookie authenticates
//! RabbitMQ's nodes and `rabbitmqctl`: every call on the cluster/admin gRPC port
//! (Raft, failure detector, forwarding, joins, quorumqctl) carries the secret in
//! its metadata, and a call without the right one gets `UNAUTHENTICATED` and
//! nothing else.
//!
//! The secret lives in a file: `--cluster-secret-file`, else the environment
//! variable `QUORUMQ_CLUSTER_SECRET_FILE`, else `$HOME/.quorumq.cookie` (the
//! `~/.erlang.cookie` of quorumq). A node creates it on its first start when it
//! is missing (32 random characters, mode 0600; atomically, so nodes started
//! together on one machine agree); the other nodes of a cluster need a copy.
//! `quorumqctl` reads the same file, so on a node's own machine, as the same
//! user, the verbs work unchanged.

use std::io::Write;
use std::path::{Path, PathBuf};

use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::service::Interceptor;
use tonic::transport::Channel;
use tonic::{Request, Status};

/// Metadata key carrying the secret.
pub const SECRET_HEADER: &str = "x-quorumq-cluster-secret";
/// Environment variable naming the secret file.
pub const SECRET_FILE_ENV: &str = "QUORUMQ_CLUSTER_SECRET_FILE";

/// A channel to a peer whose every call carries the secret.
pub type PeerChannel = InterceptedService<Channel, ClusterSecret>;

/// The shared secret; as an [`Interceptor`] it adds itself to outgoing calls.
#[derive(Clone)]
pub struct ClusterSecret {
    value: MetadataValue<Ascii>,
}

/// Reading or creating the secret file failed.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("cluster secret file {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cluster secret file {0}: empty, or not printable ASCII")]
    Invalid(PathBuf),
}

impl ClusterSecret {
    /// The secret file to use: `flag`, else `$QUORUMQ_CLUSTER_SECRET_FILE`, else
    /// `$HOME/.quorumq.cookie` (`./.quorumq.cookie` without a home directory).
    pub fn path(flag: Option<&Path>) -> PathBuf {
        if let Some(p) = flag {
            return p.to_path_buf();
        }
        if let Some(p) = std::env::var_os(SECRET_FILE_ENV).filter(|p| !p.is_empty()) {
            return PathBuf::from(p);
        }
        std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("."))
            .join(".quorumq.cookie")
    }

    /// Reads the secret (surrounding whitespace ignored).
    ///
    /// Errors: the file cannot be read, or holds no printable ASCII secret.
    pub fn read(path: &Path) -> Result<ClusterSecret, SecretError> {
        let text = std::fs::read_to_string(path).map_err(|source| SecretError::Io {
            path: path.into(),
            source,
        })?;
        Self::from_text(text.trim()).ok_or_else(|| SecretError::Invalid(path.into()))
    }

    /// Reads the secret, creating the file first when it does not exist: written to a
    /// temporary file (mode 0600, synced) and linked into place, so of several nodes
    /// starting at once one writes it and all read the same.
    ///
    /// Errors: as [`ClusterSecret::read`]; the file could not be created.
    pub fn load_or_create(path: &Path) -> Result<ClusterSecret, SecretError> {
        if !path.exists() {
            let io = |source| SecretError::Io {
                path: path.into(),
                source,
            };
            use rand::Rng;
            let secret: String = rand::thread_rng()
                .sample_iter(&rand::distributions::Alphanumeric)
                .take(32)
                .map(char::from)
                .collect();
            let tmp = path.with_extension(format!("tmp{}", std::process::id()));
            let mut opts = std::fs::OpenOptions::new();
            opts.write(true).create_new(true);
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
            let mut f = opts.open(&tmp).map_err(io)?;
            f.write_all(secret.as_bytes()).map_err(io)?;
            f.sync_all().map_err(io)?;
            drop(f);
            let linked = std::fs::hard_link(&tmp, path);
            let _ = std::fs::remove_file(&tmp);
            match linked {
                Ok(()) => {
                    tracing::info!(file = %path.display(), "created the cluster secret file (copy it to every node of the cluster)")
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io(e)),
            }
        }
        Self::read(path)
    }

    /// A placeholder for tables built in unit tests (no node uses it).
    pub fn unset() -> ClusterSecret {
        ClusterSecret {
            value: MetadataValue::from_static("unset"),
        }
    }

    fn from_text(text: &str) -> Option<ClusterSecret> {
        if text.is_empty() || !text.bytes().all(|b| b.is_ascii_graphic()) {
            return None;
        }
        Some(ClusterSecret {
            value: text.parse().ok()?,
        })
    }

    /// Server side: the call's metadata must carry this secret.
    ///
    /// Errors: `UNAUTHENTICATED` without it or with another one.
    pub fn check<T>(&self, req: &Request<T>) -> Result<(), Status> {
        let given = req
            .metadata()
            .get(SECRET_HEADER)
            .map(|v| v.as_bytes())
            .unwrap_or_default();
        let want = self.value.as_bytes();
        // Constant time over the expected length: no early exit on the first difference.
        let same = given.len() == want.len()
            && given
                .iter()
                .zip(want)
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0;
        if same {
            Ok(())
        } else {
            Err(Status::unauthenticated(
                "cluster secret missing or wrong (see --cluster-secret-file)",
            ))
        }
    }

    /// A server-side interceptor refusing calls without the secret (logged).
    pub fn server_check(&self) -> impl Interceptor + Clone + Send + Sync + 'static {
        let secret = self.clone();
        move |req: Request<()>| {
            if let Err(e) = secret.check(&req) {
                tracing::warn!(peer = ?req.remote_addr(), "refused a cluster/admin call without the cluster secret");
                return Err(e);
            }
            Ok(req)
        }
    }

    /// `channel` with this secret on every call.
    pub fn attach(&self, channel: Channel) -> PeerChannel {
        InterceptedService::new(channel, self.clone())
    }
}

impl Interceptor for ClusterSecret {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        req.metadata_mut().insert(SECRET_HEADER, self.value.clone());
        Ok(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn created_once_then_read_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cookie");
        let a = ClusterSecret::load_or_create(&path).unwrap();
        let b = ClusterSecret::load_or_create(&path).unwrap();
        assert_eq!(a.value, b.value, "a second start reads the same secret");
        assert_eq!(std::fs::read_to_string(&path).unwrap().len(), 32);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let mut signed = Request::new(());
        signed = a.clone().call(signed).unwrap();
        assert!(a.check(&signed).is_ok());
        assert!(a.check(&Request::new(())).is_err(), "no secret");
        std::fs::write(dir.path().join("other"), "something-else\n").unwrap();
        let other = ClusterSecret::read(&dir.path().join("other")).unwrap();
        let forged = other.clone().call(Request::new(())).unwrap();
        assert_eq!(
            a.check(&forged).unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
        std::fs::write(dir.path().join("empty"), "\n").unwrap();
        assert!(ClusterSecret::read(&dir.path().join("empty")).is_err());
    }
}
