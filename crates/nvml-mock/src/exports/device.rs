//! Device properties of whole GPUs and MIG devices: identity (UUID, name, index, minor, brand,
//! architecture, compute capability), memory, PCI information, NUMA and CPU affinity, attributes.

use std::ffi::{c_char, c_int, c_uint, c_ulong};

use nvml_wrapper_sys::bindings as sys;

use super::{
    MIB, Ret, Target, gpu_only, guard, mig_profile_name, pci_info, put, put_str, target, with,
};
use crate::codes::*;
use crate::machine::Gpu;
use crate::state::{Mock, Nv};

/// # Safety
/// `uuid` must be valid for `length` bytes when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetUUID(
    device: sys::nvmlDevice_t,
    uuid: *mut c_char,
    length: c_uint,
) -> Ret {
    guard(|| {
        let text = with(|m| match target(m, device)? {
            Target::Gpu(_, gpu) => Ok(gpu.uuid.clone()),
            Target::Mig { gpu, gi, ci, .. } => Ok(m.ci(gpu, gi, ci)?.uuid.clone()),
        })?;
        // SAFETY: buffer contract forwarded from the caller.
        unsafe { put_str(uuid, length, &text) }
    })
}

/// # Safety
/// `name` must be valid for `length` bytes when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetName(
    device: sys::nvmlDevice_t,
    name: *mut c_char,
    length: c_uint,
) -> Ret {
    guard(|| {
        let text = with(|m| match target(m, device)? {
            Target::Gpu(_, gpu) => Ok(gpu.name.clone()),
            Target::Mig {
                gpu,
                parent,
                gi,
                ci,
            } => {
                let (profile, _) = mig_profile_name(m, gpu, gi, ci)?;
                Ok(format!("{} MIG {profile}", parent.name))
            }
        })?;
        // SAFETY: buffer contract forwarded from the caller.
        unsafe { put_str(name, length, &text) }
    })
}

/// Index of a whole GPU; answers even when the GPU is lost.
///
/// # Safety
/// `index` must be valid for a write when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetIndex(device: sys::nvmlDevice_t, index: *mut c_uint) -> Ret {
    guard(|| {
        let g = with(|m| m.whole_gpu(device as usize, ERROR_NOT_SUPPORTED))?;
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(index, g) }
    })
}

/// # Safety
/// `minor` must be valid for a write when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetMinorNumber(
    device: sys::nvmlDevice_t,
    minor: *mut c_uint,
) -> Ret {
    guard(|| {
        let v = with(|m| Ok(gpu_only(m, device)?.1.minor))?;
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(minor, v) }
    })
}

fn parent_of<'a>(t: &Target<'a>) -> &'a Gpu {
    match t {
        Target::Gpu(_, gpu) => gpu,
        Target::Mig { parent, .. } => parent,
    }
}

/// # Safety
/// `brand` must be valid for a write when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetBrand(
    device: sys::nvmlDevice_t,
    brand: *mut sys::nvmlBrandType_t,
) -> Ret {
    guard(|| {
        let v = with(|m| Ok(parent_of(&target(m, device)?).brand.nvml_value()))?;
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(brand, v) }
    })
}

/// # Safety
/// `arch` must be valid for a write when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetArchitecture(
    device: sys::nvmlDevice_t,
    arch: *mut sys::nvmlDeviceArchitecture_t,
) -> Ret {
    guard(|| {
        let v = with(|m| Ok(parent_of(&target(m, device)?).architecture.nvml_value()))?;
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(arch, v) }
    })
}

/// # Safety
/// `major` and `minor` must be valid for writes when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    device: sys::nvmlDevice_t,
    major: *mut c_int,
    minor: *mut c_int,
) -> Ret {
    guard(|| {
        let (a, b) = with(|m| {
            let cc = &parent_of(&target(m, device)?).compute_capability;
            crate::machine::parse_compute_capability(cc).ok_or(ERROR_UNKNOWN)
        })?;
        if minor.is_null() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(major, a) }?;
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(minor, b) }
    })
}

/// (total, reserved, used) in bytes.
fn memory(m: &Mock, device: sys::nvmlDevice_t) -> Nv<(u64, u64, u64)> {
    match target(m, device)? {
        Target::Gpu(_, gpu) => Ok((
            gpu.memory_mib * MIB,
            gpu.memory_reserved_mib * MIB,
            gpu.memory_used_mib * MIB,
        )),
        Target::Mig { gpu, gi, ci, .. } => {
            let (_, mib) = mig_profile_name(m, gpu, gi, ci)?;
            Ok((mib * MIB, 0, 0))
        }
    }
}

/// # Safety
/// `out` must be valid for a write when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: sys::nvmlDevice_t,
    out: *mut sys::nvmlMemory_t,
) -> Ret {
    guard(|| {
        let (total, reserved, used) = with(|m| memory(m, device))?;
        let info = sys::nvmlMemory_t {
            total,
            free: total - reserved - used,
            used: reserved + used,
        };
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(out, info) }
    })
}

/// # Safety
/// `out` must be valid for reads and writes of `nvmlMemory_v2_t` when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: sys::nvmlDevice_t,
    out: *mut sys::nvmlMemory_v2_t,
) -> Ret {
    guard(|| {
        if out.is_null() || !out.is_aligned() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: non-null and aligned; the caller's struct is readable by contract.
        let version = unsafe { (*out).version };
        if version >> 24 != 2 {
            return Err(ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        let (total, reserved, used) = with(|m| memory(m, device))?;
        let info = sys::nvmlMemory_v2_t {
            version,
            total,
            reserved,
            free: total - reserved - used,
            used,
        };
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(out, info) }
    })
}

/// # Safety
/// `pci` must be valid for a write when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    device: sys::nvmlDevice_t,
    pci: *mut sys::nvmlPciInfo_t,
) -> Ret {
    guard(|| {
        let info = with(|m| {
            let (_, gpu) = gpu_only(m, device)?;
            Ok(pci_info(
                &gpu.pci.bus_id,
                gpu.pci.device_id,
                gpu.pci.subsystem_id,
            ))
        })?;
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(pci, info) }
    })
}

/// # Safety
/// `pci` must be valid for a write when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetPciInfo_v2(
    device: sys::nvmlDevice_t,
    pci: *mut sys::nvmlPciInfo_t,
) -> Ret {
    // SAFETY: same contract.
    unsafe { nvmlDeviceGetPciInfo_v3(device, pci) }
}

/// # Safety
/// `node` must be valid for a write when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetNumaNodeId(device: sys::nvmlDevice_t, node: *mut c_uint) -> Ret {
    guard(|| {
        let v = with(|m| gpu_only(m, device)?.1.numa_node.ok_or(ERROR_NOT_SUPPORTED))?;
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(node, v) }
    })
}

/// Writes a bitmask of `bits` into `size` words, dropping bits beyond them.
///
/// # Safety
/// A non-null `set` must be valid for writes of `size` words.
unsafe fn put_mask(set: *mut c_ulong, size: c_uint, bits: &[u32]) -> Nv<()> {
    if set.is_null() || !set.is_aligned() || size == 0 {
        return Err(ERROR_INVALID_ARGUMENT);
    }
    let word_bits = c_ulong::BITS;
    let mut words = vec![0 as c_ulong; size as usize];
    for &b in bits {
        if let Some(w) = words.get_mut((b / word_bits) as usize) {
            *w |= 1 << (b % word_bits);
        }
    }
    // SAFETY: the array holds `size` words by the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(words.as_ptr(), set, words.len()) };
    Ok(())
}

/// # Safety
/// `node_set` must be valid for writes of `size` words when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetMemoryAffinity(
    device: sys::nvmlDevice_t,
    size: c_uint,
    node_set: *mut c_ulong,
    scope: sys::nvmlAffinityScope_t,
) -> Ret {
    guard(|| {
        let node = with(|m| gpu_only(m, device)?.1.numa_node.ok_or(ERROR_NOT_SUPPORTED))?;
        if scope > sys::NVML_AFFINITY_SCOPE_SOCKET {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: array contract forwarded from the caller.
        unsafe { put_mask(node_set, size, &[node]) }
    })
}

fn cpus_of(m: &Mock, device: sys::nvmlDevice_t) -> Nv<Vec<u32>> {
    let node = gpu_only(m, device)?
        .1
        .numa_node
        .ok_or(ERROR_NOT_SUPPORTED)?;
    m.numa_cpus(node).ok_or(ERROR_NOT_SUPPORTED)
}

/// # Safety
/// `cpu_set` must be valid for writes of `size` words when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetCpuAffinityWithinScope(
    device: sys::nvmlDevice_t,
    size: c_uint,
    cpu_set: *mut c_ulong,
    scope: sys::nvmlAffinityScope_t,
) -> Ret {
    guard(|| {
        let cpus = with(|m| cpus_of(m, device))?;
        if scope > sys::NVML_AFFINITY_SCOPE_SOCKET {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: array contract forwarded from the caller.
        unsafe { put_mask(cpu_set, size, &cpus) }
    })
}

/// # Safety
/// `cpu_set` must be valid for writes of `size` words when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetCpuAffinity(
    device: sys::nvmlDevice_t,
    size: c_uint,
    cpu_set: *mut c_ulong,
) -> Ret {
    guard(|| {
        let cpus = with(|m| cpus_of(m, device))?;
        // SAFETY: array contract forwarded from the caller.
        unsafe { put_mask(cpu_set, size, &cpus) }
    })
}

/// # Safety
/// `out` must be valid for a write when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetAttributes_v2(
    device: sys::nvmlDevice_t,
    out: *mut sys::nvmlDeviceAttributes_t,
) -> Ret {
    guard(|| {
        let attrs = with(|m| match target(m, device)? {
            Target::Gpu(g, gpu) => {
                let full = m.gpus[g as usize].mig.as_ref().and_then(|mig| {
                    mig.table
                        .gpu_instance_profiles
                        .iter()
                        .find(|p| p.slice_count == mig.table.compute_slices)
                });
                Ok(sys::nvmlDeviceAttributes_t {
                    multiprocessorCount: full.map_or(0, |p| p.multiprocessor_count),
                    sharedCopyEngineCount: full.map_or(0, |p| p.copy_engine_count),
                    sharedDecoderCount: full.map_or(0, |p| p.decoder_count),
                    sharedEncoderCount: full.map_or(0, |p| p.encoder_count),
                    sharedJpegCount: full.map_or(0, |p| p.jpeg_count),
                    sharedOfaCount: full.map_or(0, |p| p.ofa_count),
                    gpuInstanceSliceCount: full.map_or(0, |p| p.slice_count),
                    computeInstanceSliceCount: full.map_or(0, |p| p.slice_count),
                    memorySizeMB: gpu.memory_mib,
                })
            }
            Target::Mig { gpu, gi, ci, .. } => {
                let mig = m.mig(gpu)?;
                let g = mig.gis.get(&gi).ok_or(ERROR_INVALID_ARGUMENT)?;
                let c = g.cis.get(&ci).ok_or(ERROR_INVALID_ARGUMENT)?;
                let p = &mig.table.gpu_instance_profiles[g.profile];
                Ok(sys::nvmlDeviceAttributes_t {
                    multiprocessorCount: p.multiprocessor_count * c.slices / p.slice_count,
                    sharedCopyEngineCount: p.copy_engine_count,
                    sharedDecoderCount: p.decoder_count,
                    sharedEncoderCount: p.encoder_count,
                    sharedJpegCount: p.jpeg_count,
                    sharedOfaCount: p.ofa_count,
                    gpuInstanceSliceCount: p.slice_count,
                    computeInstanceSliceCount: c.slices,
                    memorySizeMB: p.memory_mib,
                })
            }
        })?;
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(out, attrs) }
    })
}
