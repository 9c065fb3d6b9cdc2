//! The `ledger_record` target's checks: a task record as stored in the ledger
//! (`htc::ledger::decode_record`), from arbitrary bytes: the first 8 are the task id, the rest
//! the stored value. Whatever decodes encodes back to exactly those bytes, and no single flipped
//! bit of it decodes (the checksum catches it); a value of the wrong size or checksum is an
//! error, never a panic.
//!
//! Shared by the fuzz target (`fuzz_targets/ledger_record.rs`) and the stable replay of the
//! committed corpus `corpus/ledger_record/` in `cargo test` (`node-agent/tests/fuzz_corpus.rs`).

use htc::layout::v3;
use htc::ledger::{decode_record, encode_record, unseal, Outcome, State, RECORD_LEN};

/// What a sealed value of the right size holds that no record can: a state, outcome or flag
/// past the known ones (every state and outcome a task has, cancelled and interrupted
/// included, is known: the enums' own readers say which). Every byte is a field's.
fn impossible(v: &[u8]) -> bool {
    let byte = |f: v3::Field| v[f.at];
    State::from_u8(byte(v3::STATE)).is_none()
        || Outcome::from_u8(byte(v3::OUTCOME)) as u8 != byte(v3::OUTCOME)
        || byte(v3::FLAGS) & !(v3::FLAG_EXCLUSIVE | v3::FLAG_PREEMPTIBLE | v3::FLAG_RULES) != 0
}

/// What `check` decoded from `data`, if it was a record: the replay of the corpus asks that
/// its records cover every state.
pub fn check(data: &[u8]) -> Option<State> {
    if data.len() < 8 {
        return None;
    }
    let id = u64::from_le_bytes(data[..8].try_into().unwrap());
    let value = &data[8..];
    let Ok(r) = decode_record(id, value) else {
        assert!(value.len() != RECORD_LEN || unseal(&id.to_be_bytes(), value).is_none() || impossible(value));
        return None;
    };
    assert_eq!(&encode_record(&r, id)[..], value, "what decoded does not encode back to its bytes");
    for bit in 0..value.len() * 8 {
        let mut v = value.to_vec();
        v[bit / 8] ^= 1 << (bit % 8);
        assert!(decode_record(id, &v).is_err(), "bit {bit} flipped still decodes");
    }
    Some(r.state())
}
