//! Every host backend through the real daemon and both kubelet APIs: discovery → device-plugin
//! registration and `Allocate` → ResourceSlices → DRA prepare and CDI → health changes (hot-plug,
//! Xid events) seen by the kubelet emulator in both APIs, and recovery.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::common::{self, Claims, DevicePluginDaemon, DraDaemon};
use kubedev_core::{DeviceRef, Inventory};
use kubedev_testkit::kubelet::ClaimId;

#[cfg(feature = "nvidia")]
mod nvidia;

const DRIVER: &str = "devices.example.com";
const WAIT: Duration = Duration::from_secs(15);

/// A daemon in device-plugin mode serving `resource` (every device of the backends), with the
/// kubelet emulator.
async fn dp_node(
    dir: &Path,
    host: &Path,
    resource: &str,
    backends: &str,
    extra: &str,
) -> DevicePluginDaemon {
    let dp = dir.join("dp");
    std::fs::create_dir_all(&dp).unwrap();
    let text = format!(
        "nodeName: node-a\nhostRoot: {host}\nstateDir: {d}/state\ndevicePlugin:\n  directory: {dp}\n  resources:\n    - name: {resource}\n{extra}backends:\n{backends}",
        host = host.display(),
        d = dir.display(),
        dp = dp.display(),
    );
    let node = DevicePluginDaemon::start(&dir.join("dp.yaml"), &text, &dp).await;
    node.kubelet
        .wait_for(resource, WAIT, |r| r.connected && r.capacity > 0)
        .await
        .unwrap();
    node
}

/// A daemon in DRA mode with the DRA kubelet emulator; claims are allocated by the test.
struct DraNode {
    root: PathBuf,
    dra: DraDaemon,
}

async fn dra_node(dir: &Path, host: &Path, backends: &str) -> DraNode {
    std::fs::write(
        dir.join("boot_id"),
        "8b7c1f6e-0000-4000-8000-0000000000bb\n",
    )
    .unwrap();
    let path = dir.join("dra.yaml");
    let text = format!(
        "nodeName: node-a\nhostRoot: {host}\nstateDir: {r}/state\ndevicePlugin:\n  enabled: false\n{dra}backends:\n{backends}",
        host = host.display(),
        r = dir.display(),
        dra = common::dra_section(DRIVER, dir, &dir.join("plugins")),
    );
    let claims = Arc::new(Claims::default());
    let dra = DraDaemon::start(dir, &path, &text, DRIVER, claims, WAIT).await;
    DraNode {
        root: dir.to_path_buf(),
        dra,
    }
}

/// The claim `uid` as the kubelet names it.
fn claim_id(uid: &str) -> ClaimId {
    ClaimId::new("default", &format!("claim-{uid}"), uid)
}

impl DraNode {
    /// The devices published in ResourceSlices, as `pool/device`.
    async fn published(&self) -> Vec<DeviceRef> {
        self.dra
            .slices
            .wait_last(WAIT)
            .await
            .devices()
            .map(|(p, d)| DeviceRef::new(p.name.clone(), d.name.clone()))
            .collect()
    }

    fn published_inventory(&self) -> Inventory {
        self.dra.slices.last().unwrap()
    }

    /// Allocates `devices` to a claim and prepares it through the kubelet; returns the CDI
    /// spec file's content.
    async fn prepare(&self, uid: &str, devices: &[DeviceRef]) -> String {
        self.dra.claims.allocate(uid, "req", devices);
        let answers = self
            .dra
            .kubelet
            .prepare(DRIVER, &[claim_id(uid)])
            .await
            .unwrap();
        let answer = answers[uid].as_ref().unwrap();
        assert_eq!(answer.len(), devices.len());
        let files: Vec<PathBuf> = common::cdi_files(&self.root.join("cdi"))
            .into_iter()
            .filter(|p| p.to_string_lossy().contains(uid))
            .collect();
        assert_eq!(files.len(), 1, "one CDI spec for the claim: {files:?}");
        std::fs::read_to_string(&files[0]).unwrap()
    }

    async fn unprepare(&self, uid: &str) {
        let answers = self
            .dra
            .kubelet
            .unprepare(DRIVER, &[claim_id(uid)])
            .await
            .unwrap();
        assert!(answers[uid].is_ok(), "{:?}", answers[uid]);
    }

    async fn wait_health(&self, device: &DeviceRef, health: &str) {
        common::wait_dra_health(&self.dra.kubelet, DRIVER, &device.to_string(), health, WAIT).await;
    }

    async fn stop(self) {
        self.dra.stop().await;
    }
}

fn attr(inv: &Inventory, d: &DeviceRef, name: &str) -> Option<String> {
    inv.device(d)?
        .attributes
        .iter()
        .find(|(k, _)| k.as_str() == name)
        .map(|(_, v)| v.to_string().trim_matches('"').to_string())
}

#[cfg(feature = "vfio")]
#[tokio::test]
async fn vfio_gpus_through_both_apis_with_hot_plug() {
    use kubedev_testkit::machines::pci::{GPU_SERVER_GPUS, dual_socket_gpu_server};
    let machine = dual_socket_gpu_server().unwrap();
    let backends = "  vfio:\n    pciDevices:\n      - selector: \"10de:2236\"\n        resourceName: nvidia.com/GA102GL_A10\n";
    let resource = "nvidia.com/GA102GL_A10";
    let (addr, _, group, _) = GPU_SERVER_GPUS[0];

    // Device plugin: four GPUs, Allocate gives the VFIO nodes and KubeVirt's variable.
    let dir = tempfile::tempdir().unwrap();
    let node = dp_node(dir.path(), machine.path(), resource, backends, "").await;
    let state = node.kubelet.resource(resource).unwrap();
    assert_eq!(state.capacity, 4, "{:?}", state.devices.keys());
    let first = state.devices.keys().next().unwrap().clone();
    let a = node.kubelet.allocate(resource, &[&first]).await.unwrap();
    assert_eq!(a.envs["PCI_RESOURCE_NVIDIA_COM_GA102GL_A10"], addr, "{a:?}");
    let paths: Vec<&str> = a.devices.iter().map(|d| d.host_path.as_str()).collect();
    assert!(paths.contains(&"/dev/vfio/vfio"), "{paths:?}");
    assert!(
        paths.contains(&format!("/dev/vfio/{group}").as_str()),
        "{paths:?}"
    );

    // Hot-unplug of the group's node: Unhealthy, then back.
    let node_path = format!("/dev/vfio/{group}");
    machine.remove(&node_path).unwrap();
    node.wait_health(resource, &first, "Unhealthy", WAIT).await;
    machine.device_node(&node_path).unwrap();
    node.wait_health(resource, &first, "Healthy", WAIT).await;
    node.stop().await;

    // DRA: the same four GPUs in a slice; prepare writes their nodes into the CDI spec; the
    // health stream follows the node.
    let dir = tempfile::tempdir().unwrap();
    let node = dra_node(dir.path(), machine.path(), backends).await;
    let published = node.published().await;
    assert_eq!(published.len(), 4, "{published:?}");
    let inv = node.published_inventory();
    let gpu = published
        .iter()
        .find(|d| attr(&inv, d, "resource.kubernetes.io/pciBusID").as_deref() == Some(addr))
        .unwrap_or_else(|| panic!("no published device has pciBusID {addr}: {inv:?}"))
        .clone();
    let spec = node.prepare("uid-vfio", std::slice::from_ref(&gpu)).await;
    assert!(spec.contains(&format!("/dev/vfio/{group}")), "{spec}");
    assert!(spec.contains(addr), "{spec}");
    machine.remove(&node_path).unwrap();
    node.wait_health(&gpu, "UNHEALTHY").await;
    machine.device_node(&node_path).unwrap();
    node.wait_health(&gpu, "HEALTHY").await;
    node.unprepare("uid-vfio").await;
    node.stop().await;
}

#[cfg(feature = "usb")]
#[tokio::test]
async fn usb_groups_through_both_apis_with_hot_plug() {
    use kubedev_testkit::machines::usb::{three_devices, three_devices_list};
    let machine = three_devices().unwrap();
    let backends = "  usb:\n    resources:\n      - name: example.com/yubikey\n        selectors: [\"1050:0407\"]\n";
    let resource = "example.com/yubikey";
    let yubikeys: Vec<_> = three_devices_list()
        .into_iter()
        .filter(|d| d.vendor == 0x1050)
        .collect();

    let dir = tempfile::tempdir().unwrap();
    let node = dp_node(dir.path(), machine.path(), resource, backends, "").await;
    let state = node.kubelet.resource(resource).unwrap();
    assert_eq!(
        state.capacity, 2,
        "two identical keys, two instances: {state:?}"
    );
    let ids: Vec<String> = state.devices.keys().cloned().collect();
    let a = node.kubelet.allocate(resource, &[&ids[0]]).await.unwrap();
    let env = &a.envs["USB_RESOURCE_EXAMPLE_COM_YUBIKEY"];
    let holder = yubikeys
        .iter()
        .find(|k| *env == k.bus_dev())
        .unwrap_or_else(|| panic!("USB_RESOURCE names no key: {env}"));
    assert_eq!(a.devices[0].host_path, holder.node());
    assert_eq!(a.devices[0].permissions, "mrw");

    machine.remove(holder.node().as_str()).unwrap();
    node.wait_health(resource, &ids[0], "Unhealthy", WAIT).await;
    machine.device_node(holder.node().as_str()).unwrap();
    node.wait_health(resource, &ids[0], "Healthy", WAIT).await;
    node.stop().await;

    let dir = tempfile::tempdir().unwrap();
    let node = dra_node(dir.path(), machine.path(), backends).await;
    let published = node.published().await;
    assert_eq!(published.len(), 2, "{published:?}");
    let spec = node.prepare("uid-usb", &published[..1]).await;
    assert!(yubikeys.iter().any(|k| spec.contains(&k.node())), "{spec}");
    let key = &yubikeys[0];
    machine.remove(key.node().as_str()).unwrap();
    let inv = node.published_inventory();
    let gone = published
        .iter()
        .find(|d| {
            inv.device(d).is_some_and(|dev| {
                dev.attributes
                    .values()
                    .any(|v| v.to_string().contains("11111111"))
            })
        })
        .unwrap_or_else(|| panic!("no device carries serial 11111111: {inv:?}"))
        .clone();
    node.wait_health(&gone, "UNHEALTHY").await;
    machine.device_node(key.node().as_str()).unwrap();
    node.wait_health(&gone, "HEALTHY").await;
    node.unprepare("uid-usb").await;
    node.stop().await;
}

#[cfg(feature = "host")]
#[tokio::test]
async fn kvm_slots_through_both_apis_with_hot_plug() {
    let machine = kubedev_testkit::hostroot::HostRoot::new().unwrap();
    machine.device_node("/dev/kvm").unwrap();
    let backends = "  host:\n    resyncSeconds: 1\n    characterDevices:\n      - {name: kvm, path: /dev/kvm, slots: 3}\n";
    let resource = "devices.kubevirt.io/kvm";

    let dir = tempfile::tempdir().unwrap();
    let node = dp_node(dir.path(), machine.path(), resource, backends, "").await;
    let state = node.kubelet.resource(resource).unwrap();
    assert_eq!(state.capacity, 3, "{state:?}");
    let ids: Vec<String> = state.devices.keys().cloned().collect();
    let a = node.kubelet.allocate(resource, &[&ids[1]]).await.unwrap();
    assert_eq!(a.devices[0].host_path, "/dev/kvm");
    assert_eq!(a.devices[0].permissions, "rw");
    machine.remove("/dev/kvm").unwrap();
    for id in &ids {
        node.wait_health(resource, id, "Unhealthy", WAIT).await;
    }
    machine.device_node("/dev/kvm").unwrap();
    node.wait_health(resource, &ids[2], "Healthy", WAIT).await;
    node.stop().await;

    let dir = tempfile::tempdir().unwrap();
    let node = dra_node(dir.path(), machine.path(), backends).await;
    let published = node.published().await;
    assert_eq!(published.len(), 3);
    let spec = node.prepare("uid-kvm", &published[..2]).await;
    assert!(spec.contains("/dev/kvm"), "{spec}");
    machine.remove("/dev/kvm").unwrap();
    node.wait_health(&published[0], "UNHEALTHY").await;
    machine.device_node("/dev/kvm").unwrap();
    node.wait_health(&published[0], "HEALTHY").await;
    node.unprepare("uid-kvm").await;
    node.stop().await;
}

#[cfg(all(feature = "nvidia", feature = "host"))]
#[tokio::test]
async fn without_nvml_the_other_backends_are_still_served() {
    let machine = kubedev_testkit::hostroot::HostRoot::new().unwrap();
    machine.device_node("/dev/kvm").unwrap();
    let backends = "  nvidia:\n    libraryPath: /nonexistent/libnvidia-ml.so.1\n  host:\n    characterDevices:\n      - {name: kvm, path: /dev/kvm, slots: 2}\n";
    let dir = tempfile::tempdir().unwrap();
    let node = dp_node(
        dir.path(),
        machine.path(),
        "devices.kubevirt.io/kvm",
        backends,
        "",
    )
    .await;
    let state = node.kubelet.resource("devices.kubevirt.io/kvm").unwrap();
    assert_eq!(
        state.devices.keys().collect::<Vec<_>>(),
        ["kvm-0", "kvm-1"],
        "the kvm slots, and nothing from the missing NVML"
    );
    node.stop().await;
}

#[cfg(feature = "vfio")]
#[tokio::test]
async fn discover_and_cdi_generate_change_nothing_on_the_host() {
    use kubedev_testkit::machines::mdev::{MdevKernelSim, vgpu_mdev_host_spec};
    let spec = vgpu_mdev_host_spec();
    let machine = spec.build().unwrap();
    let _kernel = MdevKernelSim::start(machine.path(), &spec);
    let mdevs = || {
        let mut v: Vec<_> = std::fs::read_dir(machine.join("/sys/bus/mdev/devices"))
            .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name()).collect())
            .unwrap_or_default();
        v.sort();
        v
    };
    let before = mdevs();
    assert!(
        !before.is_empty(),
        "the machine starts with mediated devices"
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubedev.yaml");
    std::fs::write(
        &path,
        format!(
            "nodeName: node-a\nhostRoot: {}\nstateDir: {}/state\ndra:\n  enabled: true\n  driverName: gpu.example.com\nbackends:\n  vfio:\n    mediatedDevices:\n      - {{mdevNameSelector: \"GRID T4-1B\", resourceName: nvidia.com/GRID_T4-1B}}\n    desiredMdevTypes:\n      - {{parentSelectors: [\"10de:1eb8\"], types: [nvidia-223]}}\n  host:\n    permanentDevices: true\n",
            machine.path().display(),
            dir.path().display()
        ),
    )
    .unwrap();
    let config = kubedev::config::Config::load(&path).unwrap();
    // The daemon would replace the T4-1B instances by T4-2B ones; a look at the host must not.
    let found = kubedev::discover::discover(&config, &path).await.unwrap();
    let table = found.table();
    assert!(
        table.contains("kvm-0") && table.contains("mdev-"),
        "{table}"
    );
    let generated = kubedev::cdi_generate::generate(&config, &path, "gpu.example.com/device")
        .await
        .unwrap();
    assert!(generated.spec.is_some());
    assert_eq!(
        mdevs(),
        before,
        "discover and cdi generate created or removed mdevs"
    );
}

#[cfg(feature = "vfio")]
#[tokio::test]
async fn vgpu_types_are_created_at_start_and_served_as_mediated_devices() {
    use kubedev_testkit::machines::mdev::{MdevKernelSim, vgpu_mdev_host_spec};
    let spec = vgpu_mdev_host_spec();
    let machine = spec.build().unwrap();
    let _kernel = MdevKernelSim::start(machine.path(), &spec);
    // Two T4s; the first holds two GRID T4-1B instances. Wanted: all T4s on GRID T4-2B (8 each).
    let backends = "  vfio:\n    mediatedDevices:\n      - {mdevNameSelector: \"GRID T4-2B\", resourceName: nvidia.com/GRID_T4-2B}\n    desiredMdevTypes:\n      - {parentSelectors: [\"10de:1eb8\"], types: [nvidia-223]}\n";
    let resource = "nvidia.com/GRID_T4-2B";
    let dir = tempfile::tempdir().unwrap();
    let node = dp_node(dir.path(), machine.path(), resource, backends, "").await;
    let state = node.kubelet.resource(resource).unwrap();
    assert_eq!(state.capacity, 16, "{:?}", state.devices.keys());
    let id = state.devices.keys().next().unwrap().clone();
    let a = node.kubelet.allocate(resource, &[&id]).await.unwrap();
    let uuid = &a.envs["MDEV_PCI_RESOURCE_NVIDIA_COM_GRID_T4-2B"];
    assert_eq!(uuid.len(), 36, "an mdev UUID: {a:?}");
    assert!(
        machine
            .join(format!("/sys/bus/mdev/devices/{uuid}"))
            .exists(),
        "the allocated mdev exists"
    );
    node.stop().await;
}

#[cfg(feature = "nvidia")]
#[tokio::test]
async fn a_driver_upgraded_under_the_daemon_gets_prepared_claims_a_spec_with_the_new_files() {
    /// The driver's files of `version` on the fake host, and the module's version in sysfs.
    fn install(host: &Path, version: &str) {
        let lib = host.join("usr/lib/x86_64-linux-gnu");
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::write(lib.join(format!("libcuda.so.{version}")), version).unwrap();
        std::fs::create_dir_all(host.join("sys/module/nvidia")).unwrap();
        std::fs::write(
            host.join("sys/module/nvidia/version"),
            format!("{version}\n"),
        )
        .unwrap();
    }
    if std::env::consts::ARCH != "x86_64" {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let host = tempfile::tempdir().unwrap();
    install(host.path(), "550.54.15");
    let machine = dir.path().join("machine.yaml");
    let original = std::fs::read_to_string(nvml_mock::machine_path("workstation")).unwrap();
    std::fs::write(&machine, &original).unwrap();
    let lib = nvml_mock::isolated_library(dir.path(), &machine, None).unwrap();
    let backends = format!(
        "  nvidia:\n    libraryPath: {}\n    healthPollMillis: 50\n",
        lib.display()
    );
    let node = dra_node(dir.path(), host.path(), &backends).await;
    let published = node.published().await;
    let gpu = published
        .iter()
        .find(|d| d.device.as_str() == "gpu-0")
        .unwrap()
        .clone();
    let spec = node
        .prepare("uid-upgrade", std::slice::from_ref(&gpu))
        .await;
    assert!(spec.contains("libcuda.so.550.54.15"), "{spec}");

    // The driver is upgraded while kubedev runs: new files, the module and NVML say so.
    std::fs::write(&machine, original.replace("550.54.15", "560.35.03")).unwrap();
    install(host.path(), "560.35.03");
    let file = common::cdi_files(&node.root.join("cdi"))
        .into_iter()
        .find(|p| p.to_string_lossy().contains("uid-upgrade"))
        .unwrap();
    let rewritten = common::eventually(WAIT, || {
        let now = std::fs::read_to_string(&file).unwrap_or_default();
        async move {
            if now.contains("libcuda.so.560.35.03") {
                Ok(now)
            } else {
                Err(format!("the spec still mounts the old driver: {now}"))
            }
        }
    })
    .await;
    assert!(!rewritten.contains("550.54.15"), "{rewritten}");
    // The kubelet's next prepare of the claim answers from the new record, unchanged.
    node.prepare("uid-upgrade", std::slice::from_ref(&gpu))
        .await;
    let again = std::fs::read_to_string(&file).unwrap();
    assert_eq!(again, rewritten);
    node.unprepare("uid-upgrade").await;
    node.stop().await;
}
