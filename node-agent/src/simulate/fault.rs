//! Faults at virtual times: what a `--fault` says (a node lost, an agent stopped, a link cut, a
//! node slowed) and which agent it strikes. What they break in the simulated world is
//! `breaking`'s.

/// A fault injected into a simulated run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fault {
    /// The agent's node dies at `at_us`: its connections close, its tasks are gone.
    Lose { agent: u32, at_us: u64 },
    /// The agent process is stopped (SIGSTOP) from `at_us` for `for_us`: it hears, says and
    /// starts nothing meanwhile, while its tasks run on; its connections stay open.
    Stop { agent: u32, at_us: u64, for_us: u64 },
    /// The link between the agent and its parent breaks at `at_us`: both ends see the
    /// connection close, and the agent reaches neither its parent nor the leader for `for_us`
    /// (its tries to reconnect fail until then). Its links to its children stay up.
    Cut { agent: u32, at_us: u64, for_us: u64 },
    /// The agent's node slows down at `at_us`: tasks that start on it from then on take
    /// `factor` times their runtime.
    Slow { agent: u32, at_us: u64, factor: f64 },
}

/// The forms a `--fault` takes.
const FORMS: &str =
    "lose:AGENT@SECONDS, stop:AGENT@SECONDS+SECONDS, cut:AGENT@SECONDS+SECONDS or slow:AGENT@SECONDS*FACTOR";

impl Fault {
    pub fn agent(&self) -> u32 {
        match *self {
            Fault::Lose { agent, .. }
            | Fault::Stop { agent, .. }
            | Fault::Cut { agent, .. }
            | Fault::Slow { agent, .. } => agent,
        }
    }

    pub fn at_us(&self) -> u64 {
        match *self {
            Fault::Lose { at_us, .. }
            | Fault::Stop { at_us, .. }
            | Fault::Cut { at_us, .. }
            | Fault::Slow { at_us, .. } => at_us,
        }
    }
}

impl std::str::FromStr for Fault {
    type Err = String;
    /// As `FORMS` has them; an error names the value and what was wrong with it.
    fn from_str(s: &str) -> Result<Fault, String> {
        let bad = |why: String| format!("`{s}`: {why}");
        let form = || bad(format!("expected {FORMS}"));
        let (kind, rest) = s.split_once(':').ok_or_else(form)?;
        let (agent, when) = rest.split_once('@').ok_or_else(form)?;
        let agent: u32 = agent.parse().map_err(|_| bad(format!("the agent `{agent}` is not a number (0, 1, ...)")))?;
        let secs = |x: &str| -> Result<u64, String> {
            let v: f64 = x.parse().map_err(|_| bad(format!("`{x}` is not a number of seconds")))?;
            (v.is_finite() && v >= 0.0)
                .then(|| (v * 1e6).round() as u64)
                .ok_or_else(|| bad(format!("`{x}` is not a number of seconds, 0 or more")))
        };
        let split = |sep: char, what: &str| {
            when.split_once(sep).ok_or_else(|| bad(format!("expected {kind}:AGENT@SECONDS{sep}{what}")))
        };
        match kind {
            "lose" => Ok(Fault::Lose { agent, at_us: secs(when)? }),
            "stop" => {
                let (at, dur) = split('+', "SECONDS")?;
                Ok(Fault::Stop { agent, at_us: secs(at)?, for_us: secs(dur)? })
            }
            "cut" => {
                let (at, dur) = split('+', "SECONDS")?;
                Ok(Fault::Cut { agent, at_us: secs(at)?, for_us: secs(dur)? })
            }
            "slow" => {
                let (at, factor) = split('*', "FACTOR")?;
                let positive = factor.parse::<f64>().ok().filter(|f| f.is_finite() && *f > 0.0);
                let factor = positive.ok_or_else(|| bad(format!("the factor `{factor}` is not a positive number")))?;
                Ok(Fault::Slow { agent, at_us: secs(at)?, factor })
            }
            _ => Err(form()),
        }
    }
}

impl std::fmt::Display for Fault {
    /// As it was given (`--fault`), in seconds.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = |us: u64| us as f64 / 1e6;
        match *self {
            Fault::Lose { agent, at_us } => write!(f, "lose:{agent}@{}", s(at_us)),
            Fault::Stop { agent, at_us, for_us } => write!(f, "stop:{agent}@{}+{}", s(at_us), s(for_us)),
            Fault::Cut { agent, at_us, for_us } => write!(f, "cut:{agent}@{}+{}", s(at_us), s(for_us)),
            Fault::Slow { agent, at_us, factor } => write!(f, "slow:{agent}@{}*{factor}", s(at_us)),
        }
    }
}

/// Checks that every fault strikes one of the `n` agents.
pub(super) fn check(faults: &[Fault], n: u32) -> anyhow::Result<()> {
    match faults.iter().find(|f| f.agent() >= n) {
        Some(f) => anyhow::bail!("--fault {f}: there is no agent {} (the agents are 0 to {})", f.agent(), n - 1),
        None => Ok(()),
    }
}

/// How a connection ends: cleanly (a process that exits or drops it: what it sent still
/// arrives), or cut off (a dead node or a broken link: what was on the way is lost).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Close {
    Clean,
    Abrupt,
}
