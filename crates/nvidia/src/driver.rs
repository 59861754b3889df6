//! The user-space side of the NVIDIA driver a container needs besides device nodes: the
//! driver's libraries, tools, firmware and sockets, found under the configured driver root for
//! the version the kernel module runs, and the mounts (and optional hooks) that make them
//! usable in a container made of only a CDI spec.
//!
//! What is looked for, relative to the driver root (`/` on plain installs,
//! `/run/nvidia/driver` where the GPU Operator installs the driver):
//!
//! - **libraries**: the directory holding `libcuda.so.<version>` (else `libnvidia-ml.so.<version>`)
//!   among the usual library directories, and every `lib*.so.<version>` in it and in its `vdpau`
//!   subdirectory. 32-bit libraries are never mounted. Each is mounted under its own name and
//!   under every name the host links to it (`libcuda.so.1`, `libcuda.so`), so the loader finds
//!   it by SONAME without a symbolic link or `ldconfig` in the container;
//! - **binaries**: `nvidia-smi`, `nvidia-debugdump`, `nvidia-persistenced`,
//!   `nvidia-cuda-mps-control`, `nvidia-cuda-mps-server`: ELF executables (a wrapper script that
//!   runs the real tool from elsewhere does not work in a container), looked for first in the
//!   `bin` directory beside the library directory (`/usr/local/nvidia/bin` for
//!   `/usr/local/nvidia/lib64`), then in the usual `bin` directories;
//! - **firmware**: `nvidia/<version>/` (GSP firmware) in the kernel's custom firmware path,
//!   `lib/firmware/updates` or `lib/firmware`;
//! - **sockets**: the `nvidia-persistenced` and `nvidia-fabricmanager` sockets under `/run` or
//!   `/var/run`.
//!
//! Where they go in the container depends on [`LibraryLayout`]. With a `cdiHookPath`, the spec
//! also runs NVIDIA's `nvidia-cdi-hook` (`create-symlinks`, `update-ldcache`) so any image finds
//! the libraries through its loader cache.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use kubedev_core::{ContainerEdits, Hook, HostFs, Mount};
use serde::{Deserialize, Serialize};

/// Where the driver's libraries and tools are mounted in a container.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum LibraryLayout {
    /// At the host's paths with the driver root taken off (`/usr/lib/x86_64-linux-gnu/libcuda.so.1`,
    /// `/usr/bin/nvidia-smi`), as NVIDIA's container toolkit mounts them. Without hooks the
    /// loader finds them when the image searches the host's library directory by default
    /// (Debian and Ubuntu images on a Debian or Ubuntu host); with hooks, in any image.
    #[default]
    Host,
    /// Libraries in `/usr/local/nvidia/lib64`, tools in `/usr/local/nvidia/bin`: found by images
    /// that put those directories on `LD_LIBRARY_PATH` and `PATH`, as NVIDIA's CUDA base images
    /// do, whatever the host's distribution.
    UsrLocalNvidia,
}

/// The library directories searched, relative to the driver root, in order.
fn library_dirs() -> Vec<String> {
    let triple = match std::env::consts::ARCH {
        "aarch64" => "aarch64-linux-gnu",
        _ => "x86_64-linux-gnu",
    };
    vec![
        String::new(),
        "usr/lib64".into(),
        format!("usr/lib/{triple}"),
        format!("usr/lib/{triple}/nvidia/current"),
        "lib64".into(),
        format!("lib/{triple}"),
        format!("lib/{triple}/nvidia/current"),
        "usr/local/nvidia/lib64".into(),
        "usr/lib".into(),
        "lib".into(),
    ]
}

/// The binary directories searched, relative to the driver root, in order.
const BIN_DIRS: [&str; 7] = [
    "usr/bin",
    "usr/sbin",
    "usr/local/bin",
    "usr/local/sbin",
    "bin",
    "sbin",
    "usr/local/nvidia/bin",
];

/// The kernel's extra firmware directory, when set.
const FIRMWARE_PATH_PARAM: &str = "/sys/module/firmware_class/parameters/path";

/// The driver's tools a container gets.
pub const BINARIES: [&str; 5] = [
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
];

/// Sockets and pipe directories of the driver's daemons, relative to the driver root.
/// (The host-wide MPS pipe directory is not among them: kubedev runs an MPS daemon per claim and
/// gives the claim's own pipe directory.)
const IPC: [&str; 4] = [
    "run/nvidia-persistenced/socket",
    "var/run/nvidia-persistenced/socket",
    "run/nvidia-fabricmanager/socket",
    "var/run/nvidia-fabricmanager/socket",
];

/// The names a library must answer to even when the host has no link for them.
const REQUIRED_ALIASES: [(&str, &str); 2] = [
    ("libcuda.so.", "libcuda.so.1"),
    ("libnvidia-ml.so.", "libnvidia-ml.so.1"),
];

/// Options of read-only driver file mounts.
const RO_OPTIONS: [&str; 5] = ["ro", "nosuid", "nodev", "rbind", "rprivate"];
/// Options of socket mounts (writable: clients connect).
const IPC_OPTIONS: [&str; 5] = ["nosuid", "nodev", "noexec", "rbind", "rprivate"];

/// One library of the driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Library {
    /// The file on the host (canonical host path, driver root included).
    pub host_path: PathBuf,
    /// Its directory in the container.
    pub container_dir: PathBuf,
    /// Its file name, `lib<name>.so.<version>`.
    pub name: String,
    /// Other names the container must find it under (`libcuda.so.1`, `libcuda.so`).
    pub aliases: Vec<String>,
}

/// The driver's user-space files on this host for one driver version.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DriverFiles {
    /// The driver version the files belong to.
    pub version: String,
    /// Libraries.
    pub libraries: Vec<Library>,
    /// Tools: (host path, container path).
    pub binaries: Vec<(PathBuf, PathBuf)>,
    /// The firmware directory: (host path, container path).
    pub firmware: Option<(PathBuf, PathBuf)>,
    /// Sockets and pipe directories: (host path, container path).
    pub ipc: Vec<(PathBuf, PathBuf)>,
    /// The `nvidia-cdi-hook` to run, when hooks are used.
    pub hook: Option<PathBuf>,
    /// What was looked for and not found (for the log).
    pub missing: Vec<String>,
}

/// How to find the driver's files.
#[derive(Debug, Clone)]
pub(crate) struct DriverLocation<'a> {
    /// The host file system kubedev sees.
    pub(crate) host: &'a HostFs,
    /// The driver root, a host path.
    pub(crate) root: &'a Path,
    /// Where the files go in the container.
    pub(crate) layout: LibraryLayout,
    /// The hook program, a host path, when hooks are wanted.
    pub(crate) hook: Option<&'a Path>,
}

/// `root` joined with the relative `rel` (a host path).
fn under(root: &Path, rel: &str) -> PathBuf {
    if rel.is_empty() {
        root.to_path_buf()
    } else {
        root.join(rel)
    }
}

/// The container path of host path `p`: `p` with the driver root taken off.
fn strip_root(root: &Path, p: &Path) -> PathBuf {
    match p.strip_prefix(root) {
        Ok(rel) => Path::new("/").join(rel),
        Err(_) => p.to_path_buf(),
    }
}

impl DriverLocation<'_> {
    /// The container path of host path `p`: `p` with the driver root taken off, whether `p`
    /// is written under the driver root as configured or under where its links lead.
    fn container_path(&self, p: &Path) -> PathBuf {
        if p.starts_with(self.root) {
            return strip_root(self.root, p);
        }
        match self.canonical(self.root) {
            Some(real) if p.starts_with(&real) => strip_root(&real, p),
            _ => p.to_path_buf(),
        }
    }

    /// The host path `p` with every link resolved inside the host root; `None` when it does
    /// not exist.
    fn canonical(&self, p: &Path) -> Option<PathBuf> {
        self.host.canonicalize(p).ok()
    }

    /// The metadata of host path `p`, links resolved inside the host root (an absolute link
    /// such as `/lib64 -> /usr/lib64` stays on the host, not in kubedev's own file system).
    fn metadata(&self, p: &Path) -> Option<std::fs::Metadata> {
        std::fs::metadata(self.host.resolve(p).ok()?).ok()
    }

    fn is_file(&self, p: &Path) -> bool {
        self.metadata(p).is_some_and(|m| m.is_file())
    }

    fn is_executable(&self, p: &Path) -> bool {
        use std::os::unix::fs::PermissionsExt as _;
        self.metadata(p)
            .is_some_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    }

    /// An executable ELF file (not a script).
    fn is_elf_executable(&self, p: &Path) -> bool {
        use std::io::Read as _;
        let mut magic = [0u8; 4];
        self.is_executable(p)
            && self
                .host
                .resolve(p)
                .ok()
                .and_then(|real| std::fs::File::open(real).ok())
                .is_some_and(|mut f| f.read_exact(&mut magic).is_ok() && magic == *b"\x7fELF")
    }

    /// Finds the files of driver `version`. Never fails: what is absent is listed in
    /// [`DriverFiles::missing`].
    pub(crate) fn find(&self, version: &str) -> DriverFiles {
        let mut out = DriverFiles {
            version: version.to_owned(),
            ..DriverFiles::default()
        };
        if !is_safe_version(version) {
            out.missing.push(format!(
                "driver files: the driver version {version:?} is not a plain version string"
            ));
            return out;
        }
        let lib_dir = self.find_libraries(version, &mut out);
        self.find_binaries(lib_dir.as_deref(), &mut out);
        self.find_firmware(version, &mut out);
        let mut seen_ipc = BTreeSet::new();
        for rel in IPC {
            let p = under(self.root, rel);
            // `/run` and `/var/run` are usually one directory: mount the socket once.
            let name = rel.trim_start_matches("var/");
            if seen_ipc.contains(name) {
                continue;
            }
            if let Some(c) = self.canonical(&p) {
                seen_ipc.insert(name.to_owned());
                out.ipc.push((c, self.container_path(&p)));
            }
        }
        if let Some(h) = self.hook {
            if self.is_executable(h) {
                out.hook = Some(h.to_path_buf());
            } else {
                out.missing.push(format!(
                    "the CDI hook {} (no executable file there; the spec has no hooks)",
                    h.display()
                ));
            }
        }
        out
    }

    /// The firmware directory `nvidia/<version>` in the kernel's custom firmware path (sysfs
    /// `firmware_class.path`), `lib/firmware/updates` or `lib/firmware` under the driver root.
    fn find_firmware(&self, version: &str, out: &mut DriverFiles) {
        let custom = self
            .host
            .read_attr_opt(FIRMWARE_PATH_PARAM)
            .ok()
            .flatten()
            .filter(|p| p.starts_with('/'));
        let mut tried = Vec::new();
        let bases = custom
            .iter()
            .map(|c| under(self.root, c.trim_start_matches('/')))
            .chain(["lib/firmware/updates", "lib/firmware"].map(|b| under(self.root, b)));
        for base in bases {
            let fw = base.join("nvidia").join(version);
            if let Some(c) = self.canonical(&fw)
                && self.host.join(&c).is_dir()
            {
                let container = self.container_path(&fw);
                out.firmware = Some((c, container));
                return;
            }
            tried.push(fw.display().to_string());
        }
        out.missing.push(format!("firmware ({})", tried.join(", ")));
    }

    /// Finds the libraries; returns their directory (a canonical host path).
    fn find_libraries(&self, version: &str, out: &mut DriverFiles) -> Option<PathBuf> {
        let suffix = format!(".so.{version}");
        let mut dir = None;
        'find: for anchor in ["libcuda", "libnvidia-ml"] {
            for rel in library_dirs() {
                let d = under(self.root, &rel);
                let candidate = d.join(format!("{anchor}{suffix}"));
                if self.is_file(&candidate) {
                    dir = self.canonical(&d);
                    if dir.is_some() {
                        break 'find;
                    }
                }
            }
        }
        let Some(dir) = dir else {
            out.missing.push(format!(
                "libraries: no libcuda{suffix} or libnvidia-ml{suffix} under {} ({})",
                self.root.display(),
                library_dirs()
                    .iter()
                    .map(|d| format!("/{d}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
            return None;
        };
        for d in [dir.clone(), dir.join("vdpau")] {
            let Ok(names) = self.host.list_dir(&d) else {
                continue;
            };
            let container_dir = match self.layout {
                LibraryLayout::Host => self.container_path(&d),
                LibraryLayout::UsrLocalNvidia => {
                    let base = PathBuf::from("/usr/local/nvidia/lib64");
                    if d == dir { base } else { base.join("vdpau") }
                }
            };
            for name in &names {
                if !(name.starts_with("lib") && name.ends_with(&suffix)) {
                    continue;
                }
                let p = d.join(name);
                let real = self.host.join(&p);
                let Ok(meta) = std::fs::symlink_metadata(&real) else {
                    continue;
                };
                if !meta.is_file() {
                    continue;
                }
                let aliases = self.aliases(&d, &names, name);
                out.libraries.push(Library {
                    host_path: p,
                    container_dir: container_dir.clone(),
                    name: name.clone(),
                    aliases,
                });
            }
        }
        Some(dir)
    }

    /// The names in `names` (entries of `dir`) that are links to `target`, directly or through
    /// another such link, plus the SONAMEs a container always needs.
    fn aliases(&self, dir: &Path, names: &[String], target: &str) -> Vec<String> {
        let mut found: BTreeSet<String> = BTreeSet::new();
        let mut frontier = vec![target.to_owned()];
        while let Some(t) = frontier.pop() {
            for n in names {
                if n == target || found.contains(n) {
                    continue;
                }
                let Ok(link) = std::fs::read_link(self.host.join(dir.join(n))) else {
                    continue;
                };
                if link.file_name().and_then(|f| f.to_str()) == Some(t.as_str()) {
                    found.insert(n.clone());
                    frontier.push(n.clone());
                }
            }
        }
        for (prefix, soname) in REQUIRED_ALIASES {
            if target.starts_with(prefix) {
                found.insert(soname.to_owned());
            }
        }
        found.into_iter().collect()
    }

    fn find_binaries(&self, lib_dir: Option<&Path>, out: &mut DriverFiles) {
        let beside = lib_dir.and_then(Path::parent).map(|p| p.join("bin"));
        let dirs: Vec<PathBuf> = beside
            .into_iter()
            .chain(BIN_DIRS.iter().map(|rel| under(self.root, rel)))
            .collect();
        for bin in BINARIES {
            let found = dirs.iter().find_map(|d| {
                let p = d.join(bin);
                self.is_elf_executable(&p).then_some(p)
            });
            match found {
                Some(p) => {
                    let container = match self.layout {
                        LibraryLayout::Host => self.container_path(&p),
                        LibraryLayout::UsrLocalNvidia => {
                            Path::new("/usr/local/nvidia/bin").join(bin)
                        }
                    };
                    let host = self.canonical(&p).unwrap_or(p);
                    out.binaries.push((host, container));
                }
                None => {
                    let script = dirs
                        .iter()
                        .map(|d| d.join(bin))
                        .find(|p| self.is_executable(p));
                    out.missing.push(match script {
                        Some(p) => format!(
                            "binary {bin} (only a script at {}, not the tool itself)",
                            p.display()
                        ),
                        None => format!("binary {bin}"),
                    });
                }
            }
        }
    }
}

/// A driver version safe to put in a path: digits and dots (`580.159.04`), as NVML reports it.
fn is_safe_version(v: &str) -> bool {
    !v.is_empty()
        && v.len() <= 64
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-')
        && !v.contains("..")
        && !v.starts_with('.')
}

fn path_string(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

fn mount(host: &Path, container: &Path, options: &[&str]) -> Mount {
    Mount::new(path_string(host), path_string(container))
        .with_options(options.iter().map(|o| (*o).to_owned()).collect())
        .with_type("bind")
}

impl DriverFiles {
    /// True when nothing was found.
    pub fn is_empty(&self) -> bool {
        self.libraries.is_empty()
            && self.binaries.is_empty()
            && self.firmware.is_none()
            && self.ipc.is_empty()
    }

    /// The mounts (and hooks) that give a container these files.
    pub fn edits(&self) -> ContainerEdits {
        let mut e = ContainerEdits::default();
        let mut links = Vec::new();
        let mut dirs: BTreeSet<String> = BTreeSet::new();
        for lib in &self.libraries {
            let target = lib.container_dir.join(&lib.name);
            e.mounts.push(mount(&lib.host_path, &target, &RO_OPTIONS));
            dirs.insert(path_string(&lib.container_dir));
            for alias in &lib.aliases {
                let at = lib.container_dir.join(alias);
                if self.hook.is_some() {
                    links.push(format!("{}::{}", lib.name, path_string(&at)));
                } else {
                    e.mounts.push(mount(&lib.host_path, &at, &RO_OPTIONS));
                }
            }
        }
        for (host, container) in &self.binaries {
            e.mounts.push(mount(host, container, &RO_OPTIONS));
        }
        if let Some((host, container)) = &self.firmware {
            e.mounts.push(mount(host, container, &RO_OPTIONS));
        }
        for (host, container) in &self.ipc {
            e.mounts.push(mount(host, container, &IPC_OPTIONS));
        }
        if let Some(hook) = &self.hook {
            let hook_path = path_string(hook);
            if !links.is_empty() {
                let mut args = vec!["nvidia-cdi-hook".to_owned(), "create-symlinks".to_owned()];
                for l in links {
                    args.push("--link".into());
                    args.push(l);
                }
                e.hooks
                    .push(Hook::new("createContainer", hook_path.clone()).with_args(args));
            }
            if !dirs.is_empty() {
                let mut args = vec!["nvidia-cdi-hook".to_owned(), "update-ldcache".to_owned()];
                for d in dirs {
                    args.push("--folder".into());
                    args.push(d);
                }
                e.hooks
                    .push(Hook::new("createContainer", hook_path).with_args(args));
            }
        }
        e
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
