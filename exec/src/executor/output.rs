//! Output storage: capture files appended to the slot's streams or cut per task, the output
//! index, the results journal, and a full disk (the run stops cleanly rather than lose a
//! result's output).

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::config::{index_name, ExecConfig};
use crate::capture::{Capture, Scratch};
use crate::output::{IndexEntry, OutputMode};
use htc_core::spawn_loop::Run;
use htc_core::work::{ExecEvent, TaskToRun};

/// A task's stdout and stderr descriptors, and (per-task output) the files that own them.
pub(super) type OutputFds = (RawFd, RawFd, Option<(File, File)>);

/// Free space is looked at this often while plentiful, and before every report once below `SPACE_LOW`.
const SPACE_CHECK_EVERY: Duration = Duration::from_secs(2);
const SPACE_LOW: u64 = 256 << 20;

/// Where a loop's tasks' output goes, and its records of starts and ends.
pub(super) struct Store {
    mode: OutputMode,
    dir: PathBuf,
    /// This loop's place in the agent's output directory (`ExecConfig`).
    spawner: usize,
    first_slot: usize,
    agent: u32,
    slots: Vec<SlotOutput>,
    /// The output index (streams mode), made with the first entry, as the slots' files are.
    index: Option<BufWriter<File>>,
    /// Starts and ends, journaled before they are reported (`ExecConfig::results`).
    journal: Option<crate::results::Journal>,
    /// Where tasks' stdout and stderr go with no output kept.
    null: File,
    /// Set when output storage failed (a full disk, a failed index write): the loop then stops
    /// with it, reporting only what was recorded whole.
    fault: Option<io::Error>,
    /// When free space was last looked at, and whether it was low then.
    space_checked: Option<Instant>,
    space_low: bool,
    /// Where tasks' capture files are made.
    scratch: Scratch,
    copy_buf: Vec<u8>,
    /// "No new capture" lines, at most one a minute.
    capture_log: crate::throttle::Throttle,
}

struct SlotOutput {
    /// Its stream files (streams mode), made when it first stores a task's output: a slot that
    /// never runs a task (most of the wide spawner's, in a run without wide tasks) leaves none.
    streams: Option<Streams>,
    /// The running task's stdout and stderr captures (streams mode): descriptors whose numbers
    /// stay, pointed at fresh files before each spawn.
    capture: Option<(Capture, Capture)>,
}

/// A slot's stream files: every task that ran in it appends its stdout and stderr to them.
struct Streams {
    out: File,
    err: File,
    /// Where the next task's output starts: only the executor appends to a slot's files.
    out_end: u64,
    err_end: u64,
}

impl Streams {
    fn open(dir: &std::path::Path, slot: usize) -> io::Result<Streams> {
        let open = |name: String| {
            OpenOptions::new().append(true).create(true).custom_flags(libc::O_CLOEXEC).open(dir.join(name))
        };
        let (out, err) = (open(format!("slot-{slot}.out"))?, open(format!("slot-{slot}.err"))?);
        let (out_end, err_end) = (end_of(out.as_raw_fd()), end_of(err.as_raw_fd()));
        Ok(Streams { out, err, out_end, err_end })
    }

    /// Appends `msg` to stderr: (where it starts, whether it was written).
    fn append_err(&mut self, msg: &[u8]) -> (u64, bool) {
        let at = self.err_end;
        let kept = (&self.err).write_all(msg).is_ok();
        if kept {
            self.err_end += msg.len() as u64;
        }
        (at, kept)
    }
}

impl Store {
    pub(super) fn new(cfg: &ExecConfig) -> io::Result<Store> {
        let scratch = Scratch::find();
        if cfg.output != OutputMode::None {
            fs::create_dir_all(&cfg.out_dir)?;
        }
        if let Some(dir) = cfg.results.as_ref().and_then(|p| p.parent()) {
            fs::create_dir_all(dir)?;
        }
        let mut slots = Vec::with_capacity(cfg.slots);
        for _ in 0..cfg.slots {
            let streams = cfg.output == OutputMode::Streams;
            let capture = if streams { Some((Capture::new(&scratch)?, Capture::new(&scratch)?)) } else { None };
            slots.push(SlotOutput { streams: None, capture });
        }
        Ok(Store {
            mode: cfg.output,
            dir: cfg.out_dir.clone(),
            spawner: cfg.spawner,
            first_slot: cfg.first_slot,
            agent: cfg.agent,
            slots,
            index: None,
            journal: cfg.results.clone().map(crate::results::Journal::new),
            null: OpenOptions::new().write(true).custom_flags(libc::O_CLOEXEC).open("/dev/null")?,
            fault: None,
            space_checked: None,
            space_low: false,
            scratch,
            copy_buf: Vec::new(),
            capture_log: crate::throttle::Throttle::new(Duration::from_secs(60)),
        })
    }

    /// The storage failure met since last asked, if any.
    pub(super) fn take_fault(&mut self) -> Option<io::Error> {
        self.fault.take()
    }

    /// Where the task's stdout and stderr go (with the files to keep open until it is spawned,
    /// per-task mode); why not, as an errno and a line for its stderr.
    pub(super) fn fds(&mut self, t: &TaskToRun, slot: usize) -> Result<OutputFds, (i32, String)> {
        match self.mode {
            OutputMode::PerTask => {
                let open = |ext: &str| {
                    OpenOptions::new()
                        .write(true)
                        .create(true)
                        .truncate(true)
                        .custom_flags(libc::O_CLOEXEC)
                        .open(self.dir.join(format!("{}.{ext}", t.id)))
                };
                match (open("out"), open("err")) {
                    (Ok(o), Ok(e)) => Ok((o.as_raw_fd(), e.as_raw_fd(), Some((o, e)))),
                    (Err(e), _) | (_, Err(e)) => {
                        Err((e.raw_os_error().unwrap_or(libc::EIO), format!("htc: cannot open output file: {e}\n")))
                    }
                }
            }
            OutputMode::Streams => {
                if let Err((e, usable)) = self.renew_captures(slot) {
                    if !usable {
                        let errno = e.raw_os_error().unwrap_or(libc::EIO);
                        return Err((errno, format!("htc: cannot make its output capture: {e}\n")));
                    }
                }
                let Some((out, err)) = &self.slots[slot].capture else { unreachable!("streams mode has captures") };
                Ok((out.task_fd(), err.task_fd(), None))
            }
            OutputMode::None => Ok((self.null.as_raw_fd(), self.null.as_raw_fd(), None)),
        }
    }

    /// An ended task's output kept as its mode says.
    pub(super) fn store(&mut self, r: &Run) {
        match self.mode {
            OutputMode::Streams => self.store_capture(r),
            OutputMode::PerTask if r.task.shape.max_output > 0 => self.cut_per_task(r),
            _ => {}
        }
    }

    /// The task could not be started: the reason goes where its stderr would have gone, so
    /// `htc output` shows it.
    pub(super) fn spawn_failed(&mut self, t: &TaskToRun, slot: usize, start_us: u64, msg: &str) {
        if self.mode != OutputMode::Streams {
            return;
        }
        let first_slot = self.first_slot;
        let Ok(s) = self.streams(slot) else { return };
        let (out_off, (err_off, kept)) = (s.out_end, s.append_err(msg.as_bytes()));
        self.write_index(&IndexEntry {
            id: t.id,
            attempt: t.attempt,
            slot: (first_slot + slot) as u32,
            out_off,
            out_len: 0,
            err_off,
            err_len: if kept { msg.len() as u64 } else { 0 },
            start_us,
            out_crc: 0,
            err_crc: if kept { crc32fast::hash(msg.as_bytes()) } else { 0 },
        });
    }

    /// Notes which devices the task got in the spawner's `devices` file (`htc log` shows them).
    pub(super) fn note_devices(&self, t: &TaskToRun, ids: &str) {
        let line = format!("{}\t{}\t{ids}\n", t.id, t.attempt);
        let path = self.dir.join(crate::output::devices_name(self.agent, self.spawner));
        let w = OpenOptions::new().append(true).create(true).custom_flags(libc::O_CLOEXEC).open(&path);
        if let Err(e) = w.and_then(|mut f| f.write_all(line.as_bytes())) {
            tracing::warn!(agent = self.agent, task = t.id, error = %e, "its devices are not recorded");
        }
    }

    /// Fresh capture files for the task about to start in `slot`; where none can be made, the
    /// old ones emptied (logged at most once a minute).
    fn renew_captures(&mut self, slot: usize) -> Result<(), (io::Error, bool)> {
        let Some((out, err)) = &mut self.slots[slot].capture else { return Ok(()) };
        let r = out.renew(&self.scratch).and(err.renew(&self.scratch));
        if let Err((e, true)) = &r {
            if let Some(more) = self.capture_log.allow(Instant::now()) {
                tracing::warn!(agent = self.agent, error = %e, not_logged = more, "no new output capture; the slot's last one is emptied and reused");
            }
        }
        r
    }

    /// Appends an ended task's captures to its slot's streams (at most its `max_output=` of
    /// each) and indexes them with their checksums; a cut is noted for `htc output`.
    fn store_capture(&mut self, r: &Run) {
        let slot = r.slots[0];
        if self.slots[slot].capture.is_none() || self.streams(slot).is_err() {
            return;
        }
        let s = &mut self.slots[slot];
        let (Some((cap_out, cap_err)), Some(f)) = (&s.capture, s.streams.as_mut()) else { return };
        let (out_off, err_off) = (f.out_end, f.err_end);
        let cap = r.task.shape.max_output_bytes();
        let copied = cap_out.append_to(&mut &f.out, cap, &mut self.copy_buf).and_then(|o| {
            f.out_end += o.kept;
            let e = cap_err.append_to(&mut &f.err, cap, &mut self.copy_buf)?;
            f.err_end += e.kept;
            Ok((o, e))
        });
        let (o, e) = match copied {
            Ok(oe) => oe,
            Err(e) => {
                // Re-read the ends: a partial append must not shift the next task's offsets.
                (f.out_end, f.err_end) = (end_of(f.out.as_raw_fd()), end_of(f.err.as_raw_fd()));
                let e = self.storage_error("appending a task's output", e);
                self.fault.get_or_insert(e);
                return;
            }
        };
        self.write_index(&IndexEntry {
            id: r.task.id,
            attempt: r.task.attempt,
            slot: (self.first_slot + slot) as u32,
            out_off,
            out_len: o.kept,
            err_off,
            err_len: e.kept,
            start_us: r.start_us,
            out_crc: o.crc,
            err_crc: e.crc,
        });
        let cuts: Vec<(&str, u64)> = [("stdout", o), ("stderr", e)]
            .into_iter()
            .filter(|(_, a)| a.written > a.kept)
            .map(|(n, a)| (n, a.written))
            .collect();
        self.note_cuts(r, &cuts);
    }

    /// `max_output=` with a file per task: what the task wrote past its cap is cut off.
    fn cut_per_task(&mut self, r: &Run) {
        let cap = r.task.shape.max_output_bytes();
        let mut cuts = Vec::new();
        for (name, ext) in [("stdout", "out"), ("stderr", "err")] {
            let p = self.dir.join(format!("{}.{ext}", r.task.id));
            let Ok(f) = OpenOptions::new().write(true).custom_flags(libc::O_CLOEXEC).open(&p) else { continue };
            let written = f.metadata().map(|m| m.len()).unwrap_or(0);
            if written > cap && f.set_len(cap).is_ok() {
                cuts.push((name, written));
            }
        }
        self.note_cuts(r, &cuts);
    }

    /// Notes outputs cut at their cap in the spawner's `cuts` file, for `htc output`.
    fn note_cuts(&self, r: &Run, cuts: &[(&str, u64)]) {
        if cuts.is_empty() {
            return;
        }
        let cap = r.task.shape.max_output_bytes();
        let mut line = String::new();
        for (name, written) in cuts {
            line.push_str(&format!("{}\t{}\t{name}\t{written}\t{cap}\n", r.task.id, r.task.attempt));
        }
        let path = self.dir.join(crate::output::cuts_name(self.agent, self.spawner));
        let w = OpenOptions::new().append(true).create(true).custom_flags(libc::O_CLOEXEC).open(&path);
        if let Err(e) = w.and_then(|mut f| f.write_all(line.as_bytes())) {
            tracing::warn!(agent = self.agent, task = r.task.id, error = %e, "the cut of its output is not recorded");
        }
    }

    /// `slot`'s stream files, made at its first use; where they cannot be, the output storage
    /// failed (`fault`).
    fn streams(&mut self, slot: usize) -> Result<&mut Streams, ()> {
        if self.slots[slot].streams.is_none() {
            match Streams::open(&self.dir, self.first_slot + slot) {
                Ok(s) => self.slots[slot].streams = Some(s),
                Err(e) => {
                    let e = self.storage_error("making a slot's output files", e);
                    self.fault.get_or_insert(e);
                    return Err(());
                }
            }
        }
        Ok(self.slots[slot].streams.as_mut().expect("made above"))
    }

    /// Adds an entry to the output index, made with its first entry.
    fn write_index(&mut self, entry: &IndexEntry) {
        if self.index.is_none() {
            match crate::output::open_index(&self.dir.join(index_name(self.spawner))) {
                Ok(f) => self.index = Some(BufWriter::with_capacity(64 << 10, f)),
                Err(e) => {
                    let e = self.storage_error("making the output index", e);
                    self.fault.get_or_insert(e);
                    return;
                }
            }
        }
        let ix = self.index.as_mut().expect("made above");
        if let Err(e) = ix.write_all(&entry.encode()) {
            let e = self.storage_error("writing the output index", e);
            self.fault.get_or_insert(e);
        }
    }

    pub(super) fn flush_index(&mut self) -> io::Result<()> {
        let Some(ix) = self.index.as_mut() else { return Ok(()) };
        ix.flush().map_err(|e| self.storage_error("writing the output index", e))
    }

    /// Some(error) when the disk holding the output is full: tasks that fail then most likely
    /// failed writing their output.
    fn disk_full(&self) -> Option<io::Error> {
        let dir = &self.dir;
        let free = htc_host::free_bytes(dir).filter(|&b| b < htc_host::NEARLY_FULL)?;
        Some(io::Error::new(
            io::ErrorKind::StorageFull,
            format!("the disk holding {} is full ({free} bytes free)", dir.display()),
        ))
    }

    fn storage_error(&self, what: &str, e: io::Error) -> io::Error {
        let path = self.dir.join(index_name(self.spawner));
        io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
    }

    /// Starts and ends about to be reported go into the results journal first; `is_result`
    /// says which ends are results (not those of tasks stopped because everything was dropped).
    pub(super) fn journal(&mut self, events: &[ExecEvent], is_result: impl Fn(u64, u32) -> bool) -> io::Result<()> {
        let Some(j) = self.journal.as_mut() else { return Ok(()) };
        j.note(events, is_result);
        j.write()
    }

    /// Output storage failed and every task is being stopped: the ends not yet reported are
    /// dropped (their output may be cut short or unindexed), so those tasks run again on resume,
    /// as new attempts; their starts are journaled if the disk still takes them. Returns the
    /// error to stop with: a full disk, the likeliest cause of any write error, named first.
    pub(super) fn fail(&mut self, events: &[ExecEvent], e: io::Error) -> io::Error {
        if let Some(j) = self.journal.as_mut() {
            j.note(events, |_, _| false);
            if let Err(e) = j.write() {
                tracing::warn!(agent = self.agent, error = %e, "the starts of the tasks stopped are not journaled");
            }
        }
        let e = self.disk_full().unwrap_or(e);
        tracing::error!(agent = self.agent, error = %e, "output storage failed");
        e
    }

    /// A task's failure is not its own when the disk is full: recorded as the loop's fault, and
    /// its end not reported, it runs again on resume without using up a retry.
    pub(super) fn blame_full_disk(&mut self) -> bool {
        match self.disk_full() {
            Some(full) => {
                self.fault.get_or_insert(full);
                true
            }
            None => false,
        }
    }

    /// Before ends are reported: is the disk holding the output full? A task that wrote to a
    /// full disk may still exit 0 (dash's printf does), its output cut short. Checked before
    /// every report while space is low, and every few seconds otherwise (statfs can be a
    /// server round trip on a network filesystem).
    pub(super) fn space_fault(&mut self) -> Option<io::Error> {
        if self.mode == OutputMode::None {
            return None;
        }
        let now = Instant::now();
        if !self.space_low && self.space_checked.is_some_and(|t| now.duration_since(t) < SPACE_CHECK_EVERY) {
            return None;
        }
        self.space_checked = Some(now);
        let free = htc_host::free_bytes(&self.dir)?;
        self.space_low = free < SPACE_LOW;
        self.disk_full()
    }
}

fn end_of(fd: RawFd) -> u64 {
    // SAFETY: lseek on a valid fd; -1 maps to 0.
    let off = unsafe { libc::lseek(fd, 0, libc::SEEK_END) };
    off.max(0) as u64
}
