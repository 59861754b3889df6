//! Changing MIG: finding, creating and destroying the GPU instance (with its compute instance)
//! at a placement.

use std::ffi::c_uint;
use std::mem;
use std::ptr;

use nvml_wrapper::error::{NvmlError, nvml_sym, nvml_try};
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings as sys;

use super::mig::{compute_instances, gpu_instances, mig_profiles, mig_uuids};
use super::nvml_err;
use crate::error::NvidiaError;
use crate::snapshot::{MigProfile, Placement};

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
    let profile = profile_by_index(&dev, profile_index, &target)?;
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
    let ci_profile = whole_compute_profile(ci_profile_info, gi, profile.slice_count);
    let rollback = |why: NvidiaError| {
        // SAFETY: `gi` is live and has no compute instance (its creation failed).
        if let Err(e) = nvml_try(unsafe { destroy_gi(gi) }) {
            tracing::warn!(target = %target, error = %kubedev_core::echo::Chain(&e), "destroying the GPU instance after a failed compute instance");
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

/// The MIG profile of GPU `dev` with index `profile_index`; `target` names the placement in
/// the error.
fn profile_by_index(
    dev: &Device<'_>,
    profile_index: u32,
    target: &str,
) -> Result<MigProfile, NvidiaError> {
    all_profiles(dev)
        .into_iter()
        .find(|p| p.index == profile_index)
        .ok_or_else(|| NvidiaError::Nvml {
            call: "nvmlDeviceGetGpuInstanceProfileInfo",
            target: target.to_owned(),
            message: format!("the GPU has no MIG profile with index {profile_index}"),
            gpu_lost: false,
        })
}

/// `nvmlGpuInstanceGetComputeInstanceProfileInfo`.
type ComputeProfileInfoFn = unsafe extern "C" fn(
    sys::nvmlGpuInstance_t,
    c_uint,
    c_uint,
    *mut sys::nvmlComputeInstanceProfileInfo_t,
) -> sys::nvmlReturn_t;

/// The id of the compute instance profile of GPU instance `gi` with `slice_count` slices,
/// as many as the GPU instance has: the whole of it; `None` when there is none.
fn whole_compute_profile(
    ci_profile_info: &ComputeProfileInfoFn,
    gi: sys::nvmlGpuInstance_t,
    slice_count: u32,
) -> Option<u32> {
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
        if nvml_try(code).is_ok() && info.sliceCount == slice_count {
            return Some(info.id);
        }
    }
    None
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
