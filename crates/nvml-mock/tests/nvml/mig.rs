//! MIG through nvml-wrapper and the raw functions it exposes: profiles, placements, creation and
//! destruction with NVML's accounting and refusals, MIG device handles.

use std::ptr;

use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings::{
    NvmlLib, nvmlComputeInstance_t, nvmlComputeInstanceInfo_t, nvmlDevice_t, nvmlGpuInstance_t,
    nvmlGpuInstanceInfo_t, nvmlGpuInstancePlacement_t, nvmlGpuInstanceProfileInfo_v2_t,
    nvmlGpuInstanceProfileInfo_v3_t,
};

use crate::load;

const MIB: u64 = 1024 * 1024;
const INVALID_ARGUMENT: u32 = 2;
const NOT_SUPPORTED: u32 = 3;
const NOT_FOUND: u32 = 6;
const IN_USE: u32 = 19;
const INSUFFICIENT_RESOURCES: u32 = 23;

// A100-40GB profile ids.
const P_1G5: u32 = 19;
const P_1G10: u32 = 15;
const P_2G10: u32 = 14;
const P_3G20: u32 = 9;
const P_4G20: u32 = 5;
const P_7G40: u32 = 0;

fn ok(code: u32) -> Result<(), u32> {
    if code == 0 { Ok(()) } else { Err(code) }
}

fn handle(d: &Device) -> nvmlDevice_t {
    // SAFETY: the handle is only passed back to the library that made it.
    unsafe { d.handle() }
}

fn lib(nvml: &Nvml) -> &NvmlLib {
    nvml.lib()
}

fn create_gi(
    nvml: &Nvml,
    d: &Device,
    profile: u32,
    placement: Option<(u32, u32)>,
) -> Result<nvmlGpuInstance_t, u32> {
    let mut gi: nvmlGpuInstance_t = ptr::null_mut();
    let code = match placement {
        None => {
            let f = lib(nvml).nvmlDeviceCreateGpuInstance.as_ref().unwrap();
            // SAFETY: valid handle and out-pointer.
            unsafe { f(handle(d), profile, &mut gi) }
        }
        Some((start, size)) => {
            let f = lib(nvml)
                .nvmlDeviceCreateGpuInstanceWithPlacement
                .as_ref()
                .unwrap();
            let p = nvmlGpuInstancePlacement_t { start, size };
            // SAFETY: valid handle, placement and out-pointer.
            unsafe { f(handle(d), profile, &p, &mut gi) }
        }
    };
    ok(code).map(|()| gi)
}

fn gi_info(nvml: &Nvml, gi: nvmlGpuInstance_t) -> Result<nvmlGpuInstanceInfo_t, u32> {
    let f = lib(nvml).nvmlGpuInstanceGetInfo.as_ref().unwrap();
    // SAFETY: plain C struct, zero is a valid value.
    let mut info: nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: out-pointer to a live struct.
    ok(unsafe { f(gi, &mut info) }).map(|()| info)
}

fn destroy_gi(nvml: &Nvml, gi: nvmlGpuInstance_t) -> Result<(), u32> {
    let f = lib(nvml).nvmlGpuInstanceDestroy.as_ref().unwrap();
    // SAFETY: the handle came from the library.
    ok(unsafe { f(gi) })
}

fn remaining(nvml: &Nvml, d: &Device, profile: u32) -> Result<u32, u32> {
    let f = lib(nvml)
        .nvmlDeviceGetGpuInstanceRemainingCapacity
        .as_ref()
        .unwrap();
    let mut n = 0;
    // SAFETY: valid handle and out-pointer.
    ok(unsafe { f(handle(d), profile, &mut n) }).map(|()| n)
}

fn create_ci(
    nvml: &Nvml,
    gi: nvmlGpuInstance_t,
    profile: u32,
) -> Result<nvmlComputeInstance_t, u32> {
    let f = lib(nvml)
        .nvmlGpuInstanceCreateComputeInstance
        .as_ref()
        .unwrap();
    let mut ci: nvmlComputeInstance_t = ptr::null_mut();
    // SAFETY: valid handle and out-pointer.
    ok(unsafe { f(gi, profile, &mut ci) }).map(|()| ci)
}

fn ci_info(nvml: &Nvml, ci: nvmlComputeInstance_t) -> Result<nvmlComputeInstanceInfo_t, u32> {
    let f = lib(nvml).nvmlComputeInstanceGetInfo_v2.as_ref().unwrap();
    // SAFETY: plain C struct, zero is a valid value.
    let mut info: nvmlComputeInstanceInfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: out-pointer to a live struct.
    ok(unsafe { f(ci, &mut info) }).map(|()| info)
}

fn destroy_ci(nvml: &Nvml, ci: nvmlComputeInstance_t) -> Result<(), u32> {
    let f = lib(nvml).nvmlComputeInstanceDestroy.as_ref().unwrap();
    // SAFETY: the handle came from the library.
    ok(unsafe { f(ci) })
}

fn gpu_instances(nvml: &Nvml, d: &Device, profile: u32) -> Result<Vec<nvmlGpuInstance_t>, u32> {
    let f = lib(nvml).nvmlDeviceGetGpuInstances.as_ref().unwrap();
    let mut list = vec![ptr::null_mut(); 8];
    let mut count = 0;
    // SAFETY: the array holds 8 handles, more than any profile's instance count.
    ok(unsafe { f(handle(d), profile, list.as_mut_ptr(), &mut count) })?;
    list.truncate(count as usize);
    Ok(list)
}

fn placements(nvml: &Nvml, d: &Device, profile: u32) -> Result<Vec<(u32, u32)>, u32> {
    let f = lib(nvml)
        .nvmlDeviceGetGpuInstancePossiblePlacements_v2
        .as_ref()
        .unwrap();
    let mut count = 0;
    // SAFETY: null array asks for the count only.
    ok(unsafe { f(handle(d), profile, ptr::null_mut(), &mut count) })?;
    let mut list = vec![nvmlGpuInstancePlacement_t { start: 0, size: 0 }; count as usize];
    // SAFETY: the array holds `count` entries.
    ok(unsafe { f(handle(d), profile, list.as_mut_ptr(), &mut count) })?;
    list.truncate(count as usize);
    Ok(list.iter().map(|p| (p.start, p.size)).collect())
}

#[test]
fn a100_profiles_and_placements() {
    let l = load("dgx-a100");
    let nvml = &l.nvml;
    // Profile info answers whether or not MIG is enabled (GPU 0 has it disabled).
    let d0 = nvml.device_by_index(0).unwrap();
    let table = [
        // (NVML profile enum, id, slices, instances, memory MiB, SMs)
        (0, P_1G5, 1, 7, 4864, 14),
        (7, 20, 1, 1, 4864, 14),
        (9, P_1G10, 1, 4, 9856, 14),
        (1, P_2G10, 2, 3, 9856, 28),
        (2, P_3G20, 3, 2, 19968, 42),
        (3, P_4G20, 4, 1, 19968, 56),
        (4, P_7G40, 7, 1, 40192, 98),
    ];
    for (profile, id, slices, instances, mem, sms) in table {
        let info = d0.profile_info(profile).unwrap();
        assert_eq!(
            (
                info.id,
                info.slice_count,
                info.instance_count,
                info.memory_size_mb,
                info.multiprocessor_count
            ),
            (id, slices, instances, mem, sms),
            "profile {profile}"
        );
    }
    assert!(matches!(d0.profile_info(5), Err(NvmlError::NotSupported)));
    assert!(matches!(d0.profile_info(99), Err(NvmlError::InvalidArg)));
    assert_eq!(
        placements(nvml, &d0, P_1G5).unwrap(),
        (0..7).map(|s| (s, 1)).collect::<Vec<_>>()
    );
    assert_eq!(
        placements(nvml, &d0, P_1G10).unwrap(),
        vec![(0, 2), (2, 2), (4, 2), (6, 2)]
    );
    assert_eq!(
        placements(nvml, &d0, P_2G10).unwrap(),
        vec![(0, 2), (2, 2), (4, 2)]
    );
    assert_eq!(placements(nvml, &d0, P_3G20).unwrap(), vec![(0, 4), (4, 4)]);
    assert_eq!(placements(nvml, &d0, P_4G20).unwrap(), vec![(0, 4)]);
    assert_eq!(placements(nvml, &d0, P_7G40).unwrap(), vec![(0, 8)]);
    assert_eq!(placements(nvml, &d0, 77), Err(INVALID_ARGUMENT));
    // Creation needs MIG enabled.
    assert_eq!(create_gi(nvml, &d0, P_1G5, None).err(), Some(NOT_SUPPORTED));

    // The V form fills the name, in v2 and v3 layouts.
    let f = lib(nvml)
        .nvmlDeviceGetGpuInstanceProfileInfoV
        .as_ref()
        .unwrap();
    // SAFETY: plain C struct.
    let mut v2: nvmlGpuInstanceProfileInfo_v2_t = unsafe { std::mem::zeroed() };
    v2.version = (size_of::<nvmlGpuInstanceProfileInfo_v2_t>() | (2 << 24)) as u32;
    // SAFETY: a v2 struct with its version set.
    assert_eq!(unsafe { f(handle(&d0), 1, &mut v2) }, 0);
    // SAFETY: NUL-terminated by the library.
    let name = unsafe { std::ffi::CStr::from_ptr(v2.name.as_ptr()) };
    assert_eq!((v2.id, name.to_str().unwrap()), (P_2G10, "MIG 2g.10gb"));
    // SAFETY: plain C struct.
    let mut v3: nvmlGpuInstanceProfileInfo_v3_t = unsafe { std::mem::zeroed() };
    v3.version = (size_of::<nvmlGpuInstanceProfileInfo_v3_t>() | (3 << 24)) as u32;
    // SAFETY: a v3 struct with its version set; the function tells the layouts apart by it.
    assert_eq!(unsafe { f(handle(&d0), 4, (&raw mut v3).cast()) }, 0);
    assert_eq!((v3.id, v3.sliceCount), (P_7G40, 7));
}

#[test]
fn a100_create_and_destroy_with_accounting() {
    let l = load("dgx-a100");
    let nvml = &l.nvml;
    let d6 = nvml.device_by_index(6).unwrap();
    assert_eq!(d6.mig_device_count().unwrap(), 7);
    assert!(matches!(
        d6.mig_device_by_index(0),
        Err(NvmlError::NotFound)
    ));
    assert_eq!(remaining(nvml, &d6, P_1G5), Ok(7));
    assert_eq!(remaining(nvml, &d6, P_7G40), Ok(1));

    // 3g.20gb at slice 4 → GPU instance 2; 4g.20gb (only at 0) → 1.
    let gi_3g = create_gi(nvml, &d6, P_3G20, Some((4, 4))).unwrap();
    let info = gi_info(nvml, gi_3g).unwrap();
    assert_eq!(
        (
            info.id,
            info.profileId,
            info.placement.start,
            info.placement.size
        ),
        (2, P_3G20, 4, 4)
    );
    assert_eq!(remaining(nvml, &d6, P_7G40), Ok(0));
    assert_eq!(remaining(nvml, &d6, P_4G20), Ok(1));
    // A placement that is not in the profile's list, and one that overlaps.
    assert_eq!(
        create_gi(nvml, &d6, P_3G20, Some((2, 4))).err(),
        Some(INVALID_ARGUMENT)
    );
    assert_eq!(
        create_gi(nvml, &d6, P_2G10, Some((4, 2))).err(),
        Some(INSUFFICIENT_RESOURCES)
    );
    assert_eq!(
        create_gi(nvml, &d6, 12345, None).err(),
        Some(INVALID_ARGUMENT)
    );
    let gi_4g = create_gi(nvml, &d6, P_4G20, None).unwrap();
    assert_eq!(gi_info(nvml, gi_4g).unwrap().id, 1);
    // All compute and memory slices are used now.
    for p in [P_1G5, P_1G10, P_2G10, P_3G20, P_4G20, P_7G40] {
        assert_eq!(remaining(nvml, &d6, p), Ok(0), "profile {p}");
    }
    assert_eq!(
        create_gi(nvml, &d6, P_1G5, None).err(),
        Some(INSUFFICIENT_RESOURCES)
    );
    assert_eq!(gpu_instances(nvml, &d6, P_3G20).unwrap(), vec![gi_3g]);
    assert_eq!(gpu_instances(nvml, &d6, P_1G5).unwrap(), vec![]);

    // Compute instances: two 1-slice and one... the 3-slice GPU instance holds 3 one-slice ones.
    let ci_a = create_ci(nvml, gi_3g, 0).unwrap();
    let ci_b = create_ci(nvml, gi_3g, 0).unwrap();
    let info = ci_info(nvml, ci_b).unwrap();
    assert_eq!(
        (
            info.id,
            info.profileId,
            info.placement.start,
            info.placement.size
        ),
        (1, 0, 1, 1)
    );
    assert_eq!(
        create_ci(nvml, gi_3g, 2).err(),
        Some(INSUFFICIENT_RESOURCES)
    );
    assert_eq!(create_ci(nvml, gi_3g, 4).err(), Some(NOT_SUPPORTED));
    let ci_4g = create_ci(nvml, gi_4g, 3).unwrap();

    // MIG devices: GPU instance 1 (4g) first, then 2 (3g) with compute instances 0 and 1.
    let migs: Vec<Device> = (0..3).map(|i| d6.mig_device_by_index(i).unwrap()).collect();
    assert!(matches!(
        d6.mig_device_by_index(3),
        Err(NvmlError::NotFound)
    ));
    assert!(matches!(
        d6.mig_device_by_index(7),
        Err(NvmlError::InvalidArg)
    ));
    for (m, (gi, ci, mem, name)) in migs.iter().zip([
        (1, 0, 19968, "NVIDIA A100-SXM4-40GB MIG 4g.20gb"),
        (2, 0, 19968, "NVIDIA A100-SXM4-40GB MIG 1c.3g.20gb"),
        (2, 1, 19968, "NVIDIA A100-SXM4-40GB MIG 1c.3g.20gb"),
    ]) {
        assert!(m.mig_is_mig_device_handle().unwrap());
        assert_eq!(m.name().unwrap(), name);
        assert_eq!(m.memory_info().unwrap().total, mem * MIB);
        assert_eq!(m.mig_parent_device().unwrap().index().unwrap(), 6);
        let uuid = m.uuid().unwrap();
        assert!(uuid.starts_with("MIG-") && uuid.len() == 40, "{uuid}");
        assert_eq!(
            nvml.device_by_uuid(uuid.as_str()).unwrap().uuid().unwrap(),
            uuid
        );
        let f = lib(nvml).nvmlDeviceGetGpuInstanceId.as_ref().unwrap();
        let g = lib(nvml).nvmlDeviceGetComputeInstanceId.as_ref().unwrap();
        let (mut got_gi, mut got_ci) = (0, 0);
        // SAFETY: valid handle and out-pointers.
        unsafe {
            assert_eq!(f(handle(m), &mut got_gi), 0);
            assert_eq!(g(handle(m), &mut got_ci), 0);
        }
        assert_eq!((got_gi, got_ci), (gi, ci));
    }
    assert!(!d6.mig_is_mig_device_handle().unwrap());
    assert!(matches!(d6.mig_parent_device(), Err(NvmlError::InvalidArg)));

    // A GPU instance with compute instances cannot be destroyed.
    assert_eq!(destroy_gi(nvml, gi_3g), Err(IN_USE));
    destroy_ci(nvml, ci_a).unwrap();
    assert_eq!(destroy_gi(nvml, gi_3g), Err(IN_USE));
    destroy_ci(nvml, ci_b).unwrap();
    assert_eq!(ci_info(nvml, ci_b).err(), Some(INVALID_ARGUMENT));
    destroy_gi(nvml, gi_3g).unwrap();
    assert_eq!(gi_info(nvml, gi_3g).err(), Some(INVALID_ARGUMENT));
    assert_eq!(destroy_gi(nvml, gi_3g), Err(INVALID_ARGUMENT));
    // The freed slices take 3 × 1g.5gb at 4, 5, 6 (the 4g holds 4 compute slices of 7).
    assert_eq!(remaining(nvml, &d6, P_1G5), Ok(3));
    assert_eq!(remaining(nvml, &d6, P_2G10), Ok(1));
    let ids: Vec<u32> = (0..3)
        .map(|_| {
            gi_info(nvml, create_gi(nvml, &d6, P_1G5, None).unwrap())
                .unwrap()
                .id
        })
        .collect();
    assert_eq!(ids, vec![11, 12, 13]);
    destroy_ci(nvml, ci_4g).unwrap();
    destroy_gi(nvml, gi_4g).unwrap();
    assert_eq!(remaining(nvml, &d6, P_1G5), Ok(4));

    let f = lib(nvml).nvmlDeviceGetGpuInstanceById.as_ref().unwrap();
    let mut gi: nvmlGpuInstance_t = ptr::null_mut();
    // SAFETY: valid handle and out-pointer.
    assert_eq!(unsafe { f(handle(&d6), 1, &mut gi) }, NOT_FOUND);
    // SAFETY: as above.
    assert_eq!(unsafe { f(handle(&d6), 13, &mut gi) }, 0);
}

#[test]
fn dgx_gpu7_has_its_preexisting_instances() {
    let l = load("dgx-a100");
    let d7 = l.nvml.device_by_index(7).unwrap();
    let found: Vec<(String, u64)> = (0..4)
        .map(|i| {
            let m = d7.mig_device_by_index(i).unwrap();
            (m.name().unwrap(), m.memory_info().unwrap().total / MIB)
        })
        .collect();
    let p = "NVIDIA A100-SXM4-40GB MIG";
    assert_eq!(
        found,
        vec![
            (format!("{p} 3g.20gb"), 19968),
            (format!("{p} 1c.2g.10gb"), 9856),
            (format!("{p} 1c.2g.10gb"), 9856),
            (format!("{p} 1g.5gb"), 4864),
        ]
    );
    // Memory slice 7 is free but no 1-slice placement starts there; one compute slice is free.
    assert_eq!(remaining(&l.nvml, &d7, P_1G5), Ok(0));
    assert_eq!(remaining(&l.nvml, &d7, P_1G10), Ok(0));
}

#[test]
fn h100_seven_mig_devices() {
    let l = load("h100-mig");
    let nvml = &l.nvml;
    assert_eq!(nvml.device_count().unwrap(), 1);
    let gpu = nvml.device_by_index(0).unwrap();
    assert_eq!(gpu.name().unwrap(), "NVIDIA H100 80GB HBM3");
    assert_eq!(
        gpu.architecture().unwrap(),
        nvml_wrapper::enums::device::DeviceArchitecture::Hopper
    );
    assert_eq!(gpu.cuda_compute_capability().unwrap().major, 9);
    assert_eq!(gpu.memory_info().unwrap().total, 81559 * MIB);
    let mode = gpu.mig_mode().unwrap();
    assert_eq!((mode.current, mode.pending), (1, 1));
    assert_eq!(gpu.mig_device_count().unwrap(), 7);
    let mut uuids = std::collections::BTreeSet::new();
    for i in 0..7 {
        let m = gpu.mig_device_by_index(i).unwrap();
        assert_eq!(m.name().unwrap(), "NVIDIA H100 80GB HBM3 MIG 1g.10gb");
        assert_eq!(m.memory_info().unwrap().total, 9984 * MIB);
        assert_eq!(
            m.mig_parent_device().unwrap().uuid().unwrap(),
            gpu.uuid().unwrap()
        );
        assert!(uuids.insert(m.uuid().unwrap()));
        let mut gi = 0;
        let f = lib(nvml).nvmlDeviceGetGpuInstanceId.as_ref().unwrap();
        // SAFETY: valid handle and out-pointer.
        assert_eq!(unsafe { f(handle(&m), &mut gi) }, 0);
        assert_eq!(gi, 7 + i);
        assert!(matches!(m.pci_info(), Err(NvmlError::NotSupported)));
    }
    assert_eq!(gpu_instances(nvml, &gpu, P_1G5).unwrap().len(), 7);
    // Full: nothing else fits; the GPU instances are in use.
    assert_eq!(remaining(nvml, &gpu, P_1G5), Ok(0));
    assert_eq!(
        create_gi(nvml, &gpu, P_1G5, None).err(),
        Some(INSUFFICIENT_RESOURCES)
    );
    let gi = gpu_instances(nvml, &gpu, P_1G5).unwrap()[0];
    assert_eq!(destroy_gi(nvml, gi), Err(IN_USE));
}

#[test]
fn concurrent_creation_never_hands_out_a_slice_twice() {
    let l = load("dgx-a100");
    let nvml = &l.nvml;
    let held = parking_lot::Mutex::new(std::collections::BTreeSet::new());
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                let d6 = nvml.device_by_index(6).unwrap();
                for _ in 0..200 {
                    match create_gi(nvml, &d6, P_1G5, None) {
                        Ok(gi) => {
                            let start = gi_info(nvml, gi).unwrap().placement.start;
                            assert!(held.lock().insert(start), "slice {start} handed out twice");
                            std::thread::yield_now();
                            assert!(held.lock().remove(&start));
                            destroy_gi(nvml, gi).unwrap();
                        }
                        Err(code) => assert_eq!(code, INSUFFICIENT_RESOURCES),
                    }
                }
            });
        }
    });
    let d6 = nvml.device_by_index(6).unwrap();
    assert_eq!(gpu_instances(nvml, &d6, P_1G5).unwrap(), vec![]);
    assert_eq!(remaining(nvml, &d6, P_1G5), Ok(7));
}
