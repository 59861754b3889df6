//! Compute instances: profiles, placements, creation, lookup and destruction.

use std::ffi::{c_char, c_uint};

use nvml_wrapper_sys::bindings as sys;

use super::{Ret, device_ptr, fill_c_chars, guard, put, put_list, put_sized_list, with};
use crate::codes::*;
use crate::state::{Handle, Nv, ci_placements};

fn ci_profile(
    gi: sys::nvmlGpuInstance_t,
    profile: c_uint,
    eng_profile: c_uint,
) -> Nv<(crate::state::CiProfile, crate::machine::GpuInstanceProfile)> {
    with(|m| {
        let (g, id) = m.gi_handle(gi as usize)?;
        let mig = m.mig(g)?;
        if eng_profile != 0 {
            return Err(ERROR_NOT_SUPPORTED);
        }
        if profile >= sys::NVML_COMPUTE_INSTANCE_PROFILE_COUNT {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        let cp = mig.ci_profile(id, profile)?;
        let inst = mig.gis.get(&id).ok_or(ERROR_INVALID_ARGUMENT)?;
        Ok((cp, mig.table.gpu_instance_profiles[inst.profile].clone()))
    })
}

/// # Safety
/// `info` must be valid for a write when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceProfileInfo(
    gi: sys::nvmlGpuInstance_t,
    profile: c_uint,
    eng_profile: c_uint,
    info: *mut sys::nvmlComputeInstanceProfileInfo_t,
) -> Ret {
    guard(|| {
        let (cp, gp) = ci_profile(gi, profile, eng_profile)?;
        let v = sys::nvmlComputeInstanceProfileInfo_t {
            id: cp.id,
            sliceCount: cp.slices,
            instanceCount: cp.instance_count,
            multiprocessorCount: cp.multiprocessors,
            sharedCopyEngineCount: gp.copy_engine_count,
            sharedDecoderCount: gp.decoder_count,
            sharedEncoderCount: gp.encoder_count,
            sharedJpegCount: gp.jpeg_count,
            sharedOfaCount: gp.ofa_count,
        };
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(info, v) }
    })
}

/// Accepts `nvmlComputeInstanceProfileInfo_v2_t` and `_v3_t`, told apart by their version field.
///
/// # Safety
/// `info` must point to a struct of the version its first field names, when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceProfileInfoV(
    gi: sys::nvmlGpuInstance_t,
    profile: c_uint,
    eng_profile: c_uint,
    info: *mut sys::nvmlComputeInstanceProfileInfo_v2_t,
) -> Ret {
    guard(|| {
        if info.is_null() || !info.is_aligned() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: non-null, aligned, readable by contract; every version starts with `version`.
        let version = unsafe { (*info).version };
        let (cp, gp) = ci_profile(gi, profile, eng_profile)?;
        let mut name = [0 as c_char; 96];
        let label = if cp.slices < gp.slice_count {
            format!("MIG {}c.{}", cp.slices, gp.name)
        } else {
            format!("MIG {}", gp.name)
        };
        fill_c_chars(&mut name, &label);
        match version >> 24 {
            2 => {
                let v = sys::nvmlComputeInstanceProfileInfo_v2_t {
                    version,
                    id: cp.id,
                    sliceCount: cp.slices,
                    instanceCount: cp.instance_count,
                    multiprocessorCount: cp.multiprocessors,
                    sharedCopyEngineCount: gp.copy_engine_count,
                    sharedDecoderCount: gp.decoder_count,
                    sharedEncoderCount: gp.encoder_count,
                    sharedJpegCount: gp.jpeg_count,
                    sharedOfaCount: gp.ofa_count,
                    name,
                };
                // SAFETY: the caller passed a v2 struct.
                unsafe { put(info, v) }
            }
            3 => {
                let v = sys::nvmlComputeInstanceProfileInfo_v3_t {
                    version,
                    id: cp.id,
                    sliceCount: cp.slices,
                    instanceCount: cp.instance_count,
                    multiprocessorCount: cp.multiprocessors,
                    sharedCopyEngineCount: gp.copy_engine_count,
                    sharedDecoderCount: gp.decoder_count,
                    sharedEncoderCount: gp.encoder_count,
                    sharedJpegCount: gp.jpeg_count,
                    sharedOfaCount: gp.ofa_count,
                    name,
                    capabilities: 0,
                };
                // SAFETY: the caller passed a v3 struct (its version says so).
                unsafe { put(info.cast::<sys::nvmlComputeInstanceProfileInfo_v3_t>(), v) }
            }
            _ => Err(ERROR_ARGUMENT_VERSION_MISMATCH),
        }
    })
}

/// # Safety
/// `count` must be valid for a write when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceRemainingCapacity(
    gi: sys::nvmlGpuInstance_t,
    profile_id: c_uint,
    count: *mut c_uint,
) -> Ret {
    guard(|| {
        let n = with(|m| {
            let (g, id) = m.gi_handle(gi as usize)?;
            let (uuid, mig) = m.mig_mut(g)?;
            let uuid = uuid.to_owned();
            mig.ci_profile(id, profile_id)?;
            let mut trial = mig.clone();
            let mut n = 0;
            while trial
                .create_ci(&uuid, id, profile_id, None, None, None)
                .is_ok()
            {
                n += 1;
            }
            Ok(n)
        })?;
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(count, n) }
    })
}

/// # Safety
/// `count` must be valid for reads and writes; `placements` (if non-null) holds `*count` entries.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlGpuInstanceGetComputeInstancePossiblePlacements(
    gi: sys::nvmlGpuInstance_t,
    profile_id: c_uint,
    placements: *mut sys::nvmlComputeInstancePlacement_t,
    count: *mut c_uint,
) -> Ret {
    guard(|| {
        let list = with(|m| {
            let (g, id) = m.gi_handle(gi as usize)?;
            let mig = m.mig(g)?;
            let cp = mig.ci_profile(id, profile_id)?;
            let inst = mig.gis.get(&id).ok_or(ERROR_INVALID_ARGUMENT)?;
            let gi_slices = mig.table.gpu_instance_profiles[inst.profile].slice_count;
            Ok(ci_placements(gi_slices, cp.slices)
                .into_iter()
                .map(|start| sys::nvmlComputeInstancePlacement_t {
                    start,
                    size: cp.slices,
                })
                .collect::<Vec<_>>())
        })?;
        // SAFETY: array contract forwarded from the caller.
        unsafe { put_sized_list(placements, count, &list, true) }
    })
}

fn create_ci(
    gi: sys::nvmlGpuInstance_t,
    profile_id: c_uint,
    placement: Option<(u32, u32)>,
) -> Nv<sys::nvmlComputeInstance_t> {
    with(|m| {
        let (g, id) = m.gi_handle(gi as usize)?;
        let (uuid, mig) = m.mig_mut(g)?;
        let uuid = uuid.to_owned();
        let ci = mig.create_ci(&uuid, id, profile_id, placement, None, None)?;
        Ok(Handle::Ci { gpu: g, gi: id, ci }.encode() as sys::nvmlComputeInstance_t)
    })
}

/// # Safety
/// `out` must be valid for a write when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlGpuInstanceCreateComputeInstance(
    gi: sys::nvmlGpuInstance_t,
    profile_id: c_uint,
    out: *mut sys::nvmlComputeInstance_t,
) -> Ret {
    guard(|| {
        if out.is_null() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        let h = create_ci(gi, profile_id, None)?;
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(out, h) }
    })
}

/// # Safety
/// `placement` must be readable and `out` writable, when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlGpuInstanceCreateComputeInstanceWithPlacement(
    gi: sys::nvmlGpuInstance_t,
    profile_id: c_uint,
    placement: *const sys::nvmlComputeInstancePlacement_t,
    out: *mut sys::nvmlComputeInstance_t,
) -> Ret {
    guard(|| {
        if out.is_null() || placement.is_null() || !placement.is_aligned() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: non-null, aligned, readable by the caller's contract.
        let p = unsafe { placement.read() };
        let h = create_ci(gi, profile_id, Some((p.start, p.size)))?;
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(out, h) }
    })
}

/// `*count` on input: the array's capacity, or 0 for "the profile's instanceCount" (NVML's rule).
///
/// # Safety
/// `count` must be valid for reads and writes; `out` must hold the capacity described above.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlGpuInstanceGetComputeInstances(
    gi: sys::nvmlGpuInstance_t,
    profile_id: c_uint,
    out: *mut sys::nvmlComputeInstance_t,
    count: *mut c_uint,
) -> Ret {
    guard(|| {
        let (list, capacity) = with(|m| {
            let (g, id) = m.gi_handle(gi as usize)?;
            let mig = m.mig(g)?;
            let cp = mig
                .ci_profile(id, profile_id)
                .map_err(|_| ERROR_INVALID_ARGUMENT)?;
            let inst = mig.gis.get(&id).ok_or(ERROR_INVALID_ARGUMENT)?;
            let list: Vec<sys::nvmlComputeInstance_t> = inst
                .cis
                .values()
                .filter(|c| c.slices == cp.slices)
                .map(|c| {
                    Handle::Ci {
                        gpu: g,
                        gi: id,
                        ci: c.id,
                    }
                    .encode() as sys::nvmlComputeInstance_t
                })
                .collect();
            Ok((list, cp.instance_count as usize))
        })?;
        // SAFETY: array contract forwarded from the caller.
        unsafe { put_list(out, count, &list, capacity) }
    })
}

/// # Safety
/// `out` must be valid for a write when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceById(
    gi: sys::nvmlGpuInstance_t,
    id: c_uint,
    out: *mut sys::nvmlComputeInstance_t,
) -> Ret {
    guard(|| {
        let h = with(|m| {
            let (g, gid) = m.gi_handle(gi as usize)?;
            let inst = m.gi(g, gid)?;
            inst.cis.get(&id).ok_or(ERROR_NOT_FOUND)?;
            Ok(Handle::Ci {
                gpu: g,
                gi: gid,
                ci: id,
            }
            .encode() as sys::nvmlComputeInstance_t)
        })?;
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(out, h) }
    })
}

/// # Safety
/// `info` must be valid for a write when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlComputeInstanceGetInfo_v2(
    ci: sys::nvmlComputeInstance_t,
    info: *mut sys::nvmlComputeInstanceInfo_t,
) -> Ret {
    guard(|| {
        let v = with(|m| {
            let (g, gi, id) = m.ci_handle(ci as usize)?;
            m.gpu(g)?;
            let c = m.ci(g, gi, id)?;
            Ok(sys::nvmlComputeInstanceInfo_t {
                device: device_ptr(Handle::Gpu(g)),
                gpuInstance: Handle::Gi { gpu: g, gi }.encode() as sys::nvmlGpuInstance_t,
                id,
                profileId: crate::state::ci_profile_for_slices(c.slices).unwrap_or(0),
                placement: sys::nvmlComputeInstancePlacement_t {
                    start: c.start,
                    size: c.slices,
                },
            })
        })?;
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(info, v) }
    })
}

/// Destroys a compute instance, freeing its slices.
#[unsafe(no_mangle)]
extern "C" fn nvmlComputeInstanceDestroy(ci: sys::nvmlComputeInstance_t) -> Ret {
    guard(|| {
        with(|m| {
            let (g, gi, id) = m.ci_handle(ci as usize)?;
            let (_, mig) = m.mig_mut(g)?;
            mig.gis
                .get_mut(&gi)
                .and_then(|inst| inst.cis.remove(&id))
                .map(|_| ())
                .ok_or(ERROR_INVALID_ARGUMENT)
        })
    })
}
