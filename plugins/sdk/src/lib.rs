//! Write a kubedev selection policy as a plain Rust function.
//!
//! A policy is a `no_std` crate of type `cdylib` built for `wasm32-unknown-unknown`. It
//! receives one request and its candidate devices ([`Input`]) and answers a [`Decision`]:
//! a preference order, a score per candidate, or "keep the default order", optionally
//! rejecting candidates with a reason. [`kubedev_policy!`] generates the WebAssembly
//! exports of kubedev's policy ABI (version 1, specified in the `kubedev-sandbox` crate
//! docs), a bump allocator (every call runs on a fresh instance, so nothing is ever freed)
//! and a panic handler (a panic is a trap; the host then keeps its default order).
//!
//! ```ignore
//! #![cfg_attr(target_arch = "wasm32", no_std)]
//! extern crate alloc;
//! use kubedev_policy_sdk::{Decision, Input, kubedev_policy, pack_by};
//!
//! fn numa_first(input: &Input<'_>) -> Decision {
//!     Decision::order(pack_by(input, |c| c.numa_node()))
//! }
//!
//! kubedev_policy!(numa_first);
//! ```
//!
//! Build with `cargo build --release --target wasm32-unknown-unknown` and link with a small
//! stack (`-C link-arg=-zstack-size=65536`), as `plugins/.cargo/config.toml` does.
#![no_std]

extern crate alloc;

use alloc::collections::BTreeMap;
use alloc::string::String;
use alloc::vec::Vec;

/// The ABI version this SDK speaks.
pub const ABI_VERSION: u32 = 1;
/// Longest rejection reason the host accepts, bytes; longer reasons are cut.
pub const MAX_REASON_BYTES: usize = 256;

const INPUT_MAGIC: &[u8; 4] = b"KDPI";
const OUTPUT_MAGIC: &[u8; 4] = b"KDPO";

/// Why an input message could not be read (a host/SDK version mismatch; never expected).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeError(pub &'static str);

#[derive(Clone, Copy)]
struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or(DecodeError("input ends early"))?;
        let s = &self.buf[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn i64(&mut self) -> Result<i64, DecodeError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(i64::from_le_bytes(a))
    }
    fn bytes(&mut self) -> Result<&'a [u8], DecodeError> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    fn str(&mut self) -> Result<&'a str, DecodeError> {
        core::str::from_utf8(self.bytes()?).map_err(|_| DecodeError("a string is not UTF-8"))
    }
    fn skip_str(&mut self) -> Result<(), DecodeError> {
        self.bytes().map(|_| ())
    }
    /// Skips `count` items with `skip`, returning the bytes they span.
    fn section(
        &mut self,
        skip: fn(&mut Reader<'a>) -> Result<(), DecodeError>,
    ) -> Result<Section<'a>, DecodeError> {
        let count = self.u32()?;
        let start = self.at;
        for _ in 0..count {
            skip(self)?;
        }
        Ok(Section {
            bytes: &self.buf[start..self.at],
            count,
        })
    }
}

/// A list of encoded items, read on demand.
#[derive(Clone, Copy, Debug)]
struct Section<'a> {
    bytes: &'a [u8],
    count: u32,
}

impl<'a> Section<'a> {
    fn reader(&self) -> Reader<'a> {
        Reader {
            buf: self.bytes,
            at: 0,
        }
    }
}

fn skip_attribute(r: &mut Reader<'_>) -> Result<(), DecodeError> {
    r.skip_str()?;
    match r.u8()? {
        TAG_INT => r.take(8).map(|_| ()),
        TAG_BOOL => r.take(1).map(|_| ()),
        TAG_STRING | TAG_VERSION => r.skip_str(),
        _ => Err(DecodeError("unknown attribute tag")),
    }
}

fn skip_capacity(r: &mut Reader<'_>) -> Result<(), DecodeError> {
    r.skip_str()?;
    r.take(8)?;
    r.skip_str()
}

fn skip_counter(r: &mut Reader<'_>) -> Result<(), DecodeError> {
    r.skip_str()?;
    r.take(8).map(|_| ())
}

fn skip_counter_set(r: &mut Reader<'_>) -> Result<(), DecodeError> {
    r.skip_str()?;
    r.u32()?;
    r.section(skip_counter).map(|_| ())
}

fn skip_constraint(r: &mut Reader<'_>) -> Result<(), DecodeError> {
    r.u8()?;
    r.skip_str()
}

const TAG_INT: u8 = 0;
const TAG_BOOL: u8 = 1;
const TAG_STRING: u8 = 2;
const TAG_VERSION: u8 = 3;

/// One request and its candidates, read in place from the host's message.
#[derive(Debug)]
pub struct Input<'a> {
    claim: &'a str,
    request: &'a str,
    count: u32,
    constraints: Section<'a>,
    candidates: Vec<Candidate<'a>>,
}

impl<'a> Input<'a> {
    /// Reads an input message.
    pub fn decode(bytes: &'a [u8]) -> Result<Input<'a>, DecodeError> {
        let mut r = Reader { buf: bytes, at: 0 };
        if r.take(4)? != INPUT_MAGIC {
            return Err(DecodeError("not an input message"));
        }
        if r.u32()? != ABI_VERSION {
            return Err(DecodeError("input is another ABI version"));
        }
        let claim = r.str()?;
        let request = r.str()?;
        let count = r.u32()?;
        let constraints = r.section(skip_constraint)?;
        let n = r.u32()?;
        let mut candidates = Vec::with_capacity(n as usize);
        for index in 0..n {
            let driver = r.str()?;
            let pool = r.str()?;
            let name = r.str()?;
            let flags = r.u8()?;
            let health = r.u8()?;
            let numa = r.i64()?;
            let attributes = r.section(skip_attribute)?;
            let capacity = r.section(skip_capacity)?;
            let counters = r.section(skip_counter_set)?;
            candidates.push(Candidate {
                index,
                driver,
                pool,
                name,
                flags,
                health,
                numa,
                attributes,
                capacity,
                counters,
            });
        }
        if r.at != bytes.len() {
            return Err(DecodeError("bytes after the input message"));
        }
        Ok(Input {
            claim,
            request,
            count,
            constraints,
            candidates,
        })
    }

    /// The claim, as `namespace/name`.
    pub fn claim(&self) -> &'a str {
        self.claim
    }

    /// `request` or `request/subrequest`.
    pub fn request(&self) -> &'a str {
        self.request
    }

    /// How many devices the request wants.
    pub fn count(&self) -> usize {
        self.count as usize
    }

    /// The candidates, in the allocator's default order.
    pub fn candidates(&self) -> &[Candidate<'a>] {
        &self.candidates
    }

    /// Number of candidates.
    pub fn len(&self) -> usize {
        self.candidates.len()
    }

    /// True when there are no candidates.
    pub fn is_empty(&self) -> bool {
        self.candidates.is_empty()
    }

    /// The claim constraints in force for this request.
    pub fn constraints(&self) -> impl Iterator<Item = Constraint<'a>> + use<'a> {
        let mut r = self.constraints.reader();
        (0..self.constraints.count).filter_map(move |_| {
            let kind = match r.u8().ok()? {
                0 => ConstraintKind::MatchAttribute,
                _ => ConstraintKind::DistinctAttribute,
            };
            Some(Constraint {
                kind,
                attribute: r.str().ok()?,
            })
        })
    }
}

/// The kind of a claim constraint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConstraintKind {
    /// All devices must have the same value of the attribute.
    MatchAttribute,
    /// All devices must have different values.
    DistinctAttribute,
}

/// A claim constraint in force for the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Constraint<'a> {
    /// What it demands.
    pub kind: ConstraintKind,
    /// The qualified attribute name.
    pub attribute: &'a str,
}

/// Device health as the host knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    /// Not known.
    Unknown,
    /// Healthy.
    Healthy,
    /// Unhealthy.
    Unhealthy,
}

/// A typed attribute value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Value<'a> {
    /// An integer.
    Int(i64),
    /// A boolean.
    Bool(bool),
    /// A string.
    String(&'a str),
    /// A semantic version, as written.
    Version(&'a str),
}

/// A capacity of a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity<'a> {
    /// The name as published.
    pub name: &'a str,
    /// Kubernetes' `Value()`: rounded away from zero, saturated.
    pub value: i64,
    /// The quantity as written (`"80Gi"`).
    pub text: &'a str,
}

/// A shared counter set (a partitionable device's parent) a candidate draws from.
#[derive(Debug, Clone, Copy)]
pub struct CounterSet<'a> {
    /// The counter set name, unique in the pool.
    pub name: &'a str,
    /// How many already-allocated devices draw from the same set.
    pub in_use: u32,
    counters: Section<'a>,
}

impl<'a> CounterSet<'a> {
    /// The counters the candidate consumes from this set: name and `Value()`.
    pub fn counters(&self) -> impl Iterator<Item = (&'a str, i64)> + use<'a> {
        let mut r = self.counters.reader();
        (0..self.counters.count).filter_map(move |_| Some((r.str().ok()?, r.i64().ok()?)))
    }
}

/// One candidate device.
#[derive(Debug, Clone, Copy)]
pub struct Candidate<'a> {
    index: u32,
    driver: &'a str,
    pool: &'a str,
    name: &'a str,
    flags: u8,
    health: u8,
    numa: i64,
    attributes: Section<'a>,
    capacity: Section<'a>,
    counters: Section<'a>,
}

/// `key` (as published) names `query`: equal, or one is the bare form of the other in the
/// driver's domain.
fn name_matches(key: &str, query: &str, driver: &str) -> bool {
    fn qualified(full: &str, driver: &str, bare: &str) -> bool {
        full.len() == driver.len() + 1 + bare.len()
            && full.starts_with(driver)
            && full.as_bytes()[driver.len()] == b'/'
            && full.ends_with(bare)
    }
    key == query
        || (!key.contains('/') && qualified(query, driver, key))
        || (!query.contains('/') && qualified(key, driver, query))
}

impl<'a> Candidate<'a> {
    /// Position in the input (what [`Decision`]s refer to).
    pub fn index(&self) -> u32 {
        self.index
    }

    /// Device name.
    pub fn name(&self) -> &'a str {
        self.name
    }

    /// Driver name.
    pub fn driver(&self) -> &'a str {
        self.driver
    }

    /// Pool name.
    pub fn pool(&self) -> &'a str {
        self.pool
    }

    /// True when the device is already allocated (the allocator will skip it).
    pub fn in_use(&self) -> bool {
        self.flags & 1 != 0
    }

    /// Health.
    pub fn health(&self) -> Health {
        match self.health {
            1 => Health::Healthy,
            2 => Health::Unhealthy,
            _ => Health::Unknown,
        }
    }

    /// Free to allocate: not in use and not unhealthy.
    pub fn is_free(&self) -> bool {
        !self.in_use() && self.health() != Health::Unhealthy
    }

    /// NUMA node, when known.
    pub fn numa_node(&self) -> Option<i64> {
        (self.flags & 2 != 0).then_some(self.numa)
    }

    /// Every attribute: name as published and value.
    pub fn attributes(&self) -> impl Iterator<Item = (&'a str, Value<'a>)> + use<'a> {
        let mut r = self.attributes.reader();
        (0..self.attributes.count).filter_map(move |_| {
            let name = r.str().ok()?;
            let value = match r.u8().ok()? {
                TAG_INT => Value::Int(r.i64().ok()?),
                TAG_BOOL => Value::Bool(r.u8().ok()? != 0),
                TAG_STRING => Value::String(r.str().ok()?),
                _ => Value::Version(r.str().ok()?),
            };
            Some((name, value))
        })
    }

    /// The attribute `name`: qualified (`domain/id`) or bare (the driver's domain).
    pub fn attribute(&self, name: &str) -> Option<Value<'a>> {
        let driver = self.driver;
        self.attributes()
            .find(|(k, _)| name_matches(k, name, driver))
            .map(|(_, v)| v)
    }

    /// An integer attribute.
    pub fn int(&self, name: &str) -> Option<i64> {
        match self.attribute(name)? {
            Value::Int(i) => Some(i),
            _ => None,
        }
    }

    /// A string attribute.
    pub fn string(&self, name: &str) -> Option<&'a str> {
        match self.attribute(name)? {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// A boolean attribute.
    pub fn bool(&self, name: &str) -> Option<bool> {
        match self.attribute(name)? {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// Every capacity.
    pub fn capacities(&self) -> impl Iterator<Item = Capacity<'a>> + use<'a> {
        let mut r = self.capacity.reader();
        (0..self.capacity.count).filter_map(move |_| {
            Some(Capacity {
                name: r.str().ok()?,
                value: r.i64().ok()?,
                text: r.str().ok()?,
            })
        })
    }

    /// The capacity `name` (qualified or bare, as for attributes).
    pub fn capacity(&self, name: &str) -> Option<Capacity<'a>> {
        let driver = self.driver;
        self.capacities()
            .find(|c| name_matches(c.name, name, driver))
    }

    /// The shared counter sets the device draws from.
    pub fn counter_sets(&self) -> impl Iterator<Item = CounterSet<'a>> + use<'a> {
        let mut r = self.counters.reader();
        (0..self.counters.count).filter_map(move |_| {
            let name = r.str().ok()?;
            let in_use = r.u32().ok()?;
            let counters = r.section(skip_counter).ok()?;
            Some(CounterSet {
                name,
                in_use,
                counters,
            })
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    Keep,
    Order(Vec<u32>),
    Scores(Vec<i64>),
}

/// A policy's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    kind: Kind,
    rejections: Vec<(u32, String)>,
}

impl Decision {
    /// No preference: keep the allocator's order.
    pub fn keep() -> Self {
        Decision {
            kind: Kind::Keep,
            rejections: Vec::new(),
        }
    }

    /// Candidate indices, most preferred first. Candidates left out follow in input order;
    /// an index must not repeat.
    pub fn order(order: Vec<u32>) -> Self {
        Decision {
            kind: Kind::Order(order),
            rejections: Vec::new(),
        }
    }

    /// One score per candidate, in input order; higher is preferred, ties keep input order.
    pub fn scores(scores: Vec<i64>) -> Self {
        Decision {
            kind: Kind::Scores(scores),
            rejections: Vec::new(),
        }
    }

    /// Rejects a candidate, with a reason (cut to [`MAX_REASON_BYTES`]).
    pub fn reject(mut self, index: u32, reason: &str) -> Self {
        let mut cut = reason.len().min(MAX_REASON_BYTES);
        while !reason.is_char_boundary(cut) {
            cut -= 1;
        }
        self.rejections.push((index, String::from(&reason[..cut])));
        self
    }

    /// The output message.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        out.extend_from_slice(OUTPUT_MAGIC);
        out.extend_from_slice(&ABI_VERSION.to_le_bytes());
        match &self.kind {
            Kind::Keep => out.push(0),
            Kind::Order(o) => {
                out.push(1);
                out.extend_from_slice(&(o.len() as u32).to_le_bytes());
                for i in o {
                    out.extend_from_slice(&i.to_le_bytes());
                }
            }
            Kind::Scores(s) => {
                out.push(2);
                out.extend_from_slice(&(s.len() as u32).to_le_bytes());
                for v in s {
                    out.extend_from_slice(&v.to_le_bytes());
                }
            }
        }
        out.extend_from_slice(&(self.rejections.len() as u32).to_le_bytes());
        for (i, reason) in &self.rejections {
            out.extend_from_slice(&i.to_le_bytes());
            out.extend_from_slice(&(reason.len() as u32).to_le_bytes());
            out.extend_from_slice(reason.as_bytes());
        }
        out
    }
}

/// Packs the request onto as few groups as possible (NUMA nodes, link groups, switches):
/// first the smallest group that can hold every device still needed (keeping larger groups
/// whole), else the group with the most free devices, and so on. Within a group the input
/// order stays. Candidates without a group come after the grouped ones, and candidates that
/// are not free (in use or unhealthy) come last. Returns a full order.
pub fn pack_by<'a, K: Ord>(
    input: &Input<'a>,
    key: impl Fn(&Candidate<'a>) -> Option<K>,
) -> Vec<u32> {
    let mut groups: BTreeMap<K, Vec<u32>> = BTreeMap::new();
    let mut ungrouped = Vec::new();
    let mut busy = Vec::new();
    for c in input.candidates() {
        if !c.is_free() {
            busy.push(c.index());
        } else if let Some(k) = key(c) {
            groups.entry(k).or_default().push(c.index());
        } else {
            ungrouped.push(c.index());
        }
    }
    let mut groups: Vec<Vec<u32>> = groups.into_values().collect();
    let mut order = Vec::with_capacity(input.len());
    let mut need = input.count();
    while !groups.is_empty() {
        let best = (0..groups.len())
            .min_by_key(|&i| {
                let free = groups[i].len();
                let fits = free >= need;
                (!fits, if fits { free } else { usize::MAX - free })
            })
            .unwrap_or(0);
        let g = groups.remove(best);
        need = need.saturating_sub(g.len());
        order.extend(g);
    }
    order.extend(ungrouped);
    order.extend(busy);
    order
}

/// Spreads the request across groups (PCIe roots, switches, hosts): one candidate from
/// each group in turn, groups with fewer devices in use first, then groups with more free
/// devices, then by key. Candidates without a group come after, those not free last.
/// Returns a full order.
pub fn spread_by<'a, K: Ord>(
    input: &Input<'a>,
    key: impl Fn(&Candidate<'a>) -> Option<K>,
) -> Vec<u32> {
    // key → (devices in use, free candidates)
    let mut groups: BTreeMap<K, (usize, Vec<u32>)> = BTreeMap::new();
    let mut ungrouped = Vec::new();
    let mut busy = Vec::new();
    for c in input.candidates() {
        let k = key(c);
        if !c.is_free() {
            if let Some(k) = k {
                groups.entry(k).or_default().0 += 1;
            }
            busy.push(c.index());
        } else if let Some(k) = k {
            groups.entry(k).or_default().1.push(c.index());
        } else {
            ungrouped.push(c.index());
        }
    }
    let mut groups: Vec<(usize, Vec<u32>)> = groups.into_values().collect();
    // Stable sort: equal groups keep key order.
    groups.sort_by_key(|(used, free)| (*used, usize::MAX - free.len()));
    let mut order = Vec::with_capacity(input.len());
    let rounds = groups.iter().map(|(_, f)| f.len()).max().unwrap_or(0);
    for round in 0..rounds {
        for (_, free) in &groups {
            if let Some(&i) = free.get(round) {
                order.push(i);
            }
        }
    }
    order.extend(ungrouped);
    order.extend(busy);
    order
}

/// Writes a line to the host's log (rate-limited there; at most a few lines per call are
/// kept). Does nothing outside WebAssembly.
pub fn log(message: &str) {
    #[cfg(target_arch = "wasm32")]
    {
        #[link(wasm_import_module = "kubedev")]
        #[allow(unsafe_code)]
        unsafe extern "C" {
            #[link_name = "log"]
            fn kubedev_log(ptr: *const u8, len: usize);
        }
        // SAFETY: the host only reads `len` bytes at `ptr`, which are the message's.
        #[allow(unsafe_code)]
        unsafe {
            kubedev_log(message.as_ptr(), message.len())
        }
    }
    #[cfg(not(target_arch = "wasm32"))]
    let _ = message;
}

#[cfg(target_arch = "wasm32")]
pub use rt::BumpAllocator;

/// The glue [`kubedev_policy!`] calls; not part of the API.
#[cfg(target_arch = "wasm32")]
#[doc(hidden)]
pub mod rt {
    #![allow(unsafe_code)]

    use core::alloc::{GlobalAlloc, Layout};
    use core::sync::atomic::{AtomicUsize, Ordering::Relaxed};

    use alloc::vec::Vec;

    use crate::{Decision, Input};

    const PAGE: usize = 65536;

    unsafe extern "C" {
        /// Set by the linker: where the heap starts, after the stack and the data.
        static __heap_base: u8;
    }

    /// A bump allocator: every call runs on a fresh instance, so memory is never reused
    /// except when the newest block is freed or grown.
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
        let packed = ((out.as_ptr() as usize as u64) << 32) | out.len() as u64;
        core::mem::forget(out);
        packed as i64
    }
}

/// Generates the policy exports for `fn(&Input<'_>) -> Decision`, plus the allocator and
/// panic handler a `no_std` WebAssembly module needs. Only on `wasm32`; elsewhere it
/// expands to nothing, so the crate still builds and tests on the host.
#[macro_export]
macro_rules! kubedev_policy {
    ($policy:path) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            #[global_allocator]
            static ALLOCATOR: $crate::BumpAllocator = $crate::BumpAllocator::new();

            #[panic_handler]
            fn panic(_: &::core::panic::PanicInfo<'_>) -> ! {
                ::core::arch::wasm32::unreachable()
            }

            #[allow(unsafe_code)]
            #[unsafe(no_mangle)]
            pub extern "C" fn kubedev_policy_abi_version() -> i32 {
                $crate::ABI_VERSION as i32
            }

            #[allow(unsafe_code)]
            #[unsafe(no_mangle)]
            pub extern "C" fn kubedev_alloc(len: i32) -> i32 {
                $crate::rt::alloc(len)
            }

            #[allow(unsafe_code)]
            #[unsafe(no_mangle)]
            pub extern "C" fn kubedev_select(ptr: i32, len: i32) -> i64 {
                $crate::rt::select(ptr, len, $policy)
            }
        };
    };
}
