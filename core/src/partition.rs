//! Which instance runs which tasks. The leader asks a [`Partition`] for the next block of task
//! ids for an instance. Two plans: [`Even`] (one contiguous, even split of all ids: the paper's
//! "FluxP" baseline) and [`Classes`] (HFlow, papers/000 §4.2–4.4: every class of runtimes is
//! partitioned on its own by eq. 10, and each instance runs its shares longest class first).
//! Both let an instance whose shares are drained steal from the largest remaining share.

use std::collections::VecDeque;
use std::ops::Range;

use crate::hflow;

/// Task ids handed to one instance at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Block {
    /// Consecutive ids (read with one cursor walk).
    Range(Range<u64>),
    /// Ids of one class, increasing.
    Ids(Vec<u64>),
}

impl Block {
    pub fn len(&self) -> u64 {
        match self {
            Block::Range(r) => r.end - r.start,
            Block::Ids(v) => v.len() as u64,
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Hands out task ids to instances. Blocks may contain tasks that are already done (after a
/// resume); the caller skips those, so partitions stay arithmetic over ids.
pub trait Partition: Send {
    /// The next ids for `instance`, at most `max` of them, or `None` when nothing is left for it.
    /// Once its own shares are gone, it may take at most `steal` ids of another's share: an
    /// instance should steal only what it can start now, or it hoards long tasks that an idle
    /// (or late) instance would have run at the same time.
    fn take(&mut self, instance: usize, max: u64, steal: u64) -> Option<Block>;
    /// Ids not yet handed out, over all instances.
    fn remaining(&self) -> u64;
    /// The highest `priority=` among the ids not handed out yet, and how many have it; `None`
    /// for a plan without priorities, or when nothing is left.
    fn top_priority(&self) -> Option<(i16, u64)> {
        None
    }
    /// A task of `class` with runtime hint `hint_ms` (0: none) ran `ran_ms` and succeeded. A
    /// plan that orders work by runtime learns the runtimes the task file did not give.
    fn observe(&mut self, _class: u16, _hint_ms: u32, _ran_ms: u64) {}
    /// The instances changed (an allocation joined the run, or one left): what is not handed
    /// out yet is split anew, instance i getting a part in proportion to `weights[i]` (0: none,
    /// as for an instance that is gone). Nothing handed out moves; ids keep their order.
    fn replan(&mut self, weights: &[f64]);
}

/// Eq. 10 over instances that all run already: the start-delay skew is gone (every instance
/// started before the re-plan), so each instance's share is in proportion to its cores.
pub fn live_weights(cores: &[u64]) -> Vec<f64> {
    cores.iter().map(|&c| c as f64).collect()
}

/// Which plan `--partition` selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Plan {
    /// HFlow: classes partitioned on their own, longest first on every instance.
    #[default]
    Hflow,
    /// One even split of the ids, classes ignored (HFlow's "FluxP" baseline).
    Even,
}

impl Plan {
    pub fn name(self) -> &'static str {
        match self {
            Plan::Hflow => "hflow",
            Plan::Even => "even",
        }
    }
}

impl std::str::FromStr for Plan {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "hflow" => Ok(Plan::Hflow),
            "even" => Ok(Plan::Even),
            _ => Err(format!("unknown partition {s:?} (expected hflow or even)")),
        }
    }
}

/// The instances' shares of one sequence of positions `0..len`: instance i owns the ranges in
/// `blocks[i]`, taken front first (one range, until the run's allocations change: a re-plan cuts
/// what is left anew, and a share may then span what were several). An instance whose share is
/// drained takes the back of the largest remaining share (half of it at most, and no more than
/// it may steal), so a slow instance never holds the tail hostage.
#[derive(Debug, Clone)]
struct Shares {
    blocks: Vec<VecDeque<Range<u64>>>,
    /// Positions in each block.
    lens: Vec<u64>,
    /// Positions in all blocks: at the tail of a run every idle agent's report asks for more,
    /// and a scan of a thousand empty blocks each time was a fifth of the leader's time.
    left: u64,
}

impl Shares {
    /// Contiguous shares of the given sizes, in order.
    fn of_sizes(sizes: &[u64]) -> Shares {
        let mut s = Shares { blocks: Vec::new(), lens: Vec::new(), left: 0 };
        s.cut(std::iter::once(0..sizes.iter().sum()).collect(), sizes);
        s
    }

    fn even(len: u64, instances: usize) -> Shares {
        let n = instances.max(1) as u64;
        let sizes: Vec<u64> = (0..n).map(|i| len * (i + 1) / n - len * i / n).collect();
        Shares::of_sizes(&sizes)
    }

    /// Lays `ranges` end to end and gives instance i the next `sizes[i]` positions of them.
    fn cut(&mut self, ranges: Vec<Range<u64>>, sizes: &[u64]) {
        self.blocks = vec![VecDeque::new(); sizes.len()];
        self.lens = sizes.to_vec();
        self.left = sizes.iter().sum();
        let mut ranges = ranges.into_iter().filter(|r| !r.is_empty());
        let mut current = ranges.next();
        for (block, &size) in self.blocks.iter_mut().zip(sizes) {
            let mut need = size;
            while need > 0 {
                let Some(r) = current.as_mut() else { break };
                let n = need.min(r.end - r.start);
                block.push_back(r.start..r.start + n);
                r.start += n;
                need -= n;
                if r.is_empty() {
                    current = ranges.next();
                }
            }
        }
    }

    /// What is not handed out yet, split anew among the instances by `weights` (an instance
    /// beyond the weights gets nothing): ids keep their order, so each share stays a few ranges.
    fn replan(&mut self, weights: &[f64]) {
        let ranges: Vec<Range<u64>> = self.blocks.iter().flatten().cloned().collect();
        let mut sizes = hflow::split(self.left, weights);
        sizes.resize(weights.len().max(self.blocks.len()), 0);
        self.cut(ranges, &sizes);
    }

    fn own(&mut self, instance: usize) -> &mut VecDeque<Range<u64>> {
        if instance >= self.blocks.len() {
            self.blocks.resize(instance + 1, VecDeque::new());
            self.lens.resize(instance + 1, 0);
        }
        &mut self.blocks[instance]
    }

    /// Up to `max` positions of `instance`'s own share, from its front.
    fn take_own(&mut self, instance: usize, max: u64) -> Option<Range<u64>> {
        if max == 0 || !self.has_own(instance) {
            return None;
        }
        let b = self.own(instance);
        let front = b.front_mut()?;
        let end = front.start + max.min(front.end - front.start);
        let r = front.start..end;
        front.start = end;
        if front.is_empty() {
            b.pop_front();
        }
        let n = r.end - r.start;
        self.lens[instance] -= n;
        self.left -= n;
        Some(r)
    }

    /// Moves up to `steal` positions from the back of the largest share to `instance`'s (whose
    /// own share must be empty). False when there is nothing to steal.
    fn steal_into(&mut self, instance: usize, steal: u64) -> bool {
        if steal == 0 || self.left == 0 || !self.own(instance).is_empty() {
            return false;
        }
        let Some((victim, largest)) = self.lens.iter().copied().enumerate().max_by_key(|&(_, n)| n) else {
            return false;
        };
        if largest == 0 {
            return false;
        }
        let mut want = largest.div_ceil(2).min(steal);
        self.lens[victim] -= want;
        self.lens[instance] = want;
        let mut stolen = VecDeque::new();
        while want > 0 {
            let back = self.blocks[victim].back_mut().expect("lens counts the ranges");
            let n = want.min(back.end - back.start);
            stolen.push_front(back.end - n..back.end);
            back.end -= n;
            if back.is_empty() {
                self.blocks[victim].pop_back();
            }
            want -= n;
        }
        self.blocks[instance] = stolen;
        true
    }

    fn remaining(&self) -> u64 {
        self.left
    }

    /// Whether `instance` has positions of its own left.
    fn has_own(&self, instance: usize) -> bool {
        self.lens.get(instance).is_some_and(|&n| n > 0)
    }
}

/// Even split: instance i owns the i-th of n contiguous blocks of ids.
#[derive(Debug, Clone)]
pub struct Even {
    first: u64,
    shares: Shares,
}

impl Even {
    pub fn new(ids: Range<u64>, instances: usize) -> Self {
        Even { first: ids.start, shares: Shares::even(ids.end.saturating_sub(ids.start), instances) }
    }

    /// Contiguous shares sized by HFlow's eq. 10 (one class of tasks of runtime `params.t`).
    pub fn planned(ids: Range<u64>, instances: usize, cores: u64, params: hflow::Params) -> Self {
        let x = instances.max(1) as u64;
        let sizes = hflow::shares_rounded(x, cores.max(x), ids.end.saturating_sub(ids.start), params);
        Even { first: ids.start, shares: Shares::of_sizes(&sizes) }
    }
}

impl Partition for Even {
    fn take(&mut self, instance: usize, max: u64, steal: u64) -> Option<Block> {
        if max == 0 {
            return None;
        }
        let r = match self.shares.take_own(instance, max) {
            Some(r) => r,
            None if self.shares.steal_into(instance, steal) => self.shares.take_own(instance, max)?,
            None => return None,
        };
        Some(Block::Range(self.first + r.start..self.first + r.end))
    }

    fn remaining(&self) -> u64 {
        self.shares.remaining()
    }

    fn replan(&mut self, weights: &[f64]) {
        self.shares.replan(weights);
    }
}

/// The runtime group of a task for [`Classes`]: its class and its runtime hint rounded to a
/// quarter of an octave (so a file of a million distinct hints still makes few groups). Tasks
/// without a hint form group 0 of their class.
pub fn group_key(class: u16, runtime_ms: u32) -> u32 {
    let bucket = if runtime_ms == 0 { 0 } else { 1 + (4.0 * (runtime_ms as f64).log2()).floor() as u32 };
    ((class as u32) << 8) | bucket.min(255)
}

/// Tasks of one runtime group and priority: their ids in increasing order and their mean
/// runtime hint.
#[derive(Debug, Clone, Default)]
pub struct Group {
    pub ids: Vec<u64>,
    /// Mean runtime in seconds; `None` when the tasks carry no hint.
    pub runtime_s: Option<f64>,
    /// `group_key` of its tasks.
    pub key: u32,
    /// `priority=` of its tasks: higher goes first, whatever the runtimes.
    pub priority: i16,
}

/// Collects tasks into runtime groups, one `add` per task in id order.
#[derive(Debug, Default)]
pub struct Grouper {
    groups: std::collections::BTreeMap<(i16, u32), (Vec<u64>, u64)>,
}

impl Grouper {
    pub fn add(&mut self, id: u64, priority: i16, class: u16, runtime_ms: u32) {
        let g = self.groups.entry((priority, group_key(class, runtime_ms))).or_default();
        g.0.push(id);
        g.1 += runtime_ms as u64;
    }

    pub fn finish(self) -> Vec<Group> {
        self.groups
            .into_iter()
            .map(|((priority, key), (ids, ms))| {
                let hinted = key & 0xff != 0;
                let runtime_s = hinted.then(|| ms as f64 / 1000.0 / ids.len() as f64);
                Group { ids, runtime_s, key, priority }
            })
            .collect()
    }
}

/// HFlow's plan at run time: every runtime group is split among the instances on its own, by
/// eq. 10 (instances started earlier get more), and an instance takes its shares longest group
/// first. Over a run each group then holds cores in proportion to its core-seconds, as eq. 11
/// asks, but in time rather than in space: all groups end together on every instance, and the
/// tail of the run is made of its shortest tasks. Groups without a runtime hint go first (they
/// may be long). An instance whose shares are all drained steals from the largest remaining
/// share of the longest group that has one.
#[derive(Debug, Clone)]
pub struct Classes {
    /// In the order instances take them: longest first.
    groups: Vec<ClassGroup>,
}

#[derive(Debug, Clone)]
struct ClassGroup {
    ids: Vec<u64>,
    shares: Shares,
    key: u32,
    priority: i16,
    /// The hint's mean, in seconds, if the tasks have one.
    hinted_s: Option<f64>,
    /// Successful runs seen: their count and total seconds.
    seen: (u64, f64),
}

/// Runs of a hint-less group seen before its mean orders it among the others.
pub const LEARN_AFTER: u64 = 8;

impl ClassGroup {
    /// Its runtime as far as known: the hint, else what its tasks took once `LEARN_AFTER` of them
    /// ran, else unknown, which sorts first (it may be long).
    fn runtime_s(&self) -> f64 {
        match (self.hinted_s, self.seen) {
            (Some(h), _) => h,
            (None, (n, total)) if n >= LEARN_AFTER => total / n as f64,
            _ => f64::INFINITY,
        }
    }
}

impl Classes {
    /// `cores` and `params` feed eq. 10, with `params.t` replaced by the groups' mean runtime:
    /// the instances' weights come from the whole job, and every group is split by them.
    pub fn new(mut groups: Vec<Group>, instances: usize, cores: u64, params: hflow::Params) -> Self {
        groups.retain(|g| !g.ids.is_empty());
        let x = instances.max(1) as u64;
        let tasks: u64 = groups.iter().map(|g| g.ids.len() as u64).sum();
        let work: f64 = groups.iter().map(|g| g.ids.len() as f64 * g.runtime_s.unwrap_or(params.t)).sum();
        let t = if tasks > 0 { work / tasks as f64 } else { params.t };
        let weights = hflow::weights(x, cores.max(x), tasks, hflow::Params { t, ..params });
        let groups = groups
            .into_iter()
            .map(|g| {
                let sizes = hflow::split(g.ids.len() as u64, &weights);
                ClassGroup {
                    ids: g.ids,
                    shares: Shares::of_sizes(&sizes),
                    key: g.key,
                    priority: g.priority,
                    hinted_s: g.runtime_s,
                    seen: (0, 0.0),
                }
            })
            .collect();
        let mut c = Classes { groups };
        c.sort();
        c
    }

    /// Highest priority first; within a priority longest first; equal runtimes keep their key
    /// order (class, then runtime bucket).
    fn sort(&mut self) {
        self.groups.sort_by(|a, b| {
            b.priority.cmp(&a.priority).then(b.runtime_s().total_cmp(&a.runtime_s())).then(a.key.cmp(&b.key))
        });
    }

    /// Whether `instance` still has its own share of a group of lower priority than group `i`.
    fn owns_lower_than(&self, instance: usize, i: usize) -> bool {
        let p = self.groups[i].priority;
        self.groups[i + 1..].iter().any(|g| g.priority < p && g.shares.has_own(instance))
    }
}

impl Partition for Classes {
    fn take(&mut self, instance: usize, max: u64, steal: u64) -> Option<Block> {
        if max == 0 {
            return None;
        }
        // Its own shares first, longest group first: a core it cannot fill with its own long
        // tasks runs its own shorter ones (the victim would start its long tasks as soon). But
        // higher-priority work left anywhere goes before its own lower-priority share: it steals
        // that first, as much as it can start.
        let mut own = None;
        for i in 0..self.groups.len() {
            if let Some(r) = self.groups[i].shares.take_own(instance, max) {
                own = Some((i, r));
                break;
            }
            if self.groups[i].shares.remaining() > 0 && self.owns_lower_than(instance, i) {
                let g = &mut self.groups[i];
                if let Some(r) =
                    g.shares.steal_into(instance, steal).then(|| g.shares.take_own(instance, max)).flatten()
                {
                    own = Some((i, r));
                    break;
                }
            }
        }
        let (ids, r) = match own {
            Some((i, r)) => (&*self.groups[i].ids, r),
            // Drained: steal, longest group first, no more than it can start now.
            None => self.groups.iter_mut().find_map(|g| {
                g.shares
                    .steal_into(instance, steal)
                    .then(|| g.shares.take_own(instance, max))
                    .flatten()
                    .map(|r| (&*g.ids, r))
            })?,
        };
        Some(Block::Ids(ids[r.start as usize..r.end as usize].to_vec()))
    }

    fn remaining(&self) -> u64 {
        self.groups.iter().map(|g| g.shares.remaining()).sum()
    }

    fn replan(&mut self, weights: &[f64]) {
        for g in &mut self.groups {
            g.shares.replan(weights);
        }
    }

    fn top_priority(&self) -> Option<(i16, u64)> {
        // Groups are sorted highest priority first.
        let p = self.groups.iter().find(|g| g.shares.remaining() > 0)?.priority;
        Some((p, self.groups.iter().filter(|g| g.priority == p).map(|g| g.shares.remaining()).sum()))
    }

    /// Hint-less groups learn their runtime from their first successful runs, and take their
    /// place in the longest-first order once `LEARN_AFTER` have ended (and again whenever their
    /// mean moves past another group's).
    fn observe(&mut self, class: u16, hint_ms: u32, ran_ms: u64) {
        if hint_ms != 0 {
            return; // the hint orders its group
        }
        let key = group_key(class, hint_ms);
        // The class's groups of every priority learn alike.
        for g in self.groups.iter_mut().filter(|g| g.key == key && g.hinted_s.is_none()) {
            g.seen = (g.seen.0 + 1, g.seen.1 + ran_ms as f64 / 1000.0);
        }
        let sorted =
            self.groups.windows(2).all(|w| w[0].priority > w[1].priority || w[0].runtime_s() >= w[1].runtime_s());
        if !sorted {
            self.sort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids_of(b: &Block) -> Vec<u64> {
        match b {
            Block::Range(r) => r.clone().collect(),
            Block::Ids(v) => v.clone(),
        }
    }

    #[test]
    fn every_id_exactly_once_with_stealing() {
        let mut p = Even::new(1..10_001, 4);
        let mut seen = vec![0u8; 10_001];
        let mut turn = 0usize;
        // Instance 3 is slow: it takes one id per round, the others 7.
        while let Some(r) = p.take(turn % 4, if turn % 4 == 3 { 1 } else { 7 }, 7) {
            for id in ids_of(&r) {
                seen[id as usize] += 1;
            }
            turn += 1;
        }
        assert_eq!(seen[0], 0);
        assert!(seen[1..].iter().all(|&c| c == 1));
        assert_eq!(p.remaining(), 0);
    }

    #[test]
    fn blocks_are_even_and_contiguous() {
        let mut p = Even::new(0..10, 3);
        assert_eq!(p.take(0, 100, 100), Some(Block::Range(0..3)));
        assert_eq!(p.take(1, 100, 100), Some(Block::Range(3..6)));
        assert_eq!(p.take(2, 100, 100), Some(Block::Range(6..10)));
        assert_eq!(p.take(0, 100, 100), None);
    }

    #[test]
    fn drained_instance_steals_half_of_the_largest() {
        let mut p = Even::new(0..100, 2);
        assert_eq!(p.take(0, 50, 100), Some(Block::Range(0..50)));
        assert_eq!(p.take(0, 100, 100), Some(Block::Range(75..100)));
        assert_eq!(p.take(1, 100, 100), Some(Block::Range(50..75)));
        assert_eq!(p.take(5, 1, 1), None);
    }

    #[test]
    fn stealing_takes_no_more_than_the_thief_may() {
        // 8 long tasks on 4 instances of 2 cores: the first to ask gets its own 2, and steals
        // only for cores it has free, so the others keep theirs.
        let mut p = Even::new(0..8, 4);
        assert_eq!(p.take(0, 32, 0), Some(Block::Range(0..2)));
        assert_eq!(p.take(0, 30, 0), None, "nothing free: nothing stolen");
        assert_eq!(p.take(0, 30, 1), Some(Block::Range(7..8)), "one core free: one task, from the back of the largest");
        assert_eq!(p.take(3, 32, 0), Some(Block::Range(6..7)));
        assert_eq!(p.take(1, 32, 0), Some(Block::Range(2..4)));
        assert_eq!(p.remaining(), 2);
    }

    fn ids(b: Option<Block>) -> Vec<u64> {
        b.map(|b| ids_of(&b)).unwrap_or_default()
    }

    /// Two groups of four ids each on two instances: each instance gets half of each group,
    /// the longer group first; a drained instance steals the longer group's remainder first.
    #[test]
    fn classes_go_longest_first_and_steal_long_work_first() {
        let mut g = Grouper::default();
        for id in 1..=8 {
            // Odd ids run 10 ms, even ids 320 ms.
            g.add(id, 0, 0, if id % 2 == 1 { 10 } else { 320 });
        }
        let groups = g.finish();
        assert_eq!(groups.len(), 2);
        let p0 = hflow::Params { s: 0.0, d: 0.0, t: 0.0 };
        let mut p = Classes::new(groups, 2, 2, p0);
        assert_eq!(p.remaining(), 8);
        assert_eq!(ids(p.take(0, 1, 0)), vec![2], "the long group first");
        assert_eq!(ids(p.take(0, 10, 0)), vec![4], "then the rest of its share of it");
        assert_eq!(ids(p.take(0, 10, 0)), vec![1, 3], "then its share of the short group");
        assert_eq!(ids(p.take(0, 10, 0)), Vec::<u64>::new(), "nothing to steal without free cores");
        assert_eq!(ids(p.take(0, 10, 1)), vec![8], "one free core: the back of the long group");
        assert_eq!(ids(p.take(1, 10, 0)), vec![6]);
        assert_eq!(ids(p.take(1, 10, 0)), vec![5, 7]);
        assert_eq!(p.remaining(), 0);
        assert_eq!(p.take(1, 10, 10), None);
    }

    /// Priorities before runtimes, and across instances: an instance whose own high-priority
    /// share is drained steals another's before it runs its own low-priority share.
    #[test]
    fn higher_priority_goes_first_everywhere() {
        let mut g = Grouper::default();
        for id in 1..=8 {
            // Ids 1-4: priority 0, long; 5-8: priority 3, short.
            if id <= 4 {
                g.add(id, 0, 0, 60_000);
            } else {
                g.add(id, 3, 0, 10);
            }
        }
        let p0 = hflow::Params { s: 0.0, d: 0.0, t: 0.0 };
        let mut p = Classes::new(g.finish(), 2, 2, p0);
        assert_eq!(ids(p.take(0, 1, 1)), vec![5], "the high priority first, short as it is");
        assert_eq!(ids(p.take(0, 1, 1)), vec![6]);
        // Instance 0's high share is drained, instance 1's is not: it steals from it first.
        assert_eq!(ids(p.take(0, 1, 1)), vec![8]);
        assert_eq!(ids(p.take(0, 1, 1)), vec![7]);
        assert_eq!(ids(p.take(0, 1, 1)), vec![1], "then its own low-priority share");
        assert_eq!(p.top_priority(), Some((0, 3)));
        assert_eq!(ids(p.take(1, 4, 0)), vec![3, 4], "instance 1 has only low priority left");
    }

    #[test]
    fn groups_keep_hintless_tasks_apart_and_first() {
        let mut g = Grouper::default();
        g.add(1, 0, 0, 0);
        g.add(2, 0, 0, 1100);
        g.add(3, 0, 0, 1150); // the same quarter octave as 1100 ms
        g.add(4, 0, 1, 1000); // another class
        let groups = g.finish();
        assert_eq!(groups.len(), 3);
        assert!(groups.iter().any(|g| g.ids == vec![2, 3] && g.runtime_s == Some(1.125)));
        let mut p = Classes::new(groups, 1, 1, hflow::Params { s: 0.0, d: 0.0, t: 1.0 });
        assert_eq!(ids(p.take(0, 10, 0)), vec![1], "no hint: may be long, so first");
    }

    #[test]
    fn hint_less_classes_take_their_place_once_their_runtimes_are_seen() {
        let mut g = Grouper::default();
        (1..=100).for_each(|id| g.add(id, 0, if id <= 50 { 1 } else { 2 }, 0));
        let mut p = Classes::new(g.finish(), 1, 1, hflow::Params { s: 0.0, d: 0.0, t: 1.0 });
        let class = |b: Option<Block>| if ids(b)[0] <= 50 { 1 } else { 2 };
        assert_eq!(class(p.take(0, 1, 0)), 1, "both unknown: in class order");
        // Class 1 is seen to be short; class 2, still unknown, may be long: it goes first.
        (0..LEARN_AFTER - 1).for_each(|_| p.observe(1, 0, 10));
        assert_eq!(class(p.take(0, 1, 0)), 1, "not yet enough runs to go by");
        p.observe(1, 0, 10);
        assert_eq!(class(p.take(0, 1, 0)), 2);
        // Class 2 is seen at 1 s: still longer, still first.
        (0..LEARN_AFTER).for_each(|_| p.observe(2, 0, 1000));
        assert_eq!(class(p.take(0, 1, 0)), 2);
        // Class 1's later runs are long: its mean passes class 2's, and it goes first again.
        (0..LEARN_AFTER * 2).for_each(|_| p.observe(1, 0, 5000));
        assert_eq!(class(p.take(0, 1, 0)), 1);
        // Hinted tasks and unknown classes change nothing.
        p.observe(1, 300, 1_000_000);
        p.observe(9, 0, 1_000_000);
        assert_eq!(class(p.take(0, 1, 0)), 1);
    }

    /// Every id exactly once, over random group layouts, instance speeds and steal limits.
    #[test]
    fn classes_hand_out_every_id_exactly_once() {
        let mut next = crate::test_rng(0x9e37_79b9_7f4a_7c15);
        for _ in 0..300 {
            let n = next(2_000);
            let mut g = Grouper::default();
            for id in 1..=n {
                g.add(id, next(3) as i16 - 1, next(3) as u16, [0, 5, 40, 900, 20_000][next(5) as usize]);
            }
            let x = 1 + next(9) as usize;
            let params = hflow::Params { s: next(100) as f64 / 100.0, d: 0.001, t: 1.0 };
            let mut p = Classes::new(g.finish(), x, 24 * x as u64, params);
            let mut seen = vec![0u8; n as usize + 1];
            let mut idle_rounds = 0;
            while p.remaining() > 0 {
                let inst = next(x as u64 + 1) as usize; // one more: a late instance
                match p.take(inst, 1 + next(50), next(5)) {
                    Some(b) => {
                        assert!(!b.is_empty());
                        ids_of(&b).into_iter().for_each(|id| seen[id as usize] += 1);
                        idle_rounds = 0;
                    }
                    None => idle_rounds += 1,
                }
                assert!(idle_rounds < 10_000, "stuck with {} left", p.remaining());
            }
            assert!(seen[1..].iter().all(|&c| c == 1));
        }
    }

    /// A run re-planned as allocations join and leave hands out every id exactly once, and
    /// after a re-plan each live instance owns what is left in proportion to its weight.
    #[test]
    fn re_planning_moves_only_what_is_not_handed_out_and_follows_the_weights() {
        let mut p = Even::new(0..1000, 2);
        assert_eq!(p.take(0, 100, 0), Some(Block::Range(0..100)));
        // A third instance of twice the cores joins: 900 left, split 1:1:2.
        p.replan(&live_weights(&[4, 4, 8]));
        assert_eq!(p.remaining(), 900);
        assert_eq!(p.take(2, 1000, 0), Some(Block::Range(550..1000)), "half of what is left");
        // Instance 0 keeps the front, in order: what it had not taken.
        assert_eq!(p.take(0, 1000, 0), Some(Block::Range(100..325)));
        // Instance 1 leaves: its part goes to the others (a third and two), none to it.
        p.replan(&live_weights(&[4, 0, 8]));
        assert_eq!(p.take(1, 1000, 0), None);
        assert_eq!(p.take(0, 1000, 0).map(|b| b.len()), Some(75));
        let mut seen = vec![0u8; 1000];
        (0..100).chain(100..325).for_each(|i| seen[i] += 1);
        (550..1000).for_each(|i| seen[i] += 1);
        assert_eq!(p.remaining(), 150, "instance 2's two thirds of what instance 1 had");
        seen[325..400].iter_mut().for_each(|c| *c += 1);
        for inst in [0, 2, 0, 2] {
            while let Some(b) = p.take(inst, 7, 7) {
                ids_of(&b).into_iter().for_each(|id| seen[id as usize] += 1);
            }
        }
        assert!(seen.iter().all(|&c| c == 1), "every id exactly once");
    }

    #[test]
    fn classes_re_plan_every_group_and_hand_out_every_id_once() {
        let mut next = crate::test_rng(0x5151_7a7a_0b0b_3c3c);
        for _ in 0..200 {
            let n = next(1_500);
            let mut g = Grouper::default();
            for id in 1..=n {
                g.add(id, next(2) as i16, next(3) as u16, [0, 40, 900, 20_000][next(4) as usize]);
            }
            let mut x = 1 + next(4) as usize;
            let mut p = Classes::new(g.finish(), x, 8 * x as u64, hflow::Params { s: 0.1, d: 0.001, t: 1.0 });
            let mut seen = vec![0u8; n as usize + 1];
            let mut alive: Vec<u64> = vec![8; x];
            let mut rounds = 0;
            while p.remaining() > 0 {
                rounds += 1;
                assert!(rounds < 100_000, "stuck with {} left", p.remaining());
                if next(40) == 0 {
                    // An allocation joins, or an instance leaves (never the last).
                    if next(2) == 0 || alive.iter().filter(|&&c| c > 0).count() < 2 {
                        x += 1;
                        alive.push(1 + next(16));
                    } else {
                        let i = next(x as u64) as usize;
                        alive[i] = 0;
                    }
                    p.replan(&live_weights(&alive));
                    continue;
                }
                let inst = next(x as u64) as usize;
                if alive[inst] == 0 {
                    continue;
                }
                if let Some(b) = p.take(inst, 1 + next(30), next(5)) {
                    ids_of(&b).into_iter().for_each(|id| seen[id as usize] += 1);
                }
            }
            assert!(seen[1..].iter().all(|&c| c == 1));
        }
    }
}
