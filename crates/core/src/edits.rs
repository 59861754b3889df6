//! What a container gets for its devices, in the CDI vocabulary.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The kind of a device node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DeviceNodeType {
    /// A character device (`c`).
    #[serde(rename = "c")]
    Char,
    /// A block device (`b`).
    #[serde(rename = "b")]
    Block,
    /// An unbuffered character device (`u`).
    #[serde(rename = "u")]
    Unbuffered,
    /// A FIFO (`p`).
    #[serde(rename = "p")]
    Fifo,
}

/// A device node to create in the container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct DeviceNode {
    /// Path inside the container.
    pub path: String,
    /// Path on the host, when it differs from `path`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<String>,
    /// Node type; the runtime reads it from the host node when absent.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub node_type: Option<DeviceNodeType>,
    /// Major number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub major: Option<i64>,
    /// Minor number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minor: Option<i64>,
    /// File mode of the node in the container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_mode: Option<u32>,
    /// cgroup permissions, a combination of `r`, `w` and `m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions: Option<String>,
    /// Owner uid in the container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// Owner gid in the container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,
}

impl DeviceNode {
    /// A node at the same path in the host and the container, with the given permissions.
    pub fn new(path: impl Into<String>, permissions: impl Into<String>) -> Self {
        DeviceNode {
            path: path.into(),
            host_path: None,
            node_type: None,
            major: None,
            minor: None,
            file_mode: None,
            permissions: Some(permissions.into()),
            uid: None,
            gid: None,
        }
    }

    /// Taken from `host_path` on the host (when it is not at `path` there).
    pub fn with_host_path(mut self, host_path: impl Into<String>) -> Self {
        self.host_path = Some(host_path.into());
        self
    }

    /// Of the type `node_type` (the runtime reads it from the host node otherwise).
    pub fn with_node_type(mut self, node_type: DeviceNodeType) -> Self {
        self.node_type = Some(node_type);
        self
    }

    /// With the device numbers `major` and `minor`.
    pub fn with_numbers(mut self, major: i64, minor: i64) -> Self {
        self.major = Some(major);
        self.minor = Some(minor);
        self
    }

    /// With the file mode `mode` in the container.
    pub fn with_file_mode(mut self, mode: u32) -> Self {
        self.file_mode = Some(mode);
        self
    }

    /// Owned by `uid` and `gid` in the container.
    pub fn with_owner(mut self, uid: u32, gid: u32) -> Self {
        self.uid = Some(uid);
        self.gid = Some(gid);
        self
    }

    /// The host path (`host_path`, or `path` when they are the same).
    pub fn host_path(&self) -> &str {
        self.host_path.as_deref().unwrap_or(&self.path)
    }
}

/// A mount into the container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct Mount {
    /// Source on the host.
    pub host_path: String,
    /// Target in the container.
    pub container_path: String,
    /// Mount options, e.g. `ro`, `bind`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
    /// Mount type, e.g. `bind`.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub mount_type: Option<String>,
}

impl Mount {
    /// A mount of `host` at `container`, without options or type.
    pub fn new(host: impl Into<String>, container: impl Into<String>) -> Self {
        Mount {
            host_path: host.into(),
            container_path: container.into(),
            options: Vec::new(),
            mount_type: None,
        }
    }

    /// With the mount options `options`, e.g. `rbind`, `ro`.
    pub fn with_options(mut self, options: Vec<String>) -> Self {
        self.options = options;
        self
    }

    /// Of the mount type `mount_type`, e.g. `bind`.
    pub fn with_type(mut self, mount_type: impl Into<String>) -> Self {
        self.mount_type = Some(mount_type.into());
        self
    }

    /// A bind mount; read-only when `read_only`.
    pub fn bind(host: impl Into<String>, container: impl Into<String>, read_only: bool) -> Self {
        let mut options = vec!["rbind".to_string()];
        options.push(if read_only { "ro" } else { "rw" }.to_string());
        Mount::new(host, container)
            .with_options(options)
            .with_type("bind")
    }

    /// True when the options make the mount read-only.
    pub fn is_read_only(&self) -> bool {
        self.options.iter().any(|o| o == "ro")
    }
}

/// An OCI hook to run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct Hook {
    /// When it runs: `createRuntime`, `createContainer`, `startContainer`, `poststart`, `poststop`.
    pub hook_name: String,
    /// Executable path on the host.
    pub path: String,
    /// Arguments, including argv\[0\].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Environment, `KEY=VALUE`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Timeout in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<i64>,
}

impl Hook {
    /// The executable `path` run at `hook_name` (e.g. `createContainer`), without arguments,
    /// environment or timeout.
    pub fn new(hook_name: impl Into<String>, path: impl Into<String>) -> Self {
        Hook {
            hook_name: hook_name.into(),
            path: path.into(),
            args: Vec::new(),
            env: Vec::new(),
            timeout: None,
        }
    }

    /// With the arguments `args`, including argv\[0\].
    pub fn with_args(mut self, args: Vec<String>) -> Self {
        self.args = args;
        self
    }

    /// With the environment `env` (`KEY=VALUE` entries).
    pub fn with_env(mut self, env: Vec<String>) -> Self {
        self.env = env;
        self
    }

    /// With a timeout of `seconds`.
    pub fn with_timeout(mut self, seconds: i64) -> Self {
        self.timeout = Some(seconds);
        self
    }
}

/// Everything a container needs to use some devices: the CDI `containerEdits`, plus annotations.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct ContainerEdits {
    /// Environment variables.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Device nodes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
    /// Mounts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
    /// Hooks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<Hook>,
    /// Annotations for the container runtime.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

impl ContainerEdits {
    /// No edits (add them with the `with_` methods or through the public fields).
    pub fn new() -> Self {
        Self::default()
    }

    /// With the environment variable `name=value`.
    pub fn with_env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.insert(name.into(), value.into());
        self
    }

    /// With a device node.
    pub fn with_device_node(mut self, node: DeviceNode) -> Self {
        self.device_nodes.push(node);
        self
    }

    /// With a mount.
    pub fn with_mount(mut self, mount: Mount) -> Self {
        self.mounts.push(mount);
        self
    }

    /// With a hook.
    pub fn with_hook(mut self, hook: Hook) -> Self {
        self.hooks.push(hook);
        self
    }

    /// With an annotation for the container runtime.
    pub fn with_annotation(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.annotations.insert(key.into(), value.into());
        self
    }

    /// True when there is nothing to apply.
    pub fn is_empty(&self) -> bool {
        self.env.is_empty()
            && self.device_nodes.is_empty()
            && self.mounts.is_empty()
            && self.hooks.is_empty()
            && self.annotations.is_empty()
    }

    /// Adds `other` to `self`: device nodes and mounts already present (same container path) are
    /// kept once; for an env variable or annotation set by both, values that differ are joined
    /// with ',' and parts already present are not repeated (so `VISIBLE=a` + `VISIBLE=b,a`
    /// gives `a,b`).
    pub fn merge(&mut self, other: &ContainerEdits) {
        for (k, v) in &other.env {
            join_env_value(&mut self.env, k, v);
        }
        for (k, v) in &other.annotations {
            join_env_value(&mut self.annotations, k, v);
        }
        for n in &other.device_nodes {
            if !self.device_nodes.iter().any(|m| m.path == n.path) {
                self.device_nodes.push(n.clone());
            }
        }
        for m in &other.mounts {
            if !self
                .mounts
                .iter()
                .any(|x| x.container_path == m.container_path)
            {
                self.mounts.push(m.clone());
            }
        }
        for h in &other.hooks {
            if !self.hooks.contains(h) {
                self.hooks.push(h.clone());
            }
        }
    }
}

/// Sets the environment variable `k` in `map` to `v`, or, when it is set already, appends each
/// comma-separated part of `v` it does not contain yet (how several devices' `NVIDIA_VISIBLE_DEVICES`
/// become one list).
pub fn join_env_value(map: &mut BTreeMap<String, String>, k: &str, v: &str) {
    match map.get_mut(k) {
        None => {
            map.insert(k.to_owned(), v.to_owned());
        }
        Some(cur) => {
            for part in v.split(',') {
                if !cur.split(',').any(|p| p == part) {
                    cur.push(',');
                    cur.push_str(part);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_joins_env_and_dedupes_nodes_and_mounts() {
        let mut a = ContainerEdits::default();
        a.env.insert("VISIBLE".into(), "gpu-0".into());
        a.device_nodes.push(DeviceNode::new("/dev/ctl", "rw"));
        a.device_nodes.push(DeviceNode::new("/dev/gpu0", "rw"));
        a.mounts.push(Mount::bind("/opt/lib", "/usr/lib/x", true));
        let mut b = ContainerEdits::default();
        b.env.insert("VISIBLE".into(), "gpu-1".into());
        b.env.insert("OTHER".into(), "1".into());
        a.env.insert("CAPS".into(), "compute,video".into());
        b.env.insert("CAPS".into(), "video,compute,display".into());
        b.device_nodes.push(DeviceNode::new("/dev/ctl", "rw"));
        b.device_nodes.push(DeviceNode::new("/dev/gpu1", "rw"));
        b.mounts.push(Mount::bind("/opt/lib", "/usr/lib/x", true));
        a.merge(&b);
        a.merge(&b);
        assert_eq!(a.env["VISIBLE"], "gpu-0,gpu-1");
        assert_eq!(a.env["OTHER"], "1");
        assert_eq!(a.env["CAPS"], "compute,video,display");
        let paths: Vec<_> = a.device_nodes.iter().map(|n| n.path.as_str()).collect();
        assert_eq!(paths, ["/dev/ctl", "/dev/gpu0", "/dev/gpu1"]);
        assert_eq!(a.mounts.len(), 1);
        assert!(a.mounts[0].is_read_only());
    }

    #[test]
    fn edits_serialize_in_cdi_shape() {
        let mut n = DeviceNode::new("/dev/gpu0", "rw");
        n.node_type = Some(DeviceNodeType::Char);
        n.major = Some(195);
        let v = serde_json::to_value(&n).expect("serialize");
        assert_eq!(
            v,
            serde_json::json!({"path": "/dev/gpu0", "type": "c", "major": 195, "permissions": "rw"})
        );
    }
}
