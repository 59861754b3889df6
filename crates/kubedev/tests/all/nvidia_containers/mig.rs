//! MIG devices in a container: a static MIG device with its capability nodes and MIG UUID, and
//! a MIG placement created on prepare.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common;
use kubedev_testkit::podman::Podman;

use super::{
    CAPS_MAJOR, DRIVER, DriverRoot, Fixture, NODES_SCRIPT, WAIT, assert_nodes, assert_user_view,
    dra_node, dra_node_on, nvidia_backend, prepare, published, run_spec, sh, sha256, unprepare,
    user_script,
};

/// A copy of the NVML stand-in bound to the machine `machine`.
fn nvml_of(dir: &Path, machine: &str) -> PathBuf {
    nvml_mock::isolated_library(dir, &nvml_mock::machine_path(machine), None).unwrap()
}

/// `/proc/driver/nvidia-caps/mig-minors` as the driver numbers it for GPU 0: `config`,
/// `monitor`, then per GPU instance 0-14 its `access` followed by those of its compute
/// instances 0-7.
fn mig_minors() -> Vec<(String, u32)> {
    let mut v = vec![("config".to_string(), 1), ("monitor".to_string(), 2)];
    for gi in 0..15u32 {
        let access = 3 + gi * 9;
        v.push((format!("gpu0/gi{gi}/access"), access));
        for ci in 0..8u32 {
            v.push((format!("gpu0/gi{gi}/ci{ci}/access"), access + 1 + ci));
        }
    }
    v
}

/// A host root for kubedev in which the driver root `root` lies at its real path, as hard
/// links to the same files, nodes and socket (so every host path the spec names exists on the
/// real host, with the same content, for podman), and which has the driver's
/// `/proc/driver/nvidia-caps/mig-minors` listing `minors`. The capability nodes
/// `nvidia-cap<N>` are made in the driver root's `dev/nvidia-caps`, where the spec takes them
/// from (the dev root is the driver root, which has `dev/nvidiactl`).
fn mig_host_root(root: &DriverRoot, minors: &[(String, u32)]) -> tempfile::TempDir {
    let caps = root.path().join("dev/nvidia-caps");
    std::fs::create_dir_all(&caps).unwrap();
    let script: String = minors
        .iter()
        .map(|(_, n)| {
            format!(
                "mknod -m 0666 '{}/nvidia-cap{n}' c {CAPS_MAJOR} {n}\n",
                caps.display()
            )
        })
        .collect();
    sh(Command::new("sh").args(["-ec", &script]));
    // Beside the driver root, so hard links work (one file system).
    let host = tempfile::Builder::new()
        .prefix("kubedev-host-root")
        .tempdir_in(root.path().parent().unwrap())
        .unwrap();
    let mirror = host
        .path()
        .join(root.path().strip_prefix("/").unwrap())
        .parent()
        .unwrap()
        .to_path_buf();
    std::fs::create_dir_all(&mirror).unwrap();
    sh(Command::new("cp").arg("-al").arg(root.path()).arg(&mirror));
    let proc_dir = host.path().join("proc/driver/nvidia-caps");
    std::fs::create_dir_all(&proc_dir).unwrap();
    let text: String = minors.iter().map(|(k, n)| format!("{k} {n}\n")).collect();
    std::fs::write(proc_dir.join("mig-minors"), text).unwrap();
    host
}

#[tokio::test]
#[ignore = "needs root, podman and runc: run by cargo xtask ci"]
async fn a_static_mig_device_gives_the_container_its_gpu_capabilities_and_mig_uuid() {
    let podman = Podman::new().unwrap();
    let root = DriverRoot::new();
    let cuda_sha = sha256(&root.libcuda());
    // kubedev reads the capability minors from the host's
    // `/proc/driver/nvidia-caps/mig-minors`, which this CI machine (no NVIDIA driver) does
    // not have: with hostRoot `/` no capability node would be given (see the partitionable
    // test). A host root of the test's own provides the file, and shows the driver root at
    // its real path, so the spec still names paths that exist on the real host.
    let minors = mig_minors();
    let host = mig_host_root(&root, &minors);
    let dir = tempfile::tempdir().unwrap();
    let lib = nvml_of(dir.path(), "h100-mig");
    let backends = format!("{}    migStrategy: static\n", nvidia_backend(&lib, &root));
    let node = dra_node_on(dir.path(), host.path(), &backends).await;

    // The GPU's seven existing MIG devices are published instead of the GPU.
    let inv = node.slices.wait_last(WAIT).await;
    let names: BTreeSet<&str> = inv.devices().map(|(_, d)| d.name.as_str()).collect();
    assert_eq!(
        names,
        (0..7)
            .map(|s| format!("gpu-0-mig-1g10gb-{s}"))
            .collect::<BTreeSet<_>>()
            .iter()
            .map(String::as_str)
            .collect(),
        "{inv:?}"
    );
    let (device, attrs) = published(&node, "gpu-0-mig-1g10gb-3").await;
    let uuid = attrs["gpu.nvidia.com/uuid"].clone();
    assert!(uuid.starts_with("MIG-"), "{attrs:?}");
    assert_eq!(attrs["gpu.nvidia.com/parentIndex"], "0", "{attrs:?}");
    let gi = &attrs["gpu.nvidia.com/gpuInstanceId"];
    let ci = &attrs["gpu.nvidia.com/computeInstanceId"];
    let minor_of = |cap: String| {
        minors
            .iter()
            .find(|(k, _)| *k == cap)
            .unwrap_or_else(|| panic!("{cap} is not in mig-minors"))
            .1
    };
    let caps = [
        minor_of(format!("gpu0/gi{gi}/access")),
        minor_of(format!("gpu0/gi{gi}/ci{ci}/access")),
    ];

    let spec = prepare(&node, dir.path(), "uid-mig", &[device]).await;
    let (installed, out) = run_spec(
        &podman,
        &spec,
        format!("{}{NODES_SCRIPT}", user_script(&[0])),
    );
    // The parent GPU's node (minor 0 on this machine), the driver, and the MIG UUID alone.
    assert_user_view(&out, &[0], std::slice::from_ref(&uuid), &cuda_sha);
    assert_eq!(
        out.value("visible"),
        Some(uuid.as_str()),
        "{}",
        out.report()
    );
    // Exactly the capability nodes of the device's GPU instance and compute instance.
    assert_nodes(&out, &[0], Some(&caps));
    drop(installed);
    unprepare(&node, "uid-mig").await;
    node.stop().await;
}

#[tokio::test]
#[ignore = "needs root, podman and runc: run by cargo xtask ci"]
async fn a_mig_placement_created_on_prepare_gives_the_container_its_gpu_and_mig_uuid() {
    let Fixture {
        podman,
        root,
        cuda_sha,
        dir,
        lib,
    } = Fixture::new();
    let backends = format!(
        "{}    migStrategy: partitionable\n",
        nvidia_backend(&lib, &root)
    );
    let node = dra_node(dir.path(), &backends).await;
    let inv = node.slices.wait_last(WAIT).await;
    let chosen = common::schedule_mig(&inv, DRIVER, "1g.5gb", 1, &[]);
    assert_eq!(chosen.len(), 1, "{chosen:?}");
    let (_, attrs) = published(&node, chosen[0].device.as_str()).await;
    // The GPU indices of the `dgx-a100` machine are its minor numbers.
    let minor: u32 = attrs["gpu.nvidia.com/parentIndex"].parse().unwrap();
    let parent = attrs["gpu.nvidia.com/parentUUID"].clone();
    assert!(
        !attrs.contains_key("gpu.nvidia.com/uuid"),
        "a placement has no UUID before prepare: {attrs:?}"
    );

    let spec = prepare(&node, dir.path(), "uid-place", &chosen).await;
    // The MIG device prepare created, named in the spec.
    let uuids: BTreeSet<&str> = spec
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .filter(|t| t.starts_with("MIG-"))
        .collect();
    assert_eq!(uuids.len(), 1, "{spec}");
    let uuid = uuids.into_iter().next().unwrap().to_string();
    assert_ne!(
        uuid.trim_start_matches("MIG-"),
        parent.trim_start_matches("GPU-")
    );
    // kubedev reads the MIG capability minors from `/proc/driver/nvidia-caps/mig-minors`
    // through the host root; on this CI machine (hostRoot `/`, no NVIDIA driver) the file does
    // not exist, so the spec names no capability node and the container gets none. The static
    // test covers them with a host root of its own.
    assert!(!spec.contains("nvidia-caps"), "{spec}");
    let (installed, out) = run_spec(
        &podman,
        &spec,
        format!("{}{NODES_SCRIPT}", user_script(&[minor])),
    );
    assert_user_view(&out, &[minor], std::slice::from_ref(&uuid), &cuda_sha);
    assert_eq!(
        out.value("visible"),
        Some(uuid.as_str()),
        "{}",
        out.report()
    );
    assert_nodes(&out, &[minor], None);
    drop(installed);
    unprepare(&node, "uid-place").await;
    node.stop().await;
}
