//! MIG mode and MIG devices: the mode, MIG device handles and their parents and instance ids.

use std::ffi::c_uint;

use nvml_wrapper_sys::bindings as sys;

use super::{Ret, Target, device_ptr, gpu_only, guard, put, target, with};
use crate::codes::*;
use crate::state::Handle;

/// # Safety
/// `current` and `pending` must be valid for writes when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: sys::nvmlDevice_t,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> Ret {
    guard(|| {
        let (c, p) = with(|m| {
            let (g, _) = gpu_only(m, device)?;
            let mig = m.mig(g)?;
            Ok((c_uint::from(mig.enabled), c_uint::from(mig.pending)))
        })?;
        if pending.is_null() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(current, c) }?;
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(pending, p) }
    })
}

/// Sets the MIG mode at once (a real GPU needs a reset); disabling with GPU instances → IN_USE.
///
/// # Safety
/// `status` must be valid for a write when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceSetMigMode(
    device: sys::nvmlDevice_t,
    mode: c_uint,
    status: *mut Ret,
) -> Ret {
    guard(|| {
        if status.is_null() || mode > 1 {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        with(|m| {
            let (g, _) = gpu_only(m, device)?;
            let (_, mig) = m.mig_mut(g)?;
            if mode == 0 && !mig.gis.is_empty() {
                return Err(ERROR_IN_USE);
            }
            mig.enabled = mode == 1;
            mig.pending = mode == 1;
            Ok(())
        })?;
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(status, SUCCESS) }
    })
}

/// # Safety
/// `count` must be valid for a write when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    device: sys::nvmlDevice_t,
    count: *mut c_uint,
) -> Ret {
    guard(|| {
        let n = with(|m| {
            let (g, _) = gpu_only(m, device)?;
            Ok(match m.mig(g) {
                Ok(mig) if mig.enabled => mig.table.compute_slices,
                Ok(_) | Err(ERROR_NOT_SUPPORTED) => 0,
                Err(e) => return Err(e),
            })
        })?;
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(count, n) }
    })
}

/// # Safety
/// `out` must be valid for a write when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: sys::nvmlDevice_t,
    index: c_uint,
    out: *mut sys::nvmlDevice_t,
) -> Ret {
    guard(|| {
        let h = with(|m| {
            let (g, _) = gpu_only(m, device)?;
            let mig = m.mig(g)?;
            if !mig.enabled {
                return Err(ERROR_NOT_SUPPORTED);
            }
            if index >= mig.table.compute_slices {
                return Err(ERROR_INVALID_ARGUMENT);
            }
            let (gi, ci) = *mig
                .mig_devices()
                .get(index as usize)
                .ok_or(ERROR_NOT_FOUND)?;
            Ok(Handle::Mig { gpu: g, gi, ci })
        })?;
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(out, device_ptr(h)) }
    })
}

/// Answers even for lost GPUs.
///
/// # Safety
/// `out` must be valid for a write when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceIsMigDeviceHandle(
    device: sys::nvmlDevice_t,
    out: *mut c_uint,
) -> Ret {
    guard(|| {
        let is_mig = with(|m| match Handle::decode(device as usize) {
            Some(Handle::Gpu(g)) if (g as usize) < m.gpus.len() => Ok(0),
            Some(Handle::Mig { .. }) => Ok(1),
            _ => Err(ERROR_INVALID_ARGUMENT),
        })?;
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(out, is_mig) }
    })
}

/// # Safety
/// `out` must be valid for a write when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
    mig: sys::nvmlDevice_t,
    out: *mut sys::nvmlDevice_t,
) -> Ret {
    guard(|| {
        let parent = with(|m| match target(m, mig)? {
            Target::Mig { gpu, .. } => Ok(gpu),
            Target::Gpu(..) => Err(ERROR_INVALID_ARGUMENT),
        })?;
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(out, device_ptr(Handle::Gpu(parent))) }
    })
}

/// # Safety
/// `id` must be valid for a write when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(device: sys::nvmlDevice_t, id: *mut c_uint) -> Ret {
    guard(|| {
        let v = with(|m| match target(m, device)? {
            Target::Mig { gi, .. } => Ok(gi),
            Target::Gpu(..) => Err(ERROR_NOT_SUPPORTED),
        })?;
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(id, v) }
    })
}

/// # Safety
/// `id` must be valid for a write when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetComputeInstanceId(
    device: sys::nvmlDevice_t,
    id: *mut c_uint,
) -> Ret {
    guard(|| {
        let v = with(|m| match target(m, device)? {
            Target::Mig { ci, .. } => Ok(ci),
            Target::Gpu(..) => Err(ERROR_NOT_SUPPORTED),
        })?;
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(id, v) }
    })
}
