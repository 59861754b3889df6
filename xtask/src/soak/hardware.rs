//! The hardware of the watches soak: a fake host root with two USB security keys and four GPUs
//! on `vfio-pci`, and a DGX A100 behind the NVML stand-in, served by the usb, vfio and nvidia
//! backends beside the static one. Every event takes one [`Part`] of it away and brings it back,
//! as hardware does, in turn:
//!
//! - usb: the second key is unplugged (its sysfs directory and device node go), then plugged in
//!   again with the next device number, as the kernel numbers a replugged device (3 to 127, then
//!   around), so the backend sees a device node it has never seen;
//! - vfio: the first GPU's IOMMU group node (`/dev/vfio/20`) goes and comes back;
//! - nvidia: GPU 0 falls off the bus (`GPU_IS_LOST`) and answers again, through the stand-in's
//!   control file; and every [`XID_EVERY`] events GPU 7 reports Xid 79 when it is healthy,
//!   which it is again [`RECHECK_SECONDS`] later.
//!
//! Each change must reach the API server: the part's device tainted, then not.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use kubedev_testkit::hostroot::HostRoot;
use kubedev_testkit::machines::pci::dual_socket_gpu_server_spec;
use kubedev_testkit::machines::usb::{FakeUsbDevice, write_device, write_root_hub, yubikey};

/// How often (in events) GPU 7 reports an Xid, when it is healthy by then.
pub(super) const XID_EVERY: u64 = 25;
/// The nvidia backend's recheck period: an Xid's GPU is healthy again this long after it.
const RECHECK_SECONDS: u64 = 1;
/// The nvidia backend's probe interval, in milliseconds (its smallest; the default is 5,000).
const HEALTH_POLL_MS: u64 = 10;
/// The IOMMU group of the GPU whose group node comes and goes.
const VFIO_GROUP: u32 = 20;
/// The GPU that falls off the bus and comes back.
const LOST_GPU: u32 = 0;
/// The GPU that reports Xids.
const XID_GPU: u32 = 7;

/// The part of the machine one event takes away and brings back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Part {
    /// The second USB key.
    Usb,
    /// The first GPU's IOMMU group node.
    Vfio,
    /// GPU 0 of the DGX.
    Nvidia,
}

impl Part {
    /// The part event `event` changes: each in turn.
    pub(super) fn of_event(event: u64) -> Part {
        match event % 3 {
            0 => Part::Usb,
            1 => Part::Vfio,
            _ => Part::Nvidia,
        }
    }

    /// Its backend, which names its pool (`<node>-<backend>`).
    pub(super) fn backend(self) -> &'static str {
        match self {
            Part::Usb => "usb",
            Part::Vfio => "vfio",
            Part::Nvidia => "nvidia",
        }
    }

    /// The published device that must show a taint while the part is away.
    pub(super) fn device(self) -> &'static str {
        match self {
            Part::Usb => "yubikey-1-2",
            Part::Vfio => "pci-0000-3b-00-0",
            Part::Nvidia => "gpu-0",
        }
    }
}

/// The published device of the GPU that reports Xids.
pub(super) const XID_DEVICE: &str = "gpu-7";

/// The fake machine and the state of each thing that changes on it.
pub(super) struct Hardware {
    root: HostRoot,
    /// The NVML stand-in's copy and its control file.
    nvml: tempfile::TempDir,
    library: PathBuf,
    /// The key that is unplugged and plugged in again.
    key: FakeUsbDevice,
    /// How many times each part was taken away, by [`Part`].
    pub(super) removals: [u64; 3],
    /// Xids reported so far.
    pub(super) xids: u64,
}

impl Hardware {
    /// The machine, with everything present and healthy; the NVML stand-in's copy goes under
    /// `parent` (the system's temporary directory when `None`).
    pub(super) fn new(parent: Option<&Path>) -> anyhow::Result<Hardware> {
        let root = HostRoot::new()?;
        write_root_hub(&root, 1)?;
        write_device(&root, &yubikey(1, 1, 2, "11111111"))?;
        let key = yubikey(1, 2, 3, "22222222");
        write_device(&root, &key)?;
        dual_socket_gpu_server_spec().write_into(&root)?;
        let nvml = super::node_dir(parent)?;
        let control = nvml.path().join("control.jsonl");
        std::fs::write(&control, "")?;
        let library = nvml_mock::isolated_library(
            nvml.path(),
            &nvml_mock::machine_path("dgx-a100"),
            Some(&control),
        )
        .context("the NVML stand-in (cargo build -p kubedev-nvml-mock)")?;
        Ok(Hardware {
            root,
            nvml,
            library,
            key,
            removals: [0; 3],
            xids: 0,
        })
    }

    /// The configuration's lines for this machine: the host root, no device plugin, and the
    /// three backends' sections (to follow the static backend's, under `backends:`).
    pub(super) fn config(&self) -> String {
        format!(
            "  usb:\n    resources:\n      - {{name: example.com/yubikey, selectors: [\"1050:0407\"]}}\n  \
             vfio:\n    pciDevices:\n      - {{selector: \"10de:2236\", resourceName: example.com/a10}}\n  \
             nvidia:\n    libraryPath: {}\n    healthPollMillis: {HEALTH_POLL_MS}\n    healthRecheckSeconds: {RECHECK_SECONDS}\n\
             hostRoot: {}\ndevicePlugin:\n  enabled: false\n",
            self.library.display(),
            self.root.path().display()
        )
    }

    /// Takes `part` away (`present` false) or brings it back.
    pub(super) fn set(&mut self, part: Part, present: bool) -> anyhow::Result<()> {
        match part {
            Part::Usb if present => self.plug_in()?,
            Part::Usb => self.unplug()?,
            Part::Vfio => {
                let node = format!("/dev/vfio/{VFIO_GROUP}");
                if present {
                    self.root.device_node(&node)?;
                } else {
                    self.root.remove(&node)?;
                }
            }
            Part::Nvidia => self.control(&if present {
                format!("{{\"restore\": {LOST_GPU}}}")
            } else {
                format!("{{\"lost\": {LOST_GPU}}}")
            })?,
        }
        if !present {
            self.removals[part as usize] += 1;
        }
        Ok(())
    }

    /// GPU 7 reports Xid 79 (the GPU fell off the bus: a `NoExecute` taint until it recovers).
    pub(super) fn xid(&mut self) -> anyhow::Result<()> {
        self.control(&format!("{{\"xid\": 79, \"gpu\": {XID_GPU}}}"))?;
        self.xids += 1;
        Ok(())
    }

    /// Unplugs the key: its sysfs directory, its links and its device node go.
    fn unplug(&self) -> anyhow::Result<()> {
        let dir = format!("/sys/bus/usb/devices/{}", self.key.sysfs_name());
        let target = std::fs::canonicalize(self.root.join(&dir))?;
        std::fs::remove_dir_all(target)?;
        self.root.remove(&dir)?;
        self.root
            .remove(format!("{dir}:1.0"))
            .context("the key's interface link")?;
        self.root.remove(self.key.node())?;
        Ok(())
    }

    /// Plugs the key in again with the next device number (1, the root hub, and 2, the other
    /// key, are taken).
    fn plug_in(&mut self) -> anyhow::Result<()> {
        self.key.devnum = if self.key.devnum >= 127 {
            3
        } else {
            self.key.devnum + 1
        };
        write_device(&self.root, &self.key)?;
        Ok(())
    }

    /// Appends one line to the NVML stand-in's control file.
    fn control(&self, line: &str) -> anyhow::Result<()> {
        let path = self.nvml.path().join("control.jsonl");
        let mut f = std::fs::OpenOptions::new().append(true).open(&path)?;
        writeln!(f, "{line}").with_context(|| format!("writing {}", path.display()))
    }
}
