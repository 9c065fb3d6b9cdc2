//! What the agent's own threads ask of the kernel for each task, counted with `strace -f` over
//! two runs of different sizes: nothing that all of a node's cores pay for may come back into
//! the spawn path (issue 42). An `mmap`, `munmap`, `mprotect`, `madvise` or `mremap` in a
//! process whose threads run on other CPUs interrupts each of those CPUs (a TLB shootdown);
//! moving a process into a cgroup takes a kernel-wide lock against every fork on the node.

use std::collections::{HashMap, HashSet};
use std::fs;

use crate::common::{text, Dir};

/// What one run's agent threads (and its tasks, for cgroup moves) did.
#[derive(Debug, Default)]
struct Calls {
    /// Calls that change the agent's address space, by its own threads.
    mm_wide: usize,
    /// Writes by the agent's threads to a v1 cgroup's `tasks` (a thread moved for a spawn).
    thread_moves: usize,
    /// Writes to a v2 cgroup's `cgroup.procs` by anyone (a task moving itself in).
    process_moves: usize,
}

const MM_WIDE: [&str; 5] = ["mmap", "munmap", "mprotect", "madvise", "mremap"];

fn traced_run(tasks: usize, mem: bool) -> Calls {
    let d = Dir::new(&format!("syscalls-{tasks}-{mem}"));
    let mut file = if mem { "#HTC mem=64M\n".to_string() } else { String::new() };
    file.push_str(&"true\n".repeat(tasks));
    d.write("t.txt", file);
    let trace = d.path("trace");
    let o = std::process::Command::new("strace")
        .args(["-f", "-qq", "-y", "-o"])
        .arg(&trace)
        .args(["-e", "trace=clone,clone3,mmap,munmap,mprotect,madvise,mremap,write"])
        .args([crate::common::HTC, "run", "-q", "--mem-limit", "auto", "t.txt"])
        .current_dir(&d.0)
        .env("HTC_SITE_CONFIG", "/dev/null")
        .env("XDG_CONFIG_HOME", &d.0)
        .output()
        .expect("strace runs (CI installs it; apt-get install strace)");
    assert!(o.status.success(), "{}", text(&o));
    count(&fs::read_to_string(&trace).unwrap())
}

/// Reads a `strace -f` log (each line `PID call(...)`): the agent's threads are the spawn
/// loops (the threads that clone with CLONE_VFORK), the thread that made them and every thread
/// that one made; the tasks are what the spawn loops cloned.
fn count(log: &str) -> Calls {
    let mut made_threads: HashMap<u32, Vec<u32>> = HashMap::new();
    let mut parent_of: HashMap<u32, u32> = HashMap::new();
    let mut spawners = HashSet::new();
    // A call another thread interrupted comes in two lines: its start, then its result.
    let mut unfinished: HashMap<u32, String> = HashMap::new();
    for line in log.lines() {
        let Some((pid, rest)) = split_pid(line) else { continue };
        let whole = if rest.ends_with("<unfinished ...>") {
            unfinished.insert(pid, rest.to_string());
            continue;
        } else if rest.starts_with("<... ") {
            match unfinished.remove(&pid) {
                Some(start) => start + rest,
                None => continue,
            }
        } else {
            rest.to_string()
        };
        if !whole.starts_with("clone") {
            continue;
        }
        let Some(child) = whole.rsplit_once("= ").and_then(|(_, r)| r.trim().parse::<u32>().ok()) else { continue };
        if whole.contains("CLONE_THREAD") {
            made_threads.entry(pid).or_default().push(child);
            parent_of.insert(child, pid);
        }
        if whole.contains("CLONE_VFORK") {
            spawners.insert(pid);
        }
    }
    assert!(!spawners.is_empty(), "no spawn loop found in the trace");
    let mut agent: HashSet<u32> = HashSet::new();
    let mut todo: Vec<u32> = spawners.iter().filter_map(|s| parent_of.get(s).copied()).collect();
    todo.extend(spawners.iter().copied());
    while let Some(t) = todo.pop() {
        if agent.insert(t) {
            todo.extend(made_threads.get(&t).into_iter().flatten().copied());
        }
    }
    let mut c = Calls::default();
    for line in log.lines() {
        let Some((pid, name)) = call(line) else { continue };
        let name = name.to_string();
        if name == "write" && line.contains("/cgroup.procs>") {
            c.process_moves += 1;
        }
        if !agent.contains(&pid) {
            continue;
        }
        if MM_WIDE.contains(&name.as_str()) {
            c.mm_wide += 1;
        } else if name == "write" && line.contains("/sys/fs/cgroup/") && line.contains("/tasks>") {
            c.thread_moves += 1;
        }
    }
    c
}

/// A line's pid and call, where it starts one (not a "<... resumed>" line).
fn call(line: &str) -> Option<(u32, &str)> {
    let (pid, rest) = split_pid(line)?;
    let name = &rest[..rest.find('(')?];
    let plain = !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    plain.then_some((pid, name))
}

/// A line's pid and the rest: strace pads the pid with spaces to five characters (a run whose
/// pids had four digits read as no calls at all).
fn split_pid(line: &str) -> Option<(u32, &str)> {
    let (pid, rest) = line.split_once(' ')?;
    Some((pid.parse().ok()?, rest.trim_start()))
}

/// Per task, from a run of `small` and one of `big` tasks: what the second cost more, over
/// the tasks it had more (start-up and the end cost the same in both).
fn per_task(small: &Calls, big: &Calls, extra: usize, f: impl Fn(&Calls) -> usize) -> f64 {
    (f(big) as f64 - f(small) as f64) / extra as f64
}

#[test]
fn the_spawn_path_changes_no_address_space_and_moves_nothing_into_a_cgroup_on_v2() {
    let (small, big) = (200, 1200);
    for mem in [false, true] {
        let a = traced_run(small, mem);
        let b = traced_run(big, mem);
        let mm = per_task(&a, &b, big - small, |c| c.mm_wide);
        assert!(mm < 0.01, "mem={mem}: {mm:.3} address-space changes per task by the agent's threads ({a:?}, {b:?})");
        let procs = per_task(&a, &b, big - small, |c| c.process_moves);
        let threads = per_task(&a, &b, big - small, |c| c.thread_moves);
        if !mem {
            assert_eq!((a.process_moves, a.thread_moves, b.process_moves, b.thread_moves), (0, 0, 0, 0));
            continue;
        }
        let v1 = fs::read_to_string("/proc/self/cgroup").unwrap().lines().any(|l| {
            let mut f = l.splitn(3, ':');
            f.nth(1).is_some_and(|c| c.split(',').any(|c| c == "memory"))
        });
        if v1 {
            // v1 has no way to start a process in a cgroup: the spawn loop steps in and out
            // (bench/RESULTS.md §20 has its cost); nothing more than those two.
            assert!(procs < 0.01, "{procs:.3} cgroup.procs writes per task on v1");
            assert!(
                threads < 0.01 || (1.99..2.01).contains(&threads),
                "{threads:.3} moves of a spawn loop per task: none (no memory cgroups here) or two"
            );
        } else {
            assert!(
                procs < 0.01 && threads < 0.01,
                "v2: tasks are born in their cgroup, nothing moves ({procs:.3} process, {threads:.3} thread moves per task)"
            );
        }
    }
}
