//! powerfs (src/bin/powerfs.rs), the FUSE file system that simulates a power
//! loss: synced data and directory entries survive its crash, unsynced data
//! survives per sector or not at all (only original or zero sectors), new
//! entries without a directory fsync survive about half the time, and after
//! the crash every operation fails. Mounts FUSE, so it needs root (CI runs
//! as root).

use anyhow::{bail, ensure, Context};
use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const SEED: u64 = 42;
const SECTOR: usize = 512;

/// Byte `i` of a test pattern: never zero, different per sector and tag.
fn pattern(tag: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| 1 + ((i * 31 + i / SECTOR * 7 + usize::from(tag) * 13) % 255) as u8)
        .collect()
}

/// A running powerfs; dropping it unmounts (lazily) and reaps the process,
/// also when an assertion failed half-way.
struct Mounted {
    mnt: PathBuf,
    child: Option<Child>,
}

impl Mounted {
    fn start(backing: &Path, mnt: &Path) -> anyhow::Result<Mounted> {
        let child = Command::new(env!("CARGO_BIN_EXE_powerfs"))
            .arg(backing)
            .arg(mnt)
            .args(["--seed", &SEED.to_string()])
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting powerfs")?;
        let mut m = Mounted {
            mnt: fs::canonicalize(mnt)?,
            child: Some(child),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !m.is_mounted()? {
            if let Some(c) = m.child.as_mut() {
                if let Some(status) = c.try_wait()? {
                    let err = m.stderr();
                    bail!("powerfs exited before mounting ({status}): {err}");
                }
            }
            ensure!(Instant::now() < deadline, "powerfs did not mount in 10 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(m)
    }

    fn is_mounted(&self) -> anyhow::Result<bool> {
        let info = fs::read_to_string("/proc/self/mountinfo")?;
        let mnt = self.mnt.to_string_lossy();
        Ok(info.lines().any(|l| {
            let mut halves = l.split(" - ");
            let (Some(left), Some(right)) = (halves.next(), halves.next()) else {
                return false;
            };
            left.split(' ').nth(4) == Some(&*mnt) && right.starts_with("fuse")
        }))
    }

    fn stderr(&mut self) -> String {
        let mut s = String::new();
        if let Some(e) = self.child.as_mut().and_then(|c| c.stderr.as_mut()) {
            let _ = e.read_to_string(&mut s);
        }
        s
    }

    /// Unmounts, waits for powerfs to exit and returns what it printed.
    fn unmount(mut self) -> anyhow::Result<String> {
        self.detach();
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let c = self.child.as_mut().context("no child")?;
            if let Some(status) = c.try_wait()? {
                let err = self.stderr();
                self.child = None;
                ensure!(status.success(), "powerfs exited with {status}: {err}");
                return Ok(err);
            }
            ensure!(
                Instant::now() < deadline,
                "powerfs still running 5 s after the unmount"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn detach(&self) {
        if let Ok(c) = CString::new(self.mnt.as_os_str().as_bytes()) {
            // SAFETY: c is a valid NUL-terminated path.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let Some(mut c) = self.child.take() else {
            return;
        };
        self.detach();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = c.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = c.kill();
        let _ = c.wait();
    }
}

fn fsync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

fn backing_len(p: &Path) -> u64 {
    fs::metadata(p).map(|m| m.len()).unwrap_or(u64::MAX)
}

fn assert_eio<T: std::fmt::Debug>(what: &str, r: std::io::Result<T>) {
    match r {
        Ok(v) => panic!("{what} after the crash: succeeded ({v:?})"),
        Err(e) => assert_eq!(
            e.raw_os_error(),
            Some(libc::EIO),
            "{what} after the crash: {e}"
        ),
    }
}

#[test]
fn powerfs_keeps_what_was_synced_and_tears_the_rest() -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("this test mounts a FUSE file system (powerfs) and needs root");
    }
    let backing_dir = tempfile::Builder::new()
        .prefix("powerfs-backing-")
        .tempdir()?;
    let mnt_dir = tempfile::Builder::new().prefix("powerfs-mnt-").tempdir()?;
    let b = backing_dir.path().to_path_buf();
    let m = mnt_dir.path().to_path_buf();
    let fs_ = Mounted::start(&b, &m)?;

    // (a) written and synced (file and directory): on the platters at once.
    let synced = pattern(1, 64 * 1024);
    {
        let mut f = File::create(m.join("synced.bin"))?;
        f.write_all(&synced)?;
        f.sync_all()?;
    }
    fsync_dir(&m)?;
    assert_eq!(fs::read(b.join("synced.bin"))?, synced, "synced file");
    // An unsynced, unaligned overwrite spanning sectors 1 and 2: visible
    // through the mount, not in the backing file.
    let patch = pattern(9, 100);
    OpenOptions::new()
        .write(true)
        .open(m.join("synced.bin"))?
        .write_all_at(&patch, 1000)?;
    let mut expect = synced.clone();
    expect[1000..1100].copy_from_slice(&patch);
    assert_eq!(fs::read(m.join("synced.bin"))?, expect, "overwrite visible");
    assert_eq!(
        fs::read(b.join("synced.bin"))?,
        synced,
        "overwrite unsynced"
    );

    // (b) 1 MiB written without fsync (its entry made durable first): the
    // backing file stays empty, the mount reads it back.
    let big = pattern(2, 1 << 20);
    let mut f = File::create(m.join("unsynced.bin"))?;
    fsync_dir(&m)?;
    for chunk in big.chunks(64 * 1024) {
        f.write_all(chunk)?;
    }
    drop(f); // closing is not a sync
    assert_eq!(backing_len(&b.join("unsynced.bin")), 0, "unsynced: backing");
    assert_eq!(fs::metadata(m.join("unsynced.bin"))?.len(), 1 << 20);
    assert!(
        fs::read(m.join("unsynced.bin"))? == big,
        "unsynced: read back"
    );

    // (d) new files: durable with a directory fsync (also one renamed in
    // from another directory), volatile without.
    fs::create_dir(m.join("durable"))?;
    fs::create_dir(m.join("volatile"))?;
    let content = |i: usize| format!("file {i}\n").repeat(50).into_bytes();
    for i in 0..10 {
        let mut f = File::create(m.join(format!("durable/f{i}")))?;
        f.write_all(&content(i))?;
        f.sync_all()?;
    }
    {
        let mut f = File::create(m.join("volatile/moved"))?;
        f.write_all(&content(99))?;
        f.sync_all()?;
    }
    fs::rename(m.join("volatile/moved"), m.join("durable/moved"))?;
    fsync_dir(&m.join("durable"))?;
    const VOLATILE: usize = 40;
    for i in 0..VOLATILE {
        let mut f = File::create(m.join(format!("volatile/f{i}")))?;
        f.write_all(&content(i))?;
        f.sync_all()?; // the data, not the entry
    }
    assert_eq!(fs::read_dir(b.join("volatile"))?.count(), VOLATILE);

    // (e) truncate and rename reach the backing dir at once, and renaming a
    // directory keeps its open, dirty files reachable.
    {
        let mut f = File::create(m.join("meta.bin"))?;
        f.write_all(&pattern(3, 4096))?;
        f.sync_all()?;
        f.set_len(1000)?;
    }
    assert_eq!(backing_len(&b.join("meta.bin")), 1000, "truncate");
    assert_eq!(fs::metadata(m.join("meta.bin"))?.len(), 1000);
    fs::rename(m.join("meta.bin"), m.join("meta2.bin"))?;
    assert!(!b.join("meta.bin").exists() && b.join("meta2.bin").exists());
    assert_eq!(backing_len(&b.join("meta2.bin")), 1000);
    fsync_dir(&m)?; // meta2.bin was created since: make its entry durable
    fs::create_dir(m.join("dirA"))?;
    let mut open = File::create(m.join("dirA/f"))?;
    open.write_all(b"dirty in a renamed directory")?;
    fs::rename(m.join("dirA"), m.join("dirB"))?;
    assert!(b.join("dirB/f").exists() && !b.join("dirA").exists());
    assert_eq!(
        fs::read(m.join("dirB/f"))?,
        b"dirty in a renamed directory",
        "renamed directory's file"
    );
    open.write_all(b"!")?;
    drop(open);
    assert_eq!(fs::metadata(m.join("dirB/f"))?.len(), 29);
    let names: Vec<_> = fs::read_dir(&m)?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_, _>>()?;
    for n in ["synced.bin", "unsynced.bin", "durable", "meta2.bin", "dirB"] {
        assert!(names.iter().any(|x| x == n), "readdir lists {n}: {names:?}");
    }

    // (f) fallocate grows a file to read as zeros, volatile until an fsync
    // (the WAL preallocates its segments this way).
    {
        let f = File::create(m.join("prealloc.bin"))?;
        f.sync_all()?;
        fsync_dir(&m)?;
        // SAFETY: fallocate on a descriptor owned by `f`; no memory is passed.
        let r = unsafe { libc::fallocate(std::os::fd::AsRawFd::as_raw_fd(&f), 0, 0, 8192) };
        ensure!(r == 0, "fallocate: {}", std::io::Error::last_os_error());
        assert_eq!(fs::metadata(m.join("prealloc.bin"))?.len(), 8192);
        assert_eq!(
            backing_len(&b.join("prealloc.bin")),
            0,
            "fallocate unsynced"
        );
        f.write_all_at(b"head", 0)?;
        assert_eq!(fs::read(m.join("prealloc.bin"))?.len(), 8192);
        f.sync_data()?;
        assert_eq!(
            backing_len(&b.join("prealloc.bin")),
            8192,
            "fallocate synced"
        );
        assert_eq!(&fs::read(b.join("prealloc.bin"))?[..6], b"head\0\0");
    }

    // (c) the crash: the triggering create fails, and so does everything after.
    match File::create(m.join(".powerfs-crash")) {
        Ok(_) => bail!("creating .powerfs-crash succeeded"),
        Err(e) => ensure!(e.raw_os_error() == Some(libc::EIO), "crash trigger: {e}"),
    }
    assert_eio("stat of the root", fs::metadata(&m));
    assert_eio("stat of a synced file", fs::metadata(m.join("synced.bin")));
    assert_eio("open", File::open(m.join("synced.bin")));
    assert_eio("readdir", fs::read_dir(&m));
    assert_eio("create", File::create(m.join("after")));
    assert_eio("mkdir", fs::create_dir(m.join("after.d")));
    assert_eio("read", fs::read(m.join("durable/f0")));
    let err = fs_.unmount()?;
    assert!(
        err.contains(&format!("powerfs: crash (seed {SEED}): ")),
        "powerfs stderr: {err}"
    );
    eprintln!("{err}");

    // The synced file: intact, but for the two sectors of the unsynced
    // patch, each of which is wholly old or wholly new.
    let got = fs::read(b.join("synced.bin"))?;
    assert_eq!(got.len(), synced.len());
    for (s, (g, (old, new))) in got
        .chunks(SECTOR)
        .zip(synced.chunks(SECTOR).zip(expect.chunks(SECTOR)))
        .enumerate()
    {
        if s == 1 || s == 2 {
            assert!(g == old || g == new, "synced.bin sector {s} torn");
        } else {
            assert!(g == old, "synced.bin sector {s} changed");
        }
    }

    // The unsynced file: only original or zero sectors, some of each.
    let got = fs::read(b.join("unsynced.bin")).context("unsynced.bin's entry was synced")?;
    assert!(
        got.len() <= big.len() && got.len() % SECTOR == 0,
        "{}",
        got.len()
    );
    let mut kept = 0;
    for (s, (g, want)) in got.chunks(SECTOR).zip(big.chunks(SECTOR)).enumerate() {
        if g == want {
            kept += 1;
        } else {
            assert!(g.iter().all(|&x| x == 0), "unsynced.bin sector {s} garbage");
        }
    }
    let sectors = big.len() / SECTOR;
    assert!(
        0 < kept && kept < sectors,
        "persisted {kept} of {sectors} sectors"
    );

    // New files: the directory-synced ones all there, the others about half.
    for i in 0..10 {
        assert_eq!(fs::read(b.join(format!("durable/f{i}")))?, content(i));
    }
    assert_eq!(fs::read(b.join("durable/moved"))?, content(99));
    let mut survived = 0;
    for i in 0..VOLATILE {
        match fs::read(b.join(format!("volatile/f{i}"))) {
            Ok(d) => {
                assert_eq!(d, content(i), "volatile/f{i} survived torn");
                survived += 1;
            }
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(e.into()),
        }
    }
    assert!(
        0 < survived && survived < VOLATILE,
        "{survived} of {VOLATILE} new files survived"
    );
    // Durable at once: truncate, rename.
    assert_eq!(backing_len(&b.join("meta2.bin")), 1000);
    assert!(b.join("dirB").is_dir());
    Ok(())
}

/// Looks up a powerfs control name in the mount root; powerfs answers `ENOENT` once it
/// switched the fault.
fn switch(m: &Path, control: &str) {
    match fs::metadata(m.join(control)) {
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        other => panic!("control {control}: {other:?}"),
    }
}

fn assert_fault<T: std::fmt::Debug>(what: &str, r: std::io::Result<T>) {
    match r {
        Ok(v) => panic!("{what} under the fault: succeeded ({v:?})"),
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EIO), "{what}: {e}"),
    }
}

/// Injected media errors (issue 32 item 4): fsync faults drop the dirty data and fail the
/// fsync (a later one, healed, succeeds without it: fsyncgate), write faults refuse writes
/// and namespace changes, read faults refuse reads; each limited to paths containing a
/// substring; `.powerfs-heal` turns them off; other files and operations are untouched.
#[test]
fn powerfs_injects_media_errors_on_demand() -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("this test mounts a FUSE file system (powerfs) and needs root");
    }
    let backing_dir = tempfile::Builder::new()
        .prefix("powerfs-backing-")
        .tempdir()?;
    let mnt_dir = tempfile::Builder::new().prefix("powerfs-mnt-").tempdir()?;
    let b = backing_dir.path().to_path_buf();
    let m = mnt_dir.path().to_path_buf();
    let fs_ = Mounted::start(&b, &m)?;
    fs::create_dir(m.join("wal"))?;
    let mut seg = File::create(m.join("wal/1.wal"))?;
    let mut other = File::create(m.join("other.bin"))?;
    seg.write_all(&pattern(1, 4096))?;
    seg.sync_all()?;
    other.write_all(&pattern(2, 4096))?;
    other.sync_all()?;
    fsync_dir(&m)?;
    fsync_dir(&m.join("wal"))?;

    // An unknown control name is refused.
    match fs::metadata(m.join(".powerfs-eio-sometimes")) {
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}"),
        Ok(_) => bail!("an unknown control name was accepted"),
    }

    // fsync fault on "wal": writes land, the fsync fails and drops them; other files sync.
    switch(&m, ".powerfs-eio-fsync=wal");
    seg.write_all_at(&pattern(3, 512), 0)?;
    assert_eq!(fs::read(m.join("wal/1.wal"))?[..512], pattern(3, 512)[..]);
    assert_fault("fsync of a WAL file", seg.sync_data());
    assert_fault("fsync of the WAL directory", fsync_dir(&m.join("wal")));
    assert_eq!(
        fs::read(m.join("wal/1.wal"))?,
        pattern(1, 4096),
        "the failed fsync dropped the dirty data"
    );
    other.write_all_at(&pattern(4, 512), 0)?;
    other.sync_data()?;
    assert_eq!(fs::read(b.join("other.bin"))?[..512], pattern(4, 512)[..]);
    // Healed, a retried fsync succeeds, but the dropped write is not on the platters.
    switch(&m, ".powerfs-heal");
    seg.sync_data()?;
    assert_eq!(
        fs::read(b.join("wal/1.wal"))?,
        pattern(1, 4096),
        "fsyncgate"
    );

    // Write fault on every path: writes and namespace changes fail and change nothing.
    switch(&m, ".powerfs-eio-write");
    assert_fault("write", seg.write_all_at(b"x", 0));
    assert_fault("write elsewhere", other.write_all_at(b"x", 0));
    assert_fault("create", File::create(m.join("new.bin")));
    assert_fault("mkdir", fs::create_dir(m.join("new.d")));
    assert_fault("rename", fs::rename(m.join("other.bin"), m.join("o2.bin")));
    assert_fault("unlink", fs::remove_file(m.join("other.bin")));
    assert_fault("truncate", other.set_len(10));
    assert_fault("fsync", other.sync_all());
    assert!(!b.join("new.bin").exists() && b.join("other.bin").exists());
    assert_eq!(fs::metadata(m.join("other.bin"))?.len(), 4096);
    // Reads still work.
    assert_eq!(fs::read(m.join("wal/1.wal"))?, pattern(1, 4096));
    switch(&m, ".powerfs-heal");

    // Read fault on ".wal": reading a segment fails, stat and other files work.
    switch(&m, ".powerfs-eio-read=.wal");
    assert_fault("read of a segment", fs::read(m.join("wal/1.wal")));
    assert_eq!(fs::metadata(m.join("wal/1.wal"))?.len(), 4096);
    assert_eq!(fs::read(m.join("other.bin"))?[..512], pattern(4, 512)[..]);
    seg.write_all_at(&pattern(5, 512), 512)?;
    seg.sync_data()?;
    switch(&m, ".powerfs-heal");
    assert_eq!(
        fs::read(m.join("wal/1.wal"))?[512..1024],
        pattern(5, 512)[..]
    );

    drop((seg, other));
    let err = fs_.unmount()?;
    assert!(
        err.contains("fault: fsync answers EIO on paths containing \"wal\""),
        "{err}"
    );
    assert!(
        err.contains("fault: reads answer EIO on paths containing \".wal\""),
        "{err}"
    );
    // fsync ×2, write ×2, create, mkdir, rename, unlink, truncate, fsync, read.
    assert!(err.contains(", 11 injected errors"), "{err}");
    Ok(())
}
