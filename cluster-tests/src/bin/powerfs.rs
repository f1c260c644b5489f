//! powerfs: a FUSE pass-through file system that loses power on demand, for
//! crash tests (in the spirit of LazyFS, which Jepsen uses for the same job).
//!
//! ```text
//! powerfs BACKING_DIR MOUNTPOINT [--seed N]
//! ```
//!
//! runs in the foreground and mounts a view of `BACKING_DIR` at `MOUNTPOINT`
//! until it is unmounted (`umount MOUNTPOINT`, `umount -l MOUNTPOINT`; SIGINT,
//! SIGTERM or SIGHUP make it detach the mount itself, a second signal exits).
//! Needs root (or the right to mount FUSE with mount(2)); no fusermount.
//!
//! # What it models
//!
//! A disk with a volatile write cache under a file system that journals its
//! metadata. `BACKING_DIR` is the platters: it never loses power.
//!
//! * **File data is volatile until `fsync`/`fdatasync`.** A write goes to an
//!   in-memory overlay of dirty 512-byte sectors (partial sectors are
//!   read-modify-written from the backing file) and moves the file's logical
//!   size; reads and `stat` see backing + overlay. `fsync` writes the file's
//!   dirty sectors to the backing file and sets its length to the logical size.
//!   Closing a file persists nothing. A write through an `O_SYNC`/`O_DSYNC`
//!   descriptor (or `RWF_DSYNC`) persists the sectors it touched at once.
//! * **A file created since its directory's last `fsync`** (create/mknod; the
//!   backing file exists at once) is *new*: its directory entry is volatile.
//!   `fsync` on the directory (open it, `fsync` the descriptor) makes the
//!   new entries in it durable; `fsync` of the file itself does not. A new
//!   file renamed elsewhere stays new under its new name (the new parent's
//!   `fsync` makes it durable); an unlinked one is simply gone.
//! * **Crash**: looking up, opening or creating the name [`CRASH_NAME`]
//!   (`.powerfs-crash`) in the mount root cuts the power: for every file with
//!   dirty sectors, each sector independently reaches the backing file with
//!   probability 1/2 (torn and reordered writes: any subset survives), so the
//!   backing length grows at most to the end of the last persisted sector and
//!   never to an unsynced size otherwise; then each new file's directory
//!   entry is lost (the backing file removed) with probability 1/2. The draws
//!   come from a splitmix64 generator seeded with `--seed` (default: from the
//!   clock), over files and entries in path order, so the same seed and the
//!   same operations give the same outcome. powerfs prints
//!   `powerfs: crash (seed S): F files with D dirty sectors, P persisted; N new files, R dropped`
//!   to stderr, and from then on answers every request with `EIO` (the
//!   triggering lookup/open/create included) until it is unmounted.
//!
//! * **Media errors** (switched on and off at run time, like the crash, by
//!   looking up, opening or creating a control name in the mount root; the
//!   request answers `ENOENT` once the switch is made, `EINVAL` for an
//!   unknown `.powerfs-` name). `NAME=SUBSTR` limits the fault to paths
//!   (relative to the mount root) that contain `SUBSTR`, e.g.
//!   `.powerfs-eio-write=wal`; without `=` it covers every path.
//!   - [`EIO_FSYNC`] (`.powerfs-eio-fsync`): `fsync`/`fdatasync` of a matching
//!     file and `fsync` of a matching directory answer `EIO`. The file's dirty
//!     sectors are dropped, as the kernel drops the dirty state of pages whose
//!     writeback failed: reads then see the platters, and a later `fsync` (after
//!     [`HEAL`]) succeeds without them (PostgreSQL's "fsyncgate"). Writes still
//!     land in the cache, as on a disk whose errors surface at writeback.
//!   - [`EIO_WRITE`] (`.powerfs-eio-write`): as `.powerfs-eio-fsync`, and every
//!     write, `fallocate`, truncate, create, mknod, mkdir, unlink, rmdir and
//!     rename of a matching path answers `EIO` without changing anything.
//!   - [`EIO_READ`] (`.powerfs-eio-read`): reads of a matching file answer `EIO`
//!     (open and `stat` still work: an unreadable sector, not a missing file).
//!   - [`HEAL`] (`.powerfs-heal`): every fault is off again (what was lost
//!     stays lost).
//!
//!   Each switch prints `powerfs: fault: ...` to stderr; the unmount line counts
//!   the requests answered `EIO` by a fault (`N injected errors`).
//!
//! # What it does not model
//!
//! * Metadata operations other than file creation are durable at once:
//!   mkdir, rmdir, unlink, rename, truncate, chmod/chown/utimes are applied to
//!   the backing directory when they are made (a real file system may lose or
//!   reorder them too). Truncation drops the dirty sectors past the new size.
//! * No ordering between files beyond the above, no partial sectors (a sector
//!   is written whole or not at all), no read errors but the injected ones
//!   (whole files, not sectors), no full disk (the backing directory's `statfs`
//!   is passed through).
//! * An unmount without a crash persists nothing either: unsynced data is
//!   dropped (what was synced, and every file created, is in the backing
//!   directory) and powerfs prints `powerfs: unmounted, nothing lost: S fsyncs,
//!   N injected errors` (plus a line counting the unsynced sectors it dropped,
//!   if any).
//!
//! Every open file is in `FOPEN_DIRECT_IO` mode and entry/attribute timeouts
//! are zero, so the kernel caches neither data nor sizes; `MAP_SHARED` `mmap`
//! is therefore refused (`ENODEV`; private maps work). Locks (`flock`, `fcntl`) are left
//! to the kernel. `fallocate` grows a file's size (mode 0, volatile like a
//! write past the end; other modes answer `EOPNOTSUPP`); symlinks and hard links cannot be made
//! (readlink works on symlinks already in the backing dir).
//! `sync_file_range` never reaches a FUSE file system and is not a barrier.
//! Inode numbers are powerfs's own (a counter, the root is 1), mapped to
//! backing paths and kept right across renames (of directories too); an
//! unlinked file stays readable and writable through descriptors open on it.
//! Requests are served one at a time under a single lock.

use clap::Parser;
use cluster_tests::faults::rng::Rng;
use fuser::{
    AccessFlags, BsdFileFlags, Config, Errno, FileAttr, FileHandle, FileType, Filesystem,
    FopenFlags, Generation, INodeNo, LockOwner, MountOption, OpenFlags, RenameFlags, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs,
    ReplyWrite, ReplyXattr, Request, Session, SessionACL, TimeOrNow, WriteFlags,
};
use std::collections::btree_map::Entry as BEntry;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::{CString, OsStr, OsString};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The name, in the mount root, whose lookup, open or creation cuts the power.
pub const CRASH_NAME: &str = ".powerfs-crash";

/// Control name: from now on `fsync`s of matching paths fail with `EIO` (see the module docs).
pub const EIO_FSYNC: &str = ".powerfs-eio-fsync";
/// Control name: from now on writes, `fsync`s and namespace changes of matching paths fail
/// with `EIO`.
pub const EIO_WRITE: &str = ".powerfs-eio-write";
/// Control name: from now on reads of matching files fail with `EIO`.
pub const EIO_READ: &str = ".powerfs-eio-read";
/// Control name: every injected fault is off again.
pub const HEAL: &str = ".powerfs-heal";

/// The unit of loss: a dirty sector reaches the platters whole or not at all.
const SECTOR: u64 = 512;

/// Entry and attribute timeouts: none, so sizes are never stale in the kernel.
const TTL: Duration = Duration::ZERO;

/// Prints a line to stderr; unlike `eprintln!`, never panics (a closed
/// stderr pipe must not take the file system down).
macro_rules! note {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// Largest run of contiguous sectors written with one `pwrite`.
const MAX_RUN: usize = 1 << 20;

/// Injected media errors: for each kind, the substring a path must contain
/// (`Some("")`: every path), or `None` when off.
#[derive(Debug, Default)]
struct Faults {
    fsync: Option<Vec<u8>>,
    write: Option<Vec<u8>>,
    read: Option<Vec<u8>>,
    /// Requests answered `EIO` by a fault.
    injected: u64,
}

/// Which operation a fault check is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Fsync,
    Write,
    Read,
}

/// True when `hay` contains `needle` (the empty needle is everywhere).
fn contains(hay: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || hay.windows(needle.len()).any(|w| w == needle)
}

#[derive(Parser, Debug)]
#[command(
    name = "powerfs",
    about = "FUSE pass-through with a volatile write cache; lookup/open/create \
             `.powerfs-crash` in the mount root to simulate a power loss"
)]
struct Args {
    /// Directory holding the durable state (the "platters").
    backing_dir: PathBuf,
    /// Where to mount the view (an existing directory).
    mountpoint: PathBuf,
    /// Seed of the crash's coin flips (default: from the clock; printed).
    #[arg(long)]
    seed: Option<u64>,
}

/// True with probability 1/2.
fn coin(rng: &mut Rng) -> bool {
    rng.next_u64() >> 63 == 1
}

/// The volatile state of one file: dirty sectors not yet on the platters and
/// the file's logical size. Invariant: the backing length is at most `size`,
/// and the bytes of a dirty sector past `size` are zero.
#[derive(Debug)]
struct Overlay {
    size: u64,
    sectors: BTreeMap<u64, Box<[u8; SECTOR as usize]>>,
}

impl Overlay {
    /// Drops what lies past `size` and sets the logical size.
    fn truncate(&mut self, size: u64) {
        let keep = size.div_ceil(SECTOR);
        self.sectors.split_off(&keep);
        let tail = (size % SECTOR) as usize;
        if tail != 0 {
            if let Some(s) = self.sectors.get_mut(&(size / SECTOR)) {
                s[tail..].fill(0);
            }
        }
        self.size = size;
    }

    /// The bytes of sector `s` that lie within the logical size.
    fn clipped<'a>(&self, s: u64, data: &'a [u8; SECTOR as usize]) -> &'a [u8] {
        let len = self.size.saturating_sub(s * SECTOR).min(SECTOR) as usize;
        &data[..len]
    }
}

/// Writes sectors to a backing file, coalescing contiguous ones.
struct RunWriter<'a> {
    file: &'a File,
    start: u64,
    buf: Vec<u8>,
}

impl<'a> RunWriter<'a> {
    fn new(file: &'a File) -> Self {
        RunWriter {
            file,
            start: 0,
            buf: Vec::new(),
        }
    }

    /// Queues `data` for byte offset `at` (a sector start).
    fn push(&mut self, at: u64, data: &[u8]) -> io::Result<()> {
        if !self.buf.is_empty()
            && (self.start + self.buf.len() as u64 != at || self.buf.len() >= MAX_RUN)
        {
            self.flush()?;
        }
        if self.buf.is_empty() {
            self.start = at;
        }
        self.buf.extend_from_slice(data);
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        if !self.buf.is_empty() {
            self.file.write_all_at(&self.buf, self.start)?;
            self.buf.clear();
        }
        Ok(())
    }
}

/// One file or directory the kernel knows by number.
#[derive(Debug)]
struct Inode {
    /// Absolute backing path; `None` once unlinked (or replaced) while open.
    path: Option<PathBuf>,
    kind: FileType,
    /// Lookups the kernel holds (entry replies minus forgets).
    nlookup: u64,
    /// Open file handles.
    open: u64,
    /// Backing descriptor, kept while open or dirty (works after unlink).
    file: Option<File>,
    /// Unsynced data, if any.
    overlay: Option<Overlay>,
}

impl Inode {
    /// A regular file's backing descriptor (opened on first use) and its unsynced overlay
    /// (created at the backing file's length on first use).
    fn overlay(&mut self) -> Res<(&File, &mut Overlay)> {
        if self.file.is_none() {
            let p = self.path.as_ref().ok_or(Errno::EBADF)?;
            self.file = Some(open_backing(p).map_err(errno)?);
        }
        let Inode { file, overlay, .. } = self;
        let f = file.as_ref().ok_or(Errno::EBADF)?;
        let ov = match overlay {
            Some(ov) => ov,
            None => overlay.insert(Overlay {
                size: f.metadata().map_err(errno)?.len(),
                sectors: BTreeMap::new(),
            }),
        };
        Ok((f, ov))
    }
}

/// End offset of a write or allocation of `len` bytes at `offset`. Errors: `EFBIG` past
/// what a file offset can hold.
fn end_of(offset: u64, len: u64) -> Res<u64> {
    offset
        .checked_add(len)
        .filter(|&e| e <= i64::MAX as u64)
        .ok_or(Errno::EFBIG)
}

/// Snapshot of a directory listing taken at opendir.
type Listing = Vec<(u64, FileType, OsString)>;

/// Everything behind the one lock.
#[derive(Debug)]
struct State {
    backing: PathBuf,
    seed: u64,
    rng: Rng,
    crashed: bool,
    inodes: HashMap<u64, Inode>,
    by_path: HashMap<PathBuf, u64>,
    next_ino: u64,
    /// Files whose directory entry is not durable yet.
    new_files: BTreeSet<u64>,
    listings: HashMap<u64, Listing>,
    next_dir_fh: u64,
    fsyncs: u64,
    faults: Faults,
}

/// The file system: the state under a single mutex.
struct PowerFs {
    state: Mutex<State>,
}

type Res<T> = Result<T, Errno>;

fn errno(e: io::Error) -> Errno {
    Errno::from(e)
}

fn last_errno() -> Errno {
    errno(io::Error::last_os_error())
}

fn cpath(p: &Path) -> Res<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| Errno::EINVAL)
}

fn kind_of(ft: fs::FileType) -> FileType {
    FileType::from_std(ft).unwrap_or(FileType::RegularFile)
}

fn time(secs: i64, nsecs: i64) -> SystemTime {
    let nsecs = nsecs.clamp(0, 999_999_999) as u32;
    if secs >= 0 {
        UNIX_EPOCH
            .checked_add(Duration::new(secs as u64, nsecs))
            .unwrap_or(UNIX_EPOCH)
    } else {
        UNIX_EPOCH
            .checked_sub(Duration::new(secs.unsigned_abs(), 0))
            .and_then(|t| t.checked_add(Duration::new(0, nsecs)))
            .unwrap_or(UNIX_EPOCH)
    }
}

fn attr(ino: u64, m: &fs::Metadata, size: u64) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size,
        blocks: m.blocks(),
        atime: time(m.atime(), m.atime_nsec()),
        mtime: time(m.mtime(), m.mtime_nsec()),
        ctime: time(m.ctime(), m.ctime_nsec()),
        crtime: UNIX_EPOCH,
        kind: kind_of(m.file_type()),
        perm: (m.mode() & 0o7777) as u16,
        nlink: m.nlink() as u32,
        uid: m.uid(),
        gid: m.gid(),
        rdev: m.rdev() as u32,
        blksize: m.blksize() as u32,
        flags: 0,
    }
}

/// Reads into `buf` from `at` until it is full or the file ends (the rest
/// stays as it was: zeros).
fn read_full_at(f: &File, buf: &mut [u8], at: u64) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match f.read_at(&mut buf[done..], at + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Opens a backing file read-write, or read-only where writing is refused.
fn open_backing(path: &Path) -> io::Result<File> {
    match OpenOptions::new().read(true).write(true).open(path) {
        Ok(f) => Ok(f),
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EACCES | libc::EROFS | libc::EPERM | libc::ETXTBSY)
            ) =>
        {
            File::open(path)
        }
        Err(e) => Err(e),
    }
}

/// Makes a file created on behalf of another user theirs (we run as root).
fn give_to(path: &Path, uid: u32, gid: u32) -> Res<()> {
    // SAFETY: geteuid has no preconditions.
    if uid == unsafe { libc::geteuid() } {
        return Ok(());
    }
    let c = cpath(path)?;
    // SAFETY: c is a valid NUL-terminated path.
    if unsafe { libc::lchown(c.as_ptr(), uid, gid) } != 0 {
        return Err(last_errno());
    }
    Ok(())
}

fn timespec(t: Option<TimeOrNow>) -> libc::timespec {
    match t {
        None => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        Some(TimeOrNow::Now) => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_NOW,
        },
        Some(TimeOrNow::SpecificTime(t)) => match t.duration_since(UNIX_EPOCH) {
            Ok(d) => libc::timespec {
                tv_sec: d.as_secs() as libc::time_t,
                tv_nsec: d.subsec_nanos() as _,
            },
            Err(e) => {
                let d = e.duration();
                let mut sec = -(d.as_secs() as i64);
                let mut nsec = 0i64;
                if d.subsec_nanos() > 0 {
                    sec -= 1;
                    nsec = 1_000_000_000 - i64::from(d.subsec_nanos());
                }
                libc::timespec {
                    tv_sec: sec as libc::time_t,
                    tv_nsec: nsec as _,
                }
            }
        },
    }
}

impl State {
    fn new(backing: PathBuf, seed: u64) -> State {
        let mut inodes = HashMap::new();
        inodes.insert(
            INodeNo::ROOT.0,
            Inode {
                path: Some(backing.clone()),
                kind: FileType::Directory,
                nlookup: 0,
                open: 0,
                file: None,
                overlay: None,
            },
        );
        let mut by_path = HashMap::new();
        by_path.insert(backing.clone(), INodeNo::ROOT.0);
        State {
            backing,
            seed,
            rng: Rng::new(seed),
            crashed: false,
            inodes,
            by_path,
            next_ino: INodeNo::ROOT.0 + 1,
            new_files: BTreeSet::new(),
            listings: HashMap::new(),
            next_dir_fh: 1,
            fsyncs: 0,
            faults: Faults::default(),
        }
    }

    /// `EIO` once the power is gone.
    fn live(&self) -> Res<()> {
        if self.crashed {
            Err(Errno::EIO)
        } else {
            Ok(())
        }
    }

    /// `EIO` (counted) when an injected fault covers `op` on `path` (a backing
    /// path; `None`, an unlinked file, is matched only by a fault on every path).
    /// A write fault covers fsyncs too.
    fn fault(&mut self, op: Op, path: Option<&Path>) -> Res<()> {
        let f = &self.faults;
        let patterns = match op {
            Op::Read => [f.read.as_deref(), None],
            Op::Write => [f.write.as_deref(), None],
            Op::Fsync => [f.fsync.as_deref(), f.write.as_deref()],
        };
        let rel = path.map(|p| p.strip_prefix(&self.backing).unwrap_or(p));
        let hit = patterns.into_iter().flatten().any(|pat| match rel {
            Some(r) => contains(r.as_os_str().as_bytes(), pat),
            None => pat.is_empty(),
        });
        if hit {
            self.faults.injected += 1;
            return Err(Errno::EIO);
        }
        Ok(())
    }

    /// [`State::fault`] for inode `ino`'s path.
    fn fault_ino(&mut self, op: Op, ino: u64) -> Res<()> {
        let path = self.inode(ino)?.path.clone();
        self.fault(op, path.as_deref())
    }

    /// Switches a fault if `name` (in the mount root) is a control name:
    /// `Some(ENOENT)` once switched, `Some(EINVAL)` for an unknown `.powerfs-`
    /// name, `None` for any other name.
    fn control(&mut self, name: &OsStr) -> Option<Errno> {
        let name = name.as_bytes();
        if !name.starts_with(b".powerfs-") || name == CRASH_NAME.as_bytes() {
            return None;
        }
        let (switch, pattern) = match name.iter().position(|&b| b == b'=') {
            Some(i) => (&name[..i], name[i + 1..].to_vec()),
            None => (name, Vec::new()),
        };
        let shown = String::from_utf8_lossy(&pattern).into_owned();
        let scope = if pattern.is_empty() {
            "every path".to_string()
        } else {
            format!("paths containing {shown:?}")
        };
        let f = &mut self.faults;
        if switch == EIO_FSYNC.as_bytes() {
            f.fsync = Some(pattern);
            note!("powerfs: fault: fsync answers EIO on {scope}");
        } else if switch == EIO_WRITE.as_bytes() {
            f.write = Some(pattern);
            note!("powerfs: fault: writes and fsync answer EIO on {scope}");
        } else if switch == EIO_READ.as_bytes() {
            f.read = Some(pattern);
            note!("powerfs: fault: reads answer EIO on {scope}");
        } else if switch == HEAL.as_bytes() && pattern.is_empty() {
            f.fsync = None;
            f.write = None;
            f.read = None;
            note!(
                "powerfs: fault: healed ({} injected errors so far)",
                f.injected
            );
        } else {
            return Some(Errno::EINVAL);
        }
        Some(Errno::ENOENT)
    }

    fn inode(&self, ino: u64) -> Res<&Inode> {
        self.inodes.get(&ino).ok_or(Errno::ESTALE)
    }

    fn inode_mut(&mut self, ino: u64) -> Res<&mut Inode> {
        self.inodes.get_mut(&ino).ok_or(Errno::ESTALE)
    }

    /// Backing path of a linked inode.
    fn path(&self, ino: u64) -> Res<PathBuf> {
        self.inode(ino)?.path.clone().ok_or(Errno::ENOENT)
    }

    /// Backing path of `name` in directory `parent`.
    fn child(&self, parent: u64, name: &OsStr) -> Res<PathBuf> {
        if name.as_bytes().contains(&b'/') || name.is_empty() {
            return Err(Errno::EINVAL);
        }
        let dir = self.path(parent)?;
        Ok(match name.as_bytes() {
            b"." => dir,
            b".." if dir == self.backing => dir,
            b".." => dir.parent().map(Path::to_path_buf).unwrap_or(dir),
            _ => dir.join(name),
        })
    }

    /// The backing path of `name` in directory `parent`, for a request that
    /// names it (lookup, mknod, create). Errors: `EIO` after the crash, and
    /// for the crash trigger itself (`CRASH_NAME` in the root), which crashes.
    fn named(&mut self, parent: u64, name: &OsStr) -> Res<PathBuf> {
        self.live()?;
        if parent == INodeNo::ROOT.0 && name == OsStr::new(CRASH_NAME) {
            self.crash();
            return Err(Errno::EIO);
        }
        if parent == INodeNo::ROOT.0 {
            if let Some(e) = self.control(name) {
                return Err(e);
            }
        }
        self.child(parent, name)
    }

    /// The inode number of the backing file at `path`, allocated if the
    /// path is unknown or now names a file of another type (only changes
    /// behind powerfs's back do that). Backing inode numbers are not
    /// compared: readdir's and stat's may differ (overlayfs), and a false
    /// mismatch would lose track of a file's unsynced data.
    fn register(&mut self, path: &Path, kind: FileType) -> u64 {
        if let Some(&ino) = self.by_path.get(path) {
            match self.inodes.get(&ino) {
                Some(i) if i.kind == kind || ino == INodeNo::ROOT.0 => return ino,
                _ => self.detach(ino),
            }
        }
        let ino = self.next_ino;
        self.next_ino += 1;
        self.inodes.insert(
            ino,
            Inode {
                path: Some(path.to_path_buf()),
                kind,
                nlookup: 0,
                open: 0,
                file: None,
                overlay: None,
            },
        );
        self.by_path.insert(path.to_path_buf(), ino);
        ino
    }

    fn register_meta(&mut self, path: &Path, m: &fs::Metadata) -> u64 {
        self.register(path, kind_of(m.file_type()))
    }

    /// The inode's name is gone (unlinked, replaced): forget the path; its
    /// volatile data lives on only while it is open.
    fn detach(&mut self, ino: u64) {
        if ino == INodeNo::ROOT.0 {
            return;
        }
        self.new_files.remove(&ino);
        let Some(i) = self.inodes.get_mut(&ino) else {
            return;
        };
        if let Some(p) = i.path.take() {
            if self.by_path.get(&p) == Some(&ino) {
                self.by_path.remove(&p);
            }
        }
        if i.open == 0 {
            i.overlay = None;
            i.file = None;
        }
        self.maybe_gc(ino);
    }

    /// Drops an unlinked inode the kernel no longer references.
    fn maybe_gc(&mut self, ino: u64) {
        if let Some(i) = self.inodes.get(&ino) {
            if ino != INodeNo::ROOT.0 && i.path.is_none() && i.nlookup == 0 && i.open == 0 {
                self.inodes.remove(&ino);
            }
        }
    }

    /// Attributes as seen through the mount (logical size).
    fn getattr(&self, ino: u64) -> Res<FileAttr> {
        let i = self.inode(ino)?;
        let m = match (&i.file, &i.path) {
            (Some(f), _) => f.metadata(),
            (None, Some(p)) => fs::symlink_metadata(p),
            (None, None) => return Err(Errno::ENOENT),
        }
        .map_err(errno)?;
        let size = i.overlay.as_ref().map_or(m.len(), |o| o.size);
        Ok(attr(ino, &m, size))
    }

    /// An entry reply for `ino`: counts the kernel's lookup.
    fn entry(&mut self, ino: u64) -> Res<FileAttr> {
        let a = self.getattr(ino)?;
        self.inode_mut(ino)?.nlookup += 1;
        Ok(a)
    }

    fn lookup(&mut self, parent: u64, name: &OsStr) -> Res<FileAttr> {
        let path = self.named(parent, name)?;
        let m = fs::symlink_metadata(&path).map_err(errno)?;
        let ino = self.register_meta(&path, &m);
        self.entry(ino)
    }

    fn forget(&mut self, ino: u64, n: u64) {
        if let Some(i) = self.inodes.get_mut(&ino) {
            i.nlookup = i.nlookup.saturating_sub(n);
            self.maybe_gc(ino);
        }
    }

    /// Sets the size: durable at once in the backing file; the overlay loses
    /// what lies past it.
    fn truncate(&mut self, ino: u64, size: u64) -> Res<()> {
        let i = self.inode_mut(ino)?;
        match i.kind {
            FileType::RegularFile => {}
            FileType::Directory => return Err(Errno::EISDIR),
            _ => return Err(Errno::EINVAL),
        }
        let res = match &i.path {
            Some(p) => OpenOptions::new()
                .write(true)
                .open(p)
                .and_then(|f| f.set_len(size)),
            None => match &i.file {
                Some(f) => f.set_len(size),
                None => Err(io::Error::from_raw_os_error(libc::ENOENT)),
            },
        };
        res.map_err(errno)?;
        if let Some(ov) = &mut i.overlay {
            ov.truncate(size);
            if ov.sectors.is_empty() {
                i.overlay = None;
            }
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn setattr(
        &mut self,
        ino: u64,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
    ) -> Res<FileAttr> {
        self.live()?;
        if let Some(size) = size {
            self.fault_ino(Op::Write, ino)?;
            self.truncate(ino, size)?;
        }
        let i = self.inode(ino)?;
        // Linked: by path (works for directories too); unlinked: by descriptor.
        let target = match (&i.path, &i.file) {
            (Some(p), _) => Ok(cpath(p)?),
            (None, Some(f)) => Err(f.as_raw_fd()),
            (None, None) => return Err(Errno::ENOENT),
        };
        if let Some(mode) = mode {
            let mode = (mode & 0o7777) as libc::mode_t;
            // SAFETY: valid path / open descriptor.
            let r = match &target {
                Ok(c) => unsafe { libc::chmod(c.as_ptr(), mode) },
                Err(fd) => unsafe { libc::fchmod(*fd, mode) },
            };
            if r != 0 {
                return Err(last_errno());
            }
        }
        if uid.is_some() || gid.is_some() {
            let u = uid.unwrap_or(u32::MAX);
            let g = gid.unwrap_or(u32::MAX);
            // SAFETY: valid path / open descriptor; -1 keeps an id.
            let r = match &target {
                Ok(c) => unsafe { libc::lchown(c.as_ptr(), u, g) },
                Err(fd) => unsafe { libc::fchown(*fd, u, g) },
            };
            if r != 0 {
                return Err(last_errno());
            }
        }
        if atime.is_some() || mtime.is_some() {
            let ts = [timespec(atime), timespec(mtime)];
            // SAFETY: valid path / open descriptor and a two-element array.
            let r = match &target {
                Ok(c) => unsafe {
                    libc::utimensat(
                        libc::AT_FDCWD,
                        c.as_ptr(),
                        ts.as_ptr(),
                        libc::AT_SYMLINK_NOFOLLOW,
                    )
                },
                Err(fd) => unsafe { libc::futimens(*fd, ts.as_ptr()) },
            };
            if r != 0 {
                return Err(last_errno());
            }
        }
        self.getattr(ino)
    }

    fn readlink(&self, ino: u64) -> Res<Vec<u8>> {
        self.live()?;
        let p = self.path(ino)?;
        Ok(fs::read_link(p).map_err(errno)?.into_os_string().into_vec())
    }

    /// Creates a regular file (new: its entry is volatile) or a special node.
    fn mknod(
        &mut self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        owner: (u32, u32),
    ) -> Res<FileAttr> {
        let path = self.named(parent, name)?;
        self.fault(Op::Write, Some(&path))?;
        let perm = mode & !umask & 0o7777;
        let regular = mode & libc::S_IFMT == libc::S_IFREG || mode & libc::S_IFMT == 0;
        if regular {
            OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(perm)
                .open(&path)
                .map_err(errno)?;
        } else {
            let c = cpath(&path)?;
            // SAFETY: valid path.
            let r = unsafe {
                libc::mknod(
                    c.as_ptr(),
                    (mode & libc::S_IFMT) as libc::mode_t | perm as libc::mode_t,
                    libc::dev_t::from(rdev),
                )
            };
            if r != 0 {
                return Err(last_errno());
            }
        }
        give_to(&path, owner.0, owner.1)?;
        let m = fs::symlink_metadata(&path).map_err(errno)?;
        let ino = self.register_meta(&path, &m);
        if regular {
            self.new_files.insert(ino);
        }
        self.entry(ino)
    }

    fn mkdir(
        &mut self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        owner: (u32, u32),
    ) -> Res<FileAttr> {
        self.live()?;
        let path = self.child(parent, name)?;
        self.fault(Op::Write, Some(&path))?;
        fs::DirBuilder::new()
            .mode(mode & !umask & 0o7777)
            .create(&path)
            .map_err(errno)?;
        give_to(&path, owner.0, owner.1)?;
        let m = fs::symlink_metadata(&path).map_err(errno)?;
        let ino = self.register_meta(&path, &m);
        self.entry(ino)
    }

    fn unlink(&mut self, parent: u64, name: &OsStr, dir: bool) -> Res<()> {
        self.live()?;
        let path = self.child(parent, name)?;
        self.fault(Op::Write, Some(&path))?;
        if dir {
            fs::remove_dir(&path)
        } else {
            fs::remove_file(&path)
        }
        .map_err(errno)?;
        if let Some(&ino) = self.by_path.get(&path) {
            self.detach(ino);
        }
        Ok(())
    }

    fn rename(
        &mut self,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: RenameFlags,
    ) -> Res<()> {
        self.live()?;
        if flags.intersects(RenameFlags::RENAME_EXCHANGE | RenameFlags::RENAME_WHITEOUT) {
            return Err(Errno::EINVAL);
        }
        let old = self.child(parent, name)?;
        let new = self.child(newparent, newname)?;
        self.fault(Op::Write, Some(&old))?;
        self.fault(Op::Write, Some(&new))?;
        if flags.is_empty() {
            fs::rename(&old, &new).map_err(errno)?;
        } else {
            let (o, n) = (cpath(&old)?, cpath(&new)?);
            // SAFETY: valid paths.
            let r = unsafe {
                libc::renameat2(
                    libc::AT_FDCWD,
                    o.as_ptr(),
                    libc::AT_FDCWD,
                    n.as_ptr(),
                    flags.bits(),
                )
            };
            if r != 0 {
                return Err(last_errno());
            }
        }
        if old == new {
            return Ok(());
        }
        let src = self.by_path.get(&old).copied();
        if let Some(dst) = self.by_path.get(&new).copied() {
            if Some(dst) != src {
                self.detach(dst);
            }
        }
        let is_dir = fs::symlink_metadata(&new).is_ok_and(|m| m.is_dir());
        // The renamed inode and, for a directory, everything mapped below it.
        let moved: Vec<(u64, PathBuf, PathBuf)> = if is_dir {
            self.inodes
                .iter()
                .filter(|(&ino, _)| ino != INodeNo::ROOT.0)
                .filter_map(|(&ino, i)| {
                    let p = i.path.as_ref()?;
                    let rest = p.strip_prefix(&old).ok()?;
                    let to = if rest.as_os_str().is_empty() {
                        new.clone()
                    } else {
                        new.join(rest)
                    };
                    Some((ino, p.clone(), to))
                })
                .collect()
        } else {
            src.map(|ino| (ino, old.clone(), new.clone()))
                .into_iter()
                .collect()
        };
        for (ino, from, _) in &moved {
            if self.by_path.get(from) == Some(ino) {
                self.by_path.remove(from);
            }
        }
        for (ino, _, to) in moved {
            if let Some(i) = self.inodes.get_mut(&ino) {
                i.path = Some(to.clone());
                self.by_path.insert(to, ino);
            }
        }
        Ok(())
    }

    /// Counts an open handle and makes sure a backing descriptor is open.
    fn open_file(&mut self, ino: u64) -> Res<()> {
        let i = self.inode_mut(ino)?;
        match i.kind {
            FileType::RegularFile => {}
            FileType::Directory => return Err(Errno::EISDIR),
            _ => return Err(Errno::EOPNOTSUPP),
        }
        if i.file.is_none() {
            let p = i.path.as_ref().ok_or(Errno::ENOENT)?;
            i.file = Some(open_backing(p).map_err(errno)?);
        }
        i.open += 1;
        Ok(())
    }

    fn open(&mut self, ino: u64) -> Res<()> {
        self.live()?;
        if self.inode(ino)?.path.as_deref() == Some(&self.backing.join(CRASH_NAME)) {
            self.crash();
            return Err(Errno::EIO);
        }
        self.open_file(ino)
    }

    fn create(
        &mut self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        owner: (u32, u32),
    ) -> Res<FileAttr> {
        let path = self.named(parent, name)?;
        if flags & (libc::O_CREAT | libc::O_TRUNC) != 0 {
            self.fault(Op::Write, Some(&path))?;
        }
        let mut oo = OpenOptions::new();
        oo.read(true).write(true).mode(mode & !umask & 0o7777);
        let (file, created) = match oo.clone().create_new(true).open(&path) {
            Ok(f) => (f, true),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && flags & libc::O_EXCL == 0 => {
                (oo.open(&path).map_err(errno)?, false)
            }
            Err(e) => return Err(errno(e)),
        };
        if created {
            give_to(&path, owner.0, owner.1)?;
        }
        let m = file.metadata().map_err(errno)?;
        let ino = self.register_meta(&path, &m);
        if created {
            self.new_files.insert(ino);
        } else if flags & libc::O_TRUNC != 0 {
            self.truncate(ino, 0)?;
        }
        let i = self.inode_mut(ino)?;
        if i.kind != FileType::RegularFile {
            return Err(Errno::EISDIR);
        }
        if i.file.is_none() {
            i.file = Some(file);
        }
        i.open += 1;
        self.entry(ino)
    }

    fn read(&mut self, ino: u64, offset: u64, size: u32) -> Res<Vec<u8>> {
        self.live()?;
        self.fault_ino(Op::Read, ino)?;
        let i = self.inode(ino)?;
        let tmp;
        let f = match (&i.file, &i.path) {
            (Some(f), _) => f,
            (None, Some(p)) => {
                tmp = File::open(p).map_err(errno)?;
                &tmp
            }
            (None, None) => return Err(Errno::ENOENT),
        };
        let logical = match &i.overlay {
            Some(o) => o.size,
            None => f.metadata().map_err(errno)?.len(),
        };
        if offset >= logical || size == 0 {
            return Ok(Vec::new());
        }
        let end = logical.min(offset.saturating_add(u64::from(size)));
        let mut buf = vec![0u8; (end - offset) as usize];
        read_full_at(f, &mut buf, offset).map_err(errno)?;
        if let Some(ov) = &i.overlay {
            for (&s, data) in ov.sectors.range(offset / SECTOR..=(end - 1) / SECTOR) {
                let lo = (s * SECTOR).max(offset);
                let hi = (s * SECTOR + SECTOR).min(end);
                buf[(lo - offset) as usize..(hi - offset) as usize]
                    .copy_from_slice(&data[(lo - s * SECTOR) as usize..(hi - s * SECTOR) as usize]);
            }
        }
        Ok(buf)
    }

    /// Puts `data` into the overlay; with `O_DSYNC` writes the touched
    /// sectors through at once.
    fn write(&mut self, ino: u64, offset: u64, data: &[u8], flags: i32) -> Res<u32> {
        self.live()?;
        self.fault_ino(Op::Write, ino)?;
        let i = self.inode_mut(ino)?;
        if i.kind != FileType::RegularFile {
            return Err(Errno::EBADF);
        }
        if data.is_empty() {
            return Ok(0);
        }
        let end = end_of(offset, data.len() as u64)?;
        let (f, ov) = i.overlay()?;
        let (first, last) = (offset / SECTOR, (end - 1) / SECTOR);
        for s in first..=last {
            let start = s * SECTOR;
            let lo = start.max(offset);
            let hi = (start + SECTOR).min(end);
            let sector = match ov.sectors.entry(s) {
                BEntry::Occupied(e) => e.into_mut(),
                BEntry::Vacant(v) => {
                    let mut b = Box::new([0u8; SECTOR as usize]);
                    if hi - lo < SECTOR {
                        // Partial: the rest comes from the platters (zeros
                        // past their end; they never extend past ov.size).
                        read_full_at(f, &mut b[..], start).map_err(errno)?;
                    }
                    v.insert(b)
                }
            };
            sector[(lo - start) as usize..(hi - start) as usize]
                .copy_from_slice(&data[(lo - offset) as usize..(hi - offset) as usize]);
        }
        ov.size = ov.size.max(end);
        if flags & libc::O_DSYNC != 0 {
            let mut w = RunWriter::new(f);
            for s in first..=last {
                if let Some(b) = ov.sectors.get(&s) {
                    w.push(s * SECTOR, ov.clipped(s, b)).map_err(errno)?;
                }
            }
            w.flush().map_err(errno)?;
            for s in first..=last {
                ov.sectors.remove(&s);
            }
            if ov.sectors.is_empty() {
                f.set_len(ov.size).map_err(errno)?;
                i.overlay = None;
            }
        }
        Ok(data.len() as u32)
    }

    /// fallocate mode 0 (the only one served): the file's logical size grows
    /// to at least `offset + length`, reading as zeros past what it held. Like
    /// a write past the end it is volatile: the new size reaches the platters
    /// with the next fsync, and a crash before that loses it.
    fn fallocate(&mut self, ino: u64, offset: u64, length: u64, mode: i32) -> Res<()> {
        self.live()?;
        self.fault_ino(Op::Write, ino)?;
        if mode != 0 {
            return Err(Errno::EOPNOTSUPP);
        }
        let end = end_of(offset, length)?;
        let i = self.inode_mut(ino)?;
        if i.kind != FileType::RegularFile {
            return Err(Errno::ENODEV);
        }
        let (_, ov) = i.overlay()?;
        ov.size = ov.size.max(end);
        Ok(())
    }

    /// fsync/fdatasync: the file's dirty sectors and size reach the platters.
    /// Under an fsync or write fault: `EIO`, and the dirty sectors are dropped
    /// (see the module docs).
    fn fsync(&mut self, ino: u64) -> Res<()> {
        self.live()?;
        self.fsyncs += 1;
        if let Err(e) = self.fault_ino(Op::Fsync, ino) {
            let i = self.inode_mut(ino)?;
            i.overlay = None;
            if i.open == 0 {
                i.file = None;
            }
            return Err(e);
        }
        let i = self.inode_mut(ino)?;
        let Some(ov) = &i.overlay else {
            return Ok(());
        };
        let tmp;
        let f = match (&i.file, &i.path) {
            (Some(f), _) => f,
            (None, Some(p)) => {
                tmp = open_backing(p).map_err(errno)?;
                &tmp
            }
            (None, None) => return Err(Errno::ENOENT),
        };
        let mut w = RunWriter::new(f);
        for (&s, b) in &ov.sectors {
            w.push(s * SECTOR, ov.clipped(s, b)).map_err(errno)?;
        }
        w.flush().map_err(errno)?;
        f.set_len(ov.size).map_err(errno)?;
        i.overlay = None;
        if i.open == 0 {
            i.file = None;
        }
        Ok(())
    }

    fn release(&mut self, ino: u64) -> Res<()> {
        let i = self.inode_mut(ino)?;
        i.open = i.open.saturating_sub(1);
        if i.open == 0 && (i.overlay.is_none() || i.path.is_none()) {
            i.overlay = None;
            i.file = None;
        }
        self.maybe_gc(ino);
        self.live()
    }

    fn opendir(&mut self, ino: u64) -> Res<u64> {
        self.live()?;
        let dir = self.path(ino)?;
        if self.inode(ino)?.kind != FileType::Directory {
            return Err(Errno::ENOTDIR);
        }
        let parent = if ino == INodeNo::ROOT.0 {
            ino
        } else {
            match dir.parent().map(fs::symlink_metadata) {
                Some(Ok(m)) => {
                    let p = dir.parent().map(Path::to_path_buf).unwrap_or_default();
                    self.register_meta(&p, &m)
                }
                _ => INodeNo::ROOT.0,
            }
        };
        let mut list: Listing = vec![
            (ino, FileType::Directory, ".".into()),
            (parent, FileType::Directory, "..".into()),
        ];
        for e in fs::read_dir(&dir).map_err(errno)? {
            let e = e.map_err(errno)?;
            let kind = kind_of(e.file_type().map_err(errno)?);
            let path = e.path();
            let child = self.register(&path, kind);
            list.push((child, kind, e.file_name()));
        }
        let fh = self.next_dir_fh;
        self.next_dir_fh += 1;
        self.listings.insert(fh, list);
        Ok(fh)
    }

    /// fsyncdir: the new files in this directory become durable.
    fn fsyncdir(&mut self, ino: u64) -> Res<()> {
        self.live()?;
        self.fsyncs += 1;
        let dir = self.path(ino)?;
        self.fault(Op::Fsync, Some(&dir))?;
        let inodes = &self.inodes;
        self.new_files.retain(|n| {
            inodes
                .get(n)
                .and_then(|i| i.path.as_deref())
                .and_then(Path::parent)
                != Some(dir.as_path())
        });
        Ok(())
    }

    fn statfs(&self) -> Res<libc::statvfs> {
        self.live()?;
        let c = cpath(&self.backing)?;
        // SAFETY: all-zero is a valid statvfs; c is a valid path.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
            return Err(last_errno());
        }
        Ok(st)
    }

    /// Cuts the power: see the module docs.
    fn crash(&mut self) {
        if self.crashed {
            return;
        }
        self.crashed = true;
        let mut dirty: Vec<(PathBuf, u64)> = self
            .inodes
            .iter()
            .filter(|(_, i)| i.overlay.as_ref().is_some_and(|o| !o.sectors.is_empty()))
            .filter_map(|(&ino, i)| Some((i.path.clone()?, ino)))
            .collect();
        dirty.sort();
        let (mut files, mut sectors, mut persisted) = (0u64, 0u64, 0u64);
        for (path, ino) in dirty {
            let Some(i) = self.inodes.get_mut(&ino) else {
                continue;
            };
            let Some(ov) = i.overlay.take() else {
                continue;
            };
            files += 1;
            let opened = match &i.file {
                Some(_) => None,
                None => open_backing(&path).ok(),
            };
            let f = i.file.as_ref().or(opened.as_ref());
            let mut kept = Vec::new();
            for &s in ov.sectors.keys() {
                sectors += 1;
                if coin(&mut self.rng) {
                    kept.push(s);
                }
            }
            if let Some(f) = f {
                let mut w = RunWriter::new(f);
                let mut ok = true;
                for s in &kept {
                    if let Some(b) = ov.sectors.get(s) {
                        ok &= w.push(s * SECTOR, ov.clipped(*s, b)).is_ok();
                    }
                }
                ok &= w.flush().is_ok();
                if ok {
                    persisted += kept.len() as u64;
                } else {
                    note!("powerfs: crash: writing {} failed", path.display());
                }
            }
        }
        let mut new: Vec<PathBuf> = self
            .new_files
            .iter()
            .filter_map(|n| self.inodes.get(n)?.path.clone())
            .collect();
        new.sort();
        let mut dropped = 0u64;
        for path in &new {
            if coin(&mut self.rng) {
                match fs::remove_file(path) {
                    Ok(()) => dropped += 1,
                    Err(e) => note!("powerfs: crash: removing {}: {e}", path.display()),
                }
            }
        }
        for i in self.inodes.values_mut() {
            i.overlay = None;
            i.file = None;
        }
        self.new_files.clear();
        self.listings.clear();
        note!(
            "powerfs: crash (seed {}): {files} files with {sectors} dirty sectors, \
             {persisted} persisted; {} new files, {dropped} dropped",
            self.seed,
            new.len()
        );
    }
}

impl PowerFs {
    fn state(&self) -> MutexGuard<'_, State> {
        // A poisoned lock cannot happen without a panic; carry on regardless.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn reply_empty(r: Res<()>, reply: ReplyEmpty) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}

fn reply_entry(r: Res<FileAttr>, reply: ReplyEntry) {
    match r {
        Ok(a) => reply.entry(&TTL, &a, Generation(0)),
        Err(e) => reply.error(e),
    }
}

impl Filesystem for PowerFs {
    fn destroy(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        if st.crashed {
            note!("powerfs: unmounted after the crash");
            return;
        }
        note!(
            "powerfs: unmounted, nothing lost: {} fsyncs, {} injected errors",
            st.fsyncs,
            st.faults.injected
        );
        let (mut files, mut sectors) = (0, 0);
        for i in st.inodes.values() {
            if let Some(o) = &i.overlay {
                if !o.sectors.is_empty() && i.path.is_some() {
                    files += 1;
                    sectors += o.sectors.len();
                }
            }
        }
        if sectors > 0 {
            note!(
                "powerfs: dropped {sectors} unsynced sectors of {files} files \
                 (unmounting is not a sync)"
            );
        }
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        reply_entry(self.state().lookup(parent.0, name), reply);
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.state().forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let st = self.state();
        match st.live().and_then(|()| st.getattr(ino.0)) {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        match self
            .state()
            .setattr(ino.0, mode, uid, gid, size, atime, mtime)
        {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.state().readlink(ino.0) {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(e),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let owner = (req.uid(), req.gid());
        reply_entry(
            self.state().mknod(parent.0, name, mode, umask, rdev, owner),
            reply,
        );
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let owner = (req.uid(), req.gid());
        reply_entry(
            self.state().mkdir(parent.0, name, mode, umask, owner),
            reply,
        );
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(self.state().unlink(parent.0, name, false), reply);
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(self.state().unlink(parent.0, name, true), reply);
    }

    fn symlink(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _link_name: &OsStr,
        _target: &Path,
        reply: ReplyEntry,
    ) {
        let st = self.state();
        reply.error(st.live().err().unwrap_or(Errno::EPERM));
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        reply_empty(
            self.state()
                .rename(parent.0, name, newparent.0, newname, flags),
            reply,
        );
    }

    fn link(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _newparent: INodeNo,
        _newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let st = self.state();
        reply.error(st.live().err().unwrap_or(Errno::EPERM));
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.state().open(ino.0) {
            Ok(()) => reply.opened(FileHandle(0), FopenFlags::FOPEN_DIRECT_IO),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.state().read(ino.0, offset, size) {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.state().write(ino.0, offset, data, flags.0) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // Closing is not a sync.
        reply_empty(self.state().live(), reply);
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        reply_empty(self.state().release(ino.0), reply);
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply_empty(self.state().fsync(ino.0), reply);
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.state().opendir(ino.0) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let st = self.state();
        if let Err(e) = st.live() {
            return reply.error(e);
        }
        let Some(list) = st.listings.get(&fh.0) else {
            return reply.error(Errno::EBADF);
        };
        let skip = usize::try_from(offset).unwrap_or(usize::MAX);
        for (n, (ino, kind, name)) in list.iter().enumerate().skip(skip) {
            if reply.add(INodeNo(*ino), n as u64 + 1, *kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        let mut st = self.state();
        st.listings.remove(&fh.0);
        reply_empty(st.live(), reply);
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply_empty(self.state().fsyncdir(ino.0), reply);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.state().statfs() {
            Ok(s) => reply.statfs(
                s.f_blocks,
                s.f_bfree,
                s.f_bavail,
                s.f_files,
                s.f_ffree,
                s.f_bsize as u32,
                s.f_namemax as u32,
                s.f_frsize as u32,
            ),
            Err(e) => reply.error(e),
        }
    }

    fn setxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let st = self.state();
        reply.error(st.live().err().unwrap_or(Errno::ENOSYS));
    }

    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: ReplyXattr,
    ) {
        let st = self.state();
        reply.error(st.live().err().unwrap_or(Errno::ENOSYS));
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, _size: u32, reply: ReplyXattr) {
        let st = self.state();
        reply.error(st.live().err().unwrap_or(Errno::ENOSYS));
    }

    fn removexattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        let st = self.state();
        reply.error(st.live().err().unwrap_or(Errno::ENOSYS));
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        // default_permissions: the kernel checks modes; this only says "exists".
        let st = self.state();
        reply_empty(st.live().and_then(|()| st.inode(ino.0).map(|_| ())), reply);
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let owner = (req.uid(), req.gid());
        match self
            .state()
            .create(parent.0, name, mode, umask, flags, owner)
        {
            Ok(a) => reply.created(
                &TTL,
                &a,
                Generation(0),
                FileHandle(0),
                FopenFlags::FOPEN_DIRECT_IO,
            ),
            Err(e) => reply.error(e),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        match self.state().fallocate(ino.0, offset, length, mode) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }
}

/// Blocks SIGINT/SIGTERM/SIGHUP in every thread and handles them on one:
/// the first detaches the mount (the session then ends once nothing uses
/// it), a second exits at once.
fn handle_signals(mountpoint: &Path) -> io::Result<()> {
    let c = CString::new(mountpoint.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: sigset manipulation on a local set; blocking before any thread
    // is spawned so that all threads inherit the mask.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        let r = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        if r != 0 {
            return Err(io::Error::from_raw_os_error(r));
        }
        set
    };
    std::thread::Builder::new()
        .name("powerfs-signals".into())
        .spawn(move || {
            let mut seen = 0;
            loop {
                let mut sig = 0;
                // SAFETY: set is a valid, initialised signal set.
                if unsafe { libc::sigwait(&set, &mut sig) } != 0 {
                    continue;
                }
                seen += 1;
                if seen > 1 {
                    note!("powerfs: signal {sig} again: exiting");
                    std::process::exit(1);
                }
                note!("powerfs: signal {sig}: detaching the mount");
                // SAFETY: c is a valid path.
                if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
                    note!("powerfs: umount: {}", io::Error::last_os_error());
                }
            }
        })?;
    Ok(())
}

fn run(args: Args) -> io::Result<()> {
    let backing = fs::canonicalize(&args.backing_dir)?;
    let root_meta = fs::metadata(&backing)?;
    if !root_meta.is_dir() {
        return Err(io::Error::other(format!(
            "{} is not a directory",
            backing.display()
        )));
    }
    let mountpoint = fs::canonicalize(&args.mountpoint)?;
    let seed = args.seed.unwrap_or_else(|| {
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Rng::new(t ^ u64::from(std::process::id())).next_u64()
    });
    handle_signals(&mountpoint)?;
    let fs = PowerFs {
        state: Mutex::new(State::new(backing.clone(), seed)),
    };
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName("powerfs".into()),
        MountOption::Subtype("powerfs".into()),
        MountOption::DefaultPermissions,
    ];
    config.acl = SessionACL::All;
    let session = Session::new(fs, &mountpoint, &config)?;
    note!(
        "powerfs: mounted {} at {} (seed {seed}); crash: touch {}",
        backing.display(),
        mountpoint.display(),
        mountpoint.join(CRASH_NAME).display()
    );
    session.run()
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run(args) {
        note!("powerfs: {e}");
        std::process::exit(1);
    }
}
