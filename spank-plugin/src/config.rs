//! The user's `--htc*` options as the option callbacks collected them ([`UserOptions`]), and
//! what sbatch says about their combination: settings without an option that activates the
//! plugin, and settings that cannot go with `--htc-join`.

use crate::options::{activator, Mode, OptionDef, Role, WithJoin, COUNT, OPTIONS};
use crate::value::Value;

/// Why `--htc=FILE` and `--htc-join` exclude each other.
pub const JOIN_TAKES_NO_FILE: &str = "--htc-join joins a running run; it takes no --htc=FILE";

/// Why `--htc-open` and `--htc-join` exclude each other.
pub const OPEN_WITH_JOIN: &str = "the run's own job decides whether it is open";

/// The value of each option of [`OPTIONS`] given in this process, by its place in the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserOptions {
    values: [Option<Value>; COUNT],
}

impl Default for UserOptions {
    fn default() -> Self {
        UserOptions::new()
    }
}

impl UserOptions {
    /// `const`, for the plugin's static state.
    pub const fn new() -> UserOptions {
        UserOptions { values: [const { None }; COUNT] }
    }

    pub fn get(&self, i: usize) -> Option<&Value> {
        self.values[i].as_ref()
    }

    pub fn set(&mut self, i: usize, value: Option<Value>) {
        self.values[i] = value;
    }

    /// The options given, in table order.
    pub fn given(&self) -> impl Iterator<Item = (usize, &'static OptionDef, &Value)> {
        OPTIONS.iter().zip(&self.values).enumerate().filter_map(|(i, (def, v))| Some((i, def, v.as_ref()?)))
    }

    /// Whether the options make a job of `mode`: its activator given, or for `Run` an option
    /// that opens a run without a task file.
    pub fn has(&self, mode: Mode) -> bool {
        self.get(activator(mode)).is_some() || mode == Mode::Run && self.opens()
    }

    /// Whether the run is to be open (`--htc-open`).
    pub fn opens(&self) -> bool {
        self.given().any(|(_, def, _)| def.role == Role::Opens)
    }

    /// The settings given without `--htc` or `--htc-join` (they do nothing then).
    pub fn orphans(&self) -> Vec<String> {
        if self.has(Mode::Run) || self.has(Mode::Join) {
            return Vec::new();
        }
        self.given().filter(|(_, def, _)| def.activates().is_none()).map(|(_, def, _)| def.flag()).collect()
    }

    /// Why these options cannot go together with `--htc-join`: one message per conflicting
    /// option (empty without `--htc-join`, or when nothing conflicts). A joining job has no task
    /// file and takes the run's settings, but for those that shape this job's own agents.
    pub fn join_conflicts(&self) -> Vec<String> {
        let mut v = Vec::new();
        if !self.has(Mode::Join) {
            return v;
        }
        if self.get(activator(Mode::Run)).is_some() {
            v.push(JOIN_TAKES_NO_FILE.to_string());
        }
        for (_, def, _) in self.given() {
            let why = match def.role {
                Role::Setting(WithJoin::Refused(why)) => why,
                Role::Opens => OPEN_WITH_JOIN,
                _ => continue,
            };
            v.push(format!("{} cannot be used with --htc-join ({why})", def.flag()));
        }
        v
    }
}

#[cfg(test)]
pub mod tests {
    use super::*;
    use crate::options::by_name;
    use std::ffi::OsStr;

    /// Options as the remote option callback records them: `(name, value)`, each parsed by its
    /// entry.
    pub fn opts(given: &[(&str, &str)]) -> UserOptions {
        let mut o = UserOptions::new();
        for (name, text) in given {
            let i = by_name(name).unwrap_or_else(|| panic!("no option --{name}"));
            let v = OPTIONS[i].kind.parse(OsStr::new(text)).unwrap_or_else(|e| panic!("--{name}={text}: {e}"));
            o.set(i, Some(v));
        }
        o
    }

    #[test]
    fn orphan_options() {
        assert_eq!(
            opts(&[("htc-retries", "1"), ("htc-output", "none")]).orphans(),
            vec!["--htc-retries", "--htc-output"]
        );
        // In table order, whatever order they came in.
        assert_eq!(opts(&[("htc-grow", "2"), ("htc-resubmit", "1")]).orphans(), vec!["--htc-resubmit", "--htc-grow"]);
        for (name, value) in [
            ("htc-partition", "hflow"),
            ("htc-agents-per-node", "2"),
            ("htc-instance-nodes", "4"),
            ("htc-max-fails", "5"),
            ("htc-grow", "2"),
        ] {
            let o = opts(&[(name, value)]);
            assert_eq!(o.orphans(), vec![format!("--{name}")]);
            assert!(o.join_conflicts().is_empty());
        }
        assert!(opts(&[("htc", "/t"), ("htc-retries", "1")]).orphans().is_empty());
        // --htc-open makes a run of its own, without a task file.
        let o = opts(&[("htc-open", ""), ("htc-retries", "1"), ("htc-grow", "2")]);
        assert!(o.orphans().is_empty() && o.has(Mode::Run) && o.opens() && !o.has(Mode::Join));
        // --htc-join activates on its own: its companions are not orphans.
        let o = opts(&[("htc-join", "7"), ("htc-agents-per-node", "2"), ("htc-instance-nodes", "3")]);
        assert!(o.orphans().is_empty());
        assert!(o.join_conflicts().is_empty());
        // Without --htc-join nothing conflicts.
        assert!(opts(&[("htc", "/t"), ("htc-retries", "1"), ("htc-resume", "3")]).join_conflicts().is_empty());
    }

    #[test]
    fn join_refuses_a_task_file_and_the_run_s_settings() {
        let o = opts(&[("htc-join", "1234"), ("htc", "tasks.txt")]);
        assert_eq!(o.join_conflicts(), vec!["--htc-join joins a running run; it takes no --htc=FILE"]);
        let each = [
            ("htc-retries", "1", "the run's retries apply"),
            ("htc-fanout", "4", "the run's fan-out applies"),
            ("htc-output", "none", "the run's output mode applies"),
            ("htc-partition", "even", "the run's partition plan applies"),
            ("htc-max-fails", "3", "the run's limit applies"),
            ("htc-resume", "99", "--htc-resume continues a run that ended, --htc-join joins one that is running"),
            ("htc-resubmit", "2", "only the run's own job resubmits the run"),
            ("htc-grow", "3:1:30", "the run's own job grows it"),
            ("htc-open", "1h", OPEN_WITH_JOIN),
        ];
        for (name, value, why) in each {
            let o = opts(&[("htc-join", "1234"), (name, value)]);
            assert_eq!(o.join_conflicts(), vec![format!("--{name} cannot be used with --htc-join ({why})")]);
            assert!(o.orphans().is_empty());
        }
        // All of them are reported.
        let o = opts(&[
            ("htc-join", "1"),
            ("htc", "/t"),
            ("htc-retries", "1"),
            ("htc-resubmit", "1"),
            ("htc-agents-per-node", "2"),
        ]);
        assert_eq!(o.join_conflicts().len(), 3, "{:?}", o.join_conflicts());
    }
}
