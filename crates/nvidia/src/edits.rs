//! What a container gets for a GPU or a MIG device.

use std::collections::BTreeMap;
use std::path::Path;

use kubedev_core::{ContainerEdits, DeviceNode, HostFs};

/// The env variable the NVIDIA container runtime reads: the UUIDs of the visible GPUs and MIG
/// devices, comma separated.
pub const NVIDIA_VISIBLE_DEVICES: &str = "NVIDIA_VISIBLE_DEVICES";

/// Where the driver lists the minor numbers of the MIG capability nodes.
pub const MIG_MINORS_FILE: &str = "/proc/driver/nvidia-caps/mig-minors";

/// Control nodes every CUDA container needs; the `uvm` ones only exist once the `nvidia-uvm`
/// module is loaded and `modeset` once `nvidia-modeset` is, so they are given only when the host
/// has them.
const CONTROL_NODES: [(&str, bool); 4] = [
    ("/dev/nvidiactl", true),
    ("/dev/nvidia-uvm", false),
    ("/dev/nvidia-uvm-tools", false),
    ("/dev/nvidia-modeset", false),
];

/// Where a container's device nodes come from, and the driver files every device brings.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EditSource<'a> {
    /// The host file system kubedev sees.
    pub(crate) host: &'a HostFs,
    /// The host directory whose `dev/` holds the device nodes (`/` on most hosts).
    pub(crate) dev_root: &'a Path,
    /// The mounts (and hooks) of the driver's user-space files.
    pub(crate) driver: &'a ContainerEdits,
}

impl EditSource<'_> {
    /// The device node at container path `path`, taken from the dev root on the host.
    fn node(&self, path: &str) -> DeviceNode {
        let mut n = DeviceNode::new(path, "rw");
        if self.dev_root != Path::new("/") {
            n.host_path = Some(self.host_path(path));
        }
        n
    }

    fn host_path(&self, path: &str) -> String {
        self.dev_root
            .join(path.trim_start_matches('/'))
            .to_string_lossy()
            .into_owned()
    }

    fn exists(&self, path: &str) -> bool {
        self.host.exists(self.host_path(path))
    }
}

/// The nvidia-caps minors (`gpu0/gi1/access 12` → `"gpu0/gi1/access"` → 12); malformed lines
/// are skipped.
pub(crate) fn parse_mig_minors(text: &str) -> BTreeMap<String, u32> {
    text.lines()
        .filter_map(|line| {
            let (name, minor) = line.trim().rsplit_once(char::is_whitespace)?;
            Some((name.trim().to_string(), minor.trim().parse().ok()?))
        })
        .collect()
}

/// Reads the MIG capability minors through the host root; empty when the file is missing.
pub(crate) fn read_mig_minors(host: &HostFs) -> BTreeMap<String, u32> {
    match host.read_to_string(MIG_MINORS_FILE) {
        Ok(text) => parse_mig_minors(&text),
        Err(e) => {
            if !e.is_not_found() {
                tracing::warn!(error = %kubedev_core::echo::Chain(&e), "cannot read the MIG capability minors");
            }
            BTreeMap::new()
        }
    }
}

fn base(src: &EditSource<'_>, minor: u32, uuid: &str) -> ContainerEdits {
    let mut edits = ContainerEdits::default();
    edits
        .env
        .insert(NVIDIA_VISIBLE_DEVICES.to_string(), uuid.to_string());
    for (path, always) in CONTROL_NODES {
        if always || src.exists(path) {
            edits.device_nodes.push(src.node(path));
        }
    }
    edits
        .device_nodes
        .push(src.node(&format!("/dev/nvidia{minor}")));
    edits.mounts.extend(src.driver.mounts.iter().cloned());
    edits.hooks.extend(src.driver.hooks.iter().cloned());
    edits
}

/// Edits for a whole GPU.
pub(crate) fn gpu_edits(src: &EditSource<'_>, minor: u32, uuid: &str) -> ContainerEdits {
    base(src, minor, uuid)
}

/// Edits for a MIG device: the parent's node, and the capability nodes of its GPU and compute
/// instance (`/dev/nvidia-caps/nvidia-cap<N>`, numbered as the driver lists them).
pub(crate) fn mig_edits(
    src: &EditSource<'_>,
    minors: &BTreeMap<String, u32>,
    parent_minor: u32,
    mig_uuid: &str,
    gi: u32,
    ci: u32,
) -> ContainerEdits {
    let mut edits = base(src, parent_minor, mig_uuid);
    for cap in [
        format!("gpu{parent_minor}/gi{gi}/access"),
        format!("gpu{parent_minor}/gi{gi}/ci{ci}/access"),
    ] {
        match minors.get(&cap) {
            Some(n) => edits
                .device_nodes
                .push(src.node(&format!("/dev/nvidia-caps/nvidia-cap{n}"))),
            None if !minors.is_empty() => {
                tracing::warn!(capability = %cap, "no minor listed for MIG capability");
            }
            None => {}
        }
    }
    edits
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn minors_parse_and_map_to_cap_nodes() {
        let m = parse_mig_minors(
            "config 1\nmonitor 2\ngpu0/gi0/access 3\ngpu0/gi0/ci0/access 4\nbroken\ngpu1/gi7/access x\n",
        );
        assert_eq!(m.len(), 4);
        assert_eq!(m["gpu0/gi0/ci0/access"], 4);
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("dev")).unwrap();
        std::fs::write(d.path().join("dev/nvidia-uvm"), b"").unwrap();
        let host = HostFs::new(d.path());
        let driver = ContainerEdits::default();
        let src = EditSource {
            host: &host,
            dev_root: Path::new("/"),
            driver: &driver,
        };
        let e = mig_edits(&src, &m, 0, "MIG-1", 0, 0);
        let paths: Vec<_> = e.device_nodes.iter().map(|n| n.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "/dev/nvidiactl",
                "/dev/nvidia-uvm",
                "/dev/nvidia0",
                "/dev/nvidia-caps/nvidia-cap3",
                "/dev/nvidia-caps/nvidia-cap4"
            ]
        );
        assert_eq!(e.env[NVIDIA_VISIBLE_DEVICES], "MIG-1");
        let g = gpu_edits(&src, 5, "GPU-5");
        assert_eq!(g.device_nodes.last().unwrap().path, "/dev/nvidia5");
        assert_eq!(
            g.device_nodes.last().unwrap().permissions.as_deref(),
            Some("rw")
        );
        assert_eq!(g.device_nodes.last().unwrap().host_path, None);
    }

    #[test]
    fn nodes_come_from_the_dev_root_and_every_device_carries_the_driver_files() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("run/nvidia/driver/dev")).unwrap();
        std::fs::write(d.path().join("run/nvidia/driver/dev/nvidia-modeset"), b"").unwrap();
        let host = HostFs::new(d.path());
        let driver = ContainerEdits::default().with_mount(kubedev_core::Mount::bind(
            "/run/nvidia/driver/usr/bin/nvidia-smi",
            "/usr/bin/nvidia-smi",
            true,
        ));
        let src = EditSource {
            host: &host,
            dev_root: Path::new("/run/nvidia/driver"),
            driver: &driver,
        };
        let g = gpu_edits(&src, 2, "GPU-2");
        let nodes: Vec<_> = g
            .device_nodes
            .iter()
            .map(|n| (n.path.as_str(), n.host_path.as_deref().unwrap()))
            .collect();
        assert_eq!(
            nodes,
            [
                ("/dev/nvidiactl", "/run/nvidia/driver/dev/nvidiactl"),
                (
                    "/dev/nvidia-modeset",
                    "/run/nvidia/driver/dev/nvidia-modeset"
                ),
                ("/dev/nvidia2", "/run/nvidia/driver/dev/nvidia2"),
            ]
        );
        assert_eq!(g.mounts, driver.mounts);
    }
}
