//! openraft's own storage conformance suite (`openraft::testing::Suite::test_all`) against the
//! sled store. Each suite case gets a fresh directory and its own tokio runtime.

mod common;

use std::time::{Duration, Instant};

use common::{Ls, Sm, Tc, VecMachine};
use openraft::testing::{StoreBuilder, Suite};
use openraft::{StorageError, StorageIOError};
use raft_log::NodeStore;
use tempfile::TempDir;

struct SledBuilder;

impl StoreBuilder<Tc, Ls, Sm, TempDir> for SledBuilder {
    async fn build(&self) -> Result<(TempDir, Ls, Sm), StorageError<u64>> {
        let dir = TempDir::new().map_err(|e| StorageIOError::write(&e))?;
        let ns =
            NodeStore::open(dir.path(), common::CACHE).map_err(|e| StorageIOError::write(&e))?;
        let log = ns.log_store(1).map_err(|e| StorageIOError::write(&e))?;
        let sm = ns
            .state_machine(1, VecMachine::default())
            .map_err(|e| StorageIOError::write(&e))?;
        Ok((dir, log, sm))
    }
}

#[test]
fn openraft_suite_test_all() {
    let (tx, rx) = std::sync::mpsc::channel();
    let started = Instant::now();
    std::thread::spawn(move || {
        let _ = tx.send(Suite::test_all(SledBuilder));
    });
    let res = rx
        .recv_timeout(Duration::from_secs(120))
        .expect("Suite::test_all exceeded 120 s");
    res.expect("Suite::test_all");
    eprintln!("Suite::test_all took {:?}", started.elapsed());
}
