//! `htc report` of a finished run of 100,000 real tasks (a mix of runtimes and failures), opened
//! in a real browser: headless Chromium loads the page and each SVG, renders a screenshot, and the
//! page's figures are the run's.

use crate::common;

use std::path::Path;
use std::process::Command;

use common::{text, Dir};

const TASKS: u64 = 100_000;

/// Headless Chromium on `url`, with `args`; its stdout, and its stderr for the console.
fn chromium(d: &Dir, args: &[&str], url: &str) -> (String, String) {
    let profile = d.path("chromium-profile");
    let o = Command::new("chromium")
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--enable-logging=stderr", "--v=0"])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(url)
        .output()
        .expect("Chromium is needed for this test (Debian: apt-get install chromium)");
    assert!(o.status.success(), "chromium {args:?} {url}: {}", text(&o));
    (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

fn no_console_errors(stderr: &str) {
    let bad: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("CONSOLE") || l.contains("Uncaught") || l.contains("Failed to load"))
        .collect();
    assert!(bad.is_empty(), "the page reported errors: {bad:#?}");
}

/// A PNG's width and height, from its IHDR chunk.
fn png_size(p: &Path) -> (u32, u32) {
    let b = std::fs::read(p).unwrap();
    assert_eq!(&b[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
    let at = |i: usize| u32::from_be_bytes(b[i..i + 4].try_into().unwrap());
    (at(16), at(20))
}

#[test]
fn the_report_of_a_100k_task_run_opens_in_chromium_with_the_run_s_figures() {
    let d = Dir::new("report");
    let mut tasks = String::from("#HTC retries=0\n");
    let (mut failed, mut slow, mut mid) = (0, 0, 0);
    for i in 1..=TASKS {
        let line = if i % 50 == 0 {
            failed += 1;
            "exit 2".to_string()
        } else if i % 777 == 0 {
            failed += 1;
            "kill -9 $$".into()
        } else if i % 500 == 1 {
            slow += 1;
            "[class=slow] sleep 0.02".into()
        } else if i % 40 == 3 {
            mid += 1;
            "[class=mid] sleep 0.002".into()
        } else {
            "true".into()
        };
        tasks.push_str(&line);
        tasks.push('\n');
    }
    d.write("tasks.txt", tasks);
    let o = d.htc(&["run", "tasks.txt", "-q"]);
    assert_eq!(o.status.code(), Some(1), "{failed} tasks fail: {}", text(&o));
    let run = d.run_id();
    let o = d.htc(&["report", &run, "-o", "rep"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains(&format!("report of {TASKS} tasks")), "{}", text(&o));
    let html = d.path("rep/report.html");

    let url = format!("file://{}", html.display());
    let (dom, log) = chromium(&d, &["--dump-dom"], &url);
    no_console_errors(&log);
    let fig = |id: &str| -> String {
        let at = dom.find(&format!("id=\"{id}\">")).unwrap_or_else(|| panic!("no figure {id}"));
        let rest = &dom[at + id.len() + 6..];
        rest[..rest.find('<').unwrap()].to_string()
    };
    assert_eq!(fig("tasks"), TASKS.to_string());
    assert_eq!(fig("failed"), failed.to_string());
    assert_eq!(fig("done"), (TASKS - failed).to_string());
    assert_eq!(fig("attempts"), TASKS.to_string(), "no retries");
    assert_eq!(fig("cores"), executor_cpus().to_string());
    let util: f64 = fig("utilization").trim_end_matches(" %").parse().unwrap();
    assert!((1.0..=100.0).contains(&util), "{util}");
    let span: f64 = fig("makespan").trim_end_matches(" s").parse().unwrap();
    let rate: f64 = fig("rate").parse().unwrap();
    assert!(span > 1.0 && (rate * span - TASKS as f64).abs() < TASKS as f64 * 0.01, "{rate} tasks/s over {span} s");
    for chart in ["utilization", "throughput", "nodes", "runtimes"] {
        assert!(dom.contains(&format!("<figure id=\"{chart}\"><svg")), "chart {chart} missing");
    }
    // Failures by reason with their tasks; classes with their counts.
    assert!(dom.contains(&format!("<td>exit 2</td><td>{}</td><td>50, 100, 150,", TASKS / 50)), "exit 2 row");
    assert!(dom.contains("<td>killed by signal 9 (KILL)</td><td>"), "signal row");
    assert!(
        dom.contains(&format!("<td>slow</td><td>{slow}</td>")) && dom.contains(&format!("<td>mid</td><td>{mid}</td>"))
    );
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert!(dom.contains(&format!("<tr><td>{}</td><td>0</td>", host.trim())), "node row");

    // Each SVG file is valid on its own (an XML error would show as a parsererror).
    for svg in ["utilization", "throughput", "nodes", "runtimes"] {
        let p = d.path(&format!("rep/{svg}.svg"));
        let (dom, log) = chromium(&d, &["--dump-dom"], &format!("file://{}", p.display()));
        no_console_errors(&log);
        assert!(dom.contains("<svg") && !dom.contains("parsererror"), "{svg}.svg: {dom}");
    }
    let shot = d.path("report.png");
    let (_, log) = chromium(&d, &["--window-size=1100,2400", &format!("--screenshot={}", shot.display())], &url);
    no_console_errors(&log);
    assert_eq!(png_size(&shot), (1100, 2400));
    assert!(std::fs::metadata(&shot).unwrap().len() > 40_000, "a page of charts, not a blank one");
}

/// The CPUs `htc run` gives its one agent by default.
fn executor_cpus() -> usize {
    htc::executor::allowed_cpus().len()
}
