//! How a run keeps its tasks' output: the one definition that `htc run --output`, the SPANK
//! plugin's `--htc-output` and the agents' executors all read.

use std::str::FromStr;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OutputMode {
    /// A few stream files per agent (one stdout and one stderr per slot) plus an index.
    #[default]
    Streams,
    /// One `ID.out` and `ID.err` per task (the last attempt's); small jobs only: millions of
    /// files hurt parallel filesystems.
    PerTask,
    /// Discard output.
    None,
}

impl OutputMode {
    pub const ALL: [OutputMode; 3] = [OutputMode::Streams, OutputMode::PerTask, OutputMode::None];

    pub fn name(self) -> &'static str {
        match self {
            OutputMode::Streams => "streams",
            OutputMode::PerTask => "per-task",
            OutputMode::None => "none",
        }
    }
}

impl FromStr for OutputMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        OutputMode::ALL
            .into_iter()
            .find(|m| m.name() == s.trim())
            .ok_or_else(|| format!("'{s}' is not an output mode (streams, per-task or none)"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back() {
        for m in OutputMode::ALL {
            assert_eq!(m.name().parse(), Ok(m));
        }
        assert_eq!(" none ".parse(), Ok(OutputMode::None));
        assert!("files".parse::<OutputMode>().unwrap_err().contains("streams, per-task or none"));
    }
}
