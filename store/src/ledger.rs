//! The task ledger: every task's state in LMDB, written only by the leader.
//!
//! One fixed record per task (its layout: `layout.rs`), keyed by the task id as a big-endian u64 so ids sort in
//! order and loading is a sequence of appends. The command text is not copied into the ledger:
//! the record points into the run's copy of the task file (`cmd_off`, `cmd_len`), which keeps
//! disk per task at the record plus the line itself.
//!
//! LMDB keeps no checksums, so every value the ledger stores (task records, attempts, the
//! failed-task index, meta entries) ends in a CRC-32 of its key and the rest of the value, checked
//! on every read: a flipped bit reads back as damage, never as a plausible task. The key is in the
//! sum so that a record under the wrong key (a flipped key byte) is caught too. Every commit also
//! stores its LMDB transaction id, so that a damaged meta page that revives an older tree shows.

use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::journal::{
    Journal, Log, DB_ATTEMPTS, DB_COMMANDS, DB_FAILED, DB_KEYS, DB_META, DB_NEEDS, DB_RULES, DB_TASKS,
};
use htc_core::after::Needs;
use htc_core::attempts::Rules;
use htc_core::record::{CommandAt, Ended};
use htc_core::shape::TaskShape;
use lmdb::{Cursor, Database, DatabaseFlags, Environment, EnvironmentFlags, RwTransaction, Transaction, WriteFlags};

pub use crate::layout::{encode_record, key, unseal, RECORD_LEN, SCHEMA_VERSION};
use crate::layout::{seal, sum, SUM_LEN};
const ATTEMPT_LEN: usize = 28 + SUM_LEN;
/// The meta key under which each commit stores its LMDB transaction id.
const TXN_KEY: &str = "txn";
/// Virtual size of the map; the file only grows as far as it is used.
const MAP_SIZE: usize = 1 << 40;

#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    // Not a `source`: the message already carries it, and a chain would print it twice.
    #[error("ledger {path}: {error}")]
    Lmdb { path: String, error: lmdb::Error },
    #[error("ledger {path} has schema version {found}, newer than this build's {SCHEMA_VERSION}: a newer release wrote it, and only such a release can open it")]
    Schema { path: String, found: u32 },
    #[error("ledger {path} has schema version {found}, which this build (schema {SCHEMA_VERSION}) cannot migrate")]
    Unmigratable { path: String, found: u32 },
    #[error("ledger record of task {id} is corrupt ({len} bytes)")]
    Corrupt { id: u64, len: usize },
    /// A stored value whose checksum does not match: `what` names it ("task 17", "meta 'total'").
    #[error("ledger {path}: the entry of {what} is damaged (its checksum does not match)")]
    Sum { path: String, what: String },
    #[error("ledger is missing meta key '{0}'")]
    MissingMeta(&'static str),
    /// Reading past a file's end through its memory map would kill the process (SIGBUS).
    #[error("ledger {path} is damaged: {why}; it cannot be read safely")]
    Damaged { path: String, why: String },
    /// The journal on shared storage could not be written.
    #[error("the ledger's journal: {0}")]
    Replica(String),
    /// An error met by a child process that read the ledger (`verify::verify_apart`).
    #[error("{0}")]
    Apart(String),
}

type Result<T> = std::result::Result<T, LedgerError>;

pub use htc_core::task::{Counts, State};

/// Checks an existing ledger file against LMDB's own record of its size: the newer of the two
/// meta pages names the last page in use, and a file shorter than that (truncated by a full disk,
/// a bad copy) would turn reads into SIGBUS. A missing or empty file is a new ledger.
fn check_size(path: &Path) -> std::result::Result<(), String> {
    const MAGIC: u32 = 0xBEEF_C0DE;
    let Ok(f) = std::fs::File::open(path) else { return Ok(()) };
    let len = f.metadata().map_err(|e| e.to_string())?.len();
    if len == 0 {
        return Ok(());
    }
    use std::os::unix::fs::FileExt;
    let u32_at = |off: u64| -> Option<u32> {
        let mut b = [0u8; 4];
        f.read_exact_at(&mut b, off).ok().map(|()| u32::from_le_bytes(b))
    };
    let u64_at = |off: u64| -> Option<u64> {
        let mut b = [0u8; 8];
        f.read_exact_at(&mut b, off).ok().map(|()| u64::from_le_bytes(b))
    };
    // Page header 16 bytes, then the meta: magic, version, address, map size, two DB records
    // (the first's pad holds the page size), the last page number, the transaction id.
    if u32_at(16) != Some(MAGIC) {
        return Err(format!("not an LMDB file ({len} bytes, no LMDB signature)"));
    }
    let page = u32_at(40).filter(|p| p.is_power_of_two() && *p >= 512).ok_or("no page size in its header")? as u64;
    // Both meta pages name the page size; LMDB may go by either.
    if u32_at(page + 40) != Some(page as u32) {
        return Err("its two meta pages disagree on the page size".into());
    }
    let meta = |at: u64| Some((u64_at(at + 144)?, u64_at(at + 136)?)).filter(|_| u32_at(at + 16) == Some(MAGIC));
    let (m0, m1) = (meta(0), meta(page));
    // LMDB writes commit n's meta to page n % 2, so the two hold consecutive commits, each on
    // the page of its parity. Anything else is a damaged meta page that could make LMDB read an
    // older tree as if it were the newest.
    if let (Some((t0, _)), Some((t1, _))) = (m0, m1) {
        let fresh = t0 == 0 && t1 == 0;
        if !fresh && (t0 % 2 != 0 || t1 % 2 != 1 || t0.abs_diff(t1) != 1) {
            return Err(format!("its two meta pages name commits {t0} and {t1}, which cannot both be true"));
        }
    }
    let newest = [m0, m1].into_iter().flatten().max().ok_or("no readable meta page")?;
    let needed = newest.1.saturating_add(1).saturating_mul(page);
    if len < needed {
        return Err(format!("the file is {len} bytes but its pages reach {needed} (truncated)"));
    }
    Ok(())
}

pub use htc_core::record::{Attempt, Change, Outcome, Record};

/// Task `id`'s record from its stored form (`layout`): one of the wrong size, whose checksum
/// does not match, or that holds what no record can, is refused.
pub fn decode_record(id: u64, b: &[u8]) -> Result<Record> {
    crate::layout::decode_record(id, b).ok_or(LedgerError::Corrupt { id, len: b.len() })
}

fn encode_attempt(a: &Attempt, k: &[u8; 9]) -> [u8; ATTEMPT_LEN] {
    let mut b = [0u8; ATTEMPT_LEN];
    b[0] = a.ended.outcome as u8;
    b[1] = a.attempt;
    b[4..8].copy_from_slice(&a.ended.value.to_le_bytes());
    b[8..12].copy_from_slice(&a.agent.to_le_bytes());
    b[12..20].copy_from_slice(&a.ended.start_us.to_le_bytes());
    b[20..28].copy_from_slice(&a.ended.end_us.to_le_bytes());
    let s = sum(k, &b[..28]);
    b[28..].copy_from_slice(&s);
    b
}

/// None when the stored form is damaged.
fn decode_attempt(k: &[u8], b: &[u8]) -> Option<Attempt> {
    (b.len() == ATTEMPT_LEN && unseal(k, b).is_some()).then(|| Attempt {
        attempt: b[1],
        agent: u32::from_le_bytes(b[8..12].try_into().unwrap()),
        ended: Ended {
            outcome: Outcome::from_u8(b[0]),
            value: i32::from_le_bytes(b[4..8].try_into().unwrap()),
            start_us: u64::from_le_bytes(b[12..20].try_into().unwrap()),
            end_us: u64::from_le_bytes(b[20..28].try_into().unwrap()),
        },
    })
}

/// The records of `ids` in id order, with one cursor walk.
fn read_range(l: &Ledger, txn: &impl Transaction, ids: std::ops::Range<u64>) -> Result<Vec<(u64, Record)>> {
    let mut out = Vec::with_capacity(ids.end.saturating_sub(ids.start).min(1 << 16) as usize);
    if ids.is_empty() {
        return Ok(out);
    }
    let mut c = txn.open_ro_cursor(l.tasks).map_err(|e| l.err(e))?;
    for item in c.iter_from(key(ids.start)) {
        let (k, v) = item.map_err(|e| l.err(e))?;
        let id = u64::from_be_bytes(k.try_into().map_err(|_| LedgerError::Corrupt { id: 0, len: k.len() })?);
        if id >= ids.end {
            break;
        }
        out.push((id, l.decode(id, v)?));
    }
    Ok(out)
}

/// The name added task `id` (its record `r`) was given, if any (`add_task`).
fn read_added_name(l: &Ledger, txn: &impl Transaction, id: u64, r: &Record) -> Result<Option<Vec<u8>>> {
    if !r.command().is_added() {
        return Ok(None);
    }
    let whole = read_added_command(l, txn, id)?.unwrap_or_default();
    Ok(whole.get(r.cmd_len() as usize..).filter(|n| !n.is_empty()).map(<[u8]>::to_vec))
}

/// Task `id`'s entry in `db` (a database of schema 4 or later, `None` in an older ledger read
/// as it is), decoded and checked by `decode`; `what` names it in the error of one that is not.
fn read_of_task<T>(
    l: &Ledger,
    txn: &impl Transaction,
    db: Option<Database>,
    id: u64,
    decode: fn(u64, &[u8]) -> Option<T>,
    what: &str,
) -> Result<Option<T>> {
    let Some(db) = db else { return Ok(None) };
    match txn.get(db, &key(id)) {
        Ok(v) => Ok(Some(decode(id, v).ok_or_else(|| l.sum_err(format!("{what} of task {id}")))?)),
        Err(lmdb::Error::NotFound) => Ok(None),
        Err(e) => Err(l.err(e)),
    }
}

/// What task `id` waits for (`after=`, `afterany=`), checked; `None`: nothing.
fn read_needs(l: &Ledger, txn: &impl Transaction, id: u64) -> Result<Option<Needs>> {
    read_of_task(l, txn, l.needs, id, crate::layout::decode_needs, "the needs")
}

/// Task `id`'s rules for its attempts (only a record with `rules` set has them), checked.
fn read_rules(l: &Ledger, txn: &impl Transaction, id: u64) -> Result<Option<Rules>> {
    read_of_task(l, txn, l.rules, id, crate::layout::decode_rules, "the rules")
}

/// Whether any task of the ledger was added with a name (then `read_added_name` is worth it).
fn has_names(l: &Ledger, txn: &impl Transaction) -> Result<bool> {
    match txn.get(l.meta, &"named") {
        Ok(_) => Ok(true),
        Err(lmdb::Error::NotFound) => Ok(false),
        Err(e) => Err(l.err(e)),
    }
}

/// An added task's command from the `commands` database, checked: the command, then its name
/// if it was given one (`add_task`).
fn read_added_command(l: &Ledger, txn: &impl Transaction, id: u64) -> Result<Option<Vec<u8>>> {
    let Some(db) = l.commands else { return Ok(None) };
    match txn.get(db, &key(id)) {
        Ok(v) => Ok(Some(unseal(&key(id), v).ok_or_else(|| l.sum_err(format!("the command of task {id}")))?.to_vec())),
        Err(lmdb::Error::NotFound) => Ok(None),
        Err(e) => Err(l.err(e)),
    }
}

/// Up to `max` tasks' needs from task `start` on, in id order.
fn read_needs_from(l: &Ledger, txn: &impl Transaction, start: u64, max: usize) -> Result<Vec<(u64, Needs)>> {
    let Some(db) = l.needs else { return Ok(Vec::new()) };
    let mut c = txn.open_ro_cursor(db).map_err(|e| l.err(e))?;
    let (mut out, mut last) = (Vec::new(), None);
    for item in c.iter_from(key(start)).take(max) {
        let (k, v) = item.map_err(|e| l.err(e))?;
        let id = walked_id(k, &mut last, &l.path)?;
        out.push((
            id,
            crate::layout::decode_needs(id, v).ok_or_else(|| l.sum_err(format!("what task {id} waits for")))?,
        ));
    }
    Ok(out)
}

/// Tasks per state are stored at every commit so readers need no scan.
fn encode_counts(c: &Counts) -> [u8; 48] {
    let mut b = [0u8; 48];
    for (i, n) in c.0.iter().enumerate() {
        b[i * 8..i * 8 + 8].copy_from_slice(&n.to_le_bytes());
    }
    b
}

/// Six numbers, or five as schema 3 stored them (no task was cancelled then).
pub fn decode_counts(b: &[u8]) -> Option<Counts> {
    matches!(b.len(), 40 | 48).then(|| {
        let mut c = [0u64; 6];
        for (v, n) in c.iter_mut().zip(b.chunks_exact(8)) {
            *v = u64::from_le_bytes(n.try_into().unwrap());
        }
        Counts(c)
    })
}

/// The id of a task key met while walking the tasks in order, checked: a key of the wrong size,
/// or one not above the last, is a damaged tree (a page pointing back would loop for ever).
fn walked_id(k: &[u8], last: &mut Option<u64>, path: &str) -> Result<u64> {
    let damaged = |why: String| LedgerError::Damaged { path: path.to_string(), why };
    let id = u64::from_be_bytes(k.try_into().map_err(|_| damaged(format!("a task key of {} bytes", k.len())))?);
    if let Some(l) = last.filter(|&l| id <= l) {
        return Err(damaged(format!("task keys out of order ({id} after {l})")));
    }
    *last = Some(id);
    Ok(id)
}

fn attempt_key(id: u64, attempt: u8) -> [u8; 9] {
    let mut k = [0u8; 9];
    k[..8].copy_from_slice(&id.to_be_bytes());
    k[8] = attempt;
    k
}

/// The task id of an entry of the failed-task index, its checksum checked.
fn failed_id(l: &Ledger, k: &[u8], v: &[u8]) -> Result<u64> {
    let id = k.try_into().map(u64::from_be_bytes);
    match id {
        Ok(id) if v == sum(k, &[]) => Ok(id),
        _ => Err(l.sum_err(format!("the failed-task index (key {k:02x?})"))),
    }
}

/// The earlier attempts of task `id`, oldest first; a damaged one is an error, not left out.
fn collect_attempts(l: &Ledger, c: &mut lmdb::RoCursor<'_>, id: u64) -> Result<Vec<Attempt>> {
    let mut out = Vec::new();
    let mut last: Option<u8> = None;
    for item in c.iter_from(attempt_key(id, 0)) {
        let (k, v) = item.map_err(|e| l.err(e))?;
        // A damaged tree can lead back to a key already seen: stop rather than loop.
        if k.len() != 9 || k[..8] != key(id) || last.is_some_and(|l| k[8] <= l) {
            break;
        }
        last = Some(k[8]);
        out.push(decode_attempt(k, v).ok_or_else(|| l.sum_err(format!("attempt {} of task {id}", k[8])))?);
    }
    Ok(out)
}

use crate::cursor::TaskCursor;
use lmdb_sys::{
    mdb_cursor_close, mdb_cursor_get, mdb_cursor_open, mdb_env_get_fd, mdb_env_get_path, mdb_env_set_assert,
    mdb_txn_id, MDB_env, MDB_val, MDB_NEXT, MDB_NOTFOUND,
};

/// LMDB checks some of its invariants with assertions that end in abort(); a damaged page trips
/// them. This runs first: the user reads which file is damaged, and htc exits with its error
/// status instead of dumping core.
///
/// # Safety
///
/// Only LMDB calls it (`mdb_env_set_assert`): `env` is the environment whose check failed and
/// `msg` null or a NUL-terminated string, both valid for the call.
unsafe extern "C" fn on_lmdb_assert(env: *mut MDB_env, msg: *const libc::c_char) {
    // One write(2) each, unbuffered: a short write or a closed stderr only loses the message.
    let put = |b: &[u8]| {
        let _ = nix::unistd::write(std::io::stderr(), b);
    };
    let cstr = |p: *const libc::c_char| {
        if p.is_null() {
            &[][..]
        } else {
            // SAFETY: not null, and LMDB's strings (the message, the environment's path) are
            // NUL-terminated and live until the process exits below.
            unsafe { std::ffi::CStr::from_ptr(p) }.to_bytes()
        }
    };
    let mut path: *const libc::c_char = std::ptr::null();
    // SAFETY: env is the environment whose assertion failed; the path stays owned by LMDB.
    unsafe { mdb_env_get_path(env, &mut path) };
    put(b"htc: ledger ");
    put(cstr(path));
    put(b" is damaged: LMDB found a broken page (");
    // "mdb.c:5917: Assertion '…' failed in …()": the source's place means nothing to a user.
    let msg = cstr(msg);
    put(msg.windows(9).position(|w| w == b"Assertion").map_or(msg, |i| &msg[i..]));
    put(b"); it cannot be read safely (htc verify says which tasks it still vouches for)\n");
    // SAFETY: _exit takes no pointers and does not return; it runs no destructors or atexit
    // handlers, as abort() would not: nothing more of the damaged map is read.
    unsafe { libc::_exit(2) };
}

/// LMDB 0.9.24 opens its lock and meta-page files close-on-exec but the data file without
/// (its docs say programs may want that fd), so every process the leader starts — agents, and
/// through them tasks — would hold the ledger open read-write: a task writing to it corrupted
/// the map and made every reader die with SIGBUS. Nothing here execs with it, so mark it.
fn close_on_exec(env: &Environment) -> std::io::Result<()> {
    use nix::fcntl::{fcntl, FcntlArg, FdFlag};
    let mut fd: libc::c_int = -1;
    // SAFETY: env is an open environment; mdb_env_get_fd only stores its data file's fd.
    let rc = unsafe { mdb_env_get_fd(env.env(), &mut fd) };
    if rc != 0 {
        return Err(std::io::Error::from_raw_os_error(rc));
    }
    // SAFETY: fd is the environment's own descriptor (checked above), open while `env` is
    // borrowed, and the borrow ends with this function.
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    let flags = FdFlag::from_bits_retain(fcntl(fd, FcntlArg::F_GETFD)?);
    fcntl(fd, FcntlArg::F_SETFD(flags | FdFlag::FD_CLOEXEC))?;
    Ok(())
}

/// LMDB reports a short write as EIO; on a full disk that is what it is, and the user should
/// read "No space left on device", not suspect their hardware.
fn name_full_disk(path: &Path, e: lmdb::Error) -> lmdb::Error {
    if e != lmdb::Error::Other(libc::EIO) {
        return e;
    }
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    match htc_host::free_bytes(dir) {
        Some(free) if free < htc_host::NEARLY_FULL => lmdb::Error::Other(libc::ENOSPC),
        _ => e,
    }
}

/// Room for LMDB's reader table (64-byte slots after a small header; 256 readers need 16.1 KiB).
const LOCK_FILE_LEN: i64 = 64 << 10;

/// LMDB sizes its lock file with `ftruncate` and writes it through a shared memory map: on a full
/// disk the first write to a page the filesystem cannot back kills the process with SIGBUS. Giving
/// the file real blocks first turns a full disk into ENOSPC here, with the ledger's name on it.
fn reserve_lock_file(path: &Path) -> std::io::Result<()> {
    let mut lock = path.as_os_str().to_owned();
    lock.push("-lock");
    let f =
        match std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).mode(0o600).open(&lock) {
            Ok(f) => f,
            // A reader without write access (a shared run directory) leaves the file to LMDB.
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => return Ok(()),
            Err(e) => return Err(e),
        };
    if f.metadata()?.len() >= LOCK_FILE_LEN as u64 {
        return Ok(());
    }
    Ok(nix::fcntl::posix_fallocate(&f, 0, LOCK_FILE_LEN)?)
}

pub struct Ledger {
    /// Declared before `env`, so it is unregistered before the map goes away.
    _fault: Option<crate::mapfault::Registration>,
    env: Environment,
    path: String,
    tasks: Database,
    meta: Database,
    attempts: Database,
    failed: Database,
    /// What tasks wait for, added tasks' commands, and the keys they were added under; `None`
    /// in a ledger of a schema before them, opened read-only.
    needs: Option<Database>,
    commands: Option<Database>,
    keys: Option<Database>,
    /// Tasks' rules for their attempts; `None` in a ledger before schema 5, opened read-only.
    rules: Option<Database>,
    /// The copy on shared storage (`replica`), when the ledger itself is on a node's local disk.
    journal: Option<std::sync::Mutex<Journal>>,
    /// The layout its records are read with: this build's, or an older one a reader that may
    /// not write (`open` read-only) found.
    schema: u32,
}

impl Ledger {
    /// Creates a new ledger file at `path` (a single file plus its `-lock` file).
    pub fn create(path: &Path) -> Result<Ledger> {
        let l = Self::open_env(path, false)?;
        let mut txn = l.write()?;
        txn.put_meta("schema", &SCHEMA_VERSION.to_le_bytes())?;
        txn.put_counts(&Counts::default())?;
        txn.commit()?;
        Ok(l)
    }

    /// Opens an existing ledger; readers (`htc status`) open it read-only beside a running leader.
    /// A writer migrates a ledger of an older schema first (`upgrade`).
    pub fn open(path: &Path, read_only: bool) -> Result<Ledger> {
        let mut l = Self::open_env(path, read_only)?;
        l.upgrade(!read_only)?;
        let txn = l.read()?;
        txn.check_commit()?;
        // Readers look meta entries up by name: one whose key or size a flip damaged would read
        // as missing, and its default as the truth. The meta is small, so check all of it, and
        // the pages that hold it.
        txn.check_meta()?;
        txn.check_structure(Some(&["meta"]))?;
        drop(txn);
        Ok(l)
    }

    fn open_env(path: &Path, read_only: bool) -> Result<Ledger> {
        let p = path.display().to_string();
        check_size(path).map_err(|why| LedgerError::Damaged { path: p.clone(), why })?;
        let err = |error| LedgerError::Lmdb { path: p.clone(), error: name_full_disk(path, error) };
        reserve_lock_file(path).map_err(|e| err(lmdb::Error::from_err_code(e.raw_os_error().unwrap_or(libc::EIO))))?;
        // NO_SYNC: a commit reaches the page cache, which survives the leader's death (kill -9);
        // the leader calls `sync` on a timer so a machine crash loses at most that window.
        let mut flags = EnvironmentFlags::NO_SUB_DIR | EnvironmentFlags::NO_SYNC | EnvironmentFlags::NO_READAHEAD;
        if read_only {
            flags |= EnvironmentFlags::READ_ONLY;
        }
        let env = Environment::new()
            .set_flags(flags)
            .set_max_dbs(8)
            .set_map_size(MAP_SIZE)
            .set_max_readers(256)
            .open_with_permissions(path, 0o600)
            .map_err(err)?;
        // A damaged page can point a read past the file's end: name the file instead of dying.
        let _fault = crate::mapfault::find_map(path).and_then(|(base, len)| {
            let what = format!(
                "ledger {p} is damaged: a read through its memory map faulted; it cannot be read safely \
                 (htc verify says which tasks it still vouches for)"
            );
            crate::mapfault::register_blaming_nulls(base, len, &what)
        });
        // SAFETY: installing a callback on the environment we just opened.
        unsafe { mdb_env_set_assert(env.env(), Some(on_lmdb_assert)) };
        close_on_exec(&env).map_err(|e| err(lmdb::Error::from_err_code(e.raw_os_error().unwrap_or(libc::EIO))))?;
        let db = |name| {
            if read_only {
                env.open_db(Some(name))
            } else {
                env.create_db(Some(name), DatabaseFlags::empty())
            }
        };
        let (tasks, meta, attempts, failed) = (
            db("tasks").map_err(err)?,
            db("meta").map_err(err)?,
            db("attempts").map_err(err)?,
            db("failed").map_err(err)?,
        );
        let since_4 = |name| match db(name) {
            Ok(d) => Ok(Some(d)),
            Err(lmdb::Error::NotFound) if read_only => Ok(None),
            Err(e) => Err(err(e)),
        };
        let (needs, commands, keys) = (since_4("needs")?, since_4("commands")?, since_4("keys")?);
        let rules = since_4("rules")?;
        let schema = SCHEMA_VERSION;
        Ok(Ledger {
            _fault,
            env,
            path: p,
            tasks,
            meta,
            attempts,
            failed,
            needs,
            commands,
            keys,
            rules,
            journal: None,
            schema,
        })
    }

    /// From now on every commit first writes what it changed to `j` (see `replica`).
    pub fn attach_journal(&mut self, j: Journal) {
        self.journal = Some(std::sync::Mutex::new(j));
    }

    /// The journal, if there is one, locked (poisoned or not, as at every commit).
    fn journal_lock(&self) -> Option<std::sync::MutexGuard<'_, Journal>> {
        self.journal.as_ref().map(|j| j.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Whether the journal has grown enough for a new snapshot (`replica::new_generation`).
    pub fn journal_wants_snapshot(&self) -> bool {
        self.journal_lock().is_some_and(|j| j.wants_snapshot())
    }

    /// The directory of the journal (the replica's), if there is one.
    pub fn journal_dir(&self) -> Option<PathBuf> {
        Some(self.journal_lock()?.path().parent().map(Path::to_path_buf).unwrap_or_default())
    }

    /// Goes on with `next`, the journal of the replica's next generation.
    pub fn replace_journal(&self, next: Journal) {
        if let Some(mut j) = self.journal_lock() {
            *j = next;
        }
    }

    /// The next generation's snapshot could not be written: go on with this journal.
    pub fn defer_snapshot(&self) {
        if let Some(mut j) = self.journal_lock() {
            j.defer_snapshot();
        }
    }

    fn db(&self, id: u8) -> Database {
        match id {
            DB_TASKS => self.tasks,
            DB_META => self.meta,
            DB_ATTEMPTS => self.attempts,
            DB_NEEDS => self.needs.expect("a writer's ledger has every database"),
            DB_COMMANDS => self.commands.expect("a writer's ledger has every database"),
            DB_KEYS => self.keys.expect("a writer's ledger has every database"),
            DB_RULES => self.rules.expect("a writer's ledger has every database"),
            _ => self.failed,
        }
    }

    /// Hands every entry of every database to `f`, in key order, from one read transaction.
    pub fn dump(&self, mut f: impl FnMut(u8, &[u8], &[u8])) -> Result<()> {
        let txn = self.env.begin_ro_txn().map_err(|e| self.err(e))?;
        for id in [DB_META, DB_TASKS, DB_ATTEMPTS, DB_FAILED, DB_NEEDS, DB_COMMANDS, DB_KEYS, DB_RULES] {
            if (id >= DB_NEEDS && self.needs.is_none()) || (id == DB_RULES && self.rules.is_none()) {
                continue;
            }
            let mut c = txn.open_ro_cursor(self.db(id)).map_err(|e| self.err(e))?;
            for item in c.iter_start() {
                let (k, v) = item.map_err(|e| self.err(e))?;
                f(id, k, v);
            }
        }
        Ok(())
    }

    pub fn path(&self) -> &Path {
        Path::new(&self.path)
    }

    fn err(&self, source: lmdb::Error) -> LedgerError {
        LedgerError::Lmdb { path: self.path.clone(), error: name_full_disk(Path::new(&self.path), source) }
    }

    /// Takes the ledger to this build's schema: a ledger of an older one has its records
    /// rewritten in one transaction when `write` (a reader reads them through the older layout
    /// instead); one of a newer schema, or of one too old to migrate, is refused. A replicated
    /// run's next generation (`replica::Replica::begin`, where its leader starts) then holds
    /// the new layout, and a restore from an older replica comes through here too.
    pub fn upgrade(&mut self, write: bool) -> Result<()> {
        let found = self.read()?.schema()?;
        let path = self.path.clone();
        if found > SCHEMA_VERSION {
            return Err(LedgerError::Schema { path, found });
        }
        if !crate::layout::readable(found) {
            return Err(LedgerError::Unmigratable { path, found });
        }
        self.schema = found;
        if found != SCHEMA_VERSION && write {
            let n = self.migrate(found)?;
            tracing::info!(path = %self.path, from = found, to = SCHEMA_VERSION, tasks = n, "ledger migrated");
        }
        Ok(())
    }

    /// Rewrites every task record of schema `from` in this build's layout, and the schema with
    /// them, in one transaction: a migration cut short leaves the old ledger whole. Only the
    /// records differ between the layouts so far; a change of the other entries adds its step.
    fn migrate(&mut self, from: u32) -> Result<u64> {
        let mut t = self.write()?;
        let (mut next, mut n) = (Some(0u64), 0u64);
        while let Some(start) = next {
            let chunk = t.raw_tasks(start, 1 << 16)?;
            next = chunk.last().and_then(|(id, _)| id.checked_add(1)).filter(|_| chunk.len() == 1 << 16);
            for (id, v) in chunk {
                let r = crate::layout::decode_as(from, id, &v).ok_or(LedgerError::Corrupt { id, len: v.len() })?;
                t.apply_entry(true, DB_TASKS, &key(id), &encode_record(&r, id))?;
                n += 1;
            }
        }
        t.put_meta("schema", &SCHEMA_VERSION.to_le_bytes())?;
        t.commit()?;
        self.schema = SCHEMA_VERSION;
        Ok(n)
    }

    /// Task `id`'s record from its stored form in this ledger's layout.
    fn decode(&self, id: u64, b: &[u8]) -> Result<Record> {
        crate::layout::decode_as(self.schema, id, b).ok_or(LedgerError::Corrupt { id, len: b.len() })
    }

    fn sum_err(&self, what: String) -> LedgerError {
        LedgerError::Sum { path: self.path.clone(), what }
    }

    /// A stored meta value, its checksum checked and taken off.
    fn meta_value<'a>(&self, k: &str, stored: &'a [u8]) -> Result<&'a [u8]> {
        unseal(k.as_bytes(), stored).ok_or_else(|| self.sum_err(format!("meta '{k}'")))
    }

    pub fn write(&self) -> Result<WriteTxn<'_>> {
        let txn = self.env.begin_rw_txn().map_err(|e| self.err(e))?;
        Ok(WriteTxn {
            l: self,
            tasks: TaskCursor::new(),
            txn,
            log: self.journal.as_ref().map(|_| Default::default()),
            added_total: None,
            named: false,
        })
    }

    pub fn read(&self) -> Result<ReadTxn<'_>> {
        let txn = self.env.begin_ro_txn().map_err(|e| self.err(e))?;
        Ok(ReadTxn { l: self, txn })
    }

    /// Flushes committed pages to disk.
    pub fn sync(&self) -> Result<()> {
        self.env.sync(true).map_err(|e| self.err(e))
    }
}

pub struct WriteTxn<'l> {
    l: &'l Ledger,
    /// Before `txn`: dropped (closed) before an abandoned transaction is aborted.
    tasks: TaskCursor,
    txn: RwTransaction<'l>,
    /// What this transaction changed, for the journal; `None` when there is none.
    log: Option<Log>,
    /// The highest task id once this transaction added tasks: kept here and written to the
    /// meta `total` once, at the commit, not once per task added.
    added_total: Option<u64>,
    /// This transaction marked the ledger as holding tasks with names (meta `named`).
    named: bool,
}

impl<'l> WriteTxn<'l> {
    pub fn get(&self, id: u64) -> Result<Option<Record>> {
        // SAFETY: this live transaction and its task database.
        let got = unsafe { self.tasks.get(self.txn.txn(), self.l.tasks.dbi(), id, &key(id), |b| self.l.decode(id, b)) };
        match got {
            Ok(found) => found.transpose(),
            Err(rc) => Err(self.l.err(lmdb::Error::from_err_code(rc))),
        }
    }

    /// Writes a task's record through the transaction's cursor (`cursor`).
    fn put_task(&mut self, id: u64, k: &[u8; 8], v: &[u8]) -> Result<()> {
        // SAFETY: this live transaction and its task database.
        let put = unsafe { self.tasks.put(self.txn.txn(), self.l.tasks.dbi(), id, k, v) };
        put.map_err(|rc| self.l.err(lmdb::Error::from_err_code(rc)))
    }

    /// The records of `ids` in id order, read with one cursor walk instead of a lookup each.
    pub fn range(&self, ids: std::ops::Range<u64>) -> Result<Vec<(u64, Record)>> {
        read_range(self.l, &self.txn, ids)
    }

    /// Applies one change, to the ledger and, with a journal, to what this transaction
    /// journals: both from the same entry.
    pub fn apply(&mut self, c: &Change) -> Result<()> {
        let (db, k, v): (u8, Vec<u8>, Option<Vec<u8>>) = match *c {
            Change::Record(id, ref r) => {
                // The most frequent change by far: no allocation, and in place where it was read.
                let (k, v) = (key(id), encode_record(r, id));
                self.journal(c, DB_TASKS, &k, Some(&v));
                return self.put_task(id, &k, &v);
            }
            Change::Attempt(id, ref a) => {
                let k = attempt_key(id, self.attempts_of(id)?.len().min(255) as u8);
                (DB_ATTEMPTS, k.to_vec(), Some(encode_attempt(a, &k).to_vec()))
            }
            Change::Failed(id, true) => (DB_FAILED, key(id).to_vec(), Some(sum(&key(id), &[]).to_vec())),
            Change::Failed(id, false) => (DB_FAILED, key(id).to_vec(), None),
        };
        self.journal(c, db, &k, v.as_deref());
        self.apply_entry(v.is_some(), db, &k, v.as_deref().unwrap_or_default())
    }

    /// Puts a change's entry in this transaction's journal. Of the task records only those a
    /// restore needs: tasks that ended (and ones that stopped being failed). Dispatched and
    /// running states are not kept: a resume runs those tasks again.
    fn journal(&mut self, c: &Change, db: u8, k: &[u8], v: Option<&[u8]>) {
        let Some(log) = self.log.as_mut() else { return };
        match (c, v) {
            (Change::Record(id, r), Some(v)) => {
                if r.state().is_final() || log.reopened.contains(id) {
                    log.put(db, k, v);
                }
            }
            (Change::Failed(id, false), _) => {
                log.del(db, k);
                log.reopened.push(*id);
            }
            (_, Some(v)) => log.put(db, k, v),
            (_, None) => log.del(db, k),
        }
    }

    /// Adds a task with an id larger than every id so far (the loader's fast path). A new
    /// task's record is journaled whatever its state: a restore must know every task there is,
    /// and one added to an open run after the snapshot is nowhere else.
    pub fn append(&mut self, id: u64, r: &Record) -> Result<()> {
        let b = encode_record(r, id);
        if let Some(log) = self.log.as_mut() {
            log.put(DB_TASKS, &key(id), &b);
        }
        self.txn.put(self.l.tasks, &key(id), &b, WriteFlags::APPEND).map_err(|e| self.l.err(e))
    }

    /// Writes an entry as it is, unjournaled: a change's (`apply` journals it), or a replica's
    /// (`replica::Replica::restore`).
    pub fn apply_entry(&mut self, put: bool, db: u8, k: &[u8], v: &[u8]) -> Result<()> {
        let db = self.l.db(db);
        let r = if put { self.txn.put(db, &k, &v, WriteFlags::empty()) } else { self.txn.del(db, &k, None) };
        match r {
            Ok(()) | Err(lmdb::Error::NotFound) => Ok(()),
            Err(e) => Err(self.l.err(e)),
        }
    }

    /// Up to `max` stored task entries from id `from` on, as they are (`Ledger::migrate`).
    fn raw_tasks(&self, from: u64, max: usize) -> Result<Vec<(u64, Vec<u8>)>> {
        let mut c = self.txn.open_ro_cursor(self.l.tasks).map_err(|e| self.l.err(e))?;
        let (mut out, mut last) = (Vec::new(), None);
        for item in c.iter_from(key(from)).take(max) {
            let (k, v) = item.map_err(|e| self.l.err(e))?;
            out.push((walked_id(k, &mut last, &self.l.path)?, v.to_vec()));
        }
        Ok(out)
    }

    pub fn attempts_of(&self, id: u64) -> Result<Vec<Attempt>> {
        let mut c = self.txn.open_ro_cursor(self.l.attempts).map_err(|e| self.l.err(e))?;
        collect_attempts(self.l, &mut c, id)
    }

    pub fn put_meta(&mut self, k: &str, v: &[u8]) -> Result<()> {
        let stored = seal(k.as_bytes(), v);
        if let Some(log) = self.log.as_mut() {
            log.meta(k, &stored);
        }
        self.txn.put(self.l.meta, &k, &stored, WriteFlags::empty()).map_err(|e| self.l.err(e))
    }

    pub fn put_counts(&mut self, c: &Counts) -> Result<()> {
        self.put_meta("counts", &encode_counts(c))
    }

    /// The id the next task gets: one past the highest.
    pub fn next_id(&self) -> Result<u64> {
        if let Some(total) = self.added_total {
            return Ok(total + 1);
        }
        let total = self.meta("total")?.and_then(|b| b.try_into().ok()).map_or(0, u64::from_le_bytes);
        Ok(total + 1)
    }

    /// Adds a task made while the run runs, under the next id: its record (whose command is
    /// `CommandAt::added`), its command, what it waits for and the key it was added under, in
    /// this transaction, so that all of it is there or none.
    pub fn add_task(&mut self, t: Adding<'_>, added_as: Option<&[u8]>, name: Option<&[u8]>) -> Result<(u64, Record)> {
        let Adding { shape, shell, command, needs, rules } = t;
        let id = self.next_id()?;
        let shape = TaskShape { rules: !rules.is_empty(), ..shape };
        let r = Record::new(CommandAt::added(id, command.len() as u32, shell), shape);
        self.append(id, &r)?;
        // A name follows the command in one entry: the record's length says where it starts,
        // and a task without one (every task of a ledger before names) costs nothing more.
        match name {
            Some(n) => {
                self.put_raw(DB_COMMANDS, &key(id), &seal(&key(id), &[command, n].concat()))?;
                if !self.named {
                    self.put_meta("named", &[1])?;
                    self.named = true;
                }
            }
            None => self.put_raw(DB_COMMANDS, &key(id), &seal(&key(id), command))?,
        }
        if !needs.is_empty() {
            self.put_needs(id, needs)?;
        }
        if !rules.is_empty() {
            self.put_rules(id, rules)?;
        }
        if let Some(k) = added_as {
            self.put_raw(DB_KEYS, k, &seal(k, &id.to_le_bytes()))?;
        }
        self.added_total = Some(id);
        Ok((id, r))
    }

    /// The task added under `key`, if one was.
    pub fn keyed(&self, k: &[u8]) -> Result<Option<u64>> {
        match self.txn.get(self.l.db(DB_KEYS), &k) {
            Ok(v) => {
                let v = unseal(k, v).ok_or_else(|| self.l.sum_err("a task's key".into()))?;
                Ok(Some(u64::from_le_bytes(v.try_into().map_err(|_| self.l.sum_err("a task's key".into()))?)))
            }
            Err(lmdb::Error::NotFound) => Ok(None),
            Err(e) => Err(self.l.err(e)),
        }
    }

    /// The command of added task `id`, then its name if it was given one.
    pub fn added_command(&self, id: u64) -> Result<Option<Vec<u8>>> {
        read_added_command(self.l, &self.txn, id)
    }

    /// Up to `max` tasks' needs from task `start` on, in id order, as this transaction sees
    /// them: a slice at a time, so that a million waiting tasks are never all in memory.
    pub fn needs_from(&self, start: u64, max: usize) -> Result<Vec<(u64, Needs)>> {
        read_needs_from(self.l, &self.txn, start, max)
    }

    /// An entry written as it is, and journaled as it is.
    fn put_raw(&mut self, db: u8, k: &[u8], v: &[u8]) -> Result<()> {
        if let Some(log) = self.log.as_mut() {
            log.put(db, k, v);
        }
        self.apply_entry(true, db, k, v)
    }

    /// What task `id` waits for (`after=`, `afterany=`): written once, as the task is made.
    pub fn put_needs(&mut self, id: u64, n: &Needs) -> Result<()> {
        self.put_raw(DB_NEEDS, &key(id), &crate::layout::encode_needs(id, n))
    }

    /// Task `id`'s rules for its attempts; its record says it has some (`TaskShape::rules`).
    pub fn put_rules(&mut self, id: u64, r: &Rules) -> Result<()> {
        self.put_raw(DB_RULES, &key(id), &crate::layout::encode_rules(id, r))
    }

    pub fn meta(&self, k: &str) -> Result<Option<Vec<u8>>> {
        if let (Some(total), "total") = (self.added_total, k) {
            return Ok(Some(total.to_le_bytes().to_vec()));
        }
        match self.txn.get(self.l.meta, &k) {
            Ok(b) => Ok(Some(self.l.meta_value(k, b)?.to_vec())),
            Err(lmdb::Error::NotFound) => Ok(None),
            Err(e) => Err(self.l.err(e)),
        }
    }

    /// Calls `f` for every task from `from` on, in id order, letting it rewrite the record.
    /// Used once per resume to send interrupted tasks back to pending.
    pub fn update_all(&mut self, mut f: impl FnMut(u64, &mut Record) -> bool) -> Result<()> {
        let mut changed = Vec::new();
        {
            let mut c = self.txn.open_ro_cursor(self.l.tasks).map_err(|e| self.l.err(e))?;
            let mut last = None;
            for item in c.iter_start() {
                let (k, v) = item.map_err(|e| self.l.err(e))?;
                let id = walked_id(k, &mut last, &self.l.path)?;
                let mut r = self.l.decode(id, v)?;
                if f(id, &mut r) {
                    changed.push((id, r));
                }
            }
        }
        for (id, r) in changed {
            self.apply(&Change::Record(id, r))?;
        }
        Ok(())
    }

    /// Commits; with a journal, what changed is written to it first, so that nothing is
    /// acknowledged that only this node's disk holds.
    pub fn commit(mut self) -> Result<()> {
        if let Some(total) = self.added_total.take() {
            self.put_meta("total", &total.to_le_bytes())?;
        }
        // Not journaled: a restored ledger has transaction ids of its own.
        // SAFETY: the id of this live transaction.
        let id = unsafe { mdb_txn_id(self.txn.txn()) } as u64;
        let stored = seal(TXN_KEY.as_bytes(), &id.to_le_bytes());
        self.txn.put(self.l.meta, &TXN_KEY, &stored, WriteFlags::empty()).map_err(|e| self.l.err(e))?;
        self.tasks.close();
        let l = self.l;
        if let (Some(j), Some(log)) = (&l.journal, self.log) {
            let mut j = j.lock().unwrap_or_else(|e| e.into_inner());
            j.append(log).map_err(|e| LedgerError::Replica(e.to_string()))?;
        }
        self.txn.commit().map_err(|e| l.err(e))
    }
}

/// What a reader of tasks needs, from a write transaction's view (what it wrote, committed or
/// not) or a read transaction's (the last commit).
pub trait Reads {
    fn get(&self, id: u64) -> Result<Option<Record>>;
    /// The records of `ids` in id order, read with one cursor walk.
    fn range(&self, ids: std::ops::Range<u64>) -> Result<Vec<(u64, Record)>>;
    /// Whether any task was added with a name.
    fn has_names(&self) -> Result<bool>;
    /// The name task `id` (of record `r`) was added with, if any.
    fn added_name(&self, id: u64, r: &Record) -> Result<Option<Vec<u8>>>;
    /// Task `id`'s rules for its attempts, if it has any.
    fn rules(&self, id: u64) -> Result<Option<Rules>>;
    /// What task `id` waits for, if anything.
    fn needs(&self, id: u64) -> Result<Option<Needs>>;
}

impl Reads for WriteTxn<'_> {
    fn get(&self, id: u64) -> Result<Option<Record>> {
        WriteTxn::get(self, id)
    }
    fn range(&self, ids: std::ops::Range<u64>) -> Result<Vec<(u64, Record)>> {
        WriteTxn::range(self, ids)
    }
    fn has_names(&self) -> Result<bool> {
        Ok(self.named || has_names(self.l, &self.txn)?)
    }
    fn added_name(&self, id: u64, r: &Record) -> Result<Option<Vec<u8>>> {
        read_added_name(self.l, &self.txn, id, r)
    }
    fn rules(&self, id: u64) -> Result<Option<Rules>> {
        read_rules(self.l, &self.txn, id)
    }
    fn needs(&self, id: u64) -> Result<Option<Needs>> {
        read_needs(self.l, &self.txn, id)
    }
}

impl Reads for ReadTxn<'_> {
    fn get(&self, id: u64) -> Result<Option<Record>> {
        ReadTxn::get(self, id)
    }
    fn range(&self, ids: std::ops::Range<u64>) -> Result<Vec<(u64, Record)>> {
        ReadTxn::range(self, ids)
    }
    fn has_names(&self) -> Result<bool> {
        has_names(self.l, &self.txn)
    }
    fn added_name(&self, id: u64, r: &Record) -> Result<Option<Vec<u8>>> {
        read_added_name(self.l, &self.txn, id, r)
    }
    fn rules(&self, id: u64) -> Result<Option<Rules>> {
        read_rules(self.l, &self.txn, id)
    }
    fn needs(&self, id: u64) -> Result<Option<Needs>> {
        read_needs(self.l, &self.txn, id)
    }
}

/// A task being added (`WriteTxn::add_task`): what it asks, its command, what it waits for and
/// its rules for its attempts.
#[derive(Clone, Copy)]
pub struct Adding<'a> {
    pub shape: TaskShape,
    pub shell: bool,
    pub command: &'a [u8],
    pub needs: &'a Needs,
    pub rules: &'a Rules,
}

impl<'a> Adding<'a> {
    /// A task of no needs and no rules.
    pub fn plain(shape: TaskShape, shell: bool, command: &'a [u8]) -> Adding<'a> {
        static NONE: (Needs, Rules) = (Needs::EMPTY, Rules::NONE);
        Adding { shape, shell, command, needs: &NONE.0, rules: &NONE.1 }
    }
}

pub struct ReadTxn<'l> {
    l: &'l Ledger,
    txn: lmdb::RoTransaction<'l>,
}

impl ReadTxn<'_> {
    /// The ledger's file, as errors name it.
    pub fn path(&self) -> &str {
        &self.l.path
    }

    /// The records of `ids` in id order, read with one cursor walk instead of a lookup each.
    pub fn range(&self, ids: std::ops::Range<u64>) -> Result<Vec<(u64, Record)>> {
        read_range(self.l, &self.txn, ids)
    }

    /// The schema version the ledger's meta names.
    pub fn schema(&self) -> Result<u32> {
        let v = self.meta("schema")?.ok_or(LedgerError::MissingMeta("schema"))?;
        Ok(v.try_into().map(u32::from_le_bytes).unwrap_or(0))
    }

    pub fn get(&self, id: u64) -> Result<Option<Record>> {
        match self.txn.get(self.l.tasks, &key(id)) {
            Ok(b) => self.l.decode(id, b).map(Some),
            Err(lmdb::Error::NotFound) => Ok(None),
            Err(e) => Err(self.l.err(e)),
        }
    }

    pub fn meta(&self, k: &str) -> Result<Option<&[u8]>> {
        match self.txn.get(self.l.meta, &k) {
            Ok(b) => Ok(Some(self.l.meta_value(k, b)?)),
            Err(lmdb::Error::NotFound) => Ok(None),
            Err(e) => Err(self.l.err(e)),
        }
    }

    /// The LMDB transaction id of the commit this transaction reads.
    pub fn txn_id(&self) -> u64 {
        use lmdb::Transaction;
        // SAFETY: the id of this live transaction.
        unsafe { mdb_txn_id(self.txn.txn()) as u64 }
    }

    /// Checks that the tree read is the one the newest commit wrote: each commit stores its
    /// transaction id, so a damaged meta page that names an older tree (whose pages may since
    /// have been reused) or another id is caught.
    pub fn check_commit(&self) -> Result<()> {
        let id = self.txn_id();
        let stored = self.meta_u64(TXN_KEY)?;
        if stored != Some(id) {
            let why = match stored {
                Some(s) => format!(
                    "its newest meta page names commit {id}, but the tree it points to was written by commit {s}"
                ),
                None => format!("its newest meta page names commit {id}, but the tree it points to records no commit"),
            };
            return Err(LedgerError::Damaged { path: self.l.path.clone(), why });
        }
        Ok(())
    }

    pub fn meta_u64(&self, k: &str) -> Result<Option<u64>> {
        Ok(self.meta(k)?.and_then(|b| b.try_into().ok()).map(u64::from_le_bytes))
    }

    pub fn counts(&self) -> Result<Counts> {
        Ok(self.meta("counts")?.and_then(decode_counts).unwrap_or_default())
    }

    /// Ids of tasks that failed for good, at most `limit`.
    pub fn failed_ids(&self, limit: usize) -> Result<Vec<u64>> {
        let mut c = self.txn.open_ro_cursor(self.l.failed).map_err(|e| self.l.err(e))?;
        let mut out = Vec::new();
        for item in c.iter_start().take(limit) {
            let (k, v) = item.map_err(|e| self.l.err(e))?;
            out.push(failed_id(self.l, k, v)?);
        }
        // The index, the counts and the records are written in one transaction: if they
        // disagree, a damaged page hides failed tasks or invents some.
        let damaged = |why: String| LedgerError::Damaged { path: self.l.path.clone(), why };
        let failed = self.counts()?.get(State::Failed);
        if (out.len() as u64) < failed.min(limit as u64) {
            return Err(damaged(format!("its failed-task index holds {} of {failed} failed tasks", out.len())));
        }
        for &id in &out {
            if self.get(id)?.is_none_or(|r| r.state() != State::Failed) {
                return Err(damaged(format!("its failed-task index names task {id}, which has not failed")));
            }
        }
        Ok(out)
    }

    /// Earlier attempts of a task, oldest first.
    pub fn attempts(&self, id: u64) -> Result<Vec<Attempt>> {
        let mut c = self.txn.open_ro_cursor(self.l.attempts).map_err(|e| self.l.err(e))?;
        collect_attempts(self.l, &mut c, id)
    }

    /// The command of added task `id`, then its name if it was given one.
    pub fn added_command(&self, id: u64) -> Result<Option<Vec<u8>>> {
        read_added_command(self.l, &self.txn, id)
    }

    /// Every task that waits for others, with what it waits for, in id order.
    pub fn for_each_needs(&self, mut f: impl FnMut(u64, Needs)) -> Result<()> {
        let Some(db) = self.l.needs else { return Ok(()) };
        let mut c = self.txn.open_ro_cursor(db).map_err(|e| self.l.err(e))?;
        let mut last = None;
        for item in c.iter_start() {
            let (k, v) = item.map_err(|e| self.l.err(e))?;
            let id = walked_id(k, &mut last, &self.l.path)?;
            let n = crate::layout::decode_needs(id, v)
                .ok_or_else(|| self.l.sum_err(format!("what task {id} waits for")))?;
            f(id, n);
        }
        Ok(())
    }

    /// Visits every earlier attempt of every task, by task id then attempt.
    pub fn for_each_attempt(&self, mut f: impl FnMut(u64, Attempt)) -> Result<()> {
        let mut c = self.txn.open_ro_cursor(self.l.attempts).map_err(|e| self.l.err(e))?;
        let mut last: Option<[u8; 9]> = None;
        for item in c.iter_start() {
            let (k, v) = item.map_err(|e| self.l.err(e))?;
            let k: [u8; 9] = k.try_into().map_err(|_| LedgerError::Damaged {
                path: self.l.path.clone(),
                why: format!("an attempt key of {} bytes", k.len()),
            })?;
            if last.is_some_and(|l| k <= l) {
                let why = "attempt keys out of order".to_string();
                return Err(LedgerError::Damaged { path: self.l.path.clone(), why });
            }
            last = Some(k);
            let id = u64::from_be_bytes(k[..8].try_into().unwrap());
            let a = decode_attempt(&k, v).ok_or_else(|| self.l.sum_err(format!("attempt {} of task {id}", k[8])))?;
            f(id, a);
        }
        Ok(())
    }

    /// Visits the tasks from id `from` on, in id order, each with its record or why it cannot be
    /// decoded; stops at the first error of the tree itself (a damaged page), which it returns.
    /// Keys that do not grow mean a damaged tree (a page pointing back, which would loop).
    pub fn walk_tasks(&self, from: u64, mut f: impl FnMut(u64, Result<Record>)) -> Result<()> {
        let mut c = self.txn.open_ro_cursor(self.l.tasks).map_err(|e| self.l.err(e))?;
        let mut last = from.checked_sub(1);
        for item in c.iter_from(key(from)) {
            let (k, v) = item.map_err(|e| self.l.err(e))?;
            let id = walked_id(k, &mut last, &self.l.path)?;
            f(id, self.l.decode(id, v));
        }
        Ok(())
    }

    /// Reads every entry of the attempt history and of the failed-task index; the first error.
    pub fn check_history(&self) -> Result<()> {
        self.for_each_attempt(|_, _| {})?;
        self.for_each_needs(|_, _| {})?;
        for (db, what) in [(self.l.commands, "an added task's command"), (self.l.keys, "an added task's key")] {
            if let Some(db) = db {
                self.walk_sorted(db, |k, v| unseal(k, v).map(drop).ok_or_else(|| self.l.sum_err(what.into())))?;
            }
        }
        self.walk_sorted(self.l.failed, |k, v| failed_id(self.l, k, v).map(drop))?;
        self.check_meta()?;
        self.check_commit()
    }

    /// Walks the pages of the named databases (all: None) from the file itself (`pagecheck`):
    /// a damaged page pointer or node offset that leads to an intact value elsewhere in the file
    /// reads back whole through LMDB, and only this sees it. Costs a read of the pages walked.
    pub fn check_structure(&self, only: Option<&[&str]>) -> Result<()> {
        let id = self.txn_id();
        crate::pagecheck::check_file(self.l.path(), only, Some(id)).map(drop).map_err(|why| LedgerError::Damaged {
            path: self.l.path.clone(),
            why: format!("its page structure: {why}"),
        })
    }

    /// Reads every meta entry, checking its checksum.
    pub fn check_meta(&self) -> Result<()> {
        self.walk_sorted(self.l.meta, |k, v| {
            let name = String::from_utf8_lossy(k);
            self.l.meta_value(&name, v).map(drop)
        })
    }

    /// Hands every entry of `db` to `f`, checking that keys grow (a damaged page pointing back
    /// would loop); the first error.
    fn walk_sorted(&self, db: Database, mut f: impl FnMut(&[u8], &[u8]) -> Result<()>) -> Result<()> {
        let mut last: Vec<u8> = Vec::new();
        let mut c = self.txn.open_ro_cursor(db).map_err(|e| self.l.err(e))?;
        for item in c.iter_start() {
            let (k, v) = item.map_err(|e| self.l.err(e))?;
            if !last.is_empty() && k <= &last[..] {
                let why = "keys out of order".to_string();
                return Err(LedgerError::Damaged { path: self.l.path.clone(), why });
            }
            f(k, v)?;
            last.clear();
            last.extend_from_slice(k);
        }
        Ok(())
    }

    /// Reads LMDB's list of free pages (its database 0, which the crate does not open): a write
    /// reuses those pages, so a damaged list would have a resume write over pages in use. Each
    /// entry is a count and that many page numbers, in descending order, past the two meta
    /// pages and not past the last page in use.
    pub fn check_freelist(&self) -> Result<()> {
        use lmdb::Transaction;
        let last = self.l.env.info().map_err(|e| self.l.err(e))?.last_pgno() as u64;
        let damaged =
            |why: &str| LedgerError::Damaged { path: self.l.path.clone(), why: format!("its free-page list {why}") };
        let mut c = std::ptr::null_mut();
        // SAFETY: a cursor on database 0 of this live read transaction, closed below.
        let rc = unsafe { mdb_cursor_open(self.txn.txn(), 0, &mut c) };
        if rc != 0 {
            return Err(self.l.err(lmdb::Error::from_err_code(rc)));
        }
        let walk = || -> Result<()> {
            loop {
                let mut k = MDB_val { mv_size: 0, mv_data: std::ptr::null_mut() };
                let mut v = MDB_val { mv_size: 0, mv_data: std::ptr::null_mut() };
                // SAFETY: an open cursor and two out-parameters.
                match unsafe { mdb_cursor_get(c, &mut k, &mut v, MDB_NEXT) } {
                    0 => {}
                    MDB_NOTFOUND => return Ok(()),
                    rc => return Err(self.l.err(lmdb::Error::from_err_code(rc))),
                }
                if v.mv_data.is_null() || !v.mv_size.is_multiple_of(8) || v.mv_size == 0 {
                    return Err(damaged("has an entry of the wrong size"));
                }
                // SAFETY: LMDB returned a value of this size inside the map, alive until the
                // transaction ends.
                let bytes = unsafe { std::slice::from_raw_parts(v.mv_data as *const u8, v.mv_size) };
                let words: Vec<u64> =
                    bytes.chunks_exact(8).map(|w| u64::from_ne_bytes(w.try_into().unwrap())).collect();
                let pages = &words[1..];
                if words[0] != pages.len() as u64 {
                    return Err(damaged("has an entry whose count is wrong"));
                }
                if pages.iter().any(|&p| p < 2 || p > last) {
                    return Err(damaged("names a page outside the file"));
                }
                if pages.windows(2).any(|w| w[0] <= w[1]) {
                    return Err(damaged("is out of order"));
                }
            }
        };
        let r = walk();
        // SAFETY: the cursor opened above, not used after.
        unsafe { mdb_cursor_close(c) };
        r
    }

    /// Visits every task in id order.
    pub fn for_each(&self, mut f: impl FnMut(u64, &Record)) -> Result<()> {
        let mut c = self.txn.open_ro_cursor(self.l.tasks).map_err(|e| self.l.err(e))?;
        let mut last = None;
        for item in c.iter_start() {
            let (k, v) = item.map_err(|e| self.l.err(e))?;
            let id = walked_id(k, &mut last, &self.l.path)?;
            f(id, &self.l.decode(id, v)?);
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use htc_core::record::CommandAt;
    use htc_core::task::{End, Step};

    /// A new task's record that names line `line`.
    pub(crate) fn at_line(line: u32) -> Record {
        Record::new(CommandAt { line, ..Default::default() }, Default::default())
    }

    fn tmp(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("htc-ledger-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d.join("ledger.mdb")
    }

    #[test]
    fn a_task_added_while_the_run_runs_is_whole_in_one_transaction_and_found_by_its_key() {
        let p = tmp("added");
        let l = Ledger::create(&p).unwrap();
        let mut t = l.write().unwrap();
        t.append(1, &Record::default()).unwrap();
        t.put_meta("total", &1u64.to_le_bytes()).unwrap();
        let mut needs = Needs::default();
        needs.push(1..=1, htc_core::after::Kind::After);
        let shape = TaskShape { cores: 2, ..Default::default() };
        let (id, r) = t
            .add_task(
                Adding { needs: &needs, ..Adding::plain(shape, true, b"echo hi | wc") },
                Some(b"k-1"),
                Some(b"count"),
            )
            .unwrap();
        assert_eq!((id, r.line(), r.cmd_off(), r.shell(), r.shape().cores), (2, 0, 2, true, 2));
        assert!(r.command().is_added());
        let (id3, _) = t.add_task(Adding::plain(TaskShape::default(), false, b"true"), None, None).unwrap();
        assert_eq!((id3, t.next_id().unwrap()), (3, 4));
        assert_eq!((t.keyed(b"k-1").unwrap(), t.keyed(b"k-2").unwrap()), (Some(2), None));
        t.commit().unwrap();
        let l = Ledger::open(&p, true).unwrap();
        let r = l.read().unwrap();
        // The count of tasks is written once, at the commit.
        assert_eq!(r.meta_u64("total").unwrap(), Some(3));
        assert_eq!(r.range(2..9).unwrap().iter().map(|(id, _)| *id).collect::<Vec<_>>(), [2, 3]);
        use super::Reads;
        let (two, three) = (r.get(2).unwrap().unwrap(), r.get(3).unwrap().unwrap());
        assert_eq!(r.added_command(2).unwrap().as_deref(), Some(&b"echo hi | wccount"[..]), "its name after it");
        assert_eq!(two.cmd_len(), 12);
        assert!(r.has_names().unwrap());
        assert_eq!(r.added_name(2, &two).unwrap().as_deref(), Some(&b"count"[..]));
        assert_eq!(r.added_name(3, &three).unwrap(), None);
        assert_eq!(r.added_command(1).unwrap(), None, "a file's task has none");
        let mut waits = Vec::new();
        r.for_each_needs(|id, n| waits.push((id, n))).unwrap();
        assert_eq!(waits, [(2, needs.clone())]);
        r.check_history().unwrap();
        // A writer reads them a slice at a time.
        let l = Ledger::open(&p, false).unwrap();
        let mut t = l.write().unwrap();
        let (id4, _) = t
            .add_task(Adding { needs: &needs, ..Adding::plain(TaskShape::default(), false, b"true") }, None, None)
            .unwrap();
        assert_eq!(t.meta("total").unwrap(), Some(4u64.to_le_bytes().to_vec()), "this transaction's count");
        assert_eq!(t.needs_from(0, 1).unwrap(), [(2, needs.clone())]);
        assert_eq!(t.needs_from(3, 9).unwrap(), [(id4, needs.clone())]);
        assert!(t.needs_from(id4 + 1, 9).unwrap().is_empty());
    }

    #[test]
    fn the_records_errno_values_are_the_platforms() {
        use htc_core::record::errno;
        assert_eq!(
            [errno::ENOENT, errno::E2BIG, errno::ENOEXEC, errno::EACCES],
            [libc::ENOENT, libc::E2BIG, libc::ENOEXEC, libc::EACCES]
        );
        assert!(Outcome::SpawnFailed.is_permanent(libc::ENOENT) && !Outcome::SpawnFailed.is_permanent(libc::EAGAIN));
        assert!(Outcome::Exited.is_permanent(127) && !Outcome::Exited.is_permanent(1));
        assert_eq!(Outcome::SpawnFailed.describe(libc::EACCES), "exit 126: could not start: Permission denied");
    }

    #[test]
    fn a_damaged_attempt_meta_entry_or_failed_mark_is_an_error_not_a_gap() {
        let p = tmp("sums");
        let l = Ledger::create(&p).unwrap();
        let mut t = l.write().unwrap();
        t.append(1, &Record::default().walked(&[Step::Refuse]).unwrap()).unwrap();
        t.put_counts(&Counts([0, 0, 0, 0, 1, 0])).unwrap();
        let a = Attempt { attempt: 1, agent: 0, ended: Ended::new(Outcome::Exited, 3, 1, 2) };
        t.apply(&Change::Attempt(1, a)).unwrap();
        t.put_meta("total", &1u64.to_le_bytes()).unwrap();
        t.apply(&Change::Failed(1, true)).unwrap();
        t.commit().unwrap();
        let r = l.read().unwrap();
        assert_eq!(r.attempts(1).unwrap(), [a]);
        assert_eq!(r.meta_u64("total").unwrap(), Some(1));
        assert_eq!(r.failed_ids(10).unwrap(), [1]);
        r.check_history().unwrap();
        drop(r);
        // Damage each stored value in place, as a flipped bit on disk would.
        let mut t = l.write().unwrap();
        let mut bad = encode_attempt(&a, &attempt_key(1, 0));
        bad[4] ^= 1;
        t.apply_entry(true, crate::journal::DB_ATTEMPTS, &attempt_key(1, 0), &bad).unwrap();
        let mut m = seal(b"total", &1u64.to_le_bytes());
        m[0] ^= 0x80;
        t.apply_entry(true, crate::journal::DB_META, b"total", &m).unwrap();
        t.apply_entry(true, crate::journal::DB_FAILED, &key(1), &[0, 0, 0, 0]).unwrap();
        t.commit().unwrap();
        let r = l.read().unwrap();
        for e in [r.attempts(1).err(), r.meta_u64("total").err(), r.failed_ids(10).err(), r.check_history().err()] {
            let e = e.expect("damage must be an error").to_string();
            assert!(e.contains("checksum does not match"), "{e}");
        }
    }

    #[test]
    fn a_tree_that_is_not_the_newest_commits_is_refused() {
        let p = tmp("txn");
        let l = Ledger::create(&p).unwrap();
        let mut t = l.write().unwrap();
        t.append(1, &Record::default()).unwrap();
        t.commit().unwrap();
        l.read().unwrap().check_commit().unwrap();
        // A commit id that is not the transaction's, as a revived older tree would have.
        {
            let mut t = l.write().unwrap();
            t.txn.put(l.meta, &TXN_KEY, &seal(TXN_KEY.as_bytes(), &1u64.to_le_bytes()), WriteFlags::empty()).unwrap();
            t.txn.commit().unwrap();
        }
        let e = l.read().unwrap().check_commit().unwrap_err().to_string();
        assert!(e.contains("names commit"), "{e}");
        drop(l);
        assert!(Ledger::open(&p, true).is_err());
    }

    #[test]
    fn a_record_read_then_rewritten_lands_on_its_own_key_whatever_was_written_between() {
        // Records go back through the transaction's cursor, in place when it still stands on
        // the key read (`cursor`). Between the read and the write here: other records read and
        // written, new tasks appended past the end and keys put in the middle of the tree (page
        // splits that move entries under the cursor), the record itself deleted (the cursor then
        // stands nowhere), and an aborted transaction before.
        let p = tmp("cursor");
        let l = Ledger::create(&p).unwrap();
        let mut t = l.write().unwrap();
        for id in (2..=4000).step_by(2) {
            t.append(id, &at_line(id as u32)).unwrap();
        }
        t.commit().unwrap();
        drop(l.write().unwrap()); // a cursor opened by nothing, its transaction abandoned
        let t = l.write().unwrap();
        let _ = t.get(10).unwrap();
        drop(t); // a cursor opened, its transaction abandoned: closed before the abort
        let mut t = l.write().unwrap();
        let moved = [100u64, 2000, 3998, 50, 60];
        for (id, between) in moved.into_iter().zip(0..) {
            let mut r = t.get(id).unwrap().unwrap();
            match between {
                0 => {
                    let other = t.get(102).unwrap().unwrap();
                    t.apply(&Change::Record(102, other)).unwrap();
                }
                // Odd ids are new keys among the even ones: LMDB splits pages under the cursor.
                1 => (1..2000u64).step_by(2).for_each(|k| {
                    t.apply_entry(true, DB_TASKS, &key(k), &encode_record(&at_line(k as u32), k)).unwrap()
                }),
                2 => (4002..=6000u64).step_by(2).for_each(|k| t.append(k, &at_line(k as u32)).unwrap()),
                3 => assert!(t.get(6001).unwrap().is_none()),
                _ => t.apply_entry(false, DB_TASKS, &key(id), &[]).unwrap(),
            }
            r.take(Step::Dispatch).unwrap();
            t.apply(&Change::Record(id, r)).unwrap();
        }
        t.commit().unwrap();
        let t = l.read().unwrap();
        for id in moved {
            let r = t.get(id).unwrap().unwrap();
            assert_eq!((r.line(), r.state()), (id as u32, State::Dispatched), "task {id}");
        }
        for id in (1..2000u64).chain((2000..=6000).step_by(2)) {
            let r = t.get(id).unwrap().unwrap_or_else(|| panic!("task {id} is gone"));
            assert_eq!(r.line(), id as u32, "task {id}");
            assert_eq!(r.state() == State::Dispatched, moved.contains(&id), "task {id}");
        }
    }

    #[test]
    fn committed_state_survives_reopen_and_uncommitted_does_not() {
        let p = tmp("reopen");
        {
            let l = Ledger::create(&p).unwrap();
            let mut t = l.write().unwrap();
            for id in 1..=1000 {
                t.append(id, &at_line(id as u32)).unwrap();
            }
            t.put_counts(&Counts([1000, 0, 0, 0, 0, 0])).unwrap();
            t.commit().unwrap();
            let mut t = l.write().unwrap();
            let mut r = t.get(5).unwrap().unwrap();
            r.take(Step::Dispatch).unwrap();
            r.take(Step::Finish(End::Succeeded)).unwrap();
            t.apply(&Change::Record(5, r)).unwrap();
            let a = Attempt { attempt: 1, agent: 0, ended: Ended::new(Outcome::Exited, 1, 1, 2) };
            t.apply(&Change::Attempt(5, a)).unwrap();
            t.commit().unwrap();
            let mut t = l.write().unwrap();
            let mut r = t.get(6).unwrap().unwrap();
            r.take(Step::Dispatch).unwrap();
            r.take(Step::Finish(End::Succeeded)).unwrap();
            t.apply(&Change::Record(6, r)).unwrap();
            drop(t); // aborted
        }
        let l = Ledger::open(&p, true).unwrap();
        let t = l.read().unwrap();
        assert_eq!(t.get(5).unwrap().unwrap().state(), State::Done);
        assert_eq!(t.get(6).unwrap().unwrap().state(), State::Pending);
        assert_eq!(t.attempts(5).unwrap().len(), 1);
        assert!(t.attempts(6).unwrap().is_empty());
        assert_eq!(t.counts().unwrap().total(), 1000);
        let mut n = 0;
        t.for_each(|_, _| n += 1).unwrap();
        assert_eq!(n, 1000);
    }

    #[test]
    fn a_real_free_page_list_reads_as_whole() {
        let p = tmp("freelist");
        let l = Ledger::create(&p).unwrap();
        for round in 0..20u32 {
            let mut t = l.write().unwrap();
            for id in 1..=2000 {
                t.apply(&Change::Record(id, at_line(round))).unwrap();
            }
            t.commit().unwrap();
        }
        assert!(l.env.freelist().unwrap() > 0, "rewrites free pages");
        l.read().unwrap().check_freelist().unwrap();
    }

    /// A ledger as the (test-only) schema 2 wrote it: `n` tasks, the even ones done.
    pub(crate) fn schema_2_ledger(p: &Path, n: u64) -> Vec<Record> {
        let l = Ledger::create(p).unwrap();
        let mut t = l.write().unwrap();
        let mut written = Vec::new();
        for id in 1..=n {
            let mut r = at_line(id as u32);
            if id % 2 == 0 {
                r.take(Step::Dispatch).unwrap();
                r.take(Step::Finish(End::Succeeded)).unwrap();
            }
            t.apply_entry(true, DB_TASKS, &key(id), &crate::layout::tests::v2::encode(&r, id)).unwrap();
            written.push(r);
        }
        t.put_meta("schema", &2u32.to_le_bytes()).unwrap();
        t.put_meta("total", &n.to_le_bytes()).unwrap();
        t.commit().unwrap();
        written
    }

    fn records(l: &Ledger) -> Vec<Record> {
        let mut out = Vec::new();
        l.read().unwrap().for_each(|_, r| out.push(*r)).unwrap();
        out
    }

    #[test]
    fn an_older_schema_is_read_as_it_is_and_migrated_in_place_by_a_writer() {
        let p = tmp("migrate");
        // More tasks than one chunk of the rewrite.
        let written = schema_2_ledger(&p, (1 << 16) + 5);
        let reader = Ledger::open(&p, true).unwrap();
        assert_eq!(reader.read().unwrap().schema().unwrap(), 2, "a reader leaves it as it is");
        assert_eq!(records(&reader), written, "and reads it through the older layout");
        drop(reader);
        let l = Ledger::open(&p, false).unwrap();
        assert_eq!(l.read().unwrap().schema().unwrap(), SCHEMA_VERSION);
        assert_eq!(records(&l), written);
        let stored = l.read().unwrap().txn.get(l.tasks, &key(7)).unwrap().len();
        assert_eq!(stored, RECORD_LEN, "rewritten in this build's layout");
        drop(l);
        let again = Ledger::open(&p, false).unwrap();
        assert_eq!(records(&again), written, "a migrated ledger opens as any other");
    }

    /// A new ledger that says it has schema `version`.
    fn with_schema(name: &str, version: u32) -> std::path::PathBuf {
        let p = tmp(name);
        let l = Ledger::create(&p).unwrap();
        let mut t = l.write().unwrap();
        t.put_meta("schema", &version.to_le_bytes()).unwrap();
        t.commit().unwrap();
        p
    }

    #[test]
    fn a_schema_with_no_migration_is_refused_naming_both_versions() {
        let p = with_schema("unmigratable", 1);
        let e = Ledger::open(&p, false).err().expect("schema 1 cannot be migrated");
        assert!(matches!(e, LedgerError::Unmigratable { found: 1, .. }), "{e}");
    }

    #[test]
    fn wrong_schema_is_refused() {
        let p = with_schema("schema", 99);
        let e = Ledger::open(&p, false).err().expect("a newer schema is refused");
        assert!(matches!(e, LedgerError::Schema { found: 99, .. }), "{e}");
        let shown = e.to_string();
        assert!(
            shown.contains(&p.display().to_string())
                && shown.contains("99")
                && shown.contains(&SCHEMA_VERSION.to_string()),
            "{shown}"
        );
    }

    #[test]
    fn a_truncated_or_foreign_file_is_refused_with_a_reason_instead_of_a_bus_error() {
        let path = tmp("truncated");
        {
            let l = Ledger::create(&path).unwrap();
            let mut t = l.write().unwrap();
            for id in 1..=20_000 {
                t.append(id, &Record::default()).unwrap();
            }
            t.commit().unwrap();
        }
        assert!(Ledger::open(&path, true).is_ok());
        let len = std::fs::metadata(&path).unwrap().len();
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(len / 2).unwrap();
        let e = Ledger::open(&path, true).err().expect("a truncated ledger must not open");
        assert!(e.to_string().contains("truncated"), "{e}");
        std::fs::write(&path, vec![7u8; 8192]).unwrap();
        let e = Ledger::open(&path, true).err().expect("random bytes are no ledger");
        assert!(e.to_string().contains("not an LMDB file"), "{e}");
    }
}
