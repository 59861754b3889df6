//! A real container runtime applying CDI specs in tests: Debian's podman (4.3) with runc, a
//! busybox root filesystem and no image registry. A test installs the spec files kubedev wrote,
//! runs a container asking for their CDI device IDs, and asserts from inside the container what
//! a user relies on.
//!
//! ```no_run
//! use kubedev_testkit::podman::{Container, FakeNode, Podman};
//! # fn main() -> Result<(), kubedev_testkit::podman::PodmanError> {
//! let podman = Podman::new()?; // root, podman, runc and busybox-static, or a clear error
//! let spec = std::fs::read_to_string("/tmp/cdi/k8s.example.com-claim_uid-1.json").unwrap();
//! let installed = podman.install_spec(&spec)?; // in /var/run/cdi until dropped
//! let out = podman.run(
//!     Container::new("stat -c %t:%T /dev/kvm")
//!         .devices(installed.device_ids())
//!         .node(FakeNode::char("/dev/kvm", 10, 232)) // only inside the container's namespace
//!         .check(&spec, &installed.device_names()), // every edit of the spec, checked inside
//! )?;
//! out.assert_ok(); // exit status 0 and no check failed, or a readable report
//! assert_eq!(out.user_stdout().trim(), "a:e8");
//! # Ok(()) }
//! ```
//!
//! How it runs (every choice measured on Debian 12 with podman 4.3.1 and runc 1.1.5):
//!
//! - podman keeps its storage (`--root`, `--runroot`, `--tmpdir`, the `vfs` driver) in a
//!   temporary directory removed with the [`Podman`]; its configuration files are empty ones of
//!   its own, so the host's `containers.conf` and `storage.conf` change nothing; `--network
//!   none`, `--events-backend none`, `--cgroup-manager cgroupfs`, `--runtime runc` (crun fails on
//!   hybrid cgroups), both `--ulimit` flags (podman's default limits are above the hard limits
//!   of many machines), and `--rootfs <dir>:O` so runs never write into the shared root
//!   filesystem.
//! - Each container runs under its own cgroup parent (`kubedev-test-<pid>-<n>`), removed after
//!   the run, so no `libpod_parent` cgroups are left behind.
//! - podman runs in a private mount namespace (`unshare --mount --propagation private`) in
//!   which `/dev` and `/run` are overlays on a private tmpfs: the [`FakeNode`]s a test asks for
//!   are created (`mknod`) at their `/dev` paths there, whatever the host's `/dev` holds, and
//!   whatever podman and runc write below `/run` vanishes with the namespace. The host's `/dev`
//!   and `/run` are never changed; their submounts (`/dev/pts`, `/dev/shm`, ...) stay usable.
//! - This podman reads CDI specs only from `/etc/cdi` and `/var/run/cdi`, and only files with
//!   `cdiVersion` up to 0.5.0: newer files are ignored without a word, and their devices are
//!   "unresolvable". [`Podman::install_spec`] writes the spec to `/var/run/cdi` under a name of
//!   its own and refuses a version the podman found cannot read, naming it.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::io::Read as _;
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;
use sha2::Digest as _;

/// The Debian packages the harness needs.
pub const DEBIAN_PACKAGES: &[&str] = &["podman", "runc", "busybox-static"];

/// The command that installs [`DEBIAN_PACKAGES`] (as root).
pub const INSTALL_COMMAND: &str =
    "apt-get install -y --no-install-recommends podman runc busybox-static";

/// Where [`Podman::install_spec`] puts spec files (one of the two directories podman reads).
pub const SPEC_DIR: &str = "/var/run/cdi";

/// How long a container may run unless [`Container::timeout`] says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// Set (to anything) to have every run print its devices and [`RunOutput::report`] on stderr
/// (shown by `cargo test -- --nocapture`, or for failing tests).
pub const VERBOSE_ENV: &str = "KUBEDEV_PODMAN_VERBOSE";

/// The prefix of the lines the spec check prints inside the container.
const CHECK_PREFIX: &str = "@kubedev-check ";

/// Directories overlaid in the private mount namespace.
const OVERLAID: [&str; 2] = ["/dev", "/run"];

/// Why the harness cannot run a container, or a run went wrong before the container's own
/// exit status.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PodmanError {
    /// A tool or a privilege the harness needs is missing.
    #[error(
        "the podman container tests cannot run here: {missing}. Install the tools as root with \
         `{INSTALL_COMMAND}` (`cargo xtask ci` does this itself)"
    )]
    Missing {
        /// What is missing, e.g. "runc (not found on PATH or in /usr/sbin)".
        missing: String,
    },
    /// A file operation or a command failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// A spec or a device ID given to the harness is unusable.
    #[error("CDI spec: {0}")]
    Spec(String),
    /// The spec's `cdiVersion` is newer than this podman's CDI library reads.
    #[error(
        "podman {podman} reads CDI specs up to cdiVersion {max} and silently ignores newer \
         files, so the devices of kind {kind} (cdiVersion {version}) would be unresolvable"
    )]
    UnsupportedCdiVersion {
        /// The spec's kind.
        kind: String,
        /// The spec's `cdiVersion`.
        version: String,
        /// The newest version this podman reads.
        max: String,
        /// podman's version.
        podman: String,
    },
    /// A fake device node is unusable.
    #[error("fake device node {path}: {reason}")]
    Node {
        /// The node's path.
        path: String,
        /// Why.
        reason: String,
    },
    /// The container did not finish in time; podman was killed.
    #[error(
        "the container did not finish within {timeout:?} (podman was killed); stderr:\n{stderr}"
    )]
    Timeout {
        /// The limit.
        timeout: Duration,
        /// What podman had printed on stderr.
        stderr: String,
    },
}

fn io_err(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> PodmanError {
    let context = context.into();
    move |source| PodmanError::Io { context, source }
}

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
const RUN_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(EXTRA_PATH.iter().map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.mode() & 0o111 != 0))
}

/// Whether the ELF file at `path` has no program interpreter (is statically linked). `None`
/// when it is not an ELF file this can read.
fn is_static_elf(path: &Path) -> Option<bool> {
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
fn parse_version(v: &str) -> Option<(u64, u64, u64)> {
    let core = v.split(['-', '+', '~']).next()?;
    let mut parts = core.split('.').map(|p| p.parse::<u64>());
    let major = parts.next()?.ok()?;
    let minor = parts.next().transpose().ok()?.unwrap_or(0);
    let patch = parts.next().transpose().ok()?.unwrap_or(0);
    Some((major, minor, patch))
}

/// A character or block device node that appears at a `/dev` path only inside the private
/// mount namespace podman runs in (the host's `/dev` is never changed). A spec naming that path
/// (as its `path`, or `hostPath`) then finds a real node there, as on the machine the fake host
/// root stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeNode {
    /// The path, below `/dev`.
    pub path: String,
    /// Character (`true`) or block (`false`) device.
    pub char_device: bool,
    /// Major number.
    pub major: u32,
    /// Minor number.
    pub minor: u32,
}

impl FakeNode {
    /// A character device `major:minor` at `path`.
    pub fn char(path: impl Into<String>, major: u32, minor: u32) -> Self {
        FakeNode {
            path: path.into(),
            char_device: true,
            major,
            minor,
        }
    }

    /// A block device `major:minor` at `path`.
    pub fn block(path: impl Into<String>, major: u32, minor: u32) -> Self {
        FakeNode {
            path: path.into(),
            char_device: false,
            major,
            minor,
        }
    }

    /// The node at `path` (e.g. `/dev/vfio/20`) in the fake host root `root`, which must be a
    /// real device node there (see `HostRoot::char_device`), not a regular-file stand-in.
    pub fn from_host_root(root: &Path, path: &str) -> Result<Self, PodmanError> {
        let file = root.join(path.trim_start_matches('/'));
        let meta = std::fs::metadata(&file).map_err(io_err(format!(
            "reading the node {path} of the host root {}",
            root.display()
        )))?;
        let ft = meta.file_type();
        if !(ft.is_char_device() || ft.is_block_device()) {
            return Err(PodmanError::Node {
                path: path.to_string(),
                reason: format!(
                    "{} is not a device node (a stand-in file? make it with \
                     HostRoot::char_device)",
                    file.display()
                ),
            });
        }
        let rdev = meta.rdev();
        Ok(FakeNode {
            path: path.to_string(),
            char_device: ft.is_char_device(),
            major: rustix::fs::major(rdev),
            minor: rustix::fs::minor(rdev),
        })
    }

    fn validate(&self) -> Result<(), PodmanError> {
        let bad = |reason: &str| {
            Err(PodmanError::Node {
                path: self.path.clone(),
                reason: reason.to_string(),
            })
        };
        if !self.path.starts_with("/dev/") {
            return bad("fake nodes go below /dev");
        }
        if self.path.split('/').any(|c| c == ".." || c == ".")
            || self.path.contains(char::is_whitespace)
            || self.path.ends_with('/')
        {
            return bad("the path must be plain (no '.', '..', spaces or trailing '/')");
        }
        Ok(())
    }
}

/// One container run: the CDI devices it asks for, the fake nodes of its namespace, the script
/// `/bin/sh -c` runs in it, and the specs whose edits are checked inside it.
#[derive(Debug, Clone)]
pub struct Container {
    devices: Vec<String>,
    nodes: Vec<FakeNode>,
    script: String,
    checks: Vec<(String, Vec<String>)>,
    timeout: Duration,
}

impl Container {
    /// A container running `script` with busybox's `sh -c`.
    pub fn new(script: impl Into<String>) -> Self {
        Container {
            devices: Vec::new(),
            nodes: Vec::new(),
            script: script.into(),
            checks: Vec::new(),
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// Asks for the CDI device `id` (`vendor/class=name`), as the kubelet passes it on.
    pub fn device(mut self, id: impl Into<String>) -> Self {
        self.devices.push(id.into());
        self
    }

    /// Asks for each of the CDI device IDs.
    pub fn devices<S: AsRef<str>>(mut self, ids: impl IntoIterator<Item = S>) -> Self {
        self.devices
            .extend(ids.into_iter().map(|s| s.as_ref().to_string()));
        self
    }

    /// Creates the fake node in the container's mount namespace before podman starts.
    pub fn node(mut self, node: FakeNode) -> Self {
        self.nodes.push(node);
        self
    }

    /// Creates each fake node.
    pub fn nodes(mut self, nodes: impl IntoIterator<Item = FakeNode>) -> Self {
        self.nodes.extend(nodes);
        self
    }

    /// Checks inside the container, before `script` runs, every edit that the CDI spec `spec`
    /// (its JSON) makes for `devices` (names, or qualified IDs of the spec's kind), together
    /// with its spec-level `containerEdits`: each device node (type and `major:minor` from the
    /// spec, or else from the fake node or host node it names; `fileMode`, `uid`, `gid` when
    /// set; not refused by the device cgroup), each mount (present; the same file or directory
    /// as on the host: content for files, identity where the host path is not under `/dev` or
    /// `/run`; a write fails where the options say `ro`) and each environment variable (exact
    /// value). Hooks are not checked. The failures are in [`RunOutput::failures`].
    pub fn check(mut self, spec: &str, devices: &[impl AsRef<str>]) -> Self {
        self.checks.push((
            spec.to_string(),
            devices.iter().map(|d| d.as_ref().to_string()).collect(),
        ));
        self
    }

    /// Kills podman when the container runs longer than `timeout` ([`DEFAULT_TIMEOUT`] unless
    /// set).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }
}

/// What a container run gave.
#[derive(Debug)]
pub struct RunOutput {
    /// podman's exit status: the script's, or 125–127 when podman or runc failed.
    pub status: ExitStatus,
    /// Standard output (the spec check's lines included).
    pub stdout: String,
    /// Standard error (podman's errors, and the script's).
    pub stderr: String,
    failures: Vec<String>,
}

impl RunOutput {
    /// True when the container's script exited with 0.
    pub fn success(&self) -> bool {
        self.status.success()
    }

    /// What the spec checks found wrong, one readable line each; empty when all held (or no
    /// check was asked for).
    pub fn failures(&self) -> &[String] {
        &self.failures
    }

    /// Standard output without the spec check's lines: what the test's script printed.
    pub fn user_stdout(&self) -> String {
        self.stdout
            .lines()
            .filter(|l| !l.starts_with(CHECK_PREFIX))
            .map(|l| format!("{l}\n"))
            .collect()
    }

    /// The text after `key=` on the first line of the script's output that starts so.
    pub fn value(&self, key: &str) -> Option<&str> {
        let prefix = format!("{key}=");
        self.stdout
            .lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
    }

    /// A report of the run: status, failed checks, the script's output and podman's errors.
    pub fn report(&self) -> String {
        let mut s = format!("container exit status: {}\n", self.status);
        if self.failures.is_empty() {
            s.push_str("spec checks: none failed\n");
        } else {
            s.push_str("spec checks that failed:\n");
            for f in &self.failures {
                s.push_str(&format!("  - {f}\n"));
            }
        }
        s.push_str(&format!(
            "stdout (without check lines):\n{}stderr:\n{}",
            self.user_stdout(),
            self.stderr
        ));
        s
    }

    /// Panics with [`RunOutput::report`] unless the script exited with 0 and no spec check
    /// failed.
    #[track_caller]
    pub fn assert_ok(&self) {
        assert!(
            self.success() && self.failures.is_empty(),
            "the container run failed:\n{}",
            self.report()
        );
    }
}

/// Spec files installed by this process: how many are live, and whether the harness created
/// [`SPEC_DIR`] (then it is removed again, when empty, once the last one is gone).
static INSTALLED: Mutex<(usize, bool)> = Mutex::new((0, false));
static NEXT_SPEC: AtomicU32 = AtomicU32::new(0);
/// Numbers the runs of this process (cgroup parents and namespace directories).
static NEXT_RUN: AtomicU32 = AtomicU32::new(0);

/// A spec file in [`SPEC_DIR`], removed when dropped.
#[derive(Debug)]
pub struct InstalledSpec {
    path: PathBuf,
    kind: String,
    names: Vec<String>,
}

impl InstalledSpec {
    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The spec's kind (`vendor/class`).
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// The names of the spec's devices, in its order.
    pub fn device_names(&self) -> Vec<String> {
        self.names.clone()
    }

    /// The qualified IDs (`kind=name`) of the spec's devices, in its order.
    pub fn device_ids(&self) -> Vec<String> {
        self.names
            .iter()
            .map(|n| format!("{}={n}", self.kind))
            .collect()
    }
}

impl Drop for InstalledSpec {
    fn drop(&mut self) {
        let mut state = INSTALLED.lock();
        let _ = std::fs::remove_file(&self.path);
        state.0 = state.0.saturating_sub(1);
        if state.0 == 0 && state.1 {
            // Only when empty: another process's specs keep it.
            if std::fs::remove_dir(SPEC_DIR).is_ok() {
                state.1 = false;
            }
        }
    }
}

/// podman with a private store and a busybox root filesystem, both removed when dropped.
#[derive(Debug)]
pub struct Podman {
    tools: Tools,
    work: tempfile::TempDir,
    rootfs: PathBuf,
}

impl Podman {
    /// Checks the tools ([`Tools::find`]) and builds the root filesystem: busybox and its
    /// applets as relative links in `/bin`.
    pub fn new() -> Result<Podman, PodmanError> {
        let tools = Tools::find()?;
        let work = tempfile::Builder::new()
            .prefix("kubedev-podman")
            .tempdir()
            .map_err(io_err("creating the podman work directory"))?;
        let w = work.path();
        let rootfs = w.join("rootfs");
        for d in ["bin", "etc", "proc", "sys", "dev", "tmp", "run"] {
            std::fs::create_dir_all(rootfs.join(d))
                .map_err(io_err(format!("creating {}", rootfs.join(d).display())))?;
        }
        for d in ["storage", "run", "tmp", "home"] {
            std::fs::create_dir_all(w.join(d))
                .map_err(io_err(format!("creating {}", w.join(d).display())))?;
        }
        // Files of its own, so the host's configuration changes nothing.
        std::fs::write(w.join("containers.conf"), "").map_err(io_err("writing containers.conf"))?;
        std::fs::write(
            w.join("storage.conf"),
            format!(
                "[storage]\ndriver = \"vfs\"\nrunroot = \"{}\"\ngraphroot = \"{}\"\n",
                w.join("run").display(),
                w.join("storage").display()
            ),
        )
        .map_err(io_err("writing storage.conf"))?;
        let bin = rootfs.join("bin");
        std::fs::copy(&tools.busybox, bin.join("busybox")).map_err(io_err(format!(
            "copying {} into the root filesystem",
            tools.busybox.display()
        )))?;
        let list = Command::new(&tools.busybox)
            .arg("--list")
            .output()
            .map_err(io_err("running busybox --list"))?;
        for applet in String::from_utf8_lossy(&list.stdout).split_whitespace() {
            if applet != "busybox" && !applet.contains('/') {
                // Relative links: absolute ones would point into the host's directory.
                std::os::unix::fs::symlink("busybox", bin.join(applet))
                    .map_err(io_err(format!("linking the applet {applet}")))?;
            }
        }
        if !bin.join("sh").exists() {
            return Err(PodmanError::Missing {
                missing: format!("a busybox with sh ({})", tools.busybox.display()),
            });
        }
        Ok(Podman {
            tools,
            work,
            rootfs,
        })
    }

    /// The tools in use.
    pub fn tools(&self) -> &Tools {
        &self.tools
    }

    /// Runs a container with no devices that prints a line: Ok when podman can run containers
    /// here, else an error with podman's output.
    pub fn smoke_test(&self) -> Result<(), PodmanError> {
        let out = self.run(Container::new("echo kubedev-podman-ok"))?;
        if out.success() && out.stdout.contains("kubedev-podman-ok") {
            Ok(())
        } else {
            Err(PodmanError::Io {
                context: format!("podman cannot run a container here:\n{}", out.report()),
                source: std::io::Error::other("podman run failed"),
            })
        }
    }

    /// Installs the spec `json` in [`SPEC_DIR`] (created when missing) as
    /// `kubedev-test-<pid>-<n>-<vendor>_<class>.json`, unchanged; it is removed when the
    /// returned guard is dropped. Refuses a `cdiVersion` newer than this podman reads.
    pub fn install_spec(&self, json: &str) -> Result<InstalledSpec, PodmanError> {
        let spec: Value = serde_json::from_str(json).map_err(|e| {
            PodmanError::Spec(format!("not JSON: {}", kubedev_core::echo::chain(&e)))
        })?;
        let kind = spec["kind"]
            .as_str()
            .ok_or_else(|| PodmanError::Spec("no kind".into()))?
            .to_string();
        let version = spec["cdiVersion"]
            .as_str()
            .ok_or_else(|| PodmanError::Spec(format!("kind {kind}: no cdiVersion")))?
            .to_string();
        if let Some(max) = self.tools.max_cdi_version() {
            let newer = match (parse_version(&version), parse_version(max)) {
                (Some(v), Some(m)) => v > m,
                _ => true,
            };
            if newer {
                return Err(PodmanError::UnsupportedCdiVersion {
                    kind,
                    version,
                    max: max.to_string(),
                    podman: self.tools.podman_version.clone(),
                });
            }
        }
        let names = spec["devices"]
            .as_array()
            .map(|ds| {
                ds.iter()
                    .filter_map(|d| d["name"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        let safe: String = kind
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let n = NEXT_SPEC.fetch_add(1, Ordering::Relaxed);
        let name = format!("kubedev-test-{}-{n}-{safe}.json", std::process::id());
        let path = Path::new(SPEC_DIR).join(&name);
        let tmp = Path::new(SPEC_DIR).join(format!(".{name}.tmp"));
        let mut state = INSTALLED.lock();
        if !Path::new(SPEC_DIR).is_dir() {
            std::fs::create_dir_all(SPEC_DIR).map_err(io_err(format!("creating {SPEC_DIR}")))?;
            state.1 = true;
        }
        std::fs::write(&tmp, json).map_err(io_err(format!("writing {}", tmp.display())))?;
        std::fs::rename(&tmp, &path).map_err(io_err(format!("renaming to {}", path.display())))?;
        state.0 += 1;
        Ok(InstalledSpec { path, kind, names })
    }

    /// [`Podman::install_spec`] with the content of the file at `path`.
    pub fn install_spec_file(&self, path: &Path) -> Result<InstalledSpec, PodmanError> {
        let json = std::fs::read_to_string(path)
            .map_err(io_err(format!("reading the spec {}", path.display())))?;
        self.install_spec(&json)
    }

    /// Runs `container` to its end (`podman run --rm`) in a private mount namespace with its
    /// fake nodes, then removes its cgroups; the exit status is the script's (or podman's
    /// 125–127). Errors are for runs that could not start or did not end in time.
    pub fn run(&self, container: Container) -> Result<RunOutput, PodmanError> {
        for node in &container.nodes {
            node.validate()?;
        }
        let checks = container
            .checks
            .iter()
            .map(|(spec, devices)| SpecExpectations::new(spec, devices, &container.nodes))
            .collect::<Result<Vec<_>, _>>()?;
        let check = Check::merge(checks);
        let script = format!("{}\n{}", check.script(), container.script);

        let n = NEXT_RUN.fetch_add(1, Ordering::Relaxed);
        let cgroup = format!("kubedev-test-{}-{n}", std::process::id());
        let w = self.work.path();
        let ns = w.join(format!("ns-{n}"));
        std::fs::create_dir_all(&ns).map_err(io_err(format!("creating {}", ns.display())))?;

        let mut cmd = Command::new(&self.tools.unshare);
        cmd.args(["--mount", "--propagation", "private", "--", "sh", "-euc"])
            .arg(NAMESPACE_SCRIPT)
            .arg("kubedev-podman-ns")
            .arg(&ns);
        for node in &container.nodes {
            cmd.arg(if node.char_device { "c" } else { "b" })
                .arg(node.major.to_string())
                .arg(node.minor.to_string())
                .arg(&node.path);
        }
        cmd.arg("--").arg(&self.tools.podman);
        cmd.arg("--root")
            .arg(w.join("storage"))
            .arg("--runroot")
            .arg(w.join("run"))
            .arg("--tmpdir")
            .arg(w.join("tmp"))
            .args([
                "--storage-driver",
                "vfs",
                "--events-backend",
                "none",
                "--cgroup-manager",
                "cgroupfs",
                "--runtime",
                "runc",
                "run",
                "--rm",
                "--network",
                "none",
                "--ulimit",
                "nofile=1024:1024",
                "--ulimit",
                "nproc=1000:1000",
            ])
            .arg("--cgroup-parent")
            .arg(format!("/{cgroup}"));
        for d in &container.devices {
            cmd.arg("--device").arg(d);
        }
        // `--rootfs` is a flag: the first argument after it is the root filesystem, the rest the
        // command, so every option comes before it.
        cmd.arg("--rootfs")
            .arg(format!("{}:O", self.rootfs.display()))
            .args(["/bin/sh", "-c"])
            .arg(&script);
        cmd.env_clear()
            .env("PATH", RUN_PATH)
            .env("HOME", w.join("home"))
            .env("TMPDIR", w.join("tmp"))
            .env("CONTAINERS_CONF", w.join("containers.conf"))
            .env("CONTAINERS_STORAGE_CONF", w.join("storage.conf"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());

        let result = run_with_timeout(cmd, container.timeout);
        remove_cgroups(&cgroup);
        let _ = std::fs::remove_dir_all(&ns);
        let (status, stdout, stderr) = result?;
        let failures = check.failures(&stdout);
        let out = RunOutput {
            status,
            stdout,
            stderr,
            failures,
        };
        if std::env::var_os(VERBOSE_ENV).is_some() {
            eprintln!(
                "podman run with devices {:?} and {} fake node(s):\n{}",
                container.devices,
                container.nodes.len(),
                out.report()
            );
        }
        Ok(out)
    }
}

/// Run by `sh` in the new mount namespace: `$1` is an empty directory for a private tmpfs, then
/// `type major minor path` per fake node, then `--` and podman's command line. `/dev` and
/// `/run` become overlays (upper layers on the tmpfs) with their submounts bound back on top.
const NAMESPACE_SCRIPT: &str = r#"
ns=$1; shift
mount -t tmpfs -o mode=0700 kubedev-test "$ns"
for d in /dev /run; do
  [ -d "$d" ] || continue
  n=$(echo "$d" | tr / _)
  mkdir "$ns/upper$n" "$ns/work$n" "$ns/keep$n"
  subs=$(awk -v d="$d/" 'index($5, d) == 1 { print $5 }' /proc/self/mountinfo | sort -u)
  mount --rbind "$d" "$ns/keep$n"
  mount -t overlay kubedev-test -o "lowerdir=$d,upperdir=$ns/upper$n,workdir=$ns/work$n" "$d"
  last=/nonexistent/kubedev
  for s in $subs; do
    case "$s" in "$last"/*) continue ;; esac
    mount --rbind "$ns/keep$n${s#"$d"}" "$s"
    last=$s
  done
done
while [ "$1" != "--" ]; do
  mkdir -p "$(dirname "$4")"
  rm -rf "$4"
  mknod -m 0600 "$4" "$1" "$2" "$3"
  shift 4
done
shift
exec "$@"
"#;

/// Runs `cmd`, reading its output, killing it after `timeout`.
fn run_with_timeout(
    mut cmd: Command,
    timeout: Duration,
) -> Result<(ExitStatus, String, String), PodmanError> {
    let mut child = cmd.spawn().map_err(io_err("starting unshare and podman"))?;
    let reader = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut buf);
            }
            String::from_utf8_lossy(&buf).into_owned()
        })
    };
    let out = reader(child.stdout.take().map(|p| Box::new(p) as _));
    let err = reader(child.stderr.take().map(|p| Box::new(p) as _));
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait().map_err(io_err("waiting for podman"))? {
            Some(s) => break Some(s),
            None if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            None => std::thread::sleep(Duration::from_millis(10)),
        }
    };
    let stdout = out.join().unwrap_or_default();
    let stderr = err.join().unwrap_or_default();
    match status {
        Some(s) => Ok((s, stdout, stderr)),
        None => Err(PodmanError::Timeout { timeout, stderr }),
    }
}

/// Removes the cgroup `name` (and the cgroups below it: conmon's, the container's) from every
/// hierarchy: `/sys/fs/cgroup/<name>` (v2) and `/sys/fs/cgroup/<controller>/<name>` (v1).
fn remove_cgroups(name: &str) {
    let root = Path::new("/sys/fs/cgroup");
    let mut dirs = vec![root.join(name)];
    if let Ok(entries) = std::fs::read_dir(root) {
        dirs.extend(entries.filter_map(|e| e.ok()).map(|e| e.path().join(name)));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    for dir in dirs.into_iter().filter(|d| d.is_dir()) {
        // conmon may still be leaving: retry while the cgroup is busy.
        while rmdir_tree(&dir).is_err() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Removes the cgroup directory `dir` and its child cgroups, deepest first (only `rmdir`:
/// cgroup directories cannot be emptied otherwise).
fn rmdir_tree(dir: &Path) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)?.filter_map(|e| e.ok()) {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            rmdir_tree(&e.path())?;
        }
    }
    match std::fs::remove_dir(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        r => r,
    }
}

/// `'text'` for `sh`.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// What one device node must look like in the container.
#[derive(Debug)]
struct NodeExpect {
    origin: String,
    path: String,
    /// `(char, major, minor)`, or why it cannot be known.
    id: Result<(bool, u64, u64), String>,
    mode: Option<u32>,
    uid: Option<u32>,
    gid: Option<u32>,
    read: bool,
    write: bool,
}

/// What the host has at a mount's host path.
#[derive(Debug)]
enum HostObject {
    File { sha256: String },
    Dir { names: Vec<String> },
    Other,
}

/// What one mount must look like in the container.
#[derive(Debug)]
struct MountExpect {
    origin: String,
    container_path: String,
    host_path: String,
    bind: bool,
    /// The host object, or why it cannot be read.
    host: Result<(HostObject, &'static str), String>,
    /// `(st_dev, st_ino)` of the host object, when the container must see that very object.
    identity: Option<(u64, u64)>,
    read_only: bool,
}

/// The expectations of one spec for some of its devices.
#[derive(Debug, Default)]
struct SpecExpectations {
    nodes: Vec<NodeExpect>,
    mounts: Vec<MountExpect>,
    /// Key → (value, origin); later edits win.
    env: Vec<(String, String, String)>,
}

fn file_kind(ft: std::fs::FileType) -> &'static str {
    if ft.is_file() {
        "regular file"
    } else if ft.is_dir() {
        "directory"
    } else if ft.is_socket() {
        "socket"
    } else if ft.is_char_device() {
        "character special file"
    } else if ft.is_block_device() {
        "block special file"
    } else if ft.is_fifo() {
        "fifo"
    } else {
        "other"
    }
}

/// Whether `path` lies in a directory overlaid in the namespace (its identity differs there).
fn overlaid(path: &str) -> bool {
    OVERLAID
        .iter()
        .chain(&["/var/run"])
        .any(|d| path == *d || path.starts_with(&format!("{d}/")))
}

impl SpecExpectations {
    fn new(spec: &str, devices: &[String], fakes: &[FakeNode]) -> Result<Self, PodmanError> {
        let spec: Value = serde_json::from_str(spec).map_err(|e| {
            PodmanError::Spec(format!("not JSON: {}", kubedev_core::echo::chain(&e)))
        })?;
        let kind = spec["kind"].as_str().unwrap_or_default().to_string();
        let mut out = SpecExpectations::default();
        out.add_edits(
            &spec["containerEdits"],
            &format!("{kind} (spec-level)"),
            fakes,
        );
        for d in devices {
            let name = match d.split_once('=') {
                Some((k, n)) if k == kind => n,
                Some((k, _)) => {
                    return Err(PodmanError::Spec(format!(
                        "device {d} is not of the spec's kind {kind} (but {k})"
                    )));
                }
                None => d.as_str(),
            };
            let device = spec["devices"]
                .as_array()
                .and_then(|ds| ds.iter().find(|x| x["name"] == name))
                .ok_or_else(|| {
                    PodmanError::Spec(format!("the spec of kind {kind} has no device {name}"))
                })?;
            out.add_edits(&device["containerEdits"], &format!("{kind}={name}"), fakes);
        }
        Ok(out)
    }

    fn add_edits(&mut self, edits: &Value, origin: &str, fakes: &[FakeNode]) {
        for e in edits["env"].as_array().into_iter().flatten() {
            let e = e.as_str().unwrap_or_default();
            let (k, v) = e.split_once('=').unwrap_or((e, ""));
            self.env
                .push((k.to_string(), v.to_string(), origin.to_string()));
        }
        for n in edits["deviceNodes"].as_array().into_iter().flatten() {
            self.nodes.push(node_expect(n, origin, fakes));
        }
        for m in edits["mounts"].as_array().into_iter().flatten() {
            self.mounts.push(mount_expect(m, origin));
        }
    }
}

fn node_expect(n: &Value, origin: &str, fakes: &[FakeNode]) -> NodeExpect {
    let path = n["path"].as_str().unwrap_or_default().to_string();
    let host = n["hostPath"]
        .as_str()
        .filter(|h| !h.is_empty())
        .unwrap_or(&path)
        .to_string();
    let from_host = || -> Result<(bool, u64, u64), String> {
        if let Some(f) = fakes.iter().find(|f| f.path == host) {
            return Ok((f.char_device, f.major.into(), f.minor.into()));
        }
        let meta = std::fs::metadata(&host).map_err(|e| {
            format!(
                "its host node {host} cannot be read ({}) and no fake node stands for it",
                kubedev_core::echo::chain(&e)
            )
        })?;
        let ft = meta.file_type();
        if !(ft.is_char_device() || ft.is_block_device()) {
            return Err(format!("its host node {host} is a {}", file_kind(ft)));
        }
        let rdev = meta.rdev();
        Ok((
            ft.is_char_device(),
            rustix::fs::major(rdev).into(),
            rustix::fs::minor(rdev).into(),
        ))
    };
    let host_id = from_host();
    let id = (|| {
        let char_device = match n["type"].as_str() {
            Some("c") | Some("u") => true,
            Some("b") => false,
            Some(other) => return Err(format!("type {other:?} is not one this check knows")),
            None => host_id.clone()?.0,
        };
        let major = match n["major"].as_u64() {
            Some(m) => m,
            None => host_id.clone()?.1,
        };
        let minor = match n["minor"].as_u64() {
            Some(m) => m,
            None => host_id.clone()?.2,
        };
        Ok((char_device, major, minor))
    })();
    let perms = n["permissions"].as_str().unwrap_or("rwm");
    NodeExpect {
        origin: origin.to_string(),
        path,
        id,
        mode: n["fileMode"].as_u64().and_then(|m| u32::try_from(m).ok()),
        uid: n["uid"].as_u64().and_then(|m| u32::try_from(m).ok()),
        gid: n["gid"].as_u64().and_then(|m| u32::try_from(m).ok()),
        read: perms.contains('r'),
        write: perms.contains('w'),
    }
}

fn mount_expect(m: &Value, origin: &str) -> MountExpect {
    let container_path = m["containerPath"].as_str().unwrap_or_default().to_string();
    let host_path = m["hostPath"].as_str().unwrap_or_default().to_string();
    let options: Vec<&str> = m["options"]
        .as_array()
        .map(|o| o.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mount_type = m["type"].as_str().unwrap_or("");
    let bind = mount_type == "bind"
        || options.iter().any(|o| *o == "bind" || *o == "rbind")
        || (mount_type.is_empty() && host_path.starts_with('/'));
    let host = if bind {
        match std::fs::metadata(&host_path) {
            Ok(meta) => {
                let ft = meta.file_type();
                let object = if ft.is_file() {
                    std::fs::read(&host_path)
                        .map(|b| HostObject::File {
                            sha256: hex(&sha2::Sha256::digest(&b)),
                        })
                        .map_err(|e| {
                            format!("reading {host_path}: {}", kubedev_core::echo::chain(&e))
                        })
                } else if ft.is_dir() {
                    std::fs::read_dir(&host_path)
                        .map(|d| {
                            let mut names: Vec<String> = d
                                .filter_map(|e| e.ok())
                                .map(|e| e.file_name().to_string_lossy().into_owned())
                                .collect();
                            names.sort();
                            HostObject::Dir { names }
                        })
                        .map_err(|e| {
                            format!("listing {host_path}: {}", kubedev_core::echo::chain(&e))
                        })
                } else {
                    Ok(HostObject::Other)
                };
                object.map(|o| (o, file_kind(ft)))
            }
            Err(e) => Err(format!(
                "its host path {host_path} cannot be read: {}",
                kubedev_core::echo::chain(&e)
            )),
        }
    } else {
        Ok((HostObject::Other, ""))
    };
    let identity = if bind && !overlaid(&host_path) {
        std::fs::metadata(&host_path)
            .ok()
            .map(|m| (m.dev(), m.ino()))
    } else {
        None
    };
    MountExpect {
        origin: origin.to_string(),
        container_path,
        host_path,
        bind,
        host,
        identity,
        read_only: options.contains(&"ro"),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Every spec's expectations for one container, with the script that gathers the facts and the
/// comparison of what it printed.
#[derive(Debug, Default)]
struct Check {
    nodes: Vec<NodeExpect>,
    mounts: Vec<MountExpect>,
    env: BTreeMap<String, (String, String)>,
    active: bool,
}

impl Check {
    fn merge(specs: Vec<SpecExpectations>) -> Check {
        let mut c = Check {
            active: !specs.is_empty(),
            ..Check::default()
        };
        for s in specs {
            c.nodes.extend(s.nodes);
            c.mounts.extend(s.mounts);
            for (k, v, origin) in s.env {
                c.env.insert(k, (v, origin));
            }
        }
        c
    }

    /// The shell code printing `@kubedev-check <key> <one line>` per fact.
    fn script(&self) -> String {
        if !self.active {
            return String::new();
        }
        let mut s = String::from(
            "kdv() { printf '@kubedev-check %s %s\\n' \"$1\" \"$(tr '\\n' ' ')\"; }\n",
        );
        for (i, n) in self.nodes.iter().enumerate() {
            let p = quote(&n.path);
            s.push_str(&format!(
                "stat -c '%F|%t|%T|%a|%u|%g' {p} 2>&1 | kdv n{i}.stat\n"
            ));
            if n.read {
                s.push_str(&format!("( : < {p} ) 2>&1 | kdv n{i}.read\n"));
            }
            if n.write {
                s.push_str(&format!("( : >> {p} ) 2>&1 | kdv n{i}.write\n"));
            }
        }
        for (i, m) in self.mounts.iter().enumerate() {
            let p = quote(&m.container_path);
            s.push_str(&format!("stat -c '%F|%d|%i' {p} 2>&1 | kdv m{i}.stat\n"));
            match &m.host {
                Ok((HostObject::File { .. }, _)) => {
                    s.push_str(&format!("sha256sum < {p} 2>&1 | kdv m{i}.sha\n"));
                }
                Ok((HostObject::Dir { .. }, _)) => {
                    s.push_str(&format!(
                        "ls -A1 {p} 2>&1 | sort | tr '\\n' '/' | kdv m{i}.ls\n"
                    ));
                }
                _ => {}
            }
            if m.read_only {
                s.push_str(&format!(
                    "{{ touch -c {p} 2>&1; echo \"rc=$?\"; }} | kdv m{i}.ro\n"
                ));
            }
        }
        s.push_str("od -An -v -tx1 /proc/$$/environ | tr -d ' \\n' | kdv env\n");
        s
    }

    /// What differs from the expectations in the facts printed (`stdout`).
    fn failures(&self, stdout: &str) -> Vec<String> {
        if !self.active {
            return Vec::new();
        }
        let facts: BTreeMap<&str, &str> = stdout
            .lines()
            .filter_map(|l| l.strip_prefix(CHECK_PREFIX))
            .map(|l| {
                let (k, v) = l.split_once(' ').unwrap_or((l, ""));
                (k, v.trim_end())
            })
            .collect();
        let mut fails = Vec::new();
        let fact = |key: &str, fails: &mut Vec<String>| -> Option<String> {
            let v = facts.get(key).map(|v| v.to_string());
            if v.is_none() {
                fails.push(format!(
                    "the check printed no {key} (did the container start? see stderr)"
                ));
            }
            v
        };
        for (i, n) in self.nodes.iter().enumerate() {
            let what = format!("{}: device node {}", n.origin, n.path);
            let Some(stat) = fact(&format!("n{i}.stat"), &mut fails) else {
                continue;
            };
            let f: Vec<&str> = stat.split('|').collect();
            if f.len() != 6 {
                fails.push(format!("{what}: missing in the container ({stat})"));
                continue;
            }
            let got_char = f[0] == "character special file";
            let got_block = f[0] == "block special file";
            let got_id = (
                u64::from_str_radix(f[1], 16).unwrap_or(u64::MAX),
                u64::from_str_radix(f[2], 16).unwrap_or(u64::MAX),
            );
            match &n.id {
                Err(why) => fails.push(format!("{what}: cannot tell what it must be: {why}")),
                Ok((char_device, major, minor)) => {
                    let want_kind = if *char_device { "character" } else { "block" };
                    let kind_ok = if *char_device { got_char } else { got_block };
                    if !kind_ok || got_id != (*major, *minor) {
                        fails.push(format!(
                            "{what}: expected a {want_kind} device {major}:{minor}, the container \
                             has a {} {}:{}",
                            f[0], got_id.0, got_id.1
                        ));
                    }
                }
            }
            if let Some(mode) = n.mode
                && u32::from_str_radix(f[3], 8).ok() != Some(mode & 0o7777)
            {
                fails.push(format!(
                    "{what}: expected mode {:o} (fileMode {mode}), the container has {}",
                    mode & 0o7777,
                    f[3]
                ));
            }
            if let Some(uid) = n.uid
                && f[4] != uid.to_string()
            {
                fails.push(format!(
                    "{what}: expected uid {uid}, the container has {}",
                    f[4]
                ));
            }
            if let Some(gid) = n.gid
                && f[5] != gid.to_string()
            {
                fails.push(format!(
                    "{what}: expected gid {gid}, the container has {}",
                    f[5]
                ));
            }
            for (on, access) in [(n.read, "read"), (n.write, "write")] {
                if !on {
                    continue;
                }
                if let Some(err) = fact(&format!("n{i}.{access}"), &mut fails)
                    && err.contains("Operation not permitted")
                {
                    fails.push(format!(
                        "{what}: opening it to {access} is refused by the device cgroup ({err})"
                    ));
                }
            }
        }
        for (i, m) in self.mounts.iter().enumerate() {
            let what = format!(
                "{}: mount {} -> {}",
                m.origin, m.host_path, m.container_path
            );
            let (object, host_kind) = match &m.host {
                Ok(h) => h,
                Err(why) => {
                    fails.push(format!("{what}: {why}"));
                    continue;
                }
            };
            let Some(stat) = fact(&format!("m{i}.stat"), &mut fails) else {
                continue;
            };
            let f: Vec<&str> = stat.split('|').collect();
            if f.len() != 3 {
                fails.push(format!("{what}: missing in the container ({stat})"));
                continue;
            }
            let got_kind = if f[0].starts_with("regular") {
                "regular file"
            } else {
                f[0]
            };
            if m.bind && got_kind != *host_kind {
                fails.push(format!(
                    "{what}: the host has a {host_kind}, the container a {got_kind}"
                ));
            }
            if let Some((dev, ino)) = m.identity
                && (f[1] != dev.to_string() || f[2] != ino.to_string())
            {
                fails.push(format!(
                    "{what}: not the host's {host_kind} (device:inode {dev}:{ino} on the host, \
                     {}:{} in the container)",
                    f[1], f[2]
                ));
            }
            match object {
                HostObject::File { sha256 } => {
                    if let Some(got) = fact(&format!("m{i}.sha"), &mut fails) {
                        let got = got.split_whitespace().next().unwrap_or_default();
                        if got != sha256 {
                            fails.push(format!(
                                "{what}: the content differs from the host file's (sha256 {sha256} \
                                 on the host, {got} in the container)"
                            ));
                        }
                    }
                }
                HostObject::Dir { names } => {
                    if let Some(got) = fact(&format!("m{i}.ls"), &mut fails) {
                        let got: Vec<&str> = got.split('/').filter(|s| !s.is_empty()).collect();
                        if got != *names {
                            fails.push(format!(
                                "{what}: the directory lists {got:?} in the container, {names:?} on the host"
                            ));
                        }
                    }
                }
                HostObject::Other => {}
            }
            if m.read_only
                && let Some(ro) = fact(&format!("m{i}.ro"), &mut fails)
                && (ro.ends_with("rc=0") || !ro.contains("Read-only file system"))
            {
                fails.push(format!(
                    "{what}: the options say ro, but a write (touch) was not refused as on a \
                     read-only file system: {ro}"
                ));
            }
        }
        if let Some(hexed) = fact("env", &mut fails) {
            let bytes: Vec<u8> = (0..hexed.len() / 2)
                .filter_map(|i| u8::from_str_radix(hexed.get(2 * i..2 * i + 2)?, 16).ok())
                .collect();
            let mut seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for entry in bytes.split(|b| *b == 0).filter(|e| !e.is_empty()) {
                let entry = String::from_utf8_lossy(entry);
                let (k, v) = entry.split_once('=').unwrap_or((&entry, ""));
                seen.entry(k.to_string()).or_default().push(v.to_string());
            }
            for (k, (v, origin)) in &self.env {
                match seen.get(k).map(Vec::as_slice) {
                    None => fails.push(format!("{origin}: env {k} is not set in the container")),
                    Some([got]) if got == v => {}
                    Some(got) => fails.push(format!(
                        "{origin}: env {k} should be {v:?}, the container has {got:?}"
                    )),
                }
            }
        }
        fails
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn versions_compare_as_numbers() {
        assert_eq!(parse_version("4.3.1"), Some((4, 3, 1)));
        assert_eq!(parse_version("4.10"), Some((4, 10, 0)));
        assert_eq!(parse_version("5.0.0-rc1"), Some((5, 0, 0)));
        assert!(parse_version("0.10.0") > parse_version("0.5.0"));
        assert_eq!(parse_version("x"), None);
    }

    #[test]
    fn fake_nodes_stay_below_dev() {
        assert!(FakeNode::char("/dev/vfio/12", 240, 12).validate().is_ok());
        assert!(FakeNode::char("/etc/passwd", 1, 3).validate().is_err());
        assert!(FakeNode::char("/dev/../etc/x", 1, 3).validate().is_err());
    }

    #[test]
    fn a_busybox_test_binary_is_recognised_as_an_elf() {
        // The test binary itself: an ELF file, dynamically linked on glibc targets.
        let me = std::env::current_exe().unwrap();
        assert!(is_static_elf(&me).is_some());
        assert_eq!(is_static_elf(Path::new("/nonexistent")), None);
    }

    #[test]
    fn the_check_reports_every_difference_readably() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f.txt");
        std::fs::write(&file, "hello\n").unwrap();
        let spec = serde_json::json!({
            "cdiVersion": "0.5.0", "kind": "example.com/x",
            "containerEdits": {"env": ["TOP=1"]},
            "devices": [{"name": "a", "containerEdits": {
                "env": ["A=x y"],
                "deviceNodes": [{"path": "/dev/fake0", "permissions": "rw"}],
                "mounts": [{"hostPath": file, "containerPath": "/etc/f.txt", "options": ["ro", "bind"]}]
            }}]
        })
        .to_string();
        let fakes = [FakeNode::char("/dev/fake0", 240, 1)];
        let e = SpecExpectations::new(&spec, &["example.com/x=a".to_string()], &fakes).unwrap();
        let check = Check::merge(vec![e]);
        let script = check.script();
        assert!(
            script.contains("stat -c '%F|%t|%T|%a|%u|%g' '/dev/fake0'"),
            "{script}"
        );
        let hex_env = hex(b"TOP=1\0A=x y\0PATH=/bin\0");
        let sha = hex(&sha2::Sha256::digest(b"hello\n"));
        let meta = std::fs::metadata(&file).unwrap();
        let good = format!(
            "@kubedev-check n0.stat character special file|f0|1|666|0|0\n\
             @kubedev-check n0.read sh: can't open '/dev/fake0': No such device or address\n\
             @kubedev-check n0.write\n\
             @kubedev-check m0.stat regular file|{}|{}\n\
             @kubedev-check m0.sha {sha}  -\n\
             @kubedev-check m0.ro touch: /etc/f.txt: Read-only file system rc=1\n\
             @kubedev-check env {hex_env}\n",
            meta.dev(),
            meta.ino()
        );
        assert_eq!(check.failures(&good), Vec::<String>::new());
        let bad = good
            .replace("f0|1|", "f0|2|")
            .replace("No such device or address", "Operation not permitted")
            .replace(&sha, "00")
            .replace("Read-only file system rc=1", "rc=0")
            .replace(&hex_env, &hex(b"TOP=2\0"));
        let fails = check.failures(&bad);
        assert_eq!(fails.len(), 6, "{fails:#?}");
        assert!(
            fails[0].contains("expected a character device 240:1"),
            "{fails:#?}"
        );
        assert!(
            fails[1].contains("refused by the device cgroup"),
            "{fails:#?}"
        );
        assert!(fails[2].contains("content differs"), "{fails:#?}");
        assert!(fails[3].contains("options say ro"), "{fails:#?}");
        assert!(
            fails.iter().any(|f| f.contains("env A is not set")),
            "{fails:#?}"
        );
        assert!(
            fails.iter().any(|f| f.contains("env TOP should be \"1\"")),
            "{fails:#?}"
        );
        assert!(
            check.failures("").iter().all(|f| f.contains("printed no")),
            "a container that never ran fails every check"
        );
    }
}
