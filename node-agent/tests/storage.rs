//! Damaged and full storage, end to end: a disk that fills up before or during a run is a clear
//! error that loses nothing done, and a resume once there is space again finishes the run with
//! every task's output readable. The disks are real (tmpfs mounts of a fixed size; the tests run
//! as root, as CI does).

use crate::common;

use std::fs;
use std::path::{Path, PathBuf};

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;

use common::{text, Dir};
use htc::ledger::{Ledger, State};

/// A tmpfs of `size` mounted over a test directory, detached when dropped (before the directory
/// itself is removed).
struct Disk(PathBuf);

impl Disk {
    fn mount(at: &Path, size: &str) -> Disk {
        let opts = format!("size={size},mode=0755");
        mount_tmpfs(at, &opts, 0);
        Disk(at.to_path_buf())
    }

    fn resize(&self, size: &str) {
        mount_tmpfs(&self.0, &format!("size={size}"), libc::MS_REMOUNT);
    }

    /// Fills the disk up to `leave` bytes free with a file `fill`.
    fn fill(&self, leave: u64) {
        let free = htc::host::free_bytes(&self.0).unwrap();
        let n = free.saturating_sub(leave);
        let f = fs::File::create(self.0.join("fill")).unwrap();
        use std::io::Write;
        let mut w = std::io::BufWriter::new(f);
        let block = vec![0u8; 4096];
        let mut written = 0;
        while written + 4096 <= n {
            w.write_all(&block).unwrap();
            written += 4096;
        }
        w.flush().unwrap();
    }
}

// libc's mount(2), not nix's: nix's `mount` feature here only would give the test build other
// features than the release build's, and rebuild nix and every crate above it for the tests.
fn mount_tmpfs(at: &Path, opts: &str, flags: libc::c_ulong) {
    let (src, at_c, opts_c) = (c"tmpfs", CString::new(at.as_os_str().as_bytes()).unwrap(), CString::new(opts).unwrap());
    // SAFETY: every pointer is a NUL-terminated string that outlives the call.
    let rc = unsafe { libc::mount(src.as_ptr(), at_c.as_ptr(), src.as_ptr(), flags, opts_c.as_ptr().cast()) };
    if rc != 0 {
        panic!("mount tmpfs on {} ({opts}): {} — these tests need root", at.display(), std::io::Error::last_os_error());
    }
}

impl Drop for Disk {
    fn drop(&mut self) {
        // Detaching the mount this test made; MNT_DETACH also works while it is busy.
        let at = CString::new(self.0.as_os_str().as_bytes()).unwrap();
        // SAFETY: a NUL-terminated path that outlives the call.
        unsafe { libc::umount2(at.as_ptr(), libc::MNT_DETACH) };
    }
}

/// Exited by itself (a code, not a signal).
fn exited(o: &std::process::Output) -> Option<i32> {
    o.status.code()
}

#[test]
fn a_full_disk_at_the_start_is_a_clear_error_and_leaves_no_half_made_run() {
    let d = Dir::new("full-at-start");
    let disk = Disk::mount(&d.0, "2m");
    d.write("tasks.txt", "echo a\necho b\n");
    // Every amount of room too small for a run, from none to a few pages: never a signal.
    for leave in [0u64, 8 << 10, 32 << 10, 96 << 10, 160 << 10] {
        let _ = fs::remove_file(d.path("fill"));
        disk.fill(leave);
        for cmd in ["run", "prepare"] {
            let o = d.htc(&[cmd, "tasks.txt"]);
            if o.status.success() {
                // The room sufficed after all: a real run, which is fine; clean up for the next.
                let _ = fs::remove_dir_all(d.path(".htc"));
                continue;
            }
            assert_eq!(exited(&o), Some(2), "{cmd} with {leave} bytes free: {}", text(&o));
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(
                err.contains("No space left on device") || err.contains("is full"),
                "{cmd} with {leave} bytes free: {err}"
            );
            // Either no run at all, or a whole one that stopped when its agent found the disk
            // full, and says how to go on.
            let runs = fs::read_dir(d.path(".htc")).map(|r| r.count()).unwrap_or(0);
            if !err.contains("htc run --resume") {
                assert_eq!(runs, 0, "{cmd} with {leave} bytes free left a half-made run behind: {err}");
            }
            let _ = fs::remove_dir_all(d.path(".htc"));
        }
    }
}

/// Tasks the ledger records done.
fn done(run: &Path) -> usize {
    let l = Ledger::open(&run.join("ledger.mdb"), true).unwrap();
    let t = l.read().unwrap();
    let mut n = 0;
    t.for_each(|_, r| n += (r.state() == State::Done) as usize).unwrap();
    n
}

#[test]
fn a_disk_that_fills_mid_run_stops_it_cleanly_and_a_resume_finishes_with_all_output_readable() {
    let n = 1500u64;
    let tasks: String = (0..n).map(|_| "printf 'task %s %0300d\\n' $HTC_TASK_ID 0\n").collect();
    // The disk fills at different moments: early (the ledger's pages), mid-way, late.
    for leave in [400u64 << 10, 550 << 10, 700 << 10] {
        let d = Dir::new(&format!("full-mid-run-{leave}"));
        let disk = Disk::mount(&d.0, "3m");
        d.write("tasks.txt", &tasks);
        disk.fill(leave);
        let o = d.htc(&["run", "--agents", "2", "tasks.txt"]);
        assert_eq!(exited(&o), Some(2), "{leave} bytes free: the run cannot finish: {}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("No space left on device") || err.contains("is full"), "{leave}: {err}");
        let run = d.run_dir();
        let before = done(&run);
        assert!(before < n as usize, "{leave}: {before} done");

        disk.resize("64m");
        let o = d.htc(&["run", "--resume", "-q"]);
        assert!(o.status.success(), "{leave}: the resume: {}", text(&o));
        assert_eq!(done(&run), n as usize, "{leave}: every task done after the resume");
        // Every task's output is there and is its own, whether it ran before the disk filled or
        // after the resume.
        let id = d.run_id();
        for task in 1..=n {
            let o = d.htc(&["output", &id, &task.to_string()]);
            let want = format!("task {task} {:0300}\n", 0);
            assert_eq!(String::from_utf8_lossy(&o.stdout), want, "{leave}: output of task {task}: {}", text(&o));
        }
    }
}

/// `htc ARGS` in the test directory, killed and `None` when it runs past `limit`.
fn htc_within(d: &Dir, args: &[&str], limit: std::time::Duration) -> Option<std::process::Output> {
    let mut child = std::process::Command::new(common::HTC)
        .args(args)
        .current_dir(&d.0)
        .env("HTC_SITE_CONFIG", "/dev/null")
        .env("XDG_CONFIG_HOME", &d.0)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    if common::wait_some(limit, || child.try_wait().unwrap()).is_none() {
        let _ = child.kill();
        let _ = child.wait();
        return None;
    }
    Some(child.wait_with_output().unwrap())
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for e in fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dest);
        } else {
            fs::copy(e.path(), dest).unwrap();
        }
    }
}

/// Random bytes over any one page of a ledger: `htc status`, `output`, `verify` and
/// `run --resume` end with their own status (0, 1 or 2) within a bound, never by a signal; a
/// refusal names the ledger; `verify` calls the ledger intact or damaged, and a resume that goes
/// ahead (on an intact ledger, or one whose stored counts are all that is wrong) leaves a ledger
/// that verifies intact. The seed is printed; `HTC_TEST_SEED=` replays it.
#[test]
fn random_bytes_over_any_one_ledger_page_are_a_clear_error_never_a_signal() {
    let d = Dir::new("damaged-pages");
    let n = 2000;
    d.write("tasks.txt", (0..n).map(|i| format!("echo {i}\n")).collect::<String>());
    let o = d.htc(&["run", "-q", "tasks.txt"]);
    assert!(o.status.success(), "{}", text(&o));
    let orig = d.run_dir();
    let pages = fs::metadata(orig.join("ledger.mdb")).unwrap().len() / 4096;
    let seed = std::env::var("HTC_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1
    });
    println!("seed {seed}, {pages} pages");
    let mut x = seed;
    let mut random_page = move || {
        (0..4096)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect::<Vec<u8>>()
    };
    let mut refused = 0;
    for page in 0..pages {
        let copy = d.path(&format!("copy-{page}"));
        copy_dir(&orig, &copy);
        let ledger = copy.join("ledger.mdb");
        let mut bytes = fs::read(&ledger).unwrap();
        bytes[(page * 4096) as usize..][..4096].copy_from_slice(&random_page());
        fs::write(&ledger, bytes).unwrap();
        let run = copy.to_string_lossy().into_owned();
        for args in [
            vec!["status", &run],
            vec!["output", &run, "1000"],
            vec!["verify", &run],
            vec!["run", "-q", "--resume", &run],
        ] {
            let o = htc_within(&d, &args, std::time::Duration::from_secs(90))
                .unwrap_or_else(|| panic!("seed {seed}, page {page}, {args:?}: still running after 90 s (a loop?)"));
            let code = o.status.code();
            assert!(code.is_some_and(|c| (0..=2).contains(&c)), "seed {seed}, page {page}, {args:?}: {}", text(&o));
            let err = String::from_utf8_lossy(&o.stderr);
            if code == Some(2) {
                refused += 1;
                assert!(
                    err.contains("ledger"),
                    "seed {seed}, page {page}, {args:?}: the error names the ledger: {err}"
                );
            }
            match args[0] {
                "verify" => {
                    let out = String::from_utf8_lossy(&o.stdout);
                    let said = if code == Some(0) { "intact" } else { "damaged" };
                    assert!(out.contains(said), "seed {seed}, page {page}: verify exits {code:?} and says: {out}");
                }
                "run" if code == Some(0) => {
                    let o = htc_within(&d, &["verify", &run], std::time::Duration::from_secs(90)).unwrap();
                    assert_eq!(o.status.code(), Some(0), "seed {seed}, page {page}: after the resume: {}", text(&o));
                }
                _ => {}
            }
        }
        fs::remove_dir_all(&copy).unwrap();
    }
    println!("{refused} clear refusals over {pages} damaged pages");
    assert!(refused > 0, "seed {seed}: no damaged page was noticed at all");
}
