//! slurm-htc node runtime: the I/O around the engine. The leader's driver (`leader`: the core
//! against the ledger and the agents' connections, `net` its sockets, `launch` how agents start)
//! and the agent's (`agent`: the machine against its executors and its parent's connection,
//! `relay` to its children); the wire's framing (`frame`) and authentication (`auth`); finding
//! the parent in the tree (`bootstrap`, `pmi`); the Slurm glue (`slurm`); `htc-agent work`'s
//! command line (`work_args`) and start (`work`); the live view's file (`livefile`); joining a
//! running run from another allocation (`join`) and the joined job's hold on it (`joined`, what
//! `htc_engine::lifecycle` asks for); a run continued by another job (`continuation`); the jobs
//! a run submits itself (`submit`).
//!
//! May use: every crate below (core, engine, store, exec), tokio, sockets. May not use: the
//! product's command lines, displays and reports (`node-agent`).

pub mod agent;
pub mod auth;
pub mod bootstrap;
pub mod client;
pub mod continuation;
pub mod frame;
pub mod join;
pub mod joined;
pub mod leader;
pub mod livefile;
pub mod pmi;
pub mod slurm;
pub mod submit;
pub mod work;
pub mod work_args;
