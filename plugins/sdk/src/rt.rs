//! The glue `kubedev_policy!` calls; not part of the API: the bump
//! allocator, and the bodies of the `kubedev_alloc` and `kubedev_select` exports.
#![allow(unsafe_code)]

use core::alloc::{GlobalAlloc, Layout};
use core::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use alloc::vec::Vec;

use crate::decision::Decision;
use crate::input::Input;

const PAGE: usize = 65536;

unsafe extern "C" {
    /// Set by the linker: where the heap starts, after the stack and the data.
    static __heap_base: u8;
}

/// A bump allocator: every call starts from the module's initial memory, so memory is never
/// reused except when the newest block is freed or grown.
#[derive(Debug)]
pub struct BumpAllocator {
    next: AtomicUsize,
    end: AtomicUsize,
}

impl BumpAllocator {
    /// An allocator that starts at the linker's heap base.
    pub const fn new() -> Self {
        BumpAllocator {
            next: AtomicUsize::new(0),
            end: AtomicUsize::new(0),
        }
    }

    /// Makes sure memory reaches `upto`; false when it cannot grow.
    fn reserve(&self, upto: usize) -> bool {
        let mut end = self.end.load(Relaxed);
        if end == 0 {
            end = core::arch::wasm32::memory_size(0) * PAGE;
        }
        if upto > end {
            let pages = (upto - end).div_ceil(PAGE);
            if core::arch::wasm32::memory_grow(0, pages) == usize::MAX {
                return false;
            }
            end += pages * PAGE;
        }
        self.end.store(end, Relaxed);
        true
    }
}

impl Default for BumpAllocator {
    fn default() -> Self {
        Self::new()
    }
}

// SAFETY: blocks never overlap (`next` only moves forward, except back to the start of
// the newest block when it is freed), are aligned as asked, and lie within memory that
// `reserve` made sure exists. A policy instance runs on one thread.
unsafe impl GlobalAlloc for BumpAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let mut next = self.next.load(Relaxed);
        if next == 0 {
            // SAFETY: only the address of the linker symbol is taken.
            next = core::ptr::addr_of!(__heap_base) as usize;
        }
        let start = (next + layout.align() - 1) & !(layout.align() - 1);
        let Some(new_next) = start.checked_add(layout.size()) else {
            return core::ptr::null_mut();
        };
        if !self.reserve(new_next) {
            return core::ptr::null_mut();
        }
        self.next.store(new_next, Relaxed);
        start as *mut u8
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if ptr as usize + layout.size() == self.next.load(Relaxed) {
            self.next.store(ptr as usize, Relaxed);
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if ptr as usize + layout.size() == self.next.load(Relaxed) {
            // The newest block grows (or shrinks) in place.
            let Some(new_next) = (ptr as usize).checked_add(new_size) else {
                return core::ptr::null_mut();
            };
            if !self.reserve(new_next) {
                return core::ptr::null_mut();
            }
            self.next.store(new_next, Relaxed);
            return ptr;
        }
        // SAFETY: the new layout is valid (same alignment, size checked by the caller).
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        // SAFETY: as `GlobalAlloc::realloc`'s default: copy into a new block.
        unsafe {
            let new = self.alloc(new_layout);
            if !new.is_null() {
                core::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
            }
            new
        }
    }
}

/// `kubedev_alloc`: a buffer of `len` bytes for the input.
pub fn alloc(len: i32) -> i32 {
    let mut v: Vec<u8> = Vec::with_capacity(len.max(0) as usize);
    let p = v.as_mut_ptr() as usize as i32;
    core::mem::forget(v);
    p
}

/// `kubedev_select`: decode, decide, encode; the output's address and length packed.
pub fn select(ptr: i32, len: i32, policy: fn(&Input<'_>) -> Decision) -> i64 {
    // SAFETY: the host wrote `len` bytes at `ptr`, a buffer `alloc` handed out for it.
    let bytes = unsafe {
        core::slice::from_raw_parts(ptr as u32 as usize as *const u8, len as u32 as usize)
    };
    let Ok(input) = Input::decode(bytes) else {
        core::arch::wasm32::unreachable()
    };
    let out = policy(&input).encode();
    let packed = pack(&out);
    core::mem::forget(out);
    packed
}

/// The address and length of `bytes`, packed as the host reads them.
pub fn pack(bytes: &[u8]) -> i64 {
    (((bytes.as_ptr() as usize as u64) << 32) | bytes.len() as u64) as i64
}
