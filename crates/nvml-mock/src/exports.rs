//! The exported NVML C functions.
//!
//! Every function runs its body under `catch_unwind`, so no panic crosses the FFI boundary, and
//! checks every pointer it is given: null or misaligned out-pointers are
//! `NVML_ERROR_INVALID_ARGUMENT`. The C contract of NVML (a non-null pointer points to writable
//! memory of the declared type; buffers hold the stated length) is what makes the writes sound.
//!
//! This module holds the shared machinery (the global mock, the panic guard, pointer writers);
//! the functions themselves are in one submodule per NVML function family.
#![allow(unsafe_code)]
// The names are NVML's.
#![allow(non_snake_case)]

mod compute_instance;
mod device;
mod events;
mod gpu_instance;
mod lookup;
mod mig;
mod system;
mod topology;

use parking_lot::{Mutex, MutexGuard};
use std::ffi::{CStr, c_char, c_uint};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;

use nvml_wrapper_sys::bindings as sys;

use crate::codes::*;
use crate::machine::{Gpu, Machine};
use crate::state::{Handle, Mock, Nv};

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
    GLOBAL.lock()
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
