//! How much memory an agent may hand out to its tasks, learned where the node says it: under
//! Slurm from the allocation (`SLURM_MEM_PER_NODE`, or `SLURM_MEM_PER_CPU` times the job's CPUs
//! on the node), else the node's memory, which the job has whole; locally the memory available
//! when the agent starts. Either way no more than the cgroup the agent runs in allows, and split
//! evenly among the agents sharing the node. Reading is at the edges (`detect`); the choice is
//! the pure `budget_mb`.

use std::path::Path;

/// What the node and the job say about memory, in MiB where it is a size.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Facts {
    /// `SLURM_MEM_PER_NODE` (MiB), when the job asked for `--mem`.
    pub slurm_per_node: Option<u64>,
    /// `SLURM_MEM_PER_CPU` (MiB), when the job asked for `--mem-per-cpu`.
    pub slurm_per_cpu: Option<u64>,
    /// The job's CPUs on this node (for `SLURM_MEM_PER_CPU`).
    pub cpus_on_node: u64,
    /// Under Slurm (`--slurm`): the node's whole memory is the job's when it asked for none.
    pub slurm: bool,
    /// `MemTotal` and `MemAvailable` of /proc/meminfo.
    pub total: Option<u64>,
    pub available: Option<u64>,
    /// The limit of the memory cgroup the agent runs in (Slurm's task/cgroup sets one).
    pub cgroup_limit: Option<u64>,
    /// Agents sharing the node (and so its memory).
    pub agents_on_node: u64,
}

/// The budget in MiB and where it came from, for the agent's log line and `htc status`.
pub fn budget_mb(f: &Facts) -> (u64, &'static str) {
    let (mb, from) = if let Some(n) = f.slurm_per_node.filter(|&n| n > 0) {
        (n, "SLURM_MEM_PER_NODE")
    } else if let Some(c) = f.slurm_per_cpu.filter(|&c| c > 0) {
        (c.saturating_mul(f.cpus_on_node.max(1)), "SLURM_MEM_PER_CPU")
    } else if f.slurm {
        (f.total.unwrap_or(0), "the node's memory")
    } else {
        (f.available.or(f.total).unwrap_or(0), "the memory available at start")
    };
    let (mb, from) = match f.cgroup_limit {
        Some(l) if l < mb || mb == 0 => (l, "the memory cgroup's limit"),
        _ => (mb, from),
    };
    (mb / f.agents_on_node.max(1), from)
}

/// Reads the facts: the Slurm variables when `slurm`, /proc/meminfo and the agent's cgroup.
pub fn detect(slurm: bool, cpus_on_node: u64, agents_on_node: u64) -> Facts {
    let var = |n: &str| std::env::var(n).ok().and_then(|v| parse_slurm_mb(&v));
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    Facts {
        slurm_per_node: if slurm { var("SLURM_MEM_PER_NODE") } else { None },
        slurm_per_cpu: if slurm { var("SLURM_MEM_PER_CPU") } else { None },
        cpus_on_node,
        slurm,
        total: meminfo_mb(&meminfo, "MemTotal"),
        available: meminfo_mb(&meminfo, "MemAvailable"),
        cgroup_limit: cgroup_limit_mb(&cgroups, Path::new("/sys/fs/cgroup")),
        agents_on_node,
    }
}

/// Slurm's memory variables are MiB, sometimes with a unit suffix (`4096`, `4G`).
pub fn parse_slurm_mb(v: &str) -> Option<u64> {
    let v = v.trim();
    let (digits, unit) = v.split_at(v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len()));
    let n: u64 = digits.parse().ok()?;
    let mul = match unit {
        "" | "M" | "m" => 1,
        "G" | "g" => 1 << 10,
        "T" | "t" => 1 << 20,
        _ => return None,
    };
    n.checked_mul(mul)
}

/// A `Key:   N kB` line of /proc/meminfo, in MiB.
pub fn meminfo_mb(meminfo: &str, key: &str) -> Option<u64> {
    meminfo.lines().find_map(|l| {
        let rest = l.strip_prefix(key)?.strip_prefix(':')?;
        let kb: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
        Some(kb / 1024)
    })
}

/// The memory limit of the agent's cgroup, from its lines in /proc/self/cgroup: cgroup v2's
/// `memory.max` (on the unified hierarchy, mounted at `root` or `root/unified`), else v1's
/// `memory.limit_in_bytes`. `None` when there is no limit ("max", or v1's huge number).
pub fn cgroup_limit_mb(proc_cgroup: &str, root: &Path) -> Option<u64> {
    let mut limits = Vec::new();
    for line in proc_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(ctrls), Some(path)) = (parts.next(), parts.next(), parts.next()) else { continue };
        let rel = path.trim_start_matches('/');
        if ctrls.is_empty() {
            for base in [root.to_path_buf(), root.join("unified")] {
                limits.push(read_limit(&base.join(rel).join("memory.max")));
            }
        } else if ctrls.split(',').any(|c| c == "memory") {
            limits.push(read_limit(&root.join("memory").join(rel).join("memory.limit_in_bytes")));
        }
    }
    limits.into_iter().flatten().min()
}

fn read_limit(p: &Path) -> Option<u64> {
    let s = std::fs::read_to_string(p).ok()?;
    let bytes: u64 = s.trim().parse().ok()?; // "max" is no limit
                                             // cgroup v1 says "no limit" with a page-rounded i64::MAX.
    (bytes < 1 << 60).then_some(bytes >> 20)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local(available: u64) -> Facts {
        Facts { total: Some(available * 2), available: Some(available), agents_on_node: 1, ..Facts::default() }
    }

    #[test]
    fn slurm_allocation_first_then_per_cpu_then_the_node() {
        let mut f =
            Facts { slurm: true, total: Some(24_000), available: Some(20_000), agents_on_node: 1, ..Facts::default() };
        assert_eq!(budget_mb(&f), (24_000, "the node's memory"));
        f.slurm_per_cpu = Some(1000);
        f.cpus_on_node = 4;
        assert_eq!(budget_mb(&f), (4000, "SLURM_MEM_PER_CPU"));
        f.slurm_per_node = Some(3000);
        assert_eq!(budget_mb(&f), (3000, "SLURM_MEM_PER_NODE"));
        f.agents_on_node = 2;
        assert_eq!(budget_mb(&f).0, 1500, "agents on one node split it");
    }

    #[test]
    fn locally_what_is_available_within_the_cgroup() {
        assert_eq!(budget_mb(&local(8000)), (8000, "the memory available at start"));
        let f = Facts { cgroup_limit: Some(2048), ..local(8000) };
        assert_eq!(budget_mb(&f), (2048, "the memory cgroup's limit"));
        let f = Facts { cgroup_limit: Some(1 << 20), ..local(8000) };
        assert_eq!(budget_mb(&f).0, 8000, "a limit above the memory changes nothing");
        let f = Facts { available: None, total: None, agents_on_node: 1, ..Facts::default() };
        assert_eq!(budget_mb(&f).0, 0, "nothing known: not accounted");
    }

    #[test]
    fn slurm_values_and_meminfo_parse() {
        assert_eq!(parse_slurm_mb("4096"), Some(4096));
        assert_eq!(parse_slurm_mb("4G"), Some(4096));
        assert_eq!(parse_slurm_mb("x"), None);
        assert_eq!(parse_slurm_mb("5Q"), None);
        let mi = "MemTotal:       24683340 kB\nMemFree:  1 kB\nMemAvailable:   20000000 kB\n";
        assert_eq!(meminfo_mb(mi, "MemTotal"), Some(24104));
        assert_eq!(meminfo_mb(mi, "MemAvailable"), Some(19531));
        assert_eq!(meminfo_mb(mi, "Mem"), None, "a key is whole");
    }

    #[test]
    fn cgroup_limits_v1_and_v2() {
        let root = std::env::temp_dir().join(format!("htc-cg-{}", std::process::id()));
        let v2 = root.join("job/step");
        let v1 = root.join("memory/slurm/uid");
        std::fs::create_dir_all(&v2).unwrap();
        std::fs::create_dir_all(&v1).unwrap();
        std::fs::write(v2.join("memory.max"), "max\n").unwrap();
        assert_eq!(cgroup_limit_mb("0::/job/step\n", &root), None);
        std::fs::write(v2.join("memory.max"), format!("{}\n", 3u64 << 30)).unwrap();
        assert_eq!(cgroup_limit_mb("0::/job/step\n", &root), Some(3072));
        std::fs::write(v1.join("memory.limit_in_bytes"), "9223372036854771712\n").unwrap();
        assert_eq!(cgroup_limit_mb("4:memory:/slurm/uid\n", &root), None);
        std::fs::write(v1.join("memory.limit_in_bytes"), format!("{}\n", 1u64 << 30)).unwrap();
        assert_eq!(cgroup_limit_mb("4:memory:/slurm/uid\n0::/job/step\n", &root), Some(1024), "the smaller");
        std::fs::remove_dir_all(&root).unwrap();
    }
}
