//! The end-to-end tests of `htc` and `htc-agent` against the real binaries, one test binary with
//! each file of this directory a module (see `autotests` in Cargo.toml): what they share is in
//! `common`.

mod common;

mod after;
mod auth;
mod clients;
mod faults;
mod fuzz_corpus;
mod join;
mod ledger_flips;
mod load;
mod open;
mod output_and_log;
mod output_integrity;
mod report;
mod resources;
mod retry;
mod run;
mod sim;
mod spawn_syscalls;
mod storage;
mod sweep;
mod task_view;
mod upgrade;
mod watch;
