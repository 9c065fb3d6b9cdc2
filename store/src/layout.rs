//! How a task's record lies in the ledger, declared in one place: each field's offset and width
//! (`Field`s of `v3`), the checksum that seals every stored value, and the schema version that
//! names this layout. The ledger, its journal and the replica store records only through
//! `encode_record` / `decode_record`, so a new field is a line of the table and a line of each.
//!
//! All numbers are little-endian. A record is `FIELDS_LEN` bytes of fields (unused bytes zero),
//! then the CRC-32 of its key and those fields.

use htc_core::after::{Kind, Needs};
use htc_core::attempts::{Growing, RetryOn, Rules, MAX_LIST};
use htc_core::record::{CommandAt, Ended, Outcome, Record};
use htc_core::shape::{TaskShape, MAX_STUCK_S};
use htc_core::task::{Life, State};

/// Names the layout below and the meta keys; a ledger of another is migrated on open
/// (`migrate`), or refused when it is newer than this build. 4: a task may be cancelled (its
/// state byte 5), the counts have a sixth number for them, and what tasks wait for is in the
/// `needs` database (`encode_needs`). 5: a task may have rules for its attempts (its flag
/// `FLAG_RULES`, the rules in the `rules` database: `encode_rules`). 6: a task may have a stuck
/// watch (`STUCK_S`, in bytes schema 5 left zero) and end stuck (outcome 11).
pub const SCHEMA_VERSION: u32 = 6;
/// The fields, then their checksum.
pub const RECORD_LEN: usize = FIELDS_LEN + SUM_LEN;
pub const FIELDS_LEN: usize = 76;
pub const SUM_LEN: usize = 4;

/// Where one field lies in a stored record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field {
    pub at: usize,
    pub width: usize,
}

const fn f(at: usize, width: usize) -> Field {
    Field { at, width }
}

/// The record of schema 3 (written since before bb08bd2) and of schemas 4 to 6, which lie the
/// same but for the three bytes schema 6 gave `STUCK_S`: a schema 4 record may also be
/// cancelled, a schema 5 one may also have rules, a schema 6 one a stuck watch.
pub mod v3 {
    use super::f;
    pub use super::Field;
    pub const CMD_OFF: Field = f(0, 8);
    pub const CMD_LEN: Field = f(8, 4);
    pub const LINE: Field = f(12, 4);
    pub const CORES: Field = f(16, 2);
    pub const RETRIES: Field = f(18, 1);
    pub const SHELL: Field = f(19, 1);
    pub const TIMEOUT_MS: Field = f(20, 4);
    pub const MEM_MB: Field = f(24, 4);
    pub const CLASS: Field = f(28, 2);
    pub const STATE: Field = f(30, 1);
    pub const ATTEMPTS: Field = f(31, 1);
    pub const RUNTIME_MS: Field = f(32, 4);
    pub const OUTCOME: Field = f(36, 1);
    pub const LOSSES: Field = f(37, 1);
    pub const MAX_OUTPUT: Field = f(38, 2);
    pub const VALUE: Field = f(40, 4);
    pub const AGENT: Field = f(44, 4);
    pub const START_US: Field = f(48, 8);
    pub const END_US: Field = f(56, 8);
    pub const GPUS: Field = f(64, 1);
    /// `FLAG_EXCLUSIVE | FLAG_PREEMPTIBLE | FLAG_RULES`; other bits are damage.
    pub const FLAGS: Field = f(65, 1);
    pub const PRIORITY: Field = f(66, 2);
    pub const AFFINITY: Field = f(68, 4);
    pub const RETURNS: Field = f(72, 1);
    /// `stuck=` in seconds, as 24 bits (`shape::MAX_STUCK_S`); zero before schema 6.
    pub const STUCK_S: Field = f(73, 3);
    /// Every field, in order: the table's own test checks they neither overlap nor overrun.
    pub const ALL: [Field; 25] = [
        CMD_OFF, CMD_LEN, LINE, CORES, RETRIES, SHELL, TIMEOUT_MS, MEM_MB, CLASS, STATE, ATTEMPTS, RUNTIME_MS, OUTCOME,
        LOSSES, MAX_OUTPUT, VALUE, AGENT, START_US, END_US, GPUS, FLAGS, PRIORITY, AFFINITY, RETURNS, STUCK_S,
    ];
    pub const FLAG_EXCLUSIVE: u8 = 1;
    pub const FLAG_PREEMPTIBLE: u8 = 2;
    pub const FLAG_RULES: u8 = 4;
}

/// An older schema's record read as today's.
type Decode = fn(u64, &[u8]) -> Option<Record>;

/// The layouts of older schemas this build migrates from: schema 3 (bb08bd2's, and this one's
/// before a task could be cancelled), schema 4 (before a task could have rules), schema 5
/// (before a stuck watch); the test-only schema 2 keeps the path from a layout that moved
/// fields proven.
fn older(version: u32) -> Option<Decode> {
    match version {
        3 => Some(decode_v3),
        4 => Some(decode_v4),
        5 => Some(decode_v5),
        #[cfg(test)]
        2 => Some(tests::v2::decode),
        _ => None,
    }
}

/// Whether this build reads records of schema `version`: its own, or one it migrates from.
pub fn readable(version: u32) -> bool {
    version == SCHEMA_VERSION || older(version).is_some()
}

/// Task `id`'s record as schema `version` stored it (`decode_record` for this build's).
pub fn decode_as(version: u32, id: u64, b: &[u8]) -> Option<Record> {
    if version == SCHEMA_VERSION {
        decode_record(id, b)
    } else {
        older(version)?(id, b)
    }
}

/// The CRC-32 of a key and a value, as stored at the value's end.
pub fn sum(k: &[u8], v: &[u8]) -> [u8; SUM_LEN] {
    let mut h = crc32fast::Hasher::new();
    h.update(k);
    h.update(v);
    h.finalize().to_le_bytes()
}

/// `v` followed by its checksum under key `k`.
pub fn seal(k: &[u8], v: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.len() + SUM_LEN);
    out.extend_from_slice(v);
    out.extend_from_slice(&sum(k, v));
    out
}

/// The value stored under `k` without its checksum, or None if the checksum does not match.
pub fn unseal<'a>(k: &[u8], stored: &'a [u8]) -> Option<&'a [u8]> {
    let n = stored.len().checked_sub(SUM_LEN)?;
    let (v, s) = stored.split_at(n);
    (sum(k, v) == s).then_some(v)
}

/// A task's key: its id, big-endian, so that ids sort in order.
pub fn key(id: u64) -> [u8; 8] {
    id.to_be_bytes()
}

/// Bytes of one range of what a task waits for: its first id, its last, and its kind.
const NEED_LEN: usize = 17;

/// What task `id` waits for (`after=`, `afterany=`), as stored in the `needs` database: each
/// range as `first u64, last u64, kind u8` (0 `after`, 1 `afterany`), then the checksum under
/// the task's key.
pub fn encode_needs(id: u64, n: &Needs) -> Vec<u8> {
    let mut v = Vec::with_capacity(n.ranges().len() * NEED_LEN);
    for (r, k) in n.ranges() {
        v.extend_from_slice(&r.start().to_le_bytes());
        v.extend_from_slice(&r.end().to_le_bytes());
        v.push((*k == Kind::AfterAny) as u8);
    }
    seal(&key(id), &v)
}

/// What `encode_needs` wrote, or None for bytes it cannot have written.
pub fn decode_needs(id: u64, b: &[u8]) -> Option<Needs> {
    let v = unseal(&key(id), b)?;
    if v.is_empty() || v.len() % NEED_LEN != 0 {
        return None;
    }
    let mut n = Needs::default();
    for c in v.chunks_exact(NEED_LEN) {
        let (a, z) = (u64::from_le_bytes(c[..8].try_into().ok()?), u64::from_le_bytes(c[8..16].try_into().ok()?));
        let kind = match c[16] {
            0 => Kind::After,
            1 => Kind::AfterAny,
            _ => return None,
        };
        // Only earlier tasks are ever named.
        if a == 0 || a > z || z >= id {
            return None;
        }
        n.push(a..=z, kind);
    }
    Some(n)
}

/// A task's rules for its attempts (`attempts::Rules`), as stored in the `rules` database:
/// for each of `mem`, `timeout` and `cores` a form byte (0 none, 1 `V*F`: first u64, tenths
/// u16; 2 `V+S`: first u64, step u64; 3 a list: count u8, each u64), then `retry_on` (0 none,
/// or 1, a byte of oom 1 | timeout 2 | signal 4 | stuck 8, a count u8 and each exit range as two bytes),
/// then the checksum under the task's key.
pub fn encode_rules(id: u64, r: &Rules) -> Vec<u8> {
    let mut v = Vec::with_capacity(32);
    for g in [&r.mem, &r.timeout, &r.cores] {
        match g {
            None | Some(Growing::Fixed(_)) => v.push(0),
            Some(Growing::Times { first, tenths }) => {
                v.push(1);
                v.extend_from_slice(&first.to_le_bytes());
                v.extend_from_slice(&tenths.to_le_bytes());
            }
            Some(Growing::Plus { first, step }) => {
                v.push(2);
                v.extend_from_slice(&first.to_le_bytes());
                v.extend_from_slice(&step.to_le_bytes());
            }
            Some(Growing::List(l)) => {
                v.push(3);
                v.push(l.len() as u8);
                l.iter().for_each(|x| v.extend_from_slice(&x.to_le_bytes()));
            }
        }
    }
    match &r.retry_on {
        None => v.push(0),
        Some(o) => {
            v.push(1);
            v.push(o.oom as u8 | (o.timeout as u8) << 1 | (o.signal as u8) << 2 | (o.stuck as u8) << 3);
            v.push(o.exits.len() as u8);
            o.exits.iter().for_each(|&(lo, hi)| v.extend_from_slice(&[lo, hi]));
        }
    }
    seal(&key(id), &v)
}

/// What `encode_rules` wrote, or None for bytes it cannot have written.
pub fn decode_rules(id: u64, b: &[u8]) -> Option<Rules> {
    let v = unseal(&key(id), b)?;
    let mut at = 0usize;
    let mut take = |n: usize| -> Option<&[u8]> {
        let s = v.get(at..at + n)?;
        at += n;
        Some(s)
    };
    let u64_of = |s: &[u8]| u64::from_le_bytes(s.try_into().expect("8 bytes"));
    let mut grows = [None, None, None];
    for g in &mut grows {
        *g = match take(1)?[0] {
            0 => None,
            1 => {
                Some(Growing::Times { first: u64_of(take(8)?), tenths: u16::from_le_bytes(take(2)?.try_into().ok()?) })
            }
            2 => Some(Growing::Plus { first: u64_of(take(8)?), step: u64_of(take(8)?) }),
            3 => {
                let n = take(1)?[0] as usize;
                let l = (0..n).map(|_| take(8).map(u64_of)).collect::<Option<Vec<u64>>>()?;
                Some(Some(Growing::List(l)).filter(|_| (1..=MAX_LIST).contains(&n))?)
            }
            _ => return None,
        };
    }
    let retry_on = match take(1)?[0] {
        0 => None,
        1 => {
            let ends = take(1)?[0];
            let n = take(1)?[0] as usize;
            let exits = (0..n).map(|_| take(2).map(|p| (p[0], p[1]))).collect::<Option<Vec<_>>>()?;
            if ends & !15 != 0 || exits.iter().any(|&(lo, hi)| lo == 0 || lo > hi) {
                return None;
            }
            Some(RetryOn::of(ends & 1 != 0, ends & 2 != 0, ends & 4 != 0, ends & 8 != 0, exits))
        }
        _ => return None,
    };
    let [mem, timeout, cores] = grows;
    let r = Rules { mem, timeout, cores, retry_on };
    (at == v.len() && !r.is_empty()).then_some(r)
}

fn put(b: &mut [u8], f: Field, v: &[u8]) {
    debug_assert_eq!(f.width, v.len(), "a field written at its declared width");
    b[f.at..f.at + f.width].copy_from_slice(v);
}

fn get<const N: usize>(b: &[u8], f: Field) -> [u8; N] {
    debug_assert_eq!(f.width, N, "a field read at its declared width");
    b[f.at..f.at + N].try_into().expect("a field within the record")
}

/// The stored form of task `id`'s record, its checksum last.
pub fn encode_record(r: &Record, id: u64) -> [u8; RECORD_LEN] {
    use v3::*;
    let mut b = [0u8; RECORD_LEN];
    let (c, s, l, e) = (r.command(), r.shape(), r.life(), r.ended());
    put(&mut b, CMD_OFF, &c.off.to_le_bytes());
    put(&mut b, CMD_LEN, &c.len.to_le_bytes());
    put(&mut b, LINE, &c.line.to_le_bytes());
    put(&mut b, SHELL, &[c.shell as u8]);
    put(&mut b, CORES, &s.cores.to_le_bytes());
    put(&mut b, RETRIES, &[l.retries()]);
    put(&mut b, TIMEOUT_MS, &s.timeout_ms.to_le_bytes());
    put(&mut b, MEM_MB, &s.mem_mb.to_le_bytes());
    put(&mut b, CLASS, &s.class.to_le_bytes());
    put(&mut b, RUNTIME_MS, &s.runtime_ms.to_le_bytes());
    put(&mut b, MAX_OUTPUT, &s.max_output.to_le_bytes());
    put(&mut b, GPUS, &[s.gpus]);
    let flags = if s.exclusive { FLAG_EXCLUSIVE } else { 0 }
        | if s.preemptible { FLAG_PREEMPTIBLE } else { 0 }
        | if s.rules { FLAG_RULES } else { 0 };
    put(&mut b, FLAGS, &[flags]);
    put(&mut b, PRIORITY, &s.priority.to_le_bytes());
    put(&mut b, AFFINITY, &s.affinity.to_le_bytes());
    put(&mut b, STATE, &[l.state() as u8]);
    put(&mut b, ATTEMPTS, &[l.attempts()]);
    put(&mut b, LOSSES, &[l.losses()]);
    put(&mut b, RETURNS, &[l.returns()]);
    put(&mut b, OUTCOME, &[e.outcome as u8]);
    put(&mut b, VALUE, &e.value.to_le_bytes());
    put(&mut b, AGENT, &r.agent().to_le_bytes());
    put(&mut b, START_US, &e.start_us.to_le_bytes());
    put(&mut b, END_US, &e.end_us.to_le_bytes());
    put(&mut b, STUCK_S, &s.stuck_s.min(MAX_STUCK_S).to_le_bytes()[..3]);
    let s = sum(&key(id), &b[..FIELDS_LEN]);
    b[FIELDS_LEN..].copy_from_slice(&s);
    b
}

/// A record of schema 3: as schema 4's, and never cancelled.
fn decode_v3(id: u64, b: &[u8]) -> Option<Record> {
    decode_v4(id, b).filter(|r| r.state() != State::Cancelled && r.outcome() != Outcome::Cancelled)
}

/// A record of schema 4: as schema 5's, and never with rules.
fn decode_v4(id: u64, b: &[u8]) -> Option<Record> {
    decode_v5(id, b).filter(|r| !r.shape().rules)
}

/// A record of schema 5: as this schema's, with no stuck watch and never ended stuck.
fn decode_v5(id: u64, b: &[u8]) -> Option<Record> {
    decode_record(id, b).filter(|r| r.shape().stuck_s == 0 && r.outcome() != Outcome::Stuck)
}

/// Task `id`'s record from its stored form, or None for one that cannot be a record this
/// layout wrote: the wrong size, a checksum that does not match, or a state, outcome or flag
/// no task has (so that whatever decodes encodes back to the same bytes).
pub fn decode_record(id: u64, b: &[u8]) -> Option<Record> {
    use v3::*;
    if b.len() != RECORD_LEN || unseal(&key(id), b).is_none() {
        return None;
    }
    let byte = |f: Field| get::<1>(b, f)[0];
    let state = State::from_u8(byte(STATE))?;
    let outcome = Some(Outcome::from_u8(byte(OUTCOME))).filter(|o| *o as u8 == byte(OUTCOME))?;
    let flags = Some(byte(FLAGS)).filter(|f| f & !(FLAG_EXCLUSIVE | FLAG_PREEMPTIBLE | FLAG_RULES) == 0)?;
    let cmd = CommandAt {
        off: u64::from_le_bytes(get(b, CMD_OFF)),
        len: u32::from_le_bytes(get(b, CMD_LEN)),
        line: u32::from_le_bytes(get(b, LINE)),
        shell: byte(SHELL) != 0,
    };
    let shape = TaskShape {
        cores: u16::from_le_bytes(get(b, CORES)),
        mem_mb: u32::from_le_bytes(get(b, MEM_MB)),
        gpus: byte(GPUS),
        timeout_ms: u32::from_le_bytes(get(b, TIMEOUT_MS)),
        retries: byte(RETRIES),
        class: u16::from_le_bytes(get(b, CLASS)),
        runtime_ms: u32::from_le_bytes(get(b, RUNTIME_MS)),
        max_output: u16::from_le_bytes(get(b, MAX_OUTPUT)),
        priority: i16::from_le_bytes(get(b, PRIORITY)),
        exclusive: flags & FLAG_EXCLUSIVE != 0,
        preemptible: flags & FLAG_PREEMPTIBLE != 0,
        affinity: u32::from_le_bytes(get(b, AFFINITY)),
        rules: flags & FLAG_RULES != 0,
        stuck_s: u32::from_le_bytes({
            let [a, b, c] = get::<3>(b, STUCK_S);
            [a, b, c, 0]
        }),
    };
    let life = Life::of(state, byte(ATTEMPTS), byte(RETRIES), byte(LOSSES), byte(RETURNS));
    let ended = Ended {
        outcome,
        value: i32::from_le_bytes(get(b, VALUE)),
        start_us: u64::from_le_bytes(get(b, START_US)),
        end_us: u64::from_le_bytes(get(b, END_US)),
    };
    Some(Record::from_parts(cmd, shape, life, u32::from_le_bytes(get(b, AGENT)), ended))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Schema 2, for tests only: the record before `returns`, 72 bytes of fields.
    pub(crate) mod v2 {
        use super::super::*;
        const FIELDS_LEN_V2: usize = 72;

        pub(crate) fn encode(r: &Record, id: u64) -> Vec<u8> {
            assert_eq!(r.returns(), 0, "schema 2 has no returns");
            seal(&key(id), &encode_record(r, id)[..FIELDS_LEN_V2])
        }

        /// Today's record with no returns: what schema 2's fields are, widened.
        pub(crate) fn decode(id: u64, b: &[u8]) -> Option<Record> {
            let fields = unseal(&key(id), b).filter(|f| f.len() == FIELDS_LEN_V2)?;
            let mut wide = [0u8; FIELDS_LEN];
            wide[..FIELDS_LEN_V2].copy_from_slice(fields);
            decode_record(id, &seal(&key(id), &wide))
        }
    }
    use htc_core::task::{End, Step};

    fn every_field_set() -> Record {
        let cmd = CommandAt { off: 1 << 40, len: 77, line: 9, shell: true };
        let shape = TaskShape {
            cores: 3,
            mem_mb: 6,
            gpus: 2,
            timeout_ms: 5,
            retries: 2,
            class: 7,
            runtime_ms: 8,
            max_output: 0x8003,
            priority: -5,
            exclusive: true,
            preemptible: false,
            affinity: 0xdead_beef,
            rules: true,
            stuck_s: MAX_STUCK_S,
        };
        let fail = Step::Finish(End::Failed { permanent: false });
        let lost = Step::Finish(End::Lost);
        let steps = [Step::Dispatch, Step::Start, lost, Step::Dispatch, Step::Reclaim, Step::Dispatch, fail];
        let mut r = Record::new(cmd, shape).walked(&steps).unwrap();
        r.set_ended(11, Ended::new(Outcome::Signaled, -9, 12, 13));
        r
    }

    #[test]
    fn the_fields_neither_overlap_nor_overrun() {
        let mut used = [false; FIELDS_LEN];
        for f in v3::ALL.iter() {
            for b in &mut used[f.at..f.at + f.width] {
                assert!(!*b, "byte of {f:?} used twice");
                *b = true;
            }
        }
        assert!(used.iter().all(|&b| b), "every byte is a field's or declared unused");
    }

    #[test]
    fn a_record_comes_back_as_it_went_and_a_flipped_bit_is_refused() {
        let r = every_field_set();
        assert_eq!((r.losses(), r.returns(), r.attempts()), (1, 1, 1));
        assert_eq!(decode_record(1, &encode_record(&r, 1)), Some(r));
        assert!(decode_record(1, &[0u8; 10]).is_none());
        // Under another task's key, or with any bit flipped, it is refused.
        assert!(decode_record(2, &encode_record(&r, 1)).is_none());
        for bit in 0..RECORD_LEN * 8 {
            let mut b = encode_record(&r, 1);
            b[bit / 8] ^= 1 << (bit % 8);
            assert!(decode_record(1, &b).is_none(), "bit {bit}");
        }
    }

    #[test]
    fn what_a_task_waits_for_is_read_back_under_its_own_key_only() {
        let mut n = Needs::default();
        n.push(1..=5, Kind::After);
        n.push(7..=7, Kind::AfterAny);
        let b = encode_needs(9, &n);
        assert_eq!(decode_needs(9, &b), Some(n.clone()));
        assert_eq!(decode_needs(8, &b), None, "another task's key");
        assert_eq!(decode_needs(7, &encode_needs(7, &n)), None, "a task names only earlier ones");
        for bit in 0..b.len() * 8 {
            let mut d = b.clone();
            d[bit / 8] ^= 1 << (bit % 8);
            assert_eq!(decode_needs(9, &d), None, "bit {bit}");
        }
        assert_eq!(decode_needs(9, &encode_needs(9, &Needs::default())), None, "an entry names something");
    }

    #[test]
    fn a_task_s_rules_are_read_back_under_its_own_key_only() {
        let every = Rules {
            mem: Some(Growing::Times { first: 4096, tenths: 15 }),
            timeout: Some(Growing::Plus { first: 60_000, step: 30_000 }),
            cores: Some(Growing::List(vec![1, 2, 8])),
            retry_on: Some(RetryOn::parse("oom/signal/104/130-145").unwrap()),
        };
        let some = Rules { retry_on: Some(RetryOn::parse("timeout").unwrap()), ..Rules::default() };
        for r in [&every, &some] {
            assert_eq!(decode_rules(3, &encode_rules(3, r)).as_ref(), Some(r));
        }
        let b = encode_rules(3, &every);
        assert_eq!(decode_rules(4, &b), None, "another task's key");
        for bit in 0..b.len() * 8 {
            let mut d = b.clone();
            d[bit / 8] ^= 1 << (bit % 8);
            assert_eq!(decode_rules(3, &d), None, "bit {bit}");
        }
        assert_eq!(decode_rules(3, &encode_rules(3, &Rules::default())), None, "an entry has a rule");
        let short = seal(&key(3), &b[..b.len() - SUM_LEN - 1]);
        assert_eq!(decode_rules(3, &short), None, "cut short");
    }

    #[test]
    fn a_record_of_schema_4_has_no_rules() {
        let mut r = every_field_set();
        assert!(decode_as(4, 1, &encode_record(&r, 1)).is_none(), "rules are schema 5's");
        r.shape_mut().rules = false;
        r.shape_mut().stuck_s = 0;
        assert_eq!(decode_as(4, 1, &encode_record(&r, 1)), Some(r));
    }

    #[test]
    fn a_record_of_schema_5_has_no_stuck_watch_and_never_ended_stuck() {
        let mut r = every_field_set();
        assert!(decode_as(5, 1, &encode_record(&r, 1)).is_none(), "a watch is schema 6's");
        r.shape_mut().stuck_s = 0;
        assert_eq!(decode_as(5, 1, &encode_record(&r, 1)), Some(r));
        r.set_ended(11, Ended::new(Outcome::Stuck, 60, 12, 13));
        assert!(decode_as(5, 1, &encode_record(&r, 1)).is_none(), "ending stuck is schema 6's");
        assert_eq!(decode_as(6, 1, &encode_record(&r, 1)), Some(r));
    }

    #[test]
    fn what_no_record_holds_is_refused_though_sealed() {
        let good = encode_record(&every_field_set(), 1);
        for (f, v) in [(v3::STATE, 6), (v3::OUTCOME, 12), (v3::FLAGS, 8)] {
            let mut b = good;
            b[f.at] = v;
            let s = sum(&key(1), &b[..FIELDS_LEN]);
            b[FIELDS_LEN..].copy_from_slice(&s);
            assert!(decode_record(1, &b).is_none(), "{f:?} = {v}");
        }
    }
}
