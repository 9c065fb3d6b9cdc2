//! `htc report RUN`: one self-contained HTML page of a run (its figures, charts, failures and
//! nodes), plus each chart as an SVG file for papers and slides. `gather` reads the ledger once;
//! `svg` draws; this module lays out the page.

pub mod gather;
pub mod svg;
pub mod timeline;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context;

use self::gather::Gathered;
use self::svg::esc;
use crate::ledger::Ledger;
use crate::rundir::RunDir;

/// Rows of the node heatmap: more nodes than this are shown in groups of neighbours.
const HEAT_ROWS: usize = 64;
/// Classes drawn (the largest); the table lists them all.
const CLASSES_DRAWN: usize = 12;

/// The files written.
pub struct Written {
    pub html: PathBuf,
    pub svgs: Vec<PathBuf>,
    pub tasks: u64,
}

/// The charts, by file name.
pub fn charts(g: &Gathered) -> Vec<(&'static str, String)> {
    let used = timeline::used(&[&g.busy, &g.finished]);
    let bin_s = g.axis.width as f64 / 1e6;
    let per_bin = |v: &[f64], scale: f64| -> Vec<f64> { v[used.clone()].iter().map(|x| x / scale).collect() };
    let cores = g.cores();
    let busy = per_bin(&g.busy, g.axis.width as f64);
    let label = cores.map(|c| format!("{c} cores"));
    let mut out = vec![(
        "utilization.svg",
        svg::area(
            "Cores busy over time (the whole job)",
            "cores busy",
            bin_s,
            &busy,
            cores.map(|c| c as f64).zip(label.as_deref()),
        ),
    )];
    out.push((
        "throughput.svg",
        svg::area("Tasks finished per second", "tasks/s", bin_s, &per_bin(&g.finished, bin_s), None),
    ));
    let nodes: Vec<&gather::Node> = g.nodes.values().collect();
    let group = nodes.len().div_ceil(HEAT_ROWS).max(1);
    let rows: Vec<(String, Vec<f64>)> = nodes
        .chunks(group)
        .map(|ns| {
            let label =
                if ns.len() == 1 { ns[0].host.clone() } else { format!("{}..{}", ns[0].host, ns[ns.len() - 1].host) };
            // A node's share of its cores busy; unknown cores: of its own peak.
            let cap: f64 = ns.iter().map(|n| n.cores.map_or_else(|| peak(&n.busy, g.axis.width), |c| c as f64)).sum();
            let vals = used
                .clone()
                .map(|b| ns.iter().map(|n| n.busy[b]).sum::<f64>() / g.axis.width as f64 / cap.max(1e-9))
                .collect();
            (label, vals)
        })
        .collect();
    let title =
        if group > 1 { format!("Cores busy per node ({group} nodes a row)") } else { "Cores busy per node".into() };
    out.push(("nodes.svg", svg::heatmap(&title, bin_s, &rows)));
    let mut classes: Vec<&gather::Class> = g.classes.iter().collect();
    classes.sort_by_key(|c| std::cmp::Reverse(c.tasks));
    let hist: Vec<(String, Vec<u64>)> =
        classes.iter().take(CLASSES_DRAWN).map(|c| (c.name.clone(), c.buckets.to_vec())).collect();
    out.push(("runtimes.svg", svg::runtime_histograms("Runtime of succeeded tasks, per class", &hist)));
    out
}

fn peak(busy: &[f64], width: u64) -> f64 {
    busy.iter().cloned().fold(0.0, f64::max) / width as f64
}

fn figure(s: &mut String, id: &str, label: &str, value: &str) {
    let _ = write!(
        s,
        "<div class=\"fig\"><div class=\"v\" id=\"{id}\">{}</div><div class=\"l\">{}</div></div>",
        esc(value),
        esc(label)
    );
}

/// The whole page.
pub fn html(g: &Gathered, charts: &[(&'static str, String)]) -> String {
    let mut s = String::with_capacity(1 << 20);
    let _ = write!(
        s,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>htc report: {run}</title><style>\
         body{{font-family:sans-serif;margin:24px;color:#222;max-width:1000px}}h1{{font-size:22px}}h2{{font-size:17px;margin-top:32px}}\
         .figs{{display:flex;flex-wrap:wrap;gap:12px}}.fig{{border:1px solid #ddd;border-radius:6px;padding:10px 14px;min-width:130px}}\
         .v{{font-size:20px;font-weight:bold}}.l{{color:#666;font-size:12px}}table{{border-collapse:collapse;font-size:13px}}\
         td,th{{border-bottom:1px solid #eee;padding:3px 10px;text-align:right}}td:first-child,th:first-child{{text-align:left}}\
         svg{{max-width:100%;height:auto;display:block;margin:8px 0}}#failures td:last-child{{text-align:left}}</style></head><body>\
         <h1>htc report: run {run}</h1><p>Task file <code>{file}</code>; {tasks} tasks, read from the run's ledger.</p>",
        run = esc(&g.run),
        file = esc(&g.task_file),
        tasks = g.tasks
    );
    s.push_str("<div class=\"figs\" id=\"figures\">");
    let span = g.makespan_s();
    figure(&mut s, "makespan", "makespan (first start to last end)", &format!("{span:.2} s"));
    let util = g.utilization().map_or("-".into(), |u| format!("{:.1} %", u * 100.0));
    figure(&mut s, "utilization", "mean utilization of the job's cores", &util);
    let rate = if span > 0.0 { (g.done + g.failed) as f64 / span } else { 0.0 };
    figure(&mut s, "rate", "tasks finished per second", &format!("{rate:.0}"));
    figure(&mut s, "tasks", "tasks", &g.tasks.to_string());
    figure(&mut s, "done", "done", &g.done.to_string());
    figure(&mut s, "failed", "failed", &g.failed.to_string());
    if g.cancelled > 0 {
        figure(&mut s, "cancelled", "cancelled", &g.cancelled.to_string());
    }
    if g.unfinished > 0 {
        figure(&mut s, "unfinished", "not finished", &g.unfinished.to_string());
    }
    if g.blocked > 0 {
        figure(&mut s, "blocked", "waiting for other tasks", &g.blocked.to_string());
    }
    figure(&mut s, "attempts", "attempts", &g.attempts.to_string());
    if g.outputs_cut > 0 {
        figure(&mut s, "outputs_cut", "tasks whose output was cut (max_output)", &g.outputs_cut.to_string());
    }
    figure(&mut s, "cores", "cores", &g.cores().map_or("-".into(), |c| c.to_string()));
    figure(&mut s, "busy", "core-seconds of tasks", &format!("{:.1}", g.busy_core_s()));
    if let Some(cpu) = g.leader_cpu_us {
        figure(&mut s, "leader_cpu", "leader CPU (its last session)", &format!("{:.2} s", cpu as f64 / 1e6));
    }
    s.push_str("</div>");
    for (name, svg) in charts {
        let _ =
            write!(s, "<figure id=\"{}\">{svg}<figcaption>{name}</figcaption></figure>", name.trim_end_matches(".svg"));
    }
    classes_table(&mut s, g);
    failures_table(&mut s, g);
    nodes_table(&mut s, g);
    s.push_str("</body></html>\n");
    s
}

fn classes_table(s: &mut String, g: &Gathered) {
    s.push_str("<h2>Runtimes per class (succeeded tasks)</h2><table id=\"classes\"><tr><th>class</th><th>tasks</th><th>mean</th><th>median</th><th>95th pct</th><th>min</th><th>max</th></tr>");
    for c in &g.classes {
        let mean = (c.sum_ms / c.tasks.max(1) as f64) as u64;
        let _ = write!(
            s,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>&le; {}</td><td>&le; {}</td><td>{}</td><td>{}</td></tr>",
            esc(&c.name),
            c.tasks,
            svg::ms_label(mean),
            svg::ms_label(c.quantile_ms(0.5)),
            svg::ms_label(c.quantile_ms(0.95)),
            svg::ms_label(c.min_ms),
            svg::ms_label(c.max_ms)
        );
    }
    s.push_str("</table>");
}

fn failures_table(s: &mut String, g: &Gathered) {
    let _ = write!(s, "<h2>Failures by reason ({} tasks failed)</h2><table id=\"failures\"><tr><th>reason</th><th>tasks</th><th>task ids</th></tr>", g.failed);
    let mut reasons: Vec<(&String, &gather::Reason)> = g.reasons.iter().collect();
    reasons.sort_by_key(|(_, r)| std::cmp::Reverse(r.tasks));
    for (why, r) in reasons {
        let ids: Vec<String> = r.ids.iter().map(u64::to_string).collect();
        let more = if r.tasks > r.ids.len() as u64 { ", …" } else { "" };
        let _ = write!(s, "<tr><td>{}</td><td>{}</td><td>{}{more}</td></tr>", esc(why), r.tasks, ids.join(", "));
    }
    s.push_str("</table>");
}

fn nodes_table(s: &mut String, g: &Gathered) {
    let span = g.makespan_s();
    s.push_str("<h2>Nodes</h2><table id=\"nodes\"><tr><th>host</th><th>agent</th><th>cores</th><th>attempts ok</th><th>attempts failed</th><th>core-seconds</th><th>utilization</th></tr>");
    for n in g.nodes.values() {
        let util = n
            .cores
            .filter(|&c| c > 0 && span > 0.0)
            .map_or("-".into(), |c| format!("{:.1} %", n.busy_core_us / 1e6 / (c as f64 * span) * 100.0));
        let _ = write!(
            s,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.1}</td><td>{util}</td></tr>",
            esc(&n.host),
            n.agent,
            n.cores.map_or("-".into(), |c| c.to_string()),
            n.done,
            n.failed,
            n.busy_core_us / 1e6
        );
    }
    s.push_str("</table>");
}

/// Writes `report.html` and the charts' SVG files into `dir`.
pub fn write(run: &RunDir, dir: &Path) -> anyhow::Result<Written> {
    let ledger = Ledger::open(&run.ledger(), true)?;
    let mut g = gather::gather(&ledger, &run.id())?;
    g.outputs_cut =
        crate::output_view::all_cuts(run)?.iter().map(|c| c.id).collect::<std::collections::BTreeSet<_>>().len() as u64;
    drop(ledger);
    let charts = charts(&g);
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut svgs = Vec::new();
    for (name, svg) in &charts {
        let p = dir.join(name);
        std::fs::write(&p, svg).with_context(|| format!("writing {}", p.display()))?;
        svgs.push(p);
    }
    let html = dir.join("report.html");
    std::fs::write(&html, self::html(&g, &charts)).with_context(|| format!("writing {}", html.display()))?;
    Ok(Written { html, svgs, tasks: g.tasks })
}
