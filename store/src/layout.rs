//! How a task's record lies in the ledger, declared in one place: each field's offset and width
//! (`Field`s of `v3`), the checksum that seals every stored value, and the schema version that
//! names this layout. The ledger, its journal and the replica store records only through
//! `encode_record` / `decode_record`, so a new field is a line of the table and a line of each.
//!
//! All numbers are little-endian. A record is `FIELDS_LEN` bytes of fields (unused bytes zero),
//! then the CRC-32 of its key and those fields.

use htc_core::after::{Kind, Needs};
use htc_core::record::{CommandAt, Ended, Outcome, Record};
use htc_core::shape::TaskShape;
use htc_core::task::{Life, State};

/// Names the layout below and the meta keys; a ledger of another is migrated on open
/// (`migrate`), or refused when it is newer than this build. 4: a task may be cancelled (its
/// state byte 5), the counts have a sixth number for them, and what tasks wait for is in the
/// `needs` database (`encode_needs`).
pub const SCHEMA_VERSION: u32 = 4;
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

/// The record of schema 3 (written since before bb08bd2) and of schema 4, which lies the same and
/// whose state may also be cancelled.
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
    /// `FLAG_EXCLUSIVE | FLAG_PREEMPTIBLE`; other bits are damage.
    pub const FLAGS: Field = f(65, 1);
    pub const PRIORITY: Field = f(66, 2);
    pub const AFFINITY: Field = f(68, 4);
    pub const RETURNS: Field = f(72, 1);
    /// Unused: zero, so that a record decodes only from the bytes it encodes to.
    pub const UNUSED: Field = f(73, 3);
    /// Every field, in order: the table's own test checks they neither overlap nor overrun.
    pub const ALL: [Field; 24] = [
        CMD_OFF, CMD_LEN, LINE, CORES, RETRIES, SHELL, TIMEOUT_MS, MEM_MB, CLASS, STATE, ATTEMPTS, RUNTIME_MS, OUTCOME,
        LOSSES, MAX_OUTPUT, VALUE, AGENT, START_US, END_US, GPUS, FLAGS, PRIORITY, AFFINITY, RETURNS,
    ];
    pub const FLAG_EXCLUSIVE: u8 = 1;
    pub const FLAG_PREEMPTIBLE: u8 = 2;
}

/// An older schema's record read as today's.
type Decode = fn(u64, &[u8]) -> Option<Record>;

/// The layouts of older schemas this build migrates from: schema 3 (bb08bd2's, and this one's
/// before a task could be cancelled); the test-only schema 2 keeps the path from a layout that
/// moved fields proven.
fn older(version: u32) -> Option<Decode> {
    match version {
        3 => Some(decode_v3),
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
    let flags = if s.exclusive { FLAG_EXCLUSIVE } else { 0 } | if s.preemptible { FLAG_PREEMPTIBLE } else { 0 };
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
    let s = sum(&key(id), &b[..FIELDS_LEN]);
    b[FIELDS_LEN..].copy_from_slice(&s);
    b
}

/// A record of schema 3: as this schema's, and never cancelled.
fn decode_v3(id: u64, b: &[u8]) -> Option<Record> {
    decode_record(id, b).filter(|r| r.state() != State::Cancelled && r.outcome() != Outcome::Cancelled)
}

/// Task `id`'s record from its stored form, or None for one that cannot be a record this
/// layout wrote: the wrong size, a checksum that does not match, or a state, outcome or flag
/// no task has, or unused bytes not zero (so that whatever decodes encodes back to the same bytes).
pub fn decode_record(id: u64, b: &[u8]) -> Option<Record> {
    use v3::*;
    if b.len() != RECORD_LEN || unseal(&key(id), b).is_none() {
        return None;
    }
    let byte = |f: Field| get::<1>(b, f)[0];
    if get::<3>(b, UNUSED) != [0; 3] {
        return None;
    }
    let state = State::from_u8(byte(STATE))?;
    let outcome = Some(Outcome::from_u8(byte(OUTCOME))).filter(|o| *o as u8 == byte(OUTCOME))?;
    let flags = Some(byte(FLAGS)).filter(|f| f & !(FLAG_EXCLUSIVE | FLAG_PREEMPTIBLE) == 0)?;
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
        for f in v3::ALL.iter().chain([&v3::UNUSED]) {
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
    fn what_no_record_holds_is_refused_though_sealed() {
        let good = encode_record(&every_field_set(), 1);
        for (f, v) in [(v3::STATE, 6), (v3::OUTCOME, 11), (v3::FLAGS, 4), (v3::UNUSED, 1)] {
            let mut b = good;
            b[f.at] = v;
            let s = sum(&key(1), &b[..FIELDS_LEN]);
            b[FIELDS_LEN..].copy_from_slice(&s);
            assert!(decode_record(1, &b).is_none(), "{f:?} = {v}");
        }
    }
}
