//! Everything that talks to NVML, and the only module with `unsafe` code.
//!
//! nvml-wrapper's safe API covers GPU queries, NVLink state and events. MIG needs more: it has
//! no safe calls for listing, creating or destroying GPU and compute instances, its
//! `possible_placements` returns an empty list (it never sets the vector's length) and its
//! `remote_device_type` always answers `Unknown`; those go through the raw function table
//! (`Nvml::lib()`), each call checking that the symbol was found.
//!
//! This module reads GPUs; `mig` reads MIG profiles and instances, `instances` creates and
//! destroys them, `events` probes GPUs and waits for Xid events.

mod events;
mod instances;
mod mig;

use std::path::Path;

use kubedev_core::HostFs;
use nvml_wrapper::enum_wrappers::device::{Brand, TopologyLevel};
use nvml_wrapper::error::{NvmlError, nvml_sym, nvml_try};
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings as sys;

use crate::error::NvidiaError;
use crate::snapshot::{GpuInfo, MachineInfo, normalize_bus_id};
use mig::{mig_instances, mig_profiles};

pub(crate) use events::{Wait, XidEvents, probe};
pub(crate) use instances::{create_instance, destroy_instance, find_instance};

/// Loads and initialises NVML; the error is the reason, for "NVML unavailable: <reason>".
pub(crate) fn init(library: Option<&Path>) -> Result<Nvml, String> {
    let mut builder = Nvml::builder();
    if let Some(p) = library {
        builder.lib_path(p.as_os_str());
    }
    builder.init().map_err(|e| match library {
        Some(p) => format!("loading {}: {}", p.display(), describe(&e)),
        None => describe(&e),
    })
}

fn describe(e: &NvmlError) -> String {
    match e {
        NvmlError::LibloadingError(inner) => format!("cannot load libnvidia-ml.so: {inner}"),
        NvmlError::DriverNotLoaded => "the NVIDIA kernel driver is not loaded".to_string(),
        NvmlError::NoPermission => "no permission to use the NVIDIA driver".to_string(),
        other => other.to_string(),
    }
}

fn nvml_err(call: &'static str, target: impl Into<String>, e: &NvmlError) -> NvidiaError {
    NvidiaError::Nvml {
        call,
        target: target.into(),
        message: e.to_string(),
        gpu_lost: matches!(e, NvmlError::GpuLost),
    }
}

/// Per-GPU result of reading the machine: a GPU that cannot be read is reported, not fatal.
#[derive(Debug)]
pub(crate) struct MachineRead {
    pub(crate) machine: MachineInfo,
    /// NVML index → why the GPU could not be read.
    pub(crate) failed: Vec<(u32, NvidiaError)>,
}

/// Reads every GPU. `mig` asks for MIG profiles, placements and instances of GPUs with MIG on.
pub(crate) fn read_machine(
    nvml: &Nvml,
    host: &HostFs,
    mig: bool,
) -> Result<MachineRead, NvidiaError> {
    let count = nvml
        .device_count()
        .map_err(|e| nvml_err("nvmlDeviceGetCount", "the system", &e))?;
    let driver_version = nvml.sys_driver_version().ok();
    let cuda_driver_version = nvml.sys_cuda_driver_version().ok().map(|v| {
        (
            nvml_wrapper::cuda_driver_version_major(v),
            nvml_wrapper::cuda_driver_version_minor(v),
        )
    });
    let mut gpus = Vec::new();
    let mut handles = Vec::new();
    let mut failed = Vec::new();
    for index in 0..count {
        match read_gpu(nvml, host, index, mig) {
            Ok((gpu, dev)) => {
                gpus.push(gpu);
                handles.push(dev);
            }
            Err(e) => failed.push((index, e)),
        }
    }
    let mut ancestor_levels = vec![vec![None; gpus.len()]; gpus.len()];
    for i in 0..handles.len() {
        for j in (i + 1)..handles.len() {
            let level = nvml
                .topology_common_ancestor(&handles[i], &handles[j])
                .ok()
                .map(|l| level_value(&l));
            ancestor_levels[i][j] = level;
            ancestor_levels[j][i] = level;
        }
    }
    Ok(MachineRead {
        machine: MachineInfo {
            driver_version,
            cuda_driver_version,
            gpus,
            ancestor_levels,
        },
        failed,
    })
}

fn level_value(l: &TopologyLevel) -> u32 {
    match l {
        TopologyLevel::Internal => 0,
        TopologyLevel::Single => 10,
        TopologyLevel::Multiple => 20,
        TopologyLevel::HostBridge => 30,
        TopologyLevel::Node => 40,
        TopologyLevel::System => 50,
    }
}

fn brand_name(b: &Brand) -> &'static str {
    match b {
        Brand::Unknown => "Unknown",
        Brand::Quadro => "Quadro",
        Brand::Tesla => "Tesla",
        Brand::NVS => "NVS",
        Brand::GRID => "GRID",
        Brand::GeForce => "GeForce",
        Brand::Titan => "Titan",
        Brand::VApps => "NvidiaVApps",
        Brand::VPC => "NvidiaVPC",
        Brand::VCS => "NvidiaVCS",
        Brand::VWS => "NvidiaVWS",
        Brand::CloudGaming | Brand::VGaming => "NvidiaCloudGaming",
        Brand::QuadroRTX => "QuadroRTX",
        Brand::NvidiaRTX => "NvidiaRTX",
        Brand::Nvidia => "Nvidia",
        Brand::GeForceRTX => "GeForceRTX",
        Brand::TitanRTX => "TitanRTX",
    }
}

fn read_gpu<'n>(
    nvml: &'n Nvml,
    host: &HostFs,
    index: u32,
    mig: bool,
) -> Result<(GpuInfo, Device<'n>), NvidiaError> {
    let target = format!("GPU {index}");
    let dev = nvml
        .device_by_index(index)
        .map_err(|e| nvml_err("nvmlDeviceGetHandleByIndex", &target, &e))?;
    let uuid = dev
        .uuid()
        .map_err(|e| nvml_err("nvmlDeviceGetUUID", &target, &e))?;
    let minor = dev
        .minor_number()
        .map_err(|e| nvml_err("nvmlDeviceGetMinorNumber", &target, &e))?;
    let product_name = dev
        .name()
        .map_err(|e| nvml_err("nvmlDeviceGetName", &target, &e))?;
    let pci = dev
        .pci_info()
        .map_err(|e| nvml_err("nvmlDeviceGetPciInfo", &target, &e))?;
    let memory = dev
        .memory_info()
        .map_err(|e| nvml_err("nvmlDeviceGetMemoryInfo", &target, &e))?;
    let brand = dev
        .brand()
        .map(|b| brand_name(&b).to_string())
        .unwrap_or_else(|_| "Unknown".to_string());
    let architecture = dev
        .architecture()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| "Unknown".to_string());
    let compute_capability = dev
        .cuda_compute_capability()
        .ok()
        .map(|c| (c.major, c.minor));
    let pci_bus_id = normalize_bus_id(&pci.bus_id);
    let numa_node = match dev.numa_node_id() {
        Ok(n) => Some(i64::from(n)),
        Err(_) => sysfs_numa(host, &pci_bus_id),
    };
    let pcie_root = pcie_root(host, &pci_bus_id);
    let (mig_capable, mig_enabled) = match dev.mig_mode() {
        Ok(m) => (true, m.current == sys::NVML_DEVICE_MIG_ENABLE),
        Err(_) => (false, false),
    };
    let (nvlink_remotes, nvswitch_remotes) = nvlinks(&dev);
    let (profiles, instances) = if mig && mig_enabled {
        let profiles = mig_profiles(&dev);
        let instances = mig_instances(&dev, &profiles)
            .map_err(|e| nvml_err("listing MIG instances", &target, &e))?;
        (profiles, instances)
    } else {
        (Vec::new(), Vec::new())
    };
    Ok((
        GpuInfo {
            index,
            uuid,
            minor,
            product_name,
            brand,
            architecture,
            compute_capability,
            memory_bytes: memory.total,
            pci_bus_id,
            pcie_root,
            numa_node,
            mig_capable,
            mig_enabled,
            profiles,
            instances,
            nvlink_remotes,
            nvswitch_remotes,
        },
        dev,
    ))
}

/// The NUMA node from sysfs (`/sys/bus/pci/devices/<bdf>/numa_node`), when NVML cannot say;
/// -1 (no affinity) is no node.
fn sysfs_numa(host: &HostFs, bus: &str) -> Option<i64> {
    host.read_dec(format!("/sys/bus/pci/devices/{bus}/numa_node"))
        .ok()
        .filter(|n| *n >= 0)
}

/// The PCIe root complex of a PCI function, from the sysfs path its link resolves to
/// (`/sys/devices/pci0000:00/.../0000:07:00.0` → `pci0000:00`).
fn pcie_root(host: &HostFs, bus: &str) -> Option<String> {
    let real = host
        .canonicalize(format!("/sys/bus/pci/devices/{bus}"))
        .ok()?;
    kubedev_core::hostfs::pcie_root_of(&real)
}

fn nvlinks(dev: &Device<'_>) -> (Vec<String>, Vec<String>) {
    let mut gpus = Vec::new();
    let mut switches = Vec::new();
    // SAFETY: `handle` only copies the raw pointer out; it stays valid while `dev` (and the
    // `Nvml` it borrows) lives, which outlasts this function.
    let handle = unsafe { dev.handle() };
    let remote_type = nvml_sym(
        dev.nvml()
            .lib()
            .nvmlDeviceGetNvLinkRemoteDeviceType
            .as_ref(),
    );
    for link in 0..sys::NVML_NVLINK_MAX_LINKS {
        let l = dev.link_wrapper_for(link);
        match l.is_active() {
            Ok(true) => {}
            Ok(false) => continue,
            Err(NvmlError::NotSupported) if link == 0 => break,
            Err(_) => continue,
        }
        let Ok(remote) = l.remote_pci_info() else {
            continue;
        };
        let bus = normalize_bus_id(&remote.bus_id);
        let kind = remote_type.as_ref().ok().and_then(|sym| {
            let mut t: sys::nvmlIntNvLinkDeviceType_t =
                sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_UNKNOWN;
            // SAFETY: `handle` is a live device handle, `link` is below NVML_NVLINK_MAX_LINKS and
            // `t` is a valid place for NVML to write the device type into.
            let code = unsafe { sym(handle, link, &mut t) };
            nvml_try(code).ok().map(|()| t)
        });
        match kind {
            Some(sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_SWITCH) => {
                switches.push(bus)
            }
            Some(sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_GPU) | None => {
                gpus.push(bus)
            }
            Some(_) => {}
        }
    }
    (gpus, switches)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_failure_names_the_library() {
        let err = init(Some(Path::new("/nonexistent/libnvidia-ml.so.1"))).expect_err("no library");
        assert!(err.contains("/nonexistent/libnvidia-ml.so.1"), "{err}");
    }
}
