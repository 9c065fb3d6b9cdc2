//! Turning `--partition` and the site's calibration into the leader's [`Partition`]: HFlow's
//! plan needs the tasks' runtime groups (read once from the ledger by the caller when the file
//! has more than one); a file without runtime hints is one group, split by ranges.

use htc_core::hflow::{self, Params};
use htc_core::partition::{Classes, Even, Group, Partition, Plan};

/// The partition of tasks `1..=total` among `instances` instances of `cores` cores in all.
/// `groups`: the runtime groups of the tasks still to run, or `None` when the file has one
/// group (nothing need be read for it).
pub fn partition(
    total: u64,
    plan: Plan,
    instances: usize,
    cores: u64,
    params: Params,
    groups: Option<Vec<Group>>,
) -> Box<dyn Partition> {
    let ids = 1..total + 1;
    let groups = match (plan, groups) {
        (Plan::Even, _) => return Box::new(Even::new(ids, instances)),
        (_, None) => return Box::new(Even::planned(ids, instances, cores, params)),
        (_, Some(groups)) => groups,
    };
    let x = instances.max(1) as u64;
    for g in &groups {
        let t = g.runtime_s.unwrap_or(params.t);
        let p = Params { t, ..params };
        tracing::info!(
            tasks = g.ids.len(),
            runtime_s = t,
            class_best_x = hflow::choose_instances(cores.max(x), g.ids.len() as u64, p),
            predicted_s = hflow::makespan(x, cores.max(x), g.ids.len() as u64, p),
            "hflow group"
        );
    }
    Box::new(Classes::new(groups, instances, cores, params))
}
