//! The `frame` target's checks: `htc::frame::decode` on arbitrary bytes (the body after the
//! length prefix), and, for what decodes, an encode/decode round trip.
//!
//! Shared by the fuzz target (`fuzz_targets/frame.rs`) and the stable replay of the committed
//! corpus `corpus/frame/` in `cargo test` (`node-agent/tests/fuzz_corpus.rs`), so both make exactly these assertions.

use htc::frame::{self, FrameError, MAX_FRAME};

pub fn check(data: &[u8]) {
    match frame::decode(data) {
        Ok(body) => {
            let mut out = Vec::new();
            frame::encode_into(body.clone(), &mut out);
            let len = u32::from_be_bytes(out[..4].try_into().unwrap()) as usize;
            assert_eq!(len, out.len() - 4);
            // (Re-encoding may be longer than the input: a 5-byte varint for a negative
            // int32 comes back as 10 bytes. It still fits a frame for any input that did.)
            assert!(data.len() > MAX_FRAME / 2 || len <= MAX_FRAME);
            assert_eq!(frame::decode(&out[4..]).unwrap(), body);
        }
        Err(FrameError::Decode(e)) => assert!(!e.to_string().is_empty()),
        Err(FrameError::Empty) => {}
        Err(e) => panic!("decode can only fail with Decode or Empty, got {e:?}"),
    }
}
