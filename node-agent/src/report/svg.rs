//! The report's charts as standalone SVG (each file opens on its own, and the same text is
//! inlined in the HTML): an area chart over time, a heatmap of nodes over time, and runtime
//! histograms on a log scale. Plain strings, no dependencies.

use std::fmt::Write as _;

pub const WIDTH: f64 = 960.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 24.0;
const TOP: f64 = 34.0;
const BOTTOM: f64 = 44.0;

pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// About `n` round tick values from 0 to `max` (1, 2 or 5 times a power of ten apart).
pub fn ticks(max: f64, n: usize) -> Vec<f64> {
    if max.is_nan() || max <= 0.0 {
        return vec![0.0];
    }
    let raw = max / n.max(1) as f64;
    let p = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * p).find(|s| *s >= raw).unwrap_or(10.0 * p);
    (0..).map(|i| i as f64 * step).take_while(|v| *v <= max * 1.000001).collect()
}

/// A number for an axis: 1500 -> "1.5k", 0.25 -> "0.25".
pub fn short(v: f64) -> String {
    let a = v.abs();
    let (x, unit) = if a >= 1e9 {
        (v / 1e9, "G")
    } else if a >= 1e6 {
        (v / 1e6, "M")
    } else if a >= 1e4 {
        (v / 1e3, "k")
    } else {
        (v, "")
    };
    let s = if x.fract() == 0.0 { format!("{x:.0}") } else { format!("{x:.2}") };
    let s = if s.contains('.') { s.trim_end_matches('0').trim_end_matches('.').to_string() } else { s };
    format!("{s}{unit}")
}

fn open(height: f64, title: &str) -> String {
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {WIDTH} {height}\" width=\"{WIDTH}\" \
         height=\"{height}\" font-family=\"sans-serif\" font-size=\"12\" role=\"img\">\
         <title>{t}</title><rect width=\"100%\" height=\"100%\" fill=\"white\"/>\
         <text x=\"{LEFT}\" y=\"20\" font-size=\"15\" font-weight=\"bold\">{t}</text>",
        t = esc(title)
    )
}

/// Axes with ticks: x in seconds from 0 to `x_max`, y from 0 to `y_max`.
fn axes(s: &mut String, h: f64, x_max: f64, y_max: f64, x_label: &str, y_label: &str) {
    let (x0, y0, x1, y1) = (LEFT, h - BOTTOM, WIDTH - RIGHT, TOP);
    let _ = write!(s, "<g stroke=\"#888\"><line x1=\"{x0}\" y1=\"{y0}\" x2=\"{x1}\" y2=\"{y0}\"/><line x1=\"{x0}\" y1=\"{y0}\" x2=\"{x0}\" y2=\"{y1}\"/></g>");
    for t in ticks(x_max, 8) {
        let x = x0 + (x1 - x0) * t / x_max.max(1e-9);
        let _ = write!(s, "<line x1=\"{x:.1}\" y1=\"{y0}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"#888\"/><text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>", y0 + 4.0, y0 + 16.0, short(t));
    }
    for t in ticks(y_max, 5) {
        let y = y0 - (y0 - y1) * t / y_max.max(1e-9);
        let _ = write!(s, "<line x1=\"{x0}\" y1=\"{y:.1}\" x2=\"{x1}\" y2=\"{y:.1}\" stroke=\"#eee\"/><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>", x0 - 6.0, y + 4.0, short(t));
    }
    let _ = write!(
        s,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
        (x0 + x1) / 2.0,
        h - 8.0,
        esc(x_label)
    );
    let _ = write!(
        s,
        "<text transform=\"translate(14 {:.1}) rotate(-90)\" text-anchor=\"middle\">{}</text>",
        (y0 + y1) / 2.0,
        esc(y_label)
    );
}

/// A filled step chart of `ys` (one value per bin of `bin_s` seconds), with an optional
/// reference line (e.g. the job's cores).
pub fn area(title: &str, y_label: &str, bin_s: f64, ys: &[f64], reference: Option<(f64, &str)>) -> String {
    let h = 300.0;
    let x_max = bin_s * ys.len() as f64;
    let peak = ys.iter().cloned().fold(0.0, f64::max);
    let y_max = reference.map_or(peak, |(r, _)| r.max(peak)).max(1e-9) * 1.05;
    let mut s = open(h, title);
    axes(&mut s, h, x_max, y_max, "seconds since the first task started", y_label);
    let (x0, y0, x1, y1) = (LEFT, h - BOTTOM, WIDTH - RIGHT, TOP);
    let sx = |t: f64| x0 + (x1 - x0) * t / x_max.max(1e-9);
    let sy = |v: f64| y0 - (y0 - y1) * v / y_max;
    let mut d = format!("M{x0:.1},{y0:.1}");
    for (i, v) in ys.iter().enumerate() {
        let _ =
            write!(d, " L{:.1},{:.1} L{:.1},{:.1}", sx(i as f64 * bin_s), sy(*v), sx((i + 1) as f64 * bin_s), sy(*v));
    }
    let _ = write!(d, " L{:.1},{y0:.1} Z", sx(x_max));
    let _ = write!(s, "<path class=\"series\" d=\"{d}\" fill=\"#4a90d9\" fill-opacity=\"0.55\" stroke=\"#2c6fb7\" stroke-width=\"1\"/>");
    if let Some((r, label)) = reference {
        let y = sy(r);
        let _ = write!(s, "<line x1=\"{x0}\" y1=\"{y:.1}\" x2=\"{x1}\" y2=\"{y:.1}\" stroke=\"#d0021b\" stroke-dasharray=\"6 4\"/><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"#d0021b\">{}</text>", x1, y - 4.0, esc(label));
    }
    s.push_str("</svg>");
    s
}

/// Rows over time, each cell coloured by its value in 0..=1 (a node's busy fraction).
pub fn heatmap(title: &str, bin_s: f64, rows: &[(String, Vec<f64>)]) -> String {
    let row_h = (360.0 / rows.len().max(1) as f64).clamp(4.0, 18.0);
    let h = TOP + row_h * rows.len() as f64 + BOTTOM + 24.0;
    let cols = rows.first().map_or(0, |r| r.1.len());
    let x_max = bin_s * cols as f64;
    let (x0, x1) = (LEFT + 60.0, WIDTH - RIGHT);
    let cw = (x1 - x0) / cols.max(1) as f64;
    let mut s = open(h, title);
    for (r, (label, vals)) in rows.iter().enumerate() {
        let y = TOP + r as f64 * row_h;
        if row_h >= 9.0 || r % (9.0 / row_h).ceil() as usize == 0 {
            let _ = write!(
                s,
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" font-size=\"{:.0}\">{}</text>",
                x0 - 4.0,
                y + row_h * 0.8,
                row_h.clamp(7.0, 12.0),
                esc(label)
            );
        }
        // Runs of one colour are one rectangle: a thousand bins of an idle node cost one.
        let level = |v: f64| (v.clamp(0.0, 1.0) * 10.0).round() as usize;
        let mut c = 0;
        while c < vals.len() {
            let l = level(vals[c]);
            let mut e = c + 1;
            while e < vals.len() && level(vals[e]) == l {
                e += 1;
            }
            let _ = write!(
                s,
                "<rect x=\"{:.1}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{}\"/>",
                x0 + c as f64 * cw,
                (e - c) as f64 * cw + 0.3,
                row_h - 0.5,
                heat(l)
            );
            c = e;
        }
    }
    let y0 = TOP + row_h * rows.len() as f64;
    for t in ticks(x_max, 8) {
        let x = x0 + (x1 - x0) * t / x_max.max(1e-9);
        let _ = write!(s, "<text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>", y0 + 14.0, short(t));
    }
    let _ = write!(s, "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">seconds since the first task started (colour: share of the node's cores busy, white 0 to dark 1)</text>", (x0 + x1) / 2.0, y0 + 32.0);
    s.push_str("</svg>");
    s
}

fn heat(level: usize) -> &'static str {
    const RAMP: [&str; 11] = [
        "#ffffff", "#eef4fb", "#dbe8f6", "#c3d9f0", "#a6c6e8", "#86b0de", "#6699d2", "#4a82c3", "#336bb0", "#21559a",
        "#143f80",
    ];
    RAMP[level.min(10)]
}

/// One histogram per row on a shared log2 axis of runtimes: (label, counts per bucket, where
/// bucket k holds [2^(k-1), 2^k) ms).
pub fn runtime_histograms(title: &str, rows: &[(String, Vec<u64>)]) -> String {
    let row_h = 70.0;
    let h = TOP + row_h * rows.len().max(1) as f64 + BOTTOM;
    let buckets = rows.iter().map(|r| r.1.iter().rposition(|&n| n > 0).map_or(0, |i| i + 1)).max().unwrap_or(0).max(11);
    let (x0, x1) = (LEFT + 90.0, WIDTH - RIGHT);
    let bw = (x1 - x0) / buckets as f64;
    let mut s = open(h, title);
    for (r, (label, counts)) in rows.iter().enumerate() {
        let base = TOP + (r + 1) as f64 * row_h - 8.0;
        let peak = counts.iter().copied().max().unwrap_or(0).max(1) as f64;
        let _ =
            write!(s, "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>", x0 - 6.0, base - 20.0, esc(label));
        let _ = write!(s, "<line x1=\"{x0}\" y1=\"{base:.1}\" x2=\"{x1}\" y2=\"{base:.1}\" stroke=\"#888\"/>");
        for (k, &n) in counts.iter().enumerate().take(buckets) {
            if n == 0 {
                continue;
            }
            let bh = (row_h - 16.0) * n as f64 / peak;
            let _ = write!(s, "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{bh:.1}\" fill=\"#7b68c8\"><title>{n} tasks of {}</title></rect>", x0 + k as f64 * bw + 1.0, base - bh, bw - 2.0, esc(&bucket_name(k)));
        }
    }
    let y = h - BOTTOM + 4.0;
    for k in (0..buckets).step_by(2) {
        let _ = write!(
            s,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            x0 + (k as f64 + 1.0) * bw,
            y + 10.0,
            ms_label(1u64 << k)
        );
    }
    let _ = write!(
        s,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">runtime (log scale; bars: tasks per bucket)</text>",
        (x0 + x1) / 2.0,
        h - 8.0
    );
    s.push_str("</svg>");
    s
}

fn bucket_name(k: usize) -> String {
    if k == 0 {
        "under 1 ms".into()
    } else {
        format!("{} to {}", ms_label(1 << (k - 1)), ms_label(1 << k))
    }
}

pub fn ms_label(ms: u64) -> String {
    match ms {
        0..1000 => format!("{ms}ms"),
        1000..60_000 => short(ms as f64 / 1000.0) + "s",
        60_000..3_600_000 => short(ms as f64 / 60_000.0) + "min",
        _ => short(ms as f64 / 3_600_000.0) + "h",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round_and_cover_the_range() {
        assert_eq!(ticks(100.0, 5), [0.0, 20.0, 40.0, 60.0, 80.0, 100.0]);
        assert_eq!(ticks(7.0, 8), [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]);
        assert_eq!(ticks(0.0, 5), [0.0]);
        assert_eq!(
            (short(1500.0), short(25000.0), short(0.25), short(3e6)),
            ("1500".into(), "25k".into(), "0.25".into(), "3M".into())
        );
        assert_eq!((ms_label(512), ms_label(2048), ms_label(120_000)), ("512ms".into(), "2.05s".into(), "2min".into()));
    }

    #[test]
    fn charts_are_well_formed_svg_with_their_titles() {
        let a = area("Cores <busy>", "cores", 0.5, &[1.0, 2.0, 0.0], Some((4.0, "4 cores")));
        assert!(
            a.starts_with("<svg") && a.ends_with("</svg>") && a.contains("Cores &lt;busy&gt;") && a.contains("4 cores")
        );
        let h = heatmap("Nodes", 1.0, &[("n1".into(), vec![0.0, 0.0, 1.0]), ("n2".into(), vec![0.5; 3])]);
        assert_eq!(h.matches("<rect x=").count(), 3, "runs of one colour are one rectangle: {h}");
        let r = runtime_histograms("Runtimes", &[("short".into(), vec![0, 5, 1])]);
        assert!(r.contains("5 tasks of 1ms to 2ms"), "{r}");
    }
}
