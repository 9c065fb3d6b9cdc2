//! The `pmi` target's checks: PMI2 server replies (the length-prefixed `cmd=…;k=v;…;` messages
//! and the PMI1-style answer to `init`) through the client's own parsing (`htc::pmi::fuzz_parse_*`).
//!
//! Shared by the fuzz target (`fuzz_targets/pmi.rs`) and the stable replay of the committed
//! corpus `corpus/pmi/` in `cargo test` (`node-agent/tests/fuzz_corpus.rs`), so both make exactly these assertions.

use htc::pmi::{self, PmiError, MAX_MESSAGE};

const CMDS: [&str; 5] = ["fullinit", "kvs-put", "kvs-fence", "kvs-get", "finalize"];

pub fn check(data: &[u8]) {
    let Some((&sel, msg)) = data.split_first() else { return };
    if sel & 0x80 != 0 {
        match pmi::fuzz_parse_init_response(msg) {
            Ok(()) => {
                let line = std::str::from_utf8(msg).unwrap();
                let rc = line.split_ascii_whitespace().filter_map(|t| t.strip_prefix("rc=")).next_back();
                assert_eq!(rc.map(str::parse::<i32>), Some(Ok(0)), "{line:?}");
                assert!(line.split_ascii_whitespace().any(|t| t == "pmi_version=2"), "{line:?}");
            }
            Err(e) => assert!(!e.to_string().is_empty()),
        }
        return;
    }
    let cmd = CMDS[usize::from(sel) % CMDS.len()];
    match pmi::fuzz_parse_response(msg, cmd) {
        Ok(pairs) => {
            assert!(msg.len() - 6 <= MAX_MESSAGE);
            assert_eq!(pairs[0].0, "cmd");
            assert_eq!(pairs[0].1, format!("{cmd}-response"));
            for (k, v) in &pairs {
                assert!(!k.is_empty() && !k.contains(';') && !k.contains('=') && !v.contains(';'), "{k:?}={v:?}");
            }
            let rc = pairs.iter().find(|(k, _)| k == "rc").unwrap();
            assert_eq!(rc.1.trim().parse::<i32>(), Ok(0));
        }
        Err(e @ PmiError::Rc { .. }) | Err(e @ PmiError::Protocol(_)) | Err(e @ PmiError::Closed) => {
            assert!(!e.to_string().is_empty())
        }
        Err(e) => panic!("unexpected error kind for a parse: {e:?}"),
    }
}
