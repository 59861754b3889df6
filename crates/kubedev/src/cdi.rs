//! Container Device Interface (CDI) spec files for prepared DRA claims.
//!
//! Each prepared claim gets one spec file in the CDI directory (default `/var/run/cdi`), which
//! the container runtime reads when the kubelet hands it the claim's CDI device IDs:
//!
//! - kind `k8s.<driver>/claim` (vendor `k8s.<driver>`, class `claim`);
//! - one CDI device per prepared device, named `<claim UID>-<device>`, plus `-<share ID>` when
//!   the device is shared; its qualified ID is `k8s.<driver>/claim=<name>`;
//! - file name `k8s.<driver>-claim_<claim UID>.json` (vendor, class and claim UID);
//! - `cdiVersion` is the lowest version whose features the content uses, so older container
//!   runtimes can read it;
//! - written atomically (temporary file, fsync, rename, directory fsync) with mode 0644.
//!
//! Claim UIDs, device names and share IDs come from outside; they are checked against the CDI
//! name rules before any of them becomes part of a path or a spec.
//!
//! A CDI device must change the container somehow (the CDI libraries reject a device whose
//! `containerEdits` are empty), so a prepared device without environment, device nodes, mounts
//! or hooks gets no CDI device and no CDI ID, and a claim with no such device gets no file.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use kubedev_core::atomic_file;
use kubedev_core::{
    AllocatedDevice, ContainerEdits, DeviceNode, DriverName, Hook, Mount, PreparedDevice,
};

/// The CDI directory container runtimes read by default for dynamic specs.
pub const DEFAULT_CDI_DIR: &str = "/var/run/cdi";

/// The CDI class of claim specs.
pub const CLAIM_CLASS: &str = "claim";

/// Longest claim UID accepted (Kubernetes UIDs have 36 characters); keeps file names well
/// below the 255-byte limit.
pub const MAX_CLAIM_UID_LEN: usize = 128;

/// Longest share ID accepted.
pub const MAX_SHARE_ID_LEN: usize = 128;

/// Mode of spec files: container runtimes may run as another user.
const SPEC_MODE: u32 = 0o644;
/// The mode of a CDI directory kubedev creates. Unlike kubedev's other directories it is not
/// private: the container runtime and CDI tools (`nvidia-ctk cdi list`, podman run by a user)
/// read the specs in it, as they do in `/etc/cdi` and `/var/run/cdi`.
const SPEC_DIR_MODE: u32 = 0o755;

/// Kubernetes' limit on the total size of annotations, which CDI applies too.
const MAX_ANNOTATIONS_BYTES: usize = 256 * 1024;

/// Hook names the CDI libraries accept.
const HOOK_NAMES: [&str; 6] = [
    "prestart",
    "createRuntime",
    "createContainer",
    "startContainer",
    "poststart",
    "poststop",
];

/// CDI spec versions a spec may declare, oldest first. Earlier versions exist but nothing valid
/// is older than 0.3.0.
const KNOWN_VERSIONS: [&str; 8] = [
    "0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0",
];

/// A CDI spec file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct CdiSpec {
    /// The CDI spec version, e.g. `0.5.0`.
    pub cdi_version: String,
    /// `<vendor>/<class>`.
    pub kind: String,
    /// Spec-level annotations (CDI metadata; they do not reach the container).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// The devices.
    pub devices: Vec<CdiDevice>,
    /// Edits applied whenever any device of the spec is used.
    #[serde(default, skip_serializing_if = "CdiContainerEdits::is_empty")]
    pub container_edits: CdiContainerEdits,
}

/// One device of a CDI spec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct CdiDevice {
    /// The device name within the kind.
    pub name: String,
    /// Device annotations (CDI metadata).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// What the container needs for this device.
    pub container_edits: CdiContainerEdits,
}

/// CDI `containerEdits`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct CdiContainerEdits {
    /// Environment variables, `KEY=VALUE`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Device nodes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
    /// OCI hooks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<Hook>,
    /// Mounts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
    /// Additional group IDs for the container's process (CDI 0.7.0).
    #[serde(
        default,
        rename = "additionalGIDs",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub additional_gids: Vec<u32>,
}

impl CdiContainerEdits {
    /// True when the edits change nothing.
    pub fn is_empty(&self) -> bool {
        self.env.is_empty()
            && self.device_nodes.is_empty()
            && self.hooks.is_empty()
            && self.mounts.is_empty()
            && self.additional_gids.is_empty()
    }

    /// The CDI form of kubedev's container edits (annotations are not edits; they go on the
    /// device). Empty host paths and mount types are dropped, and a host path equal to the
    /// container path is left out, which is what it defaults to.
    pub fn from_edits(edits: &ContainerEdits) -> Self {
        CdiContainerEdits {
            env: edits.env.iter().map(|(k, v)| format!("{k}={v}")).collect(),
            device_nodes: edits
                .device_nodes
                .iter()
                .map(|n| {
                    let mut n = n.clone();
                    if n.host_path
                        .as_deref()
                        .is_some_and(|h| h.is_empty() || h == n.path)
                    {
                        n.host_path = None;
                    }
                    if n.permissions.as_deref() == Some("") {
                        n.permissions = None;
                    }
                    n
                })
                .collect(),
            hooks: edits.hooks.clone(),
            mounts: edits
                .mounts
                .iter()
                .map(|m| {
                    let mut m = m.clone();
                    if m.mount_type.as_deref() == Some("") {
                        m.mount_type = None;
                    }
                    m
                })
                .collect(),
            additional_gids: Vec::new(),
        }
    }

    fn validate(&self, scope: &str) -> Result<(), CdiError> {
        let bad = |reason: String| CdiError::InvalidContent {
            scope: scope.to_owned(),
            reason,
        };
        for e in &self.env {
            check_env(e).map_err(|r| bad(format!("environment variable {e:?} {r}")))?;
        }
        for n in &self.device_nodes {
            if n.path.is_empty() {
                return Err(bad("device node with an empty path".into()));
            }
            if let Some(p) = &n.permissions
                && let Some(c) = p.chars().find(|c| !matches!(c, 'r' | 'w' | 'm'))
            {
                return Err(bad(format!(
                    "device node {:?}: permissions {p:?} contain {c:?}; only 'r', 'w' and 'm' are allowed",
                    n.path
                )));
            }
        }
        for h in &self.hooks {
            if !HOOK_NAMES.contains(&h.hook_name.as_str()) {
                return Err(bad(format!(
                    "hook name {:?} is not one of {}",
                    h.hook_name,
                    HOOK_NAMES.join(", ")
                )));
            }
            if h.path.is_empty() {
                return Err(bad(format!("hook {:?} has an empty path", h.hook_name)));
            }
            for e in &h.env {
                check_env(e).map_err(|r| {
                    bad(format!(
                        "hook {:?}: environment entry {e:?} {r}",
                        h.hook_name
                    ))
                })?;
            }
        }
        for m in &self.mounts {
            if m.host_path.is_empty() {
                return Err(bad(format!(
                    "mount to {:?} has an empty host path",
                    m.container_path
                )));
            }
            if m.container_path.is_empty() {
                return Err(bad(format!(
                    "mount of {:?} has an empty container path",
                    m.host_path
                )));
            }
        }
        Ok(())
    }

    fn needs_host_path(&self) -> bool {
        self.device_nodes
            .iter()
            .any(|n| n.host_path.as_deref().is_some_and(|h| !h.is_empty()))
    }

    fn needs_mount_type(&self) -> bool {
        self.mounts
            .iter()
            .any(|m| m.mount_type.as_deref().is_some_and(|t| !t.is_empty()))
    }
}

fn check_env(entry: &str) -> Result<(), &'static str> {
    match entry.find('=') {
        Some(i) if i > 0 => Ok(()),
        Some(_) => Err("has an empty name"),
        None => Err("has no '='"),
    }
}

impl CdiSpec {
    /// The lowest CDI version whose features this spec uses (the rules of the CDI reference
    /// implementation):
    /// - 0.3.0: the baseline;
    /// - 0.4.0: a mount with a `type`;
    /// - 0.5.0: a device name that does not start with a letter, or a device node `hostPath`;
    /// - 0.6.0: annotations on the spec or a device, or a '.' in the class;
    /// - 0.7.0: `additionalGIDs`.
    pub fn minimum_version(&self) -> &'static str {
        let edits = || {
            std::iter::once(&self.container_edits)
                .chain(self.devices.iter().map(|d| &d.container_edits))
        };
        let class_has_dot = self
            .kind
            .split_once('/')
            .is_some_and(|(_, class)| class.contains('.'));
        if edits().any(|e| !e.additional_gids.is_empty()) {
            "0.7.0"
        } else if !self.annotations.is_empty()
            || self.devices.iter().any(|d| !d.annotations.is_empty())
            || class_has_dot
        {
            "0.6.0"
        } else if self
            .devices
            .iter()
            .any(|d| !d.name.starts_with(|c: char| c.is_ascii_alphabetic()))
            || edits().any(CdiContainerEdits::needs_host_path)
        {
            "0.5.0"
        } else if edits().any(CdiContainerEdits::needs_mount_type) {
            "0.4.0"
        } else {
            "0.3.0"
        }
    }

    /// A spec of `kind` (`<vendor>/<class>`) with one CDI device per named set of edits, in the
    /// order given, at the lowest version its content needs; validated (names, unique devices,
    /// non-empty edits). Each device keeps its own values: unlike a claim's spec, nothing is
    /// joined across devices.
    pub fn for_devices(kind: &str, devices: &[(String, ContainerEdits)]) -> Result<Self, CdiError> {
        let mut spec = CdiSpec {
            cdi_version: String::new(),
            kind: kind.to_owned(),
            annotations: BTreeMap::new(),
            devices: devices
                .iter()
                .map(|(name, edits)| CdiDevice {
                    name: name.clone(),
                    annotations: edits.annotations.clone(),
                    container_edits: CdiContainerEdits::from_edits(edits),
                })
                .collect(),
            container_edits: CdiContainerEdits::default(),
        };
        spec.cdi_version = spec.minimum_version().to_owned();
        spec.validate()?;
        Ok(spec)
    }

    /// Checks the spec as a container runtime's CDI library would: a known version no lower
    /// than [`minimum_version`](Self::minimum_version), valid vendor, class and device names,
    /// unique devices with non-empty edits, valid edits and annotations.
    pub fn validate(&self) -> Result<(), CdiError> {
        let version = parse_version(&self.cdi_version)
            .filter(|_| KNOWN_VERSIONS.contains(&self.cdi_version.as_str()))
            .ok_or_else(|| CdiError::InvalidContent {
                scope: "spec".into(),
                reason: format!(
                    "cdiVersion {:?} is not one of {}",
                    self.cdi_version,
                    KNOWN_VERSIONS.join(", ")
                ),
            })?;
        let minimum = self.minimum_version();
        if parse_version(minimum).is_some_and(|m| m > version) {
            return Err(CdiError::InvalidContent {
                scope: "spec".into(),
                reason: format!(
                    "cdiVersion {} is too low: the content needs {minimum}",
                    self.cdi_version
                ),
            });
        }
        let (vendor, class) = self
            .kind
            .split_once('/')
            .ok_or_else(|| CdiError::InvalidName {
                what: "kind",
                value: self.kind.clone(),
                reason: "must be <vendor>/<class>".into(),
            })?;
        check_vendor_or_class("vendor", vendor)?;
        check_vendor_or_class("class", class)?;
        check_annotations("spec", &self.annotations)?;
        self.container_edits.validate("spec")?;
        if self.devices.is_empty() {
            return Err(CdiError::InvalidContent {
                scope: "spec".into(),
                reason: "no devices".into(),
            });
        }
        let mut seen = BTreeSet::new();
        for d in &self.devices {
            validate_device_name(&d.name)?;
            if !seen.insert(d.name.as_str()) {
                return Err(CdiError::DuplicateDevice {
                    name: d.name.clone(),
                });
            }
            let scope = format!("device {}", d.name);
            check_annotations(&scope, &d.annotations)?;
            if d.container_edits.is_empty() {
                return Err(CdiError::InvalidContent {
                    scope,
                    reason: "empty container edits".into(),
                });
            }
            d.container_edits.validate(&scope)?;
        }
        Ok(())
    }
}

fn parse_version(v: &str) -> Option<(u32, u32, u32)> {
    let mut parts = v.split('.').map(|p| p.parse::<u32>().ok());
    let version = (parts.next()??, parts.next()??, parts.next()??);
    parts.next().is_none().then_some(version)
}

/// A CDI operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CdiError {
    /// A name breaks the CDI naming rules (or is unsafe in a path).
    #[error("invalid CDI {what} {value:?}: {reason}")]
    InvalidName {
        /// What kind of name: "vendor", "class", "device name", "claim UID", "share ID", "kind".
        what: &'static str,
        /// The rejected value.
        value: String,
        /// The rule it broke.
        reason: String,
    },
    /// The spec's content would be rejected by a container runtime.
    #[error("invalid CDI spec content in {scope}: {reason}")]
    InvalidContent {
        /// Where: `spec` or `device <name>`.
        scope: String,
        /// What is wrong.
        reason: String,
    },
    /// Two devices of one claim get the same CDI device name.
    #[error("two devices get the CDI device name {name:?}")]
    DuplicateDevice {
        /// The name.
        name: String,
    },
    /// A file-system operation failed.
    #[error("CDI: {op} {path} failed")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// The spec could not be serialized.
    #[error("cannot serialize CDI spec {path}")]
    Serialize {
        /// The spec file.
        path: PathBuf,
        /// The serializer's error.
        source: serde_json::Error,
    },
}

impl From<atomic_file::WriteFailure> for CdiError {
    fn from(f: atomic_file::WriteFailure) -> Self {
        CdiError::Io {
            op: f.step,
            path: f.path,
            source: f.source,
        }
    }
}

/// Checks a CDI vendor or class name: ASCII letters, digits, '_', '-' and '.', starting with a
/// letter and ending with a letter or digit.
fn check_vendor_or_class(what: &'static str, s: &str) -> Result<(), CdiError> {
    let err = |reason: &str| CdiError::InvalidName {
        what,
        value: s.to_owned(),
        reason: reason.to_owned(),
    };
    let first = s.chars().next().ok_or_else(|| err("must not be empty"))?;
    if !first.is_ascii_alphabetic() {
        return Err(err("must start with a letter"));
    }
    if !s.ends_with(|c: char| c.is_ascii_alphanumeric()) {
        return Err(err("must end with a letter or digit"));
    }
    if let Some(c) = s
        .chars()
        .find(|&c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
    {
        return Err(err(&format!(
            "contains {c:?}; only letters, digits, '_', '-' and '.' are allowed"
        )));
    }
    Ok(())
}

/// Checks a CDI device name: ASCII letters, digits, '_', '-', '.' and ':', starting and ending
/// with a letter or digit.
pub fn validate_device_name(name: &str) -> Result<(), CdiError> {
    check_device_name_rules("device name", name, usize::MAX)
}

/// Checks a claim UID before it becomes part of a CDI device name and a file name: the CDI
/// device-name characters, at most [`MAX_CLAIM_UID_LEN`] long, no "..".
pub fn validate_claim_uid(uid: &str) -> Result<(), CdiError> {
    check_device_name_rules("claim UID", uid, MAX_CLAIM_UID_LEN)
}

fn check_device_name_rules(what: &'static str, s: &str, max: usize) -> Result<(), CdiError> {
    let err = |reason: String| CdiError::InvalidName {
        what,
        value: s.to_owned(),
        reason,
    };
    if s.is_empty() {
        return Err(err("must not be empty".into()));
    }
    if s.len() > max {
        return Err(err(format!("must be no more than {max} characters")));
    }
    if let Some(c) = s
        .chars()
        .find(|&c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':')))
    {
        return Err(err(format!(
            "contains {c:?}; only letters, digits, '_', '-', '.' and ':' are allowed"
        )));
    }
    if !s.starts_with(|c: char| c.is_ascii_alphanumeric())
        || !s.ends_with(|c: char| c.is_ascii_alphanumeric())
    {
        return Err(err("must start and end with a letter or digit".into()));
    }
    if s.contains("..") {
        return Err(err("must not contain \"..\"".into()));
    }
    Ok(())
}

/// Checks annotations as Kubernetes does (CDI applies the same rules): keys are qualified names
/// (`[prefix/]name`, prefix a DNS subdomain, name at most 63 of letters, digits, '-', '_', '.'),
/// and keys and values together at most 256 KiB.
fn check_annotations(scope: &str, annotations: &BTreeMap<String, String>) -> Result<(), CdiError> {
    let bad = |reason: String| CdiError::InvalidContent {
        scope: scope.to_owned(),
        reason,
    };
    let mut total = 0usize;
    for (key, value) in annotations {
        check_annotation_key(key).map_err(|r| bad(format!("annotation key {key:?}: {r}")))?;
        total = total.saturating_add(key.len()).saturating_add(value.len());
    }
    if total > MAX_ANNOTATIONS_BYTES {
        return Err(bad(format!(
            "annotations are {total} bytes, more than {MAX_ANNOTATIONS_BYTES}"
        )));
    }
    Ok(())
}

fn check_annotation_key(key: &str) -> Result<(), String> {
    let lower = key.to_ascii_lowercase();
    let name = match lower.split('/').collect::<Vec<_>>().as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                return Err("prefix must not be empty".into());
            }
            kubedev_core::check_dns_subdomain(prefix, 253).map_err(|e| format!("prefix {e}"))?;
            *name
        }
        _ => return Err("must be [prefix/]name with at most one '/'".into()),
    };
    if name.is_empty() {
        return Err("name must not be empty".into());
    }
    if name.len() > 63 {
        return Err("name must be no more than 63 characters".into());
    }
    if !name.starts_with(|c: char| c.is_ascii_alphanumeric())
        || !name.ends_with(|c: char| c.is_ascii_alphanumeric())
    {
        return Err("name must start and end with a letter or digit".into());
    }
    if let Some(c) = name
        .chars()
        .find(|&c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(format!(
            "name contains {c:?}; only letters, digits, '-', '_' and '.' are allowed"
        ));
    }
    Ok(())
}

/// The CDI device name of an allocated device in a claim: `<claim UID>-<device>` or
/// `<claim UID>-<device>-<share ID>`.
fn device_name(claim_uid: &str, device: &AllocatedDevice) -> Result<String, CdiError> {
    let mut name = format!("{claim_uid}-{}", device.device.device);
    if let Some(share) = &device.share_id {
        check_device_name_rules("share ID", share, MAX_SHARE_ID_LEN)?;
        name.push('-');
        name.push_str(share);
    }
    validate_device_name(&name)?;
    Ok(name)
}

/// Writes a CDI spec file atomically (temporary file, fsync, rename, directory fsync) with the
/// mode container runtimes expect (0644), creating its directory. The content is written as
/// given: container runtimes read `.json` files as JSON and `.yaml` files as YAML.
pub fn write_spec_file(path: &Path, content: &[u8]) -> Result<(), CdiError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        kubedev_core::safefs::create_dir_all_mode(dir, SPEC_DIR_MODE).map_err(|source| {
            CdiError::Io {
                op: "creating directory",
                path: dir.to_path_buf(),
                source,
            }
        })?;
    }
    Ok(atomic_file::replace(path, SPEC_MODE, |f| {
        f.write_all(content)
    })?)
}

/// A claim's spec file, its bytes (`None`: no device needs edits) and its CDI device IDs.
type ClaimBytes = (PathBuf, Option<Vec<u8>>, Vec<Option<String>>);

/// Renames a directory found where a spec file belongs to the first free
/// `<name>.damaged-<n>` (container runtimes read only `.json` and `.yaml` files).
fn move_dir_aside(path: &Path) -> Result<PathBuf, CdiError> {
    let aside = (1..=1000)
        .map(|n| path.with_extension(format!("json.damaged-{n}")))
        .find(|p| fs::symlink_metadata(p).is_err())
        .unwrap_or_else(|| path.with_extension("json.damaged"));
    fs::rename(path, &aside).map_err(|source| CdiError::Io {
        op: "moving a directory aside from",
        path: path.to_path_buf(),
        source,
    })?;
    Ok(aside)
}

/// What [`CdiWriter::write_claim`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CdiClaimSpec {
    /// The spec file, or `None` when no device needed container edits (then no file exists).
    pub file: Option<PathBuf>,
    /// For each prepared device, in the order given: its qualified CDI device ID
    /// (`k8s.<driver>/claim=<name>`), or `None` when it needs no container edits.
    pub device_ids: Vec<Option<String>>,
}

/// What [`CdiWriter::ensure_claim`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SpecCheck {
    /// The spec file was exactly as it should be (or correctly absent).
    Intact,
    /// The spec file was missing or damaged and was written again.
    Repaired {
        /// What was at the path: `no file`, `a symbolic link`, `a truncated or different file`, ...
        found: String,
    },
}

/// Writes and removes one driver's claim spec files in a CDI directory.
#[derive(Debug, Clone)]
pub struct CdiWriter {
    dir: PathBuf,
    kind: String,
    /// `k8s.<driver>-claim_`: every claim file of this driver starts with it.
    file_prefix: String,
}

impl CdiWriter {
    /// A writer for `driver`'s claim specs in `cdi_dir` (normally [`DEFAULT_CDI_DIR`]). The
    /// directory is created when the first spec is written.
    pub fn new(cdi_dir: impl Into<PathBuf>, driver: &DriverName) -> Self {
        let vendor = format!("k8s.{driver}");
        CdiWriter {
            dir: cdi_dir.into(),
            kind: format!("{vendor}/{CLAIM_CLASS}"),
            file_prefix: format!("{vendor}-{CLAIM_CLASS}_"),
        }
    }

    /// The CDI directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The CDI kind of this driver's claim specs, `k8s.<driver>/claim`.
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// The spec file of a claim, `<dir>/k8s.<driver>-claim_<uid>.json`, after checking the UID.
    pub fn claim_file(&self, claim_uid: &str) -> Result<PathBuf, CdiError> {
        validate_claim_uid(claim_uid)?;
        Ok(self
            .dir
            .join(format!("{}{claim_uid}.json", self.file_prefix)))
    }

    /// The spec for a claim's prepared devices, without writing it: `None` when no device needs
    /// container edits. Every name is checked and the content validated.
    pub fn claim_spec(
        &self,
        claim_uid: &str,
        prepared: &[PreparedDevice],
    ) -> Result<(Option<CdiSpec>, Vec<Option<String>>), CdiError> {
        validate_claim_uid(claim_uid)?;
        // A variable several devices set (e.g. the list of visible GPUs) would otherwise be
        // overwritten device by device when a container gets them all: each device that sets
        // it carries the joined value of the whole claim, as the device-plugin path merges it.
        let mut joined: BTreeMap<String, String> = BTreeMap::new();
        let mut setters: BTreeMap<&str, usize> = BTreeMap::new();
        for p in prepared {
            for (k, v) in &p.edits.env {
                kubedev_core::join_env_value(&mut joined, k, v);
                *setters.entry(k.as_str()).or_default() += 1;
            }
        }
        joined.retain(|k, _| setters.get(k.as_str()).is_some_and(|n| *n > 1));
        let mut devices = Vec::new();
        let mut ids = Vec::with_capacity(prepared.len());
        let mut seen = BTreeSet::new();
        for p in prepared {
            let mut p = p.clone();
            for (k, v) in p.edits.env.iter_mut() {
                if let Some(all) = joined.get(k) {
                    v.clone_from(all);
                }
            }
            let p = &p;
            let name = device_name(claim_uid, &p.device)?;
            if !seen.insert(name.clone()) {
                return Err(CdiError::DuplicateDevice { name });
            }
            if let Some(key) = p.edits.env.keys().find(|k| k.contains('=')) {
                return Err(CdiError::InvalidContent {
                    scope: format!("device {name}"),
                    reason: format!("environment variable name {key:?} contains '='"),
                });
            }
            let container_edits = CdiContainerEdits::from_edits(&p.edits);
            if container_edits.is_empty() {
                ids.push(None);
                continue;
            }
            ids.push(Some(format!("{}={name}", self.kind)));
            devices.push(CdiDevice {
                name,
                annotations: p.edits.annotations.clone(),
                container_edits,
            });
        }
        if devices.is_empty() {
            return Ok((None, ids));
        }
        let mut spec = CdiSpec {
            cdi_version: String::new(),
            kind: self.kind.clone(),
            annotations: BTreeMap::new(),
            devices,
            container_edits: CdiContainerEdits::default(),
        };
        spec.cdi_version = spec.minimum_version().to_owned();
        spec.validate()?;
        Ok((Some(spec), ids))
    }

    /// The spec file of a claim and its exact bytes as [`CdiWriter::write_claim`] writes them
    /// (`None` when no device needs container edits), with the CDI device IDs.
    fn claim_bytes(
        &self,
        claim_uid: &str,
        prepared: &[PreparedDevice],
    ) -> Result<ClaimBytes, CdiError> {
        let path = self.claim_file(claim_uid)?;
        let (spec, device_ids) = self.claim_spec(claim_uid, prepared)?;
        let Some(spec) = spec else {
            return Ok((path, None, device_ids));
        };
        let mut bytes = serde_json::to_vec_pretty(&spec).map_err(|source| CdiError::Serialize {
            path: path.clone(),
            source,
        })?;
        bytes.push(b'\n');
        Ok((path, Some(bytes), device_ids))
    }

    /// Writes the spec file for a claim's prepared devices (replacing an earlier one atomically)
    /// and returns the CDI device IDs for the kubelet. Nothing is written when a name or the
    /// content is invalid. When no device needs container edits, an earlier file is removed.
    pub fn write_claim(
        &self,
        claim_uid: &str,
        prepared: &[PreparedDevice],
    ) -> Result<CdiClaimSpec, CdiError> {
        let (path, bytes, device_ids) = self.claim_bytes(claim_uid, prepared)?;
        let Some(bytes) = bytes else {
            self.remove_claim(claim_uid)?;
            return Ok(CdiClaimSpec {
                file: None,
                device_ids,
            });
        };
        self.put(&path, &bytes)?;
        Ok(CdiClaimSpec {
            file: Some(path),
            device_ids,
        })
    }

    /// Writes `bytes` at `path` atomically. A rename replaces a link, a FIFO or a damaged file in
    /// place (never writing through it); a directory in the way is moved aside first, to a name
    /// container runtimes do not read.
    fn put(&self, path: &Path, bytes: &[u8]) -> Result<(), CdiError> {
        kubedev_core::safefs::create_dir_all_mode(&self.dir, SPEC_DIR_MODE).map_err(|source| {
            CdiError::Io {
                op: "creating directory",
                path: self.dir.clone(),
                source,
            }
        })?;
        if fs::symlink_metadata(path).is_ok_and(|m| m.is_dir()) {
            move_dir_aside(path)?;
        }
        atomic_file::replace(path, SPEC_MODE, |f| f.write_all(bytes))?;
        Ok(())
    }

    /// Makes sure a claim's spec file holds exactly what [`CdiWriter::write_claim`] would write
    /// for `prepared`, rewriting it atomically when it is missing, differs, or is not a regular
    /// file (a link is replaced, never followed). Says what it found.
    pub fn ensure_claim(
        &self,
        claim_uid: &str,
        prepared: &[PreparedDevice],
    ) -> Result<SpecCheck, CdiError> {
        self.ensure_claim_ids(claim_uid, prepared)
            .map(|(check, _)| check)
    }

    /// [`CdiWriter::ensure_claim`], also giving the CDI device IDs for the kubelet, as
    /// [`CdiWriter::write_claim`] does (the spec is built once).
    pub fn ensure_claim_ids(
        &self,
        claim_uid: &str,
        prepared: &[PreparedDevice],
    ) -> Result<(SpecCheck, Vec<Option<String>>), CdiError> {
        let (path, bytes, ids) = self.claim_bytes(claim_uid, prepared)?;
        let Some(bytes) = bytes else {
            let check = match self.remove_claim(claim_uid)? {
                true => SpecCheck::Repaired {
                    found: "a spec file for a claim whose devices need none".into(),
                },
                false => SpecCheck::Intact,
            };
            return Ok((check, ids));
        };
        let found = match kubedev_core::safefs::read_regular(&path, bytes.len() as u64) {
            Ok(Some(current)) if current == bytes => return Ok((SpecCheck::Intact, ids)),
            Ok(Some(current)) if current.len() > bytes.len() => {
                "a longer file with other content".to_string()
            }
            Ok(Some(current)) if current.len() < bytes.len() => {
                format!(
                    "a truncated or different file ({} of {} bytes)",
                    current.len(),
                    bytes.len()
                )
            }
            Ok(Some(_)) => "a file with different content".to_string(),
            Ok(None) => "no file".to_string(),
            Err(kubedev_core::safefs::SafeOpenError::NotAFile { found, .. }) => found.to_string(),
            Err(kubedev_core::safefs::SafeOpenError::Io { source, .. }) => {
                format!("a file that cannot be read ({source})")
            }
        };
        self.put(&path, &bytes)?;
        Ok((SpecCheck::Repaired { found }, ids))
    }

    /// Removes a claim's spec file. Returns whether there was one; a missing file is success.
    pub fn remove_claim(&self, claim_uid: &str) -> Result<bool, CdiError> {
        let path = self.claim_file(claim_uid)?;
        self.remove_spec_path(&path)
    }

    /// Removes whatever is at the spec path `path` (a link itself, never its target); a
    /// directory, which kubedev never makes there, is moved aside to a name container runtimes
    /// do not read. Returns whether something was there.
    pub fn remove_spec_path(&self, path: &Path) -> Result<bool, CdiError> {
        let path = path.to_path_buf();
        if fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir()) {
            move_dir_aside(&path)?;
            return Ok(true);
        }
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(source) => {
                return Err(CdiError::Io {
                    op: "removing",
                    path,
                    source,
                });
            }
        }
        atomic_file::sync_dir(&self.dir).map_err(|source| CdiError::Io {
            op: "fsyncing directory",
            path: self.dir.clone(),
            source,
        })?;
        Ok(true)
    }

    /// This driver's claim spec files in the CDI directory, as (claim UID, path), sorted by UID.
    /// Other drivers' files, temporary files and names with an invalid UID are not listed; a
    /// missing directory lists nothing.
    pub fn list_claim_files(&self) -> Result<Vec<(String, PathBuf)>, CdiError> {
        let list_err = |source| CdiError::Io {
            op: "listing",
            path: self.dir.clone(),
            source,
        };
        let entries = match fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(list_err(e)),
        };
        let mut files = Vec::new();
        for entry in entries {
            let entry = entry.map_err(list_err)?;
            let name = entry.file_name();
            let Some(uid) = name
                .to_str()
                .and_then(|n| n.strip_prefix(&self.file_prefix))
                .and_then(|n| n.strip_suffix(".json"))
            else {
                continue;
            };
            if validate_claim_uid(uid).is_ok() {
                files.push((uid.to_owned(), entry.path()));
            }
        }
        files.sort();
        Ok(files)
    }

    /// Removes temporary files that interrupted writes of this driver's specs left behind, if
    /// they are at least `older_than` old (another daemon instance may be writing right now, so
    /// pass a margin unless no other instance can run). Returns the files removed.
    pub fn remove_stale_temp_files(&self, older_than: Duration) -> Result<Vec<PathBuf>, CdiError> {
        atomic_file::remove_stale_temps(&self.dir, &self.file_prefix, older_than).map_err(
            |source| CdiError::Io {
                op: "removing stale temporary files in",
                path: self.dir.clone(),
                source,
            },
        )
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use serde_json::json;

    use super::*;
    use crate::test_dir::TestDir;
    use kubedev_core::{DeviceName, DeviceNodeType, DeviceRef, PoolName};

    const UID: &str = "a1b2c3d4-0000-4000-8000-000000000001";
    const DIGIT_UID: &str = "0b8a6c3e-1111-4111-8111-000000000002";

    fn writer(dir: &Path) -> CdiWriter {
        CdiWriter::new(dir, &DriverName::new("gpu.example.com").unwrap())
    }

    fn allocated(device: &str, share: Option<&str>) -> AllocatedDevice {
        {
            let mut v = AllocatedDevice::new(DeviceRef {
                pool: PoolName::new("node-a").unwrap(),
                device: DeviceName::new(device).unwrap(),
            });
            v.request = "gpu".into();
            v.share_id = share.map(str::to_owned);
            v
        }
    }

    fn prepared(device: &str) -> PreparedDevice {
        let mut edits = ContainerEdits::default();
        edits.env.insert("GPU_VISIBLE".into(), device.into());
        edits
            .device_nodes
            .push(DeviceNode::new(format!("/dev/{device}"), "rw"));
        PreparedDevice::new(allocated(device, None), edits)
    }

    #[test]
    fn a_variable_several_devices_set_carries_the_whole_claims_value() {
        let w = writer(Path::new("/nonexistent"));
        let mut a = prepared("gpu-0");
        a.edits.env.insert("ONLY_A".into(), "x".into());
        let b = prepared("gpu-1");
        let (spec, _) = w.claim_spec(UID, &[a, b]).unwrap();
        let spec = spec.unwrap();
        let env = |i: usize| spec.devices[i].container_edits.env.clone();
        // A container given both devices sees both GPUs, whichever device's edits apply last.
        assert!(
            env(0).contains(&"GPU_VISIBLE=gpu-0,gpu-1".to_string()),
            "{:?}",
            env(0)
        );
        assert!(
            env(1).contains(&"GPU_VISIBLE=gpu-0,gpu-1".to_string()),
            "{:?}",
            env(1)
        );
        assert!(env(0).contains(&"ONLY_A=x".to_string()));
        assert!(!env(1).iter().any(|e| e.starts_with("ONLY_A")));
        // One device alone keeps its own value.
        let (one, _) = w.claim_spec(UID, &[prepared("gpu-3")]).unwrap();
        assert_eq!(
            one.unwrap().devices[0].container_edits.env,
            vec!["GPU_VISIBLE=gpu-3".to_string()]
        );
    }

    #[test]
    fn spec_has_the_cdi_shape_and_field_names() {
        let dir = TestDir::new("cdi");
        let w = writer(dir.path());
        let mut p = prepared("gpu-0");
        p.edits.env.insert("A".into(), "1".into());
        let node = &mut p.edits.device_nodes[0];
        node.host_path = Some("/dev/host-gpu0".into());
        node.node_type = Some(DeviceNodeType::Char);
        node.major = Some(195);
        node.minor = Some(0);
        node.file_mode = Some(0o666);
        node.uid = Some(0);
        node.gid = Some(44);
        p.edits
            .mounts
            .push(Mount::bind("/opt/lib", "/usr/lib/gpu", true));
        p.edits.hooks.push(Hook {
            hook_name: "createContainer".into(),
            path: "/usr/bin/gpu-hook".into(),
            args: vec!["gpu-hook".into(), "update-ldcache".into()],
            env: vec!["DEBUG=1".into()],
            timeout: Some(5),
        });
        p.edits
            .annotations
            .insert("gpu.example.com/model".into(), "x1".into());

        let out = w.write_claim(UID, &[p]).unwrap();
        let path = dir
            .path()
            .join(format!("k8s.gpu.example.com-claim_{UID}.json"));
        assert_eq!(out.file.as_deref(), Some(path.as_path()));
        assert_eq!(
            out.device_ids,
            [Some(format!("k8s.gpu.example.com/claim={UID}-gpu-0"))]
        );
        let written: serde_json::Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
        assert_eq!(
            written,
            json!({
                "cdiVersion": "0.6.0",
                "kind": "k8s.gpu.example.com/claim",
                "devices": [{
                    "name": format!("{UID}-gpu-0"),
                    "annotations": {"gpu.example.com/model": "x1"},
                    "containerEdits": {
                        "env": ["A=1", "GPU_VISIBLE=gpu-0"],
                        "deviceNodes": [{
                            "path": "/dev/gpu-0",
                            "hostPath": "/dev/host-gpu0",
                            "type": "c",
                            "major": 195,
                            "minor": 0,
                            "fileMode": 0o666,
                            "permissions": "rw",
                            "uid": 0,
                            "gid": 44
                        }],
                        "hooks": [{
                            "hookName": "createContainer",
                            "path": "/usr/bin/gpu-hook",
                            "args": ["gpu-hook", "update-ldcache"],
                            "env": ["DEBUG=1"],
                            "timeout": 5
                        }],
                        "mounts": [{
                            "hostPath": "/opt/lib",
                            "containerPath": "/usr/lib/gpu",
                            "options": ["rbind", "ro"],
                            "type": "bind"
                        }]
                    }
                }]
            })
        );
    }

    #[test]
    fn written_spec_round_trips_and_validates() {
        let dir = TestDir::new("cdi");
        let w = writer(dir.path());
        let devices = [prepared("gpu-0"), prepared("gpu-1")];
        let out = w.write_claim(DIGIT_UID, &devices).unwrap();
        let text = fs::read(out.file.as_ref().unwrap()).unwrap();
        let parsed: CdiSpec = serde_json::from_slice(&text).unwrap();
        let (built, ids) = w.claim_spec(DIGIT_UID, &devices).unwrap();
        assert_eq!(Some(&parsed), built.as_ref());
        assert_eq!(ids, out.device_ids);
        parsed.validate().unwrap();
        assert_eq!(parsed.devices.len(), 2);
        assert_eq!(parsed.devices[1].name, format!("{DIGIT_UID}-gpu-1"));
        assert_eq!(parsed.kind, w.kind());
    }

    #[test]
    fn minimum_version_follows_the_content() {
        let dir = TestDir::new("cdi");
        let w = writer(dir.path());
        let version = |uid: &str, p: PreparedDevice| {
            let (spec, _) = w.claim_spec(uid, &[p]).unwrap();
            spec.unwrap().cdi_version
        };
        // Baseline: name starts with a letter, no newer fields.
        assert_eq!(version(UID, prepared("gpu-0")), "0.3.0");
        // A host path equal to the path is the default and left out.
        let mut same = prepared("gpu-0");
        same.edits.device_nodes[0].host_path = Some("/dev/gpu-0".into());
        assert_eq!(version(UID, same), "0.3.0");
        // Mount type: 0.4.0; a mount without type stays at 0.3.0.
        let mut typed = prepared("gpu-0");
        typed.edits.mounts.push(Mount::bind("/a", "/b", false));
        assert_eq!(version(UID, typed.clone()), "0.4.0");
        typed.edits.mounts[0].mount_type = None;
        assert_eq!(version(UID, typed), "0.3.0");
        // A device name starting with a digit: 0.5.0.
        assert_eq!(version(DIGIT_UID, prepared("gpu-0")), "0.5.0");
        // hostPath on a device node: 0.5.0.
        let mut host = prepared("gpu-0");
        host.edits.device_nodes[0].host_path = Some("/dev/other".into());
        assert_eq!(version(UID, host), "0.5.0");
        // Device annotations: 0.6.0.
        let mut annotated = prepared("gpu-0");
        annotated.edits.annotations.insert("a".into(), "b".into());
        assert_eq!(version(UID, annotated), "0.6.0");

        // Rules only reachable through hand-built specs.
        let (spec, _) = w.claim_spec(UID, &[prepared("gpu-0")]).unwrap();
        let mut spec = spec.unwrap();
        spec.kind = "example.com/gpu.v2".into();
        assert_eq!(spec.minimum_version(), "0.6.0");
        spec.kind = "example.com/gpu".into();
        spec.annotations.insert("k".into(), "v".into());
        assert_eq!(spec.minimum_version(), "0.6.0");
        spec.annotations.clear();
        spec.container_edits.additional_gids.push(44);
        assert_eq!(spec.minimum_version(), "0.7.0");
        // Declaring less than the content needs is invalid.
        spec.cdi_version = "0.6.0".into();
        let err = spec.validate().unwrap_err();
        assert!(err.to_string().contains("needs 0.7.0"), "{err}");
        spec.cdi_version = "0.7.0".into();
        spec.validate().unwrap();
        spec.cdi_version = "0.9.0".into();
        assert!(spec.validate().is_err());
    }

    #[test]
    fn hostile_names_are_rejected_before_anything_is_written() {
        let dir = TestDir::new("cdi");
        let w = writer(dir.path());
        let long = "a".repeat(MAX_CLAIM_UID_LEN + 1);
        for bad in [
            "../x", "a/b", "", "..", "a..b", "-a", "a-", "a b", "a\0b", "ü", &long,
        ] {
            let err = w.write_claim(bad, &[prepared("gpu-0")]).unwrap_err();
            assert!(
                matches!(err, CdiError::InvalidName { what: "claim UID", ref value, .. } if value == bad),
                "{bad:?}: {err:?}"
            );
            assert!(w.remove_claim(bad).is_err(), "{bad:?}");
            assert!(w.claim_file(bad).is_err(), "{bad:?}");
        }
        validate_claim_uid(&"a".repeat(MAX_CLAIM_UID_LEN)).unwrap();
        validate_claim_uid("0").unwrap();
        validate_claim_uid("A:b_c.d-9").unwrap();

        for bad_share in [
            "../x",
            "a/b",
            "",
            "a..b",
            "-x",
            &"s".repeat(MAX_SHARE_ID_LEN + 1),
        ] {
            let mut p = prepared("gpu-0");
            p.device.share_id = Some(bad_share.to_owned());
            let err = w.write_claim(UID, &[p]).unwrap_err();
            assert!(
                matches!(
                    err,
                    CdiError::InvalidName {
                        what: "share ID",
                        ..
                    }
                ),
                "{bad_share:?}: {err:?}"
            );
        }
        assert!(
            !dir.path().exists() || dir.names().is_empty(),
            "{:?}",
            dir.names()
        );
    }

    #[test]
    fn a_spec_for_named_devices_keeps_each_devices_values() {
        let edits = |v: &str| {
            let mut e = ContainerEdits::default();
            e.env.insert("VISIBLE".into(), v.into());
            e.device_nodes
                .push(DeviceNode::new(format!("/dev/x{v}"), "rw"));
            e
        };
        let spec = CdiSpec::for_devices(
            "example.com/device",
            &[("a".into(), edits("0")), ("b".into(), edits("1"))],
        )
        .unwrap();
        assert_eq!(spec.kind, "example.com/device");
        assert_eq!(spec.devices[1].name, "b");
        assert_eq!(spec.devices[1].container_edits.env, ["VISIBLE=1"]);
        assert_eq!(
            spec.devices[0].container_edits.device_nodes[0].path,
            "/dev/x0"
        );
        assert_eq!(spec.cdi_version, "0.3.0");
        // Names, kinds and empty edits are checked as for claim specs.
        let err = CdiSpec::for_devices("example.com/device", &[("-a".into(), edits("0"))]);
        assert!(err.unwrap_err().to_string().contains("-a"));
        assert!(CdiSpec::for_devices("nokind", &[("a".into(), edits("0"))]).is_err());
        assert!(
            CdiSpec::for_devices(
                "example.com/device",
                &[("a".into(), ContainerEdits::default())]
            )
            .is_err()
        );
        let dup = CdiSpec::for_devices(
            "example.com/device",
            &[("a".into(), edits("0")), ("a".into(), edits("1"))],
        );
        assert!(dup.is_err());
    }

    #[test]
    fn vendor_class_and_device_name_rules() {
        for ok in ["a", "k8s.gpu.example.com", "A_b-c.9"] {
            check_vendor_or_class("vendor", ok).unwrap();
        }
        for bad in ["", "9a", ".a", "a.", "a/b", "a=b", "a b"] {
            assert!(check_vendor_or_class("vendor", bad).is_err(), "{bad:?}");
        }
        for ok in ["0", "a", "uid-gpu-0", "x:y.z_w"] {
            validate_device_name(ok).unwrap();
        }
        for bad in ["", "-a", "a-", "a/b", "a=b", ":a", "a b"] {
            assert!(validate_device_name(bad).is_err(), "{bad:?}");
        }
        let spec = CdiSpec {
            cdi_version: "0.3.0".into(),
            kind: "noslash".into(),
            annotations: BTreeMap::new(),
            devices: Vec::new(),
            container_edits: CdiContainerEdits::default(),
        };
        let err = spec.validate().unwrap_err();
        assert!(
            matches!(err, CdiError::InvalidName { what: "kind", .. }),
            "{err:?}"
        );
    }

    #[test]
    fn shared_devices_get_the_share_id_and_duplicates_are_rejected() {
        let dir = TestDir::new("cdi");
        let w = writer(dir.path());
        let mut a = prepared("gpu-0");
        a.device.share_id = Some("s-1".into());
        let mut b = prepared("gpu-0");
        b.device.share_id = Some("s-2".into());
        let out = w.write_claim(UID, &[a.clone(), b]).unwrap();
        assert_eq!(
            out.device_ids,
            [
                Some(format!("k8s.gpu.example.com/claim={UID}-gpu-0-s-1")),
                Some(format!("k8s.gpu.example.com/claim={UID}-gpu-0-s-2")),
            ]
        );
        // The same device name from another pool would collide.
        let mut c = prepared("gpu-0");
        c.device.device.pool = PoolName::new("node-b").unwrap();
        let err = w.write_claim(UID, &[prepared("gpu-0"), c]).unwrap_err();
        assert!(matches!(err, CdiError::DuplicateDevice { .. }), "{err:?}");
        let err = w.write_claim(UID, &[a.clone(), a]).unwrap_err();
        assert!(err.to_string().contains("gpu-0-s-1"), "{err}");
    }

    #[test]
    fn devices_without_edits_get_no_cdi_device() {
        let dir = TestDir::new("cdi");
        let w = writer(dir.path());
        let mut bare = prepared("gpu-1");
        bare.edits = ContainerEdits::default();
        bare.edits
            .annotations
            .insert("only".into(), "metadata".into());
        let out = w
            .write_claim(UID, &[prepared("gpu-0"), bare.clone()])
            .unwrap();
        assert_eq!(
            out.device_ids,
            [Some(format!("k8s.gpu.example.com/claim={UID}-gpu-0")), None]
        );
        let spec: CdiSpec = serde_json::from_slice(&fs::read(out.file.unwrap()).unwrap()).unwrap();
        assert_eq!(spec.devices.len(), 1);
        // A claim where nothing needs edits has no file, and an earlier one is removed.
        let out = w.write_claim(UID, &[bare]).unwrap();
        assert_eq!(out.file, None);
        assert_eq!(out.device_ids, [None]);
        assert!(dir.names().is_empty(), "{:?}", dir.names());
    }

    #[test]
    fn invalid_content_is_rejected_and_the_old_file_stays() {
        let dir = TestDir::new("cdi");
        let w = writer(dir.path());
        let out = w.write_claim(UID, &[prepared("gpu-0")]).unwrap();
        let path = out.file.unwrap();
        let before = fs::read(&path).unwrap();

        let mut cases: Vec<(PreparedDevice, &str)> = Vec::new();
        let mut p = prepared("gpu-0");
        p.edits.env.insert("A=B".into(), "1".into());
        cases.push((p, "environment"));
        let mut p = prepared("gpu-0");
        p.edits.env.insert(String::new(), "1".into());
        cases.push((p, "empty name"));
        let mut p = prepared("gpu-0");
        p.edits.device_nodes[0].permissions = Some("rwx".into());
        cases.push((p, "permissions"));
        let mut p = prepared("gpu-0");
        p.edits.device_nodes[0].path.clear();
        cases.push((p, "empty path"));
        let mut p = prepared("gpu-0");
        p.edits.hooks.push(Hook {
            hook_name: "beforeBoot".into(),
            path: "/bin/true".into(),
            args: Vec::new(),
            env: Vec::new(),
            timeout: None,
        });
        cases.push((p, "hook name"));
        let mut p = prepared("gpu-0");
        p.edits.hooks.push(Hook {
            hook_name: "poststop".into(),
            path: "/bin/true".into(),
            args: Vec::new(),
            env: vec!["NOEQUALS".into()],
            timeout: None,
        });
        cases.push((p, "no '='"));
        let mut p = prepared("gpu-0");
        p.edits.mounts.push(Mount::bind("", "/x", true));
        cases.push((p, "empty host path"));
        let mut p = prepared("gpu-0");
        p.edits.annotations.insert("bad key!".into(), "v".into());
        cases.push((p, "annotation key"));
        let mut p = prepared("gpu-0");
        p.edits
            .annotations
            .insert("big".into(), "x".repeat(MAX_ANNOTATIONS_BYTES));
        cases.push((p, "bytes"));

        for (p, why) in cases {
            let err = w.write_claim(UID, &[p]).unwrap_err();
            assert!(
                matches!(err, CdiError::InvalidContent { .. }),
                "{why}: {err:?}"
            );
            assert!(err.to_string().contains(why), "{why}: {err}");
            assert_eq!(fs::read(&path).unwrap(), before, "{why}: old file changed");
        }
        assert_eq!(dir.names().len(), 1);
    }

    #[test]
    fn annotation_keys_follow_kubernetes_rules() {
        for ok in ["a", "gpu.example.com/model", "A_b.c-9", "Example.COM/x"] {
            check_annotation_key(ok).unwrap();
        }
        for bad in [
            "",
            "/a",
            "a/",
            "a/b/c",
            "-a",
            "a b",
            "bad_domain/x",
            &"n".repeat(64),
        ] {
            assert!(check_annotation_key(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn files_are_0644_and_no_temporary_file_remains() {
        let dir = TestDir::new("cdi");
        let cdi_dir = dir.path().join("run").join("cdi");
        let w = writer(&cdi_dir);
        let out = w.write_claim(UID, &[prepared("gpu-0")]).unwrap();
        w.write_claim(UID, &[prepared("gpu-1")]).unwrap();
        let path = out.file.unwrap();
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o644);
        let names: Vec<_> = fs::read_dir(&cdi_dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, [format!("k8s.gpu.example.com-claim_{UID}.json")]);
        let spec: CdiSpec = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
        assert_eq!(
            spec.devices[0].name,
            format!("{UID}-gpu-1"),
            "rewritten in place"
        );
    }

    /// Every kind of damage to a spec kubedev owns is found and repaired in place; a link's
    /// target is never written.
    #[test]
    fn damaged_specs_are_rewritten_and_links_never_followed() {
        let dir = TestDir::new("cdi-damage");
        let cdi_dir = dir.path().join("cdi");
        let w = writer(&cdi_dir);
        let devices = [prepared("gpu-0"), prepared("gpu-1")];
        let path = w.write_claim(UID, &devices).unwrap().file.unwrap();
        let good = fs::read(&path).unwrap();
        assert_eq!(w.ensure_claim(UID, &devices).unwrap(), SpecCheck::Intact);
        let victim = dir.path().join("victim");
        fs::write(&victim, "not a spec").unwrap();

        type Damage = Box<dyn Fn(&Path)>;
        let cases: Vec<(&str, Damage, &str)> = vec![
            (
                "missing",
                Box::new(|p: &Path| fs::remove_file(p).unwrap()),
                "no file",
            ),
            (
                "truncated",
                Box::new(|p: &Path| {
                    let f = fs::OpenOptions::new().write(true).open(p).unwrap();
                    f.set_len(300).unwrap();
                }),
                "truncated",
            ),
            (
                "garbage",
                Box::new(|p: &Path| fs::write(p, vec![0xffu8; 2000]).unwrap()),
                "other content",
            ),
            (
                "other spec",
                Box::new(|p: &Path| fs::write(p, b"{}").unwrap()),
                "truncated or different",
            ),
            (
                "directory",
                Box::new(|p: &Path| {
                    fs::remove_file(p).unwrap();
                    fs::create_dir(p).unwrap();
                    fs::write(p.join("inside"), "x").unwrap();
                }),
                "a directory",
            ),
            (
                "symlink",
                Box::new({
                    let victim = victim.clone();
                    move |p: &Path| {
                        fs::remove_file(p).unwrap();
                        std::os::unix::fs::symlink(&victim, p).unwrap();
                    }
                }),
                "a symbolic link",
            ),
            (
                "fifo",
                Box::new(|p: &Path| {
                    fs::remove_file(p).unwrap();
                    rustix::fs::mknodat(
                        rustix::fs::CWD,
                        p,
                        rustix::fs::FileType::Fifo,
                        rustix::fs::Mode::from_raw_mode(0o644),
                        0,
                    )
                    .unwrap();
                }),
                "FIFO",
            ),
        ];
        for (what, damage, found) in cases {
            damage(&path);
            match w.ensure_claim(UID, &devices).unwrap() {
                SpecCheck::Repaired { found: f } => assert!(f.contains(found), "{what}: {f}"),
                other => panic!("{what}: {other:?}"),
            }
            let meta = fs::symlink_metadata(&path).unwrap();
            assert!(meta.is_file(), "{what}: not a regular file after repair");
            assert_eq!(meta.permissions().mode() & 0o777, 0o644, "{what}");
            assert_eq!(fs::read(&path).unwrap(), good, "{what}");
            assert_eq!(
                w.ensure_claim(UID, &devices).unwrap(),
                SpecCheck::Intact,
                "{what}"
            );
        }
        assert_eq!(fs::read_to_string(&victim).unwrap(), "not a spec");
        // The directory was moved aside, under a name no container runtime reads as a spec.
        let listed: Vec<_> = w.list_claim_files().unwrap();
        assert_eq!(listed, [(UID.to_string(), path.clone())]);
    }

    #[test]
    fn remove_and_list_claim_files() {
        let dir = TestDir::new("cdi");
        let w = writer(dir.path());
        assert!(w.list_claim_files().unwrap().is_empty());
        assert!(!w.remove_claim(UID).unwrap(), "absent file is success");
        w.write_claim(UID, &[prepared("gpu-0")]).unwrap();
        w.write_claim(DIGIT_UID, &[prepared("gpu-1")]).unwrap();
        // Files that are not ours.
        let other = writer(dir.path().join("unused").as_path());
        assert_ne!(other.dir(), w.dir());
        CdiWriter::new(dir.path(), &DriverName::new("other.example.com").unwrap())
            .write_claim(UID, &[prepared("gpu-0")])
            .unwrap();
        fs::write(
            dir.path().join("k8s.gpu.example.com-claim_bad..uid.json"),
            b"{}",
        )
        .unwrap();
        fs::write(dir.path().join("k8s.gpu.example.com-claim_x.yaml"), b"{}").unwrap();
        fs::write(dir.path().join("vendor.json"), b"{}").unwrap();
        fs::write(
            dir.path()
                .join(format!(".k8s.gpu.example.com-claim_{UID}.json.tmp-1-2-3")),
            b"{",
        )
        .unwrap();

        let listed = w.list_claim_files().unwrap();
        let mut expected = vec![
            (UID.to_string(), w.claim_file(UID).unwrap()),
            (DIGIT_UID.to_string(), w.claim_file(DIGIT_UID).unwrap()),
        ];
        expected.sort();
        assert_eq!(listed, expected);

        assert!(w.remove_claim(UID).unwrap());
        assert!(!w.claim_file(UID).unwrap().exists());
        assert!(!w.remove_claim(UID).unwrap());
        assert_eq!(w.list_claim_files().unwrap().len(), 1);

        let removed = w.remove_stale_temp_files(Duration::ZERO).unwrap();
        assert_eq!(removed.len(), 1);
        assert!(removed[0].to_string_lossy().contains(".tmp-"));
        assert!(
            w.remove_stale_temp_files(Duration::ZERO)
                .unwrap()
                .is_empty()
        );
        // The other driver's file is untouched.
        assert!(
            dir.path()
                .join(format!("k8s.other.example.com-claim_{UID}.json"))
                .exists()
        );
    }

    #[test]
    fn version_parsing() {
        assert_eq!(parse_version("0.5.0"), Some((0, 5, 0)));
        assert_eq!(parse_version("1.10.2"), Some((1, 10, 2)));
        for bad in ["", "1", "1.2", "1.2.3.4", "v1.2.3", "1.x.3"] {
            assert_eq!(parse_version(bad), None, "{bad:?}");
        }
    }
}
