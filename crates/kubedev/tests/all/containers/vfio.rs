//! VFIO devices in a container, on a fake host root: a GPU's IOMMU group and container nodes,
//! and a mediated device.

use kubedev_testkit::podman::{Container, FakeNode, Podman, RunOutput};

use super::{Prepared, allocated, char_dev, dra_node, node_of, podman, run, stat_node};

/// The VFIO nodes of IOMMU group `group` in the fake host root `machine`: the container node
/// (misc 10:196) and the group's node (a dynamic major, here 243).
#[cfg(feature = "vfio")]
fn vfio_nodes(machine: &kubedev_testkit::hostroot::HostRoot, group: u32) {
    machine.char_device("/dev/vfio/vfio", 10, 196).unwrap();
    machine
        .char_device(format!("/dev/vfio/{group}"), 243, group)
        .unwrap();
}

/// Runs `script` after a look at both VFIO nodes in a container given the prepared claim `p`,
/// with the nodes of `machine` in place; checks every edit of the spec and that both nodes are
/// the host's.
#[cfg(feature = "vfio")]
fn run_with_vfio_nodes(
    podman: &Podman,
    machine: &kubedev_testkit::hostroot::HostRoot,
    group: u32,
    p: &Prepared,
    script: &str,
) -> RunOutput {
    let group_node = format!("/dev/vfio/{group}");
    let script = format!(
        "{}{}{script}",
        stat_node("container", "/dev/vfio/vfio"),
        stat_node("group", &group_node),
    );
    let fake = |path: &str| FakeNode::from_host_root(machine.path(), path).unwrap();
    let out = run(
        podman,
        Container::new(script)
            .devices(&p.ids)
            .node(fake("/dev/vfio/vfio"))
            .node(fake(&group_node))
            .check(&p.spec, &p.ids),
    );
    out.assert_ok();
    assert_eq!(
        node_of(&out, "container"),
        char_dev(10, 196),
        "{}",
        out.report()
    );
    assert_eq!(
        node_of(&out, "group"),
        char_dev(243, group),
        "{}",
        out.report()
    );
    out
}

#[cfg(feature = "vfio")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root, podman and runc: run by cargo xtask ci"]
async fn vfio_gpu_group_and_container_nodes_on_a_fake_host_root() {
    use kubedev_testkit::machines::pci::{GPU_SERVER_GPUS, dual_socket_gpu_server};
    let podman = podman();
    let machine = dual_socket_gpu_server().unwrap();
    let (addr, _, group, _) = GPU_SERVER_GPUS[0];
    vfio_nodes(&machine, group);
    let backends = "  vfio:\n    pciDevices:\n      - selector: \"10de:2236\"\n        resourceName: nvidia.com/GA102GL_A10\n";
    let dir = tempfile::tempdir().unwrap();
    let node = dra_node(
        dir.path(),
        Some(machine.path()),
        "vfio.example.com",
        backends,
    )
    .await;
    let gpu = node
        .device_with("resource.kubernetes.io/pciBusID", addr)
        .await;
    let uid = "5f1d2c3b-0000-4000-8000-00000000a007";
    let p = node.prepare(uid, vec![allocated(&gpu)]).await;
    let _spec = podman.install_spec(&p.spec).unwrap();
    let out = run_with_vfio_nodes(
        &podman,
        &machine,
        group,
        &p,
        "echo \"pci=$PCI_RESOURCE_NVIDIA_COM_GA102GL_A10\"\n",
    );
    assert_eq!(out.value("pci"), Some(addr), "{}", out.report());
    node.stop().await;
}

#[cfg(feature = "vfio")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root, podman and runc: run by cargo xtask ci"]
async fn vfio_mediated_device_on_a_fake_host_root() {
    use kubedev_testkit::machines::mdev::{MDEV_INSTANCES, MdevKernelSim, vgpu_mdev_host_spec};
    let podman = podman();
    let spec = vgpu_mdev_host_spec();
    let machine = spec.build().unwrap();
    let _kernel = MdevKernelSim::start(machine.path(), &spec);
    let (uuid, _, _, group) = MDEV_INSTANCES[0];
    vfio_nodes(&machine, group);
    let backends = "  vfio:\n    mediatedDevices:\n      - {mdevNameSelector: \"GRID T4-1B\", resourceName: nvidia.com/GRID_T4-1B}\n";
    let dir = tempfile::tempdir().unwrap();
    let node = dra_node(
        dir.path(),
        Some(machine.path()),
        "mdev.example.com",
        backends,
    )
    .await;
    let mdev = node.device_named(&format!("mdev-{uuid}")).await;
    let uid = "5f1d2c3b-0000-4000-8000-00000000a008";
    let p = node.prepare(uid, vec![allocated(&mdev)]).await;
    let _spec = podman.install_spec(&p.spec).unwrap();
    let out = run_with_vfio_nodes(
        &podman,
        &machine,
        group,
        &p,
        "tr '\\0' '\\n' < /proc/$$/environ | grep '^MDEV_PCI_RESOURCE' | sed 's/^/env=/'\n",
    );
    // The name has a '-', which no shell variable may (busybox's sh does not even pass it on
    // to its children): read it from the environment the container started with.
    assert_eq!(
        out.value("env"),
        Some(format!("MDEV_PCI_RESOURCE_NVIDIA_COM_GRID_T4-1B={uuid}").as_str()),
        "{}",
        out.report()
    );
    node.stop().await;
}
