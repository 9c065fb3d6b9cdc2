//! slurm-htc store: where a run's state lives and how it survives. The task ledger (`ledger`,
//! LMDB, a CRC on every value) written only by the leader; its journal and snapshot in the submit
//! directory (`replica`) that a run recovers from when the node-local ledger is lost, and their
//! file format with the open journal the ledger writes to (`journal`); the checks that a ledger is
//! whole (`verify`, `pagecheck`, `mapfault`); the run directory (`rundir`) and loading a task file
//! into it (`load`). Free space and the host come from `htc-host`.
//!
//! May use: `htc-core` (records, task states), `htc-host`, LMDB, files, `libc`. May not use: the engine's
//! machines, the wire format, sockets or processes: the store knows tasks, not agents.

mod cursor;
pub mod journal;
pub mod layout;
pub mod ledger;
pub mod load;
pub mod mapfault;
pub mod pagecheck;
pub mod replica;
pub mod rundir;
pub mod verify;
pub mod vouch;
