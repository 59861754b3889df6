//! Topology and NVLink: common ancestors and nearest GPUs, P2P status, NVLink state, version and
//! the far end of each link.

use std::ffi::c_uint;

use nvml_wrapper_sys::bindings as sys;

use super::{
    NVSWITCH_DEVICE_ID, Ret, device_ptr, gpu_only, guard, pci_info, put, put_sized_list, with,
};
use crate::codes::*;
use crate::state::{Handle, LinkEnd, Mock, Nv};

/// Two whole GPUs (not lost).
fn gpu_pair(m: &Mock, a: sys::nvmlDevice_t, b: sys::nvmlDevice_t) -> Nv<(u32, u32)> {
    let (a, _) = gpu_only(m, a).map_err(not_supported_is_invalid)?;
    let (b, _) = gpu_only(m, b).map_err(not_supported_is_invalid)?;
    Ok((a, b))
}

fn not_supported_is_invalid(e: u32) -> u32 {
    if e == ERROR_NOT_SUPPORTED {
        ERROR_INVALID_ARGUMENT
    } else {
        e
    }
}

/// # Safety
/// `level` must be valid for a write when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetTopologyCommonAncestor(
    a: sys::nvmlDevice_t,
    b: sys::nvmlDevice_t,
    level: *mut sys::nvmlGpuTopologyLevel_t,
) -> Ret {
    guard(|| {
        let v = with(|m| {
            let (a, b) = gpu_pair(m, a, b)?;
            Ok(m.topology(a, b).nvml_value())
        })?;
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(level, v) }
    })
}

/// GPUs whose common ancestor with `device` is at `level` or closer; array NULL → count only.
///
/// # Safety
/// `count` must be valid for reads and writes; `devices` (if non-null) holds `*count` entries.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetTopologyNearestGpus(
    device: sys::nvmlDevice_t,
    level: sys::nvmlGpuTopologyLevel_t,
    count: *mut c_uint,
    devices: *mut sys::nvmlDevice_t,
) -> Ret {
    guard(|| {
        let list = with(|m| {
            let (g, _) = gpu_only(m, device).map_err(not_supported_is_invalid)?;
            Ok((0..m.gpus.len() as u32)
                .filter(|&o| o != g && m.topology(g, o).nvml_value() <= level)
                .map(|o| device_ptr(Handle::Gpu(o)))
                .collect::<Vec<_>>())
        })?;
        // SAFETY: array contract forwarded from the caller.
        unsafe { put_sized_list(devices, count, &list, false) }
    })
}

/// # Safety
/// `status` must be valid for a write when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetP2PStatus(
    a: sys::nvmlDevice_t,
    b: sys::nvmlDevice_t,
    index: sys::nvmlGpuP2PCapsIndex_t,
    status: *mut sys::nvmlGpuP2PStatus_t,
) -> Ret {
    guard(|| {
        let v = with(|m| {
            let (a, b) = gpu_pair(m, a, b)?;
            if index >= sys::nvmlGpuP2PCapsIndex_enum_NVML_P2P_CAPS_INDEX_UNKNOWN {
                return Err(ERROR_INVALID_ARGUMENT);
            }
            let ok = if index == sys::nvmlGpuP2PCapsIndex_enum_NVML_P2P_CAPS_INDEX_NVLINK {
                m.nvlinked(a, b)
            } else {
                a != b
            };
            Ok(if ok {
                sys::nvmlGpuP2PStatus_enum_NVML_P2P_STATUS_OK
            } else {
                sys::nvmlGpuP2PStatus_enum_NVML_P2P_STATUS_NOT_SUPPORTED
            })
        })?;
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(status, v) }
    })
}

/// The far end of `link` of a GPU: `Ok(None)` for an inactive link.
fn link_end(m: &Mock, device: sys::nvmlDevice_t, link: c_uint) -> Nv<Option<LinkEnd>> {
    let (g, _) = gpu_only(m, device)?;
    if link >= sys::NVML_NVLINK_MAX_LINKS {
        return Err(ERROR_INVALID_ARGUMENT);
    }
    let links = &m.gpus[g as usize].links;
    let max = m.machine.nvlink.as_ref().map_or(0, |n| n.max_links);
    if links.is_empty() || link >= max {
        return Err(ERROR_NOT_SUPPORTED);
    }
    Ok(links.get(link as usize).cloned())
}

/// # Safety
/// `active` must be valid for a write when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetNvLinkState(
    device: sys::nvmlDevice_t,
    link: c_uint,
    active: *mut sys::nvmlEnableState_t,
) -> Ret {
    guard(|| {
        let v = with(|m| Ok(c_uint::from(link_end(m, device, link)?.is_some())))?;
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(active, v) }
    })
}

/// # Safety
/// `version` must be valid for a write when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetNvLinkVersion(
    device: sys::nvmlDevice_t,
    link: c_uint,
    version: *mut c_uint,
) -> Ret {
    guard(|| {
        let v = with(|m| {
            link_end(m, device, link)?;
            Ok(m.machine.nvlink.as_ref().map_or(0, |n| n.version))
        })?;
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(version, v) }
    })
}

/// # Safety
/// `pci` must be valid for a write when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetNvLinkRemotePciInfo_v2(
    device: sys::nvmlDevice_t,
    link: c_uint,
    pci: *mut sys::nvmlPciInfo_t,
) -> Ret {
    guard(|| {
        let info = with(|m| match link_end(m, device, link)? {
            None => Err(ERROR_NOT_SUPPORTED),
            Some(LinkEnd::Gpu(o)) => {
                let gpu = &m.machine.gpus[o as usize];
                Ok(pci_info(
                    &gpu.pci.bus_id,
                    gpu.pci.device_id,
                    gpu.pci.subsystem_id,
                ))
            }
            Some(LinkEnd::Switch(bus)) => Ok(pci_info(&bus, NVSWITCH_DEVICE_ID, 0)),
        })?;
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(pci, info) }
    })
}

/// # Safety
/// `kind` must be valid for a write when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetNvLinkRemoteDeviceType(
    device: sys::nvmlDevice_t,
    link: c_uint,
    kind: *mut sys::nvmlIntNvLinkDeviceType_t,
) -> Ret {
    guard(|| {
        let v = with(|m| match link_end(m, device, link)? {
            None => Err(ERROR_NOT_SUPPORTED),
            Some(LinkEnd::Gpu(_)) => {
                Ok(sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_GPU)
            }
            Some(LinkEnd::Switch(_)) => {
                Ok(sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_SWITCH)
            }
        })?;
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(kind, v) }
    })
}
