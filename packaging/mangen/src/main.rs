//! Writes the man pages htc(1), htc-agent(8) and spank_htc(8) into a directory:
//!
//!     cargo run -p htc-mangen -- OUT_DIR
//!
//! The NAME, SYNOPSIS, OPTIONS and COMMANDS parts come from the clap definitions the binaries parse
//! with (`htc::cli`), so they cannot drift from `--help`; everything else is hand-written roff in
//! `packaging/man/*.in`, which says where the generated parts go with lines like `@COMMANDS@`.

use std::io;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::CommandFactory;
use clap_mangen::Man;

const VERSION: &str = env!("CARGO_PKG_VERSION");

struct Page {
    file: &'static str,
    template: &'static str,
    /// The clap command the page documents; spank_htc(8) has none (the plugin's options are
    /// registered with Slurm, not parsed by clap).
    cmd: Option<clap::Command>,
    section: &'static str,
}

fn pages() -> Vec<Page> {
    vec![
        Page {
            file: "htc.1",
            template: include_str!("../../man/htc.1.in"),
            cmd: Some(htc::cli::htc::Cli::command()),
            section: "1",
        },
        Page {
            file: "htc-agent.8",
            template: include_str!("../../man/htc-agent.8.in"),
            cmd: Some(htc::cli::agent::Cli::command()),
            section: "8",
        },
        Page { file: "spank_htc.8", template: include_str!("../../man/spank_htc.8.in"), cmd: None, section: "8" },
    ]
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [out] = args.as_slice() else {
        eprintln!("usage: htc-mangen OUT_DIR");
        return ExitCode::from(2);
    };
    match write_all(Path::new(out)) {
        Ok(files) => {
            for f in files {
                println!("{}", f.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("htc-mangen: {e}");
            ExitCode::FAILURE
        }
    }
}

fn write_all(out: &Path) -> io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(out)?;
    let mut written = Vec::new();
    for p in pages() {
        let text = render(&p)?;
        let path = out.join(p.file);
        std::fs::write(&path, text)?;
        written.push(path);
    }
    Ok(written)
}

fn render(p: &Page) -> io::Result<String> {
    let mut text = String::new();
    for line in p.template.lines() {
        let generated = match (line, &p.cmd) {
            ("@TH@", cmd) => Some(title(cmd.as_ref(), p.file, p.section)),
            ("@NAME@", Some(cmd)) => Some(section_body(&man(cmd, p.section), Man::render_name_section)?),
            ("@SYNOPSIS@", Some(cmd)) => Some(section_body(&man(cmd, p.section), Man::render_synopsis_section)?),
            ("@OPTIONS@", Some(cmd)) => Some(section_body(&man(cmd, p.section), Man::render_options_section)?),
            ("@COMMANDS@", Some(cmd)) => Some(commands(cmd, p.section)?),
            _ => None,
        };
        match generated {
            Some(g) => text.push_str(&g),
            None => {
                text.push_str(&line.replace("@VERSION@", VERSION));
                text.push('\n');
            }
        }
    }
    // A misspelt or misplaced placeholder would otherwise reach the page as literal text.
    if let Some(l) = text.lines().find(|l| l.starts_with('@') && l.ends_with('@')) {
        return Err(io::Error::other(format!("{}: unknown placeholder {l}", p.file)));
    }
    Ok(text)
}

fn man(cmd: &clap::Command, section: &str) -> Man {
    Man::new(cmd.clone()).section(section)
}

fn title(cmd: Option<&clap::Command>, file: &str, section: &str) -> String {
    let name =
        cmd.map(|c| c.get_name().to_string()).unwrap_or_else(|| file.trim_end_matches(&format!(".{section}")).into());
    format!(".TH \"{}\" \"{section}\" \"\" \"slurm-htc {VERSION}\" \"slurm-htc manual\"\n", name.to_uppercase())
}

/// One section rendered by clap_mangen, without its `.SH` heading (the template has that).
fn section_body(man: &Man, f: fn(&Man, &mut dyn io::Write) -> io::Result<()>) -> io::Result<String> {
    let mut buf = Vec::new();
    f(man, &mut buf)?;
    let s = String::from_utf8(buf).map_err(io::Error::other)?;
    Ok(s.lines().filter(|l| !l.starts_with(".SH ")).map(|l| format!("{l}\n")).collect())
}

/// Every subcommand as a `.SS` subsection: what it does, its synopsis, its options. One page per
/// program, not one per subcommand: `man htc` is where a user looks.
fn commands(root: &clap::Command, section: &str) -> io::Result<String> {
    // Every subcommand takes -h; listing it under each one is noise.
    let mut root = root.clone().disable_help_subcommand(true).mut_subcommands(|s| s.disable_help_flag(true));
    // Gives subcommands their full name ("htc run") for the synopsis lines.
    root.build();
    let mut out = String::new();
    for sub in root.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = sub.get_bin_name().unwrap_or(sub.get_name()).to_string();
        out.push_str(&format!(".SS \"{name}\"\n"));
        let about = sub.get_long_about().or(sub.get_about()).map(|s| s.to_string()).unwrap_or_default();
        if !about.is_empty() {
            out.push_str(&escape(&about));
            out.push_str("\n.PP\n");
        }
        let m = man(sub, section);
        out.push_str(&section_body(&m, Man::render_synopsis_section)?);
        if sub.get_arguments().any(|a| !a.is_hide_set()) {
            out.push_str(&section_body(&m, Man::render_options_section)?);
        }
    }
    Ok(out)
}

/// Text for a roff body line: backslashes, leading dots and quotes would otherwise be requests.
fn escape(s: &str) -> String {
    let s = s.replace('\\', "\\e").replace('-', "\\-");
    if s.starts_with('.') || s.starts_with('\'') {
        format!("\\&{s}")
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_page_renders_without_leftover_placeholders() {
        for p in pages() {
            let t = render(&p).unwrap();
            assert!(t.lines().any(|l| l.starts_with(".TH \"")), "{}", p.file);
            assert!(!t.contains("@VERSION@"), "{}", p.file);
        }
    }

    #[test]
    fn htc_page_lists_every_subcommand_and_option() {
        let p = pages().into_iter().find(|p| p.file == "htc.1").unwrap();
        let t = render(&p).unwrap();
        for s in ["run", "prepare", "submit", "resume", "check", "status", "verify", "output", "calibrate", "simulate"]
        {
            assert!(t.contains(&format!(".SS \"htc {s}\"")), "{s} missing");
        }
        assert!(t.contains("\\-\\-cores\\-per\\-agent"), "{t}");
        assert!(t.contains("\\-\\-partition"), "{t}");
        // Hidden options stay hidden.
        assert!(!t.contains("commit\\-ms"));
    }
}
