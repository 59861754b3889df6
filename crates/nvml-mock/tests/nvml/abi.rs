//! The C boundary itself: uninitialised calls, null and foreign pointers, short buffers and
//! reference counting, called through the raw function table.

use std::ffi::{CStr, c_char};
use std::ptr;

use nvml_wrapper_sys::bindings::{NvmlLib, nvmlDevice_t, nvmlGpuInstance_t};

const SUCCESS: u32 = 0;
const UNINITIALIZED: u32 = 1;
const INVALID_ARGUMENT: u32 = 2;
const NOT_FOUND: u32 = 6;
const INSUFFICIENT_SIZE: u32 = 7;

#[test]
fn raw_calls_check_every_pointer() {
    let dir = tempfile::tempdir().unwrap();
    let lib = nvml_mock::isolated_library(dir.path(), &nvml_mock::machine_path("dgx-a100"), None)
        .unwrap();
    // SAFETY: the mock library has no initialisers with preconditions.
    let nvml = unsafe { NvmlLib::new(&lib) }.unwrap();
    // SAFETY: all calls below pass valid pointers, null, or deliberately foreign
    // handles, which the library must reject without touching them.
    unsafe {
        let mut count = 0;
        assert_eq!(nvml.nvmlDeviceGetCount_v2(&mut count), UNINITIALIZED);
        assert_eq!(nvml.nvmlShutdown(), UNINITIALIZED);
        let text = CStr::from_ptr(nvml.nvmlErrorString(15)).to_str().unwrap();
        assert_eq!(text, "GPU is lost");
        assert_eq!(nvml.nvmlInit_v2(), SUCCESS);
        assert_eq!(nvml.nvmlInit_v2(), SUCCESS);

        assert_eq!(
            nvml.nvmlDeviceGetCount_v2(ptr::null_mut()),
            INVALID_ARGUMENT
        );
        assert_eq!(nvml.nvmlDeviceGetCount_v2(&mut count), SUCCESS);
        assert_eq!(count, 8);
        let mut dev: nvmlDevice_t = ptr::null_mut();
        assert_eq!(
            nvml.nvmlDeviceGetHandleByIndex_v2(0, ptr::null_mut()),
            INVALID_ARGUMENT
        );
        assert_eq!(nvml.nvmlDeviceGetHandleByIndex_v2(0, &mut dev), SUCCESS);
        assert!(!dev.is_null());

        let foreign = 0x1234usize as nvmlDevice_t;
        let mut minor = 0;
        assert_eq!(
            nvml.nvmlDeviceGetMinorNumber(foreign, &mut minor),
            INVALID_ARGUMENT
        );
        assert_eq!(
            nvml.nvmlDeviceGetMinorNumber(ptr::null_mut(), &mut minor),
            INVALID_ARGUMENT
        );
        assert_eq!(
            nvml.nvmlDeviceGetMinorNumber(dev, ptr::null_mut()),
            INVALID_ARGUMENT
        );

        // Strings: the buffer must hold the text and its NUL.
        let uuid = "GPU-4a1c2e8f-61b0-3d27-9a4e-0c5f7b1d2e01";
        let mut buf = [0 as c_char; 96];
        assert_eq!(
            nvml.nvmlDeviceGetUUID(dev, buf.as_mut_ptr(), uuid.len() as u32),
            INSUFFICIENT_SIZE
        );
        assert_eq!(
            nvml.nvmlDeviceGetUUID(dev, ptr::null_mut(), 96),
            INVALID_ARGUMENT
        );
        assert_eq!(
            nvml.nvmlDeviceGetUUID(dev, buf.as_mut_ptr(), uuid.len() as u32 + 1),
            SUCCESS
        );
        assert_eq!(CStr::from_ptr(buf.as_ptr()).to_str().unwrap(), uuid);
        assert_eq!(
            nvml.nvmlDeviceGetHandleByUUID(ptr::null(), &mut dev),
            INVALID_ARGUMENT
        );
        assert_eq!(
            nvml.nvmlDeviceGetHandleByUUID(c"GPU-nope".as_ptr(), &mut dev),
            NOT_FOUND
        );
        assert_eq!(
            nvml.nvmlDeviceGetHandleByPciBusId_v2(c"0000:47:00.0".as_ptr(), &mut dev),
            SUCCESS
        );
        let mut index = 0;
        assert_eq!(nvml.nvmlDeviceGetIndex(dev, &mut index), SUCCESS);
        assert_eq!(index, 2);

        // Instance arrays: a capacity given in *count is respected.
        let mut gpu7: nvmlDevice_t = ptr::null_mut();
        assert_eq!(nvml.nvmlDeviceGetHandleByIndex_v2(7, &mut gpu7), SUCCESS);
        let mut gis: [nvmlGpuInstance_t; 2] = [ptr::null_mut(); 2];
        let mut n = 1;
        // 2g.10gb (id 14) has one instance on GPU 7; 1g.5gb (19) one too.
        assert_eq!(
            nvml.nvmlDeviceGetGpuInstances(gpu7, 14, gis.as_mut_ptr(), &mut n),
            SUCCESS
        );
        assert_eq!(n, 1);
        assert_eq!(
            nvml.nvmlDeviceGetGpuInstances(gpu7, 14, ptr::null_mut(), &mut n),
            INVALID_ARGUMENT
        );
        let mut cis = [ptr::null_mut(); 1];
        let mut n = 1;
        // The 2g.10gb instance holds two 1-slice compute instances: one slot is too few.
        assert_eq!(
            nvml.nvmlGpuInstanceGetComputeInstances(gis[0], 0, cis.as_mut_ptr(), &mut n),
            INSUFFICIENT_SIZE
        );
        assert_eq!(n, 2);
        // A compute-instance handle is not a GPU-instance handle.
        assert_eq!(nvml.nvmlGpuInstanceDestroy(cis[0].cast()), INVALID_ARGUMENT);
        assert_eq!(
            nvml.nvmlGpuInstanceDestroy(foreign.cast()),
            INVALID_ARGUMENT
        );
        assert_eq!(nvml.nvmlEventSetFree(foreign.cast()), INVALID_ARGUMENT);

        // Reference counting: two inits need two shutdowns.
        assert_eq!(nvml.nvmlShutdown(), SUCCESS);
        assert_eq!(nvml.nvmlDeviceGetCount_v2(&mut count), SUCCESS);
        assert_eq!(nvml.nvmlShutdown(), SUCCESS);
        assert_eq!(nvml.nvmlDeviceGetCount_v2(&mut count), UNINITIALIZED);
        assert_eq!(nvml.nvmlShutdown(), UNINITIALIZED);
    }
}
