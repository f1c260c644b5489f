//! A `powerfs` FUSE mount for tests (`cluster-tests/src/bin/powerfs.rs`): mounted
//! over a backing directory, crashed (power loss) or switched to media errors
//! through control names in its root, unmounted when dropped. Needs root (or the
//! right to mount FUSE) and `/dev/fuse`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};

/// A cluster root whose node `node` keeps its data on powerfs: `root`
/// (for `Cluster::start_placed*`) with `data/node-<node>` the mount point,
/// and `disk`, a temporary directory apart holding the backing directory
/// (`platters`) and powerfs's log. Both directories go when dropped (drop
/// `fs` first: it unmounts).
pub struct PoweredRoot {
    pub root: tempfile::TempDir,
    pub disk: tempfile::TempDir,
    pub fs: PowerFs,
}

impl PoweredRoot {
    /// Makes both directories (named `<prefix>…` and `<prefix>disk-…`) and
    /// mounts powerfs (`bin`, a test's `env!("CARGO_BIN_EXE_powerfs")`) at
    /// node `node`'s data directory.
    ///
    /// Errors: a directory cannot be made; the mount fails ([`PowerFs::mount`]).
    pub fn mount(bin: &str, prefix: &str, node: u64) -> anyhow::Result<PoweredRoot> {
        let disk = tempfile::Builder::new()
            .prefix(&format!("{prefix}disk-"))
            .tempdir()?;
        let backing = disk.path().join("platters");
        std::fs::create_dir_all(&backing)?;
        let root = tempfile::Builder::new().prefix(prefix).tempdir()?;
        let mnt = root.path().join("data").join(format!("node-{node}"));
        std::fs::create_dir_all(&mnt)?;
        let fs = PowerFs::mount(bin, &backing, &mnt, &[], &disk.path().join("powerfs.log"))?;
        Ok(PoweredRoot { root, disk, fs })
    }
}

/// A mounted powerfs and its process.
pub struct PowerFs {
    /// The mount point (canonical).
    pub mnt: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

impl PowerFs {
    /// Mounts `backing` at `mnt` with the powerfs binary `bin` (a test's
    /// `env!("CARGO_BIN_EXE_powerfs")`) and `args` (e.g. `--seed N`), its
    /// output appended to `log`; waits up to 10 s for the mount.
    ///
    /// Errors: the process cannot start, exits, or does not mount in time.
    pub fn mount(
        bin: &str,
        backing: &Path,
        mnt: &Path,
        args: &[String],
        log: &Path,
    ) -> anyhow::Result<PowerFs> {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)?;
        let child = Command::new(bin)
            .arg(backing)
            .arg(mnt)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .context("spawning powerfs")?;
        let mut fs = PowerFs {
            mnt: mnt.canonicalize()?,
            log: log.to_owned(),
            child: Some(child),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !fs.mounted() {
            if let Some(status) = fs.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                bail!("powerfs exited with {status}: {}", fs.log_text());
            }
            ensure!(
                Instant::now() < deadline,
                "powerfs did not mount {} within 10 s",
                mnt.display()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(fs)
    }

    /// Whether the mount point is a powerfs mount (`/proc/self/mountinfo`).
    pub fn mounted(&self) -> bool {
        let want = self.mnt.to_string_lossy().into_owned();
        std::fs::read_to_string("/proc/self/mountinfo").is_ok_and(|m| {
            m.lines()
                .any(|l| l.split(' ').nth(4) == Some(want.as_str()) && l.contains("powerfs"))
        })
    }

    /// What powerfs wrote to its log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Power loss: unsynced data is lost or torn, every later operation fails.
    pub fn crash(&self) {
        // The create itself answers EIO.
        let _ = std::fs::File::create(self.mnt.join(".powerfs-crash"));
    }

    /// Switches a fault (`.powerfs-eio-fsync`, `.powerfs-heal`, ...): powerfs answers the
    /// control name's lookup with `ENOENT` once it is switched.
    ///
    /// Errors: the lookup answered anything else.
    pub fn switch(&self, control: &str) -> anyhow::Result<()> {
        match std::fs::metadata(self.mnt.join(control)) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            other => bail!("powerfs control {control}: {other:?}"),
        }
    }

    /// Unmounts (lazily) and waits up to 10 s for the process to end, then kills it.
    pub fn unmount(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(&self.mnt)
            .stderr(Stdio::null())
            .status();
        if let Some(mut c) = self.child.take() {
            let deadline = Instant::now() + Duration::from_secs(10);
            while c.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for PowerFs {
    fn drop(&mut self) {
        self.unmount();
    }
}
