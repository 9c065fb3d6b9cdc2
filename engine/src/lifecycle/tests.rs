//! The run's life case by case: scripted inputs on a virtual clock (µs since the job started),
//! the effects checked in order.

use super::*;

const S: u64 = 1_000_000;
/// A one-minute job that started at time 0.
const END: u64 = 60 * S;

fn job(resubmit: Option<u32>) -> Job {
    Job {
        id: "7".into(),
        run_id: "5".into(),
        run: "/w/.htc/5".into(),
        nodes: 2,
        end_us: Some(END),
        resubmit,
        agents_wait: true,
    }
}

fn step(life: &mut Life, now: u64, input: Input) -> Vec<Effect> {
    let mut out = Vec::new();
    life.handle(now, input, &mut out);
    out
}

fn print(r: Report) -> Effect {
    Effect::Print(r)
}

fn attached(leader: &str) -> Input {
    Input::Attached { first: 4, last: 5, run_job: "5".into(), leader_job: leader.into(), workdir_refused: None }
}

fn live(job: &str, written_us: u64) -> Option<LiveSeen> {
    Some(LiveSeen { job: job.into(), state: "running".into(), written_us })
}

/// A joined job whose agents run for the leader of job 5.
fn staying() -> Life {
    let mut out = Vec::new();
    let mut life = Life::joining(job(None), &mut out);
    assert_eq!(out, [Effect::Attach { keep: false }]);
    let out = step(&mut life, S, attached("5"));
    let joins =
        Report::Joins { job: "7".into(), run: "/w/.htc/5".into(), run_job: "5".into(), nodes: 2, first: 4, last: 5 };
    assert_eq!(out, [print(joins), Effect::StartAgents { await_leader: true }]);
    assert_eq!(step(&mut life, 2 * S, Input::AgentsStarted), [Effect::Watch { link: true }]);
    life
}

/// A joined job whose agents ended at 10 s, asking who leads.
fn judging() -> Life {
    let mut life = staying();
    let out = step(&mut life, 10 * S, Input::AgentsEnded);
    assert_eq!(
        out,
        [Effect::Detach { keep_agents: false }, print(Report::AgentsEnded { job: "7".into() }), Effect::LookForLeader]
    );
    life
}

/// A joined job whose leader's link closed at 10 s: its agents run on, and it looks for the next.
fn leader_gone() -> Life {
    let mut life = staying();
    let out = step(&mut life, 10 * S, Input::LeaderLinkClosed);
    assert_eq!(
        out,
        [Effect::Detach { keep_agents: true }, print(Report::LeaderGone { job: "7".into() }), Effect::TakeLock]
    );
    life
}

#[test]
fn a_grown_job_let_go_by_a_leader_that_still_leads_leaves() {
    let mut life = judging();
    let out = step(&mut life, 11 * S, Input::LeaderSeen { published: Some("5".into()), live: live("5", 10 * S) });
    assert_eq!(out, [print(Report::LetGo { job: "7".into() }), Effect::Exit(Exit::Code(0))]);
    assert!(life.is_over());
}

#[test]
fn a_job_whose_leader_was_killed_outright_takes_the_run_over() {
    let mut life = judging();
    // The address file is still there, but the view is 6 s old: nobody writes it.
    let out = step(&mut life, 16 * S, Input::LeaderSeen { published: Some("5".into()), live: live("5", 10 * S) });
    assert_eq!(out, [Effect::TakeLock]);
    assert_eq!(step(&mut life, 16 * S, Input::LockTaken { unfinished: 30 }), [Effect::TakeOver]);
    let out = step(&mut life, 17 * S, Input::TookOver { left: 30, kept_agents: None });
    assert_eq!(out, [print(Report::TakesOver { job: "7".into(), left: 30 }), Effect::Lead]);
    let out =
        step(&mut life, 40 * S, Input::SessionEnded { end: SessionEnd::Complete, joined_running: 0, at_us: 40 * S });
    assert_eq!(out, [Effect::Summarize { resume_hint: true }, Effect::Exit(Exit::Session)]);
}

#[test]
fn another_leaders_address_is_not_the_one_that_let_this_job_go() {
    let mut life = judging();
    let out = step(&mut life, 11 * S, Input::LeaderSeen { published: Some("9".into()), live: live("9", 11 * S) });
    assert_eq!(out, [Effect::TakeLock]);
}

#[test]
fn kept_agents_go_to_the_job_that_took_over_under_their_ids() {
    let mut life = leader_gone();
    // Another joined job leads already: attach at once, keeping the agents' ids.
    assert_eq!(step(&mut life, 11 * S, Input::LockBusy { published: true }), [Effect::Attach { keep: true }]);
    let out = step(&mut life, 12 * S, attached("8"));
    let stays = Report::Stays { job: "7".into(), run: "/w/.htc/5".into(), first: 4, last: 5 };
    assert_eq!(out, [print(stays), Effect::Watch { link: true }]);
    // Its agents end with the run; the leader of job 8 let them go.
    step(&mut life, 30 * S, Input::AgentsEnded);
    let out = step(&mut life, 30 * S, Input::LeaderSeen { published: Some("8".into()), live: live("8", 30 * S) });
    assert_eq!(out, [print(Report::LetGo { job: "7".into() }), Effect::Exit(Exit::Code(0))]);
}

#[test]
fn kept_agents_lead_with_the_job_that_takes_over() {
    let mut life = leader_gone();
    assert_eq!(step(&mut life, 11 * S, Input::LockTaken { unfinished: 3 }), [Effect::TakeOver]);
    let out = step(&mut life, 12 * S, Input::TookOver { left: 3, kept_agents: Some(2) });
    assert_eq!(
        out,
        [
            print(Report::TakesOver { job: "7".into(), left: 3 }),
            print(Report::LeadsWithKept { job: "7".into(), agents: 2 }),
            Effect::Lead
        ]
    );
}

#[test]
fn kept_agents_refused_by_the_new_leader_finish_first() {
    let mut life = leader_gone();
    step(&mut life, 11 * S, Input::LockBusy { published: true });
    let out = step(&mut life, 12 * S, Input::AttachFailed { why: "refused".into(), leader_went: false });
    assert_eq!(out, [print(Report::CouldNotKeep { job: "7".into(), why: "refused".into() }), Effect::DrainAgents]);
    assert_eq!(step(&mut life, 20 * S, Input::AgentsEnded), [Effect::LookForLeader]);
    // Whoever is published and fresh let them go.
    let out = step(&mut life, 20 * S, Input::LeaderSeen { published: Some("8".into()), live: live("8", 20 * S) });
    assert_eq!(out, [print(Report::LetGo { job: "7".into() }), Effect::Exit(Exit::Code(0))]);
}

#[test]
fn a_job_without_kept_agents_waits_a_moment_and_joins_the_new_leader_afresh() {
    let mut life = judging();
    step(&mut life, 16 * S, Input::LeaderSeen { published: None, live: None });
    let out = step(&mut life, 16 * S, Input::LockBusy { published: true });
    assert_eq!(out, [Effect::Sleep { us: REATTACH_PAUSE_US }]);
    assert_eq!(step(&mut life, 17 * S, Input::Woke), [Effect::Attach { keep: false }]);
    let out = step(&mut life, 18 * S, attached("8"));
    assert!(matches!(out.as_slice(), [Effect::Print(Report::Joins { .. }), Effect::StartAgents { .. }]), "{out:?}");
}

#[test]
fn a_lock_held_while_nobody_leads_is_tried_again_for_two_minutes() {
    let mut life = judging();
    step(&mut life, 16 * S, Input::LeaderSeen { published: None, live: None });
    let mut now = 16 * S;
    loop {
        let out = step(&mut life, now, Input::LockBusy { published: false });
        if now - 16 * S <= NOBODY_LEADS_US {
            assert_eq!(out, [Effect::Sleep { us: LOCK_RETRY_US }], "at {now}");
        } else {
            assert_eq!(out, [print(Report::NobodyLeads { secs: 120 }), Effect::Exit(Exit::Code(1))]);
            break;
        }
        now += LOCK_RETRY_US;
        assert_eq!(step(&mut life, now, Input::Woke), [Effect::TakeLock]);
    }
    assert!(life.is_over());
}

#[test]
fn a_job_leaves_near_its_time_limit_rather_than_look_for_a_leader() {
    let mut life = judging();
    let at = END - KILL_WAIT_US;
    let out = step(&mut life, at, Input::LeaderSeen { published: None, live: None });
    assert_eq!(out, [print(Report::TimeUp { job: "7".into() }), Effect::Exit(Exit::Code(0))]);
    // With its agents kept, too: the next leader re-runs what they held.
    let mut life = staying();
    let out = step(&mut life, at + S, Input::LeaderLinkClosed);
    assert_eq!(out[2..], [print(Report::TimeUp { job: "7".into() }), Effect::Exit(Exit::Code(0))]);
}

#[test]
fn a_leader_gone_before_the_job_joined_leaves_it_to_find_the_next_or_the_end() {
    let mut out = Vec::new();
    let mut life = Life::joining(job(None), &mut out);
    let out = step(&mut life, S, Input::AttachFailed { why: "not running".into(), leader_went: true });
    assert_eq!(out, [print(Report::LeaderWentFirst { job: "7".into(), why: "not running".into() }), Effect::TakeLock]);
    let out = step(&mut life, S, Input::LockTaken { unfinished: 0 });
    assert_eq!(out, [print(Report::RunEnded { job: "7".into() }), Effect::Exit(Exit::Code(0))]);
}

#[test]
fn a_job_that_cannot_join_fails() {
    let mut out = Vec::new();
    let mut life = Life::joining(job(None), &mut out);
    let out = step(&mut life, S, Input::AttachFailed { why: "other cluster".into(), leader_went: false });
    let r = Report::CannotJoin { job: "7".into(), why: "other cluster".into() };
    assert!(r.to_stderr());
    assert_eq!(out, [print(r), Effect::Exit(Exit::Code(2))]);
}

#[test]
fn agents_that_did_not_start_end_the_stay() {
    let mut out = Vec::new();
    let mut life = Life::joining(job(None), &mut out);
    step(&mut life, S, attached("5"));
    let out = step(&mut life, S, Input::AgentsNotStarted("srun: no".into()));
    let r = Report::AgentsDidNotStart { job: "7".into(), why: "srun: no".into() };
    assert_eq!(out, [Effect::Detach { keep_agents: false }, print(r), Effect::LookForLeader]);
}

#[test]
fn agents_that_do_not_wait_for_a_next_leader_are_watched_without_the_link() {
    let mut out = Vec::new();
    let mut life = Life::joining(Job { agents_wait: false, ..job(None) }, &mut out);
    let out = step(&mut life, S, attached("5"));
    assert_eq!(out[1], Effect::StartAgents { await_leader: false });
    assert_eq!(step(&mut life, S, Input::AgentsStarted), [Effect::Watch { link: false }]);
}

#[test]
fn a_workdir_it_cannot_enter_is_said_before_the_join() {
    let mut out = Vec::new();
    let mut life = Life::joining(job(None), &mut out);
    let input = Input::Attached {
        first: 0,
        last: 0,
        run_job: "5".into(),
        leader_job: "5".into(),
        workdir_refused: Some(("/w".into(), "denied".into())),
    };
    let out = step(&mut life, S, input);
    assert_eq!(out[0], print(Report::WorkdirRefused { job: "7".into(), dir: "/w".into(), why: "denied".into() }));
}

#[test]
fn a_node_that_cannot_hold_the_ledger_does_not_take_over() {
    let mut life = judging();
    step(&mut life, 16 * S, Input::LeaderSeen { published: None, live: None });
    step(&mut life, 16 * S, Input::LockTaken { unfinished: 1 });
    let out = step(&mut life, 16 * S, Input::CannotTakeOver("no disk".into()));
    assert_eq!(out, [print(Report::CannotLead { why: "no disk".into() }), Effect::Exit(Exit::Code(2))]);
}

/// The effects after a session of a job with `--htc-resubmit=2` that ended so at `at_us`.
fn ended(end: SessionEnd, joined_running: usize, at_us: u64) -> (Life, Vec<Effect>) {
    let mut life = Life::leading(job(Some(2)));
    let out = step(&mut life, at_us, Input::SessionEnded { end, joined_running, at_us });
    (life, out)
}

const NOT_CONTINUED: [Effect; 2] = [Effect::Summarize { resume_hint: true }, Effect::Exit(Exit::Session)];

#[test]
fn a_cancel_40_s_into_a_minute_is_not_the_time_limit_no_resubmission() {
    // The defect: every SIGTERM in the last 30 s was taken for the limit.
    assert_eq!(ended(SessionEnd::Terminated, 0, 40 * S).1, NOT_CONTINUED);
    assert_eq!(ended(SessionEnd::Terminated, 0, END - LIMIT_SLACK_US - 1).1, NOT_CONTINUED);
}

#[test]
fn sigterm_at_or_after_the_end_is_the_time_limit_resubmitted() {
    // Slurm's check runs every ~30 s: its SIGTERM comes at the end or up to half a minute later.
    for at in [END, END + 25 * S] {
        let (mut life, out) = ended(SessionEnd::Terminated, 0, at);
        assert_eq!(out, [Effect::CountResubmits], "at {at}");
        let out = step(&mut life, at, Input::Resubmits(0));
        assert_eq!(out, [Effect::Summarize { resume_hint: false }, Effect::Resubmit { nth: 1 }]);
        let said = "Submitted batch job 12".to_string();
        let out = step(&mut life, at, Input::Resubmitted(said.clone()));
        assert_eq!(out, [print(Report::Resubmitted { nth: 1, max: 2, said }), Effect::Exit(Exit::Session)]);
        assert!(life.is_over());
    }
}

#[test]
fn a_cancel_in_the_last_2_s_cannot_be_told_from_the_limit() {
    // The end is known to the second: a scancel this close to it is taken for the limit.
    assert_eq!(ended(SessionEnd::Terminated, 0, END - LIMIT_SLACK_US).1, [Effect::CountResubmits]);
    assert_eq!(ended(SessionEnd::Terminated, 0, END - S).1, [Effect::CountResubmits]);
}

#[test]
fn what_ends_a_session_decides_its_resubmission() {
    // A preemption's grace used: the run continues in a job of its own, as at the time limit.
    for end in [SessionEnd::OutOfTime, SessionEnd::AgentsLost, SessionEnd::Preempted] {
        assert_eq!(ended(end, 0, 5 * S).1, [Effect::CountResubmits], "{end:?}");
    }
    for end in [SessionEnd::Complete, SessionEnd::Interrupted, SessionEnd::TooManyFailures, SessionEnd::AgentNotStarted]
    {
        assert_eq!(ended(end, 0, END + S).1, NOT_CONTINUED, "{end:?}");
    }
    // A job without a time limit has none to reach.
    assert!(!resubmit_due(SessionEnd::Terminated, 100 * S, None));
    // Without --htc-resubmit, nothing is counted.
    let mut life = Life::leading(job(None));
    let out = step(&mut life, END, Input::SessionEnded { end: SessionEnd::OutOfTime, joined_running: 0, at_us: END });
    assert_eq!(out, NOT_CONTINUED);
}

#[test]
fn a_run_resubmitted_enough_times_is_not_again() {
    let (mut life, _) = ended(SessionEnd::Terminated, 0, END);
    let out = step(&mut life, END, Input::Resubmits(2));
    assert_eq!(
        out,
        [
            Effect::Summarize { resume_hint: true },
            print(Report::NotResubmitting { done: 2, max: 2 }),
            Effect::Exit(Exit::Session)
        ]
    );
}

#[test]
fn a_failed_resubmission_says_how_to_continue() {
    let (mut life, _) = ended(SessionEnd::AgentsLost, 0, END);
    step(&mut life, END, Input::Resubmits(1));
    let out = step(&mut life, END, Input::ResubmitFailed("sbatch: down".into()));
    let r = Report::CouldNotResubmit { why: "sbatch: down".into(), resume: Some("htc resume 5".into()) };
    assert_eq!(r.to_string(), "htc: could not resubmit: sbatch: down; continue with: htc resume 5");
    assert_eq!(out, [print(r), Effect::Exit(Exit::Session)]);
    // Before sbatch: the summary gives the hint itself.
    let (mut life, _) = ended(SessionEnd::AgentsLost, 0, END);
    let out = step(&mut life, END, Input::ResubmitFailed("ledger".into()));
    assert_eq!(out[0], Effect::Summarize { resume_hint: true });
    assert_eq!(out[1], print(Report::CouldNotResubmit { why: "ledger".into(), resume: None }));
}

#[test]
fn a_joined_job_takes_over_from_a_session_that_ended_early_no_resubmission() {
    let out = ended(SessionEnd::Terminated, 2, END).1;
    assert_eq!(
        out,
        [
            Effect::Summarize { resume_hint: false },
            print(Report::HandedOver { joined: 2 }),
            Effect::Exit(Exit::Session)
        ]
    );
    // A finished run has nothing to hand over.
    assert_eq!(ended(SessionEnd::Complete, 2, END).1, NOT_CONTINUED);
}

#[test]
fn inputs_out_of_turn_change_nothing() {
    let mut life = staying();
    assert!(step(&mut life, 3 * S, Input::Woke).is_empty());
    assert!(step(&mut life, 3 * S, Input::LockTaken { unfinished: 1 }).is_empty());
    // Still staying: its agents' end is heard.
    assert_eq!(step(&mut life, 4 * S, Input::AgentsEnded).len(), 3);
}

#[test]
fn still_leads_needs_the_published_address_and_a_fresh_view() {
    let v = live("5", 10 * S);
    assert!(still_leads("5", Some("5"), v.as_ref(), 10 * S + LIVE_FRESH_US - 1));
    assert!(!still_leads("5", Some("5"), v.as_ref(), 10 * S + LIVE_FRESH_US));
    assert!(!still_leads("5", None, v.as_ref(), 10 * S));
    assert!(!still_leads("5", Some("5"), None, 10 * S));
    let ended = LiveSeen { state: "complete".into(), ..v.clone().unwrap() };
    assert!(!still_leads("5", Some("5"), Some(&ended), 10 * S));
}

#[test]
fn reports_say_what_the_slurm_tests_look_for() {
    let joins =
        Report::Joins { job: "7".into(), run: "/w/.htc/5".into(), run_job: "5".into(), nodes: 2, first: 4, last: 5 };
    assert_eq!(joins.to_string(), "htc: job 7 joins run /w/.htc/5 (job 5) with 2 node(s): agents 4..5");
    let stays = Report::Stays { job: "7".into(), run: "/w/.htc/5".into(), first: 4, last: 5 };
    assert_eq!(stays.to_string(), "htc: job 7 stays in run /w/.htc/5 with its agents 4..5, which kept their tasks");
    assert!(Report::TakesOver { job: "7".into(), left: 3 }.to_string().contains("takes the run over"));
    let r = Report::Resubmitted { nth: 1, max: 2, said: "Submitted batch job 12".into() };
    assert_eq!(r.to_string(), "htc: resubmitted (1 of 2): Submitted batch job 12");
}
