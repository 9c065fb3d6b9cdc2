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
//! `n`, and whether an end may be retried; where an attempt is placed and what a too-large ask
//! does is the leader's. Not yet read by the task file's parser nor by the leader: until they
//! do (docs/architecture.md, "Attempts that grow"), a line with these forms is refused.

use crate::record::Outcome;

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
    /// Exit values, as inclusive ranges.
    pub exits: Vec<(u8, u8)>,
    any: bool,
}

impl Default for RetryOn {
    fn default() -> Self {
        RetryOn { oom: true, timeout: true, signal: true, exits: vec![(1, 255)], any: true }
    }
}

impl RetryOn {
    /// Parses `oom/timeout/signal/104/130-145` (or `any`); the error names the word.
    pub fn parse(s: &str) -> Result<RetryOn, String> {
        if s == "any" {
            return Ok(RetryOn::default());
        }
        let mut r = RetryOn { oom: false, timeout: false, signal: false, exits: Vec::new(), any: false };
        for word in s.split('/') {
            match word {
                "oom" => r.oom = true,
                "timeout" => r.timeout = true,
                "signal" => r.signal = true,
                _ => {
                    let (lo, hi) = word.split_once('-').unwrap_or((word, word));
                    let exit =
                        |v: &str| v.parse::<u8>().ok().filter(|&n| n > 0 && v.bytes().all(|b| b.is_ascii_digit()));
                    match (exit(lo), exit(hi)) {
                        (Some(lo), Some(hi)) if lo <= hi => r.exits.push((lo, hi)),
                        _ => {
                            return Err(format!(
                                "'{word}' is not oom, timeout, signal, an exit value from 1 to 255 or a range of them"
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
            AttemptEnd::Exit(v) => self.exits.iter().any(|&(lo, hi)| (lo..=hi).contains(&v)),
        }
    }

    /// Whether this is the default (every end retried): a task that says nothing costs nothing.
    pub fn is_any(&self) -> bool {
        self.any
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
