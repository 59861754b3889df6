//! Everything that talks to NVML, and the only module with `unsafe` code.
//!
//! nvml-wrapper's safe API covers GPU queries, NVLink state and events. MIG needs more: it has
//! no safe calls for listing, creating or destroying GPU and compute instances, its
//! `possible_placements` returns an empty list (it never sets the vector's length) and its
//! `remote_device_type` always answers `Unknown`; those go through the raw function table
//! (`Nvml::lib()`), each call checking that the symbol was found.

use std::mem;
use std::os::raw::c_uint;
use std::path::Path;
use std::ptr;

use kubedev_core::HostFs;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{Brand, TopologyLevel};
use nvml_wrapper::error::{NvmlError, nvml_sym, nvml_try};
use nvml_wrapper::{Device, EventSet, Nvml};
use nvml_wrapper_sys::bindings as sys;

use crate::NvidiaError;
use crate::health::Probe;
use crate::snapshot::{GpuInfo, MachineInfo, MigInstance, MigProfile, Placement, normalize_bus_id};

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
    let mut parts = real.components().map(|c| c.as_os_str().to_string_lossy());
    while let Some(p) = parts.next() {
        if p == "devices"
            && let Some(root) = parts.next()
            && root.starts_with("pci")
        {
            return Some(root.into_owned());
        }
    }
    None
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

/// The profile name NVML would print when the versioned profile call is missing: e.g.
/// `1g.5gb`, with the suffix of the profile variant.
fn derived_profile_name(index: u32, slices: u32, memory_mib: u64) -> String {
    let gb = memory_mib.div_ceil(1024);
    let suffix = match index {
        sys::NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1 => "+me",
        sys::NVML_GPU_INSTANCE_PROFILE_1_SLICE_GFX
        | sys::NVML_GPU_INSTANCE_PROFILE_2_SLICE_GFX
        | sys::NVML_GPU_INSTANCE_PROFILE_4_SLICE_GFX => "+gfx",
        sys::NVML_GPU_INSTANCE_PROFILE_1_SLICE_NO_ME
        | sys::NVML_GPU_INSTANCE_PROFILE_2_SLICE_NO_ME => "-me",
        sys::NVML_GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME
        | sys::NVML_GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME => "+me.all",
        _ => "",
    };
    format!("{slices}g.{gb}gb{suffix}")
}

fn c_name(raw: &[std::os::raw::c_char]) -> Option<String> {
    let bytes: Vec<u8> = raw
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    let s = String::from_utf8(bytes).ok()?;
    let s = s.trim();
    let s = s.strip_prefix("MIG ").unwrap_or(s);
    (!s.is_empty()).then(|| s.to_string())
}

/// The GPU instance profiles the GPU supports, with their placements.
fn mig_profiles(dev: &Device<'_>) -> Vec<MigProfile> {
    let lib = dev.nvml().lib();
    // SAFETY: see `nvlinks`.
    let handle = unsafe { dev.handle() };
    let mut out = Vec::new();
    for index in 0..sys::NVML_GPU_INSTANCE_PROFILE_COUNT {
        let named = nvml_sym(lib.nvmlDeviceGetGpuInstanceProfileInfoV.as_ref())
            .ok()
            .and_then(|sym| {
                // SAFETY: an all-zero struct of integers and a char array is a valid value.
                let mut info: sys::nvmlGpuInstanceProfileInfo_v2_t = unsafe { mem::zeroed() };
                info.version =
                    (mem::size_of::<sys::nvmlGpuInstanceProfileInfo_v2_t>() as c_uint) | (2 << 24);
                // SAFETY: `handle` is live and `info` is a v2 struct whose version field says so.
                let code = unsafe { sym(handle, index, &mut info) };
                nvml_try(code).ok().map(|()| info)
            });
        let profile = match named {
            Some(info) => MigProfile {
                index,
                id: info.id,
                name: c_name(&info.name).unwrap_or_else(|| {
                    derived_profile_name(index, info.sliceCount, info.memorySizeMB)
                }),
                slice_count: info.sliceCount,
                memory_mib: info.memorySizeMB,
                multiprocessors: info.multiprocessorCount,
                copy_engines: info.copyEngineCount,
                decoders: info.decoderCount,
                encoders: info.encoderCount,
                jpeg_engines: info.jpegCount,
                ofa_engines: info.ofaCount,
                placements: Vec::new(),
            },
            None => {
                let Ok(sym) = nvml_sym(lib.nvmlDeviceGetGpuInstanceProfileInfo.as_ref()) else {
                    break;
                };
                // SAFETY: an all-zero struct of integers is a valid value.
                let mut info: sys::nvmlGpuInstanceProfileInfo_t = unsafe { mem::zeroed() };
                // SAFETY: `handle` is live and `info` is a valid out-pointer.
                let code = unsafe { sym(handle, index, &mut info) };
                if nvml_try(code).is_err() {
                    continue;
                }
                MigProfile {
                    index,
                    id: info.id,
                    name: derived_profile_name(index, info.sliceCount, info.memorySizeMB),
                    slice_count: info.sliceCount,
                    memory_mib: info.memorySizeMB,
                    multiprocessors: info.multiprocessorCount,
                    copy_engines: info.copyEngineCount,
                    decoders: info.decoderCount,
                    encoders: info.encoderCount,
                    jpeg_engines: info.jpegCount,
                    ofa_engines: info.ofaCount,
                    placements: Vec::new(),
                }
            }
        };
        let placements = match placements(dev, handle, profile.id) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(profile = %profile.name, error = %e, "cannot list MIG placements; profile skipped");
                continue;
            }
        };
        out.push(MigProfile {
            placements,
            ..profile
        });
    }
    out
}

fn placements(
    dev: &Device<'_>,
    handle: sys::nvmlDevice_t,
    profile_id: u32,
) -> Result<Vec<Placement>, NvmlError> {
    let sym = nvml_sym(
        dev.nvml()
            .lib()
            .nvmlDeviceGetGpuInstancePossiblePlacements_v2
            .as_ref(),
    )?;
    let mut count: c_uint = 0;
    // SAFETY: a null buffer asks for the count only; `count` is a valid out-pointer.
    nvml_try(unsafe { sym(handle, profile_id, ptr::null_mut(), &mut count) })?;
    let mut buf = vec![sys::nvmlGpuInstancePlacement_t { start: 0, size: 0 }; count as usize];
    // SAFETY: `buf` holds `count` placements and `count` says so.
    nvml_try(unsafe { sym(handle, profile_id, buf.as_mut_ptr(), &mut count) })?;
    buf.truncate(count as usize);
    Ok(buf
        .into_iter()
        .map(|p| Placement {
            start: p.start,
            size: p.size,
        })
        .collect())
}

/// One GPU instance as NVML lists it.
struct Gi {
    handle: sys::nvmlGpuInstance_t,
    id: u32,
    profile_id: u32,
    placement: Placement,
}

/// Every GPU instance of the GPU (all profiles).
fn gpu_instances(dev: &Device<'_>, profiles: &[MigProfile]) -> Result<Vec<Gi>, NvmlError> {
    let lib = dev.nvml().lib();
    let list = nvml_sym(lib.nvmlDeviceGetGpuInstances.as_ref())?;
    let info_of = nvml_sym(lib.nvmlGpuInstanceGetInfo.as_ref())?;
    // SAFETY: see `nvlinks`.
    let handle = unsafe { dev.handle() };
    let mut out = Vec::new();
    for p in profiles {
        // The buffer must hold as many instances as the profile allows.
        let cap = p.placements.len().max(8);
        let mut buf: Vec<sys::nvmlGpuInstance_t> = vec![ptr::null_mut(); cap];
        let mut count = cap as c_uint;
        // SAFETY: `buf` holds `cap` handles and `count` says so.
        let code = unsafe { list(handle, p.id, buf.as_mut_ptr(), &mut count) };
        match nvml_try(code) {
            Ok(()) => {}
            Err(NvmlError::NotFound | NvmlError::NotSupported) => continue,
            Err(e) => return Err(e),
        }
        for &gi in buf.iter().take(count as usize) {
            // SAFETY: an all-zero struct of integers and pointers is a valid value.
            let mut info: sys::nvmlGpuInstanceInfo_t = unsafe { mem::zeroed() };
            // SAFETY: `gi` is a handle NVML just returned; `info` is a valid out-pointer.
            nvml_try(unsafe { info_of(gi, &mut info) })?;
            out.push(Gi {
                handle: gi,
                id: info.id,
                profile_id: info.profileId,
                placement: Placement {
                    start: info.placement.start,
                    size: info.placement.size,
                },
            });
        }
    }
    Ok(out)
}

/// One compute instance as NVML lists it.
struct Ci {
    handle: sys::nvmlComputeInstance_t,
    id: u32,
    slices: u32,
}

/// Every compute instance of a GPU instance.
fn compute_instances(dev: &Device<'_>, gi: sys::nvmlGpuInstance_t) -> Result<Vec<Ci>, NvmlError> {
    let lib = dev.nvml().lib();
    let profile_info = nvml_sym(lib.nvmlGpuInstanceGetComputeInstanceProfileInfo.as_ref())?;
    let list = nvml_sym(lib.nvmlGpuInstanceGetComputeInstances.as_ref())?;
    let info_of = nvml_sym(lib.nvmlComputeInstanceGetInfo_v2.as_ref())?;
    let mut out = Vec::new();
    for ci_index in 0..sys::NVML_COMPUTE_INSTANCE_PROFILE_COUNT {
        // SAFETY: an all-zero struct of integers is a valid value.
        let mut pinfo: sys::nvmlComputeInstanceProfileInfo_t = unsafe { mem::zeroed() };
        // SAFETY: `gi` is a live GPU instance handle; `pinfo` is a valid out-pointer.
        let code = unsafe {
            profile_info(
                gi,
                ci_index,
                sys::NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                &mut pinfo,
            )
        };
        if nvml_try(code).is_err() {
            continue;
        }
        let cap = (pinfo.instanceCount as usize).max(1);
        let mut buf: Vec<sys::nvmlComputeInstance_t> = vec![ptr::null_mut(); cap];
        let mut count = cap as c_uint;
        // SAFETY: `buf` holds `cap` handles and `count` says so.
        let code = unsafe { list(gi, pinfo.id, buf.as_mut_ptr(), &mut count) };
        match nvml_try(code) {
            Ok(()) => {}
            Err(NvmlError::NotFound | NvmlError::NotSupported) => continue,
            Err(e) => return Err(e),
        }
        for &ci in buf.iter().take(count as usize) {
            // SAFETY: an all-zero struct of integers and pointers is a valid value.
            let mut info: sys::nvmlComputeInstanceInfo_t = unsafe { mem::zeroed() };
            // SAFETY: `ci` is a handle NVML just returned; `info` is a valid out-pointer.
            nvml_try(unsafe { info_of(ci, &mut info) })?;
            out.push(Ci {
                handle: ci,
                id: info.id,
                slices: pinfo.sliceCount,
            });
        }
    }
    Ok(out)
}

/// (GI id, CI id) → MIG device UUID, for every MIG device of the GPU.
fn mig_uuids(dev: &Device<'_>) -> Vec<((u32, u32), String)> {
    let lib = dev.nvml().lib();
    let (Ok(gi_of), Ok(ci_of)) = (
        nvml_sym(lib.nvmlDeviceGetGpuInstanceId.as_ref()),
        nvml_sym(lib.nvmlDeviceGetComputeInstanceId.as_ref()),
    ) else {
        return Vec::new();
    };
    let max = dev.mig_device_count().unwrap_or(0);
    let mut out = Vec::new();
    for i in 0..max {
        let Ok(m) = dev.mig_device_by_index(i) else {
            continue;
        };
        // SAFETY: see `nvlinks`; `m` lives until the end of this iteration.
        let h = unsafe { m.handle() };
        let (mut gi, mut ci): (c_uint, c_uint) = (0, 0);
        // SAFETY: `h` is a live MIG device handle and `gi`/`ci` are valid out-pointers.
        let ok =
            unsafe { nvml_try(gi_of(h, &mut gi)).is_ok() && nvml_try(ci_of(h, &mut ci)).is_ok() };
        if let (true, Ok(uuid)) = (ok, m.uuid()) {
            out.push(((gi, ci), uuid));
        }
    }
    out
}

/// Every existing MIG device (compute instance) of the GPU.
fn mig_instances(dev: &Device<'_>, profiles: &[MigProfile]) -> Result<Vec<MigInstance>, NvmlError> {
    let uuids = mig_uuids(dev);
    let mut out = Vec::new();
    for gi in gpu_instances(dev, profiles)? {
        for ci in compute_instances(dev, gi.handle)? {
            let uuid = uuids
                .iter()
                .find(|(k, _)| *k == (gi.id, ci.id))
                .map(|(_, u)| u.clone());
            out.push(MigInstance {
                gi_id: gi.id,
                ci_id: ci.id,
                profile_id: gi.profile_id,
                placement: gi.placement,
                ci_slice_count: ci.slices,
                uuid,
            });
        }
    }
    out.sort_by_key(|i| (i.placement, i.ci_id));
    Ok(out)
}

/// What exists at one placement of one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FoundInstance {
    pub(crate) gi_id: u32,
    /// Compute instances (id).
    pub(crate) ci_ids: Vec<u32>,
    /// The UUID of the first compute instance's MIG device.
    pub(crate) mig_uuid: Option<String>,
}

fn device_by_uuid<'n>(nvml: &'n Nvml, uuid: &str) -> Result<Device<'n>, NvidiaError> {
    nvml.device_by_uuid(uuid)
        .map_err(|e| nvml_err("nvmlDeviceGetHandleByUUID", uuid, &e))
}

fn all_profiles(dev: &Device<'_>) -> Vec<MigProfile> {
    mig_profiles(dev)
}

/// The GPU instance at `placement` (with profile `profile_id`) on GPU `gpu_uuid`, if any.
pub(crate) fn find_instance(
    nvml: &Nvml,
    gpu_uuid: &str,
    profile_id: u32,
    placement: Placement,
) -> Result<Option<FoundInstance>, NvidiaError> {
    let dev = device_by_uuid(nvml, gpu_uuid)?;
    let target = format!(
        "{gpu_uuid} placement {}+{}",
        placement.start, placement.size
    );
    let profiles = all_profiles(&dev);
    let gis = gpu_instances(&dev, &profiles)
        .map_err(|e| nvml_err("nvmlDeviceGetGpuInstances", &target, &e))?;
    let Some(gi) = gis
        .into_iter()
        .find(|g| g.placement == placement && g.profile_id == profile_id)
    else {
        return Ok(None);
    };
    let cis = compute_instances(&dev, gi.handle)
        .map_err(|e| nvml_err("nvmlGpuInstanceGetComputeInstances", &target, &e))?;
    let ci_ids: Vec<u32> = cis.iter().map(|c| c.id).collect();
    let mig_uuid = ci_ids.first().and_then(|&ci| {
        mig_uuids(&dev)
            .into_iter()
            .find(|(k, _)| *k == (gi.id, ci))
            .map(|(_, u)| u)
    });
    Ok(Some(FoundInstance {
        gi_id: gi.id,
        ci_ids,
        mig_uuid,
    }))
}

/// Creates a GPU instance of profile `profile_index` at `placement` and one compute instance
/// spanning it; a compute-instance failure destroys the new GPU instance again.
pub(crate) fn create_instance(
    nvml: &Nvml,
    gpu_uuid: &str,
    profile_index: u32,
    placement: Placement,
) -> Result<FoundInstance, NvidiaError> {
    let dev = device_by_uuid(nvml, gpu_uuid)?;
    let target = format!(
        "{gpu_uuid} placement {}+{}",
        placement.start, placement.size
    );
    let lib = nvml.lib();
    let sym_err = |call: &'static str, e: NvmlError| nvml_err(call, &target, &e);
    let profile = all_profiles(&dev)
        .into_iter()
        .find(|p| p.index == profile_index)
        .ok_or_else(|| NvidiaError::Nvml {
            call: "nvmlDeviceGetGpuInstanceProfileInfo",
            target: target.clone(),
            message: format!("the GPU has no MIG profile with index {profile_index}"),
            gpu_lost: false,
        })?;
    let create_gi = nvml_sym(lib.nvmlDeviceCreateGpuInstanceWithPlacement.as_ref())
        .map_err(|e| sym_err("nvmlDeviceCreateGpuInstanceWithPlacement", e))?;
    let destroy_gi = nvml_sym(lib.nvmlGpuInstanceDestroy.as_ref())
        .map_err(|e| sym_err("nvmlGpuInstanceDestroy", e))?;
    let ci_profile_info = nvml_sym(lib.nvmlGpuInstanceGetComputeInstanceProfileInfo.as_ref())
        .map_err(|e| sym_err("nvmlGpuInstanceGetComputeInstanceProfileInfo", e))?;
    let create_ci = nvml_sym(lib.nvmlGpuInstanceCreateComputeInstance.as_ref())
        .map_err(|e| sym_err("nvmlGpuInstanceCreateComputeInstance", e))?;
    let gi_info = nvml_sym(lib.nvmlGpuInstanceGetInfo.as_ref())
        .map_err(|e| sym_err("nvmlGpuInstanceGetInfo", e))?;
    let ci_info = nvml_sym(lib.nvmlComputeInstanceGetInfo_v2.as_ref())
        .map_err(|e| sym_err("nvmlComputeInstanceGetInfo_v2", e))?;
    // SAFETY: see `nvlinks`.
    let handle = unsafe { dev.handle() };
    let raw_placement = sys::nvmlGpuInstancePlacement_t {
        start: placement.start,
        size: placement.size,
    };
    let mut gi: sys::nvmlGpuInstance_t = ptr::null_mut();
    // SAFETY: `handle` is live; `raw_placement` and `gi` are valid pointers for the call.
    nvml_try(unsafe { create_gi(handle, profile.id, &raw_placement, &mut gi) })
        .map_err(|e| sym_err("nvmlDeviceCreateGpuInstanceWithPlacement", e))?;
    // The compute instance profile with as many slices as the GPU instance: the whole of it.
    let mut ci_profile = None;
    for ci_index in 0..sys::NVML_COMPUTE_INSTANCE_PROFILE_COUNT {
        // SAFETY: an all-zero struct of integers is a valid value.
        let mut info: sys::nvmlComputeInstanceProfileInfo_t = unsafe { mem::zeroed() };
        // SAFETY: `gi` was just created and is live; `info` is a valid out-pointer.
        let code = unsafe {
            ci_profile_info(
                gi,
                ci_index,
                sys::NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                &mut info,
            )
        };
        if nvml_try(code).is_ok() && info.sliceCount == profile.slice_count {
            ci_profile = Some(info.id);
            break;
        }
    }
    let rollback = |why: NvidiaError| {
        // SAFETY: `gi` is live and has no compute instance (its creation failed).
        if let Err(e) = nvml_try(unsafe { destroy_gi(gi) }) {
            tracing::warn!(target = %target, error = %e, "destroying the GPU instance after a failed compute instance");
        }
        why
    };
    let Some(ci_profile) = ci_profile else {
        return Err(rollback(NvidiaError::Nvml {
            call: "nvmlGpuInstanceGetComputeInstanceProfileInfo",
            target: target.clone(),
            message: format!(
                "no compute instance profile spans the {} slices of profile {}",
                profile.slice_count, profile.name
            ),
            gpu_lost: false,
        }));
    };
    let mut ci: sys::nvmlComputeInstance_t = ptr::null_mut();
    // SAFETY: `gi` is live and `ci` is a valid out-pointer.
    if let Err(e) = nvml_try(unsafe { create_ci(gi, ci_profile, &mut ci) }) {
        return Err(rollback(sym_err("nvmlGpuInstanceCreateComputeInstance", e)));
    }
    // SAFETY: all-zero structs of integers and pointers are valid values.
    let (mut gi_i, mut ci_i): (sys::nvmlGpuInstanceInfo_t, sys::nvmlComputeInstanceInfo_t) =
        unsafe { (mem::zeroed(), mem::zeroed()) };
    // SAFETY: `gi` and `ci` are live; the infos are valid out-pointers.
    nvml_try(unsafe { gi_info(gi, &mut gi_i) })
        .map_err(|e| sym_err("nvmlGpuInstanceGetInfo", e))?;
    // SAFETY: as above.
    nvml_try(unsafe { ci_info(ci, &mut ci_i) })
        .map_err(|e| sym_err("nvmlComputeInstanceGetInfo_v2", e))?;
    let mig_uuid = mig_uuids(&dev)
        .into_iter()
        .find(|(k, _)| *k == (gi_i.id, ci_i.id))
        .map(|(_, u)| u);
    Ok(FoundInstance {
        gi_id: gi_i.id,
        ci_ids: vec![ci_i.id],
        mig_uuid,
    })
}

/// Destroys every compute instance of the GPU instance at `placement`, then the GPU instance.
/// Nothing there is success.
pub(crate) fn destroy_instance(
    nvml: &Nvml,
    gpu_uuid: &str,
    profile_id: u32,
    placement: Placement,
) -> Result<(), NvidiaError> {
    let dev = device_by_uuid(nvml, gpu_uuid)?;
    let target = format!(
        "{gpu_uuid} placement {}+{}",
        placement.start, placement.size
    );
    let lib = nvml.lib();
    let sym_err = |call: &'static str, e: NvmlError| nvml_err(call, &target, &e);
    let destroy_ci = nvml_sym(lib.nvmlComputeInstanceDestroy.as_ref())
        .map_err(|e| sym_err("nvmlComputeInstanceDestroy", e))?;
    let destroy_gi = nvml_sym(lib.nvmlGpuInstanceDestroy.as_ref())
        .map_err(|e| sym_err("nvmlGpuInstanceDestroy", e))?;
    let profiles = all_profiles(&dev);
    let gis =
        gpu_instances(&dev, &profiles).map_err(|e| sym_err("nvmlDeviceGetGpuInstances", e))?;
    let Some(gi) = gis
        .into_iter()
        .find(|g| g.placement == placement && g.profile_id == profile_id)
    else {
        return Ok(());
    };
    for ci in compute_instances(&dev, gi.handle)
        .map_err(|e| sym_err("nvmlGpuInstanceGetComputeInstances", e))?
    {
        // SAFETY: `ci.handle` was just listed by NVML and is live.
        match nvml_try(unsafe { destroy_ci(ci.handle) }) {
            Ok(()) | Err(NvmlError::NotFound) => {}
            Err(e) => return Err(sym_err("nvmlComputeInstanceDestroy", e)),
        }
    }
    // SAFETY: `gi.handle` was just listed by NVML and has no compute instances left.
    match nvml_try(unsafe { destroy_gi(gi.handle) }) {
        Ok(()) | Err(NvmlError::NotFound) => Ok(()),
        Err(e) => Err(sym_err("nvmlGpuInstanceDestroy", e)),
    }
}

/// Asks the GPU something cheap, to tell whether it answers.
pub(crate) fn probe(nvml: &Nvml, uuid: &str) -> Probe {
    let dev = match nvml.device_by_uuid(uuid) {
        Ok(d) => d,
        Err(NvmlError::GpuLost) => return Probe::Lost("NVML reports the GPU is lost".into()),
        Err(e) => return Probe::Failed(e.to_string()),
    };
    match dev.memory_info() {
        Ok(_) => Probe::Answers,
        Err(NvmlError::GpuLost) => {
            Probe::Lost("NVML reports the GPU has fallen off the bus".into())
        }
        Err(e) => Probe::Failed(e.to_string()),
    }
}

/// What one wait on the Xid event set gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Wait {
    /// An Xid on the GPU with this UUID, scoped to a GPU instance when NVML says so (`None`
    /// xid: NVML did not give the code).
    Xid {
        gpu_uuid: String,
        gi: Option<u32>,
        xid: Option<u64>,
    },
    /// Some GPU is lost: probe them all.
    Lost,
    /// Nothing within the timeout.
    Timeout,
    /// The wait failed otherwise.
    Failed(String),
}

/// An event set with Xid critical errors registered for every GPU that supports them.
pub(crate) struct XidEvents<'n> {
    set: EventSet<'n>,
    /// (raw handle address, UUID) of each registered GPU, to name the GPU of an event even when
    /// it no longer answers.
    gpus: Vec<(usize, String)>,
}

impl std::fmt::Debug for XidEvents<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XidEvents")
            .field("gpus", &self.gpus)
            .finish()
    }
}

impl<'n> XidEvents<'n> {
    /// Registers every GPU in `uuids` that supports Xid events; those that do not are logged.
    pub(crate) fn open(nvml: &'n Nvml, uuids: &[String]) -> Result<Self, NvidiaError> {
        let mut set = nvml
            .create_event_set()
            .map_err(|e| nvml_err("nvmlEventSetCreate", "the system", &e))?;
        let mut gpus = Vec::new();
        for uuid in uuids {
            let dev = match nvml.device_by_uuid(uuid.as_str()) {
                Ok(d) => d,
                Err(e) => {
                    tracing::warn!(gpu = %uuid, error = %e, "GPU not watched for Xid errors");
                    continue;
                }
            };
            match dev.supported_event_types() {
                Ok(t) if t.contains(EventTypes::CRITICAL_XID_ERROR) => {}
                other => {
                    tracing::warn!(gpu = %uuid, supported = ?other.ok(), "GPU does not report Xid errors; not watched");
                    continue;
                }
            }
            // SAFETY: see `nvlinks`; only the address is kept, as an identity.
            let addr = unsafe { dev.handle() } as usize;
            match dev.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
                Ok(s) => {
                    set = s;
                    gpus.push((addr, uuid.clone()));
                }
                Err(e) => {
                    // A failed registration frees the set: start a new one with the GPUs
                    // registered so far.
                    tracing::warn!(gpu = %uuid, error = %e.error, "registering Xid events failed; GPU not watched");
                    set = nvml
                        .create_event_set()
                        .map_err(|e| nvml_err("nvmlEventSetCreate", "the system", &e))?;
                    let kept = std::mem::take(&mut gpus);
                    for (a, u) in kept {
                        let Ok(d) = nvml.device_by_uuid(u.as_str()) else {
                            continue;
                        };
                        match d.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
                            Ok(s) => {
                                set = s;
                                gpus.push((a, u));
                            }
                            Err(e) => {
                                return Err(nvml_err("nvmlDeviceRegisterEvents", u, &e.error));
                            }
                        }
                    }
                }
            }
        }
        Ok(XidEvents { set, gpus })
    }

    /// The GPUs registered.
    pub(crate) fn watched(&self) -> impl Iterator<Item = &str> {
        self.gpus.iter().map(|(_, u)| u.as_str())
    }

    /// Waits up to `timeout_ms` for one event.
    ///
    /// The wait is called raw: nvml-wrapper's `EventData` drops the GPU and compute instance ids
    /// that scope an Xid to one MIG device.
    pub(crate) fn wait(&self, nvml: &Nvml, timeout_ms: u32) -> Wait {
        let sym = match nvml_sym(nvml.lib().nvmlEventSetWait_v2.as_ref()) {
            Ok(s) => s,
            Err(e) => return Wait::Failed(e.to_string()),
        };
        // SAFETY: an all-zero struct of integers and a pointer is a valid value.
        let mut data: sys::nvmlEventData_t = unsafe { mem::zeroed() };
        // SAFETY: the set is live (owned by `self`) and `data` is a valid out-pointer; the
        // handle is only used for this call, never freed here.
        let code = unsafe { sym(self.set.handle(), &mut data, timeout_ms) };
        match nvml_try(code) {
            Ok(()) => {}
            Err(NvmlError::Timeout) => return Wait::Timeout,
            Err(NvmlError::GpuLost) => return Wait::Lost,
            Err(e) => return Wait::Failed(e.to_string()),
        }
        if data.eventType & u64::from(sys::nvmlEventTypeXidCriticalError) == 0 {
            return Wait::Timeout;
        }
        let addr = data.device as usize;
        let Some(gpu_uuid) = self
            .gpus
            .iter()
            .find(|(a, _)| *a == addr)
            .map(|(_, u)| u.clone())
        else {
            return Wait::Failed("an Xid event for a GPU that is not watched".into());
        };
        let xid = (data.eventData != 999).then_some(data.eventData);
        let gi = (data.gpuInstanceId != u32::MAX).then_some(data.gpuInstanceId);
        Wait::Xid { gpu_uuid, gi, xid }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_names_follow_nvidia_smi() {
        assert_eq!(derived_profile_name(0, 1, 4864), "1g.5gb");
        assert_eq!(derived_profile_name(4, 7, 40192), "7g.40gb");
        assert_eq!(
            derived_profile_name(sys::NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1, 1, 4864),
            "1g.5gb+me"
        );
        assert_eq!(derived_profile_name(0, 1, 9984), "1g.10gb");
    }

    #[test]
    fn c_names_drop_the_mig_prefix() {
        let mut raw = [0 as std::os::raw::c_char; 96];
        for (i, b) in b"MIG 1g.10gb".iter().enumerate() {
            raw[i] = *b as std::os::raw::c_char;
        }
        assert_eq!(c_name(&raw).as_deref(), Some("1g.10gb"));
        assert_eq!(c_name(&[0; 4]), None);
    }

    #[test]
    fn init_failure_names_the_library() {
        let err = init(Some(Path::new("/nonexistent/libnvidia-ml.so.1"))).expect_err("no library");
        assert!(err.contains("/nonexistent/libnvidia-ml.so.1"), "{err}");
    }
}
