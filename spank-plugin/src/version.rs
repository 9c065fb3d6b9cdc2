//! The version guard's pure logic: which Slurm release is loading the plugin, and what the
//! plugin claims to be so that Slurm's loader accepts it.
//!
//! Slurm's loader (`plugin_load_from_file` → `_verify_syms` in src/common/plugin.c, the same
//! from 22.05 to 26.x) first `dlopen`s the plugin, which runs its ELF constructors, and only
//! then reads the `plugin_version` symbol and compares its major.minor (mask `0xffff00` for
//! SPANK plugins) with the `SLURM_VERSION_NUMBER` it was itself compiled with. A constructor
//! can therefore learn the host's release and, when it differs from the one the plugin was
//! built for, claim the host's release and switch the plugin to its inert mode.
//!
//! The host's release comes from `slurm_api_version()`, exported by libslurmfull (and
//! libslurm) in every Slurm process that loads SPANK plugins. It returns the library's
//! libtool version (`META`'s `API_CURRENT` − `API_AGE`, `API_AGE`, `API_REVISION`), and
//! `API_CURRENT` has moved in lock-step with the release: one step per major.minor, the same
//! for every micro release of it (checked for every tag from 20.02 to 26.05).

use std::fmt;

/// A Slurm release as `SLURM_VERSION_NUMBER` encodes it: `0xMMmmuu` (22.05.8 = `0x160508`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Release {
    pub major: u32,
    pub minor: u32,
}

impl Release {
    pub fn from_version_number(v: u32) -> Release {
        Release { major: (v >> 16) & 0xff, minor: (v >> 8) & 0xff }
    }

    /// The value `plugin_version` must hold to be accepted by this release (micro is not
    /// compared for SPANK plugins).
    pub fn version_number(self) -> u32 {
        (self.major << 16) | (self.minor << 8)
    }
}

impl fmt::Display for Release {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:02}", self.major, self.minor)
    }
}

/// The release whose libslurm has this `slurm_api_version()`, or `None` for values that no
/// release is known (or can be expected) to return.
pub fn release_from_api_version(api_version: i64) -> Option<Release> {
    if !(0..=0xff_ffff).contains(&api_version) {
        return None;
    }
    let v = api_version as u32;
    let current = ((v >> 16) & 0xff) + ((v >> 8) & 0xff);
    let (major, minor) = match current {
        35 => (20, 2),
        36 => (20, 11),
        37 => (21, 8),
        38 => (22, 5),
        39 => (23, 2),
        40 => (23, 11),
        // Since 24.05 SchedMD releases every May and November (41 = 24.05 … 46 = 26.11 in
        // their META files); later releases are assumed to keep that rhythm. A wrong guess
        // is harmless: the loader then refuses the plugin, as it would without the guard.
        c if (41..=41 + 2 * 75).contains(&c) => {
            let step = c - 41;
            (24 + step / 2, if step % 2 == 0 { 5 } else { 11 })
        }
        _ => return None,
    };
    Some(Release { major, minor })
}

/// What the plugin does in this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Loaded by the release it was built for (or the host could not be identified, in which
    /// case Slurm's own check decides): full behaviour.
    Normal,
    /// Loaded by another release: `plugin_version` claims `host`, and the plugin only
    /// registers its options in order to refuse them with [`inert_reason`].
    Inert { built: Release, host: Release },
}

/// The guard's decision, from the build's `SLURM_VERSION_NUMBER` and the host's
/// `slurm_api_version()` (`None` when the symbol is missing).
pub fn decide(build_version: u32, host_api_version: Option<i64>) -> Mode {
    let built = Release::from_version_number(build_version);
    match host_api_version.and_then(release_from_api_version) {
        Some(host) if host != built => Mode::Inert { built, host },
        _ => Mode::Normal,
    }
}

/// The one line that explains the inert mode, to users and admins alike.
pub fn inert_reason(built: Release, host: Release) -> String {
    format!(
        "spank_htc.so was built for Slurm {built} but this is Slurm {host}: --htc is disabled until the slurm-htc package built for Slurm {host} is installed"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_and_numbers() {
        let r = Release::from_version_number(0x160508);
        assert_eq!(r, Release { major: 22, minor: 5 });
        assert_eq!(r.to_string(), "22.05");
        assert_eq!(r.version_number(), 0x160500);
        assert_eq!(Release::from_version_number(0x170b03).to_string(), "23.11");
    }

    #[test]
    fn api_versions_of_known_releases() {
        // slurm_api_version() = (API_CURRENT - API_AGE) << 16 | API_AGE << 8 | API_REVISION.
        let known = [
            (35, "20.02"),
            (36, "20.11"),
            (37, "21.08"),
            (38, "22.05"),
            (39, "23.02"),
            (40, "23.11"),
            (41, "24.05"),
            (42, "24.11"),
            (43, "25.05"),
            (44, "25.11"),
            (45, "26.05"),
            (46, "26.11"),
        ];
        for (current, rel) in known {
            let v = (current as i64) << 16;
            assert_eq!(release_from_api_version(v).unwrap().to_string(), rel, "API_CURRENT {current}");
        }
        // Measured on Debian's 22.05.8: 0x260000.
        assert_eq!(release_from_api_version(0x260000), Some(Release { major: 22, minor: 5 }));
        // A non-zero age is added back: current 39 = major 38 + age 1.
        assert_eq!(release_from_api_version(0x260100).unwrap().to_string(), "23.02");
        for bad in [-1, 0, 34 << 16, 1 << 24, i64::MAX] {
            assert_eq!(release_from_api_version(bad), None, "{bad:#x}");
        }
    }

    #[test]
    fn decisions() {
        assert_eq!(decide(0x160508, Some(0x260000)), Mode::Normal);
        assert_eq!(decide(0x160500, None), Mode::Normal);
        assert_eq!(decide(0x160500, Some(7)), Mode::Normal);
        let m = decide(0x170200, Some(0x260000));
        assert_eq!(m, Mode::Inert { built: Release { major: 23, minor: 2 }, host: Release { major: 22, minor: 5 } });
        if let Mode::Inert { built, host } = m {
            assert_eq!(host.version_number(), 0x160500);
            let r = inert_reason(built, host);
            assert!(r.contains("built for Slurm 23.02 but this is Slurm 22.05"), "{r}");
            assert!(r.contains("--htc is disabled until the slurm-htc package built for Slurm 22.05 is installed"));
        }
    }
}
