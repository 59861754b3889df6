//! GPU instances: profiles, placements, creation, lookup and destruction.

use std::ffi::{c_char, c_uint};

use nvml_wrapper_sys::bindings as sys;

use super::{Ret, device_ptr, fill_c_chars, gpu_only, guard, put, put_list, put_sized_list, with};
use crate::codes::*;
use crate::state::{Handle, Mock, Nv};

fn gi_profile_by_enum(
    m: &Mock,
    device: sys::nvmlDevice_t,
    profile: c_uint,
) -> Nv<crate::machine::GpuInstanceProfile> {
    let (g, _) = gpu_only(m, device)?;
    let mig = m.mig(g)?;
    if profile >= sys::NVML_GPU_INSTANCE_PROFILE_COUNT {
        return Err(ERROR_INVALID_ARGUMENT);
    }
    mig.table
        .gpu_instance_profiles
        .iter()
        .find(|p| p.profile == profile)
        .cloned()
        .ok_or(ERROR_NOT_SUPPORTED)
}

/// # Safety
/// `info` must be valid for a write when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfo(
    device: sys::nvmlDevice_t,
    profile: c_uint,
    info: *mut sys::nvmlGpuInstanceProfileInfo_t,
) -> Ret {
    guard(|| {
        let p = with(|m| gi_profile_by_enum(m, device, profile))?;
        let v = sys::nvmlGpuInstanceProfileInfo_t {
            id: p.id,
            isP2pSupported: c_uint::from(p.p2p),
            sliceCount: p.slice_count,
            instanceCount: p.instance_count,
            multiprocessorCount: p.multiprocessor_count,
            copyEngineCount: p.copy_engine_count,
            decoderCount: p.decoder_count,
            encoderCount: p.encoder_count,
            jpegCount: p.jpeg_count,
            ofaCount: p.ofa_count,
            memorySizeMB: p.memory_mib,
        };
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(info, v) }
    })
}

/// Accepts `nvmlGpuInstanceProfileInfo_v2_t` and `_v3_t`, told apart by their version field.
///
/// # Safety
/// `info` must point to a struct of the version its first field names, when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfoV(
    device: sys::nvmlDevice_t,
    profile: c_uint,
    info: *mut sys::nvmlGpuInstanceProfileInfo_v2_t,
) -> Ret {
    guard(|| {
        if info.is_null() || !info.is_aligned() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: non-null, aligned, readable by contract; every version starts with `version`.
        let version = unsafe { (*info).version };
        let p = with(|m| gi_profile_by_enum(m, device, profile))?;
        let mut name = [0 as c_char; 96];
        fill_c_chars(&mut name, &format!("MIG {}", p.name));
        match version >> 24 {
            2 => {
                let v = sys::nvmlGpuInstanceProfileInfo_v2_t {
                    version,
                    id: p.id,
                    isP2pSupported: c_uint::from(p.p2p),
                    sliceCount: p.slice_count,
                    instanceCount: p.instance_count,
                    multiprocessorCount: p.multiprocessor_count,
                    copyEngineCount: p.copy_engine_count,
                    decoderCount: p.decoder_count,
                    encoderCount: p.encoder_count,
                    jpegCount: p.jpeg_count,
                    ofaCount: p.ofa_count,
                    memorySizeMB: p.memory_mib,
                    name,
                };
                // SAFETY: the caller passed a v2 struct.
                unsafe { put(info, v) }
            }
            3 => {
                let v = sys::nvmlGpuInstanceProfileInfo_v3_t {
                    version,
                    id: p.id,
                    sliceCount: p.slice_count,
                    instanceCount: p.instance_count,
                    multiprocessorCount: p.multiprocessor_count,
                    copyEngineCount: p.copy_engine_count,
                    decoderCount: p.decoder_count,
                    encoderCount: p.encoder_count,
                    jpegCount: p.jpeg_count,
                    ofaCount: p.ofa_count,
                    memorySizeMB: p.memory_mib,
                    name,
                    capabilities: if p.p2p {
                        sys::NVML_GPU_INSTANCE_PROFILE_CAPS_P2P
                    } else {
                        0
                    },
                };
                // SAFETY: the caller passed a v3 struct (its version says so).
                unsafe { put(info.cast::<sys::nvmlGpuInstanceProfileInfo_v3_t>(), v) }
            }
            _ => Err(ERROR_ARGUMENT_VERSION_MISMATCH),
        }
    })
}

/// # Safety
/// `count` must be valid for reads and writes; `placements` (if non-null) holds `*count` entries.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetGpuInstancePossiblePlacements_v2(
    device: sys::nvmlDevice_t,
    profile_id: c_uint,
    placements: *mut sys::nvmlGpuInstancePlacement_t,
    count: *mut c_uint,
) -> Ret {
    guard(|| {
        let list = with(|m| {
            let (g, _) = gpu_only(m, device)?;
            let mig = m.mig(g)?;
            let p = mig
                .table
                .gpu_instance_profiles
                .iter()
                .find(|p| p.id == profile_id)
                .ok_or(ERROR_INVALID_ARGUMENT)?;
            Ok(p.placements
                .starts
                .iter()
                .map(|&start| sys::nvmlGpuInstancePlacement_t {
                    start,
                    size: p.placements.size,
                })
                .collect::<Vec<_>>())
        })?;
        // SAFETY: array contract forwarded from the caller.
        unsafe { put_sized_list(placements, count, &list, true) }
    })
}

/// # Safety
/// `count` must be valid for a write when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetGpuInstanceRemainingCapacity(
    device: sys::nvmlDevice_t,
    profile_id: c_uint,
    count: *mut c_uint,
) -> Ret {
    guard(|| {
        let n = with(|m| {
            let (g, _) = gpu_only(m, device)?;
            m.mig(g)?.remaining(profile_id)
        })?;
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(count, n) }
    })
}

fn create_gi(
    device: sys::nvmlDevice_t,
    profile_id: c_uint,
    placement: Option<(u32, u32)>,
) -> Nv<sys::nvmlGpuInstance_t> {
    with(|m| {
        let (g, _) = gpu_only(m, device)?;
        let (_, mig) = m.mig_mut(g)?;
        let gi = mig.create_gi(profile_id, placement, None)?;
        Ok(Handle::Gi { gpu: g, gi }.encode() as sys::nvmlGpuInstance_t)
    })
}

/// # Safety
/// `out` must be valid for a write when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceCreateGpuInstance(
    device: sys::nvmlDevice_t,
    profile_id: c_uint,
    out: *mut sys::nvmlGpuInstance_t,
) -> Ret {
    guard(|| {
        if out.is_null() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        let h = create_gi(device, profile_id, None)?;
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(out, h) }
    })
}

/// # Safety
/// `placement` must be readable and `out` writable, when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceCreateGpuInstanceWithPlacement(
    device: sys::nvmlDevice_t,
    profile_id: c_uint,
    placement: *const sys::nvmlGpuInstancePlacement_t,
    out: *mut sys::nvmlGpuInstance_t,
) -> Ret {
    guard(|| {
        if out.is_null() || placement.is_null() || !placement.is_aligned() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: non-null, aligned, readable by the caller's contract.
        let p = unsafe { placement.read() };
        let h = create_gi(device, profile_id, Some((p.start, p.size)))?;
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(out, h) }
    })
}

/// `*count` on input: the array's capacity, or 0 for "the profile's instanceCount" (NVML's rule).
///
/// # Safety
/// `count` must be valid for reads and writes; `out` must hold the capacity described above.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetGpuInstances(
    device: sys::nvmlDevice_t,
    profile_id: c_uint,
    out: *mut sys::nvmlGpuInstance_t,
    count: *mut c_uint,
) -> Ret {
    guard(|| {
        let (list, capacity) = with(|m| {
            let (g, _) = gpu_only(m, device)?;
            let mig = m.mig(g)?;
            if !mig.enabled {
                return Err(ERROR_NOT_SUPPORTED);
            }
            let (index, p) = mig
                .table
                .gpu_instance_profiles
                .iter()
                .enumerate()
                .find(|(_, p)| p.id == profile_id)
                .ok_or(ERROR_INVALID_ARGUMENT)?;
            let list: Vec<sys::nvmlGpuInstance_t> = mig
                .gis
                .values()
                .filter(|gi| gi.profile == index)
                .map(|gi| Handle::Gi { gpu: g, gi: gi.id }.encode() as sys::nvmlGpuInstance_t)
                .collect();
            Ok((list, p.instance_count as usize))
        })?;
        // SAFETY: array contract forwarded from the caller.
        unsafe { put_list(out, count, &list, capacity) }
    })
}

/// # Safety
/// `out` must be valid for a write when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetGpuInstanceById(
    device: sys::nvmlDevice_t,
    id: c_uint,
    out: *mut sys::nvmlGpuInstance_t,
) -> Ret {
    guard(|| {
        let h = with(|m| {
            let (g, _) = gpu_only(m, device)?;
            let mig = m.mig(g)?;
            if !mig.enabled {
                return Err(ERROR_NOT_SUPPORTED);
            }
            mig.gis.get(&id).ok_or(ERROR_NOT_FOUND)?;
            Ok(Handle::Gi { gpu: g, gi: id }.encode() as sys::nvmlGpuInstance_t)
        })?;
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(out, h) }
    })
}

/// # Safety
/// `info` must be valid for a write when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlGpuInstanceGetInfo(
    gi: sys::nvmlGpuInstance_t,
    info: *mut sys::nvmlGpuInstanceInfo_t,
) -> Ret {
    guard(|| {
        let v = with(|m| {
            let (g, id) = m.gi_handle(gi as usize)?;
            let mig = m.mig(g)?;
            let inst = mig.gis.get(&id).ok_or(ERROR_INVALID_ARGUMENT)?;
            Ok(sys::nvmlGpuInstanceInfo_t {
                device: device_ptr(Handle::Gpu(g)),
                id,
                profileId: mig.table.gpu_instance_profiles[inst.profile].id,
                placement: sys::nvmlGpuInstancePlacement_t {
                    start: inst.start,
                    size: inst.size,
                },
            })
        })?;
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(info, v) }
    })
}

/// Destroys a GPU instance; one with compute instances → NVML_ERROR_IN_USE.
#[unsafe(no_mangle)]
extern "C" fn nvmlGpuInstanceDestroy(gi: sys::nvmlGpuInstance_t) -> Ret {
    guard(|| {
        with(|m| {
            let (g, id) = m.gi_handle(gi as usize)?;
            let (_, mig) = m.mig_mut(g)?;
            let inst = mig.gis.get(&id).ok_or(ERROR_INVALID_ARGUMENT)?;
            if !inst.cis.is_empty() {
                return Err(ERROR_IN_USE);
            }
            mig.gis.remove(&id);
            Ok(())
        })
    })
}
