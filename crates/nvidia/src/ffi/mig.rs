//! Reading MIG through the raw function table: GPU instance profiles and their placements,
//! GPU and compute instances, and the UUIDs of MIG devices.

use std::mem;
use std::os::raw::c_uint;
use std::ptr;

use nvml_wrapper::Device;
use nvml_wrapper::error::{NvmlError, nvml_sym, nvml_try};
use nvml_wrapper_sys::bindings as sys;

use crate::snapshot::{MigInstance, MigProfile, Placement};

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
pub(super) fn mig_profiles(dev: &Device<'_>) -> Vec<MigProfile> {
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
                tracing::warn!(profile = %profile.name, error = %kubedev_core::echo::Chain(&e), "cannot list MIG placements; profile skipped");
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
pub(super) struct Gi {
    pub(super) handle: sys::nvmlGpuInstance_t,
    pub(super) id: u32,
    pub(super) profile_id: u32,
    pub(super) placement: Placement,
}

/// Every GPU instance of the GPU (all profiles).
pub(super) fn gpu_instances(
    dev: &Device<'_>,
    profiles: &[MigProfile],
) -> Result<Vec<Gi>, NvmlError> {
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
pub(super) struct Ci {
    pub(super) handle: sys::nvmlComputeInstance_t,
    pub(super) id: u32,
    pub(super) slices: u32,
}

/// Every compute instance of a GPU instance.
pub(super) fn compute_instances(
    dev: &Device<'_>,
    gi: sys::nvmlGpuInstance_t,
) -> Result<Vec<Ci>, NvmlError> {
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
pub(super) fn mig_uuids(dev: &Device<'_>) -> Vec<((u32, u32), String)> {
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
pub(super) fn mig_instances(
    dev: &Device<'_>,
    profiles: &[MigProfile],
) -> Result<Vec<MigInstance>, NvmlError> {
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
}
