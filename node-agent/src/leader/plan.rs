//! Turning `--partition` and the site's calibration into the leader's [`Partition`]: HFlow's
//! plan needs the tasks' runtime groups, read once from the ledger when the file has more than
//! one; a file without runtime hints is one group, split by ranges without reading anything.

use htc_core::hflow::{self, Params};
use htc_core::partition::{Classes, Even, Grouper, Partition, Plan};

use crate::ledger::Ledger;
use htc_core::task::State;

/// The partition of tasks `1..=total` among `instances` instances of `cores` cores in all.
pub fn partition(
    ledger: &Ledger,
    total: u64,
    plan: Plan,
    instances: usize,
    cores: u64,
    params: Params,
) -> anyhow::Result<Box<dyn Partition>> {
    let ids = 1..total + 1;
    if plan == Plan::Even {
        return Ok(Box::new(Even::new(ids, instances)));
    }
    let read = ledger.read()?;
    if read.meta_u64("groups")? == Some(1) {
        return Ok(Box::new(Even::planned(ids, instances, cores, params)));
    }
    // Only tasks still to run: after a resume the plan splits what is left.
    let mut grouper = Grouper::default();
    read.for_each(|id, r| {
        if r.state() == State::Pending {
            grouper.add(id, r.priority, r.class, r.runtime_ms);
        }
    })?;
    let groups = grouper.finish();
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
    Ok(Box::new(Classes::new(groups, instances, cores, params)))
}
