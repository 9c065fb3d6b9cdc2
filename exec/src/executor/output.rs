//! Output storage: capture files appended to the slot's streams or cut per task, the output
//! index, and a full disk (the run stops cleanly rather than lose a result's output).

use super::*;

impl Executor {
    /// Fresh capture files for the task about to start in `slot`; where none can be made, the
    /// old ones emptied (logged at most once a minute).
    pub(super) fn renew_captures(&mut self, slot: usize) -> Result<(), (io::Error, bool)> {
        let Some((out, err)) = &mut self.slots[slot].capture else { return Ok(()) };
        let r = out.renew(&self.scratch).and(err.renew(&self.scratch));
        if let Err((e, true)) = &r {
            if let Some(more) = self.capture_log.allow(Instant::now()) {
                tracing::warn!(agent = self.cfg.agent, error = %e, not_logged = more, "no new output capture; the slot's last one is emptied and reused");
            }
        }
        r
    }

    /// Appends an ended task's captures to its slot's streams (at most its `max_output=` of
    /// each) and indexes them with their checksums; a cut is noted for `htc output`.
    pub(super) fn store_capture(&mut self, r: &Running) {
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
            slot: (self.cfg.first_slot + slot) as u32,
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
    pub(super) fn cut_per_task(&mut self, r: &Running) {
        let cap = r.task.shape.max_output_bytes();
        let mut cuts = Vec::new();
        for (name, ext) in [("stdout", "out"), ("stderr", "err")] {
            let p = self.cfg.out_dir.join(format!("{}.{ext}", r.task.id));
            let Ok(f) = OpenOptions::new().write(true).custom_flags(libc::O_CLOEXEC).open(&p) else { continue };
            let written = f.metadata().map(|m| m.len()).unwrap_or(0);
            if written > cap && f.set_len(cap).is_ok() {
                cuts.push((name, written));
            }
        }
        self.note_cuts(r, &cuts);
    }

    /// Notes outputs cut at their cap in the spawner's `cuts` file, for `htc output`.
    pub(super) fn note_cuts(&self, r: &Running, cuts: &[(&str, u64)]) {
        if cuts.is_empty() {
            return;
        }
        let cap = r.task.shape.max_output_bytes();
        let mut line = String::new();
        for (name, written) in cuts {
            line.push_str(&format!("{}\t{}\t{name}\t{written}\t{cap}\n", r.task.id, r.task.attempt));
        }
        let path = self.cfg.out_dir.join(crate::output::cuts_name(self.cfg.agent, self.cfg.spawner));
        let w = OpenOptions::new().append(true).create(true).custom_flags(libc::O_CLOEXEC).open(&path);
        if let Err(e) = w.and_then(|mut f| f.write_all(line.as_bytes())) {
            tracing::warn!(agent = self.cfg.agent, task = r.task.id, error = %e, "the cut of its output is not recorded");
        }
    }

    /// `slot`'s stream files, made at its first use; where they cannot be, the output storage
    /// failed (`fault`).
    pub(super) fn streams(&mut self, slot: usize) -> Result<&mut Streams, ()> {
        if self.slots[slot].streams.is_none() {
            match Streams::open(&self.cfg.out_dir, self.cfg.first_slot + slot) {
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
    pub(super) fn write_index(&mut self, entry: &IndexEntry) {
        if self.index.is_none() {
            match crate::output::open_index(&self.cfg.out_dir.join(self.cfg.index_name())) {
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
    pub(super) fn disk_full(&self) -> Option<io::Error> {
        let dir = &self.cfg.out_dir;
        let free = htc_host::free_bytes(dir).filter(|&b| b < htc_host::NEARLY_FULL)?;
        Some(io::Error::new(
            io::ErrorKind::StorageFull,
            format!("the disk holding {} is full ({free} bytes free)", dir.display()),
        ))
    }

    pub(super) fn storage_error(&self, what: &str, e: io::Error) -> io::Error {
        let path = self.cfg.out_dir.join(self.cfg.index_name());
        io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
    }

    /// Starts and ends about to be reported (and the ends of tasks this loop did not stop
    /// itself) go into the results journal first.
    pub(super) fn journal_events(&mut self) -> io::Result<()> {
        let Some(j) = self.journal.as_mut() else { return Ok(()) };
        let aborted = &self.aborted;
        j.note(&self.events, |id, attempt| !aborted.contains(&(id, attempt)));
        j.write()
    }

    /// Output storage failed: stop every task. The ends not yet reported are dropped (their
    /// output may be cut short or unindexed), so those tasks run again on resume, as new
    /// attempts: their starts are journaled if the disk still takes them.
    pub(super) fn stop_on_fault(&mut self, e: io::Error) -> io::Error {
        self.queue.clear();
        self.abort_all();
        if let Some(j) = self.journal.as_mut() {
            j.note(&self.events, |_, _| false);
            if let Err(e) = j.write() {
                tracing::warn!(agent = self.cfg.agent, error = %e, "the starts of the tasks stopped are not journaled");
            }
        }
        self.events.clear();
        // A full disk is the likeliest cause of any write error, and the most useful to name.
        let e = self.disk_full().unwrap_or(e);
        tracing::error!(agent = self.cfg.agent, error = %e, "output storage failed");
        e
    }

    /// Before ends are reported: is the disk holding the output full? A task that wrote to a
    /// full disk may still exit 0 (dash's printf does), its output cut short. Checked before
    /// every report while space is low, and every few seconds otherwise (statfs can be a
    /// server round trip on a network filesystem).
    pub(super) fn space_fault(&mut self) -> Option<io::Error> {
        if self.cfg.output == OutputMode::None {
            return None;
        }
        let now = Instant::now();
        if !self.space_low && self.space_checked.is_some_and(|t| now.duration_since(t) < SPACE_CHECK_EVERY) {
            return None;
        }
        self.space_checked = Some(now);
        let free = htc_host::free_bytes(&self.cfg.out_dir)?;
        self.space_low = free < SPACE_LOW;
        self.disk_full()
    }
}
