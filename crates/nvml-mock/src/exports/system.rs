//! Init, shutdown, error strings and system-wide queries (driver, NVML and CUDA versions).

use std::ffi::{c_char, c_int, c_uint};

use super::{Ret, guard, init, lock, put, put_str, with};
use crate::codes::*;

/// Initialises NVML: reads the machine file when the reference count goes from 0 to 1.
#[unsafe(no_mangle)]
extern "C" fn nvmlInit_v2() -> Ret {
    guard(init)
}

/// Old name of `nvmlInit_v2`.
#[unsafe(no_mangle)]
extern "C" fn nvmlInit() -> Ret {
    guard(init)
}

/// Initialises NVML; the flags are accepted and ignored.
#[unsafe(no_mangle)]
extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> Ret {
    guard(init)
}

/// Drops one reference; the last one forgets the machine and all handles.
#[unsafe(no_mangle)]
extern "C" fn nvmlShutdown() -> Ret {
    guard(|| {
        let mut global = lock();
        if global.refcount == 0 {
            return Err(ERROR_UNINITIALIZED);
        }
        global.refcount -= 1;
        if global.refcount == 0 {
            global.mock = None;
        }
        Ok(())
    })
}

/// Static text for a return code.
#[unsafe(no_mangle)]
extern "C" fn nvmlErrorString(result: Ret) -> *const c_char {
    error_cstr(result).as_ptr().cast()
}

/// # Safety
/// `version` must be valid for `length` bytes when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlSystemGetDriverVersion(version: *mut c_char, length: c_uint) -> Ret {
    guard(|| {
        let text = with(|m| Ok(m.machine.driver_version.clone()))?;
        // SAFETY: buffer contract forwarded from the caller.
        unsafe { put_str(version, length, &text) }
    })
}

/// # Safety
/// `version` must be valid for `length` bytes when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlSystemGetNVMLVersion(version: *mut c_char, length: c_uint) -> Ret {
    guard(|| {
        let text = with(|m| Ok(m.machine.nvml_version_string()))?;
        // SAFETY: buffer contract forwarded from the caller.
        unsafe { put_str(version, length, &text) }
    })
}

/// # Safety
/// `out` must be valid for a write when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(out: *mut c_int) -> Ret {
    guard(|| {
        let v = with(|m| Ok(m.machine.cuda_driver_version))?;
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(out, v) }
    })
}

/// # Safety
/// `out` must be valid for a write when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(out: *mut c_int) -> Ret {
    // SAFETY: same contract.
    unsafe { nvmlSystemGetCudaDriverVersion(out) }
}
