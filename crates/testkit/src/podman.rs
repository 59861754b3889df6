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

mod check;
mod container;
mod expect;
mod install;
mod runtime;
mod tools;

pub use container::{Container, FakeNode, RunOutput};
pub use install::InstalledSpec;
pub use runtime::Podman;
pub use tools::Tools;

use std::time::Duration;

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

#[cfg(test)]
mod tests;
