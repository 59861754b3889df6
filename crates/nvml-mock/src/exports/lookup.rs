//! Device lookup: the GPU count and handles by index, UUID or PCI bus id.

use std::ffi::{c_char, c_uint};

use nvml_wrapper_sys::bindings as sys;

use super::{Ret, device_ptr, guard, put, read_str, with};
use crate::codes::*;
use crate::state::Handle;

/// # Safety
/// `count` must be valid for a write when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> Ret {
    guard(|| {
        let n = with(|m| Ok(m.gpus.len() as c_uint))?;
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(count, n) }
    })
}

/// # Safety
/// `count` must be valid for a write when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetCount(count: *mut c_uint) -> Ret {
    // SAFETY: same contract.
    unsafe { nvmlDeviceGetCount_v2(count) }
}

/// # Safety
/// `device` must be valid for a write when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut sys::nvmlDevice_t,
) -> Ret {
    guard(|| {
        let h = with(|m| {
            if (index as usize) < m.gpus.len() {
                Ok(Handle::Gpu(index))
            } else {
                Err(ERROR_INVALID_ARGUMENT)
            }
        })?;
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(device, device_ptr(h)) }
    })
}

/// # Safety
/// `device` must be valid for a write when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetHandleByIndex(
    index: c_uint,
    device: *mut sys::nvmlDevice_t,
) -> Ret {
    // SAFETY: same contract.
    unsafe { nvmlDeviceGetHandleByIndex_v2(index, device) }
}

/// # Safety
/// `uuid` must be NUL-terminated and `device` valid for a write, when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut sys::nvmlDevice_t,
) -> Ret {
    guard(|| {
        // SAFETY: string contract forwarded from the caller.
        let uuid = unsafe { read_str(uuid) }?;
        let h = with(|m| m.device_by_uuid(&uuid).ok_or(ERROR_NOT_FOUND))?;
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(device, device_ptr(h)) }
    })
}

/// # Safety
/// `bus` must be NUL-terminated and `device` valid for a write, when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(
    bus: *const c_char,
    device: *mut sys::nvmlDevice_t,
) -> Ret {
    guard(|| {
        // SAFETY: string contract forwarded from the caller.
        let bus = unsafe { read_str(bus) }?;
        let g = with(|m| m.gpu_by_bus(&bus).ok_or(ERROR_NOT_FOUND))?;
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(device, device_ptr(Handle::Gpu(g))) }
    })
}

/// # Safety
/// As `nvmlDeviceGetHandleByPciBusId_v2`.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId(
    bus: *const c_char,
    device: *mut sys::nvmlDevice_t,
) -> Ret {
    // SAFETY: same contract.
    unsafe { nvmlDeviceGetHandleByPciBusId_v2(bus, device) }
}
