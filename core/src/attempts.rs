//! What each attempt of a task asks, and which of its ends are worth another attempt. The
//! commonest failure of HTC work is running out of memory or time, which then fails the same way
//! on every retry; workflow users write the cure into their pipelines (nf-core's
//! `memory = { 6.GB * task.attempt }`, retrying only exits 130–145 and 104). Here a task says it
//! once, in its line:
//!
//! - `mem=4G*2`: times 2 at each retry (4G, 8G, 16G, …; a factor of 1.1 to 100, one decimal);
//! - `mem=4G+2G`: 2G more at each retry (4G, 6G, 8G, …);
//! - `mem=4G/8G/32G`: the attempts in turn, the last one's thereafter;
//!
//! and the same for `timeout=` (durations) and `cores=`; `retry_on=oom/timeout/signal/104/130-145`
//! names the ends that are retried (any end, by default). Pure: parsing, the ask of attempt
//! `n`, and whether an end may be retried. The task file's parser reads these forms into a
//! task's `Rules` (the record asks the first attempt's values and says it has rules); the
//! leader grows the record to each retry's ask and fails for good an end `retry_on=` does not
//! name; where an attempt is placed, and that an ask no agent can hold fails, is dispatch's.

use crate::record::Outcome;
use crate::shape::TaskShape;

/// A value of one attempt after another: the first attempt's and how it grows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Growing {
    /// The same for every attempt.
    Fixed(u64),
    /// The first, then times `tenths / 10` at each retry.
    Times { first: u64, tenths: u16 },
    /// The first, then `step` more at each retry.
    Plus { first: u64, step: u64 },
    /// Each attempt's in turn; the last for those after.
    List(Vec<u64>),
}

/// Values a list may hold: enough for any retry budget worth having.
pub const MAX_LIST: usize = 16;

impl Growing {
    /// Parses `V`, `V*F`, `V+S` or `V/V/…`, each value read by `value` (a size, a duration, a
    /// count); the error says what is wrong, for the caller to place.
    pub fn parse(s: &str, value: impl Fn(&str) -> Option<u64>) -> Result<Growing, String> {
        let one = |v: &str| value(v).ok_or_else(|| format!("'{v}' is not a value here"));
        if let Some((first, factor)) = s.split_once('*') {
            let tenths = parse_tenths(factor)
                .filter(|t| (11..=1000).contains(t))
                .ok_or_else(|| format!("'{factor}' is not a factor from 1.1 to 100 (one decimal at most)"))?;
            return Ok(Growing::Times { first: one(first)?, tenths });
        }
        if let Some((first, step)) = s.split_once('+') {
            return Ok(Growing::Plus { first: one(first)?, step: one(step)? });
        }
        if s.contains('/') {
            let list = s.split('/').map(one).collect::<Result<Vec<u64>, String>>()?;
            if list.len() > MAX_LIST {
                return Err(format!("{} values; at most {MAX_LIST}", list.len()));
            }
            return Ok(Growing::List(list));
        }
        Ok(Growing::Fixed(one(s)?))
    }

    /// What attempt `attempt` (1 for the first) asks, at most `cap` (the field's largest).
    pub fn at(&self, attempt: u32, cap: u64) -> u64 {
        let retries = attempt.saturating_sub(1);
        let v = match self {
            Growing::Fixed(v) => *v,
            Growing::Plus { first, step } => first.saturating_add(step.saturating_mul(retries as u64)),
            Growing::List(list) => list.get(retries as usize).or(list.last()).copied().unwrap_or(0),
            Growing::Times { first, tenths } => {
                let mut v = *first as u128;
                for _ in 0..retries {
                    v = v * *tenths as u128 / 10;
                    if v >= cap as u128 {
                        break;
                    }
                }
                v.min(u64::MAX as u128) as u64
            }
        };
        v.min(cap)
    }

    /// The first attempt's value.
    pub fn first(&self) -> u64 {
        self.at(1, u64::MAX)
    }

    /// Whether a later attempt may ask more than the first.
    pub fn grows(&self) -> bool {
        !matches!(self, Growing::Fixed(_))
    }

    /// The form as written, each value as `value` writes it (`4G*2`, `10m+5m`).
    pub fn describe(&self, value: impl Fn(u64) -> String) -> String {
        match self {
            Growing::Fixed(v) => value(*v),
            Growing::Times { first, tenths } if tenths % 10 == 0 => format!("{}*{}", value(*first), tenths / 10),
            Growing::Times { first, tenths } => format!("{}*{}.{}", value(*first), tenths / 10, tenths % 10),
            Growing::Plus { first, step } => format!("{}+{}", value(*first), value(*step)),
            Growing::List(l) => l.iter().map(|v| value(*v)).collect::<Vec<_>>().join("/"),
        }
    }
}

/// A size in MiB as a task line writes it: `4G`, `1536M`.
pub fn mem_word(mb: u64) -> String {
    match mb {
        0 => "0".into(),
        _ if mb.is_multiple_of(1 << 20) => format!("{}T", mb >> 20),
        _ if mb.is_multiple_of(1 << 10) => format!("{}G", mb >> 10),
        _ => format!("{mb}M"),
    }
}

/// A duration in ms as a task line writes it: `2h`, `10m`, `90s`, `1500ms`.
pub fn duration_word(ms: u64) -> String {
    match ms {
        0 => "0".into(),
        _ if ms.is_multiple_of(3_600_000) => format!("{}h", ms / 3_600_000),
        _ if ms.is_multiple_of(60_000) => format!("{}m", ms / 60_000),
        _ if ms.is_multiple_of(1000) => format!("{}s", ms / 1000),
        _ => format!("{ms}ms"),
    }
}

/// `2`, `1.5`: tenths (15), one decimal at most.
fn parse_tenths(s: &str) -> Option<u16> {
    let (whole, frac) = s.split_once('.').unwrap_or((s, "0"));
    let digits = |d: &str| !d.is_empty() && d.len() <= 4 && d.bytes().all(|b| b.is_ascii_digit());
    if !digits(whole) || !digits(frac) || frac.len() > 1 {
        return None;
    }
    Some(whole.parse::<u16>().ok()? * 10 + frac.parse::<u16>().ok()?)
}

/// How an attempt ended, as `retry_on=` tells ends apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptEnd {
    Exit(u8),
    Signal(i32),
    OutOfMemory,
    TimedOut,
    Stuck,
}

impl AttemptEnd {
    /// The end of a failed attempt as the ledger records it (`outcome`, `value`); `None` for an
    /// outcome that is not a failed run of the task's own (lost, preempted, refused …), which
    /// the task's life handles without `retry_on=`.
    pub fn of(outcome: Outcome, value: u32) -> Option<AttemptEnd> {
        match outcome {
            Outcome::Exited => Some(AttemptEnd::Exit(value.min(255) as u8)),
            Outcome::Signaled => Some(AttemptEnd::Signal(value as i32)),
            Outcome::OutOfMemory => Some(AttemptEnd::OutOfMemory),
            Outcome::TimedOut => Some(AttemptEnd::TimedOut),
            Outcome::Stuck => Some(AttemptEnd::Stuck),
            _ => None,
        }
    }
}

/// Which failed ends a task retries (`retry_on=`); the default retries all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryOn {
    pub oom: bool,
    pub timeout: bool,
    pub signal: bool,
    pub stuck: bool,
    /// Exit values, as inclusive ranges.
    pub exits: Vec<(u8, u8)>,
    any: bool,
}

impl Default for RetryOn {
    fn default() -> Self {
        RetryOn { oom: true, timeout: true, signal: true, stuck: true, exits: vec![(1, 255)], any: true }
    }
}

impl RetryOn {
    /// Parses `oom/timeout/signal/stuck/104/130-145` (or `any`); the error names the word.
    pub fn parse(s: &str) -> Result<RetryOn, String> {
        if s == "any" {
            return Ok(RetryOn::default());
        }
        let mut r = RetryOn { oom: false, timeout: false, signal: false, stuck: false, exits: Vec::new(), any: false };
        for word in s.split('/') {
            match word {
                "oom" => r.oom = true,
                "timeout" => r.timeout = true,
                "signal" => r.signal = true,
                "stuck" => r.stuck = true,
                _ => {
                    let (lo, hi) = word.split_once('-').unwrap_or((word, word));
                    let exit =
                        |v: &str| v.parse::<u8>().ok().filter(|&n| n > 0 && v.bytes().all(|b| b.is_ascii_digit()));
                    match (exit(lo), exit(hi)) {
                        (Some(lo), Some(hi)) if lo <= hi => r.exits.push((lo, hi)),
                        _ => {
                            return Err(format!(
                                "'{word}' is not oom, timeout, signal, stuck, an exit value from 1 to 255 or a range of them"
                            ))
                        }
                    }
                }
            }
        }
        Ok(r)
    }

    /// Whether an attempt that ended so may be retried (its budget allowing).
    pub fn retries(&self, end: AttemptEnd) -> bool {
        match end {
            AttemptEnd::OutOfMemory => self.oom,
            AttemptEnd::TimedOut => self.timeout,
            AttemptEnd::Signal(_) => self.signal,
            AttemptEnd::Stuck => self.stuck,
            AttemptEnd::Exit(v) => self.exits.iter().any(|&(lo, hi)| (lo..=hi).contains(&v)),
        }
    }

    /// Whether this is the default (every end retried): a task that says nothing costs nothing.
    pub fn is_any(&self) -> bool {
        self.any
    }

    /// Ends named so, as a stored copy says them: the exit ranges besides oom, timeout,
    /// signal and stuck.
    pub fn of(oom: bool, timeout: bool, signal: bool, stuck: bool, exits: Vec<(u8, u8)>) -> RetryOn {
        let any = oom && timeout && signal && stuck && exits == [(1, 255)];
        RetryOn { oom, timeout, signal, stuck, exits, any }
    }

    /// As `parse` reads it: `oom/timeout/stuck/104/130-145`, or `any`.
    pub fn describe(&self) -> String {
        if self.any {
            return "any".into();
        }
        let mut words: Vec<String> =
            [("oom", self.oom), ("timeout", self.timeout), ("signal", self.signal), ("stuck", self.stuck)]
                .into_iter()
                .filter(|(_, on)| *on)
                .map(|(w, _)| w.to_string())
                .collect();
        words.extend(self.exits.iter().map(|&(lo, hi)| if lo == hi { lo.to_string() } else { format!("{lo}-{hi}") }));
        words.join("/")
    }
}

/// A task's rules for its attempts, each only where it gave one: what grows, and which ends
/// are retried. A task with none has none stored and costs nothing.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Rules {
    pub mem: Option<Growing>,
    pub timeout: Option<Growing>,
    pub cores: Option<Growing>,
    pub retry_on: Option<RetryOn>,
}

/// The largest ask of each growing field: what its record can hold.
const MEM_CAP: u64 = u32::MAX as u64;
const TIMEOUT_CAP: u64 = u32::MAX as u64;
const CORES_CAP: u64 = crate::shape::MAX_CORES as u64;

impl Rules {
    /// No rules: every attempt asks the same, every end is retried.
    pub const NONE: Rules = Rules { mem: None, timeout: None, cores: None, retry_on: None };

    pub fn is_empty(&self) -> bool {
        self.mem.is_none() && self.timeout.is_none() && self.cores.is_none() && self.retry_on.is_none()
    }

    /// What attempt `attempt` (1 for the first) asks: `base`, the task's shape, with each
    /// growing field at that attempt's value.
    pub fn shape_at(&self, base: &TaskShape, attempt: u32) -> TaskShape {
        let mut s = *base;
        if let Some(g) = &self.mem {
            s.mem_mb = g.at(attempt, MEM_CAP) as u32;
        }
        if let Some(g) = &self.timeout {
            s.timeout_ms = g.at(attempt, TIMEOUT_CAP) as u32;
        }
        if let Some(g) = &self.cores {
            s.cores = g.at(attempt, CORES_CAP).max(1) as u16;
        }
        s
    }

    /// Whether an attempt that ended so is not to be retried, whatever the budget: `retry_on=`
    /// does not name its end.
    pub fn stops(&self, outcome: Outcome, value: i32) -> bool {
        let Some(r) = &self.retry_on else { return false };
        AttemptEnd::of(outcome, value as u32).is_some_and(|e| !r.retries(e))
    }

    /// The rules as task-line options (`mem=4G*2 retry_on=oom`), for people to read and for a
    /// task line to say again.
    pub fn describe(&self) -> String {
        let mut words = Vec::new();
        if let Some(g) = &self.mem {
            words.push(format!("mem={}", g.describe(mem_word)));
        }
        if let Some(g) = &self.timeout {
            words.push(format!("timeout={}", g.describe(duration_word)));
        }
        if let Some(g) = &self.cores {
            words.push(format!("cores={}", g.describe(|n| n.to_string())));
        }
        if let Some(r) = &self.retry_on {
            words.push(format!("retry_on={}", r.describe()));
        }
        words.join(" ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::taskfile::{parse_duration_ms, parse_mem_mb};

    fn mem(s: &str) -> Result<Growing, String> {
        Growing::parse(s, |v| parse_mem_mb(v).map(u64::from))
    }

    fn attempts(g: &Growing, n: u32) -> Vec<u64> {
        (1..=n).map(|a| g.at(a, u32::MAX as u64)).collect()
    }

    #[test]
    fn each_form_gives_each_attempt_its_ask() {
        assert_eq!(attempts(&mem("4G").unwrap(), 3), [4096, 4096, 4096]);
        assert_eq!(attempts(&mem("4G*2").unwrap(), 4), [4096, 8192, 16384, 32768]);
        assert_eq!(attempts(&mem("1000*1.5").unwrap(), 3), [1000, 1500, 2250]);
        assert_eq!(attempts(&mem("4G+2G").unwrap(), 3), [4096, 6144, 8192]);
        assert_eq!(attempts(&mem("4G/8G/32G").unwrap(), 5), [4096, 8192, 32768, 32768, 32768]);
        let t = Growing::parse("10m*2", |v| parse_duration_ms(v).map(u64::from)).unwrap();
        assert_eq!(attempts(&t, 2), [600_000, 1_200_000]);
        assert!(!mem("4G").unwrap().grows() && mem("4G+1").unwrap().grows());
        assert_eq!(mem("4G/8G").unwrap().first(), 4096);
    }

    #[test]
    fn an_ask_never_passes_its_field_s_largest_however_many_attempts() {
        let g = mem("4T*100").unwrap();
        assert_eq!(g.at(255, u32::MAX as u64), u32::MAX as u64);
        assert_eq!(mem("1+4000T").unwrap().at(255, u32::MAX as u64), u32::MAX as u64);
        assert_eq!(g.at(0, 10), 10, "attempt 0 reads as the first");
    }

    #[test]
    fn what_is_not_a_growth_says_why() {
        for (s, says) in [
            ("4G*1", "not a factor from 1.1 to 100"),
            ("4G*1.25", "not a factor"),
            ("4G*x", "not a factor"),
            ("4G*101", "not a factor"),
            ("four+1G", "'four' is not a value"),
            ("4G/", "'' is not a value"),
            ("4G+", "'' is not a value"),
            ("", "'' is not a value"),
        ] {
            let e = mem(s).unwrap_err();
            assert!(e.contains(says), "{s}: {e}");
        }
        let long = vec!["1G"; MAX_LIST + 1].join("/");
        assert!(mem(&long).unwrap_err().contains("at most 16"));
    }

    #[test]
    fn retry_on_names_the_ends_that_are_retried() {
        let r = RetryOn::parse("oom/timeout/104/130-145").unwrap();
        let yes = [AttemptEnd::OutOfMemory, AttemptEnd::TimedOut, AttemptEnd::Exit(104), AttemptEnd::Exit(137)];
        assert!(yes.iter().all(|&e| r.retries(e)));
        let no = [AttemptEnd::Exit(1), AttemptEnd::Exit(146), AttemptEnd::Signal(9)];
        assert!(no.iter().all(|&e| !r.retries(e)));
        assert!(!r.is_any() && RetryOn::parse("any").unwrap().is_any());
        let any = RetryOn::default();
        assert!([yes.as_slice(), no.as_slice()].concat().iter().all(|&e| any.retries(e)));
        for bad in ["", "0", "256", "145-130", "oops", "1-", "-1", "+3"] {
            assert!(RetryOn::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_failed_run_s_record_reads_as_its_end_and_other_outcomes_as_none() {
        assert_eq!(AttemptEnd::of(Outcome::Exited, 3), Some(AttemptEnd::Exit(3)));
        assert_eq!(AttemptEnd::of(Outcome::Signaled, 9), Some(AttemptEnd::Signal(9)));
        assert_eq!(AttemptEnd::of(Outcome::OutOfMemory, 2048), Some(AttemptEnd::OutOfMemory));
        assert_eq!(AttemptEnd::of(Outcome::TimedOut, 0), Some(AttemptEnd::TimedOut));
        assert_eq!(AttemptEnd::of(Outcome::Lost, 0), None);
        assert_eq!(AttemptEnd::of(Outcome::Preempted, 0), None);
    }

    #[test]
    fn no_text_makes_a_parser_panic() {
        // A cheap fuzz: every short string over the alphabet the forms are made of.
        let alphabet = ['1', '0', '.', '*', '+', '/', '-', 'G', 'm', 'x', 'o'];
        let mut words = vec![String::new()];
        for _ in 0..4 {
            words = words.iter().flat_map(|w| alphabet.iter().map(move |c| format!("{w}{c}"))).collect();
            for w in &words {
                if let Ok(g) = mem(w) {
                    let _ = g.at(200, u64::MAX);
                }
                let _ = RetryOn::parse(w);
            }
        }
    }
}
