//! An agent's own scheduling: the order of its queue, what starts next on its cores and
//! devices, which running tasks stop to make room for higher-priority work, and when a task
//! past its time limit is told to stop and then killed. One policy for the process executor
//! (`htc_exec::executor`) and the virtual one (`crate::virtual_exec`): they differ only in how
//! a task runs and ends, never in which task gets the cores.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use crate::record::{Ended, Outcome};
use crate::work::{recall_from, ExecEvent, Finished, TaskToRun};

/// Tasks sent to the agent and not started: higher priority first, the leader's order within
/// one priority.
#[derive(Debug, Default)]
pub struct Queue {
    tasks: VecDeque<TaskToRun>,
    /// Some task ever had a priority: kept in priority order from then on (sorting costs
    /// nothing to runs that use none).
    prioritized: bool,
}

impl Queue {
    pub fn add(&mut self, v: Vec<TaskToRun>) {
        self.prioritized |= v.iter().any(|t| t.shape.priority != 0);
        self.tasks.extend(v);
        if self.prioritized {
            // Stable: the leader's order within a priority.
            self.tasks.make_contiguous().sort_by_key(|t| Reverse(t.shape.priority));
        }
    }

    /// Takes back these tasks unstarted, each said in `out` as recalled.
    pub fn recall(&mut self, ids: &[u64], out: &mut Vec<ExecEvent>) {
        recall_from(&mut self.tasks, ids, out);
    }

    /// Ends these tasks, if queued, as preempted without starting them.
    pub fn preempt(&mut self, ids: &[u64], now_us: u64, out: &mut Vec<ExecEvent>) {
        self.tasks.retain(|t| {
            let keep = !ids.contains(&t.id);
            if !keep {
                out.push(ExecEvent::Finished(Finished {
                    id: t.id,
                    attempt: t.attempt,
                    ended: Ended::new(Outcome::Preempted, 0, now_us, now_us),
                }));
            }
            keep
        });
    }

    /// A task `next` gave to start that could not start after all goes back to the head.
    pub fn put_back(&mut self, t: TaskToRun) {
        self.tasks.push_front(t);
    }

    pub fn clear(&mut self) {
        self.tasks.clear();
    }

    /// Every queued task, emptying the queue.
    pub fn drain(&mut self) -> impl Iterator<Item = TaskToRun> + '_ {
        self.tasks.drain(..)
    }

    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// The next task on `room`, or what to do about the head of the queue.
    pub fn next(&mut self, room: &Room, running: impl Iterator<Item = Holder>) -> Next {
        let Some(t) = self.tasks.front() else { return Next::Idle };
        let (cores, gpus) = (t.shape.cores.max(1) as u32, t.shape.gpus as u32);
        if cores > room.cores || gpus > room.gpus {
            // The leader only sends tasks that fit this agent; refuse rather than wait forever.
            return Next::Refuse(self.tasks.pop_front().expect("a head"));
        }
        if cores <= room.free_cores && gpus <= room.free_gpus {
            return Next::Start(self.tasks.pop_front().expect("a head"));
        }
        let need = Need {
            priority: t.shape.priority,
            cores: cores - cores.min(room.free_cores),
            gpus: gpus - gpus.min(room.free_gpus),
        };
        match victims(need, running) {
            Some(ids) if !ids.is_empty() => Next::Stop(ids),
            _ => Next::Wait,
        }
    }
}

/// What the agent has, and what of it no task holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Room {
    pub cores: u32,
    pub gpus: u32,
    pub free_cores: u32,
    pub free_gpus: u32,
}

/// A running task as the preemption choice sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holder {
    pub id: u64,
    pub priority: i16,
    pub preemptible: bool,
    pub start_us: u64,
    pub cores: u32,
    pub gpus: u32,
    /// Already told to stop (preempted, past its time limit or its memory): its cores and
    /// devices are on their way back.
    pub stopping: bool,
}

impl Holder {
    pub fn of(t: &TaskToRun, start_us: u64, stopping: bool) -> Holder {
        Holder {
            id: t.id,
            priority: t.shape.priority,
            preemptible: t.shape.preemptible,
            start_us,
            cores: t.shape.cores.max(1) as u32,
            gpus: t.shape.gpus as u32,
            stopping,
        }
    }
}

/// What the head of the queue lacks.
#[derive(Debug, Clone, Copy)]
struct Need {
    priority: i16,
    cores: u32,
    gpus: u32,
}

/// What to do next about the queue.
#[derive(Debug, PartialEq)]
pub enum Next {
    /// Start it: the agent has its cores and devices free.
    Start(TaskToRun),
    /// It is wider than the agent: end it as a spawn failure (`E2BIG`).
    Refuse(TaskToRun),
    /// Stop these running tasks (as preempted): they make room for the head of the queue.
    Stop(Vec<u64>),
    /// Nothing starts until a task ends.
    Wait,
    /// The queue is empty.
    Idle,
}

/// The running tasks to stop so that the head's `need` is met: preemptible ones of lower
/// priority, lowest priority then newest first, counting what is already stopping. None when
/// even all of them would not make room: stopping some would throw their work away and still
/// leave the head waiting. Empty when what is stopping is enough.
fn victims(need: Need, running: impl Iterator<Item = Holder>) -> Option<Vec<u64>> {
    let (mut cores, mut gpus) = (need.cores, need.gpus);
    let mut candidates = Vec::new();
    for h in running {
        if h.stopping {
            cores = cores.saturating_sub(h.cores);
            gpus = gpus.saturating_sub(h.gpus);
        } else if h.preemptible && h.priority < need.priority {
            candidates.push(h);
        }
    }
    candidates.sort_unstable_by_key(|h| (h.priority, Reverse(h.start_us), h.id));
    let mut ids = Vec::new();
    for h in candidates {
        if cores == 0 && gpus == 0 {
            break;
        }
        // Only a task that gives back something still lacking is stopped.
        if (cores > 0 && h.cores > 0) || (gpus > 0 && h.gpus > 0) {
            cores = cores.saturating_sub(h.cores);
            gpus = gpus.saturating_sub(h.gpus);
            ids.push(h.id);
        }
    }
    (cores == 0 && gpus == 0).then_some(ids)
}

/// What a time limit asks of a running task when it comes due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// Its limit passed: stop it (SIGTERM) and kill it if still there after the grace.
    Stop,
    /// Its grace after a stop passed: kill it (SIGKILL).
    Kill,
}

/// Time limits of running tasks on any clock (`T`: an `Instant`, µs of a virtual clock), by
/// key (`K`: what the caller finds a task by) and serial (a new task that reused a key is not
/// hit by its predecessor's limit).
#[derive(Debug)]
pub struct Deadlines<T: Ord + Copy, K: Ord + Copy> {
    heap: BinaryHeap<Reverse<(T, K, u64, bool)>>,
}

impl<T: Ord + Copy, K: Ord + Copy> Default for Deadlines<T, K> {
    fn default() -> Self {
        Deadlines { heap: BinaryHeap::new() }
    }
}

impl<T: Ord + Copy, K: Ord + Copy> Deadlines<T, K> {
    /// The task `key` (spawn `serial`) is stopped at `at` unless it ended.
    pub fn limit(&mut self, at: T, key: K, serial: u64) {
        self.heap.push(Reverse((at, key, serial, false)));
    }

    /// The task was told to stop: it is killed at `at` unless it ended.
    pub fn kill_at(&mut self, at: T, key: K, serial: u64) {
        self.heap.push(Reverse((at, key, serial, true)));
    }

    /// The next limit due by `now`: the task's key and serial (the caller drops it if the task
    /// under the key is another or gone), and what it asks.
    pub fn due(&mut self, now: T) -> Option<(K, u64, Due)> {
        let Reverse((at, ..)) = self.heap.peek()?;
        if *at > now {
            return None;
        }
        let Reverse((_, key, serial, kill)) = self.heap.pop()?;
        Some((key, serial, if kill { Due::Kill } else { Due::Stop }))
    }

    /// When the next limit comes due.
    pub fn next(&self) -> Option<T> {
        self.heap.peek().map(|Reverse((at, ..))| *at)
    }
}

/// Why the agent stopped a running task, each cause it saw; `ending` says which names its end.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stopped {
    /// Killed for passing its `mem=`, with the resident MiB seen then.
    pub oom_mb: Option<u64>,
    pub preempted: bool,
    pub timed_out: bool,
    /// Killed by the stuck watch, with the seconds it sat idle.
    pub stuck_s: Option<u32>,
}

/// How a stopped or ended task is recorded: why the agent stopped it comes before how it
/// ended (a task killed for memory that then dies of SIGKILL ran out of memory).
pub fn ending(why: Stopped, exited: bool, value: i32) -> (Outcome, i32) {
    if let Some(mb) = why.oom_mb {
        (Outcome::OutOfMemory, mb.min(i32::MAX as u64) as i32)
    } else if why.preempted {
        (Outcome::Preempted, value)
    } else if why.timed_out {
        (Outcome::TimedOut, value)
    } else if let Some(s) = why.stuck_s {
        (Outcome::Stuck, s.min(i32::MAX as u32) as i32)
    } else if exited {
        (Outcome::Exited, value)
    } else {
        (Outcome::Signaled, value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shape::TaskShape;

    fn task(id: u64, cores: u16, gpus: u8, priority: i16) -> TaskToRun {
        let shape = TaskShape { cores, gpus, priority, preemptible: priority < 0, ..Default::default() };
        TaskToRun::new(id, 1, b"x".to_vec()).shaped(shape)
    }

    fn room(cores: u32, gpus: u32, free_cores: u32, free_gpus: u32) -> Room {
        Room { cores, gpus, free_cores, free_gpus }
    }

    fn holder(id: u64, priority: i16, start_us: u64, cores: u32, gpus: u32) -> Holder {
        Holder { id, priority, preemptible: true, start_us, cores, gpus, stopping: false }
    }

    #[test]
    fn the_queue_runs_higher_priority_first_and_keeps_the_leader_s_order_within_one() {
        let mut q = Queue::default();
        q.add(vec![task(1, 1, 0, 0), task(2, 1, 0, 0)]);
        q.add(vec![task(3, 1, 0, 2), task(4, 1, 0, 0), task(5, 1, 0, 2)]);
        let r = room(8, 0, 8, 0);
        let order: Vec<u64> = std::iter::from_fn(|| match q.next(&r, std::iter::empty()) {
            Next::Start(t) => Some(t.id),
            _ => None,
        })
        .collect();
        assert_eq!(order, [3, 5, 1, 2, 4]);
    }

    #[test]
    fn a_task_wider_than_the_agent_is_refused_and_one_wider_than_what_is_free_waits() {
        let mut q = Queue::default();
        q.add(vec![task(1, 5, 0, 0), task(2, 1, 2, 0), task(3, 3, 0, 0)]);
        assert!(matches!(q.next(&room(4, 1, 4, 1), std::iter::empty()), Next::Refuse(t) if t.id == 1));
        assert!(matches!(q.next(&room(4, 1, 4, 1), std::iter::empty()), Next::Refuse(t) if t.id == 2));
        assert_eq!(q.next(&room(4, 1, 2, 1), std::iter::empty()), Next::Wait);
        assert_eq!(q.len(), 1);
        assert!(matches!(q.next(&room(4, 1, 3, 1), std::iter::empty()), Next::Start(t) if t.id == 3));
        assert_eq!(q.next(&room(4, 1, 0, 1), std::iter::empty()), Next::Idle);
    }

    #[test]
    fn room_is_made_from_the_lowest_priority_and_newest_preemptible_tasks_only() {
        let mut q = Queue::default();
        q.add(vec![task(9, 2, 0, 5)]);
        let running = [
            holder(1, -1, 10, 1, 0),
            holder(2, -2, 5, 1, 0),
            holder(3, -1, 20, 1, 0),
            Holder { preemptible: false, ..holder(4, -9, 30, 1, 0) },
            holder(5, 5, 40, 1, 0),
        ];
        // Two cores short: the lowest priority (2), then the newer of the two at -1 (3).
        assert_eq!(q.next(&room(5, 0, 0, 0), running.into_iter()), Next::Stop(vec![2, 3]));
        // One of them already stopping counts: one more is enough.
        let stopping = running.map(|h| Holder { stopping: h.id == 2, ..h });
        assert_eq!(q.next(&room(5, 0, 0, 0), stopping.into_iter()), Next::Stop(vec![3]));
        let both = running.map(|h| Holder { stopping: h.id == 2 || h.id == 3, ..h });
        assert_eq!(q.next(&room(5, 0, 0, 0), both.into_iter()), Next::Wait);
    }

    #[test]
    fn nothing_is_stopped_when_stopping_everything_allowed_would_not_make_room() {
        let mut q = Queue::default();
        q.add(vec![task(9, 3, 0, 5)]);
        let running = [holder(1, -1, 10, 1, 0), Holder { preemptible: false, ..holder(2, -1, 5, 2, 0) }];
        assert_eq!(q.next(&room(3, 0, 0, 0), running.into_iter()), Next::Wait);
        // Equal priority is not lower: never preempted for.
        let mut q = Queue::default();
        q.add(vec![task(9, 1, 0, -1)]);
        assert_eq!(q.next(&room(1, 0, 0, 0), [holder(1, -1, 1, 1, 0)].into_iter()), Next::Wait);
    }

    #[test]
    fn a_task_short_of_devices_stops_a_holder_of_devices_not_one_of_cores_only() {
        let mut q = Queue::default();
        q.add(vec![task(9, 1, 1, 3)]);
        let running = [holder(1, -1, 30, 1, 0), holder(2, -1, 10, 1, 1)];
        assert_eq!(q.next(&room(4, 1, 2, 0), running.into_iter()), Next::Stop(vec![2]));
    }

    #[test]
    fn limits_come_due_in_time_order_once_each() {
        let mut d: Deadlines<u64, i32> = Deadlines::default();
        d.limit(30, 7, 1);
        d.limit(10, 8, 2);
        assert_eq!(d.next(), Some(10));
        assert_eq!(d.due(9), None);
        assert_eq!(d.due(10), Some((8, 2, Due::Stop)));
        d.kill_at(15, 8, 2);
        assert_eq!(d.due(40), Some((8, 2, Due::Kill)));
        assert_eq!(d.due(40), Some((7, 1, Due::Stop)));
        assert_eq!(d.due(40), None);
    }

    #[test]
    fn why_the_agent_stopped_a_task_comes_before_how_it_ended() {
        let all = Stopped { oom_mb: Some(700), preempted: true, timed_out: true, stuck_s: Some(60) };
        assert_eq!(ending(all, false, 9), (Outcome::OutOfMemory, 700));
        let all = Stopped { oom_mb: None, ..all };
        assert_eq!(ending(all, false, 15), (Outcome::Preempted, 15));
        assert_eq!(ending(Stopped { preempted: false, ..all }, false, 15), (Outcome::TimedOut, 15));
        let stuck = Stopped { stuck_s: Some(60), ..Stopped::default() };
        assert_eq!(ending(stuck, false, 15), (Outcome::Stuck, 60), "its end is the watch's, whatever signal did it");
        assert_eq!(ending(stuck, true, 0), (Outcome::Stuck, 60));
        assert_eq!(ending(Stopped::default(), true, 3), (Outcome::Exited, 3));
        assert_eq!(ending(Stopped::default(), false, 9), (Outcome::Signaled, 9));
    }
}
