//! Host paths seen through a host root, and what every backend is given to find its devices.
//!
//! The daemon usually runs in a container with the host's `/` mounted somewhere (or reaches it
//! through `/proc/1/root`). A [`HostFs`] reads host paths beneath that root and resolves symbolic
//! links the way the host would — but an absolute link target or a `..` never leaves the root, so
//! a hostile or broken tree cannot make a backend read the container's own files. Every error
//! names the host path it is about.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::fmt;
use std::io;
use std::path::{Component, Path, PathBuf};

mod parsers;
mod pci_placement;

pub use parsers::{UeventError, parse_dec, parse_hex, parse_uevent};
pub use pci_placement::{pci_function_of, pcie_root_of};

/// How many symbolic links one resolution may follow (the kernel's own limit).
const MAX_LINKS: usize = 40;

/// Reading or resolving a host path failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HostFsError {
    /// The path could not be read, resolved or written.
    #[error("{}: {error}", path.display())]
    Io {
        /// The host path (as on the host, not under the root).
        path: PathBuf,
        /// What kind of failure it was.
        kind: io::ErrorKind,
        /// The operating system's message.
        error: String,
    },
    /// The file was read but does not hold what was expected.
    #[error("{}: {1} is not {expected}", path.display(), crate::echo::echo(.value))]
    Parse {
        /// The host path.
        path: PathBuf,
        /// What the file held (trimmed, cut to 64 characters).
        value: String,
        /// What it should have held, e.g. "a hexadecimal number".
        expected: &'static str,
    },
    /// Resolving the path followed too many symbolic links (a loop).
    #[error("{}: too many levels of symbolic links", path.display())]
    Loop {
        /// The host path.
        path: PathBuf,
    },
}

impl HostFsError {
    /// Whether the path (or a component of it) does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, HostFsError::Io { kind, .. } if *kind == io::ErrorKind::NotFound)
    }

    /// Whether the path is absent: it does not exist, or a component on its way is not a
    /// directory.
    fn is_absent(&self) -> bool {
        matches!(self, HostFsError::Io { kind, .. }
            if matches!(kind, io::ErrorKind::NotFound | io::ErrorKind::NotADirectory))
    }

    fn io(path: &Path, e: &io::Error) -> Self {
        HostFsError::Io {
            path: path.to_path_buf(),
            kind: e.kind(),
            error: e.to_string(),
        }
    }

    fn parse(path: &Path, value: &str, expected: &'static str) -> Self {
        HostFsError::Parse {
            path: path.to_path_buf(),
            value: value.chars().take(64).collect(),
            expected,
        }
    }
}

/// The host's file system beneath a root directory (`/`, `/proc/1/root`, or a test's fake root).
///
/// All methods take host paths written as on the host (`/sys/bus/pci/devices`); a relative path
/// is taken relative to the host's `/`.
#[derive(Clone, PartialEq, Eq)]
pub struct HostFs {
    root: PathBuf,
}

impl fmt::Debug for HostFs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HostFs({})", self.root.display())
    }
}

impl HostFs {
    /// The host file system under `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        HostFs { root: root.into() }
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The path on this machine of `host_path`, without resolving any symbolic link; `..`
    /// components are dropped so the result stays under the root.
    pub fn join(&self, host_path: impl AsRef<Path>) -> PathBuf {
        let mut out = self.root.clone();
        for c in host_path.as_ref().components() {
            if let Component::Normal(n) = c {
                out.push(n);
            }
        }
        out
    }

    /// The canonical host path of `host_path`: every symbolic link followed, with absolute link
    /// targets and `..` resolved inside the root. The path must exist.
    pub fn canonicalize(&self, host_path: impl AsRef<Path>) -> Result<PathBuf, HostFsError> {
        let host_path = host_path.as_ref();
        let mut resolved = PathBuf::from("/");
        let mut rest: VecDeque<OsString> = VecDeque::new();
        push_front_components(&mut rest, host_path);
        let mut links = 0usize;
        while let Some(name) = rest.pop_front() {
            if name == ".." {
                resolved.pop();
                continue;
            }
            let candidate = resolved.join(&name);
            let real = self.join(&candidate);
            let meta = std::fs::symlink_metadata(&real).map_err(|e| {
                let mut p = candidate.clone();
                p.extend(rest.iter());
                HostFsError::io(&p, &e)
            })?;
            if meta.file_type().is_symlink() {
                links += 1;
                if links > MAX_LINKS {
                    return Err(HostFsError::Loop {
                        path: host_path.to_path_buf(),
                    });
                }
                let target =
                    std::fs::read_link(&real).map_err(|e| HostFsError::io(&candidate, &e))?;
                if target.is_absolute() {
                    resolved = PathBuf::from("/");
                }
                push_front_components(&mut rest, &target);
            } else {
                resolved = candidate;
            }
        }
        Ok(resolved)
    }

    /// The path on this machine to open for `host_path`, symbolic links resolved inside the root.
    pub fn resolve(&self, host_path: impl AsRef<Path>) -> Result<PathBuf, HostFsError> {
        Ok(self.join(self.canonicalize(host_path)?))
    }

    /// Whether `host_path` exists (after resolving links inside the root).
    pub fn exists(&self, host_path: impl AsRef<Path>) -> bool {
        self.canonicalize(host_path).is_ok()
    }

    /// Whether `host_path` exists, telling "no" (it, or a directory on its way, is missing)
    /// from "cannot tell" (the error: permission denied, a link loop, an I/O error).
    pub fn presence(&self, host_path: impl AsRef<Path>) -> Result<bool, HostFsError> {
        match self.canonicalize(host_path) {
            Ok(_) => Ok(true),
            Err(e) if e.is_absent() => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The whole content of a file.
    pub fn read_to_string(&self, host_path: impl AsRef<Path>) -> Result<String, HostFsError> {
        let host_path = host_path.as_ref();
        let real = self.resolve(host_path)?;
        std::fs::read_to_string(real).map_err(|e| HostFsError::io(host_path, &e))
    }

    /// A sysfs attribute: the file's content with surrounding white space removed.
    pub fn read_attr(&self, host_path: impl AsRef<Path>) -> Result<String, HostFsError> {
        Ok(self.read_to_string(host_path)?.trim().to_string())
    }

    /// A sysfs attribute that may be absent: `None` when the file does not exist.
    pub fn read_attr_opt(
        &self,
        host_path: impl AsRef<Path>,
    ) -> Result<Option<String>, HostFsError> {
        match self.read_attr(host_path) {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// A hexadecimal attribute such as `vendor` (`0x10de`) or `idVendor` (`046d`).
    pub fn read_hex(&self, host_path: impl AsRef<Path>) -> Result<u64, HostFsError> {
        let host_path = host_path.as_ref();
        let v = self.read_attr(host_path)?;
        parse_hex(&v).ok_or_else(|| HostFsError::parse(host_path, &v, "a hexadecimal number"))
    }

    /// A decimal attribute such as `numa_node` (`-1`) or `busnum` (`3`).
    pub fn read_dec(&self, host_path: impl AsRef<Path>) -> Result<i64, HostFsError> {
        let host_path = host_path.as_ref();
        let v = self.read_attr(host_path)?;
        parse_dec(&v).ok_or_else(|| HostFsError::parse(host_path, &v, "a decimal number"))
    }

    /// The last component of a symbolic link's target, e.g. `vfio-pci` for a PCI function's
    /// `driver` link or `12` for its `iommu_group` link. The link itself is not followed.
    pub fn read_link_name(&self, host_path: impl AsRef<Path>) -> Result<String, HostFsError> {
        let host_path = host_path.as_ref();
        let (parent, name) = match (host_path.parent(), host_path.file_name()) {
            (Some(p), Some(n)) => (p, n),
            _ => {
                return Err(HostFsError::parse(
                    host_path,
                    &host_path.to_string_lossy(),
                    "a symbolic link",
                ));
            }
        };
        let real = self.resolve(parent)?.join(name);
        let target = std::fs::read_link(&real).map_err(|e| HostFsError::io(host_path, &e))?;
        target
            .file_name()
            .and_then(|n| n.to_str())
            .map(str::to_string)
            .ok_or_else(|| {
                HostFsError::parse(
                    host_path,
                    &target.to_string_lossy(),
                    "a link to a named entry",
                )
            })
    }

    /// The names of a directory's entries, sorted; names that are not UTF-8 are left out.
    pub fn list_dir(&self, host_path: impl AsRef<Path>) -> Result<Vec<String>, HostFsError> {
        let host_path = host_path.as_ref();
        let real = self.resolve(host_path)?;
        let rd = std::fs::read_dir(real).map_err(|e| HostFsError::io(host_path, &e))?;
        let mut names = Vec::new();
        for entry in rd {
            let entry = entry.map_err(|e| HostFsError::io(host_path, &e))?;
            if let Ok(n) = entry.file_name().into_string() {
                names.push(n);
            }
        }
        names.sort();
        Ok(names)
    }

    /// Writes `value` to an existing attribute (e.g. `driver_override`, `bind`, an mdev
    /// `create`); the file is never created.
    pub fn write_attr(&self, host_path: impl AsRef<Path>, value: &str) -> Result<(), HostFsError> {
        use std::io::Write;
        let host_path = host_path.as_ref();
        let real = self.resolve(host_path)?;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(real)
            .map_err(|e| HostFsError::io(host_path, &e))?;
        f.write_all(value.as_bytes())
            .map_err(|e| HostFsError::io(host_path, &e))
    }
}

fn push_front_components(rest: &mut VecDeque<OsString>, path: &Path) {
    let parts: Vec<OsString> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            Component::ParentDir => Some(OsString::from("..")),
            _ => None,
        })
        .collect();
    for p in parts.into_iter().rev() {
        rest.push_front(p);
    }
}

/// What the daemon gives every backend: the host file system, a directory for the backend's own
/// crash-safe records, and the node's name.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct BackendContext {
    /// The host's file system.
    pub host: HostFs,
    /// A directory only this backend writes (created by the daemon).
    pub state_dir: PathBuf,
    /// The Kubernetes node this daemon serves.
    pub node_name: String,
}

impl BackendContext {
    /// The context of a backend on node `node_name`, reading the host through `host`, keeping
    /// its own records in `state_dir` (which the daemon creates).
    pub fn new(host: HostFs, state_dir: impl Into<PathBuf>, node_name: impl Into<String>) -> Self {
        BackendContext {
            host,
            state_dir: state_dir.into(),
            node_name: node_name.into(),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
