//! The fuzz targets' committed corpora (`fuzz/corpus/{taskfile,frame,pmi,replica,ledger_record,user_input}/`: hand-written seeds
//! and what libFuzzer kept or found) replayed through the targets' own checks
//! (`fuzz/checks/*.rs`), so every `cargo test` makes the fuzzer's assertions on them without
//! a nightly toolchain. The plugin's target is replayed in `spank-plugin/tests/`.

#[path = "../../fuzz/checks/frame.rs"]
mod frame;
#[path = "../../fuzz/checks/ledger_record.rs"]
mod ledger_record;
#[path = "../../fuzz/checks/pmi.rs"]
mod pmi;
#[path = "../../fuzz/checks/replay.rs"]
mod replay;
#[path = "../../fuzz/checks/replica.rs"]
mod replica;
#[path = "../../fuzz/checks/taskfile.rs"]
mod taskfile;
#[path = "../../fuzz/checks/user_input.rs"]
mod user_input;

use replay::replay;

#[test]
fn taskfile_corpus() {
    replay("taskfile", taskfile::check);
}

#[test]
fn frame_corpus() {
    replay("frame", frame::check);
}

#[test]
fn pmi_corpus() {
    replay("pmi", pmi::check);
}

#[test]
fn replica_corpus() {
    replay("replica", replica::check);
}

/// Beyond the checks, the corpus holds a record of every state a task can be in (cancelled by a
/// user and by a dependency, interrupted, failed, done…), so a layout change that stops one
/// decoding fails here and not only under the fuzzer.
#[test]
fn ledger_record_corpus() {
    let states = replay("ledger_record", ledger_record::check);
    for s in htc::ledger::State::ALL {
        assert!(states.contains(&Some(s)), "no record of the corpus is {}", s.name());
    }
}

#[test]
fn user_input_corpus() {
    replay("user_input", user_input::check);
}
