//! The `taskfile` target's checks: `check` on arbitrary bytes, plus the streaming `Parser` read
//! through a tiny `BufReader` (so lines straddle buffer refills) with per-task invariants.
//!
//! Shared by the fuzz target (`fuzz_targets/taskfile.rs`) and the stable replay of the committed
//! corpus `corpus/taskfile/` in `cargo test` (`node-agent/tests/fuzz_corpus.rs`), so both make exactly these assertions.

use std::io::BufReader;

use htc_core::taskfile::{self, ErrorKind, Parser, MAX_CLASSES, MAX_CORES, MAX_LINE, MAX_RETRIES};

#[derive(Debug, PartialEq)]
enum Event {
    Task { line: u64, offset: u64, options: taskfile::TaskShape, command: Vec<u8>, shell: bool },
    Error { line: u64, column: usize, kind: ErrorKind },
}

fn is_blank(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

/// Tasks a walk takes from sweeps before it stops (a sweep may make billions).
const MAX_GENERATED: u64 = 20_000;

/// Runs the parser to its end (or to `MAX_GENERATED` tasks of sweeps: then `None`) and checks
/// every task against the input.
// Long (about 85 lines): a fuzz check, one assertion after another on the same parser state.
fn walk<R: std::io::BufRead>(data: &[u8], reader: R) -> Option<(Vec<Event>, Vec<String>)> {
    let lines = data.split(|&b| b == b'\n').count() as u64 - u64::from(data.last() == Some(&b'\n'));
    let mut p = Parser::new(reader, "fuzz");
    let mut events = Vec::new();
    let mut last_line = 0u64;
    let (mut calls, mut generated) = (0u64, 0u64);
    loop {
        calls += 1;
        // Every call consumes at least one line, makes a sweep's task or ends the file: no livelock.
        assert!(calls <= lines + 2 + generated, "parser did not terminate: {calls} calls for {lines} lines");
        match p.next_task() {
            Ok(Some(t)) if t.generated => {
                generated += 1;
                if generated > MAX_GENERATED {
                    return None;
                }
                // A sweep's tasks share their template's line; the command is made, not read.
                assert!(t.line >= last_line && t.line <= lines, "sweep task line {} after {last_line}", t.line);
                last_line = t.line;
                assert!(!t.command.is_empty() && t.command.len() <= taskfile::MAX_COMMAND);
                assert!(!t.command.contains(&0) && !t.command.contains(&b'\n'));
                assert_eq!(t.shell, taskfile::needs_shell(t.command));
                events.push(Event::Task {
                    line: t.line,
                    offset: t.offset,
                    options: t.options,
                    command: t.command.to_vec(),
                    shell: t.shell,
                });
            }
            Ok(Some(t)) => {
                assert!(t.line > last_line, "line numbers must increase: {} after {last_line}", t.line);
                assert!(t.line <= lines);
                last_line = t.line;
                let off = t.offset as usize;
                assert_eq!(&data[off..off + t.command.len()], t.command, "command is the input at offset");
                assert!(!t.command.is_empty());
                assert!(t.command.len() <= MAX_LINE);
                assert!(!is_blank(t.command[0]) && !is_blank(*t.command.last().unwrap()));
                assert!(!t.command.contains(&0) && !t.command.contains(&b'\n'));
                assert_eq!(t.shell, taskfile::needs_shell(t.command));
                let o = t.options;
                assert!(o.cores >= 1 && u32::from(o.cores) <= MAX_CORES, "{o:?}");
                assert!(u32::from(o.retries) <= MAX_RETRIES, "{o:?}");
                events.push(Event::Task {
                    line: t.line,
                    offset: t.offset,
                    options: o,
                    command: t.command.to_vec(),
                    shell: t.shell,
                });
                assert!((o.class as usize) < p.classes().len(), "class id {} of {:?}", o.class, p.classes());
            }
            Ok(None) => break,
            Err(e) => {
                let msg = e.to_string();
                assert!(msg.starts_with("fuzz"), "{msg}");
                let stop = matches!(e.kind, ErrorKind::Empty | ErrorKind::Io(_));
                if e.kind == ErrorKind::Empty {
                    assert_eq!(e.line, 0);
                } else {
                    // A sweep's error is at its template's line, which its tasks had too.
                    assert!(
                        (e.line > last_line || (generated > 0 && e.line == last_line)) && e.line <= lines,
                        "error line {} after {last_line} of {lines}",
                        e.line
                    );
                    last_line = e.line;
                }
                events.push(Event::Error { line: e.line, column: e.column, kind: e.kind });
                if stop {
                    break;
                }
            }
        }
    }
    let classes = p.classes();
    assert!(classes.len() <= MAX_CLASSES);
    assert_eq!(classes[0], "default");
    for (i, c) in classes.iter().enumerate().skip(1) {
        // docs/task-file.md: 1 to 64 of `A-Z a-z 0-9 _ . -`, each name once.
        assert!((1..=64).contains(&c.len()), "{c:?}");
        assert!(c.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b)), "{c:?}");
        assert!(!classes[..i].contains(c), "{c:?} twice");
    }
    Some((events, p.classes().to_vec()))
}

pub fn check(data: &[u8]) {
    let Some((events, classes)) = walk(data, data) else { return };
    let whole = taskfile::check(data, "fuzz", 100);
    match &whole {
        Ok(s) => {
            assert!(s.tasks > 0);
            assert!(s.shell_tasks <= s.tasks);
            assert_eq!(s.classes.iter().map(|c| c.tasks).sum::<u64>(), s.tasks);
            assert!(s.classes.iter().all(|c| c.core_seconds.is_finite() && c.core_seconds >= 0.0));
        }
        Err(errors) => {
            assert!(!errors.is_empty() && errors.len() <= 100);
        }
    }

    // Same answers however the bytes arrive.
    let cap = 1 + data.first().map_or(0, |b| usize::from(b % 7));
    let (chunked, chunked_classes) =
        walk(data, BufReader::with_capacity(cap, data)).expect("as long as the first walk");
    assert_eq!(events, chunked);
    assert_eq!(classes, chunked_classes);

    // `check` agrees with the streaming parser.
    let tasks = events.iter().filter(|e| matches!(e, Event::Task { .. })).count() as u64;
    let errors = events.len() as u64 - tasks;
    match whole {
        Ok(s) => {
            assert_eq!(errors, 0);
            assert_eq!(s.tasks, tasks);
        }
        Err(e) => assert!(errors > 0 && e.len() as u64 <= errors.min(100), "{} vs {errors}", e.len()),
    }
}
