//! The GPUs an agent hands to tasks (`gpus=N`), and which task holds which.
//!
//! An agent learns its devices from, in order: `--gpus LIST` (an explicit override, also how
//! tests without GPUs run), the devices the job step was given (`CUDA_VISIBLE_DEVICES`, then
//! `ROCR_VISIBLE_DEVICES`, as Slurm's gres plugin and ROCm set them, then `SLURM_STEP_GPUS` /
//! `SLURM_JOB_GPUS`), and locally `nvidia-smi`. Where `nvidia-smi` names a device's PCI bus,
//! the CPUs nearest it come from sysfs, and a task given that device is bound to them.
//!
//! The leader never sends an agent more GPU tasks than it has devices (it commits them as it
//! commits memory); the pool, shared by the agent's spawn loops, gives each task distinct ones.

use std::path::Path;
use std::sync::{Arc, Mutex};

/// One device: the id tasks see in `CUDA_VISIBLE_DEVICES`, and the CPUs nearest it (empty:
/// not known).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    pub id: String,
    pub cpus: Vec<usize>,
}

/// Where the devices came from, for the agent's log line.
pub fn detect(overridden: Option<&str>) -> (Vec<Device>, &'static str) {
    if let Some(list) = overridden {
        return (plain(list), "--gpus");
    }
    for var in ["CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS"] {
        if let Ok(v) = std::env::var(var) {
            // "NoDevFiles" (Slurm with no device files) or an empty list: none.
            let d = plain(&v);
            if !d.is_empty() || v.trim().is_empty() {
                return (d, var);
            }
        }
    }
    let out = std::process::Command::new("nvidia-smi")
        .args(["--query-gpu=index,pci.bus_id", "--format=csv,noheader"])
        .stderr(std::process::Stdio::null())
        .output();
    match out {
        Ok(o) if o.status.success() => {
            (from_nvidia_smi(&String::from_utf8_lossy(&o.stdout), Path::new("/sys/bus/pci/devices")), "nvidia-smi")
        }
        _ => (Vec::new(), "none found"),
    }
}

/// A comma-separated list of device ids (`0,1,2`, `GPU-8f2…`); ids are words of
/// `[A-Za-z0-9_-]`, so "NoDevFiles"-like markers and garbage give no device.
pub fn plain(list: &str) -> Vec<Device> {
    let ids: Vec<&str> = list.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
    let ok = |s: &&str| s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ids.iter().all(ok) && !ids.contains(&"NoDevFiles") {
        ids.into_iter().map(|id| Device { id: id.to_string(), cpus: Vec::new() }).collect()
    } else {
        Vec::new()
    }
}

/// `index, 00000000:3B:00.0` lines; each device's nearest CPUs from `sysfs/<bus id>/local_cpulist`.
pub fn from_nvidia_smi(csv: &str, sysfs: &Path) -> Vec<Device> {
    csv.lines()
        .filter_map(|l| {
            let (index, bus) = l.split_once(',')?;
            let index = index.trim();
            index.parse::<u32>().ok()?;
            // nvidia-smi writes an 8-digit domain, sysfs a 4-digit one, in lower case.
            let bus = bus.trim().to_ascii_lowercase();
            let bus = if bus.len() == 16 { bus[4..].to_string() } else { bus };
            let cpus = std::fs::read_to_string(sysfs.join(&bus).join("local_cpulist"))
                .ok()
                .and_then(|s| cpu_list(s.trim()))
                .unwrap_or_default();
            Some(Device { id: index.to_string(), cpus })
        })
        .collect()
}

/// A kernel CPU list: `0-3,8-11`.
pub fn cpu_list(s: &str) -> Option<Vec<usize>> {
    let mut out = Vec::new();
    for part in s.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.parse().ok()?, b.parse().ok()?);
                if b < a || b - a > 65_536 {
                    return None;
                }
                out.extend(a..=b);
            }
            None => out.push(part.parse().ok()?),
        }
    }
    Some(out)
}

/// Each device and the task holding it.
type Holders = Vec<(Device, Option<u64>)>;

/// The agent's devices and which task holds each, shared by its spawn loops.
#[derive(Debug, Clone, Default)]
pub struct Pool(Arc<Mutex<Holders>>, usize);

impl Pool {
    pub fn new(devices: Vec<Device>) -> Pool {
        let n = devices.len();
        Pool(Arc::new(Mutex::new(devices.into_iter().map(|d| (d, None)).collect())), n)
    }

    /// Devices in the pool (fixed: no lock on the spawn path).
    pub fn len(&self) -> usize {
        self.1
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Devices no task holds now.
    pub fn free(&self) -> usize {
        self.0.lock().map_or(0, |p| p.iter().filter(|d| d.1.is_none()).count())
    }

    /// `n` free devices for `task`, or none if fewer are free.
    pub fn take(&self, task: u64, n: usize) -> Option<Vec<Device>> {
        let mut p = self.0.lock().ok()?;
        let free: Vec<usize> = (0..p.len()).filter(|&i| p[i].1.is_none()).take(n).collect();
        if free.len() < n {
            return None;
        }
        Some(
            free.into_iter()
                .map(|i| {
                    p[i].1 = Some(task);
                    p[i].0.clone()
                })
                .collect(),
        )
    }

    /// The task's devices are free again.
    pub fn give_back(&self, task: u64) {
        if let Ok(mut p) = self.0.lock() {
            for d in p.iter_mut().filter(|d| d.1 == Some(task)) {
                d.1 = None;
            }
        }
    }
}

/// The `local`-th of `agents` agents sharing a node gets its part of the node's devices; each
/// device goes to one agent only (some may get none).
pub fn share(devices: &[Device], agents: usize, local: usize) -> Vec<Device> {
    let (n, agents) = (devices.len(), agents.max(1));
    let (from, to) = (local * n / agents, ((local + 1) * n / agents).min(n));
    devices.get(from..to).map(<[Device]>::to_vec).unwrap_or_default()
}

/// What a task is told its devices are by: CUDA, ROCm and HIP.
pub const VISIBLE_VARS: [&str; 3] = ["CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"];

/// Whether an environment entry `NAME=value` sets `var`.
pub fn sets(entry: &[u8], var: &str) -> bool {
    entry.strip_prefix(var.as_bytes()).is_some_and(|rest| rest.first() == Some(&b'='))
}

/// The value of `CUDA_VISIBLE_DEVICES` (and the ROCm equivalents) for `devices`.
pub fn visible(devices: &[Device]) -> String {
    devices.iter().map(|d| d.id.as_str()).collect::<Vec<_>>().join(",")
}

/// The CPUs to bind a task given `devices` to: those nearest them, when known for every one.
pub fn nearest_cpus(devices: &[Device]) -> Option<Vec<usize>> {
    if devices.is_empty() || devices.iter().any(|d| d.cpus.is_empty()) {
        return None;
    }
    let mut cpus: Vec<usize> = devices.iter().flat_map(|d| d.cpus.iter().copied()).collect();
    cpus.sort_unstable();
    cpus.dedup();
    Some(cpus)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_parse_and_markers_give_none() {
        assert_eq!(plain("0,1, 3").iter().map(|d| d.id.as_str()).collect::<Vec<_>>(), ["0", "1", "3"]);
        assert_eq!(plain("GPU-8f2a-11").len(), 1);
        assert!(plain("NoDevFiles").is_empty());
        assert!(plain("").is_empty());
        assert!(plain("0,$(rm)").is_empty(), "not an id");
        assert_eq!(cpu_list("0-3,8,10-11"), Some(vec![0, 1, 2, 3, 8, 10, 11]));
        assert_eq!(cpu_list("3-1"), None);
        assert_eq!(cpu_list("x"), None);
    }

    #[test]
    fn nvidia_smi_bus_ids_give_the_nearest_cpus() {
        let sysfs = std::env::temp_dir().join(format!("htc-gpu-{}", std::process::id()));
        std::fs::create_dir_all(sysfs.join("0000:3b:00.0")).unwrap();
        std::fs::write(sysfs.join("0000:3b:00.0/local_cpulist"), "0-3\n").unwrap();
        let d = from_nvidia_smi("0, 00000000:3B:00.0\n1, 00000000:AF:00.0\nbad line\n", &sysfs);
        assert_eq!(d, vec![Device { id: "0".into(), cpus: vec![0, 1, 2, 3] }, Device { id: "1".into(), cpus: vec![] }]);
        assert_eq!(nearest_cpus(&d[..1]), Some(vec![0, 1, 2, 3]));
        assert_eq!(nearest_cpus(&d), None, "one device's CPUs unknown: no binding by devices");
        std::fs::remove_dir_all(&sysfs).unwrap();
    }

    #[test]
    fn agents_on_a_node_share_its_devices_without_overlap() {
        let d = plain("0,1,2,3,4");
        let parts: Vec<String> = (0..2).map(|i| visible(&share(&d, 2, i))).collect();
        assert_eq!(parts, ["0,1", "2,3,4"]);
        assert_eq!(visible(&share(&d, 1, 0)), "0,1,2,3,4");
        let few = plain("0");
        assert_eq!((share(&few, 2, 0).len(), share(&few, 2, 1).len()), (0, 1));
        assert!(share(&d, 2, 7).is_empty(), "an agent past the node's count");
    }

    #[test]
    fn the_pool_gives_distinct_devices_and_takes_them_back() {
        let p = Pool::new(plain("0,1,2"));
        let a = p.take(10, 2).unwrap();
        assert_eq!(visible(&a), "0,1");
        assert!(p.take(11, 2).is_none(), "one left");
        assert_eq!(visible(&p.take(11, 1).unwrap()), "2");
        p.give_back(10);
        assert_eq!(visible(&p.take(12, 2).unwrap()), "0,1");
        assert_eq!(p.len(), 3);
    }
}
