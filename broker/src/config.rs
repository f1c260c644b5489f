//! Node configuration: TOML file, overridden by command-line flags.

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Settings of one node. Defaults give a single node on 127.0.0.1 with
/// data under `./data`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Node id (u64, unique in the cluster, never reused for a wiped node).
    pub node_id: u64,
    /// Root of the node's data (Raft WAL, snapshots and message segments under `node-<id>/`).
    pub data_dir: PathBuf,
    /// AMQP 0-9-1 listener.
    pub amqp_listen: String,
    /// Cluster gRPC listener (Raft transport and admin API).
    pub cluster_listen: String,
    /// Shortest time between two write-ahead-log syncs (`fdatasync`) while the node is busy,
    /// in µs: Raft appends of every queue that arrive meanwhile share one sync — fewer, larger
    /// log writes for up to this much extra commit latency. A lone writer waiting for each
    /// commit (a publisher waiting for every confirm) is never delayed. 0 = always sync as
    /// soon as anything is waiting.
    pub sync_interval_us: u64,
}

/// Default of [`Config::sync_interval_us`]: 1 ms. Measured with `quorumq-perf` (100k × 1 KiB,
/// confirm 256, prefetch 256) on the 2-core dev VM: 0 µs → ~16k msg/s consumed at 42 µs of
/// broker CPU per message; 1000 µs → ~26k msg/s at 17 µs (README "Benchmark").
pub const DEFAULT_SYNC_INTERVAL_US: u64 = 1000;

impl Default for Config {
    fn default() -> Self {
        Config {
            node_id: 1,
            data_dir: PathBuf::from("./data"),
            amqp_listen: "127.0.0.1:5672".into(),
            cluster_listen: "127.0.0.1:5680".into(),
            sync_interval_us: DEFAULT_SYNC_INTERVAL_US,
        }
    }
}

/// Errors reading a configuration file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("parsing {path}: {source}")]
    Parse {
        path: PathBuf,
        source: toml::de::Error,
    },
}

impl Config {
    /// Loads a TOML file (keys as the struct fields).
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.into(),
            source,
        })?;
        toml::from_str(&text).map_err(|source| ConfigError::Parse {
            path: path.into(),
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn example_config_parses_and_defaults_fill_the_rest() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/quorumq.toml");
        let c = Config::load(&path).expect("deploy/quorumq.toml parses");
        assert_eq!(c.amqp_listen, "127.0.0.1:5672");
        assert_eq!(c.sync_interval_us, 1000);
        let c: Config = toml::from_str("sync_interval_us = 0").expect("partial config");
        assert_eq!((c.sync_interval_us, c.node_id), (0, 1));
        assert_eq!(c.data_dir, PathBuf::from("./data"));
    }

    #[test]
    fn a_misspelt_key_is_an_error_not_ignored() {
        let err = toml::from_str::<Config>("sync_interval = 5").expect_err("unknown key");
        assert!(err.to_string().contains("sync_interval"), "{err}");
    }
}
