//! The plugin's arguments on its plugstack.conf line (`agent=PATH ledger_dir=DIR fanout=K
//! disabled`): the site's configuration, as opposed to the user's `--htc*` options.

use std::path::PathBuf;

use crate::value::parse_number;

/// Agent used when plugstack.conf gives no `agent=`; set at build time by `HTC_DEFAULT_AGENT`.
pub const DEFAULT_AGENT: &str = env!("HTC_BUILD_DEFAULT_AGENT");

/// Children per node of the agents' tree, for `fanout=` and `--htc-fanout` alike.
pub const FANOUT_MIN: u32 = 2;
pub const FANOUT_MAX: u32 = 1024;

/// Plugin arguments from the plugstack.conf line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginConfig {
    /// Absolute path of `htc-agent`.
    pub agent: PathBuf,
    /// Passed to the agent as `--ledger-dir` (node-local directory for the LMDB ledger).
    pub ledger_dir: Option<PathBuf>,
    /// Site default for the tree fan-out; `--htc-fanout` overrides it.
    pub fanout: Option<u32>,
    /// `disabled`: `--htc` is refused at submit time, and HTC jobs already queued fail.
    pub disabled: bool,
}

impl Default for PluginConfig {
    fn default() -> Self {
        PluginConfig { agent: PathBuf::from(DEFAULT_AGENT), ledger_dir: None, fanout: None, disabled: false }
    }
}

/// Parses the plugin arguments. Every bad argument is reported; any error means the
/// configuration must not be used.
pub fn parse_plugin_args<S: AsRef<str>>(args: &[S]) -> Result<PluginConfig, Vec<String>> {
    let mut cfg = PluginConfig::default();
    let mut errors = Vec::new();
    let mut seen: Vec<&str> = Vec::new();
    for arg in args {
        let arg = arg.as_ref();
        let (key, value) = match arg.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (arg, None),
        };
        let known = ["agent", "ledger_dir", "fanout", "disabled"];
        if let Some(k) = known.iter().find(|k| **k == key) {
            if seen.contains(k) {
                errors.push(format!("plugin argument '{key}' given twice"));
                continue;
            }
            seen.push(k);
        }
        match (key, value) {
            ("agent", Some(v)) => match absolute_path("agent", v) {
                Ok(p) => cfg.agent = p,
                Err(e) => errors.push(e),
            },
            ("ledger_dir", Some(v)) => match absolute_path("ledger_dir", v) {
                Ok(p) => cfg.ledger_dir = Some(p),
                Err(e) => errors.push(e),
            },
            ("fanout", Some(v)) => match parse_number(v, FANOUT_MIN, FANOUT_MAX) {
                Ok(k) => cfg.fanout = Some(k),
                Err(e) => errors.push(format!("plugin argument fanout={v}: {e}")),
            },
            ("disabled", None) => cfg.disabled = true,
            ("disabled", Some(v)) => match v {
                "1" | "yes" | "true" => cfg.disabled = true,
                "0" | "no" | "false" => cfg.disabled = false,
                _ => errors.push(format!("plugin argument disabled={v}: expected yes or no")),
            },
            ("agent" | "ledger_dir" | "fanout", None) => {
                errors.push(format!("plugin argument '{key}' needs a value ({key}=…)"))
            }
            _ => errors.push(format!(
                "unknown plugin argument '{arg}' (known: agent=PATH, ledger_dir=DIR, fanout=K, disabled)"
            )),
        }
    }
    if errors.is_empty() {
        Ok(cfg)
    } else {
        Err(errors)
    }
}

fn absolute_path(key: &str, v: &str) -> Result<PathBuf, String> {
    if v.is_empty() {
        return Err(format!("plugin argument {key}= is empty"));
    }
    if !v.starts_with('/') {
        return Err(format!("plugin argument {key}={v}: must be an absolute path"));
    }
    Ok(PathBuf::from(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugin_args_defaults_and_values() {
        let none: [&str; 0] = [];
        let c = parse_plugin_args(&none).unwrap();
        assert_eq!(c.agent, PathBuf::from(DEFAULT_AGENT));
        assert!(c.agent.is_absolute());
        assert!(!c.disabled);
        let c =
            parse_plugin_args(&["agent=/opt/htc/bin/htc-agent", "ledger_dir=/var/tmp/htc", "fanout=16", "disabled"])
                .unwrap();
        assert_eq!(c.agent, PathBuf::from("/opt/htc/bin/htc-agent"));
        assert_eq!(c.ledger_dir, Some(PathBuf::from("/var/tmp/htc")));
        assert_eq!(c.fanout, Some(16));
        assert!(c.disabled);
        assert!(!parse_plugin_args(&["disabled=no"]).unwrap().disabled);
        assert!(parse_plugin_args(&["disabled=yes"]).unwrap().disabled);
    }

    #[test]
    fn plugin_args_errors_are_all_reported() {
        let e = parse_plugin_args(&["agent=htc-agent", "fanout=1", "colour=blue", "ledger_dir", "disabled=maybe"])
            .unwrap_err();
        assert_eq!(e.len(), 5, "{e:?}");
        assert!(e[0].contains("absolute"), "{}", e[0]);
        assert_eq!(e[1], "plugin argument fanout=1: '1' is not a whole number from 2 to 1024");
        assert!(e[2].contains("unknown plugin argument 'colour=blue'"), "{}", e[2]);
        assert!(e[3].contains("needs a value"), "{}", e[3]);
        assert!(e[4].contains("disabled=maybe"), "{}", e[4]);
        let e = parse_plugin_args(&["agent=/a", "agent=/b"]).unwrap_err();
        assert!(e[0].contains("twice"));
        assert!(parse_plugin_args(&["agent="]).is_err());
    }
}
