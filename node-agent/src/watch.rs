//! `htc watch RUN`: a terminal dashboard of a running run, drawn from its live view
//! (`live.rs`) alone. `Model` turns the views read so far into what is shown (rate over the last
//! seconds, ETA, whether the leader went silent) and is tested without a terminal; `run` is the
//! terminal loop.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph, Row, Table, TableState};
use ratatui::Frame;

use crate::live::{self, View};
use crate::status::fmt_duration;
use htc_core::task::State;

/// The rate is measured over this much of the latest history.
const RATE_WINDOW_US: u64 = 10_000_000;

/// What the dashboard shows, from the views read so far.
pub struct Model {
    pub run: String,
    pub view: Option<View>,
    /// (leader's clock, tasks finished) of recent views, oldest first.
    samples: VecDeque<(u64, u64)>,
    /// A leader silent this long is said to be.
    silent_after_us: u64,
    pub scroll: usize,
}

impl Model {
    pub fn new(run: String, silent_after: Duration) -> Model {
        Model { run, view: None, samples: VecDeque::new(), silent_after_us: silent_after.as_micros() as u64, scroll: 0 }
    }

    pub fn update(&mut self, v: View) {
        if self.samples.back().is_none_or(|&(t, _)| v.now_us > t) {
            self.samples.push_back((v.now_us, v.finished()));
        }
        while self.samples.len() > 2 && v.now_us.saturating_sub(self.samples[1].0) >= RATE_WINDOW_US {
            self.samples.pop_front();
        }
        self.view = Some(v);
    }

    /// Tasks finished per second: over the latest seconds seen, else over the whole session.
    pub fn rate(&self) -> f64 {
        let Some(v) = &self.view else { return 0.0 };
        if let (Some(a), Some(b)) = (self.samples.front(), self.samples.back()) {
            if b.0 > a.0 && self.samples.len() > 2 {
                return (b.1.saturating_sub(a.1)) as f64 * 1e6 / (b.0 - a.0) as f64;
            }
        }
        let secs = v.now_us.saturating_sub(v.session_start_us) as f64 / 1e6;
        if secs > 0.0 {
            v.finished().saturating_sub(v.finished_start) as f64 / secs
        } else {
            0.0
        }
    }

    pub fn eta(&self) -> Option<Duration> {
        let v = self.view.as_ref()?;
        let left = v.counts.total().saturating_sub(v.finished());
        let rate = self.rate();
        (v.state == "running" && rate > 0.0).then(|| Duration::from_secs_f64(left as f64 / rate))
    }

    /// The run's state in words, judged at `now_us` (a running leader that stopped writing is
    /// said to be silent: killed, or its node gone).
    pub fn state(&self, now_us: u64) -> String {
        match &self.view {
            None => "waiting for the leader to start (no live view yet)".into(),
            Some(v) if v.state == "complete" && v.counts.get(State::Failed) > 0 => {
                format!("complete, {} tasks failed (htc output --failed)", v.counts.get(State::Failed))
            }
            Some(v) if v.state != "running" => format!("{} (the run has ended)", v.state),
            Some(v) => {
                let age = now_us.saturating_sub(v.now_us);
                if age > self.silent_after_us {
                    format!("leader silent for {} (see htc status)", fmt_duration(Duration::from_micros(age)))
                } else {
                    "running".into()
                }
            }
        }
    }
}

fn ago(now_us: u64, then_us: u64) -> String {
    if then_us == 0 {
        return "-".into();
    }
    format!("{} ago", fmt_duration(Duration::from_micros(now_us.saturating_sub(then_us))))
}

/// Draws the whole dashboard.
pub fn draw(f: &mut Frame, m: &Model, now_us: u64, table: &mut TableState) {
    let failures = m.view.as_ref().map_or(0, |v| v.failures.len()) as u16;
    let nodes = m.view.as_ref().map_or(0, |v| v.nodes.len()).min(10_000) as u16;
    let joined = m.view.as_ref().is_some_and(|v| !v.allocations.is_empty()) as u16;
    // The nodes take what the failures leave, no more than they need; any rest is left empty.
    let [title, gauge, stats, nodes, fails, _, help] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(1),
        Constraint::Length(2 + joined),
        Constraint::Max(nodes.max(1) + 3),
        Constraint::Length(failures.clamp(1, live::RECENT_FAILURES as u16) + 2),
        Constraint::Fill(1),
        Constraint::Length(1),
    ])
    .areas(f.area());
    let state = m.state(now_us);
    let bold = Style::default().add_modifier(Modifier::BOLD);
    let job = m.view.as_ref().map(|v| v.job.clone()).unwrap_or_default();
    let head = format!(
        "htc watch  run {}{}  ",
        m.run,
        if job.is_empty() || job == m.run { String::new() } else { format!(" (job {job})") }
    );
    f.render_widget(Paragraph::new(Line::from(vec![Span::styled(head, bold), Span::raw(state)])), title);
    f.render_widget(
        Line::from(Span::styled("q quit   up/down/PgUp/PgDn scroll the nodes", Style::default().fg(Color::DarkGray))),
        help,
    );
    let Some(v) = &m.view else { return };
    let (total, finished) = (v.counts.total(), v.finished());
    let ratio = if total > 0 { finished as f64 / total as f64 } else { 1.0 };
    // The count beside the bar, not over it: a label drawn on the bar is cut by its edge.
    let label = format!(" {finished}/{total} ({:.1}%)", ratio * 100.0);
    let [bar, count] =
        Layout::horizontal([Constraint::Fill(1), Constraint::Length(label.chars().count() as u16)]).areas(gauge);
    let color = if v.counts.get(State::Failed) > 0 { Color::Yellow } else { Color::Green };
    f.render_widget(progress_bar(bar.width, ratio, color), bar);
    f.render_widget(Paragraph::new(label), count);
    let up = v.nodes.iter().filter(|n| shown_state(v, n) == "up").count();
    let nodes_line = if v.state == "running" {
        format!("nodes {up} up of {}", v.nodes.len())
    } else {
        format!("nodes {}, ended with the run", v.nodes.len())
    };
    f.render_widget(
        Paragraph::new(
            format!(
                "done {}  failed {}  running {}  queued at nodes {}  pending {}{}\n\
             {:.0} tasks/s  ETA {}  elapsed {}  {nodes_line}",
                v.counts.get(State::Done),
                v.counts.get(State::Failed),
                v.counts.get(State::Running),
                v.counts.get(State::Dispatched),
                v.counts.get(State::Pending),
                if v.blocked > 0 { format!(" ({} blocked)", v.blocked) } else { String::new() },
                m.rate(),
                m.eta().map(fmt_duration).unwrap_or_else(|| "-".into()),
                fmt_duration(Duration::from_micros(v.now_us.saturating_sub(v.session_start_us))),
            ) + &if v.allocations.is_empty() {
                String::new()
            } else {
                format!("\njoined: {}", crate::status::allocations_line(&v.allocations, v.now_us))
            },
        ),
        stats,
    );
    draw_nodes(f, v, now_us, nodes, table);
    draw_failures(f, v, now_us, fails);
}

/// The progress bar, drawn cell by cell: ratatui's `Gauge` draws the cell where its (empty)
/// label would stand as a blank, which splits a full bar in two halves on some widths.
fn progress_bar(width: u16, ratio: f64, color: Color) -> Paragraph<'static> {
    let filled = ((width as f64 * ratio.clamp(0.0, 1.0)).round() as usize).min(width as usize);
    Paragraph::new(Line::from(vec![
        Span::styled("█".repeat(filled), Style::default().fg(color)),
        Span::styled("░".repeat(width as usize - filled), Style::default().fg(Color::DarkGray)),
    ]))
}

/// A node's state as the dashboard shows it: once the run has ended, its agents have too, and
/// the last view's "up" is history.
fn shown_state<'a>(v: &View, n: &'a live::Node) -> &'a str {
    if v.state != "running" && n.state == "up" {
        "ended"
    } else {
        &n.state
    }
}

fn draw_nodes(f: &mut Frame, v: &View, now_us: u64, area: ratatui::layout::Rect, table: &mut TableState) {
    let rows = v.nodes.iter().map(|n| {
        let state = shown_state(v, n).to_string();
        let style = match state.as_str() {
            "up" => Style::default(),
            "ended" => Style::default().fg(Color::DarkGray),
            "drained" => Style::default().fg(Color::Yellow),
            _ => Style::default().fg(Color::Red),
        };
        Row::new(vec![
            n.agent.to_string(),
            n.host.clone(),
            format!("{}/{}", n.busy, n.cores),
            n.done.to_string(),
            n.failed.to_string(),
            ago(now_us, n.heard_us),
            state,
        ])
        .style(style)
    });
    let host_width = v.nodes.iter().map(|n| n.host.chars().count()).max().unwrap_or(0).clamp(4, 40) as u16;
    let widths = [
        Constraint::Length(6),
        Constraint::Length(host_width + 1),
        Constraint::Length(10),
        Constraint::Length(10),
        Constraint::Length(16),
        Constraint::Length(12),
        Constraint::Fill(1),
    ];
    // Per node, attempts: a task retried elsewhere failed here and may be done there.
    let header = Row::new(vec!["agent", "host", "busy", "done", "failed attempts", "heard", "state"])
        .style(Style::default().add_modifier(Modifier::BOLD));
    let t = Table::new(rows, widths)
        .header(header)
        .block(Block::bordered().title(format!(" nodes ({}) ", v.nodes.len())))
        .row_highlight_style(Style::default().add_modifier(Modifier::REVERSED));
    f.render_stateful_widget(t, area, table);
}

fn draw_failures(f: &mut Frame, v: &View, now_us: u64, area: ratatui::layout::Rect) {
    let lines: Vec<Line> = if v.failures.is_empty() {
        vec![Line::from("none")]
    } else {
        v.failures
            .iter()
            .rev()
            .map(|x| {
                Line::from(format!(
                    "{:>9}  task {} (line {}) on {}: {}{}",
                    ago(now_us, x.at_us),
                    x.task,
                    x.line,
                    x.host,
                    x.reason,
                    if x.retrying { ", retrying" } else { "" }
                ))
            })
            .collect()
    };
    let title = format!(" recent failures (tasks failed: {}) ", v.counts.get(State::Failed));
    f.render_widget(Paragraph::new(lines).block(Block::bordered().title(title)), area);
}

/// Runs the dashboard until `q`, Esc or Ctrl-C.
pub fn run(run_dir: &Path, every: Duration, silent_after: Duration) -> anyhow::Result<()> {
    let name = run_dir.file_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let mut m = Model::new(name, silent_after);
    let mut table = TableState::default();
    use std::io::IsTerminal;
    if !std::io::stdout().is_terminal() || !std::io::stdin().is_terminal() {
        anyhow::bail!(
            "htc watch draws a dashboard and needs a terminal; without one, `htc status {}` (or --json) says the same",
            run_dir.display()
        );
    }
    let mut term = ratatui::try_init()?;
    let r = event_loop(&mut term, run_dir.to_path_buf(), every, &mut m, &mut table);
    ratatui::restore();
    r
}

fn event_loop(
    term: &mut ratatui::DefaultTerminal,
    dir: PathBuf,
    every: Duration,
    m: &mut Model,
    table: &mut TableState,
) -> anyhow::Result<()> {
    let mut next_read = Instant::now();
    loop {
        if Instant::now() >= next_read {
            if let Some(v) = crate::livefile::read(&dir)? {
                m.update(v);
            }
            next_read = Instant::now() + every;
        }
        term.draw(|f| draw(f, m, crate::rundir::now_us(), table))?;
        if !event::poll(next_read.saturating_duration_since(Instant::now()))? {
            continue;
        }
        let Event::Key(k) = event::read()? else { continue };
        if k.kind != KeyEventKind::Press {
            continue;
        }
        let rows = m.view.as_ref().map_or(0, |v| v.nodes.len());
        match k.code {
            KeyCode::Char('q') | KeyCode::Esc => return Ok(()),
            KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => return Ok(()),
            KeyCode::Down | KeyCode::Char('j') => table.scroll_down_by(1),
            KeyCode::Up | KeyCode::Char('k') => table.scroll_up_by(1),
            KeyCode::PageDown => table.scroll_down_by(10),
            KeyCode::PageUp => table.scroll_up_by(10),
            KeyCode::Home => table.select_first(),
            KeyCode::End => table.select(Some(rows.saturating_sub(1))),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use htc_core::task::Counts;

    fn view(now_s: u64, done: u64, state: &str) -> View {
        View {
            job: "j".into(),
            now_us: now_s * 1_000_000,
            session_start_us: 0,
            state: state.into(),
            counts: Counts([1000 - done, 0, 0, done, 0, 0]),
            ..Default::default()
        }
    }

    #[test]
    fn rate_is_over_the_latest_seconds_and_eta_follows_it() {
        let mut m = Model::new("r".into(), Duration::from_secs(5));
        m.update(view(1, 10, "running"));
        // One view: the session's rate.
        assert_eq!(m.rate(), 10.0);
        // 10 tasks/s for 10 s, then 2 tasks/s for 10 s: only the last 10 s count.
        for s in 2..=20 {
            m.update(view(s, if s <= 10 { s * 10 } else { 100 + 2 * (s - 10) }, "running"));
        }
        assert_eq!(m.rate(), 2.0);
        assert_eq!(m.eta(), Some(Duration::from_secs(440)));
        m.update(view(21, 1000, "complete"));
        assert_eq!(m.eta(), None);
        assert_eq!(m.state(21_000_000), "complete (the run has ended)");
        let mut failed = view(22, 990, "complete");
        failed.counts = Counts([0, 0, 0, 990, 10, 0]);
        m.update(failed);
        assert_eq!(m.state(22_000_000), "complete, 10 tasks failed (htc output --failed)");
    }

    #[test]
    fn a_full_bar_is_one_unbroken_run_of_cells_at_any_width() {
        for width in [1u16, 7, 80, 139, 140, 141, 300] {
            let area = ratatui::layout::Rect::new(0, 0, width, 1);
            let mut buf = ratatui::buffer::Buffer::empty(area);
            ratatui::widgets::Widget::render(progress_bar(width, 1.0, Color::Green), area, &mut buf);
            let cells: String = (0..width).map(|x| buf[(x, 0)].symbol().to_string()).collect();
            assert_eq!(cells, "█".repeat(width as usize), "width {width}");
            let mut half = ratatui::buffer::Buffer::empty(area);
            ratatui::widgets::Widget::render(progress_bar(width, 0.5, Color::Green), area, &mut half);
            let filled = (0..width).filter(|&x| half[(x, 0)].symbol() == "█").count();
            assert_eq!(filled, (width as f64 / 2.0).round() as usize, "width {width}");
        }
    }

    #[test]
    fn a_leader_that_stops_writing_is_said_to_be_silent() {
        let mut m = Model::new("r".into(), Duration::from_secs(5));
        assert!(m.state(0).starts_with("waiting"));
        m.update(view(10, 5, "running"));
        assert_eq!(m.state(12_000_000), "running");
        assert_eq!(m.state(30_000_000), "leader silent for 20.0s (see htc status)");
    }
}
