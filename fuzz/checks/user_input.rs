//! The `user_input` target's checks: what users type or leave for other commands to read, other
//! than task files. `--tasks` id lists (`htc_core::idset`), the words of `#HTC sweep` lines
//! (`htc_core::sweep`, no table files), and the leader's live view file (`htc::live`), which
//! `htc watch` reads while the leader rewrites it.
//!
//! Shared by the fuzz target (`fuzz_targets/user_input.rs`) and the stable replay of the committed
//! corpus `corpus/user_input/` in `cargo test` (`node-agent/tests/fuzz_corpus.rs`).

use htc::live::View;
use htc_core::{idset, sweep::Sweep};

pub fn check(data: &[u8]) {
    let text = String::from_utf8_lossy(data);

    if let Ok(ranges) = idset::parse(&text) {
        assert!(!ranges.is_empty());
        assert!(ranges.iter().all(|r| *r.start() >= 1 && r.start() <= r.end()), "{ranges:?}");
    }

    // A sweep's words, without `rows=` (which reads a file); its count is what it makes.
    let words: String =
        text.lines().next().unwrap_or("").split(' ').filter(|w| !w.contains("rows=")).collect::<Vec<_>>().join(" ");
    if let Ok(mut s) = Sweep::parse(&words, None) {
        let n = s.tasks().expect("a parsed sweep has a count within the limit");
        assert!(n >= 1);
        let names = s.names().len();
        let t = s.compile(b"cmd {a} {b} {x}");
        s.start().unwrap();
        let mut made = 1u64;
        let mut buf = Vec::new();
        while made < 2000 {
            let v = s.values();
            assert_eq!(v.len(), names);
            t.fill(&v, &mut buf);
            assert!(buf.starts_with(b"cmd "));
            if !s.advance().unwrap() {
                assert_eq!(made, n, "made as many as counted");
                break;
            }
            made += 1;
        }
    }

    if let Ok(v) = View::decode(&text, "live") {
        // What is written reads back the same.
        let again = View::decode(&v.encode(), "live").expect("an encoded view decodes");
        assert_eq!(again.encode(), v.encode());
    }
}
