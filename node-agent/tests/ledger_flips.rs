//! Every byte of a small ledger's used pages, flipped in turn: `htc verify` reports the damage,
//! or the flip changed nothing any command prints. No flip may make `status`, `log`, `output`,
//! `task status` or `task wait` print a value other than the undamaged ledger's, leave a task
//! out, or exit 0 on damage, nor end any command by a signal.

use crate::common;

use std::fs;
use std::path::Path;
use std::process::Output;

use common::{text, Dir};

const PAGE: usize = 4096;
/// Page header (16 bytes) and LMDB's meta record (136 bytes).
const META_USED: usize = 16 + 136;
const P_BRANCH: u16 = 0x01;
const P_LEAF: u16 = 0x02;
const P_META: u16 = 0x08;

/// The byte offsets of `ledger` that LMDB's live pages use: both meta records, and of every
/// branch and leaf page not on the free list, its header, node pointers and nodes (not the free
/// gap between them). Freed pages still look like leaves, but nothing reads them.
fn used_bytes(ledger: &[u8]) -> Vec<usize> {
    let u64_at = |i: usize| u64::from_le_bytes(ledger[i..i + 8].try_into().unwrap());
    // The newer meta: its free-list root, its last page.
    let meta = if u64_at(PAGE + 144) > u64_at(144) { PAGE } else { 0 };
    let (free_root, last) = (u64_at(meta + 80) as usize, u64_at(meta + 136) as usize);
    let mut free = std::collections::HashSet::new();
    if free_root != usize::MAX {
        for (_, data) in nodes(&ledger[free_root * PAGE..][..PAGE]) {
            free.extend(data.chunks_exact(8).skip(1).map(|w| u64::from_le_bytes(w.try_into().unwrap()) as usize));
        }
    }
    let mut out = Vec::new();
    for (n, page) in ledger.chunks_exact(PAGE).enumerate().take(last + 1) {
        let u16_at = |i: usize| u16::from_le_bytes([page[i], page[i + 1]]) as usize;
        let flags = u16_at(10) as u16;
        let base = n * PAGE;
        if flags & P_META != 0 {
            out.extend(base..base + META_USED);
        } else if flags & (P_BRANCH | P_LEAF) != 0 && !free.contains(&n) {
            let (lower, upper) = (u16_at(12).min(PAGE), u16_at(14).min(PAGE));
            out.extend(base..base + lower);
            out.extend(base + upper.max(lower)..base + PAGE);
        }
    }
    out
}

/// The (key, data) of each node of a leaf page (data inline, as small values are).
fn nodes(page: &[u8]) -> Vec<(&[u8], &[u8])> {
    let u16_at = |i: usize| u16::from_le_bytes([page[i], page[i + 1]]) as usize;
    let count = (u16_at(12).saturating_sub(16)) / 2;
    (0..count)
        .map(|i| {
            let at = u16_at(16 + 2 * i);
            let dsize = u16_at(at) | (u16_at(at + 2) << 16);
            let ksize = u16_at(at + 6);
            let key = &page[at + 8..at + 8 + ksize];
            (key, &page[at + 8 + ksize..at + 8 + ksize + dsize])
        })
        .collect()
}

/// What the user-facing readers print of the run, each with its exit status; run side by side.
fn readings(d: &Dir, run: &str) -> Vec<(i32, String)> {
    let cmds: [&[&str]; 8] = [
        &["status", run, "--json"],
        &["log", run, "--format", "json"],
        &["output", run, "--tag"],
        &["output", run, "2", "--stderr"],
        // The readers of task states that clients (Python, Snakemake) and scripts call.
        &["task", "status", run, "--all"],
        &["task", "status", run, "--all", "--format", "json"],
        &["task", "status", run, "1-5"],
        &["task", "wait", run, "--all", "--timeout", "1s"],
    ];
    std::thread::scope(|s| {
        let running: Vec<_> = cmds.iter().map(|args| s.spawn(|| d.htc(args))).collect();
        running
            .into_iter()
            .map(|h| {
                let o = h.join().unwrap();
                (code(&o), String::from_utf8_lossy(&o.stdout).into_owned())
            })
            .collect()
    })
}

/// The exit status, or minus the signal that ended the command (which the test counts as wrong).
fn code(o: &Output) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    o.status.code().unwrap_or_else(|| -o.status.signal().unwrap_or(0))
}

#[test]
fn every_flipped_byte_of_a_small_ledger_is_reported_by_verify_or_changes_nothing() {
    let d = Dir::new("ledger-flips");
    d.write("tasks.txt", "echo one\n[retries=1] echo bad >&2; exit 3\necho three\nsleep 0.1; echo four\necho five\n");
    let o = d.htc(&["run", "-q", "tasks.txt"]);
    assert_eq!(o.status.code(), Some(1), "one task fails: {}", text(&o));
    let orig = d.run_dir();
    let run = orig.to_string_lossy().into_owned();
    let ledger = orig.join("ledger.mdb");
    let pristine = fs::read(&ledger).unwrap();
    let truth = readings(&d, &run);
    assert_eq!(truth, readings(&d, &run), "the readings are repeatable");
    assert!(truth.iter().all(|(c, _)| *c <= 1), "{truth:?}");

    let bytes = used_bytes(&pristine);
    println!("{} used bytes", bytes.len());
    let (mut reported, mut harmless) = (0, 0);
    let mut wrong = Vec::new();
    let mut slow: Vec<(usize, f64)> = Vec::new();
    for &at in &bytes {
        let t0 = std::time::Instant::now();
        let mut damaged = pristine.clone();
        damaged[at] ^= 1 << (at % 8);
        write_ledger(&ledger, &damaged);
        let v = d.htc(&["verify", &run]);
        let verdict = code(&v);
        let now = readings(&d, &run);
        if verdict == 0 {
            harmless += 1;
            if now != truth {
                wrong.push(format!("byte {at} (page {}): verify says intact, but the readings are {now:?}", at / PAGE));
            }
        } else {
            reported += 1;
            if !(1..=2).contains(&verdict) {
                wrong.push(format!("byte {at} (page {}): verify exits {verdict}: {}", at / PAGE, text(&v)));
            }
            for ((c, out), (tc, tout)) in now.iter().zip(&truth) {
                // Refused (2, with a message; 3 from a task-state reader that names the tasks
                // it cannot vouch for), or exactly what the undamaged ledger says. A refusal may
                // come after lines that were read whole: each must be a true one, or a row that
                // says its task is damaged.
                let damaged_row = |l: &str| l.contains("\tdamaged\t") || l.contains(r#""state":"damaged""#);
                let true_lines = out.lines().all(|l| damaged_row(l) || tout.lines().any(|t| t == l));
                if !(((*c == 2 || *c == 3) && true_lines) || (c == tc && out == tout)) {
                    wrong.push(format!("byte {at} (page {}): a reader exits {c} and prints {out:?}", at / PAGE));
                }
            }
        }
        let took = t0.elapsed().as_secs_f64();
        if took > 1.0 {
            eprintln!("byte {at} (page {}, offset {}): {took:.1} s", at / PAGE, at % PAGE);
        }
        slow.push((at, took));
    }
    write_ledger(&ledger, &pristine);
    slow.sort_by(|a, b| b.1.total_cmp(&a.1));
    println!("slowest flips: {:?}", &slow[..slow.len().min(20)]);
    let shown: Vec<&str> = wrong.iter().take(30).map(String::as_str).collect();
    assert!(wrong.is_empty(), "{} flips printed wrong values (truth: {truth:?}):\n{}", wrong.len(), shown.join("\n"));
    println!("{} bytes flipped: {reported} reported by verify, {harmless} changed nothing", bytes.len());
    assert!(reported > bytes.len() / 2, "most flips of used bytes are damage verify must see");
}

fn write_ledger(path: &Path, bytes: &[u8]) {
    fs::write(path, bytes).unwrap();
}
