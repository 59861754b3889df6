//! The NVIDIA backend through the real nvml-wrapper against the mock libnvidia-ml
//! (`cargo build -p kubedev-nvml-mock` first).
#![allow(clippy::unwrap_used, missing_docs, missing_debug_implementations)]

mod discovery;
mod driver_files;
mod health;
mod mig;
mod sharing;

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use kubedev_core::{AttributeValue, BackendContext, Device, DeviceSource, Pool};
use kubedev_nvidia::{NvidiaBackend, NvidiaConfig};

/// One backend on a private copy of the mock bound to a machine file, with a fake host root.
pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub ctx: BackendContext,
    pub control: PathBuf,
    pub library: PathBuf,
}

impl Fixture {
    pub fn new(machine: &str) -> Fixture {
        Self::with_machine_file(&nvml_mock::machine_path(machine))
    }

    pub fn with_machine_file(machine: &Path) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let control = dir.path().join("control.jsonl");
        std::fs::write(&control, b"").unwrap();
        let library = nvml_mock::isolated_library(dir.path(), machine, Some(&control))
            .expect("the mock library: run `cargo build -p kubedev-nvml-mock` first");
        let root = dir.path().join("host");
        fake_host(&root);
        let ctx = BackendContext::new(
            kubedev_core::HostFs::new(root),
            dir.path().join("state"),
            "node-a",
        );
        Fixture {
            dir,
            ctx,
            control,
            library,
        }
    }

    pub fn config(&self) -> NvidiaConfig {
        NvidiaConfig {
            library_path: Some(self.library.clone()),
            ..NvidiaConfig::default()
        }
    }

    pub fn backend(&self, config: NvidiaConfig) -> NvidiaBackend {
        NvidiaBackend::new(config, &self.ctx).unwrap()
    }

    /// Appends one line to the mock's control file.
    pub fn control(&self, line: &str) {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.control)
            .unwrap();
        writeln!(f, "{line}").unwrap();
    }
}

/// A host root with the NVIDIA control nodes, the MIG capability minors as the driver numbers
/// them, and sysfs links for the dgx-a100 GPUs (so `pcieRoot` can be derived).
fn fake_host(root: &Path) {
    std::fs::create_dir_all(root.join("dev")).unwrap();
    for n in ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"] {
        std::fs::write(root.join("dev").join(n), b"").unwrap();
    }
    let caps = root.join("proc/driver/nvidia-caps");
    std::fs::create_dir_all(&caps).unwrap();
    let mut minors = String::from("config 1\nmonitor 2\n");
    let mut n = 3;
    for gpu in 0..8 {
        for gi in 0..15 {
            minors.push_str(&format!("gpu{gpu}/gi{gi}/access {n}\n"));
            n += 1;
            for ci in 0..8 {
                minors.push_str(&format!("gpu{gpu}/gi{gi}/ci{ci}/access {n}\n"));
                n += 1;
            }
        }
    }
    std::fs::write(caps.join("mig-minors"), minors).unwrap();
    let links = root.join("sys/bus/pci/devices");
    std::fs::create_dir_all(&links).unwrap();
    for (bus, root_complex) in [
        ("0000:07:00.0", "pci0000:00"),
        ("0000:0f:00.0", "pci0000:00"),
        ("0000:47:00.0", "pci0000:40"),
        ("0000:4e:00.0", "pci0000:40"),
        ("0000:87:00.0", "pci0000:80"),
        ("0000:90:00.0", "pci0000:80"),
        ("0000:b7:00.0", "pci0000:b0"),
        ("0000:bd:00.0", "pci0000:b0"),
    ] {
        let real = root
            .join("sys/devices")
            .join(root_complex)
            .join("0000:00:01.0")
            .join(bus);
        std::fs::create_dir_all(&real).unwrap();
        symlink(
            format!("../../../devices/{root_complex}/0000:00:01.0/{bus}"),
            links.join(bus),
        )
        .unwrap();
    }
}

pub async fn discover(b: &NvidiaBackend) -> Pool {
    let mut pools = b.discover().await.unwrap();
    assert_eq!(pools.len(), 1);
    let pool = pools.remove(0);
    pool.validate().unwrap();
    pool
}

/// An attribute of the `gpu.nvidia.com` domain.
pub fn a(d: &Device, id: &str) -> AttributeValue {
    d.attribute(&format!("gpu.nvidia.com/{id}"))
        .cloned()
        .unwrap_or_else(|| panic!("{} has no attribute {id}", d.name))
}

pub fn s(v: &str) -> AttributeValue {
    AttributeValue::String(v.to_string())
}
