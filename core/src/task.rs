//! A task's life: its states and the one function that moves it between them. Every scheduler
//! decision that changes a task (dispatch, start, how an attempt ended, an interrupted session)
//! goes through [`step`], which also decides retries; the counts of tasks per state move with it
//! and can never go below zero.

/// Where a task stands. The numbers are the ledger's on-disk encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum State {
    /// Waiting for an instance.
    Pending = 0,
    /// Sent to an instance, not yet reported started.
    Dispatched = 1,
    Running = 2,
    /// Succeeded; never runs again.
    Done = 3,
    /// Out of attempts, or failed in a way a retry cannot fix; never runs again unless a user
    /// asks for it.
    Failed = 4,
    /// Stopped by a user, or by the failure of a task it depended on (`after=`); never runs
    /// again unless a user asks for it.
    Cancelled = 5,
}

impl State {
    pub const ALL: [State; 6] =
        [State::Pending, State::Dispatched, State::Running, State::Done, State::Failed, State::Cancelled];

    pub fn from_u8(v: u8) -> Option<State> {
        State::ALL.get(v as usize).copied()
    }

    pub fn name(self) -> &'static str {
        match self {
            State::Pending => "pending",
            State::Dispatched => "dispatched",
            State::Running => "running",
            State::Done => "done",
            State::Failed => "failed",
            State::Cancelled => "cancelled",
        }
    }

    /// Done, failed or cancelled: the task needs nothing more.
    pub fn is_final(self) -> bool {
        matches!(self, State::Done | State::Failed | State::Cancelled)
    }

    /// Dispatched or running: an attempt is out there.
    pub fn in_flight(self) -> bool {
        matches!(self, State::Dispatched | State::Running)
    }
}

/// How an attempt ended, as far as retrying is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    Succeeded,
    /// Failed; `permanent` when a retry cannot help (command not found, not executable).
    Failed {
        permanent: bool,
    },
    /// Its agent vanished while it ran: not the task's fault, unless it keeps happening.
    Lost,
    /// Stopped for higher-priority work: it runs again later, and that costs it nothing (its
    /// budget of retries grows by the attempt, so attempt numbers stay distinct).
    Preempted,
}

/// Something that happens to a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Sent to an instance: a new attempt.
    Dispatch,
    /// Its process started.
    Start,
    /// The attempt ended.
    Finish(End),
    /// The session that ran it ended (leader killed, job requeued): the attempt costs no retry,
    /// but its number stays used, so that its re-run is a new attempt (`$HTC_ATTEMPT`, `htc log`).
    Interrupt,
    /// Given back unstarted by its agent when asked (a recall): the attempt is forgotten and
    /// costs no retry, and its number is free again (nothing of it can come back late).
    Return,
    /// Taken back unstarted without its agent's word (a lost agent's queue, a shrunk instance):
    /// the attempt is forgotten and costs no retry, but its number stays used, so that a late
    /// start or result of it is told apart (`Life::returns`).
    Reclaim,
    /// No instance of the job can ever run it (it asks for more than any node has).
    Refuse,
    /// The attempt that last failed did so because of its node (a black hole: it fails every
    /// task), not the task: it costs no retry, and a task it made fail for good runs again.
    Refund,
    /// A user asked for a finished task to run again (`htc retry`): a new round of attempts,
    /// numbered after the earlier ones, with this many retries of its own.
    Rerun { retries: u8 },
    /// A user cancelled it, or a task it depended on (`after=`) failed for good: it never
    /// starts, or what runs of it is stopped and its end not recorded. Costs no retry.
    Cancel,
}

/// Attempts lost with their agent before a loss counts as a failure: a task that takes agents
/// down with it is probably their cause.
pub const MAX_LOSSES: u8 = 3;

/// Attempts a task can have in all (its count is a byte): rounds of `htc retry` included.
pub const MAX_ATTEMPTS: u8 = 255;

/// The part of a task's record that its life changes or depends on. Only [`step`] moves it:
/// elsewhere it is read, or rebuilt as it was stored (`Life::of`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Life {
    state: u8,
    /// Attempts counted so far (the current one included while it is in flight).
    attempts: u8,
    /// Retries allowed after the first attempt.
    retries: u8,
    /// Attempts lost with their agent so far.
    losses: u8,
    /// Attempt numbers used by dispatches that never counted as attempts: taken back
    /// unstarted (`Step::Reclaim`) or refunded (`Step::Refund`).
    returns: u8,
}

/// What the step means beyond the new state, for whoever records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    None,
    /// The attempt that just ended is kept in the history and the task waits for another.
    Retry,
    /// The task is finished (done, failed or cancelled) for good.
    Final,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a {state} task cannot take the step {step:?}", state = .from.name())]
pub struct Invalid {
    pub from: State,
    pub step: Step,
}

impl Life {
    /// A life as a record stored it.
    pub fn of(state: State, attempts: u8, retries: u8, losses: u8, returns: u8) -> Life {
        Life { state: state as u8, attempts, retries, losses, returns }
    }

    /// A task's life before its first attempt, with `retries` allowed.
    pub const fn new(retries: u8) -> Life {
        Life { state: State::Pending as u8, attempts: 0, retries, losses: 0, returns: 0 }
    }

    /// Attempts counted so far (the current one included while it is in flight).
    pub fn attempts(&self) -> u8 {
        self.attempts
    }
    /// Retries allowed after the first attempt.
    pub fn retries(&self) -> u8 {
        self.retries
    }
    /// Attempts lost with their agent so far.
    pub fn losses(&self) -> u8 {
        self.losses
    }
    /// Attempt numbers used by dispatches that never counted as attempts.
    pub fn returns(&self) -> u8 {
        self.returns
    }

    /// The number of the attempt in flight (or of the last one), as tasks see it in
    /// `$HTC_ATTEMPT`: every run counts, lost ones included, so that the re-run of a lost
    /// attempt never shares its number (a late result of the lost run is then told apart).
    pub fn attempt_no(&self) -> u32 {
        self.attempts as u32 + self.losses as u32 + self.returns as u32
    }

    pub fn state(&self) -> State {
        // Records are only written through `step`, so the byte is always a valid state.
        State::from_u8(self.state).unwrap_or(State::Pending)
    }
}

/// The fewest steps that bring a new task to `s` (tests and tools that need a task in a state
/// take them rather than set it).
pub fn path_to(s: State) -> &'static [Step] {
    match s {
        State::Pending => &[],
        State::Dispatched => &[Step::Dispatch],
        State::Running => &[Step::Dispatch, Step::Start],
        State::Done => &[Step::Dispatch, Step::Start, Step::Finish(End::Succeeded)],
        State::Failed => &[Step::Refuse],
        State::Cancelled => &[Step::Cancel],
    }
}

/// The transition function: the new life and what it means, or `Invalid` for a step the state
/// does not allow (a stale report, say), which callers ignore without changing anything.
pub fn step(life: Life, s: Step) -> Result<(Life, Effect), Invalid> {
    use State::*;
    let from = life.state();
    let invalid = Err(Invalid { from, step: s });
    let mut next = life;
    let to = match (from, s) {
        (Pending, Step::Dispatch) => {
            next.attempts = life.attempts.saturating_add(1);
            Dispatched
        }
        (Dispatched, Step::Start) => Running,
        (Dispatched | Running, Step::Finish(End::Succeeded)) => Done,
        (Dispatched | Running, Step::Finish(End::Lost)) if life.losses + 1 < MAX_LOSSES => {
            next.losses = life.losses + 1;
            next.attempts = life.attempts.saturating_sub(1);
            next.state = Pending as u8;
            return Ok((next, Effect::Retry));
        }
        (Dispatched | Running, Step::Finish(End::Lost)) => {
            next.losses = life.losses.saturating_add(1);
            retry_or_fail(life, false)
        }
        (Dispatched | Running, Step::Finish(End::Failed { permanent })) => retry_or_fail(life, permanent),
        (Dispatched | Running, Step::Finish(End::Preempted)) if life.attempts < MAX_ATTEMPTS => {
            next.retries = life.retries.saturating_add(1);
            Pending
        }
        (Dispatched | Running, Step::Finish(End::Preempted)) => Failed,
        (Dispatched, Step::Return) => {
            next.attempts = life.attempts.saturating_sub(1);
            Pending
        }
        (Dispatched | Running, Step::Interrupt) | (Dispatched, Step::Reclaim) => {
            next.attempts = life.attempts.saturating_sub(1);
            next.returns = life.returns.saturating_add(1);
            Pending
        }
        (Pending, Step::Refuse) => Failed,
        (Pending | Dispatched | Running, Step::Cancel) => Cancelled,
        // The budget counts all attempts so far (`retry_or_fail`): the new round's starts here,
        // and must fit in the count (a task has at most `MAX_ATTEMPTS`).
        (Done | Failed | Cancelled, Step::Rerun { retries })
            if (life.attempts as u16 + retries as u16) < MAX_ATTEMPTS as u16 =>
        {
            next.retries = life.attempts + retries;
            Pending
        }
        (Pending | Failed, Step::Refund) if life.attempts > 0 => {
            // Its attempts count goes back one, but its next run is a new attempt number.
            next.attempts = life.attempts - 1;
            next.returns = life.returns.saturating_add(1);
            Pending
        }
        _ => return invalid,
    };
    next.state = to as u8;
    let effect = match (from, to) {
        (_, Done | Failed | Cancelled) => Effect::Final,
        (Dispatched | Running, Pending) if !matches!(s, Step::Interrupt | Step::Return | Step::Reclaim) => {
            Effect::Retry
        }
        _ => Effect::None,
    };
    Ok((next, effect))
}

fn retry_or_fail(life: Life, permanent: bool) -> State {
    if !permanent && life.attempts <= life.retries && life.attempts < MAX_ATTEMPTS {
        State::Pending
    } else {
        State::Failed
    }
}

/// Tasks per state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts(pub [u64; 6]);

impl Counts {
    pub fn get(&self, s: State) -> u64 {
        self.0[s as usize]
    }
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }
    /// Tasks not yet done, failed or cancelled.
    pub fn unfinished(&self) -> u64 {
        self.get(State::Pending) + self.get(State::Dispatched) + self.get(State::Running)
    }
    /// Tasks done, failed or cancelled: they need nothing more.
    pub fn finished(&self) -> u64 {
        self.get(State::Done) + self.get(State::Failed) + self.get(State::Cancelled)
    }
    pub fn add(&mut self, s: State) {
        self.0[s as usize] += 1;
    }
    /// Moves a task's life by `step`, and these counts with it: the way every holder of counts
    /// (the leader's core, `htc retry`) moves a task, so that the two cannot part.
    pub fn step(&mut self, life: Life, s: Step) -> Result<(Life, Effect), Invalid> {
        let (to, effect) = step(life, s)?;
        self.moved(life.state(), to.state());
        Ok((to, effect))
    }

    /// One task moved. A move out of an empty state means the counts and the records disagree:
    /// a bug, caught in debug builds and clamped (never wrapped) in release builds.
    fn moved(&mut self, from: State, to: State) {
        let c = &mut self.0[from as usize];
        debug_assert!(*c > 0, "no {} task to move to {}", from.name(), to.name());
        *c = c.saturating_sub(1);
        self.0[to as usize] += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn life(state: State, attempts: u8, retries: u8) -> Life {
        Life { state: state as u8, attempts, retries, losses: 0, returns: 0 }
    }

    fn run(l: Life, steps: &[Step]) -> (Life, Vec<Effect>) {
        let mut l = l;
        let mut fx = Vec::new();
        for &s in steps {
            let (n, e) = step(l, s).unwrap_or_else(|e| panic!("{e} (life {l:?})"));
            l = n;
            fx.push(e);
        }
        (l, fx)
    }

    #[test]
    fn a_dispatch_given_back_unstarted_costs_nothing_and_a_running_one_cannot_be() {
        let (l, fx) = run(life(State::Pending, 1, 0), &[Step::Dispatch, Step::Return]);
        assert_eq!((l.state(), l.attempts, l.retries), (State::Pending, 1, 0));
        assert_eq!(fx.last(), Some(&Effect::None), "no retry used: {fx:?}");
        let running = run(life(State::Pending, 0, 0), &[Step::Dispatch, Step::Start]).0;
        assert!(step(running, Step::Return).is_err(), "a started task ends by its result");
        assert!(step(life(State::Pending, 0, 0), Step::Return).is_err());
        // Its number is free again: the next dispatch is the same attempt.
        let (again, _) = step(l, Step::Dispatch).unwrap();
        assert_eq!(again.attempt_no(), 2);
    }

    #[test]
    fn a_dispatch_taken_back_without_its_agent_s_word_costs_nothing_but_its_number() {
        let (l, fx) = run(life(State::Pending, 1, 0), &[Step::Dispatch, Step::Reclaim]);
        assert_eq!((l.state(), l.attempts, l.returns, fx[1]), (State::Pending, 1, 1, Effect::None));
        // A late result of attempt 2 (the agent still had it) is told from the next run, 3.
        let (again, _) = step(l, Step::Dispatch).unwrap();
        assert_eq!(again.attempt_no(), 3);
        let running = run(life(State::Pending, 0, 0), &[Step::Dispatch, Step::Start]).0;
        assert!(step(running, Step::Reclaim).is_err(), "a started task ends by its result");
    }

    #[test]
    fn a_task_that_succeeds_first_time() {
        let (l, fx) = run(life(State::Pending, 0, 2), &[Step::Dispatch, Step::Start, Step::Finish(End::Succeeded)]);
        assert_eq!((l.state(), l.attempts), (State::Done, 1));
        assert_eq!(fx, [Effect::None, Effect::None, Effect::Final]);
    }

    #[test]
    fn failures_retry_until_the_retries_are_used_up() {
        let fail = Step::Finish(End::Failed { permanent: false });
        let (l, fx) = run(
            life(State::Pending, 0, 2),
            &[Step::Dispatch, Step::Start, fail, Step::Dispatch, fail, Step::Dispatch, Step::Start, fail],
        );
        assert_eq!((l.state(), l.attempts), (State::Failed, 3), "1 attempt + 2 retries");
        assert_eq!(fx[2], Effect::Retry);
        assert_eq!(fx[4], Effect::Retry);
        assert_eq!(fx[7], Effect::Final);
        // No retries at all: the first failure is final.
        let (l, _) = run(life(State::Pending, 0, 0), &[Step::Dispatch, fail]);
        assert_eq!(l.state(), State::Failed);
    }

    #[test]
    fn preemption_costs_no_retry_however_often() {
        let pre = Step::Finish(End::Preempted);
        let mut steps = Vec::new();
        for _ in 0..10 {
            steps.extend([Step::Dispatch, Step::Start, pre]);
        }
        let (l, fx) = run(life(State::Pending, 0, 0), &steps);
        assert_eq!((l.state(), l.attempts, l.retries, l.losses), (State::Pending, 10, 10, 0));
        assert_eq!(fx[2], Effect::Retry, "the preempted attempt is kept in the history");
        // Its own retries (none) are still whole: the first failure after is final.
        let (l, _) = run(l, &[Step::Dispatch, Step::Finish(End::Failed { permanent: false })]);
        assert_eq!((l.state(), l.attempt_no()), (State::Failed, 11));
    }

    #[test]
    fn a_rerun_is_a_new_round_numbered_after_the_old_one() {
        let fail = Step::Finish(End::Failed { permanent: false });
        let (l, _) = run(life(State::Pending, 0, 1), &[Step::Dispatch, fail, Step::Dispatch, fail]);
        assert_eq!((l.state(), l.attempts), (State::Failed, 2));
        // Once, no retries: the third attempt, final whatever its end.
        let (l, fx) = run(l, &[Step::Rerun { retries: 0 }, Step::Dispatch]);
        assert_eq!((l.state(), l.attempt_no(), fx[0]), (State::Dispatched, 3, Effect::None));
        assert_eq!(step(l, fail).unwrap().0.state(), State::Failed);
        // With one retry: two more attempts; a done task can be rerun too.
        let (l, _) = run(l, &[Step::Finish(End::Succeeded), Step::Rerun { retries: 1 }, Step::Dispatch, fail]);
        assert_eq!((l.state(), l.attempts), (State::Pending, 4));
        // Not past the count: a task that used up its attempts is not rerun.
        let worn = Life { state: State::Failed as u8, attempts: 250, retries: 250, losses: 0, returns: 0 };
        assert!(step(worn, Step::Rerun { retries: 4 }).is_ok());
        assert!(step(worn, Step::Rerun { retries: 5 }).is_err());
        let (at_max, _) = step(
            Life { state: State::Pending as u8, attempts: 254, retries: 255, losses: 0, returns: 0 },
            Step::Dispatch,
        )
        .unwrap();
        assert_eq!(step(at_max, fail).unwrap().0.state(), State::Failed, "the 255th attempt is the last");
        // Only finished tasks: a pending or running one is left as it is.
        assert!(step(life(State::Running, 1, 0), Step::Rerun { retries: 0 }).is_err());
        assert!(step(life(State::Pending, 0, 0), Step::Rerun { retries: 0 }).is_err());
    }

    #[test]
    fn a_task_not_finished_can_be_cancelled_for_good_and_rerun_by_a_user() {
        for from in [State::Pending, State::Dispatched, State::Running] {
            let (l, fx) = run(life(State::Pending, 0, 3), path_to(from));
            let (l, e) = step(l, Step::Cancel).unwrap();
            assert_eq!((l.state(), e), (State::Cancelled, Effect::Final), "from {}", from.name());
            assert!(fx.iter().all(|&e| e == Effect::None));
            // What comes of the stopped attempt is stale.
            assert!(step(l, Step::Finish(End::Succeeded)).is_err());
            assert!(step(l, Step::Start).is_err());
            assert_eq!(step(l, Step::Rerun { retries: 0 }).unwrap().0.state(), State::Pending);
        }
        for from in [State::Done, State::Failed, State::Cancelled] {
            assert!(step(run(life(State::Pending, 0, 0), path_to(from)).0, Step::Cancel).is_err());
        }
        let mut c = Counts::default();
        c.add(State::Running);
        let (l, _) = run(life(State::Pending, 0, 0), path_to(State::Running));
        c.step(l, Step::Cancel).unwrap();
        assert_eq!((c.get(State::Cancelled), c.unfinished(), c.total()), (1, 0, 1));
    }

    #[test]
    fn permanent_failures_are_never_retried() {
        let (l, fx) = run(life(State::Pending, 0, 5), &[Step::Dispatch, Step::Finish(End::Failed { permanent: true })]);
        assert_eq!((l.state(), fx[1]), (State::Failed, Effect::Final));
    }

    #[test]
    fn losses_cost_no_retry_until_they_repeat() {
        let lost = Step::Finish(End::Lost);
        let (l, fx) = run(life(State::Pending, 0, 0), &[Step::Dispatch, Step::Start, lost, Step::Dispatch, lost]);
        assert_eq!((l.state(), l.attempts, l.losses), (State::Pending, 0, 2));
        assert_eq!((fx[2], fx[4]), (Effect::Retry, Effect::Retry));
        // Each run has its own number, though the losses used no retry.
        let (next, _) = step(l, Step::Dispatch).unwrap();
        assert_eq!(next.attempt_no(), 3, "runs 1 and 2 were lost; this is the third");
        // The third loss counts as a failure, and with no retries left it is final.
        let (l, fx) = run(l, &[Step::Dispatch, lost]);
        assert_eq!((l.state(), l.losses, fx[1]), (State::Failed, 3, Effect::Final));
    }

    #[test]
    fn a_refunded_failure_costs_no_retry_and_reopens_a_task_it_failed() {
        let fail = Step::Finish(End::Failed { permanent: false });
        let (l, _) = run(life(State::Pending, 0, 0), &[Step::Dispatch, fail]);
        assert_eq!(l.state(), State::Failed, "no retries: the failure was final");
        let (l, fx) = run(l, &[Step::Refund]);
        assert_eq!((l.state(), l.attempts, fx[0]), (State::Pending, 0, Effect::None));
        let (l, _) = run(life(State::Pending, 0, 1), &[Step::Dispatch, fail, Step::Refund]);
        assert_eq!((l.state(), l.attempts), (State::Pending, 0), "its retry is given back");
        assert!(step(life(State::Pending, 0, 1), Step::Refund).is_err(), "nothing to refund");
    }

    #[test]
    fn an_interrupted_attempt_costs_no_retry_but_keeps_its_number() {
        let (l, fx) = run(life(State::Pending, 0, 1), &[Step::Dispatch, Step::Start, Step::Interrupt]);
        assert_eq!((l.state(), l.attempts, fx[2]), (State::Pending, 0, Effect::None));
        let (l, _) = run(l, &[Step::Dispatch]);
        assert_eq!(l.attempt_no(), 2, "its re-run is attempt 2");
    }

    #[test]
    fn steps_a_state_does_not_allow_change_nothing() {
        let done = life(State::Done, 1, 2);
        for s in
            [Step::Dispatch, Step::Start, Step::Finish(End::Succeeded), Step::Interrupt, Step::Refuse, Step::Refund]
        {
            assert_eq!(step(done, s), Err(Invalid { from: State::Done, step: s }));
        }
        // A stale start (the task was re-queued meanwhile) or result for a pending task.
        assert!(step(life(State::Pending, 1, 2), Step::Start).is_err());
        assert!(step(life(State::Pending, 1, 2), Step::Finish(End::Succeeded)).is_err());
        assert!(step(life(State::Running, 1, 2), Step::Dispatch).is_err());
        assert!(step(life(State::Running, 1, 2), Step::Start).is_err());
        assert_eq!(step(life(State::Pending, 0, 0), Step::Refuse).unwrap().0.state(), State::Failed);
    }

    /// Every state × step pair: the result is either an error or a state the table allows, and
    /// the counts follow without ever going negative.
    #[test]
    fn every_pair_is_defined_and_counts_balance() {
        let steps = [
            Step::Dispatch,
            Step::Start,
            Step::Finish(End::Succeeded),
            Step::Finish(End::Failed { permanent: false }),
            Step::Finish(End::Failed { permanent: true }),
            Step::Finish(End::Lost),
            Step::Interrupt,
            Step::Refuse,
            Step::Refund,
            Step::Return,
            Step::Reclaim,
            Step::Cancel,
        ];
        let mut counts = Counts::default();
        for from in State::ALL {
            for s in steps {
                for attempts in 0..4 {
                    for losses in 0..MAX_LOSSES {
                        let l = Life { state: from as u8, attempts, retries: 2, losses, returns: 0 };
                        counts.add(from);
                        match step(l, s) {
                            Ok((n, _)) => counts.moved(from, n.state()),
                            Err(_) => {
                                assert!(from.is_final() || !matches!((from, s), (State::Pending, Step::Dispatch)))
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(counts.total(), State::ALL.len() as u64 * steps.len() as u64 * 4 * MAX_LOSSES as u64);
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "no running task")]
    fn counts_catch_a_move_from_an_empty_state() {
        Counts::default().moved(State::Running, State::Done);
    }
}
