//! What a CDI spec makes a container look like: per device node, mount and environment
//! variable of the edits a test checks, the expectation, read from the spec, the fake nodes and
//! the host.

use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};

use serde_json::Value;
use sha2::Digest as _;

use super::{FakeNode, OVERLAID, PodmanError};

/// What one device node must look like in the container.
#[derive(Debug)]
pub(super) struct NodeExpect {
    pub(super) origin: String,
    pub(super) path: String,
    /// `(char, major, minor)`, or why it cannot be known.
    pub(super) id: Result<(bool, u64, u64), String>,
    pub(super) mode: Option<u32>,
    pub(super) uid: Option<u32>,
    pub(super) gid: Option<u32>,
    pub(super) read: bool,
    pub(super) write: bool,
}

/// What the host has at a mount's host path.
#[derive(Debug)]
pub(super) enum HostObject {
    File { sha256: String },
    Dir { names: Vec<String> },
    Other,
}

/// What one mount must look like in the container.
#[derive(Debug)]
pub(super) struct MountExpect {
    pub(super) origin: String,
    pub(super) container_path: String,
    pub(super) host_path: String,
    pub(super) bind: bool,
    /// The host object, or why it cannot be read.
    pub(super) host: Result<(HostObject, &'static str), String>,
    /// `(st_dev, st_ino)` of the host object, when the container must see that very object.
    pub(super) identity: Option<(u64, u64)>,
    pub(super) read_only: bool,
}

/// The expectations of one spec for some of its devices.
#[derive(Debug, Default)]
pub(super) struct SpecExpectations {
    pub(super) nodes: Vec<NodeExpect>,
    pub(super) mounts: Vec<MountExpect>,
    /// Key → (value, origin); later edits win.
    pub(super) env: Vec<(String, String, String)>,
}

/// The kind of file, in the words of `stat -c %F`.
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
    /// The expectations of the JSON spec `spec` for `devices` (names, or IDs of its kind) and
    /// its spec-level edits.
    pub(super) fn new(
        spec: &str,
        devices: &[String],
        fakes: &[FakeNode],
    ) -> Result<Self, PodmanError> {
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

    /// Adds the expectations of the `containerEdits` `edits`, which come from `origin`.
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

/// The expectation of the spec's device node `n` (an entry of `deviceNodes`).
fn node_expect(n: &Value, origin: &str, fakes: &[FakeNode]) -> NodeExpect {
    let path = n["path"].as_str().unwrap_or_default().to_string();
    let host = n["hostPath"]
        .as_str()
        .filter(|h| !h.is_empty())
        .unwrap_or(&path)
        .to_string();
    let id = node_id(n, host_node_id(&host, fakes));
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

/// `(char, major, minor)` of the node the spec's device node `n` must be: the spec's `type`,
/// `major` and `minor`, each missing one taken from `host_id`.
fn node_id(
    n: &Value,
    host_id: Result<(bool, u64, u64), String>,
) -> Result<(bool, u64, u64), String> {
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
}

/// `(char, major, minor)` of the node at `host`: the fake node for that path, or else the
/// host's own device node.
fn host_node_id(host: &str, fakes: &[FakeNode]) -> Result<(bool, u64, u64), String> {
    if let Some(f) = fakes.iter().find(|f| f.path == host) {
        return Ok((f.char_device, f.major.into(), f.minor.into()));
    }
    let meta = std::fs::metadata(host).map_err(|e| {
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
}

/// The expectation of the spec's mount `m` (an entry of `mounts`).
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
        read_host_object(&host_path)
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

/// What the host has at `host_path` (a file's digest, a directory's sorted names) with its
/// kind, or why it cannot be read.
fn read_host_object(host_path: &str) -> Result<(HostObject, &'static str), String> {
    match std::fs::metadata(host_path) {
        Ok(meta) => {
            let ft = meta.file_type();
            let object = if ft.is_file() {
                std::fs::read(host_path)
                    .map(|b| HostObject::File {
                        sha256: hex(&sha2::Sha256::digest(&b)),
                    })
                    .map_err(|e| format!("reading {host_path}: {}", kubedev_core::echo::chain(&e)))
            } else if ft.is_dir() {
                std::fs::read_dir(host_path)
                    .map(|d| {
                        let mut names: Vec<String> = d
                            .filter_map(|e| e.ok())
                            .map(|e| e.file_name().to_string_lossy().into_owned())
                            .collect();
                        names.sort();
                        HostObject::Dir { names }
                    })
                    .map_err(|e| format!("listing {host_path}: {}", kubedev_core::echo::chain(&e)))
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
}

/// Lowercase hexadecimal digits of `bytes`.
pub(super) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
