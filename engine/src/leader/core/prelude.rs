//! The names every handler of the core uses: its state, its inputs, its parts, and what it
//! speaks. Handlers import this instead of their parent, so that none of them depends on
//! `mod.rs`, which calls them.

pub(super) use std::collections::{HashMap, HashSet, VecDeque};
pub(super) use std::sync::Arc;

pub(super) use htc_core::affinity::Route;
pub(super) use htc_core::backfill::{self, Need};
pub(super) use htc_core::idmap::IdSet;
pub(super) use htc_core::partition::{Block, Partition};
pub(super) use htc_core::record::{Attempt, Change, Ended, Outcome, Record};
pub(super) use htc_core::task::{self, End, Life, State, Step};

pub(super) use super::super::effect::{self, Effect, Effects};
pub(super) use crate::live;
pub(super) use crate::msg::{self, Stop, ToAgent};

pub(super) use super::allocation::{Allocation, Stage};
pub(super) use super::asking::Idle;
pub(super) use super::flights::Flight;
pub(super) use super::input::{Ending, Tasks};
pub(super) use super::roster::Agent;
pub(super) use super::state::Core;
