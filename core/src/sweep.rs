//! Parameter sweeps: `#HTC sweep` makes the next task line a template run once per combination
//! of its parameters, so a million runs need two lines, not a million.
//!
//! ```text
//! #HTC sweep seed=1..1000 model=a,b,c        # cross product: 3000 tasks
//! #HTC sweep x=0..1:0.25 +y=10..50:10        # `+` links y to x (in step): 5 tasks
//! #HTC sweep rows=params.csv                 # a task per row; columns named by the header
//! ./simulate --seed {seed} --model {model}
//! ```
//!
//! Values are taken one combination at a time (ranges computed, rows read as they come, a file
//! read again for each turn of an outer parameter), so a sweep costs memory for its parameters,
//! never per task. A value with characters the shell treats specially is single-quoted where it
//! is put into the command, as GNU parallel does.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

/// Tasks one sweep may make (the ledger numbers tasks with 32 bits).
pub const MAX_TASKS: u64 = u32::MAX as u64;

/// A numeric range `A..B[:S]`, as integers scaled by 10^decimals.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Range {
    start: i128,
    step: i128,
    count: u64,
    decimals: u32,
}

impl Range {
    fn parse(s: &str) -> Result<Range, String> {
        let (span, step) = match s.split_once(':') {
            Some((a, b)) => (a, Some(b)),
            None => (s, None),
        };
        let (a, b) = span.split_once("..").ok_or_else(|| format!("'{s}' is not a range like 1..10 or 0..1:0.25"))?;
        let decimals = [Some(a), Some(b), step]
            .iter()
            .flatten()
            .map(|x| x.split_once('.').map_or(0, |(_, f)| f.len()))
            .max()
            .unwrap_or(0) as u32;
        if decimals > 9 {
            return Err(format!("'{s}': at most 9 decimals"));
        }
        let num = |x: &str| -> Result<i128, String> {
            let bad = || format!("'{x}' in '{s}' is not a number");
            let (neg, x) = x.strip_prefix('-').map_or((false, x), |r| (true, r));
            let (int, frac) = x.split_once('.').unwrap_or((x, ""));
            if int.is_empty()
                || !int.bytes().all(|b| b.is_ascii_digit())
                || !frac.bytes().all(|b| b.is_ascii_digit())
                || int.len() > 18
            {
                return Err(bad());
            }
            let mut v: i128 = int.parse().map_err(|_| bad())?;
            let mut f = frac.to_string();
            f.extend(std::iter::repeat_n('0', decimals as usize - frac.len()));
            v = v * 10i128.pow(decimals) + if f.is_empty() { 0 } else { f.parse::<i128>().map_err(|_| bad())? };
            Ok(if neg { -v } else { v })
        };
        let (start, end) = (num(a)?, num(b)?);
        let step = match step {
            Some(x) => num(x)?,
            None if end >= start => 10i128.pow(decimals),
            None => -(10i128.pow(decimals)),
        };
        if step == 0 || (end - start).signum() * step.signum() < 0 {
            return Err(format!("'{s}': the step never reaches the end"));
        }
        let count = (end - start) / step + 1;
        if count > MAX_TASKS as i128 {
            return Err(format!("'{s}' has more than {MAX_TASKS} values"));
        }
        Ok(Range { start, step, count: count as u64, decimals })
    }

    fn value(&self, i: u64) -> String {
        let v = self.start + self.step * i as i128;
        if self.decimals == 0 {
            return v.to_string();
        }
        let p = 10i128.pow(self.decimals);
        let sign = if v < 0 { "-" } else { "" };
        format!("{sign}{}.{:0w$}", v.abs() / p, v.abs() % p, w = self.decimals as usize)
    }
}

/// Values of one named parameter, by position.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Values {
    Range(Range),
    List(Vec<String>),
}

impl Values {
    fn parse(s: &str) -> Result<Values, String> {
        // A range starts with a number (`../a.txt,../b.txt` is a list of paths).
        if !s.contains(',') && s.contains("..") && s.starts_with(|c: char| c.is_ascii_digit() || c == '-' || c == '.') {
            return Range::parse(s).map(Values::Range);
        }
        let items: Vec<String> = s.split(',').map(str::to_string).collect();
        if items.iter().any(String::is_empty) {
            return Err(format!("'{s}': an empty value in the list"));
        }
        Ok(Values::List(items))
    }
    fn len(&self) -> u64 {
        match self {
            Values::Range(r) => r.count,
            Values::List(v) => v.len() as u64,
        }
    }
    fn value(&self, i: u64) -> String {
        match self {
            Values::Range(r) => r.value(i),
            Values::List(v) => v[i as usize].clone(),
        }
    }
}

/// A table file's rows, read one at a time.
#[derive(Debug)]
struct Rows {
    path: PathBuf,
    shown: String,
    delim: u8,
    count: u64,
    reader: Option<BufReader<std::fs::File>>,
    line: u64,
}

impl Rows {
    /// Opens the file, reads its header (the parameter names) and counts and checks its rows.
    fn open(path: PathBuf, shown: String) -> Result<(Rows, Vec<String>), String> {
        let delim = if path.extension().is_some_and(|e| e == "tsv") { b'\t' } else { b',' };
        let mut r = Rows { path, shown, delim, count: 0, reader: None, line: 0 };
        let names = r.rewind()?.ok_or_else(|| format!("{}: no header line", r.shown))?;
        if let Some(bad) = names.iter().find(|n| !is_name(n)) {
            return Err(format!("{}:1: '{bad}' is not a parameter name (letters, digits, _)", r.shown));
        }
        while let Some(fields) = r.next_row()? {
            if fields.len() != names.len() {
                return Err(format!("{}:{}: {} fields, the header has {}", r.shown, r.line, fields.len(), names.len()));
            }
            r.count += 1;
        }
        Ok((r, names))
    }

    /// Back to the first row; returns the header's fields.
    fn rewind(&mut self) -> Result<Option<Vec<String>>, String> {
        let f = std::fs::File::open(&self.path).map_err(|e| format!("{}: {e}", self.shown))?;
        self.reader = Some(BufReader::new(f));
        self.line = 0;
        self.next_row()
    }

    fn next_row(&mut self) -> Result<Option<Vec<String>>, String> {
        let Some(rd) = self.reader.as_mut() else { return Ok(None) };
        let mut l = String::new();
        loop {
            l.clear();
            let n = rd.read_line(&mut l).map_err(|e| format!("{}: {e}", self.shown))?;
            if n == 0 {
                return Ok(None);
            }
            self.line += 1;
            let t = l.trim_end_matches(['\n', '\r']);
            if t.contains('\0') {
                return Err(format!("{}:{}: a NUL byte (a binary file?)", self.shown, self.line));
            }
            if !t.trim().is_empty() {
                return split_row(t, self.delim).map(Some).map_err(|e| format!("{}:{}: {e}", self.shown, self.line));
            }
        }
    }
}

/// Fields of one row: separated by `delim`, a field in double quotes may hold it (`""` is a quote).
fn split_row(line: &str, delim: u8) -> Result<Vec<String>, String> {
    let b = line.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    loop {
        let mut field = Vec::new();
        if b.get(i) == Some(&b'"') {
            i += 1;
            loop {
                match (b.get(i), b.get(i + 1)) {
                    (Some(b'"'), Some(b'"')) => {
                        field.push(b'"');
                        i += 2;
                    }
                    (Some(b'"'), _) => {
                        i += 1;
                        break;
                    }
                    (Some(&c), _) => {
                        field.push(c);
                        i += 1;
                    }
                    (None, _) => return Err("a quoted field is not closed".into()),
                }
            }
            if i < b.len() && b[i] != delim {
                return Err("text after a quoted field".into());
            }
        } else {
            while i < b.len() && b[i] != delim {
                field.push(b[i]);
                i += 1;
            }
        }
        out.push(String::from_utf8_lossy(&field).into_owned());
        if i >= b.len() {
            return Ok(out);
        }
        i += 1; // the delimiter
    }
}

fn is_name(s: &str) -> bool {
    let mut c = s.chars();
    c.next().is_some_and(|f| f.is_ascii_alphabetic() || f == '_') && c.all(|x| x.is_ascii_alphanumeric() || x == '_')
}

/// One dimension of the sweep: linked parameters that move in step, or a table's rows.
#[derive(Debug)]
enum Dim {
    Linked { names: Vec<String>, values: Vec<Values>, at: u64 },
    Rows { names: Vec<String>, rows: Rows, current: Vec<String> },
}

impl Dim {
    fn len(&self) -> u64 {
        match self {
            Dim::Linked { values, .. } => values[0].len(),
            Dim::Rows { rows, .. } => rows.count,
        }
    }
    fn names(&self) -> &[String] {
        match self {
            Dim::Linked { names, .. } | Dim::Rows { names, .. } => names,
        }
    }
    /// To the first combination.
    fn reset(&mut self) -> Result<(), String> {
        match self {
            Dim::Linked { at, .. } => *at = 0,
            Dim::Rows { rows, current, .. } => {
                rows.rewind()?;
                *current = rows.next_row()?.unwrap_or_default();
            }
        }
        Ok(())
    }
    /// To the next; false past the last.
    fn advance(&mut self) -> Result<bool, String> {
        match self {
            Dim::Linked { at, values, .. } => {
                *at += 1;
                Ok(*at < values[0].len())
            }
            Dim::Rows { rows, current, .. } => match rows.next_row()? {
                Some(r) => {
                    *current = r;
                    Ok(true)
                }
                None => Ok(false),
            },
        }
    }
    fn value(&self, k: usize) -> String {
        match self {
            Dim::Linked { values, at, .. } => values[k].value(*at),
            Dim::Rows { current, .. } => current.get(k).cloned().unwrap_or_default(),
        }
    }
}

/// A parsed `#HTC sweep` line: its dimensions, outermost first.
#[derive(Debug)]
pub struct Sweep {
    dims: Vec<Dim>,
}

impl Sweep {
    /// Parses the words after `#HTC sweep`; `rows=` files are relative to `dir`. Errors name the
    /// word's byte offset in `words` and why.
    pub fn parse(words: &str, dir: Option<&Path>) -> Result<Sweep, (usize, String)> {
        let mut dims: Vec<Dim> = Vec::new();
        let mut at = 0;
        for w in words.split([' ', '\t']) {
            let col = at;
            at += w.len() + 1;
            if w.is_empty() {
                continue;
            }
            if w.starts_with('#') {
                break; // a comment to the end of the line
            }
            let e = |m: String| (col, m);
            let (linked, word) = w.strip_prefix('+').map_or((false, w), |r| (true, r));
            let (name, value) = word.split_once('=').ok_or_else(|| e(format!("expected name=values, found '{w}'")))?;
            if name == "rows" {
                if linked {
                    return Err(e("rows= cannot be linked with '+' (put the values in the file instead)".into()));
                }
                let p = Path::new(value);
                let path = if p.is_absolute() { p.to_path_buf() } else { dir.unwrap_or(Path::new(".")).join(p) };
                let (rows, names) = Rows::open(path, value.to_string()).map_err(e)?;
                dims.push(Dim::Rows { names, rows, current: Vec::new() });
                continue;
            }
            if !is_name(name) {
                return Err(e(format!("'{name}' is not a parameter name (letters, digits, _)")));
            }
            let values = Values::parse(value).map_err(e)?;
            match dims.last_mut() {
                Some(Dim::Linked { names, values: vs, .. }) if linked => {
                    if values.len() != vs[0].len() {
                        return Err(e(format!(
                            "{name} has {} values, {} linked to it has {}",
                            values.len(),
                            names[0],
                            vs[0].len()
                        )));
                    }
                    names.push(name.to_string());
                    vs.push(values);
                }
                Some(Dim::Rows { .. }) if linked => {
                    return Err(e(format!("'+{name}' cannot link to a table's rows (put its values in the table)")))
                }
                _ if linked => return Err(e(format!("'+{name}' links to the parameter before it, and there is none"))),
                _ => dims.push(Dim::Linked { names: vec![name.to_string()], values: vec![values], at: 0 }),
            }
        }
        if dims.is_empty() {
            return Err((0, "a sweep needs parameters, e.g. `#HTC sweep seed=1..100`".into()));
        }
        let mut seen: Vec<&String> = dims.iter().flat_map(|d| d.names()).collect();
        seen.sort();
        if let Some(w) = seen.windows(2).find(|w| w[0] == w[1]) {
            return Err((0, format!("parameter '{}' is named twice", w[0])));
        }
        let s = Sweep { dims };
        if s.dims.iter().any(|d| d.len() == 0) {
            return Err((0, "a parameter has no values (an empty table?)".into()));
        }
        if s.tasks().is_none() {
            return Err((0, format!("more than {MAX_TASKS} combinations")));
        }
        Ok(s)
    }

    /// How many tasks it makes (None past `MAX_TASKS`).
    pub fn tasks(&self) -> Option<u64> {
        self.dims.iter().try_fold(1u64, |n, d| n.checked_mul(d.len())).filter(|&n| n <= MAX_TASKS)
    }

    /// Every parameter name.
    pub fn names(&self) -> Vec<&str> {
        self.dims.iter().flat_map(|d| d.names()).map(String::as_str).collect()
    }

    /// Where each `{name}` of `template` is: the template as pieces.
    pub fn compile(&self, template: &[u8]) -> Template {
        let names = self.names();
        let mut pieces = Vec::new();
        let mut lit = Vec::new();
        let mut i = 0;
        while i < template.len() {
            if template[i] == b'{' {
                if let Some(len) = template[i + 1..].iter().position(|&b| b == b'}') {
                    let word = &template[i + 1..i + 1 + len];
                    if let Some(k) = names.iter().position(|n| n.as_bytes() == word) {
                        pieces.push(Piece::Lit(std::mem::take(&mut lit)));
                        pieces.push(Piece::Param(k));
                        i += len + 2;
                        continue;
                    }
                }
            }
            lit.push(template[i]);
            i += 1;
        }
        pieces.push(Piece::Lit(lit));
        Template { pieces }
    }

    /// Starts at the first combination.
    pub fn start(&mut self) -> Result<(), String> {
        for d in &mut self.dims {
            d.reset()?;
        }
        Ok(())
    }

    /// Moves to the next combination (the last parameter fastest); false after the last.
    pub fn advance(&mut self) -> Result<bool, String> {
        for i in (0..self.dims.len()).rev() {
            if self.dims[i].advance()? {
                return Ok(true);
            }
            if i == 0 {
                return Ok(false);
            }
            self.dims[i].reset()?;
        }
        Ok(false)
    }

    /// The current values, in `names()` order.
    pub fn values(&self) -> Vec<String> {
        self.dims.iter().flat_map(|d| (0..d.names().len()).map(move |k| d.value(k))).collect()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Lit(Vec<u8>),
    Param(usize),
}

/// A task line with its `{name}` places found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    pieces: Vec<Piece>,
}

impl Template {
    /// Whether any parameter appears at all (a template without one would make copies).
    pub fn uses_params(&self) -> bool {
        self.pieces.iter().any(|p| matches!(p, Piece::Param(_)))
    }

    /// The command for `values` into `out`, each value quoted for the shell if it needs to be.
    pub fn fill(&self, values: &[String], out: &mut Vec<u8>) {
        out.clear();
        for p in &self.pieces {
            match p {
                Piece::Lit(b) => out.extend_from_slice(b),
                Piece::Param(k) => quote(&values[*k], out),
            }
        }
    }
}

/// A value as one shell word: as it is when it is plain, else in single quotes.
pub fn quote(v: &str, out: &mut Vec<u8>) {
    let plain = !v.is_empty() && v.bytes().all(|b| b.is_ascii_alphanumeric() || b"_@%+=:,./-".contains(&b));
    if plain {
        out.extend_from_slice(v.as_bytes());
        return;
    }
    out.push(b'\'');
    for b in v.bytes() {
        if b == b'\'' {
            out.extend_from_slice(b"'\\''");
        } else {
            out.push(b);
        }
    }
    out.push(b'\'');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(words: &str, template: &str, dir: Option<&Path>) -> Vec<String> {
        let mut s = Sweep::parse(words, dir).unwrap();
        let t = s.compile(template.as_bytes());
        let n = s.tasks().unwrap();
        s.start().unwrap();
        let mut out = Vec::new();
        let mut buf = Vec::new();
        loop {
            t.fill(&s.values(), &mut buf);
            out.push(String::from_utf8(buf.clone()).unwrap());
            if !s.advance().unwrap() {
                break;
            }
        }
        assert_eq!(out.len() as u64, n, "tasks() counts what is made");
        out
    }

    #[test]
    fn cross_products_and_linked_parameters() {
        assert_eq!(
            all("x=1..3 y=a,b", "run {x} {y}", None),
            ["run 1 a", "run 1 b", "run 2 a", "run 2 b", "run 3 a", "run 3 b"]
        );
        assert_eq!(
            all("x=0..1:0.25 +y=50..10:-10", "f {x} {y}", None),
            ["f 0.00 50", "f 0.25 40", "f 0.50 30", "f 0.75 20", "f 1.00 10"]
        );
        assert_eq!(
            all("n=-1..1", "{n} {m} {} awk '{print}'", None),
            ["-1 {m} {} awk '{print}'", "0 {m} {} awk '{print}'", "1 {m} {} awk '{print}'"]
        );
        assert_eq!(all("k=1..10:4", "{k}", None), ["1", "5", "9"]);
        assert_eq!(
            all("f=../a.txt,../b.txt   # paths, not a range", "cat {f}", None),
            ["cat ../a.txt", "cat ../b.txt"]
        );
    }

    #[test]
    fn rows_of_a_table_and_quoting() {
        let d = std::env::temp_dir().join(format!("htc-sweep-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("p.csv"), "name,size\nplain,1\n\"it's, quoted\",2\n\n\"a \"\"b\"\"\",3\n").unwrap();
        let got = all("rows=p.csv s=x,y", "echo {name} {size}{s}", Some(&d));
        assert_eq!(got[0], "echo plain 1x");
        assert_eq!(got[2], r"echo 'it'\''s, quoted' 2x");
        assert_eq!(got[5], r#"echo 'a "b"' 3y"#);
        assert_eq!(got.len(), 6);
        std::fs::write(d.join("t.tsv"), "a\tb\n1\t2\n").unwrap();
        assert_eq!(all("rows=t.tsv", "{a}+{b}", Some(&d)), ["1+2"]);
        std::fs::write(d.join("bad.csv"), "a,b\n1,2\n3\n").unwrap();
        assert_eq!(Sweep::parse("rows=bad.csv", Some(&d)).unwrap_err().1, "bad.csv:3: 1 fields, the header has 2");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn bad_sweeps_say_what_and_where() {
        let err = |w: &str| Sweep::parse(w, None).unwrap_err();
        assert_eq!(err("x=1..3 +y=1,2"), (7, "y has 2 values, x linked to it has 3".into()));
        assert_eq!(err("+y=1,2").1, "'+y' links to the parameter before it, and there is none");
        assert_eq!(err("x=1..3 x=4").1, "parameter 'x' is named twice");
        assert_eq!(err("x=3..1:1").1, "'3..1:1': the step never reaches the end");
        assert_eq!(err("x=1..a").1, "'a' in '1..a' is not a number");
        assert_eq!(err("x=a,,b").1, "'a,,b': an empty value in the list");
        assert_eq!(err("9x=1").1, "'9x' is not a parameter name (letters, digits, _)");
        assert_eq!(err("x").1, "expected name=values, found 'x'");
        assert_eq!(err("").1, "a sweep needs parameters, e.g. `#HTC sweep seed=1..100`");
        assert_eq!(err("a=1..100000 b=1..100000").1, format!("more than {MAX_TASKS} combinations"));
        assert_eq!(
            err("x=0..18446744073.709551616:0.000000001").1,
            format!("'0..18446744073.709551616:0.000000001' has more than {MAX_TASKS} values")
        );
        assert!(err("rows=/nonexistent.csv").1.starts_with("/nonexistent.csv: No such file"));
    }
}
