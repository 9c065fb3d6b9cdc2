//! The live view's file in the run directory (`RUN/live`): rewritten whole by the leader every
//! second, read by `htc watch`. What it says and how is `live.rs`'s; this is only where and how
//! it is stored.

use std::path::{Path, PathBuf};

use htc_engine::live::{LiveError, View, FILE};

pub fn path(run_dir: &Path) -> PathBuf {
    run_dir.join(FILE)
}

/// Replaces the run's live view at once (a reader sees the old file or the new one, never half).
pub fn write(run_dir: &Path, v: &View) -> Result<(), LiveError> {
    let to = path(run_dir);
    let tmp = run_dir.join(format!(".{FILE}.tmp"));
    let io = |source| LiveError::Io { path: to.display().to_string(), source };
    std::fs::write(&tmp, v.encode()).map_err(io)?;
    std::fs::rename(&tmp, &to).map_err(io)
}

/// The run's live view, or `None` when no leader wrote one yet.
pub fn read(run_dir: &Path) -> Result<Option<View>, LiveError> {
    let p = path(run_dir);
    match std::fs::read_to_string(&p) {
        Ok(t) => View::decode(&t, &p.display().to_string()).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(LiveError::Io { path: p.display().to_string(), source }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_views_replace_each_other_whole() {
        let d = std::env::temp_dir().join(format!("htc-live-test-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        assert_eq!(read(&d).unwrap(), None);
        let v1 = View { job: "1234".into(), state: "running".into(), now_us: 5, ..Default::default() };
        write(&d, &v1).unwrap();
        assert_eq!(read(&d).unwrap(), Some(v1.clone()));
        let v2 = View { state: "complete".into(), ..v1 };
        write(&d, &v2).unwrap();
        assert_eq!(read(&d).unwrap(), Some(v2));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
