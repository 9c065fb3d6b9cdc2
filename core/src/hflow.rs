//! HFlow's partition plan (papers/000 §4.2–4.4, Algorithm 1): how many 2nd-level instances to
//! split C cores into, how many of the J tasks each gets, and how classes of different runtimes
//! share the cores. Pure arithmetic over the calibrated parameters; the schedulers turn the plan
//! into blocks of task ids and correct it at run time (stealing) when reality differs.

/// The calibrated costs, in seconds (§4.2.2).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Params {
    /// Time to start one 2nd-level instance.
    pub s: f64,
    /// Time for an instance to dispatch one task.
    pub d: f64,
    /// Runtime of one task.
    pub t: f64,
}

/// The per-instance runtime with the tasks spread evenly over `x` instances (eqs. 3 and 4).
pub fn instance_runtime(x: u64, cores: u64, tasks: u64, p: Params) -> f64 {
    let (x, c, j) = (x as f64, cores as f64, tasks as f64);
    if p.t >= p.d * c / x {
        // Each task outlasts one dispatch round over the instance's cores: the last core's
        // tasks, after the round's start-up, decide.
        p.d * c / x + p.t * j / c
    } else {
        // Dispatch is the bottleneck: every task of the instance is dispatched in turn.
        p.d * j / x + p.t
    }
}

/// T(x), the job's expected runtime with `x` instances started one after another (eq. 5).
pub fn makespan(x: u64, cores: u64, tasks: u64, p: Params) -> f64 {
    x as f64 * p.s + instance_runtime(x, cores, tasks, p)
}

/// The divisors of `n` in increasing order (Algorithm 1, line 1), in O(√n).
pub fn divisors(n: u64) -> Vec<u64> {
    let (mut low, mut high) = (Vec::new(), Vec::new());
    let mut k = 1;
    while k * k <= n {
        if n.is_multiple_of(k) {
            low.push(k);
            if k != n / k {
                high.push(n / k);
            }
        }
        k += 1;
    }
    low.extend(high.into_iter().rev());
    low
}

/// argmin over the divisors of `cores` of T(x) (Algorithm 1, lines 2–3); ties go to fewer
/// instances, which cost less to start and to watch.
pub fn choose_instances(cores: u64, tasks: u64, p: Params) -> u64 {
    let mut best = (1, f64::INFINITY);
    for x in divisors(cores.max(1)) {
        let t = makespan(x, cores, tasks, p);
        if t < best.1 {
            best = (x, t);
        }
    }
    best.0
}

/// H_1..H_x (eq. 10 and Algorithm 1, lines 4–11): instances started earlier get more tasks so
/// that all finish together. Shares are clamped so none is negative and they sum to `tasks`
/// (the paper's ceilings can overshoot J when s is large against T_r).
pub fn shares(x: u64, cores: u64, tasks: u64, p: Params) -> Vec<u64> {
    let x = x.max(1);
    let even = tasks as f64 / x as f64;
    let w = weights(x, cores, tasks, p);
    let mut left = tasks;
    let mut h = Vec::with_capacity(x as usize);
    for &wi in &w[..x as usize - 1] {
        let raw = (even * wi).ceil();
        let hi = if raw.is_finite() && raw > 0.0 { (raw as u64).min(left) } else { 0 };
        left -= hi;
        h.push(hi);
    }
    h.push(left);
    h
}

/// Eq. 10's shares rounded to the nearest whole task (largest remainder) instead of up: the
/// scheduler's version. Algorithm 1's ceilings give each of the first x − 1 instances up to one
/// task too many and the last all of the deficit, which is invisible at 64,000 tasks and a
/// skew of a whole round at 8 (shares 3, 3, 2, 0 of 8 long tasks on 4 instances instead of
/// 2 each). Negative shares are clamped to 0 and the rest scaled to sum to `tasks`.
pub fn shares_rounded(x: u64, cores: u64, tasks: u64, p: Params) -> Vec<u64> {
    split(tasks, &weights(x, cores, tasks, p))
}

/// Eq. 10's relative shares 1 + (1 + x − 2i)·s / (2·T_r) of instances i = 1..x, negative ones
/// clamped to 0. Several classes run on the same instances one after another split each class
/// by the weights of the whole job, since an instance's start delay is spread over all its work.
pub fn weights(x: u64, cores: u64, tasks: u64, p: Params) -> Vec<f64> {
    let x = x.max(1);
    let tr = instance_runtime(x, cores, tasks, p);
    (1..=x)
        .map(|i| {
            let skew = if tr > 0.0 { (1.0 + x as f64 - 2.0 * i as f64) * p.s / (2.0 * tr) } else { 0.0 };
            let h = 1.0 + skew;
            if h.is_finite() {
                h.max(0.0)
            } else {
                0.0
            }
        })
        .collect()
}

/// `tasks` split in proportion to `weights`, rounded by largest remainder (sums to `tasks`);
/// evenly when every weight is 0.
pub fn split(tasks: u64, weights: &[f64]) -> Vec<u64> {
    let n = weights.len().max(1);
    let sum: f64 = weights.iter().sum();
    let exact: Vec<f64> = if sum > 0.0 {
        weights.iter().map(|w| w / sum * tasks as f64).collect()
    } else {
        vec![tasks as f64 / n as f64; n]
    };
    let mut out: Vec<u64> = exact.iter().map(|e| e.floor() as u64).collect();
    let left = tasks.saturating_sub(out.iter().sum());
    let mut order: Vec<usize> = (0..out.len()).collect();
    order.sort_by(|&a, &b| (exact[b] - exact[b].floor()).total_cmp(&(exact[a] - exact[a].floor())).then(a.cmp(&b)));
    for &i in order.iter().take(left as usize) {
        out[i] += 1;
    }
    out
}

/// The plan for one class of tasks: `shares.len()` instances of `cores / shares.len()` cores.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub cores: u64,
    pub shares: Vec<u64>,
}

impl Plan {
    pub fn instances(&self) -> u64 {
        self.shares.len() as u64
    }
    pub fn cores_per_instance(&self) -> u64 {
        self.cores / self.instances().max(1)
    }
}

/// Algorithm 1.
pub fn plan(cores: u64, tasks: u64, p: Params) -> Plan {
    let x = choose_instances(cores, tasks, p);
    Plan { cores, shares: shares(x, cores, tasks, p) }
}

/// Cores per class (eq. 11): C_i proportional to the class's core-seconds J_i·t_i, rounded to
/// whole cores by largest remainder, at least one core per class that has tasks while cores last.
/// `classes` holds (J_i, t_i) pairs; the result sums to `cores`.
pub fn class_cores(cores: u64, classes: &[(u64, f64)]) -> Vec<u64> {
    let work: Vec<f64> = classes.iter().map(|&(j, t)| if j > 0 { j as f64 * t.max(0.0) } else { 0.0 }).collect();
    let total: f64 = work.iter().sum();
    let with_tasks: Vec<usize> = (0..classes.len()).filter(|&i| classes[i].0 > 0).collect();
    let mut out = vec![0u64; classes.len()];
    if with_tasks.is_empty() || cores == 0 {
        return out;
    }
    // Zero runtimes everywhere: share by task count instead.
    let weight: Vec<f64> = if total > 0.0 { work } else { classes.iter().map(|&(j, _)| j as f64).collect() };
    let sum: f64 = weight.iter().sum();
    let exact: Vec<f64> = weight.iter().map(|w| w / sum * cores as f64).collect();
    for &i in &with_tasks {
        out[i] = exact[i].floor() as u64;
    }
    // Each floor loses less than a core, so fewer cores are left than classes with tasks.
    let left = cores - out.iter().sum::<u64>();
    let mut order = with_tasks.clone();
    order.sort_by(|&a, &b| (exact[b] - exact[b].floor()).total_cmp(&(exact[a] - exact[a].floor())).then(a.cmp(&b)));
    for &i in order.iter().take(left as usize) {
        out[i] += 1;
    }
    // Every class with tasks gets a core, taken from the largest, while there are enough cores.
    for &i in &with_tasks {
        if out[i] == 0 {
            let Some(donor) = (0..out.len()).filter(|&k| out[k] > 1).max_by_key(|&k| out[k]) else { break };
            out[donor] -= 1;
            out[i] = 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9 * b.abs().max(1.0)
    }

    #[test]
    fn divisors_in_order() {
        assert_eq!(divisors(1), vec![1]);
        assert_eq!(divisors(12), vec![1, 2, 3, 4, 6, 12]);
        assert_eq!(divisors(64), vec![1, 2, 4, 8, 16, 32, 64]);
        assert_eq!(divisors(49), vec![1, 7, 49]);
        assert_eq!(divisors(24_000).len(), 56); // 2^6 · 3 · 5^3: 7 · 2 · 4
    }

    /// Worked by hand. C = 64, J = 64,000, s = 2 s, d = 0.05 s, t = 0.01 s. Since
    /// t < d·C/x for every x ≤ 64 (0.01 < 3.2/x), eq. 5's second case holds:
    /// T(x) = 2x + 64,000·0.05/x + 0.01 = 2x + 3,200/x + 0.01, so
    /// T(16) = 32 + 200 + 0.01 = 232.01, T(32) = 64 + 100 + 0.01 = 164.01,
    /// T(64) = 128 + 50 + 0.01 = 178.01; the minimum is x = 32.
    /// Then T_r = d·J/x + t = 0.05·2,000 + 0.01 = 100.01 (eq. 4) and eq. 10 gives
    /// H_i = ⌈2,000·(1 + (33 − 2i)·2/(2·100.01))⌉ = ⌈2,000 + 2,000·(33 − 2i)/100.01⌉:
    /// H_1 = ⌈2,000 + 62,000/100.01⌉ = ⌈2,619.938⌉ = 2,620, H_2 = ⌈2,579.942⌉ = 2,580,
    /// H_16 = ⌈2,019.998⌉ = 2,020, H_17 = ⌈1,980.002⌉ = 1,981, H_31 = ⌈1,420.058⌉ = 1,421.
    /// For the sum, pair k = 33 − 2i with −k: ⌈2,000 + a⌉ + ⌈2,000 − a⌉ = 4,001 for non-integer a,
    /// so k = ±1 … ±29 give 15 × 4,001 = 60,015, plus H_1 = 2,620: Σ_{i=1..31} H_i = 62,635 and
    /// H_32 = 64,000 − 62,635 = 1,365 (Algorithm 1, line 11).
    #[test]
    fn worked_example_dispatch_bound() {
        let p = Params { s: 2.0, d: 0.05, t: 0.01 };
        assert!(close(makespan(16, 64, 64_000, p), 232.01));
        assert!(close(makespan(32, 64, 64_000, p), 164.01));
        assert!(close(makespan(64, 64, 64_000, p), 178.01));
        assert_eq!(choose_instances(64, 64_000, p), 32);
        assert!(close(instance_runtime(32, 64, 64_000, p), 100.01));
        let h = shares(32, 64, 64_000, p);
        assert_eq!(h.len(), 32);
        assert_eq!((h[0], h[1], h[15], h[16], h[30]), (2_620, 2_580, 2_020, 1_981, 1_421));
        assert_eq!(h.iter().sum::<u64>(), 64_000);
        assert_eq!(h[..31].iter().sum::<u64>(), 62_635);
        assert_eq!(h[31], 1_365);
        assert_eq!(plan(64, 64_000, p), Plan { cores: 64, shares: h });
    }

    /// Worked by hand. C = 12, J = 1,200, s = 1 s, d = 0.01 s, t = 1 s. Here t ≥ d·C/x for every
    /// x (1 ≥ 0.12/x), eq. 5's first case: T(x) = x + 0.12/x + 1,200/12 = x + 0.12/x + 100;
    /// T(1) = 101.12, T(2) = 102.06, so one instance: starting more costs more than it saves.
    #[test]
    fn worked_example_runtime_bound() {
        let p = Params { s: 1.0, d: 0.01, t: 1.0 };
        assert!(close(makespan(1, 12, 1_200, p), 101.12));
        assert!(close(makespan(2, 12, 1_200, p), 102.06));
        assert!(close(makespan(12, 12, 1_200, p), 12.0 + 0.01 + 100.0));
        assert_eq!(choose_instances(12, 1_200, p), 1);
        assert_eq!(shares(1, 12, 1_200, p), vec![1_200]);
    }

    /// Worked by hand. C = 4, J = 10, s = 10 s, d = 1 s, t = 0 s, x = 4. Eq. 4: T_r = 1·10/4 + 0 =
    /// 2.5 and (1 + 4 − 2i)·10/(2·2.5) = 2·(5 − 2i), so H_1 = ⌈2.5·(1 + 6)⌉ = 18 > J: clamped
    /// to 10, and every later share is 0.
    #[test]
    fn shares_are_clamped_when_the_paper_overshoots() {
        let p = Params { s: 10.0, d: 1.0, t: 0.0 };
        assert_eq!(shares(4, 4, 10, p), vec![10, 0, 0, 0]);
    }

    /// Rounded shares: even when s is negligible, however few the tasks; otherwise within one
    /// task of Algorithm 1's ceilings (worked example above: 2,619.94 → 2,620, 1,420.06 → 1,420).
    #[test]
    fn rounded_shares_are_even_at_small_s_and_near_the_paper_otherwise() {
        let p = Params { s: 0.002, d: 0.0005, t: 3.0 };
        assert_eq!(shares(4, 8, 8, p), vec![3, 3, 2, 0], "the paper's ceilings skew small jobs");
        assert_eq!(shares_rounded(4, 8, 8, p), vec![2, 2, 2, 2]);
        let p = Params { s: 2.0, d: 0.05, t: 0.01 };
        let r = shares_rounded(32, 64, 64_000, p);
        assert_eq!(r.iter().sum::<u64>(), 64_000);
        assert_eq!((r[0], r[1], r[15], r[16], r[30]), (2_620, 2_580, 2_020, 1_980, 1_420));
        let h = shares(32, 64, 64_000, p);
        assert!(r.iter().zip(&h).take(31).all(|(a, b)| a.abs_diff(*b) <= 1));
        // The clamped case above: relative shares 1 + 2·(5 − 2i) = 7, 3, −1, −5 → 7, 3, 0, 0,
        // scaled to 10 tasks (the paper's ceilings give the first all 10).
        assert_eq!(shares_rounded(4, 4, 10, Params { s: 10.0, d: 1.0, t: 0.0 }), vec![7, 3, 0, 0]);
    }

    /// Eq. 11 worked by hand: C = 100 cores, classes (J, t) = (100, 1), (100, 2), (50, 8):
    /// core-seconds 100, 200, 400 of 700, so 14.29, 28.57, 57.14 cores; floors 14 + 28 + 57 = 99,
    /// the one left goes to the largest remainder (0.57 of class 2 vs 0.29 and 0.14): 14, 29, 57.
    #[test]
    fn class_cores_worked_example() {
        assert_eq!(class_cores(100, &[(100, 1.0), (100, 2.0), (50, 8.0)]), vec![14, 29, 57]);
        // Equal numbers of tasks of 1, 2, 4, 8, 16, 32 s on 1,200 cores (HFlow Fig. 4(b)):
        // t_i / 63 of the cores each: 19.05, 38.10, 76.19, 152.38, 304.76, 609.52.
        assert_eq!(
            class_cores(1_200, &[(10, 1.0), (10, 2.0), (10, 4.0), (10, 8.0), (10, 16.0), (10, 32.0)]),
            vec![19, 38, 76, 152, 305, 610]
        );
        // A class too small for a whole core still gets one; a class without tasks gets none.
        assert_eq!(class_cores(10, &[(1_000, 10.0), (1, 0.001), (0, 5.0)]), vec![9, 1, 0]);
        // Zero runtimes: share by task count.
        assert_eq!(class_cores(6, &[(10, 0.0), (20, 0.0)]), vec![2, 4]);
    }

    /// Properties over many random inputs: Σ H_i = J, x divides C, class cores sum to C.
    #[test]
    fn properties() {
        let mut next = crate::test_rng(0x2545_f491_4f6c_dd1d);
        for _ in 0..5_000 {
            let c = 1 + next(4_096);
            let j = next(1_000_000);
            let p = Params {
                s: next(10_000) as f64 / 1_000.0,
                d: next(1_000) as f64 / 100_000.0,
                t: next(100_000) as f64 / 1_000.0,
            };
            let plan = plan(c, j, p);
            let rounded = shares_rounded(plan.instances(), c, j, p);
            assert_eq!(rounded.iter().sum::<u64>(), j, "rounded Σ H_i = J: {c} {j} {p:?}");
            assert_eq!(c % plan.instances(), 0, "x divides C: {c} {j} {p:?}");
            assert_eq!(plan.shares.iter().sum::<u64>(), j, "Σ H_i = J: {c} {j} {p:?}");
            let best = makespan(plan.instances(), c, j, p);
            assert!(divisors(c).iter().all(|&x| makespan(x, c, j, p) >= best));
            let k = 1 + next(8) as usize;
            let classes: Vec<(u64, f64)> = (0..k).map(|_| (next(1_000), next(10_000) as f64 / 100.0)).collect();
            let cc = class_cores(c, &classes);
            let any = classes.iter().any(|cl| cl.0 > 0);
            assert_eq!(cc.iter().sum::<u64>(), if any { c } else { 0 }, "{c} {classes:?} -> {cc:?}");
            for (i, cl) in classes.iter().enumerate() {
                if cl.0 == 0 {
                    assert_eq!(cc[i], 0);
                }
            }
            if classes.iter().filter(|cl| cl.0 > 0).count() as u64 <= c {
                assert!(classes.iter().zip(&cc).all(|(cl, &n)| cl.0 == 0 || n >= 1), "{c} {classes:?} -> {cc:?}");
            }
        }
    }
}
