//! What the batch step makes sure of before it becomes the agent: that only root can change
//! the agent it executes, that it runs with exactly the job's credentials, and that the agent
//! does not inherit the plugin's private variables.

use std::ffi::OsString;
use std::fmt;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

use crate::options::PLUGIN_NAME;
use crate::request::JOB_ENV_PREFIX;

/// Why the plugin will not start the configured agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentPathError {
    /// The path (or a directory on it) does not exist.
    NotFound(String),
    /// The path cannot be resolved for another reason (e.g. a directory the user cannot
    /// search).
    Inaccessible(String),
    /// Someone other than root could change what gets executed, or the file is set-id.
    Unsafe(String),
}

impl fmt::Display for AgentPathError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AgentPathError::NotFound(m) | AgentPathError::Inaccessible(m) | AgentPathError::Unsafe(m) => f.write_str(m),
        }
    }
}

/// What [`check_agent_path`] needs to know about one path (from `stat`, symlinks followed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathMeta {
    pub uid: u32,
    /// `st_mode`, file type bits included.
    pub mode: u32,
}

const S_IFMT: u32 = 0o170000;
const S_IFREG: u32 = 0o100000;
const S_IFDIR: u32 = 0o040000;

/// The agent that an HTC batch step executes as the job's user must be one only root can
/// change: otherwise whoever can write the file, or rename entries in a directory on its
/// path, would run code as every other user who submits an HTC job. The rule is sshd's
/// `StrictModes` for its own files: the symlink-free (canonical) path and every directory
/// above it owned by root and writable by nobody else; the file a regular file without the
/// set-user-ID or set-group-ID bit (the agent always runs as the job's user, never as its
/// owner). Returns the canonical path, which is what gets executed (a symlink on the
/// configured path could otherwise be re-pointed between this check and the exec).
pub fn check_agent_path(agent: &Path) -> Result<PathBuf, AgentPathError> {
    use std::os::unix::fs::MetadataExt;
    // Only std here: the fuzz target compiles this file on its own.
    let canon = std::fs::canonicalize(agent).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory => AgentPathError::NotFound(e.to_string()),
        _ => AgentPathError::Inaccessible(e.to_string()),
    })?;
    check_agent_path_with(agent, &canon, |p| {
        std::fs::metadata(p).map(|m| PathMeta { uid: m.uid(), mode: m.mode() }).map_err(|e| e.to_string())
    })?;
    Ok(canon)
}

/// [`check_agent_path`] on an already canonical path, `stat` being injectable for tests.
pub fn check_agent_path_with(
    configured: &Path,
    canon: &Path,
    stat: impl Fn(&Path) -> Result<PathMeta, String>,
) -> Result<(), AgentPathError> {
    // Messages follow "cannot start the agent <configured path>: ".
    let via = if configured == canon { String::new() } else { format!("resolves to {}: ", canon.display()) };
    let unsafe_ = |what: &str| AgentPathError::Unsafe(format!("{via}{what}"));
    if !canon.is_absolute() {
        return Err(unsafe_("not an absolute path"));
    }
    let meta = stat(canon).map_err(AgentPathError::Inaccessible)?;
    if meta.mode & S_IFMT != S_IFREG {
        return Err(unsafe_(&format!("{} is not a regular file", canon.display())));
    }
    if meta.mode & 0o6000 != 0 {
        return Err(unsafe_(&format!(
            "file {} is set-user-ID or set-group-ID (mode {:04o}); the agent must run as the job's user, never as its owner",
            canon.display(),
            meta.mode & 0o7777
        )));
    }
    let owned_by_root_only = |p: &Path, m: PathMeta, kind: &str| -> Result<(), AgentPathError> {
        if m.uid != 0 {
            return Err(unsafe_(&format!(
                "{kind} {} is owned by uid {}, not root; only root may be able to change the agent",
                p.display(),
                m.uid
            )));
        }
        if m.mode & 0o022 != 0 {
            return Err(unsafe_(&format!(
                "{kind} {} is writable by group or others (mode {:04o}); only root may be able to change the agent",
                p.display(),
                m.mode & 0o7777
            )));
        }
        Ok(())
    };
    owned_by_root_only(canon, meta, "file")?;
    for dir in canon.ancestors().skip(1) {
        let m = stat(dir).map_err(|e| AgentPathError::Inaccessible(format!("{}: {e}", dir.display())))?;
        if m.mode & S_IFMT != S_IFDIR {
            return Err(unsafe_(&format!("{} is not a directory", dir.display())));
        }
        owned_by_root_only(dir, m, "directory")?;
    }
    Ok(())
}

/// The credentials of the task process that is about to become the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// Real, effective, saved user id.
    pub uids: [u32; 3],
    /// Real, effective, saved group id.
    pub gids: [u32; 3],
    /// Supplementary groups (`getgroups`).
    pub groups: Vec<u32>,
}

/// The agent may only start with exactly the job's credentials: uid and gid (real, effective
/// and saved, so nothing can switch back to root), and no supplementary group that Slurm did
/// not give the job (slurmstepd sets them with `setgroups(job->gids)`). `job_groups` is
/// `S_JOB_SUPPLEMENTARY_GIDS` (empty when unknown, which then allows only the job's gid).
pub fn check_identity(id: &Identity, job_uid: u32, job_gid: u32, job_groups: &[u32]) -> Result<(), String> {
    if id.uids.iter().any(|&u| u != job_uid) {
        return Err(format!(
            "uid {}/{}/{} (real/effective/saved) is not the job's uid {job_uid}",
            id.uids[0], id.uids[1], id.uids[2]
        ));
    }
    if id.gids.iter().any(|&g| g != job_gid) {
        return Err(format!(
            "gid {}/{}/{} (real/effective/saved) is not the job's gid {job_gid}",
            id.gids[0], id.gids[1], id.gids[2]
        ));
    }
    if let Some(g) = id.groups.iter().find(|&&g| g != job_gid && !job_groups.contains(&g)) {
        return Err(format!("supplementary group {g} is not one of the job's groups {job_groups:?}"));
    }
    Ok(())
}

/// Job-environment entries (`NAME=value`) the agent must not inherit: our job-control
/// variables and Slurm's copies of our option values. Left in place they would leak into
/// every `srun`/`sbatch` run below the agent, which would then re-process `--htc` (a nested
/// `sbatch` would turn into an HTC job, an `srun` would re-run the option callbacks).
pub fn is_private_env(entry: &[u8]) -> bool {
    let name = match entry.iter().position(|&b| b == b'=') {
        Some(i) => &entry[..i],
        None => entry,
    };
    let opt = format!("_SLURM_SPANK_OPTION_{PLUGIN_NAME}_");
    let jc = format!("{JOB_ENV_PREFIX}HTC_");
    name.starts_with(jc.as_bytes())
        || name.starts_with(opt.as_bytes())
        || strip(name, b"SLURM_SPANK_").is_some_and(|n| n.starts_with(opt.as_bytes()))
        || strip(name, b"SPANK_").is_some_and(|n| n.starts_with(opt.as_bytes()) || n.starts_with(b"HTC_"))
}

fn strip<'a>(s: &'a [u8], prefix: &[u8]) -> Option<&'a [u8]> {
    s.strip_prefix(prefix)
}

/// Names (before `=`) of the entries of `env` that `is_private_env` selects.
pub fn private_env_names<'a>(env: impl IntoIterator<Item = &'a [u8]>) -> Vec<OsString> {
    env.into_iter()
        .filter(|e| is_private_env(e))
        .map(|e| {
            let n = e.iter().position(|&b| b == b'=').unwrap_or(e.len());
            OsString::from_vec(e[..n].to_vec())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    fn meta_table<'a>(entries: &'a [(&'a str, u32, u32)]) -> impl Fn(&Path) -> Result<PathMeta, String> + 'a {
        move |p: &Path| {
            entries
                .iter()
                .find(|(q, _, _)| Path::new(q) == p)
                .map(|&(_, uid, mode)| PathMeta { uid, mode })
                .ok_or_else(|| format!("{}: No such file or directory", p.display()))
        }
    }

    #[test]
    fn agent_path_rules() {
        let safe =
            [("/", 0, 0o040755), ("/opt", 0, 0o040755), ("/opt/htc", 0, 0o040755), ("/opt/htc/htc-agent", 0, 0o100755)];
        let p = Path::new("/opt/htc/htc-agent");
        assert_eq!(check_agent_path_with(p, p, meta_table(&safe)), Ok(()));

        let with = |path: &str, uid: u32, mode: u32| {
            let mut t = safe.to_vec();
            for e in t.iter_mut() {
                if e.0 == path {
                    *e = (e.0, uid, mode);
                }
            }
            match check_agent_path_with(p, p, meta_table(&t)) {
                Err(AgentPathError::Unsafe(m)) => m,
                other => panic!("{path} {uid} {mode:o}: {other:?}"),
            }
        };
        assert!(with("/opt/htc/htc-agent", 1001, 0o100755).contains("file /opt/htc/htc-agent is owned by uid 1001"));
        assert!(with("/opt/htc/htc-agent", 0, 0o100775).contains("writable by group or others (mode 0775)"));
        assert!(with("/opt/htc/htc-agent", 0, 0o100757).contains("writable by group or others"));
        assert!(with("/opt/htc/htc-agent", 0, 0o104755).contains("set-user-ID"));
        assert!(with("/opt/htc/htc-agent", 0, 0o102755).contains("set-group-ID"));
        assert!(with("/opt/htc/htc-agent", 0, 0o040755).contains("not a regular file"));
        assert!(with("/opt/htc", 1001, 0o040755).contains("directory /opt/htc is owned by uid 1001"));
        assert!(with("/opt", 0, 0o041777).contains("directory /opt is writable by group or others (mode 1777)"));
        assert!(with("/", 0, 0o040775).contains("directory / is writable"));

        // The message names both the configured and the resolved path.
        let link = Path::new("/usr/local/bin/htc-agent");
        let t = [
            ("/", 0, 0o040755),
            ("/opt", 0, 0o040755),
            ("/opt/htc", 1001, 0o040755),
            ("/opt/htc/htc-agent", 0, 0o100755),
        ];
        let e = check_agent_path_with(link, p, meta_table(&t)).unwrap_err().to_string();
        assert!(e.starts_with("resolves to /opt/htc/htc-agent: directory /opt/htc is owned by uid 1001"), "{e}");
        // A directory that cannot be examined is not "safe".
        let t = [("/opt/htc/htc-agent", 0, 0o100755)];
        assert!(matches!(check_agent_path_with(p, p, meta_table(&t)), Err(AgentPathError::Inaccessible(_))));
        assert!(matches!(
            check_agent_path_with(p, Path::new("rel"), meta_table(&safe)),
            Err(AgentPathError::Unsafe(_))
        ));
    }

    #[test]
    fn agent_path_on_this_machine() {
        match check_agent_path(Path::new("/nonexistent/htc-agent")) {
            Err(AgentPathError::NotFound(m)) => assert!(m.contains("No such file"), "{m}"),
            other => panic!("{other:?}"),
        }
        // A file in a world-writable directory (the temp dir) is never acceptable.
        let dir = std::env::temp_dir().join(format!("spank-htc-agent-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("htc-agent");
        std::fs::write(&f, b"#!/bin/sh\n").unwrap();
        assert!(matches!(check_agent_path(&f), Err(AgentPathError::Unsafe(_))));
        std::fs::remove_dir_all(&dir).unwrap();
        // /bin/sh is root's on any sane system (and /bin may be a symlink to usr/bin).
        let sh = check_agent_path(Path::new("/bin/sh"));
        assert!(sh.is_ok(), "{sh:?}");
        assert!(!sh.unwrap().as_os_str().is_empty());
    }

    #[test]
    fn identity_rules() {
        let id = Identity { uids: [1001; 3], gids: [1001; 3], groups: vec![1001, 2000] };
        assert_eq!(check_identity(&id, 1001, 1001, &[1001, 2000]), Ok(()));
        assert_eq!(check_identity(&id, 1001, 1001, &[2000]), Ok(()));
        let e = check_identity(&id, 1001, 1001, &[]).unwrap_err();
        assert!(e.contains("supplementary group 2000"), "{e}");
        let e = check_identity(&Identity { uids: [1001, 1001, 0], ..id.clone() }, 1001, 1001, &[2000]).unwrap_err();
        assert!(e.contains("uid 1001/1001/0 (real/effective/saved) is not the job's uid 1001"), "{e}");
        let e = check_identity(&Identity { uids: [0; 3], ..id.clone() }, 1001, 1001, &[2000]).unwrap_err();
        assert!(e.contains("is not the job's uid"), "{e}");
        let e = check_identity(&Identity { gids: [1001, 0, 1001], ..id.clone() }, 1001, 1001, &[2000]).unwrap_err();
        assert!(e.contains("gid 1001/0/1001"), "{e}");
        let e =
            check_identity(&Identity { groups: vec![0, 1001], ..id.clone() }, 1001, 1001, &[1001, 2000]).unwrap_err();
        assert!(e.contains("supplementary group 0"), "{e}");
        // root's own job (submitted by root) is root's business.
        let root = Identity { uids: [0; 3], gids: [0; 3], groups: vec![0] };
        assert_eq!(check_identity(&root, 0, 0, &[0]), Ok(()));
    }

    #[test]
    fn private_env_filter() {
        for e in [
            "SLURM_SPANK_HTC_FILE=/t",
            "SLURM_SPANK_HTC_RETRIES=2",
            "_SLURM_SPANK_OPTION_htc_htc=t.txt",
            "_SLURM_SPANK_OPTION_htc_htc_retries=2",
            "SLURM_SPANK__SLURM_SPANK_OPTION_htc_htc=t.txt",
            "SPANK__SLURM_SPANK_OPTION_htc_htc=t.txt",
            "SPANK_HTC_FILE=/t",
        ] {
            assert!(is_private_env(e.as_bytes()), "{e}");
        }
        for e in [
            "HTC_FILE=/t",
            "PATH=/bin",
            "SLURM_JOB_ID=1",
            "SLURM_SPANK__SLURM_SPANK_OPTION_other_htc=x",
            "SLURM_SPANK_HTCX=1",
            "_SLURM_SPANK_OPTION_htcx_a=1",
            "HOME",
        ] {
            assert!(!is_private_env(e.as_bytes()), "{e}");
        }
        for e in [
            "SLURM_SPANK_HTC_JOIN=1234",
            "SLURM_SPANK_HTC_GROW=3:1:30",
            "_SLURM_SPANK_OPTION_htc_htc_grow=3:1:30",
            "_SLURM_SPANK_OPTION_htc_htc_join=1234",
            "SLURM_SPANK__SLURM_SPANK_OPTION_htc_htc_join=1234",
        ] {
            assert!(is_private_env(e.as_bytes()), "{e}");
        }
        let env: Vec<&[u8]> = vec![b"A=1", b"SLURM_SPANK_HTC_FILE=/x=y", b"B=2", b"_SLURM_SPANK_OPTION_htc_htc=t"];
        assert_eq!(private_env_names(env), os(&["SLURM_SPANK_HTC_FILE", "_SLURM_SPANK_OPTION_htc_htc"]));
    }
}
