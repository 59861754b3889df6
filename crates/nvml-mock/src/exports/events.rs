//! Events: event sets, supported and registered event types, and waits.

use std::ffi::{c_uint, c_ulonglong};
use std::time::{Duration, Instant};

use nvml_wrapper_sys::bindings as sys;

use super::{Ret, device_ptr, gpu_only, guard, put, with};
use crate::codes::*;
use crate::state::{Handle, Mock, Nv, WaitOutcome};

/// # Safety
/// `set` must be valid for a write when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlEventSetCreate(set: *mut sys::nvmlEventSet_t) -> Ret {
    guard(|| {
        if set.is_null() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        let id = with(Mock::create_event_set)?;
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(set, Handle::EventSet(id).encode() as sys::nvmlEventSet_t) }
    })
}

fn event_set_id(set: sys::nvmlEventSet_t) -> Nv<u32> {
    match Handle::decode(set as usize) {
        Some(Handle::EventSet(id)) => Ok(id),
        _ => Err(ERROR_INVALID_ARGUMENT),
    }
}

/// Frees an event set.
#[unsafe(no_mangle)]
extern "C" fn nvmlEventSetFree(set: sys::nvmlEventSet_t) -> Ret {
    guard(|| {
        let id = event_set_id(set)?;
        with(|m| m.free_event_set(id))
    })
}

/// # Safety
/// `types` must be valid for a write when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    device: sys::nvmlDevice_t,
    types: *mut c_ulonglong,
) -> Ret {
    guard(|| {
        let v = with(|m| {
            let (g, _) = gpu_only(m, device)?;
            Ok(m.supported_events(g))
        })?;
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(types, v) }
    })
}

/// Registers event types of a whole GPU with an event set.
#[unsafe(no_mangle)]
extern "C" fn nvmlDeviceRegisterEvents(
    device: sys::nvmlDevice_t,
    types: c_ulonglong,
    set: sys::nvmlEventSet_t,
) -> Ret {
    guard(|| {
        let id = event_set_id(set)?;
        with(|m| {
            let (g, _) = gpu_only(m, device)?;
            if !m.has_event_set(id) {
                return Err(ERROR_INVALID_ARGUMENT);
            }
            m.register(g, types, id)
        })
    })
}

/// Waits up to `timeout_ms` for an event, reading the control file every 10 ms.
///
/// # Safety
/// `data` must be valid for a write when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlEventSetWait_v2(
    set: sys::nvmlEventSet_t,
    data: *mut sys::nvmlEventData_t,
    timeout_ms: c_uint,
) -> Ret {
    guard(|| {
        let id = event_set_id(set)?;
        if data.is_null() || !data.is_aligned() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        let deadline = Instant::now() + Duration::from_millis(timeout_ms.into());
        loop {
            match with(|m| m.take_event(id))? {
                WaitOutcome::Event(ev) => {
                    let v = sys::nvmlEventData_t {
                        device: device_ptr(Handle::Gpu(ev.gpu)),
                        eventType: ev.event_type,
                        eventData: ev.data,
                        gpuInstanceId: ev.gi,
                        computeInstanceId: ev.ci,
                    };
                    // SAFETY: out-pointer contract forwarded from the caller.
                    return unsafe { put(data, v) };
                }
                WaitOutcome::GpuLost => return Err(ERROR_GPU_IS_LOST),
                WaitOutcome::Nothing => {}
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(ERROR_TIMEOUT);
            }
            std::thread::sleep((deadline - now).min(Duration::from_millis(10)));
        }
    })
}

/// # Safety
/// As `nvmlEventSetWait_v2`.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlEventSetWait(
    set: sys::nvmlEventSet_t,
    data: *mut sys::nvmlEventData_t,
    timeout_ms: c_uint,
) -> Ret {
    // SAFETY: same contract.
    unsafe { nvmlEventSetWait_v2(set, data, timeout_ms) }
}
