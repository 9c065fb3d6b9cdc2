//! The `replica` target's checks: `htc::replica::decode_frames` on arbitrary bytes (a ledger
//! snapshot or journal as found in a run directory), and, for what decodes, a round trip: the
//! frames it accepted encode back to exactly the bytes they came from.
//!
//! Shared by the fuzz target (`fuzz_targets/replica.rs`) and the stable replay of the committed
//! corpus `corpus/replica/` in `cargo test` (`node-agent/tests/fuzz_corpus.rs`).

use std::path::Path;

use htc::replica::{self, ReplicaError};

pub fn check(data: &[u8]) {
    let mut seen = Vec::new();
    let name = Path::new("fuzz-input");
    let push = |e| {
        seen.push(e);
        Ok(())
    };
    match replica::decode_frames(data, data.len() as u64, name, push) {
        Ok((gen, _tail)) => {
            let mut out = replica::header(gen);
            for e in &seen {
                replica::encode(&mut out, e.op, e.db, &e.key, &e.val);
            }
            assert!(data.starts_with(&out), "what was accepted is not what was read");
            let mut again = Vec::new();
            let (g2, _) = replica::decode_frames(&out[..], out.len() as u64, name, |e| {
                again.push(e);
                Ok(())
            })
            .unwrap();
            assert_eq!((g2, &again), (gen, &seen));
        }
        Err(ReplicaError::Damaged { why, .. }) => assert!(!why.is_empty()),
        Err(e) => panic!("decoding bytes can only find damage, got {e}"),
    }
}
