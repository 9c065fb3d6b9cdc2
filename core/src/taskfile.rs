//! The task file format: one task per line, `#` comments, `#HTC` default directives and
//! `[key=value …]` per-line options. See `docs/task-file.md` for the user-facing description.
//!
//! The parser streams: it holds one line at a time, so a 10 M-line file costs no more memory
//! than a 10-line one, and commands are handed out as raw bytes (non-UTF-8 is preserved).

use std::fmt;
use std::io::{self, BufRead};

use crate::sweep::{Sweep, Template};

/// Longest accepted line, in bytes, including options. Longer lines are an error, not a truncation.
pub const MAX_LINE: usize = 128 * 1024;
/// The longest command `sh -c` can be given: the kernel's limit for one argument
/// (`MAX_ARG_STRLEN`, 128 KiB with its terminating NUL).
pub const MAX_COMMAND: usize = 128 * 1024 - 1;
/// Most distinct task classes in one file (class ids are `u16`).
pub const MAX_CLASSES: usize = 4096;
pub const MAX_RETRIES: u32 = 100;
/// Devices one task may ask for (`gpus=`).
pub const MAX_GPUS: u32 = 64;
/// Durations are kept in milliseconds in a `u32`: about 49 days.
pub const MAX_DURATION_MS: u64 = u32::MAX as u64;

pub use crate::after::{Kind, Needs};
use crate::attempts::{Growing, RetryOn, Rules};
pub use crate::shape::{output_cap, TaskShape, DEFAULT_RETRIES, MAX_CORES, MAX_STUCK_S};

/// One parsed task. `command` borrows the parser's line buffer.
#[derive(Debug, PartialEq, Eq)]
pub struct Task<'a> {
    /// 1-based line number in the file.
    pub line: u64,
    /// Byte offset of `command` in the file, so a copy of the file can serve as the task store.
    pub offset: u64,
    pub options: TaskShape,
    pub command: &'a [u8],
    /// True when the command needs `/bin/sh -c`; false when it can be exec'd directly.
    pub shell: bool,
    /// Made from a sweep's template (`sweep`): `command` is not in the file, `offset` is the
    /// template's.
    pub generated: bool,
    /// The earlier tasks it waits for (`after=`, `afterany=`).
    pub after: &'a Needs,
    /// Its rules for its attempts (`mem=4G*2`, `retry_on=oom`): `options.rules` says whether
    /// there are any, and `options` holds the first attempt's values.
    pub rules: &'a Rules,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ErrorKind {
    Io(String),
    LineTooLong,
    NulByte,
    Empty,
    UnclosedOptions,
    MissingCommand,
    BadOptionSyntax(String),
    UnknownOption(String),
    BadValue {
        key: &'static str,
        value: String,
        why: &'static str,
    },
    /// `after=` or `afterany=` that names no earlier tasks.
    BadNeeds {
        key: &'static str,
        value: String,
        why: String,
    },
    TooManyClasses,
    InvalidDirective,
    /// A FIFO would block the reader and a device such as `/dev/zero` never end.
    NotAFile(&'static str),
    /// Something the shell would refuse (`shellsyntax`).
    ShellSyntax(&'static str),
    CommandTooLong(usize),
    /// A bad `#HTC sweep` line, or a sweep that could not be made.
    Sweep(String),
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ErrorKind::Io(e) => write!(f, "cannot read: {e}"),
            ErrorKind::LineTooLong => write!(f, "line longer than {MAX_LINE} bytes"),
            ErrorKind::NulByte => write!(f, "NUL byte in line (binary file?)"),
            ErrorKind::Empty => write!(f, "no tasks in file (only blank lines and comments, or empty)"),
            ErrorKind::UnclosedOptions => write!(f, "option block '[' is not closed by ']'"),
            ErrorKind::MissingCommand => write!(f, "options but no command"),
            ErrorKind::BadOptionSyntax(s) => write!(f, "expected key=value, found '{s}'"),
            ErrorKind::UnknownOption(k) => {
                write!(f, "unknown option '{k}' (known: cores, mem, gpus, priority, exclusive, preemptible, affinity, timeout, retries, retry_on, stuck, class, runtime, max_output, after, afterany)")
            }
            ErrorKind::BadValue { key, value, why } => write!(f, "bad value '{value}' for {key}: {why}"),
            ErrorKind::BadNeeds { key, value, why } => write!(f, "bad value '{value}' for {key}: {why}"),
            ErrorKind::TooManyClasses => write!(f, "more than {MAX_CLASSES} distinct classes"),
            ErrorKind::InvalidDirective => write!(f, "'#HTC' directive needs key=value options"),
            ErrorKind::ShellSyntax(why) => write!(f, "shell syntax: {why}"),
            ErrorKind::NotAFile(what) => write!(f, "is {what}; a task file must be a regular file"),
            ErrorKind::Sweep(why) => write!(f, "sweep: {why}"),
            ErrorKind::CommandTooLong(n) => write!(
                f,
                "command of {n} bytes; the longest a shell can be given is {MAX_COMMAND} bytes (the kernel's limit for one argument)"
            ),
        }
    }
}

/// A task file error, displayed as `file:line:column: reason` (the GNU convention editors jump to).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct TaskFileError {
    pub file: String,
    /// 1-based; 0 when the error concerns the whole file.
    pub line: u64,
    /// 1-based byte column; 0 when the error concerns the whole line.
    pub column: usize,
    pub kind: ErrorKind,
}

impl fmt::Display for TaskFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.line, self.column) {
            (0, _) => write!(f, "{}: {}", self.file, self.kind),
            (l, 0) => write!(f, "{}:{}: {}", self.file, l, self.kind),
            (l, c) => write!(f, "{}:{}:{}: {}", self.file, l, c, self.kind),
        }
    }
}

/// Streaming parser over any `BufRead`.
pub struct Parser<R> {
    reader: R,
    file: String,
    line_no: u64,
    buf: Vec<u8>,
    /// Bytes consumed before the current line.
    line_start: u64,
    pos: u64,
    defaults: TaskShape,
    /// What the lines after an `#HTC after=…` wait for, and what the current line does.
    default_needs: Needs,
    needs: Needs,
    /// The same for rules for attempts: the directives', and the current line's.
    default_rules: Rules,
    rules: Rules,
    /// `adding`: `after=` ids are the run's, not this file's.
    adding: bool,
    classes: Vec<String>,
    tasks: u64,
    eof: bool,
    /// Where `rows=` files of sweeps are looked for (the task file's directory).
    dir: Option<std::path::PathBuf>,
    /// A `#HTC sweep` line waiting for its template: (sweep, line, column).
    pending: Option<(Sweep, u64, usize)>,
    active: Option<Active>,
    /// The command of the last generated task.
    generated: Vec<u8>,
    /// (line of the template, tasks it makes) of every sweep so far.
    sweeps: Vec<(u64, u64)>,
    /// The line of the last error returned: a sweep whose template was refused is not also
    /// said to have none.
    last_error: std::cell::Cell<u64>,
}

/// A sweep making its tasks.
struct Active {
    sweep: Sweep,
    template: Template,
    options: TaskShape,
    needs: Needs,
    rules: Rules,
    line: u64,
    offset: u64,
    /// The next combination is the first.
    first: bool,
}

impl<R: BufRead> Parser<R> {
    pub fn new(reader: R, file: impl Into<String>) -> Self {
        Parser {
            reader,
            file: file.into(),
            line_no: 0,
            buf: Vec::with_capacity(256),
            line_start: 0,
            pos: 0,
            defaults: TaskShape::default(),
            default_needs: Needs::default(),
            needs: Needs::default(),
            default_rules: Rules::default(),
            rules: Rules::default(),
            adding: false,
            classes: vec!["default".to_string()],
            tasks: 0,
            eof: false,
            dir: None,
            pending: None,
            active: None,
            generated: Vec::new(),
            sweeps: Vec::new(),
            last_error: std::cell::Cell::new(0),
        }
    }

    /// Looks for sweeps' `rows=` files relative to `dir` (the task file's directory) instead of
    /// the current directory.
    pub fn with_dir(mut self, dir: impl Into<std::path::PathBuf>) -> Self {
        self.dir = Some(dir.into());
        self
    }

    /// (line of the template, tasks it makes) of every sweep met so far.
    pub fn sweeps(&self) -> &[(u64, u64)] {
        &self.sweeps
    }

    /// Starts from other defaults than `TaskShape::default()` (e.g. a site's or the user's
    /// `--retries`); `#HTC` lines and per-line options still override them.
    pub fn with_defaults(mut self, defaults: TaskShape) -> Self {
        self.defaults = defaults;
        self
    }

    /// Lines added to a run that has tasks already (`htc task add --file`): `after=` may name
    /// any id, as this file's numbering is not the run's; the leader checks each against the
    /// run's tasks when it adds them.
    pub fn adding(mut self) -> Self {
        self.adding = true;
        self
    }

    /// Class names, indexed by `TaskShape::class`. Index 0 is `default`.
    pub fn classes(&self) -> &[String] {
        &self.classes
    }

    /// Number of tasks returned so far.
    pub fn tasks(&self) -> u64 {
        self.tasks
    }

    fn err(&self, column: usize, kind: ErrorKind) -> TaskFileError {
        self.last_error.set(self.line_no);
        TaskFileError { file: self.file.clone(), line: self.line_no, column, kind }
    }

    /// Reads one line into `buf` without ever holding more than `MAX_LINE` bytes of it.
    /// Returns false at end of file.
    fn read_line(&mut self) -> Result<bool, TaskFileError> {
        self.buf.clear();
        self.line_start = self.pos;
        let mut too_long = false;
        let mut any = false;
        loop {
            let chunk = match self.reader.fill_buf() {
                Ok(c) => c,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.err(0, ErrorKind::Io(e.to_string()))),
            };
            if chunk.is_empty() {
                break;
            }
            any = true;
            let (take, done) = match chunk.iter().position(|&b| b == b'\n') {
                Some(i) => (i + 1, true),
                None => (chunk.len(), false),
            };
            if !too_long {
                if self.buf.len() + take > MAX_LINE + 2 {
                    too_long = true;
                } else {
                    self.buf.extend_from_slice(&chunk[..take]);
                }
            }
            self.reader.consume(take);
            self.pos += take as u64;
            if done {
                break;
            }
        }
        if !any {
            return Ok(false);
        }
        self.line_no += 1;
        if too_long {
            return Err(self.err(0, ErrorKind::LineTooLong));
        }
        if self.buf.last() == Some(&b'\n') {
            self.buf.pop();
        }
        if self.buf.last() == Some(&b'\r') {
            self.buf.pop();
        }
        if self.buf.len() > MAX_LINE {
            return Err(self.err(0, ErrorKind::LineTooLong));
        }
        Ok(true)
    }

    /// Returns the next task, `Ok(None)` at the end, or the error of the current line. After an
    /// error the parser can go on with the next line, so a checker can list several errors.
    pub fn next_task(&mut self) -> Result<Option<Task<'_>>, TaskFileError> {
        if self.advance_sweep()? {
            return Ok(Some(self.generated_task()));
        }
        loop {
            if self.eof || !self.read_line()? {
                self.eof = true;
                return self.at_end().map(|()| None);
            }
            // The line after a sweep's directive was refused: it was the template, and the sweep
            // goes with it (the next line is not taken for one).
            if self.pending.as_ref().is_some_and(|p| self.last_error.get() > p.1) {
                self.pending = None;
            }
            if let Some(i) = self.buf.iter().position(|&b| b == 0) {
                return Err(self.err(i + 1, ErrorKind::NulByte));
            }
            let start = self.buf.iter().position(|b| !is_blank(*b)).unwrap_or(self.buf.len());
            let end = self.buf.iter().rposition(|b| !is_blank(*b)).map_or(start, |i| i + 1);
            if start >= end {
                continue;
            }
            if self.buf[start] == b'#' {
                self.comment(start, end)?;
                continue;
            }
            let mut options = self.defaults;
            self.needs.clone_from(&self.default_needs);
            self.rules.clone_from(&self.default_rules);
            let cmd_start = self.line_options(start, end, &mut options)?;
            options.rules = !self.rules.is_empty();
            let shell = self.check_command(cmd_start, end)?;
            let offset = self.line_start + cmd_start as u64;
            if self.pending.is_some() {
                self.start_sweep(cmd_start, end, options, offset)?;
                if self.advance_sweep()? {
                    return Ok(Some(self.generated_task()));
                }
                continue;
            }
            self.tasks += 1;
            let command = &self.buf[cmd_start..end];
            let (after, rules) = (&self.needs, &self.rules);
            return Ok(Some(Task {
                line: self.line_no,
                offset,
                options,
                command,
                shell,
                generated: false,
                after,
                rules,
            }));
        }
    }

    /// The file ended: a sweep with no template line is an error, and so is a file of no task.
    fn at_end(&mut self) -> Result<(), TaskFileError> {
        if let Some((_, line, col)) = self.pending.take().filter(|p| self.last_error.get() < p.1) {
            return Err(TaskFileError {
                file: self.file.clone(),
                line,
                column: col,
                kind: ErrorKind::Sweep("no task line after it to be its template".into()),
            });
        }
        if self.tasks == 0 {
            return Err(TaskFileError { file: self.file.clone(), line: 0, column: 0, kind: ErrorKind::Empty });
        }
        Ok(())
    }

    /// A comment line (`buf[start..end]`, starting with `#`): an `#HTC` directive sets the
    /// defaults of the lines after it, or starts a sweep; any other comment is nothing.
    fn comment(&mut self, start: usize, end: usize) -> Result<(), TaskFileError> {
        let rest = &self.buf[start..end];
        if !(rest.starts_with(b"#HTC") && rest.get(4).is_none_or(|b| is_blank(*b))) {
            return Ok(());
        }
        let (s, e) = (start + 4, end);
        let words = String::from_utf8_lossy(&self.buf[s..e]).into_owned();
        if let Some(args) =
            words.trim_start().strip_prefix("sweep").filter(|a| a.is_empty() || a.starts_with([' ', '\t']))
        {
            let at = s + (words.len() - words.trim_start().len()) + 5;
            return self.sweep_directive(args, at, start);
        }
        let mut opts = self.defaults;
        // A directive's `after=` replaces an earlier directive's: the lines after it wait for
        // what it names.
        let mut needs = Needs::default();
        // Rules add up as the other options do: a later directive's replace only what it names.
        let mut rules = self.default_rules.clone();
        if !self.parse_options(s, e, &mut opts, &mut needs, &mut rules)? {
            return Err(self.err(start + 1, ErrorKind::InvalidDirective));
        }
        self.defaults = opts;
        self.default_rules = rules;
        if !needs.is_empty() {
            self.default_needs = needs;
        }
        Ok(())
    }

    /// A task line's own `[options]`, if it starts with them, into `options`; returns where its
    /// command starts.
    fn line_options(&mut self, start: usize, end: usize, options: &mut TaskShape) -> Result<usize, TaskFileError> {
        if !(self.buf[start] == b'[' && self.buf.get(start + 1).is_some_and(|b| !is_blank(*b))) {
            return Ok(start);
        }
        let close = match self.buf[start..end].iter().position(|&b| b == b']') {
            Some(i) => start + i,
            None => return Err(self.err(start + 1, ErrorKind::UnclosedOptions)),
        };
        let (mut needs, mut rules) = (std::mem::take(&mut self.needs), std::mem::take(&mut self.rules));
        let parsed = self.parse_options(start + 1, close, options, &mut needs, &mut rules);
        (self.needs, self.rules) = (needs, rules);
        parsed?;
        let mut cmd_start = close + 1;
        if cmd_start < end && !is_blank(self.buf[cmd_start]) {
            return Err(self.err(
                cmd_start + 1,
                ErrorKind::BadOptionSyntax("text right after ']' (put a space before the command)".into()),
            ));
        }
        while cmd_start < end && is_blank(self.buf[cmd_start]) {
            cmd_start += 1;
        }
        if cmd_start >= end {
            return Err(self.err(close + 1, ErrorKind::MissingCommand));
        }
        Ok(cmd_start)
    }

    /// The command `buf[cmd_start..end]`: not too long, and valid shell where it needs a shell;
    /// says whether it does.
    fn check_command(&self, cmd_start: usize, end: usize) -> Result<bool, TaskFileError> {
        let command = &self.buf[cmd_start..end];
        if command.len() > MAX_COMMAND {
            return Err(self.err(cmd_start + 1, ErrorKind::CommandTooLong(command.len())));
        }
        let shell = needs_shell(command);
        if let Err((at, why)) = if shell { crate::shellsyntax::check(command) } else { Ok(()) } {
            return Err(self.err(cmd_start + at + 1, ErrorKind::ShellSyntax(why)));
        }
        Ok(shell)
    }

    /// The task line after `#HTC sweep` (`buf[cmd_start..end]`) becomes the sweep's template.
    fn start_sweep(
        &mut self,
        cmd_start: usize,
        end: usize,
        options: TaskShape,
        offset: u64,
    ) -> Result<(), TaskFileError> {
        let (sweep, _, _) = self.pending.take().expect("a sweep is pending");
        let template = sweep.compile(&self.buf[cmd_start..end]);
        if !template.uses_params() {
            let names = sweep.names().iter().map(|n| format!("{{{n}}}")).collect::<Vec<_>>().join(", ");
            let why = format!("this template after `#HTC sweep` uses none of {names}");
            return Err(self.err(cmd_start + 1, ErrorKind::Sweep(why)));
        }
        self.sweeps.push((self.line_no, sweep.tasks().unwrap_or(0)));
        let (needs, rules) = (self.needs.clone(), self.rules.clone());
        let line = self.line_no;
        self.active = Some(Active { sweep, template, options, needs, rules, line, offset, first: true });
        Ok(())
    }

    /// `#HTC sweep WORDS` at byte `at` of the line (the directive at `start`): parsed, it waits
    /// for the task line that is its template.
    fn sweep_directive(&mut self, words: &str, at: usize, start: usize) -> Result<(), TaskFileError> {
        if self.pending.is_some() {
            self.pending = None;
            return Err(
                self.err(start + 1, ErrorKind::Sweep("a second `#HTC sweep` before the first's task line".into()))
            );
        }
        let sweep = Sweep::parse(words, self.dir.as_deref())
            .map_err(|(col, why)| self.err(at + col + 1, ErrorKind::Sweep(why)))?;
        self.pending = Some((sweep, self.line_no, start + 1));
        Ok(())
    }

    /// Moves the active sweep to its next task (false, and the sweep ended, after its last; false
    /// without one).
    fn advance_sweep(&mut self) -> Result<bool, TaskFileError> {
        let Some(a) = self.active.as_mut() else { return Ok(false) };
        let file = &self.file;
        let err = |column, kind| TaskFileError { file: file.clone(), line: a.line, column, kind };
        let more = if a.first { a.sweep.start().map(|_| true) } else { a.sweep.advance() };
        a.first = false;
        if !more.map_err(|e| err(0, ErrorKind::Sweep(e)))? {
            self.active = None;
            return Ok(false);
        }
        a.template.fill(&a.sweep.values(), &mut self.generated);
        if self.generated.len() > MAX_COMMAND {
            return Err(err(0, ErrorKind::CommandTooLong(self.generated.len())));
        }
        // A value is one word, but a template that puts it inside quotes of its own (`'{x}'`)
        // can still make a line the shell refuses.
        if needs_shell(&self.generated) {
            if let Err((_, why)) = crate::shellsyntax::check(&self.generated) {
                let values = a.sweep.values().join(" ");
                return Err(err(0, ErrorKind::Sweep(format!("with the values {values} the command is not valid shell ({why}); write {{name}} outside quotes"))));
            }
        }
        self.tasks += 1;
        Ok(true)
    }

    /// The task `advance_sweep` made.
    fn generated_task(&self) -> Task<'_> {
        let a = self.active.as_ref().expect("a sweep is active");
        let shell = needs_shell(&self.generated);
        let (line, offset, options) = (a.line, a.offset, a.options);
        let (after, rules) = (&a.needs, &a.rules);
        Task { line, offset, options, command: &self.generated, shell, generated: true, after, rules }
    }

    /// Parses `key=value` words (separated by blanks or commas) in `buf[s..e]` into `opts`,
    /// `after=`/`afterany=` into `needs`, and how attempts grow or are retried into `rules`.
    /// Returns whether any option was present.
    fn parse_options(
        &mut self,
        s: usize,
        e: usize,
        opts: &mut TaskShape,
        needs: &mut Needs,
        rules: &mut Rules,
    ) -> Result<bool, TaskFileError> {
        let mut i = s;
        let mut any = false;
        while i < e {
            let b = self.buf[i];
            if is_blank(b) || b == b',' {
                i += 1;
                continue;
            }
            let w_start = i;
            while i < e && !is_blank(self.buf[i]) && self.buf[i] != b',' {
                i += 1;
            }
            let word = String::from_utf8_lossy(&self.buf[w_start..i]).into_owned();
            let col = w_start + 1;
            // Flags are bare words.
            if word == "exclusive" || word == "preemptible" {
                if word == "exclusive" {
                    opts.exclusive = true;
                } else {
                    opts.preemptible = true;
                }
                any = true;
                continue;
            }
            let Some((key, value)) = word.split_once('=') else {
                return Err(self.err(col, ErrorKind::BadOptionSyntax(word)));
            };
            if let Some(kind) = [Kind::After, Kind::AfterAny].into_iter().find(|k| k.option() == key) {
                // Tasks before this one: those counted so far (a sweep's all wait alike).
                let last = if self.adding { u64::MAX } else { self.tasks };
                needs.parse(value, kind, last).map_err(|why| {
                    self.err(col, ErrorKind::BadNeeds { key: kind.option(), value: value.to_string(), why })
                })?;
                any = true;
                continue;
            }
            if !self.set_rule(key, value, col, opts, rules)? {
                self.set_option(key, value, col, opts)?;
            }
            any = true;
        }
        Ok(any)
    }

    /// A `mem=`, `timeout=` or `cores=` that grows from attempt to attempt (`4G*2`, `4G+2G`,
    /// `4G/8G/32G`: `opts` gets the first attempt's), or a `retry_on=`, into `rules`; a plain
    /// value of those three clears a growth a directive gave. False for any other option, which
    /// is `set_option`'s.
    fn set_rule(
        &mut self,
        key: &str,
        value: &str,
        col: usize,
        opts: &mut TaskShape,
        rules: &mut Rules,
    ) -> Result<bool, TaskFileError> {
        let bad = |key: &'static str, why: &'static str| ErrorKind::BadValue { key, value: value.to_string(), why };
        if key == "retry_on" {
            let why =
                "ends separated by '/': oom, timeout, signal, stuck, exit values or ranges (104, 130-145), or any";
            rules.retry_on = Some(RetryOn::parse(value).map_err(|_| self.err(col, bad("retry_on", why)))?);
            return Ok(true);
        }
        let (slot, key, why): (&mut Option<Growing>, &'static str, &'static str) = match key {
            "mem" => (&mut rules.mem, "mem", "a size like 4G, or how it grows: 4G*2, 4G+2G, 4G/8G/32G (max 4096T)"),
            "timeout" => {
                (&mut rules.timeout, "timeout", "a duration like 10m, or how it grows: 10m*2, 10m+5m, 10m/30m/2h")
            }
            "cores" => (&mut rules.cores, "cores", "an integer from 1 to 4096, or how it grows: 2*2, 2+2, 2/4/16"),
            _ => return Ok(false),
        };
        if !value.contains(['*', '+', '/']) {
            *slot = None;
            return Ok(false);
        }
        let g = match key {
            "mem" => Growing::parse(value, |v| parse_mem_mb(v).map(u64::from)),
            "timeout" => Growing::parse(value, |v| parse_duration_ms(v).map(u64::from)),
            _ => Growing::parse(value, |v| parse_uint(v).filter(|&n| n >= 1 && n <= MAX_CORES as u64)),
        };
        let g = g.map_err(|_| self.err(col, bad(key, why)))?;
        let first = g.first();
        match key {
            "mem" => opts.mem_mb = first as u32,
            "timeout" => opts.timeout_ms = first as u32,
            _ => opts.cores = first as u16,
        }
        *slot = Some(g);
        Ok(true)
    }

    /// One `key=value` option at column `col` into `opts`.
    fn set_option(&mut self, key: &str, value: &str, col: usize, opts: &mut TaskShape) -> Result<(), TaskFileError> {
        let bad = |key: &'static str, why: &'static str| ErrorKind::BadValue { key, value: value.to_string(), why };
        match key {
            "cores" => {
                opts.cores = parse_uint(value)
                    .filter(|&n| n >= 1 && n <= MAX_CORES as u64)
                    .ok_or_else(|| self.err(col, bad("cores", "an integer from 1 to 4096")))?
                    as u16
            }
            "mem" => {
                opts.mem_mb =
                    parse_mem_mb(value).ok_or_else(|| self.err(col, bad("mem", "a size like 512M, 4G (max 4096T)")))?
            }
            "gpus" => {
                opts.gpus = parse_uint(value)
                    .filter(|&n| n <= MAX_GPUS as u64)
                    .ok_or_else(|| self.err(col, bad("gpus", "an integer from 0 to 64")))?
                    as u8
            }
            "priority" => {
                opts.priority = value
                    .parse::<i16>()
                    .ok()
                    .filter(|_| value.bytes().all(|b| b.is_ascii_digit() || b == b'-'))
                    .ok_or_else(|| self.err(col, bad("priority", "an integer from -32768 to 32767")))?
            }
            "affinity" => {
                if value.is_empty() || value.len() > 256 {
                    return Err(self.err(col, bad("affinity", "a key of 1 to 256 characters")));
                }
                opts.affinity = crate::affinity::key_hash(value.as_bytes());
            }
            "timeout" => {
                opts.timeout_ms = parse_duration_ms(value).ok_or_else(|| {
                    self.err(col, bad("timeout", "a duration like 90, 90s, 10m, 1h30m, 1:30:00 (0 = none)"))
                })?
            }
            "stuck" => {
                opts.stuck_s =
                    parse_duration_ms(value).map(|ms| ms.div_ceil(1000)).filter(|&s| s <= MAX_STUCK_S).ok_or_else(
                        || self.err(col, bad("stuck", "a duration like 30m, 2h (0 = no watch; under 49 days)")),
                    )?
            }
            "runtime" => {
                opts.runtime_ms = parse_duration_ms(value)
                    .ok_or_else(|| self.err(col, bad("runtime", "a duration like 2s, 5m, 1h")))?
            }
            "max_output" => {
                opts.max_output = parse_bytes(value)
                    .and_then(output_cap::encode)
                    .ok_or_else(|| self.err(col, bad("max_output", "a size like 100K, 10M, 2G (below 32G; 0 = all)")))?
            }
            "retries" => {
                opts.retries = parse_uint(value)
                    .filter(|&n| n <= MAX_RETRIES as u64)
                    .ok_or_else(|| self.err(col, bad("retries", "an integer from 0 to 100")))?
                    as u8
            }
            "class" => opts.class = self.class_of(value, col)?,
            _ => return Err(self.err(col, ErrorKind::UnknownOption(key.to_string()))),
        }
        Ok(())
    }

    /// The number of class `value` (`class=`), a new one for a name not seen before.
    fn class_of(&mut self, value: &str, col: usize) -> Result<u16, TaskFileError> {
        let ok = !value.is_empty()
            && value.len() <= 64
            && value.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
        if !ok {
            let why = "1 to 64 characters of A-Z a-z 0-9 _ . -";
            return Err(self.err(col, ErrorKind::BadValue { key: "class", value: value.to_string(), why }));
        }
        match self.classes.iter().position(|c| c == value) {
            Some(i) => Ok(i as u16),
            None if self.classes.len() >= MAX_CLASSES => Err(self.err(col, ErrorKind::TooManyClasses)),
            None => {
                self.classes.push(value.to_string());
                Ok((self.classes.len() - 1) as u16)
            }
        }
    }
}

fn is_blank(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

fn parse_uint(s: &str) -> Option<u64> {
    if s.is_empty() || s.len() > 12 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// `4096`, `100K`, `10M`, `2G` (binary units; a bare number is bytes). Result in bytes.
pub fn parse_bytes(s: &str) -> Option<u64> {
    let (num, mult): (&str, u64) = match s.as_bytes().last()? {
        b'K' | b'k' => (&s[..s.len() - 1], 1 << 10),
        b'M' | b'm' => (&s[..s.len() - 1], 1 << 20),
        b'G' | b'g' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    parse_uint(num)?.checked_mul(mult)
}

/// `512`, `512M`, `4G`, `100K`, `1T` (binary units; a bare number is MiB). Result in MiB.
pub fn parse_mem_mb(s: &str) -> Option<u32> {
    let (num, mult_kb): (&str, u64) = match s.as_bytes().last()? {
        b'K' | b'k' => (&s[..s.len() - 1], 1),
        b'M' | b'm' => (&s[..s.len() - 1], 1024),
        b'G' | b'g' => (&s[..s.len() - 1], 1024 * 1024),
        b'T' | b't' => (&s[..s.len() - 1], 1024 * 1024 * 1024),
        _ => (s, 1024),
    };
    let kb = parse_uint(num)?.checked_mul(mult_kb)?;
    let mb = kb.div_ceil(1024);
    u32::try_from(mb).ok()
}

/// Durations: `90` (seconds), `1.5s`, `250ms`, `10m`, `2h`, `1d`, `1h30m`, or Slurm's `[[H:]M:]S`.
/// Result in milliseconds; `0` means none.
pub fn parse_duration_ms(s: &str) -> Option<u32> {
    if s.is_empty() || s.len() > 32 {
        return None;
    }
    let total: u64 = if s.contains(':') {
        let parts: Vec<&str> = s.split(':').collect();
        if parts.len() > 3 {
            return None;
        }
        let mut secs: u64 = 0;
        for p in &parts {
            secs = secs.checked_mul(60)?.checked_add(parse_uint(p)?)?;
        }
        secs.checked_mul(1000)?
    } else if s.bytes().all(|b| b.is_ascii_digit()) {
        parse_uint(s)?.checked_mul(1000)?
    } else {
        let mut total: u64 = 0;
        let b = s.as_bytes();
        let mut i = 0;
        while i < b.len() {
            let n0 = i;
            while i < b.len() && (b[i].is_ascii_digit() || b[i] == b'.') {
                i += 1;
            }
            let num = &s[n0..i];
            let u0 = i;
            while i < b.len() && b[i].is_ascii_alphabetic() {
                i += 1;
            }
            let unit_ms: f64 = match &s[u0..i] {
                "ms" => 1.0,
                "s" => 1000.0,
                "m" => 60_000.0,
                "h" => 3_600_000.0,
                "d" => 86_400_000.0,
                _ => return None,
            };
            if num.is_empty() || num.bytes().filter(|&c| c == b'.').count() > 1 || num.len() > 12 {
                return None;
            }
            let v: f64 = num.parse().ok()?;
            // A positive duration never rounds down to 0, which would mean "none".
            let ms = (v * unit_ms).round().max(if v > 0.0 { 1.0 } else { 0.0 });
            if !ms.is_finite() || ms > MAX_DURATION_MS as f64 {
                return None;
            }
            total = total.checked_add(ms as u64)?;
        }
        total
    };
    u32::try_from(total).ok()
}

/// Whether `command` must go through `/bin/sh -c`. A command is exec'd directly only when every
/// byte is plainly literal and its first word is neither an assignment nor a shell builtin, so
/// direct exec is exactly what the shell would have done.
pub fn needs_shell(command: &[u8]) -> bool {
    // A table, not a search per byte: this runs on every line of files of millions of lines.
    const LITERAL: [bool; 256] = {
        let mut t = [false; 256];
        let mut b = 0;
        while b < 256 {
            let c = b as u8;
            t[b] = c.is_ascii_alphanumeric()
                || matches!(c, b'-' | b'_' | b'.' | b'/' | b',' | b':' | b'=' | b'+' | b'%' | b'@' | b'^' | b' ');
            b += 1;
        }
        t
    };
    if !command.iter().all(|&b| LITERAL[b as usize]) {
        return true;
    }
    let first = command.split(|&b| b == b' ').find(|w| !w.is_empty()).unwrap_or(b"");
    if first.contains(&b'=') {
        return true;
    }
    // Builtins and reserved words: they mean nothing to exec.
    matches!(
        first,
        b"." | b":"
            | b"alias"
            | b"bg"
            | b"break"
            | b"cd"
            | b"command"
            | b"continue"
            | b"eval"
            | b"exec"
            | b"exit"
            | b"export"
            | b"fc"
            | b"fg"
            | b"getopts"
            | b"hash"
            | b"jobs"
            | b"local"
            | b"read"
            | b"readonly"
            | b"return"
            | b"set"
            | b"shift"
            | b"source"
            | b"times"
            | b"trap"
            | b"type"
            | b"ulimit"
            | b"umask"
            | b"unalias"
            | b"unset"
            | b"wait"
            | b"if"
            | b"then"
            | b"else"
            | b"elif"
            | b"fi"
            | b"case"
            | b"esac"
            | b"for"
            | b"while"
            | b"until"
            | b"do"
            | b"done"
            | b"function"
    )
}

/// Counts from a whole-file check.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Summary {
    pub tasks: u64,
    /// Per class: (name, tasks, core-seconds from runtime hints, tasks without a hint).
    pub classes: Vec<ClassSummary>,
    pub shell_tasks: u64,
    pub max_cores: u16,
    /// (line of the template, tasks it makes) of each `#HTC sweep`.
    pub sweeps: Vec<(u64, u64)>,
    /// Each different set of rules for attempts (`mem=4G*2 retry_on=oom`), the first
    /// `MAX_RULE_SETS`: how it reads, what its attempts ask, and how many tasks have it.
    pub rule_sets: Vec<RuleSet>,
    /// Tasks with rules for their attempts, those of sets past the first ones included.
    pub with_rules: u64,
}

/// One set of rules for attempts in a checked file (`Summary::rule_sets`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RuleSet {
    pub rules: String,
    /// What each attempt its budget allows asks, e.g. `mem 4096M, 8192M, 16384M`.
    pub asks: String,
    pub tasks: u64,
}

/// Sets of rules `htc check` shows one by one.
pub const MAX_RULE_SETS: usize = 8;

/// What attempts 1 to `retries + 1` (at most 6) of a task of `shape` and `rules` ask, for
/// the fields that grow.
pub fn describe_asks(shape: &TaskShape, rules: &Rules) -> String {
    let n = (shape.retries as u32 + 1).min(6);
    let asks: Vec<TaskShape> = (1..=n).map(|a| rules.shape_at(shape, a)).collect();
    let mut fields = Vec::new();
    let list = |f: &dyn Fn(&TaskShape) -> String| asks.iter().map(f).collect::<Vec<_>>().join(", ");
    if rules.mem.is_some() {
        fields.push(format!("mem {}", list(&|s| crate::attempts::mem_word(s.mem_mb as u64))));
    }
    if rules.timeout.is_some() {
        fields.push(format!("timeout {}", list(&|s| crate::attempts::duration_word(s.timeout_ms as u64))));
    }
    if rules.cores.is_some() {
        fields.push(format!("cores {}", list(&|s| s.cores.to_string())));
    }
    fields.join("; ")
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClassSummary {
    pub name: String,
    pub tasks: u64,
    pub core_seconds: f64,
    pub without_runtime: u64,
}

impl Summary {
    pub fn core_seconds(&self) -> f64 {
        self.classes.iter().map(|c| c.core_seconds).sum()
    }

    fn count_rules(&mut self, shape: &TaskShape, rules: &Rules) {
        self.with_rules += 1;
        let (said, asks) = (rules.describe(), describe_asks(shape, rules));
        let full = self.rule_sets.len() >= MAX_RULE_SETS;
        match self.rule_sets.iter_mut().find(|r| r.rules == said && r.asks == asks) {
            Some(r) => r.tasks += 1,
            None if !full => self.rule_sets.push(RuleSet { rules: said, asks, tasks: 1 }),
            None => {}
        }
    }
}

/// Checks a whole file. Returns the summary, or up to `max_errors` errors (at least one).
pub fn check<R: BufRead>(reader: R, file: &str, max_errors: usize) -> Result<Summary, Vec<TaskFileError>> {
    check_in(Parser::new(reader, file), max_errors)
}

fn check_in<R: BufRead>(mut p: Parser<R>, max_errors: usize) -> Result<Summary, Vec<TaskFileError>> {
    let mut errors = Vec::new();
    let mut per_class: Vec<(u64, f64, u64)> = vec![(0, 0.0, 0)];
    let mut s = Summary::default();
    loop {
        match p.next_task() {
            Ok(Some(t)) => {
                let o = t.options;
                let shell = t.shell;
                if per_class.len() <= o.class as usize {
                    per_class.resize(o.class as usize + 1, (0, 0.0, 0));
                }
                let c = &mut per_class[o.class as usize];
                c.0 += 1;
                if o.runtime_ms == 0 {
                    c.2 += 1;
                } else {
                    c.1 += o.cores as f64 * o.runtime_ms as f64 / 1000.0;
                }
                s.tasks += 1;
                s.shell_tasks += shell as u64;
                s.max_cores = s.max_cores.max(o.cores);
                if o.rules {
                    s.count_rules(&o, t.rules);
                }
            }
            Ok(None) => break,
            Err(e) => {
                let fatal = matches!(e.kind, ErrorKind::Io(_) | ErrorKind::Empty);
                // An empty-file complaint after other errors says nothing new.
                if e.kind != ErrorKind::Empty || errors.is_empty() {
                    errors.push(e);
                }
                if fatal || errors.len() >= max_errors {
                    break;
                }
            }
        }
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    s.sweeps = p.sweeps().to_vec();
    s.classes = p
        .classes()
        .iter()
        .zip(per_class.iter().chain(std::iter::repeat(&(0, 0.0, 0))))
        .map(|(name, &(tasks, cs, without))| ClassSummary {
            name: name.clone(),
            tasks,
            core_seconds: cs,
            without_runtime: without,
        })
        .filter(|c| c.tasks > 0)
        .collect();
    Ok(s)
}

/// Refuses what is not a regular file before opening it (opening a FIFO blocks), by what it is.
pub fn require_regular(path: &std::path::Path) -> Result<(), TaskFileError> {
    use std::os::unix::fs::FileTypeExt;
    let err = |kind| TaskFileError { file: path.display().to_string(), line: 0, column: 0, kind };
    let t = std::fs::metadata(path).map_err(|e| err(ErrorKind::Io(e.to_string())))?.file_type();
    let what = if t.is_file() {
        return Ok(());
    } else if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO (named pipe)"
    } else if t.is_char_device() || t.is_block_device() {
        "a device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    };
    Err(err(ErrorKind::NotAFile(what)))
}

/// Opens and checks a file by path; errors name the path as given.
pub fn check_path(path: &std::path::Path, max_errors: usize) -> Result<Summary, Vec<TaskFileError>> {
    let name = path.display().to_string();
    require_regular(path).map_err(|e| vec![e])?;
    let f = std::fs::File::open(path).map_err(|e| {
        vec![TaskFileError { file: name.clone(), line: 0, column: 0, kind: ErrorKind::Io(e.to_string()) }]
    })?;
    let p = Parser::new(io::BufReader::with_capacity(1 << 16, f), &name);
    check_in(p.with_dir(path.parent().unwrap_or(std::path::Path::new("."))), max_errors)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (line, options, command, shell) of every task in `text`.
    type Parsed = (u64, TaskShape, Vec<u8>, bool);

    fn all(text: &[u8]) -> Result<Vec<Parsed>, TaskFileError> {
        let mut p = Parser::new(text, "t.txt");
        let mut v = Vec::new();
        while let Some(t) = p.next_task()? {
            let at = &text[t.offset as usize..t.offset as usize + t.command.len()];
            assert_eq!(at, t.command, "offset points at the command");
            v.push((t.line, t.options, t.command.to_vec(), t.shell));
        }
        Ok(v)
    }

    /// Each task's rules for its attempts, as `Rules::describe` says them.
    fn rules(text: &[u8]) -> Result<Vec<(u32, String)>, TaskFileError> {
        let mut p = Parser::new(text, "t.txt");
        let mut v = Vec::new();
        while let Some(t) = p.next_task()? {
            assert_eq!(t.options.rules, !t.rules.is_empty(), "the flag says whether there are rules");
            v.push((t.options.mem_mb, t.rules.describe()));
        }
        Ok(v)
    }

    #[test]
    fn attempts_that_grow_and_the_ends_retried_are_a_task_s_own_or_its_directive_s() {
        let v = rules(b"#HTC mem=1G*2 retry_on=oom/130-145\na\n[mem=2G] b\n[mem=512M/1G timeout=1m+30s cores=2*1.5] c\n#HTC sweep x=1,2\n[retry_on=any] d {x}\n").unwrap();
        assert_eq!(v[0], (1024, "mem=1G*2 retry_on=oom/130-145".to_string()));
        assert_eq!(v[1], (2048, "retry_on=oom/130-145".to_string()), "a plain mem= ends the directive's growth");
        assert_eq!(v[2].0, 512, "the record asks the first attempt's");
        assert_eq!(v[2].1, "mem=512M/1G timeout=1m+30s cores=2*1.5 retry_on=oom/130-145");
        assert_eq!(v[3], (1024, "mem=1G*2 retry_on=any".to_string()), "a sweep's tasks have their line's");
        assert_eq!(v[3], v[4]);
        assert_eq!(rules(b"plain\n").unwrap(), [(0, String::new())]);
    }

    #[test]
    fn a_growth_or_retry_on_that_cannot_be_read_is_refused_where_it_is() {
        for (text, col, says) in [
            (&b"[mem=4G*1] x\n"[..], 2, "how it grows: 4G*2"),
            (b"[mem=4G+] x\n", 2, "4G+2G"),
            (b"[timeout=1m*x] x\n", 2, "10m*2"),
            (b"[cores=0+1] x\n", 2, "2*2"),
            (b"[cores=5000/1] x\n", 2, "from 1 to 4096"),
            (b"[retry_on=oom/0] x\n", 2, "oom, timeout, signal"),
            (b"[retry_on=] x\n", 2, "retry_on"),
            (b"[retry_on=stuk] x\n", 2, "stuck"),
            (b"[stuck=soon] x\n", 2, "for stuck: a duration"),
            (b"[stuck=50d] x\n", 2, "under 49 days"),
        ] {
            let e = all(text).unwrap_err();
            let shown = e.to_string();
            assert_eq!((e.line, e.column), (1, col), "{shown}");
            assert!(shown.contains(says), "{shown}");
        }
    }

    #[test]
    fn plain_lines_comments_blank_and_crlf() {
        let v = all(b"# head\n\necho a\r\n  true  \n\t\n/bin/echo x y\n").unwrap();
        assert_eq!(v.len(), 3);
        assert_eq!(v[0].0, 3);
        assert_eq!(v[0].2, b"echo a");
        assert_eq!(v[1].2, b"true");
        assert_eq!(v[2].0, 6);
        assert!(!v[2].3);
    }

    #[test]
    fn output_caps_parse_and_keep_at_least_what_was_asked() {
        let v = all(b"[max_output=10M] a\n[max_output=100K] b\n[max_output=0] c\n[max_output=3000] d\n").unwrap();
        let caps: Vec<u64> = v.iter().map(|t| output_cap::bytes(t.1.max_output)).collect();
        assert_eq!(caps, [10 << 20, 100 << 10, 0, 3072]);
        assert_eq!(output_cap::bytes(output_cap::encode(32 << 30).unwrap_or(0)), 0, "over 32G: refused");
        assert_eq!(output_cap::bytes(output_cap::encode((32 << 30) - (1 << 20)).unwrap()), (32 << 30) - (1 << 20));
        assert_eq!(output_cap::bytes(output_cap::encode((1 << 25) + 1).unwrap()), (1 << 25) + (1 << 20), "MiB, up");
        let e = all(b"[max_output=lots] a\n").unwrap_err().to_string();
        assert!(e.contains("t.txt:1:2: bad value 'lots' for max_output"), "{e}");
    }

    #[test]
    fn a_sweep_makes_its_tasks_from_the_line_after_it() {
        let text = b"echo first\n#HTC sweep x=1..3 +y=a,b,c n=1,2\n[cores=2] run {x} {y} {n} '{z}'\necho last\n";
        let mut p = Parser::new(&text[..], "t.txt");
        let mut got = Vec::new();
        while let Some(t) = p.next_task().unwrap() {
            got.push((t.line, String::from_utf8(t.command.to_vec()).unwrap(), t.options.cores, t.generated));
        }
        assert_eq!(got.len(), 8);
        assert_eq!(got[0], (1, "echo first".into(), 1, false));
        assert_eq!(got[1], (3, "run 1 a 1 '{z}'".into(), 2, true));
        assert_eq!(got[6], (3, "run 3 c 2 '{z}'".into(), 2, true));
        assert_eq!(got[7], (4, "echo last".into(), 1, false));
        assert_eq!(p.sweeps(), [(3, 6)]);
        let s = check(&text[..], "t.txt", 5).unwrap();
        assert_eq!((s.tasks, s.sweeps.clone()), (8, vec![(3, 6)]));
    }

    #[test]
    fn a_sweep_goes_with_its_refused_template_and_made_commands_are_checked() {
        let e = |t: &[u8]| check(t, "t.txt", 5).unwrap_err().iter().map(|e| e.to_string()).collect::<Vec<_>>();
        assert_eq!(
            e(b"#HTC sweep x=1,2\n[cores=0] echo {x}\necho plain\n"),
            ["t.txt:2:2: bad value '0' for cores: an integer from 1 to 4096"]
        );
        assert_eq!(
            e(b"#HTC sweep x=a,it's\necho '{x}'\n"),
            ["t.txt:2: sweep: with the values it's the command is not valid shell (single quote ' is not closed); write {name} outside quotes"]
        );
        assert_eq!(check(&b"#HTC sweep x=1..3 # three\necho {x}\n"[..], "t.txt", 5).unwrap().tasks, 3);
    }

    #[test]
    fn bad_sweeps_are_refused_with_their_place() {
        let e = |t: &[u8]| check(t, "t.txt", 5).unwrap_err().iter().map(|e| e.to_string()).collect::<Vec<_>>();
        assert_eq!(
            e(b"#HTC sweep x=1..3 +y=1,2\necho {x}\n"),
            ["t.txt:1:19: sweep: y has 2 values, x linked to it has 3"]
        );
        assert_eq!(e(b"echo a\n#HTC sweep x=1,2\n"), ["t.txt:2:1: sweep: no task line after it to be its template"]);
        assert_eq!(
            e(b"#HTC sweep x=1,2\necho {y}\n"),
            ["t.txt:2:1: sweep: this template after `#HTC sweep` uses none of {x}"]
        );
        assert_eq!(
            e(b"#HTC sweep x=1,2\n#HTC sweep y=1\necho {y}\n"),
            ["t.txt:2:1: sweep: a second `#HTC sweep` before the first's task line"]
        );
        assert_eq!(e(b"#HTC sweep rows=nope.csv\necho {y}\n").len(), 1);
    }

    #[test]
    fn last_line_without_newline() {
        let v = all(b"a\nb").unwrap();
        assert_eq!(v[1].2, b"b");
    }

    #[test]
    fn options_and_defaults() {
        let v = all(b"#HTC cores=2 timeout=1m retries=1 stuck=10m\n[class=long,runtime=30s mem=2G gpus=2 priority=-3 exclusive affinity=sample-7 preemptible stuck=90] ./sim 1\n./sim 2\n#HTC class=short\n[cores=1 stuck=0] x\n").unwrap();
        assert_eq!(
            v[0].1,
            TaskShape {
                cores: 2,
                mem_mb: 2048,
                timeout_ms: 60_000,
                retries: 1,
                class: 1,
                runtime_ms: 30_000,
                max_output: 0,
                gpus: 2,
                priority: -3,
                exclusive: true,
                affinity: crate::affinity::key_hash(b"sample-7"),
                preemptible: true,
                rules: false,
                stuck_s: 90,
            }
        );
        assert_eq!(v[0].2, b"./sim 1");
        assert_eq!((v[1].1.stuck_s, v[2].1.stuck_s), (600, 0), "the directive's, then none");
        assert_eq!(v[1].1.class, 0);
        assert_eq!(v[1].1.cores, 2);
        assert_eq!(v[2].1.class, 2);
        assert_eq!(v[2].1.cores, 1);
    }

    /// Each task's `after=`/`afterany=` ids, in order.
    fn needs(text: &[u8]) -> Result<Vec<Vec<(u64, Kind)>>, TaskFileError> {
        let mut p = Parser::new(text, "t.txt");
        let mut v = Vec::new();
        while let Some(t) = p.next_task()? {
            v.push(t.after.each().collect());
        }
        Ok(v)
    }

    #[test]
    fn tasks_wait_for_earlier_ones_by_line_by_directive_and_in_sweeps() {
        use Kind::*;
        let v =
            needs(b"a\nb\n[after=1:2 afterany=1] c\n#HTC after=3\nd\n[after=2] e\n#HTC sweep x=1,2\nf {x}\n").unwrap();
        assert_eq!(v[0], []);
        assert_eq!(v[2], [(1, After), (2, After), (1, AfterAny)]);
        assert_eq!(v[3], [(3, After)], "the directive's, for every line after it");
        assert_eq!(v[4], [(3, After), (2, After)], "a line's own beside the directive's");
        assert_eq!(v[5..], [vec![(3, After)], vec![(3, After)]], "each task of a sweep");
        assert_eq!(needs(b"a\n[after=1-1] b\n").unwrap()[1], [(1, After)]);
    }

    #[test]
    fn a_task_that_waits_for_itself_or_a_later_one_is_refused_where_it_says_so() {
        let e = needs(b"a\n[cores=1 after=2] b\n").unwrap_err();
        assert_eq!((e.line, e.column), (2, 10));
        assert!(e.to_string().contains("not before this one"), "{e}");
        let e = needs(b"[after=1] a\n").unwrap_err();
        assert!(e.to_string().contains("first task"), "{e}");
        let e = needs(b"a\n[afterany=x] b\n").unwrap_err();
        assert!(e.to_string().contains("bad value 'x' for afterany"), "{e}");
    }

    #[test]
    fn test_bracket_command_is_not_options() {
        let v = all(b"[ -f x ] && echo y\n[] [abc]cmd\n").unwrap();
        assert_eq!(v[0].2, b"[ -f x ] && echo y");
        assert!(v[0].3);
        assert_eq!(v[1].2, b"[abc]cmd");
    }

    #[test]
    fn errors_name_line_and_column() {
        let e = all(b"ok\n[cores=0] x\n").unwrap_err();
        assert_eq!((e.line, e.column), (2, 2));
        assert_eq!(e.to_string(), "t.txt:2:2: bad value '0' for cores: an integer from 1 to 4096");
        let e = all(b"[cores=1 x\n").unwrap_err();
        assert_eq!(e.kind, ErrorKind::UnclosedOptions);
        let e = all(b"[frob=1] x\n").unwrap_err();
        assert_eq!(e.kind, ErrorKind::UnknownOption("frob".into()));
        let e = all(b"[cores=1]\n").unwrap_err();
        assert_eq!(e.kind, ErrorKind::MissingCommand);
        let e = all(b"[cores=1]x\n").unwrap_err();
        assert!(matches!(e.kind, ErrorKind::BadOptionSyntax(_)));
        let e = all(b"echo\0x\n").unwrap_err();
        assert_eq!((e.kind.clone(), e.column), (ErrorKind::NulByte, 5));
        let e = all(b"#HTC\n").unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidDirective);
    }

    #[test]
    fn empty_file_is_an_error() {
        for t in [&b""[..], b"\n\n# only\n", b"   \r\n"] {
            let e = all(t).unwrap_err();
            assert_eq!(e.kind, ErrorKind::Empty);
            assert_eq!(e.to_string(), "t.txt: no tasks in file (only blank lines and comments, or empty)");
        }
    }

    #[test]
    fn long_line_is_rejected_without_buffering_it() {
        let mut text = b"ok\n".to_vec();
        text.extend(std::iter::repeat_n(b'x', 10 << 20));
        text.extend(b"\nafter\n");
        let mut p = Parser::new(&text[..], "big");
        assert!(p.next_task().unwrap().is_some());
        let e = p.next_task().unwrap_err();
        assert_eq!((e.line, e.kind.clone()), (2, ErrorKind::LineTooLong));
        assert!(p.buf.capacity() < 2 * MAX_LINE + 1024);
        assert_eq!(p.next_task().unwrap().unwrap().command, b"after");
    }

    #[test]
    fn non_utf8_is_preserved() {
        let v = all(b"echo \xff\xfe caf\xc3\xa9\n").unwrap();
        assert_eq!(v[0].2, b"echo \xff\xfe caf\xc3\xa9");
        assert!(v[0].3);
    }

    #[test]
    fn shell_detection() {
        // Every byte: only letters, digits and -_./,:=+%@^ and space run without a shell.
        for b in 0..=255u8 {
            let literal = b.is_ascii_alphanumeric() || b"-_./,:=+%@^ ".contains(&b);
            assert_eq!(needs_shell(&[b'z', b]), !literal || b == b'=', "byte {b}");
        }
        for w in ["while x", "done", ". ./env", "export A", "function f"] {
            assert!(needs_shell(w.as_bytes()), "{w}");
        }
        assert!(!needs_shell(b"whilex 1"));
        assert!(!needs_shell(b"/bin/true"));
        assert!(!needs_shell(b"./sim --seed=3 out.dat"));
        assert!(needs_shell(b"echo $HOME"));
        assert!(needs_shell(b"a | b"));
        assert!(needs_shell(b"FOO=1 cmd"));
        assert!(needs_shell(b"cd /tmp"));
        assert!(needs_shell(b"echo 'x'"));
        assert!(needs_shell(b"ls ~"));
    }

    #[test]
    fn durations_and_sizes() {
        assert_eq!(parse_duration_ms("90"), Some(90_000));
        assert_eq!(parse_duration_ms("1h30m"), Some(5_400_000));
        assert_eq!(parse_duration_ms("250ms"), Some(250));
        assert_eq!(parse_duration_ms("1.5s"), Some(1500));
        assert_eq!(parse_duration_ms("0.4ms"), Some(1));
        assert_eq!(parse_duration_ms("0s"), Some(0));
        assert_eq!(parse_duration_ms("1:00:00"), Some(3_600_000));
        assert_eq!(parse_duration_ms("0"), Some(0));
        assert_eq!(parse_duration_ms("5x"), None);
        assert_eq!(parse_duration_ms("-1"), None);
        assert_eq!(parse_duration_ms("1.2.3s"), None);
        assert_eq!(parse_duration_ms("999999999h"), None);
        assert_eq!(parse_mem_mb("2G"), Some(2048));
        assert_eq!(parse_mem_mb("512"), Some(512));
        assert_eq!(parse_mem_mb("1K"), Some(1));
        assert_eq!(parse_mem_mb("G"), None);
    }

    #[test]
    fn check_counts_classes_and_core_seconds() {
        let s = check(&b"[class=a runtime=10s cores=2] x\n[class=b] y\nz\n"[..], "f", 10).unwrap();
        assert_eq!(s.tasks, 3);
        assert_eq!(s.core_seconds(), 20.0);
        assert_eq!(s.classes.len(), 3);
        let errs = check(&b"[cores=x] a\n[q=1] b\nok\n"[..], "f", 10).unwrap_err();
        assert_eq!(errs.len(), 2);
    }

    #[test]
    fn garbage_never_panics() {
        // A cheap deterministic fuzz over the parser's special bytes; see also fuzz/.
        let mut x: u64 = 0x9E3779B97F4A7C15;
        for _ in 0..2000 {
            let mut v = Vec::new();
            for _ in 0..(x % 200) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                const ALPHABET: &[u8] = b"[]=,#HTC cores=1mem\n\r \t\x00\xffab:;.s";
                v.push(ALPHABET[(x % ALPHABET.len() as u64) as usize]);
            }
            let _ = check(&v[..], "fuzz", 100);
        }
    }
}
