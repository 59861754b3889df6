//! What a test asks of a container run ([`Container`], with the [`FakeNode`]s of its mount
//! namespace) and what the run gave ([`RunOutput`]).

use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
use std::path::Path;
use std::process::ExitStatus;
use std::time::Duration;

use super::{CHECK_PREFIX, DEFAULT_TIMEOUT, PodmanError, io_err};

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

    /// Refuses a path outside `/dev` or one that is not plain.
    pub(super) fn validate(&self) -> Result<(), PodmanError> {
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
    pub(super) devices: Vec<String>,
    pub(super) nodes: Vec<FakeNode>,
    pub(super) script: String,
    /// Each spec to check (its JSON) with the devices whose edits are checked.
    pub(super) checks: Vec<(String, Vec<String>)>,
    pub(super) timeout: Duration,
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
    pub(super) failures: Vec<String>,
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
