//! Finding the programs the harness runs (podman, runc, a static busybox, `unshare`) and what
//! the podman found can read.

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::PodmanError;

/// The programs the harness runs, found on the machine.
#[derive(Debug, Clone)]
pub struct Tools {
    /// podman.
    pub podman: PathBuf,
    /// podman's version, e.g. `4.3.1`.
    pub podman_version: String,
    /// runc (podman finds it itself; checked so a missing one is named).
    pub runc: PathBuf,
    /// A statically linked busybox, copied into the root filesystem.
    pub busybox: PathBuf,
    /// util-linux `unshare`, for the private mount namespace.
    pub unshare: PathBuf,
}

/// Directories searched besides `PATH` (root's `sbin` directories may be missing from it).
const EXTRA_PATH: [&str; 6] = [
    "/usr/local/sbin",
    "/usr/local/bin",
    "/usr/sbin",
    "/usr/bin",
    "/sbin",
    "/bin",
];

/// The `PATH` podman and the namespace script run with.
pub(super) const RUN_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(EXTRA_PATH.iter().map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.mode() & 0o111 != 0))
}

/// Whether the ELF file at `path` has no program interpreter (is statically linked). `None`
/// when it is not an ELF file this can read.
pub(super) fn is_static_elf(path: &Path) -> Option<bool> {
    let bytes = std::fs::read(path).ok()?;
    if bytes.get(..4)? != b"\x7fELF" {
        return None;
    }
    let little = *bytes.get(5)? == 1;
    let num = |at: usize, len: usize| -> Option<u64> {
        let b = bytes.get(at..at + len)?;
        let mut v = 0u64;
        for i in 0..len {
            let byte = if little { b[len - 1 - i] } else { b[i] };
            v = (v << 8) | u64::from(byte);
        }
        Some(v)
    };
    let (phoff, phentsize, phnum) = match bytes.get(4)? {
        2 => (num(0x20, 8)?, num(0x36, 2)?, num(0x38, 2)?),
        1 => (num(0x1c, 4)?, num(0x2a, 2)?, num(0x2c, 2)?),
        _ => return None,
    };
    const PT_INTERP: u64 = 3;
    for i in 0..phnum {
        let at = usize::try_from(phoff + i * phentsize).ok()?;
        if num(at, 4)? == PT_INTERP {
            return Some(false);
        }
    }
    Some(true)
}

impl Tools {
    /// Finds the tools and checks that the harness can run (root, a static busybox); the error
    /// names everything missing and how to install it.
    pub fn find() -> Result<Tools, PodmanError> {
        let mut missing = Vec::new();
        if !rustix::process::geteuid().is_root() {
            missing.push("root (podman runs rootful, with private mounts)".to_string());
        }
        let mut find = |name: &str, package: &str| {
            let found = which(name);
            if found.is_none() {
                missing.push(format!("{name} (package {package}; not found on PATH)"));
            }
            found
        };
        let podman = find("podman", "podman");
        let runc = find("runc", "runc");
        let busybox = find("busybox", "busybox-static");
        let unshare = find("unshare", "util-linux");
        let _ = find("mount", "mount");
        if let Some(b) = &busybox
            && is_static_elf(b) != Some(true)
        {
            missing.push(format!(
                "a statically linked busybox ({} is not one: install busybox-static)",
                b.display()
            ));
        }
        let podman_version = podman.as_ref().and_then(|p| {
            let out = Command::new(p).arg("--version").output().ok()?;
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let v = text.split_whitespace().last()?.to_string();
            if v.is_empty() { None } else { Some(v) }
        });
        if podman.is_some() && podman_version.is_none() {
            missing.push("a podman that answers `podman --version`".to_string());
        }
        match (podman, podman_version, runc, busybox, unshare) {
            (Some(podman), Some(podman_version), Some(runc), Some(busybox), Some(unshare))
                if missing.is_empty() =>
            {
                Ok(Tools {
                    podman,
                    podman_version,
                    runc,
                    busybox,
                    unshare,
                })
            }
            _ => Err(PodmanError::Missing {
                missing: missing.join(", "),
            }),
        }
    }

    /// The newest `cdiVersion` this podman is known to read: `0.5.0` for podman 4 before 4.7
    /// (its CDI library predates spec 0.6.0; measured with 4.3.1, which ignores 0.6.0, 0.7.0,
    /// 0.8.0 and 1.0.0 files), none known otherwise.
    pub fn max_cdi_version(&self) -> Option<&'static str> {
        let v = parse_version(&self.podman_version)?;
        (v.0 < 4 || (v.0 == 4 && v.1 < 7)).then_some("0.5.0")
    }
}

/// `major.minor.patch` (anything after a `-` or `+` ignored; a missing part is 0).
pub(super) fn parse_version(v: &str) -> Option<(u64, u64, u64)> {
    let core = v.split(['-', '+', '~']).next()?;
    let mut parts = core.split('.').map(|p| p.parse::<u64>());
    let major = parts.next()?.ok()?;
    let minor = parts.next().transpose().ok()?.unwrap_or(0);
    let patch = parts.next().transpose().ok()?.unwrap_or(0);
    Some((major, minor, patch))
}
