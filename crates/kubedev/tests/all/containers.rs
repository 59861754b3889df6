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

use crate::common::{self, Claims, DraDaemon};
use kubedev_core::{AllocatedDevice, DeviceRef, Inventory};
use kubedev_testkit::kubelet::ClaimId;
use kubedev_testkit::podman::{Container, Podman, RunOutput};

mod metadata_file;
mod plugin_cdi_mode;
mod static_and_host;
#[cfg(feature = "usb")]
mod usb;
#[cfg(feature = "vfio")]
mod vfio;

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
