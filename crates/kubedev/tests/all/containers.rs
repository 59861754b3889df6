//! The CDI specs kubedev writes, applied by a real container runtime: Debian's podman with runc
//! and a busybox root filesystem (`kubedev_testkit::podman`). Each test prepares devices through
//! the real daemon and the kubelet emulator, installs kubedev's spec file unchanged, runs a
//! container with the CDI device IDs the kubelet got, and asserts from inside the container
//! both the generic check (every device node, mount and variable of the spec, spec-level edits
//! included) and what a user of that kind of device relies on, written here independently of
//! the spec.
//!
//! The tests need root, podman, runc and busybox-static; `cargo xtask ci` installs them and runs
//! `cargo test -p kubedev --test all -- --ignored containers::` (a filter that also takes
//! `nvidia_containers::`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::common::{self, Claims, DevicePluginDaemon, DraDaemon};
use kubedev_core::{AllocatedDevice, DeviceRef, Inventory};
use kubedev_testkit::hostroot::HostRoot;
use kubedev_testkit::kubelet::ClaimId;
use kubedev_testkit::podman::{Container, FakeNode, Podman, RunOutput};

const WAIT: Duration = Duration::from_secs(15);

/// The harness, or a panic saying what to install.
fn podman() -> Podman {
    Podman::new().unwrap_or_else(|e| panic!("{e}"))
}

/// Runs `container`, blocking this worker thread (the daemon keeps the other).
fn run(podman: &Podman, container: Container) -> RunOutput {
    tokio::task::block_in_place(|| podman.run(container)).unwrap_or_else(|e| panic!("{e}"))
}

/// `(type, major, minor)` from a script line printed with `stat -c '%F|%t|%T' <node>`.
fn node_of(out: &RunOutput, key: &str) -> (String, u32, u32) {
    let v = out
        .value(key)
        .unwrap_or_else(|| panic!("the container printed no {key}:\n{}", out.report()));
    let f: Vec<&str> = v.split('|').collect();
    assert_eq!(f.len(), 3, "{key}: {v}\n{}", out.report());
    let hex = |s: &str| u32::from_str_radix(s, 16).unwrap();
    (f[0].to_string(), hex(f[1]), hex(f[2]))
}

fn char_dev(major: u32, minor: u32) -> (String, u32, u32) {
    ("character special file".to_string(), major, minor)
}

/// A script line printing `key=<type>|<major hex>|<minor hex>` of `node`.
fn stat_node(key: &str, node: &str) -> String {
    format!("echo \"{key}=$(stat -c '%F|%t|%T' {node} 2>&1)\"\n")
}

/// What a prepare gave: the CDI device IDs the kubelet got, and the claim's spec file.
struct Prepared {
    ids: Vec<String>,
    spec: String,
}

/// A daemon in DRA mode (in-process, with the DRA kubelet emulator); claims are allocated by the
/// test.
struct DraNode {
    root: PathBuf,
    driver: String,
    dra: DraDaemon,
}

async fn dra_node(dir: &Path, host: Option<&Path>, driver: &str, backends: &str) -> DraNode {
    std::fs::write(
        dir.join("boot_id"),
        "8b7c1f6e-0000-4000-8000-0000000000cc\n",
    )
    .unwrap();
    let host = host
        .map(|h| format!("hostRoot: {}\n", h.display()))
        .unwrap_or_default();
    let text = format!(
        "nodeName: node-a\n{host}stateDir: {r}/state\ndevicePlugin:\n  enabled: false\n{dra}backends:\n{backends}",
        r = dir.display(),
        dra = common::dra_section(driver, dir, &dir.join("plugins")),
    );
    let claims = Arc::new(Claims::default());
    let dra = DraDaemon::start(dir, &dir.join("dra.yaml"), &text, driver, claims, WAIT).await;
    DraNode {
        root: dir.to_path_buf(),
        driver: driver.to_string(),
        dra,
    }
}

impl DraNode {
    /// The inventory published last (waiting for the first).
    async fn published(&self) -> Inventory {
        self.dra.slices.wait_last(WAIT).await
    }

    /// The published device `name`, whatever its pool.
    async fn device_named(&self, name: &str) -> DeviceRef {
        let inv = self.published().await;
        inv.devices()
            .find(|(_, d)| d.name.as_str() == name)
            .map(|(p, d)| DeviceRef::new(p.name.clone(), d.name.clone()))
            .unwrap_or_else(|| panic!("no device {name} was published: {inv:?}"))
    }

    /// The published device whose attribute `attr` says `value`.
    #[cfg(feature = "vfio")]
    async fn device_with(&self, attr: &str, value: &str) -> DeviceRef {
        let inv = self.published().await;
        inv.devices()
            .find(|(_, d)| {
                d.attributes
                    .iter()
                    .any(|(k, v)| k.as_str() == attr && v.to_string().trim_matches('"') == value)
            })
            .map(|(p, d)| DeviceRef::new(p.name.clone(), d.name.clone()))
            .unwrap_or_else(|| panic!("no published device has {attr} = {value}: {inv:?}"))
    }

    /// Allocates `devices` to the claim `uid` and prepares it through the kubelet.
    async fn prepare(&self, uid: &str, devices: Vec<AllocatedDevice>) -> Prepared {
        let n = devices.len();
        self.dra.claims.allocate_devices(uid, devices);
        let claim = ClaimId::new("default", &format!("claim-{uid}"), uid);
        let answers = self
            .dra
            .kubelet
            .prepare(&self.driver, &[claim])
            .await
            .unwrap();
        let answer = answers[uid]
            .as_ref()
            .unwrap_or_else(|e| panic!("{uid}: {e}"));
        assert_eq!(answer.len(), n, "{answer:?}");
        let ids = answer
            .iter()
            .flat_map(|d| d.cdi_device_ids.clone())
            .collect();
        let files: Vec<PathBuf> = common::cdi_files(&self.root.join("cdi"))
            .into_iter()
            .filter(|p| p.to_string_lossy().contains(uid))
            .collect();
        assert_eq!(files.len(), 1, "one CDI spec for the claim: {files:?}");
        let spec = std::fs::read_to_string(&files[0]).unwrap();
        if std::env::var_os(kubedev_testkit::podman::VERBOSE_ENV).is_some() {
            eprintln!("the CDI spec of claim {uid}:\n{spec}");
        }
        Prepared { ids, spec }
    }

    async fn stop(self) {
        self.dra.stop().await;
    }
}

fn allocated(d: &DeviceRef) -> AllocatedDevice {
    AllocatedDevice::new(d.clone()).with_request("req")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root, podman and runc: run by cargo xtask ci"]
async fn static_backend_claim_nodes_env_and_read_only_mounts() {
    let podman = podman();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("fw.bin"), "example firmware v1\n").unwrap();
    std::fs::create_dir(d.join("lib")).unwrap();
    std::fs::write(d.join("lib/libexample.so.1"), "not really ELF\n").unwrap();
    let backends = format!(
        "  static:\n    pool: node-a\n    devices:\n\
         \x20     - name: gpu-0\n        deviceNodes: [\"/dev/example/gpu0\"]\n\
         \x20       env: {{EXAMPLE_MODEL: \"Example X1\", EXAMPLE_FLAGS: \"a=b c\"}}\n\
         \x20       mounts: {{{d}/fw.bin: /lib/firmware/example/fw.bin}}\n\
         \x20     - name: gpu-1\n        deviceNodes: [\"/dev/example/gpu1\"]\n\
         \x20       mounts: {{{d}/lib: /usr/local/example/lib}}\n",
        d = d.display()
    );
    let node = dra_node(d, None, "static.example.com", &backends).await;
    let gpus = [
        node.device_named("gpu-0").await,
        node.device_named("gpu-1").await,
    ];
    let uid = "5f1d2c3b-0000-4000-8000-00000000a001";
    let p = node
        .prepare(uid, gpus.iter().map(allocated).collect())
        .await;
    let _spec = podman.install_spec(&p.spec).unwrap();
    let script = format!(
        "{}{}\
         echo \"visible=$STATIC_VISIBLE_DEVICES\"\n\
         echo \"model=$EXAMPLE_MODEL\"\necho \"flags=$EXAMPLE_FLAGS\"\n\
         echo \"fw=$(cat /lib/firmware/example/fw.bin)\"\n\
         echo \"fw_write=$( (echo x >> /lib/firmware/example/fw.bin) 2>&1 && echo written)\"\n\
         echo \"lib=$(ls /usr/local/example/lib)\"\n\
         echo \"lib_write=$( (touch /usr/local/example/lib/new) 2>&1 && echo written)\"\n",
        stat_node("gpu0", "/dev/example/gpu0"),
        stat_node("gpu1", "/dev/example/gpu1"),
    );
    let out = run(
        &podman,
        Container::new(script)
            .devices(&p.ids)
            .node(FakeNode::char("/dev/example/gpu0", 240, 0))
            .node(FakeNode::char("/dev/example/gpu1", 240, 1))
            .check(&p.spec, &p.ids),
    );
    out.assert_ok();
    assert_eq!(node_of(&out, "gpu0"), char_dev(240, 0), "{}", out.report());
    assert_eq!(node_of(&out, "gpu1"), char_dev(240, 1), "{}", out.report());
    assert_eq!(
        out.value("visible"),
        Some("gpu-0,gpu-1"),
        "{}",
        out.report()
    );
    assert_eq!(out.value("model"), Some("Example X1"));
    assert_eq!(out.value("flags"), Some("a=b c"));
    assert_eq!(out.value("fw"), Some("example firmware v1"));
    let fw_write = out.value("fw_write").unwrap();
    assert!(fw_write.contains("Read-only file system"), "{fw_write}");
    assert_eq!(out.value("lib"), Some("libexample.so.1"));
    let lib_write = out.value("lib_write").unwrap();
    assert!(lib_write.contains("Read-only file system"), "{lib_write}");
    assert_eq!(
        std::fs::read_to_string(d.join("fw.bin")).unwrap(),
        "example firmware v1\n"
    );
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root, podman and runc: run by cargo xtask ci"]
async fn host_character_device_slot_gives_the_node() {
    let podman = podman();
    let machine = HostRoot::new().unwrap();
    machine.device_node("/dev/kvm").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let backends =
        "  host:\n    characterDevices:\n      - {name: kvm, path: /dev/kvm, slots: 3}\n";
    let node = dra_node(
        dir.path(),
        Some(machine.path()),
        "host.example.com",
        backends,
    )
    .await;
    let slot = node.device_named("kvm-1").await;
    let uid = "5f1d2c3b-0000-4000-8000-00000000a002";
    let p = node.prepare(uid, vec![allocated(&slot)]).await;
    let _spec = podman.install_spec(&p.spec).unwrap();
    let script = format!(
        "{}echo \"open=$( (: <> /dev/kvm) 2>&1 && echo opened)\"\n",
        stat_node("kvm", "/dev/kvm")
    );
    let out = run(
        &podman,
        Container::new(script)
            .devices(&p.ids)
            .node(FakeNode::char("/dev/kvm", 10, 232))
            .check(&p.spec, &p.ids),
    );
    out.assert_ok();
    assert_eq!(node_of(&out, "kvm"), char_dev(10, 232), "{}", out.report());
    // Opened where the host has KVM, "No such device" where it does not: never refused.
    let open = out.value("open").unwrap();
    assert!(
        !open.contains("Operation not permitted"),
        "the device cgroup refuses /dev/kvm: {open}"
    );
    node.stop().await;
}

/// A Unix socket listening in `dir/<name>/<name>.socket`.
fn socket(dir: &Path, name: &str) -> (PathBuf, std::os::unix::net::UnixListener) {
    let sock_dir = dir.join(name);
    std::fs::create_dir_all(&sock_dir).unwrap();
    let path = sock_dir.join(format!("{name}.socket"));
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    (path, listener)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root, podman and runc: run by cargo xtask ci"]
async fn host_socket_device_mounts_the_socket_directory() {
    use std::os::unix::fs::MetadataExt as _;
    let podman = podman();
    let dir = tempfile::tempdir().unwrap();
    let (sock, _listener) = socket(dir.path(), "qgs");
    let backends = format!(
        "  host:\n    socketDevices:\n      - {{name: qgs, path: {}, containerDir: /var/run/tdx-qgs}}\n",
        sock.display()
    );
    let node = dra_node(dir.path(), None, "sockets.example.com", &backends).await;
    let qgs = node.device_named("qgs-0").await;
    let uid = "5f1d2c3b-0000-4000-8000-00000000a003";
    let p = node.prepare(uid, vec![allocated(&qgs)]).await;
    let _spec = podman.install_spec(&p.spec).unwrap();
    let out = run(
        &podman,
        Container::new(
            "echo \"sock=$(stat -c '%F|%i' /var/run/tdx-qgs/qgs.socket 2>&1)\"\n\
             touch /var/run/tdx-qgs/from-container\n",
        )
        .devices(&p.ids)
        .check(&p.spec, &p.ids),
    );
    out.assert_ok();
    let ino = std::fs::metadata(&sock).unwrap().ino();
    assert_eq!(
        out.value("sock"),
        Some(format!("socket|{ino}").as_str()),
        "the host's socket at the configured container directory\n{}",
        out.report()
    );
    assert!(
        sock.parent().unwrap().join("from-container").exists(),
        "the directory is mounted read-write"
    );
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root, podman and runc: run by cargo xtask ci"]
async fn consumable_capacity_shares_reach_one_socket_from_two_containers() {
    use std::os::unix::fs::MetadataExt as _;
    let podman = podman();
    let dir = tempfile::tempdir().unwrap();
    let (sock, _listener) = socket(dir.path(), "qgs");
    let backends = format!(
        "  host:\n    socketDevices:\n      - {{name: qgs, path: {}, slots: 4, consumableCapacity: true}}\n",
        sock.display()
    );
    let node = dra_node(dir.path(), None, "shares.example.com", &backends).await;
    let qgs = node.device_named("qgs").await;
    let shares = [
        (
            "5f1d2c3b-0000-4000-8000-00000000a004",
            "4b1e0a1c-5f5e-4a43-9d3c-8a5f0e1c2d3e",
        ),
        (
            "5f1d2c3b-0000-4000-8000-00000000a005",
            "9c2d1e0f-7a6b-4c5d-8e9f-0a1b2c3d4e5f",
        ),
    ];
    let mut prepared = Vec::new();
    for (uid, share) in shares {
        let p = node
            .prepare(uid, vec![allocated(&qgs).with_share_id(share)])
            .await;
        assert_eq!(p.ids.len(), 1);
        assert!(
            p.ids[0].ends_with(share),
            "one CDI device per share: {:?}",
            p.ids
        );
        prepared.push(p);
    }
    let _specs: Vec<_> = prepared
        .iter()
        .map(|p| podman.install_spec(&p.spec).unwrap())
        .collect();
    let sock_dir = sock.parent().unwrap();
    let ino = std::fs::metadata(&sock).unwrap().ino();
    for (i, p) in prepared.iter().enumerate() {
        let script = format!(
            "echo \"sock=$(stat -c '%F|%i' {s} 2>&1)\"\ntouch {d}/from-share-{i}\n",
            s = sock.display(),
            d = sock_dir.display()
        );
        let out = run(
            &podman,
            Container::new(script)
                .devices(&p.ids)
                .check(&p.spec, &p.ids),
        );
        out.assert_ok();
        assert_eq!(
            out.value("sock"),
            Some(format!("socket|{ino}").as_str()),
            "{}",
            out.report()
        );
    }
    for i in 0..2 {
        assert!(sock_dir.join(format!("from-share-{i}")).exists());
    }
    node.stop().await;
}

#[cfg(feature = "usb")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root, podman and runc: run by cargo xtask ci"]
async fn usb_device_node_and_variable_on_a_fake_host_root() {
    use kubedev_testkit::machines::usb::{three_devices, three_devices_list};
    let podman = podman();
    let machine = three_devices().unwrap();
    let key = three_devices_list()
        .into_iter()
        .find(|d| d.serial.as_deref() == Some("22222222"))
        .unwrap();
    // The node the kernel would make: the numbers the device's uevent declares.
    let uevent = std::fs::read_to_string(
        machine.join(format!("/sys/bus/usb/devices/{}/uevent", key.sysfs_name())),
    )
    .unwrap();
    let field = |name: &str| -> u32 {
        uevent
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}=")))
            .unwrap()
            .parse()
            .unwrap()
    };
    let (major, minor) = (field("MAJOR"), field("MINOR"));
    assert_eq!((major, minor), (189, 2), "bus 1, device 3");
    machine.char_device(key.node(), major, minor).unwrap();
    let backends = "  usb:\n    resources:\n      - name: example.com/yubikey\n        selectors: [\"1050:0407\"]\n";
    let dir = tempfile::tempdir().unwrap();
    let node = dra_node(
        dir.path(),
        Some(machine.path()),
        "usb.example.com",
        backends,
    )
    .await;
    let inv = node.published().await;
    let dev = inv
        .devices()
        .find(|(_, d)| {
            d.attributes
                .values()
                .any(|v| v.to_string().contains("22222222"))
        })
        .map(|(p, d)| DeviceRef::new(p.name.clone(), d.name.clone()))
        .unwrap_or_else(|| panic!("no device carries serial 22222222: {inv:?}"));
    let uid = "5f1d2c3b-0000-4000-8000-00000000a006";
    let p = node.prepare(uid, vec![allocated(&dev)]).await;
    let _spec = podman.install_spec(&p.spec).unwrap();
    let script = format!(
        "{}echo \"list=$USB_RESOURCE_EXAMPLE_COM_YUBIKEY\"\nls /dev/bus/usb/*/* | tr '\\n' ' ' | sed 's/^/nodes=/'; echo\n",
        stat_node("key", "/dev/bus/usb/001/003")
    );
    let out = run(
        &podman,
        Container::new(script)
            .devices(&p.ids)
            .node(FakeNode::from_host_root(machine.path(), &key.node()).unwrap())
            .check(&p.spec, &p.ids),
    );
    out.assert_ok();
    assert_eq!(node_of(&out, "key"), char_dev(189, 2), "{}", out.report());
    assert_eq!(out.value("list"), Some("1:3"), "{}", out.report());
    assert_eq!(
        out.value("nodes").map(str::trim),
        Some("/dev/bus/usb/001/003"),
        "only the allocated key's node"
    );
    node.stop().await;
}

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

/// Four static GPUs served as `example.com/gpu` in device-plugin CDI mode.
fn dp_config(dir: &Path) -> String {
    let devices: String = (0..4)
        .map(|i| {
            format!(
                "      - name: gpu-{i}\n        deviceNodes: [\"/dev/example/dp{i}\"]\n        env: {{EXAMPLE_GPU_{i}: \"present\"}}\n"
            )
        })
        .collect();
    format!(
        "devicePlugin:\n  directory: {d}\n  cdi: true\n  cdiDir: {d}/cdi\n  resources:\n    - name: example.com/gpu\nbackends:\n  static:\n    pool: node-a\n    devices:\n{devices}",
        d = dir.display()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root, podman and runc: run by cargo xtask ci"]
async fn device_plugin_cdi_mode_gives_each_container_its_devices() {
    let podman = podman();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubedev.yaml");
    let node = DevicePluginDaemon::start(&path, &dp_config(dir.path()), dir.path()).await;
    node.kubelet
        .wait_for("example.com/gpu", WAIT, |r| r.connected && r.capacity == 4)
        .await
        .unwrap();
    // Two containers: the first gets gpu-1, the second gpu-3 and gpu-0.
    let first = node
        .kubelet
        .allocate("example.com/gpu", &["gpu-1"])
        .await
        .unwrap();
    let second = node
        .kubelet
        .allocate("example.com/gpu", &["gpu-3", "gpu-0"])
        .await
        .unwrap();
    let files = common::cdi_files(&dir.path().join("cdi"));
    assert_eq!(files.len(), 1, "one spec for the resource: {files:?}");
    let spec = std::fs::read_to_string(&files[0]).unwrap();
    let _installed = podman.install_spec(&spec).unwrap();
    let script = "ls /dev/example | tr '\\n' ' ' | sed 's/^/nodes=/'; echo\n\
                  echo \"visible=$STATIC_VISIBLE_DEVICES\"\n\
                  env | grep '^EXAMPLE_GPU_' | sort | tr '\\n' ' ' | sed 's/^/gpus=/'; echo\n";
    let fakes: Vec<FakeNode> = (0..4)
        .map(|i| FakeNode::char(format!("/dev/example/dp{i}"), 240, i))
        .collect();
    // Both containers start after both allocations, as a container restarted later does: each
    // must still get its own devices and variables from the spec as it is now.
    for (answer, nodes, visible, gpus) in [
        (&first, "dp1", "gpu-1", "EXAMPLE_GPU_1=present"),
        (
            &second,
            "dp0 dp3",
            "gpu-0,gpu-3",
            "EXAMPLE_GPU_0=present EXAMPLE_GPU_3=present",
        ),
    ] {
        let ids: Vec<String> = answer.cdi_devices.iter().map(|d| d.name.clone()).collect();
        let out = run(
            &podman,
            Container::new(script)
                .devices(&ids)
                .nodes(fakes.clone())
                .check(&spec, &ids),
        );
        out.assert_ok();
        assert_eq!(
            out.value("nodes").map(str::trim),
            Some(nodes),
            "{}",
            out.report()
        );
        assert_eq!(
            out.value("gpus").map(str::trim),
            Some(gpus),
            "{}",
            out.report()
        );
        let mut seen: Vec<&str> = out.value("visible").unwrap_or("").split(',').collect();
        seen.sort();
        assert_eq!(
            seen.join(","),
            visible,
            "STATIC_VISIBLE_DEVICES lists the container's own devices\n{spec}\n{}",
            out.report()
        );
    }
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root, podman and runc: run by cargo xtask ci"]
async fn device_metadata_file_is_readable_at_the_documented_path() {
    use crate::common::process::{DRIVER, Env, NODE, stop};
    use kubedev_testkit::apiserver::Resource;
    use serde_json::{Value, json};
    const CONTAINER_FILE: &str = "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/gpus/gpu/gpu.example.com-metadata.json";

    let podman = podman();
    let env = Env::new().await;
    env.edit_config(|c| {
        c.replace("  enabled: true\n", "  enabled: true\n  deviceMetadata: true\n")
            .replace(
                "      - name: gpu-0\n",
                "      - name: gpu-0\n        attributes:\n          model: {string: x1}\n          resource.kubernetes.io/pciBusID: {string: \"0000:3b:00.0\"}\n",
            )
    });
    let daemon = env.start("").await;
    let uid = "5f1d2c3b-0000-4000-8000-00000000a009";
    env.api
        .put_raw(
            Resource::ResourceClaims,
            json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": "train-gpus-x7k2q", "namespace": "default", "uid": uid,
                             "annotations": {"resource.kubernetes.io/pod-claim-name": "gpus"}},
                "spec": {"devices": {"requests": [
                    {"name": "gpu", "exactly": {"deviceClassName": "gpu", "count": 2}}
                ]}},
                "status": {"allocation": {"devices": {"results": [
                    {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-0"},
                    {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-3"}
                ]}}}
            }),
        )
        .unwrap();
    let claim = ClaimId::new("default", "train-gpus-x7k2q", uid);
    let out = env
        .kubelet
        .prepare(DRIVER, std::slice::from_ref(&claim))
        .await
        .unwrap();
    let devices = out[uid].as_ref().unwrap();
    let ids: Vec<String> = devices
        .iter()
        .flat_map(|d| d.cdi_device_ids.clone())
        .collect();
    let specs = env.cdi_files();
    assert_eq!(
        specs.len(),
        2,
        "the claim's spec and its metadata spec: {specs:?}"
    );
    let texts: Vec<String> = specs
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect();
    let _installed: Vec<_> = texts
        .iter()
        .map(|t| podman.install_spec(t).unwrap())
        .collect();
    let mut container = Container::new(format!(
        "echo \"meta=$(tr -d '\\n' < {CONTAINER_FILE})\"\n\
         echo \"meta_write=$( (: >> {CONTAINER_FILE}) 2>&1 && echo written)\"\n\
         echo \"null=$(stat -c '%F|%t|%T' /dev/null)\"\n\
         echo \"visible=$STATIC_VISIBLE_DEVICES\"\n"
    ))
    .devices(&ids);
    for t in &texts {
        let kind = serde_json::from_str::<Value>(t).unwrap()["kind"]
            .as_str()
            .unwrap()
            .to_string();
        let mine: Vec<&String> = ids
            .iter()
            .filter(|id| id.starts_with(&format!("{kind}=")))
            .collect();
        container = container.check(t, &mine);
    }
    let run_out = run(&podman, container);
    run_out.assert_ok();
    // The file is a stream of objects (v1beta1 first, then v1alpha1): read the first.
    let meta: Value = serde_json::Deserializer::from_str(run_out.value("meta").unwrap())
        .into_iter::<Value>()
        .next()
        .expect("an object in the metadata file")
        .unwrap_or_else(|e| {
            panic!(
                "the metadata file does not parse: {e}\n{}",
                run_out.report()
            )
        });
    assert_eq!(meta["kind"], "DeviceMetadata", "{meta}");
    assert_eq!(meta["metadata"]["uid"], uid, "{meta}");
    assert_eq!(meta["podClaimName"], "gpus", "{meta}");
    let names: Vec<&str> = meta["requests"][0]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["gpu-0", "gpu-3"], "{meta}");
    assert_eq!(
        meta["requests"][0]["devices"][0]["attributes"]["resource.kubernetes.io/pciBusID"],
        json!({"string": "0000:3b:00.0"}),
        "{meta}"
    );
    let write = run_out.value("meta_write").unwrap();
    assert!(write.contains("Read-only file system"), "{write}");
    assert_eq!(node_of(&run_out, "null"), char_dev(1, 3));
    assert_eq!(run_out.value("visible"), Some("gpu-0,gpu-3"));
    stop(daemon);
}
