//! The exported NVML C functions.
//!
//! Every function runs its body under `catch_unwind`, so no panic crosses the FFI boundary, and
//! checks every pointer it is given: null or misaligned out-pointers are
//! `NVML_ERROR_INVALID_ARGUMENT`. The C contract of NVML (a non-null pointer points to writable
//! memory of the declared type; buffers hold the stated length) is what makes the writes sound.
#![allow(unsafe_code)]
// The names are NVML's.
#![allow(non_snake_case)]

use std::ffi::{CStr, c_char, c_int, c_uint, c_ulong, c_ulonglong};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use nvml_wrapper_sys::bindings as sys;

use crate::codes::*;
use crate::machine::{Gpu, Machine};
use crate::state::{Handle, LinkEnd, Mock, Nv, WaitOutcome, ci_placements};

type Ret = sys::nvmlReturn_t;

const MIB: u64 = 1024 * 1024;
/// PCI device id reported for NVSwitch link ends (NVSwitch gen 2).
const NVSWITCH_DEVICE_ID: u32 = 0x1af1_10de;

struct Global {
    refcount: u32,
    mock: Option<Mock>,
}

static GLOBAL: Mutex<Global> = Mutex::new(Global {
    refcount: 0,
    mock: None,
});

fn lock() -> MutexGuard<'static, Global> {
    GLOBAL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runs an exported function's body; panics become `NVML_ERROR_UNKNOWN`.
fn guard(f: impl FnOnce() -> Nv<()>) -> Ret {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => ERROR_UNKNOWN,
    }
}

/// Runs `f` on the initialised mock after reading the control file.
fn with<T>(f: impl FnOnce(&mut Mock) -> Nv<T>) -> Nv<T> {
    let mut global = lock();
    let mock = global.mock.as_mut().ok_or(ERROR_UNINITIALIZED)?;
    mock.poll_control();
    f(mock)
}

/// Writes `value` through an out-pointer.
///
/// # Safety
/// A non-null `ptr` must be valid for a write of `T` (NVML's contract for out-parameters).
unsafe fn put<T>(ptr: *mut T, value: T) -> Nv<()> {
    if ptr.is_null() || !ptr.is_aligned() {
        return Err(ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: non-null and aligned; validity for writes is the caller's contract.
    unsafe { ptr.write(value) };
    Ok(())
}

/// Copies `text` and a NUL into a caller buffer of `len` bytes.
///
/// # Safety
/// A non-null `buf` must be valid for writes of `len` bytes.
unsafe fn put_str(buf: *mut c_char, len: c_uint, text: &str) -> Nv<()> {
    if buf.is_null() {
        return Err(ERROR_INVALID_ARGUMENT);
    }
    if text.len() + 1 > len as usize {
        return Err(ERROR_INSUFFICIENT_SIZE);
    }
    // SAFETY: the buffer holds `len` >= text.len() + 1 bytes by the caller's contract.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr().cast::<c_char>(), buf, text.len());
        buf.add(text.len()).write(0);
    }
    Ok(())
}

/// Writes a list into a caller array whose capacity is `*count` when non-zero on input, else
/// `needed_capacity` (NVML's documented requirement for such arrays); sets `*count`.
///
/// # Safety
/// `count` must be valid for reads and writes when non-null; a non-null `array` must hold the
/// capacity described above.
unsafe fn put_list<T: Copy>(
    array: *mut T,
    count: *mut c_uint,
    items: &[T],
    needed_capacity: usize,
) -> Nv<()> {
    if count.is_null() || !count.is_aligned() {
        return Err(ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: non-null, aligned; validity is the caller's contract.
    let given = unsafe { count.read() } as usize;
    let capacity = if given == 0 { needed_capacity } else { given };
    if array.is_null() || !array.is_aligned() {
        return Err(ERROR_INVALID_ARGUMENT);
    }
    if items.len() > capacity {
        // SAFETY: as above.
        unsafe { count.write(items.len() as c_uint) };
        return Err(ERROR_INSUFFICIENT_SIZE);
    }
    // SAFETY: the array holds `capacity` >= items.len() elements by the caller's contract.
    unsafe {
        std::ptr::copy_nonoverlapping(items.as_ptr(), array, items.len());
        count.write(items.len() as c_uint);
    }
    Ok(())
}

/// Writes a count-or-fill list: `array` null → only the count (`INSUFFICIENT_SIZE` when
/// non-zero); else `*count` on input is the capacity.
///
/// # Safety
/// As [`put_list`], with `*count` the array's capacity.
unsafe fn put_sized_list<T: Copy>(
    array: *mut T,
    count: *mut c_uint,
    items: &[T],
    null_is_success: bool,
) -> Nv<()> {
    if count.is_null() || !count.is_aligned() {
        return Err(ERROR_INVALID_ARGUMENT);
    }
    if array.is_null() {
        // SAFETY: non-null, aligned; validity is the caller's contract.
        unsafe { count.write(items.len() as c_uint) };
        return if items.is_empty() || null_is_success {
            Ok(())
        } else {
            Err(ERROR_INSUFFICIENT_SIZE)
        };
    }
    // SAFETY: as above.
    let capacity = unsafe { count.read() } as usize;
    if !array.is_aligned() {
        return Err(ERROR_INVALID_ARGUMENT);
    }
    if items.len() > capacity {
        // SAFETY: as above.
        unsafe { count.write(items.len() as c_uint) };
        return Err(ERROR_INSUFFICIENT_SIZE);
    }
    // SAFETY: the array holds `capacity` >= items.len() elements by the caller's contract.
    unsafe {
        std::ptr::copy_nonoverlapping(items.as_ptr(), array, items.len());
        count.write(items.len() as c_uint);
    }
    Ok(())
}

/// Reads a NUL-terminated argument string.
///
/// # Safety
/// A non-null `ptr` must point to a NUL-terminated string.
unsafe fn read_str(ptr: *const c_char) -> Nv<String> {
    if ptr.is_null() {
        return Err(ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: NUL-terminated by the caller's contract.
    let text = unsafe { CStr::from_ptr(ptr) };
    text.to_str()
        .map(str::to_owned)
        .map_err(|_| ERROR_INVALID_ARGUMENT)
}

fn device_ptr(h: Handle) -> sys::nvmlDevice_t {
    h.encode() as sys::nvmlDevice_t
}

fn fill_c_chars<const N: usize>(dst: &mut [c_char; N], text: &str) {
    for (d, s) in dst.iter_mut().zip(text.bytes().take(N.saturating_sub(1))) {
        *d = s as c_char;
    }
}

fn pci_info(bus_id: &str, device_id: u32, subsystem_id: u32) -> sys::nvmlPciInfo_t {
    let (domain, bus, device, function) =
        crate::machine::parse_bus_id(bus_id).unwrap_or((0, 0, 0, 0));
    let mut info = sys::nvmlPciInfo_t {
        busIdLegacy: [0; 16],
        domain,
        bus,
        device,
        pciDeviceId: device_id,
        pciSubSystemId: subsystem_id,
        busId: [0; 32],
    };
    fill_c_chars(
        &mut info.busIdLegacy,
        &format!(
            "{:04X}:{bus:02X}:{device:02X}.{function:X}",
            domain & 0xffff
        ),
    );
    fill_c_chars(
        &mut info.busId,
        &format!("{domain:08X}:{bus:02X}:{device:02X}.{function:X}"),
    );
    info
}

/// The machine and control paths of this copy of the library.
fn locate_machine() -> Option<(PathBuf, Option<PathBuf>)> {
    if let Some(sidecar) = crate::locate::own_sidecar() {
        return Some(sidecar);
    }
    let machine = std::env::var_os("NVML_MOCK_MACHINE")?;
    let control = std::env::var_os("NVML_MOCK_CONTROL").map(PathBuf::from);
    Some((PathBuf::from(machine), control))
}

fn init() -> Nv<()> {
    let mut global = lock();
    if global.refcount == 0 {
        let (path, control) = locate_machine().ok_or(ERROR_DRIVER_NOT_LOADED)?;
        let machine = Machine::load(&path).map_err(|e| {
            eprintln!("nvml-mock: {e}");
            ERROR_UNKNOWN
        })?;
        if let Some(code) = machine.init_error {
            return Err(code);
        }
        let control = control.or_else(|| std::env::var_os("NVML_MOCK_CONTROL").map(PathBuf::from));
        let mock = Mock::new(machine, control).map_err(|e| {
            eprintln!("nvml-mock: invalid machine {}: {e}", path.display());
            ERROR_UNKNOWN
        })?;
        global.mock = Some(mock);
    }
    global.refcount += 1;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Init, shutdown, errors, system

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

// ---------------------------------------------------------------------------------------------
// Device lookup

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

// ---------------------------------------------------------------------------------------------
// Device properties

/// What a property query is asked about: a whole GPU, or a MIG device of it.
enum Target<'a> {
    Gpu(u32, &'a Gpu),
    Mig {
        gpu: u32,
        parent: &'a Gpu,
        gi: u32,
        ci: u32,
    },
}

/// Resolves a device handle for a property query; lost GPUs answer GPU_IS_LOST.
fn target(m: &Mock, raw: sys::nvmlDevice_t) -> Nv<Target<'_>> {
    match m.device(raw as usize)? {
        Handle::Gpu(g) => Ok(Target::Gpu(g, m.gpu(g)?.0)),
        Handle::Mig { gpu, gi, ci } => Ok(Target::Mig {
            gpu,
            parent: m.gpu(gpu)?.0,
            gi,
            ci,
        }),
        _ => Err(ERROR_INVALID_ARGUMENT),
    }
}

/// Resolves a whole-GPU handle (not lost); MIG device handles give NOT_SUPPORTED.
fn gpu_only(m: &Mock, raw: sys::nvmlDevice_t) -> Nv<(u32, &Gpu)> {
    match target(m, raw)? {
        Target::Gpu(g, gpu) => Ok((g, gpu)),
        Target::Mig { .. } => Err(ERROR_NOT_SUPPORTED),
    }
}

fn mig_profile_name(m: &Mock, gpu: u32, gi: u32, ci: u32) -> Nv<(String, u64)> {
    let mig = m.mig(gpu)?;
    let g = mig.gis.get(&gi).ok_or(ERROR_INVALID_ARGUMENT)?;
    let c = g.cis.get(&ci).ok_or(ERROR_INVALID_ARGUMENT)?;
    let p = &mig.table.gpu_instance_profiles[g.profile];
    let name = if c.slices < p.slice_count {
        format!("{}c.{}", c.slices, p.name)
    } else {
        p.name.clone()
    };
    Ok((name, p.memory_mib))
}

/// # Safety
/// `uuid` must be valid for `length` bytes when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetUUID(
    device: sys::nvmlDevice_t,
    uuid: *mut c_char,
    length: c_uint,
) -> Ret {
    guard(|| {
        let text = with(|m| match target(m, device)? {
            Target::Gpu(_, gpu) => Ok(gpu.uuid.clone()),
            Target::Mig { gpu, gi, ci, .. } => Ok(m.ci(gpu, gi, ci)?.uuid.clone()),
        })?;
        // SAFETY: buffer contract forwarded from the caller.
        unsafe { put_str(uuid, length, &text) }
    })
}

/// # Safety
/// `name` must be valid for `length` bytes when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetName(
    device: sys::nvmlDevice_t,
    name: *mut c_char,
    length: c_uint,
) -> Ret {
    guard(|| {
        let text = with(|m| match target(m, device)? {
            Target::Gpu(_, gpu) => Ok(gpu.name.clone()),
            Target::Mig {
                gpu,
                parent,
                gi,
                ci,
            } => {
                let (profile, _) = mig_profile_name(m, gpu, gi, ci)?;
                Ok(format!("{} MIG {profile}", parent.name))
            }
        })?;
        // SAFETY: buffer contract forwarded from the caller.
        unsafe { put_str(name, length, &text) }
    })
}

/// Index of a whole GPU; answers even when the GPU is lost.
///
/// # Safety
/// `index` must be valid for a write when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetIndex(device: sys::nvmlDevice_t, index: *mut c_uint) -> Ret {
    guard(|| {
        let g = with(|m| m.whole_gpu(device as usize, ERROR_NOT_SUPPORTED))?;
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(index, g) }
    })
}

/// # Safety
/// `minor` must be valid for a write when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetMinorNumber(
    device: sys::nvmlDevice_t,
    minor: *mut c_uint,
) -> Ret {
    guard(|| {
        let v = with(|m| Ok(gpu_only(m, device)?.1.minor))?;
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(minor, v) }
    })
}

fn parent_of<'a>(t: &Target<'a>) -> &'a Gpu {
    match t {
        Target::Gpu(_, gpu) => gpu,
        Target::Mig { parent, .. } => parent,
    }
}

/// # Safety
/// `brand` must be valid for a write when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetBrand(
    device: sys::nvmlDevice_t,
    brand: *mut sys::nvmlBrandType_t,
) -> Ret {
    guard(|| {
        let v = with(|m| Ok(parent_of(&target(m, device)?).brand.nvml_value()))?;
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(brand, v) }
    })
}

/// # Safety
/// `arch` must be valid for a write when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetArchitecture(
    device: sys::nvmlDevice_t,
    arch: *mut sys::nvmlDeviceArchitecture_t,
) -> Ret {
    guard(|| {
        let v = with(|m| Ok(parent_of(&target(m, device)?).architecture.nvml_value()))?;
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(arch, v) }
    })
}

/// # Safety
/// `major` and `minor` must be valid for writes when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    device: sys::nvmlDevice_t,
    major: *mut c_int,
    minor: *mut c_int,
) -> Ret {
    guard(|| {
        let (a, b) = with(|m| {
            let cc = &parent_of(&target(m, device)?).compute_capability;
            crate::machine::parse_compute_capability(cc).ok_or(ERROR_UNKNOWN)
        })?;
        if minor.is_null() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(major, a) }?;
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(minor, b) }
    })
}

/// (total, reserved, used) in bytes.
fn memory(m: &Mock, device: sys::nvmlDevice_t) -> Nv<(u64, u64, u64)> {
    match target(m, device)? {
        Target::Gpu(_, gpu) => Ok((
            gpu.memory_mib * MIB,
            gpu.memory_reserved_mib * MIB,
            gpu.memory_used_mib * MIB,
        )),
        Target::Mig { gpu, gi, ci, .. } => {
            let (_, mib) = mig_profile_name(m, gpu, gi, ci)?;
            Ok((mib * MIB, 0, 0))
        }
    }
}

/// # Safety
/// `out` must be valid for a write when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: sys::nvmlDevice_t,
    out: *mut sys::nvmlMemory_t,
) -> Ret {
    guard(|| {
        let (total, reserved, used) = with(|m| memory(m, device))?;
        let info = sys::nvmlMemory_t {
            total,
            free: total - reserved - used,
            used: reserved + used,
        };
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(out, info) }
    })
}

/// # Safety
/// `out` must be valid for reads and writes of `nvmlMemory_v2_t` when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: sys::nvmlDevice_t,
    out: *mut sys::nvmlMemory_v2_t,
) -> Ret {
    guard(|| {
        if out.is_null() || !out.is_aligned() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: non-null and aligned; the caller's struct is readable by contract.
        let version = unsafe { (*out).version };
        if version >> 24 != 2 {
            return Err(ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        let (total, reserved, used) = with(|m| memory(m, device))?;
        let info = sys::nvmlMemory_v2_t {
            version,
            total,
            reserved,
            free: total - reserved - used,
            used,
        };
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(out, info) }
    })
}

/// # Safety
/// `pci` must be valid for a write when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    device: sys::nvmlDevice_t,
    pci: *mut sys::nvmlPciInfo_t,
) -> Ret {
    guard(|| {
        let info = with(|m| {
            let (_, gpu) = gpu_only(m, device)?;
            Ok(pci_info(
                &gpu.pci.bus_id,
                gpu.pci.device_id,
                gpu.pci.subsystem_id,
            ))
        })?;
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(pci, info) }
    })
}

/// # Safety
/// `pci` must be valid for a write when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetPciInfo_v2(
    device: sys::nvmlDevice_t,
    pci: *mut sys::nvmlPciInfo_t,
) -> Ret {
    // SAFETY: same contract.
    unsafe { nvmlDeviceGetPciInfo_v3(device, pci) }
}

/// # Safety
/// `node` must be valid for a write when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetNumaNodeId(device: sys::nvmlDevice_t, node: *mut c_uint) -> Ret {
    guard(|| {
        let v = with(|m| gpu_only(m, device)?.1.numa_node.ok_or(ERROR_NOT_SUPPORTED))?;
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(node, v) }
    })
}

/// Writes a bitmask of `bits` into `size` words, dropping bits beyond them.
///
/// # Safety
/// A non-null `set` must be valid for writes of `size` words.
unsafe fn put_mask(set: *mut c_ulong, size: c_uint, bits: &[u32]) -> Nv<()> {
    if set.is_null() || !set.is_aligned() || size == 0 {
        return Err(ERROR_INVALID_ARGUMENT);
    }
    let word_bits = c_ulong::BITS;
    let mut words = vec![0 as c_ulong; size as usize];
    for &b in bits {
        if let Some(w) = words.get_mut((b / word_bits) as usize) {
            *w |= 1 << (b % word_bits);
        }
    }
    // SAFETY: the array holds `size` words by the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(words.as_ptr(), set, words.len()) };
    Ok(())
}

/// # Safety
/// `node_set` must be valid for writes of `size` words when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetMemoryAffinity(
    device: sys::nvmlDevice_t,
    size: c_uint,
    node_set: *mut c_ulong,
    scope: sys::nvmlAffinityScope_t,
) -> Ret {
    guard(|| {
        let node = with(|m| gpu_only(m, device)?.1.numa_node.ok_or(ERROR_NOT_SUPPORTED))?;
        if scope > sys::NVML_AFFINITY_SCOPE_SOCKET {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: array contract forwarded from the caller.
        unsafe { put_mask(node_set, size, &[node]) }
    })
}

fn cpus_of(m: &Mock, device: sys::nvmlDevice_t) -> Nv<Vec<u32>> {
    let node = gpu_only(m, device)?
        .1
        .numa_node
        .ok_or(ERROR_NOT_SUPPORTED)?;
    m.numa_cpus(node).ok_or(ERROR_NOT_SUPPORTED)
}

/// # Safety
/// `cpu_set` must be valid for writes of `size` words when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetCpuAffinityWithinScope(
    device: sys::nvmlDevice_t,
    size: c_uint,
    cpu_set: *mut c_ulong,
    scope: sys::nvmlAffinityScope_t,
) -> Ret {
    guard(|| {
        let cpus = with(|m| cpus_of(m, device))?;
        if scope > sys::NVML_AFFINITY_SCOPE_SOCKET {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: array contract forwarded from the caller.
        unsafe { put_mask(cpu_set, size, &cpus) }
    })
}

/// # Safety
/// `cpu_set` must be valid for writes of `size` words when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetCpuAffinity(
    device: sys::nvmlDevice_t,
    size: c_uint,
    cpu_set: *mut c_ulong,
) -> Ret {
    guard(|| {
        let cpus = with(|m| cpus_of(m, device))?;
        // SAFETY: array contract forwarded from the caller.
        unsafe { put_mask(cpu_set, size, &cpus) }
    })
}

/// # Safety
/// `out` must be valid for a write when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetAttributes_v2(
    device: sys::nvmlDevice_t,
    out: *mut sys::nvmlDeviceAttributes_t,
) -> Ret {
    guard(|| {
        let attrs = with(|m| match target(m, device)? {
            Target::Gpu(g, gpu) => {
                let full = m.gpus[g as usize].mig.as_ref().and_then(|mig| {
                    mig.table
                        .gpu_instance_profiles
                        .iter()
                        .find(|p| p.slice_count == mig.table.compute_slices)
                });
                Ok(sys::nvmlDeviceAttributes_t {
                    multiprocessorCount: full.map_or(0, |p| p.multiprocessor_count),
                    sharedCopyEngineCount: full.map_or(0, |p| p.copy_engine_count),
                    sharedDecoderCount: full.map_or(0, |p| p.decoder_count),
                    sharedEncoderCount: full.map_or(0, |p| p.encoder_count),
                    sharedJpegCount: full.map_or(0, |p| p.jpeg_count),
                    sharedOfaCount: full.map_or(0, |p| p.ofa_count),
                    gpuInstanceSliceCount: full.map_or(0, |p| p.slice_count),
                    computeInstanceSliceCount: full.map_or(0, |p| p.slice_count),
                    memorySizeMB: gpu.memory_mib,
                })
            }
            Target::Mig { gpu, gi, ci, .. } => {
                let mig = m.mig(gpu)?;
                let g = mig.gis.get(&gi).ok_or(ERROR_INVALID_ARGUMENT)?;
                let c = g.cis.get(&ci).ok_or(ERROR_INVALID_ARGUMENT)?;
                let p = &mig.table.gpu_instance_profiles[g.profile];
                Ok(sys::nvmlDeviceAttributes_t {
                    multiprocessorCount: p.multiprocessor_count * c.slices / p.slice_count,
                    sharedCopyEngineCount: p.copy_engine_count,
                    sharedDecoderCount: p.decoder_count,
                    sharedEncoderCount: p.encoder_count,
                    sharedJpegCount: p.jpeg_count,
                    sharedOfaCount: p.ofa_count,
                    gpuInstanceSliceCount: p.slice_count,
                    computeInstanceSliceCount: c.slices,
                    memorySizeMB: p.memory_mib,
                })
            }
        })?;
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(out, attrs) }
    })
}

// ---------------------------------------------------------------------------------------------
// MIG mode and MIG devices

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

// ---------------------------------------------------------------------------------------------
// GPU instances

fn gi_profile_by_enum(
    m: &Mock,
    device: sys::nvmlDevice_t,
    profile: c_uint,
) -> Nv<crate::machine::GpuInstanceProfile> {
    let (g, _) = gpu_only(m, device)?;
    let mig = m.mig(g)?;
    if profile >= sys::NVML_GPU_INSTANCE_PROFILE_COUNT {
        return Err(ERROR_INVALID_ARGUMENT);
    }
    mig.table
        .gpu_instance_profiles
        .iter()
        .find(|p| p.profile == profile)
        .cloned()
        .ok_or(ERROR_NOT_SUPPORTED)
}

/// # Safety
/// `info` must be valid for a write when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfo(
    device: sys::nvmlDevice_t,
    profile: c_uint,
    info: *mut sys::nvmlGpuInstanceProfileInfo_t,
) -> Ret {
    guard(|| {
        let p = with(|m| gi_profile_by_enum(m, device, profile))?;
        let v = sys::nvmlGpuInstanceProfileInfo_t {
            id: p.id,
            isP2pSupported: c_uint::from(p.p2p),
            sliceCount: p.slice_count,
            instanceCount: p.instance_count,
            multiprocessorCount: p.multiprocessor_count,
            copyEngineCount: p.copy_engine_count,
            decoderCount: p.decoder_count,
            encoderCount: p.encoder_count,
            jpegCount: p.jpeg_count,
            ofaCount: p.ofa_count,
            memorySizeMB: p.memory_mib,
        };
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(info, v) }
    })
}

/// Accepts `nvmlGpuInstanceProfileInfo_v2_t` and `_v3_t`, told apart by their version field.
///
/// # Safety
/// `info` must point to a struct of the version its first field names, when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfoV(
    device: sys::nvmlDevice_t,
    profile: c_uint,
    info: *mut sys::nvmlGpuInstanceProfileInfo_v2_t,
) -> Ret {
    guard(|| {
        if info.is_null() || !info.is_aligned() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: non-null, aligned, readable by contract; every version starts with `version`.
        let version = unsafe { (*info).version };
        let p = with(|m| gi_profile_by_enum(m, device, profile))?;
        let mut name = [0 as c_char; 96];
        fill_c_chars(&mut name, &format!("MIG {}", p.name));
        match version >> 24 {
            2 => {
                let v = sys::nvmlGpuInstanceProfileInfo_v2_t {
                    version,
                    id: p.id,
                    isP2pSupported: c_uint::from(p.p2p),
                    sliceCount: p.slice_count,
                    instanceCount: p.instance_count,
                    multiprocessorCount: p.multiprocessor_count,
                    copyEngineCount: p.copy_engine_count,
                    decoderCount: p.decoder_count,
                    encoderCount: p.encoder_count,
                    jpegCount: p.jpeg_count,
                    ofaCount: p.ofa_count,
                    memorySizeMB: p.memory_mib,
                    name,
                };
                // SAFETY: the caller passed a v2 struct.
                unsafe { put(info, v) }
            }
            3 => {
                let v = sys::nvmlGpuInstanceProfileInfo_v3_t {
                    version,
                    id: p.id,
                    sliceCount: p.slice_count,
                    instanceCount: p.instance_count,
                    multiprocessorCount: p.multiprocessor_count,
                    copyEngineCount: p.copy_engine_count,
                    decoderCount: p.decoder_count,
                    encoderCount: p.encoder_count,
                    jpegCount: p.jpeg_count,
                    ofaCount: p.ofa_count,
                    memorySizeMB: p.memory_mib,
                    name,
                    capabilities: if p.p2p {
                        sys::NVML_GPU_INSTANCE_PROFILE_CAPS_P2P
                    } else {
                        0
                    },
                };
                // SAFETY: the caller passed a v3 struct (its version says so).
                unsafe { put(info.cast::<sys::nvmlGpuInstanceProfileInfo_v3_t>(), v) }
            }
            _ => Err(ERROR_ARGUMENT_VERSION_MISMATCH),
        }
    })
}

/// # Safety
/// `count` must be valid for reads and writes; `placements` (if non-null) holds `*count` entries.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetGpuInstancePossiblePlacements_v2(
    device: sys::nvmlDevice_t,
    profile_id: c_uint,
    placements: *mut sys::nvmlGpuInstancePlacement_t,
    count: *mut c_uint,
) -> Ret {
    guard(|| {
        let list = with(|m| {
            let (g, _) = gpu_only(m, device)?;
            let mig = m.mig(g)?;
            let p = mig
                .table
                .gpu_instance_profiles
                .iter()
                .find(|p| p.id == profile_id)
                .ok_or(ERROR_INVALID_ARGUMENT)?;
            Ok(p.placements
                .starts
                .iter()
                .map(|&start| sys::nvmlGpuInstancePlacement_t {
                    start,
                    size: p.placements.size,
                })
                .collect::<Vec<_>>())
        })?;
        // SAFETY: array contract forwarded from the caller.
        unsafe { put_sized_list(placements, count, &list, true) }
    })
}

/// # Safety
/// `count` must be valid for a write when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetGpuInstanceRemainingCapacity(
    device: sys::nvmlDevice_t,
    profile_id: c_uint,
    count: *mut c_uint,
) -> Ret {
    guard(|| {
        let n = with(|m| {
            let (g, _) = gpu_only(m, device)?;
            m.mig(g)?.remaining(profile_id)
        })?;
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(count, n) }
    })
}

fn create_gi(
    device: sys::nvmlDevice_t,
    profile_id: c_uint,
    placement: Option<(u32, u32)>,
) -> Nv<sys::nvmlGpuInstance_t> {
    with(|m| {
        let (g, _) = gpu_only(m, device)?;
        let (_, mig) = m.mig_mut(g)?;
        let gi = mig.create_gi(profile_id, placement, None)?;
        Ok(Handle::Gi { gpu: g, gi }.encode() as sys::nvmlGpuInstance_t)
    })
}

/// # Safety
/// `out` must be valid for a write when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceCreateGpuInstance(
    device: sys::nvmlDevice_t,
    profile_id: c_uint,
    out: *mut sys::nvmlGpuInstance_t,
) -> Ret {
    guard(|| {
        if out.is_null() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        let h = create_gi(device, profile_id, None)?;
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(out, h) }
    })
}

/// # Safety
/// `placement` must be readable and `out` writable, when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceCreateGpuInstanceWithPlacement(
    device: sys::nvmlDevice_t,
    profile_id: c_uint,
    placement: *const sys::nvmlGpuInstancePlacement_t,
    out: *mut sys::nvmlGpuInstance_t,
) -> Ret {
    guard(|| {
        if out.is_null() || placement.is_null() || !placement.is_aligned() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: non-null, aligned, readable by the caller's contract.
        let p = unsafe { placement.read() };
        let h = create_gi(device, profile_id, Some((p.start, p.size)))?;
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(out, h) }
    })
}

/// `*count` on input: the array's capacity, or 0 for "the profile's instanceCount" (NVML's rule).
///
/// # Safety
/// `count` must be valid for reads and writes; `out` must hold the capacity described above.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetGpuInstances(
    device: sys::nvmlDevice_t,
    profile_id: c_uint,
    out: *mut sys::nvmlGpuInstance_t,
    count: *mut c_uint,
) -> Ret {
    guard(|| {
        let (list, capacity) = with(|m| {
            let (g, _) = gpu_only(m, device)?;
            let mig = m.mig(g)?;
            if !mig.enabled {
                return Err(ERROR_NOT_SUPPORTED);
            }
            let (index, p) = mig
                .table
                .gpu_instance_profiles
                .iter()
                .enumerate()
                .find(|(_, p)| p.id == profile_id)
                .ok_or(ERROR_INVALID_ARGUMENT)?;
            let list: Vec<sys::nvmlGpuInstance_t> = mig
                .gis
                .values()
                .filter(|gi| gi.profile == index)
                .map(|gi| Handle::Gi { gpu: g, gi: gi.id }.encode() as sys::nvmlGpuInstance_t)
                .collect();
            Ok((list, p.instance_count as usize))
        })?;
        // SAFETY: array contract forwarded from the caller.
        unsafe { put_list(out, count, &list, capacity) }
    })
}

/// # Safety
/// `out` must be valid for a write when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetGpuInstanceById(
    device: sys::nvmlDevice_t,
    id: c_uint,
    out: *mut sys::nvmlGpuInstance_t,
) -> Ret {
    guard(|| {
        let h = with(|m| {
            let (g, _) = gpu_only(m, device)?;
            let mig = m.mig(g)?;
            if !mig.enabled {
                return Err(ERROR_NOT_SUPPORTED);
            }
            mig.gis.get(&id).ok_or(ERROR_NOT_FOUND)?;
            Ok(Handle::Gi { gpu: g, gi: id }.encode() as sys::nvmlGpuInstance_t)
        })?;
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(out, h) }
    })
}

/// # Safety
/// `info` must be valid for a write when non-null.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlGpuInstanceGetInfo(
    gi: sys::nvmlGpuInstance_t,
    info: *mut sys::nvmlGpuInstanceInfo_t,
) -> Ret {
    guard(|| {
        let v = with(|m| {
            let (g, id) = m.gi_handle(gi as usize)?;
            let mig = m.mig(g)?;
            let inst = mig.gis.get(&id).ok_or(ERROR_INVALID_ARGUMENT)?;
            Ok(sys::nvmlGpuInstanceInfo_t {
                device: device_ptr(Handle::Gpu(g)),
                id,
                profileId: mig.table.gpu_instance_profiles[inst.profile].id,
                placement: sys::nvmlGpuInstancePlacement_t {
                    start: inst.start,
                    size: inst.size,
                },
            })
        })?;
        // SAFETY: out-pointer contract forwarded from the caller.
        unsafe { put(info, v) }
    })
}

/// Destroys a GPU instance; one with compute instances → NVML_ERROR_IN_USE.
#[unsafe(no_mangle)]
extern "C" fn nvmlGpuInstanceDestroy(gi: sys::nvmlGpuInstance_t) -> Ret {
    guard(|| {
        with(|m| {
            let (g, id) = m.gi_handle(gi as usize)?;
            let (_, mig) = m.mig_mut(g)?;
            let inst = mig.gis.get(&id).ok_or(ERROR_INVALID_ARGUMENT)?;
            if !inst.cis.is_empty() {
                return Err(ERROR_IN_USE);
            }
            mig.gis.remove(&id);
            Ok(())
        })
    })
}

// ---------------------------------------------------------------------------------------------
// Compute instances

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

// ---------------------------------------------------------------------------------------------
// Topology and NVLink

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

// ---------------------------------------------------------------------------------------------
// Events

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
