//! Loading a task file into a new run: copy it into the run directory (the ledger's records point
//! into the copy, so a later edit of the user's file cannot change a run), then parse the copy and
//! append one record per task, committing in large batches. Memory stays flat whatever the size.

use std::fs::File;
use std::io::{BufReader, Write};
use std::path::Path;

use htc_core::partition::group_key;
use htc_core::taskfile::{Parser, TaskFileError, TaskShape};

use crate::ledger::{Ledger, LedgerError, Record};
use crate::rundir::RunDir;
use htc_core::record::CommandAt;
use htc_core::task::Counts;

const BATCH: u64 = 200_000;

/// The commands sweeps made, in the run directory beside the copy of the task file.
pub const GENERATED: &str = "generated.txt";

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{0}")]
    TaskFile(#[from] TaskFileError),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error("cannot copy {path} into the run directory: {source}")]
    Copy { path: String, source: std::io::Error },
    #[error("{path}: more than {max} tasks")]
    TooMany { path: String, max: u64 },
    #[error("{0}")]
    Replica(String),
}

#[derive(Debug, Clone)]
pub struct Loaded {
    pub tasks: u64,
    pub classes: Vec<String>,
    pub max_cores: u16,
    pub max_mem_mb: u32,
}

/// The most cores any task of the run asks for (as wide as can be for runs loaded before it was
/// kept, and for an open run). `--spawners N` is refused by it when N loops would each be too
/// narrow for a task (the default, a loop per CPU, runs wide tasks beside them).
pub fn widest_task(ledger: &Ledger) -> Result<u64, LedgerError> {
    let r = ledger.read()?;
    // An open run's tasks come while it runs: any of them may need all of an agent's cores.
    if r.meta_u64(OPEN)?.is_some() {
        return Ok(u64::MAX);
    }
    Ok(r.meta_u64("max_cores")?.unwrap_or(u64::MAX))
}

/// Copies `src` into the run and loads it into `ledger`. Errors name `src` as the user wrote it.
// Long (about 80 lines): one pass over the task file that writes records, sweeps and meta in one
// transaction; split, each part would need the whole of the pass's state.
pub fn load(src: &Path, run: &RunDir, ledger: &Ledger, defaults: TaskShape) -> Result<Loaded, LoadError> {
    let shown = src.display().to_string();
    htc_core::taskfile::require_regular(src)?;
    std::fs::copy(src, run.tasks()).map_err(|source| LoadError::Copy { path: shown.clone(), source })?;
    let f = File::open(run.tasks()).map_err(|source| LoadError::Copy { path: shown.clone(), source })?;
    let text_len = f.metadata().map_err(|source| LoadError::Copy { path: shown.clone(), source })?.len();
    let dir = src.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let mut p = Parser::new(BufReader::with_capacity(1 << 20, f), shown.clone()).with_defaults(defaults).with_dir(dir);
    // Commands made by sweeps are not in the file: they go to `generated.txt`, read as if it
    // followed the copy (`TaskText`).
    let mut generated: Option<Generated> = None;
    let copy_err = |source| LoadError::Copy { path: shown.clone(), source };
    let mut txn = ledger.write()?;
    let mut id: u64 = 0;
    let (mut max_cores, mut max_mem_mb) = (1u16, 0u32);
    // Runtime groups (HFlow's classes): the leader reads them back only when there are several.
    let (mut groups, mut last, mut hinted, mut exclusive) = (std::collections::HashSet::new(), None, 0u64, 0u64);
    // Tasks that wait for others: the leader reads what they wait for only when there are some.
    let mut waits = 0u64;
    while let Some(t) = p.next_task()? {
        id += 1;
        // Sweeps can make more tasks than lines: the count is bounded as the lines are.
        if t.line > u32::MAX as u64 || id > u32::MAX as u64 {
            return Err(LoadError::TooMany { path: shown.clone(), max: u32::MAX as u64 });
        }
        let o = t.options;
        max_cores = max_cores.max(o.cores);
        max_mem_mb = max_mem_mb.max(o.mem_mb);
        hinted += (o.runtime_ms > 0) as u64;
        exclusive += o.exclusive as u64;
        // Consecutive tasks mostly share their options: key only on a change.
        if last != Some((o.priority, o.class, o.runtime_ms)) {
            groups.insert((o.priority, group_key(o.class, o.runtime_ms)));
            last = Some((o.priority, o.class, o.runtime_ms));
        }
        let cmd_off = if t.generated {
            let g = match generated.as_mut() {
                Some(g) => g,
                None => generated.insert(Generated::create(&run.path.join(GENERATED), text_len).map_err(copy_err)?),
            };
            g.push(t.command).map_err(copy_err)?
        } else {
            t.offset
        };
        let cmd = CommandAt { off: cmd_off, len: t.command.len() as u32, line: t.line as u32, shell: t.shell };
        let r = Record::new(cmd, o);
        txn.append(id, &r)?;
        if !t.after.is_empty() {
            txn.put_needs(id, t.after)?;
            waits += 1;
        }
        if o.rules {
            txn.put_rules(id, t.rules)?;
        }
        if id.is_multiple_of(BATCH) {
            txn.commit()?;
            txn = ledger.write()?;
        }
    }
    txn.put_meta("total", &id.to_le_bytes())?;
    txn.put_meta("max_cores", &(max_cores as u64).to_le_bytes())?;
    txn.put_meta("hinted", &hinted.to_le_bytes())?;
    txn.put_meta("exclusive", &exclusive.to_le_bytes())?;
    txn.put_meta("groups", &(groups.len() as u64).to_le_bytes())?;
    txn.put_meta("waits", &waits.to_le_bytes())?;
    if let Some(g) = generated {
        g.finish().map_err(copy_err)?;
    }
    txn.put_meta("classes", p.classes().join("\n").as_bytes())?;
    txn.put_meta("task_file", shown.as_bytes())?;
    txn.put_counts(&Counts([id, 0, 0, 0, 0, 0]))?;
    txn.commit()?;
    Ok(Loaded { tasks: id, classes: p.classes().to_vec(), max_cores, max_mem_mb })
}

/// An open run (`htc run --open`): it takes tasks while it runs, and ends once closed, or once
/// idle for `idle_exit_ms`. Kept in the ledger's meta (`OPEN`: the idle time in ms, 0: none),
/// so that every session of the run is open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenRun {
    pub idle_exit_ms: Option<u64>,
}

pub const OPEN: &str = "open";

/// Whether the run is open, as its ledger says.
pub fn open_run(ledger: &Ledger) -> Result<Option<OpenRun>, LedgerError> {
    let ms = ledger.read()?.meta_u64(OPEN)?;
    Ok(ms.map(|ms| OpenRun { idle_exit_ms: (ms > 0).then_some(ms) }))
}

/// An open run started without a task file: its tasks all come while it runs.
fn load_nothing(run: &RunDir, ledger: &Ledger) -> Result<Loaded, LoadError> {
    std::fs::write(run.tasks(), b"").map_err(|source| LoadError::Copy { path: "(no task file)".into(), source })?;
    let mut txn = ledger.write()?;
    for (k, v) in [("total", 0u64), ("max_cores", 1), ("hinted", 0), ("exclusive", 0), ("groups", 0), ("waits", 0)] {
        txn.put_meta(k, &v.to_le_bytes())?;
    }
    txn.put_meta("classes", b"default")?;
    txn.put_meta("task_file", b"")?;
    txn.put_counts(&Counts::default())?;
    txn.commit()?;
    Ok(Loaded { tasks: 0, classes: vec!["default".into()], max_cores: 1, max_mem_mb: 0 })
}

/// The commands sweeps made, written as they are made. Its first line says the offset records
/// use for its first byte (the copy's size at load), so a copy that changed size later cannot
/// shift them onto other bytes.
struct Generated {
    w: std::io::BufWriter<File>,
    base: u64,
    at: u64,
}

const GENERATED_HEAD: &str = "# htc: commands made by sweeps; offsets from ";

impl Generated {
    fn create(path: &Path, base: u64) -> std::io::Result<Generated> {
        let mut w = std::io::BufWriter::with_capacity(1 << 20, File::create(path)?);
        let head = format!("{GENERATED_HEAD}{base:020}\n");
        w.write_all(head.as_bytes())?;
        Ok(Generated { w, base, at: head.len() as u64 })
    }

    /// Appends a command; its offset for the record.
    fn push(&mut self, cmd: &[u8]) -> std::io::Result<u64> {
        self.w.write_all(cmd)?;
        self.w.write_all(b"\n")?;
        let off = self.base + self.at;
        self.at += cmd.len() as u64 + 1;
        Ok(off)
    }

    fn finish(mut self) -> std::io::Result<()> {
        self.w.flush()?;
        self.w.get_ref().sync_all()
    }
}

/// The base a `Generated` file's first line gives.
fn generated_base(head: &[u8]) -> Option<u64> {
    let line = head.split(|&b| b == b'\n').next()?;
    std::str::from_utf8(line).ok()?.strip_prefix(GENERATED_HEAD)?.parse().ok()
}

/// The task file to give sbatch when a new job continues `run` (sbatch checks it; the job loads
/// nothing): the run's copy, or, for a run with sweeps, the original file while it is there, whose
/// `rows=` tables resolve beside it (they are not beside the copy).
pub fn file_for_sbatch(run: &RunDir, ledger: &Ledger) -> Result<std::path::PathBuf, LedgerError> {
    if run.path.join(GENERATED).exists() {
        let t = ledger.read()?;
        if let Some(orig) =
            t.meta("task_file")?.map(|b| std::path::PathBuf::from(String::from_utf8_lossy(b).into_owned()))
        {
            if orig.is_absolute() && orig.is_file() {
                return Ok(orig);
            }
        }
    }
    Ok(run.tasks())
}

/// The option that gives sbatch the run to continue (with `--htc-resume`): `--htc=FILE` as
/// [`file_for_sbatch`] says, or `--htc-open` for an open run started without a task file (its
/// empty copy is no task file sbatch takes; the continuation is open as its ledger says).
pub fn sbatch_run_option(run: &RunDir, ledger: &Ledger) -> Result<std::ffi::OsString, LedgerError> {
    let no_file = ledger.read()?.meta("task_file")?.is_some_and(|f| f.is_empty());
    if no_file && open_run(ledger)?.is_some() {
        return Ok("--htc-open".into());
    }
    let mut option = std::ffi::OsString::from("--htc=");
    option.push(file_for_sbatch(run, ledger)?);
    Ok(option)
}

/// Bytes of command text records may point into: the copy of the task file, then the commands
/// its sweeps made.
pub fn text_len(run: &RunDir) -> u64 {
    use std::os::unix::fs::FileExt;
    let len = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    let gen = run.path.join(GENERATED);
    let mut head = [0u8; 80];
    let base = File::open(&gen).ok().and_then(|f| {
        let n = f.read_at(&mut head, 0).ok()?;
        generated_base(&head[..n])
    });
    match base {
        Some(b) => b + len(&gen),
        None => len(&run.tasks()),
    }
}

/// The run's copy of the task file, and the commands its sweeps made (`GENERATED`), mapped
/// read-only: commands are read straight from the page cache at dispatch instead of living on the
/// heap. A record's offset past the copy's end is in the generated commands.
pub struct TaskText {
    text: Mapped,
    generated: Mapped,
    /// The offset at which records point into `generated` (the copy's size at load).
    base: usize,
}

struct Mapped {
    ptr: *const u8,
    len: usize,
    fault: Option<crate::mapfault::Registration>,
}

// SAFETY: the raw pointers are what keeps TaskText from being Send. Each `Mapped` owns its
// mapping alone (nothing else holds the pointer), so it may be unmapped on any thread.
unsafe impl Send for TaskText {}
// SAFETY: the mappings are PROT_READ and never written through, and stay mapped until Drop, which
// needs `&mut`: threads sharing `&TaskText` only read memory that does not change. (A task file
// cut short under it faults, and mapfault turns that into an error exit, on any thread.)
unsafe impl Sync for TaskText {}

impl Mapped {
    const NONE: Mapped = Mapped { ptr: std::ptr::null(), len: 0, fault: None };

    fn open(path: &Path) -> std::io::Result<Mapped> {
        use nix::sys::mman::{mmap, MapFlags, ProtFlags};
        let f = File::open(path)?;
        let Some(len) = std::num::NonZeroUsize::new(f.metadata()?.len() as usize) else { return Ok(Mapped::NONE) };
        // SAFETY: a new read-only private mapping (address chosen by the kernel, so nothing of
        // ours is replaced) of `len` > 0 bytes.
        let ptr = unsafe { mmap(None, len, ProtFlags::PROT_READ, MapFlags::MAP_PRIVATE, &f, 0) }?;
        let (ptr, len) = (ptr.as_ptr() as *const u8, len.get());
        let what = format!("the run's copy of the task file {} was cut short while in use", path.display());
        Ok(Mapped { ptr, len, fault: crate::mapfault::register(ptr as usize, len, &what) })
    }

    fn get(&self, off: usize, len: usize) -> &[u8] {
        if self.ptr.is_null() || off.checked_add(len).is_none_or(|e| e > self.len) {
            return &[];
        }
        // SAFETY: `off + len` is within the mapping (checked above), which stays mapped and
        // unchanged while `self` is borrowed.
        unsafe { std::slice::from_raw_parts(self.ptr.add(off), len) }
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        self.fault.take();
        if let Some(ptr) = std::ptr::NonNull::new(self.ptr as *mut libc::c_void) {
            // SAFETY: exactly the mapping open() made, unmapped once; no slice of it outlives the
            // borrow of `self` that get() gave, so none is left.
            let _ = unsafe { nix::sys::mman::munmap(ptr, self.len) };
        }
    }
}

impl TaskText {
    /// Maps the copy at `path`, and the generated commands beside it if there are any.
    pub fn open(path: &Path) -> std::io::Result<TaskText> {
        let text = Mapped::open(path)?;
        let gen = path.with_file_name(GENERATED);
        let generated = if gen.exists() { Mapped::open(&gen)? } else { Mapped::NONE };
        let base = generated_base(generated.get(0, generated.len.min(80))).map_or(usize::MAX, |b| b as usize);
        Ok(TaskText { text, generated, base })
    }

    /// The command of a record; empty if the record points outside the files (a truncated copy).
    pub fn command(&self, r: &Record) -> &[u8] {
        let (off, len) = (r.cmd_off() as usize, r.cmd_len() as usize);
        match off.checked_sub(self.base) {
            Some(g) => self.generated.get(g, len),
            None => self.text.get(off, len),
        }
    }
}

/// Creates the run directory `base/.htc/id`, loads `file` into its ledger (in the run directory,
/// or at `ledger` on a node's local disk), records the output mode and writes the job secret. A
/// bad task file removes the run again, so nothing can run; readers find the run only once it
/// is whole (`RunDir::create`).
pub fn create_run(
    base: &Path,
    id: &str,
    file: Option<&Path>,
    output: htc_core::output::OutputMode,
    defaults: TaskShape,
    ledger: Option<std::path::PathBuf>,
    open: Option<OpenRun>,
) -> Result<(RunDir, Loaded), CreateError> {
    let mut run =
        RunDir::create(base, id).map_err(|e| CreateError::Io(format!("creating {}/.htc/{id}: {e}", base.display())))?;
    if let Some(l) = ledger {
        // A new run's node-local ledger is new: one found at its path is a dead job's of the
        // same id (ids start over when a cluster's controller does), never a live run's.
        if l.exists() {
            if crate::replica::in_use(&l) {
                return Err(CreateError::Io(format!("{} is in use by a live process", l.display())));
            }
            tracing::warn!(ledger = %l.display(), "removing a ledger a dead job of the same id left on this node");
            crate::replica::remove_node_local(&l);
            crate::replica::private_dir(l.parent().unwrap_or(base)).map_err(CreateError::Io)?;
        }
        run = run.with_ledger(l);
    }
    let result = (|| {
        let ledger = Ledger::create(&run.ledger())?;
        let loaded = match file {
            Some(file) => load(file, &run, &ledger, defaults)?,
            None => load_nothing(&run, &ledger)?,
        };
        let mut t = ledger.write()?;
        t.put_meta("output", output.name().as_bytes())?;
        if let Some(o) = open {
            t.put_meta(OPEN, &o.idle_exit_ms.unwrap_or(0).to_le_bytes())?;
        }
        t.commit()?;
        if run.replicated() {
            // Its first snapshot: from now on the run survives the node that holds its ledger.
            crate::replica::Replica::of(&run.path)
                .begin(&ledger)
                .map_err(|e| LoadError::Replica(format!("writing the ledger's snapshot: {e}")))?;
        }
        Ok::<_, LoadError>(loaded)
    })();
    // A run that cannot be made whole (a bad task file, a full disk) is removed, so that no
    // half-made run is left for `htc status` or a resume to trip over.
    let result = result.map_err(CreateError::Load).and_then(|loaded| {
        run.write_secret()
            .map_err(|e| CreateError::Io(format!("writing the job secret into {}: {e}", run.path.display())))?;
        Ok(loaded)
    });
    let result = result.and_then(|loaded| {
        let made = run.path.clone();
        let published =
            run.clone().publish().map_err(|e| CreateError::Io(format!("naming {}: {e}", made.display())))?;
        run = published;
        Ok(loaded)
    });
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&run.path);
        // The folders made for it too, when nothing else is in them (remove_dir refuses then).
        if let Some(htc_dir) = run.path.parent() {
            let _ = std::fs::remove_dir(htc_dir);
        }
        if run.replicated() {
            crate::replica::remove_node_local(&run.ledger());
        }
    }
    result.map(|loaded| (run, loaded))
}

#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("{0}")]
    Io(String),
}
