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
//! A policy crate starts with `#![cfg_attr(target_arch = "wasm32", no_std)]`, so it also
//! builds (and unit-tests) on the host, where the macro expands to nothing:
//!
//! ```
//! use kubedev_policy_sdk::{Decision, Input, kubedev_policy, pack_by};
//!
//! fn numa_first(input: &Input<'_>) -> Decision {
//!     Decision::order(pack_by(input, |c| c.numa_node()))
//! }
//!
//! // Attribute lookups in a loop: resolve the name once.
//! fn by_island(input: &Input<'_>) -> Decision {
//!     let island = input.key("linkGroup");
//!     Decision::order(pack_by(input, |c| c.get(&island)))
//! }
//!
//! kubedev_policy!(numa_first);
//! ```
//!
//! Build with `cargo build --release --target wasm32-unknown-unknown` and link with a small
//! stack (`-C link-arg=-zstack-size=16384`), as `plugins/.cargo/config.toml` does: a policy
//! instance then needs a single 64 KiB page of memory, which keeps every call cheap.
#![no_std]

extern crate alloc;

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

const HEADER: usize = 64;
const CANDIDATE: usize = 64;
const CONSTRAINT: usize = 8;
const ATTRIBUTE: usize = 16;
const CAPACITY: usize = 24;
const COUNTER_SET: usize = 16;
const COUNTER: usize = 16;
const NAME: usize = 8;

const TAG_INT: u8 = 0;
const TAG_BOOL: u8 = 1;
const TAG_STRING: u8 = 2;

/// True when every byte is below 0x80, checked eight bytes at a time.
fn is_ascii(bytes: &[u8]) -> bool {
    let mut words = bytes.chunks_exact(8);
    words.by_ref().all(|w| {
        u64::from_ne_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]) & 0x8080_8080_8080_8080
            == 0
    }) && words.remainder().iter().all(|b| *b < 0x80)
}

/// UTF-8 text of host bytes. Names and values are nearly always ASCII: checking that is a
/// few operations per word, where full validation costs a few hundred per string.
#[inline]
fn text(bytes: &[u8]) -> &str {
    if is_ascii(bytes) {
        #[allow(unsafe_code)]
        // SAFETY: every byte is below 0x80, so the bytes are ASCII, which is valid UTF-8.
        unsafe {
            core::str::from_utf8_unchecked(bytes)
        }
    } else {
        core::str::from_utf8(bytes).unwrap_or("")
    }
}

/// The message, read in place. Reads out of bounds panic (a trap: the host keeps its
/// default order); the host never sends such a message.
#[derive(Clone, Copy)]
struct Msg<'a> {
    b: &'a [u8],
    strings: usize,
    names: usize,
    names_len: u32,
    /// The whole string region is ASCII, so every span is valid UTF-8 without a check.
    ascii: bool,
}

impl core::fmt::Debug for Msg<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Msg").field("bytes", &self.b.len()).finish()
    }
}

impl<'a> Msg<'a> {
    #[inline(always)]
    fn u32(&self, at: usize) -> u32 {
        let mut a = [0u8; 4];
        a.copy_from_slice(&self.b[at..at + 4]);
        u32::from_le_bytes(a)
    }
    #[inline(always)]
    fn i64(&self, at: usize) -> i64 {
        let mut a = [0u8; 8];
        a.copy_from_slice(&self.b[at..at + 8]);
        i64::from_le_bytes(a)
    }
    #[inline(always)]
    fn usize(&self, at: usize) -> usize {
        self.u32(at) as usize
    }
    /// The bytes of the span at `at`.
    #[inline]
    fn bytes(&self, at: usize) -> &'a [u8] {
        let off = self.strings + self.usize(at);
        &self.b[off..off + self.usize(at + 4)]
    }
    fn str(&self, at: usize) -> &'a str {
        let bytes = self.bytes(at);
        if self.ascii {
            #[allow(unsafe_code)]
            // SAFETY: the string region is all ASCII (checked once in `Input::decode`), so
            // every slice of it is valid UTF-8.
            unsafe {
                core::str::from_utf8_unchecked(bytes)
            }
        } else {
            text(bytes)
        }
    }
    /// The text of name `id`.
    fn name(&self, id: u32) -> &'a [u8] {
        if id >= self.names_len {
            return &[];
        }
        self.bytes(self.names + id as usize * NAME)
    }
    /// The id of the name whose text is `text`.
    fn find(&self, text: &[u8]) -> Option<u32> {
        (0..self.names_len).find(|&id| self.name(id) == text)
    }
    /// The id of `driver/bare`.
    fn find_qualified(&self, driver: &[u8], bare: &[u8]) -> Option<u32> {
        (0..self.names_len).find(|&id| {
            let n = self.name(id);
            n.len() == driver.len() + 1 + bare.len()
                && n.starts_with(driver)
                && n[driver.len()] == b'/'
                && n.ends_with(bare)
        })
    }
}

/// One request and its candidates, read in place from the host's message.
#[derive(Debug, Clone, Copy)]
pub struct Input<'a> {
    m: Msg<'a>,
    count: u32,
    constraints: usize,
    constraints_len: usize,
    candidates: usize,
    len: usize,
}

impl<'a> Input<'a> {
    /// Reads an input message (checks its header; records are read when used).
    pub fn decode(bytes: &'a [u8]) -> Result<Input<'a>, DecodeError> {
        if bytes.len() < HEADER || &bytes[0..4] != INPUT_MAGIC {
            return Err(DecodeError("not an input message"));
        }
        let mut m = Msg {
            b: bytes,
            strings: 0,
            names: 0,
            names_len: 0,
            ascii: false,
        };
        if m.u32(4) != ABI_VERSION {
            return Err(DecodeError("input is another ABI version"));
        }
        let (strings, strings_len) = (m.usize(56), m.usize(60));
        let (names, names_len) = (m.usize(32), m.usize(36));
        let (constraints, constraints_len) = (m.usize(40), m.usize(44));
        let (candidates, len) = (m.usize(48), m.usize(52));
        let fits = |off: usize, n: usize, size: usize| {
            n.checked_mul(size)
                .and_then(|s| s.checked_add(off))
                .is_some_and(|end| end <= bytes.len())
        };
        if !fits(strings, strings_len, 1)
            || !fits(names, names_len, NAME)
            || !fits(constraints, constraints_len, CONSTRAINT)
            || !fits(candidates, len, CANDIDATE)
        {
            return Err(DecodeError("a region lies outside the message"));
        }
        m.strings = strings;
        m.names = names;
        m.names_len = names_len as u32;
        m.ascii = is_ascii(&bytes[strings..strings + strings_len]);
        Ok(Input {
            m,
            count: m.u32(8),
            constraints,
            constraints_len,
            candidates,
            len,
        })
    }

    /// The claim, as `namespace/name`.
    pub fn claim(&self) -> &'a str {
        self.m.str(16)
    }

    /// `request` or `request/subrequest`.
    pub fn request(&self) -> &'a str {
        self.m.str(24)
    }

    /// How many devices the request wants.
    pub fn count(&self) -> usize {
        self.count as usize
    }

    /// Number of candidates.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when there are no candidates.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Candidate `index` (panics when out of range).
    pub fn candidate(&self, index: usize) -> Candidate<'a> {
        assert!(index < self.len, "candidate index out of range");
        Candidate {
            m: self.m,
            rec: self.candidates + index * CANDIDATE,
            index: index as u32,
        }
    }

    /// The candidates, in the allocator's default order.
    pub fn candidates(&self) -> impl ExactSizeIterator<Item = Candidate<'a>> + use<'a> {
        let this = *self;
        (0..self.len).map(move |i| this.candidate(i))
    }

    /// The claim constraints in force for this request.
    pub fn constraints(&self) -> impl Iterator<Item = Constraint<'a>> + use<'a> {
        let (m, base) = (self.m, self.constraints);
        (0..self.constraints_len).map(move |i| {
            let at = base + i * CONSTRAINT;
            Constraint {
                kind: if m.u32(at + 4) == 0 {
                    ConstraintKind::MatchAttribute
                } else {
                    ConstraintKind::DistinctAttribute
                },
                attribute: text(m.name(m.u32(at))),
            }
        })
    }

    /// Resolves an attribute or capacity name once, for fast lookups with
    /// [`Candidate::get`] and [`Candidate::capacity_of`]. A qualified name (`domain/id`) is
    /// taken as it is; a bare name means the id in each candidate's driver's domain.
    pub fn key(&self, name: &str) -> Key {
        let name = name.as_bytes();
        if name.contains(&b'/') {
            return Key {
                ids: self
                    .m
                    .find(name)
                    .map(|id| (ANY_DRIVER, id))
                    .into_iter()
                    .collect(),
            };
        }
        let mut ids: Vec<(u32, u32)> = Vec::new();
        for c in self.candidates() {
            let d = c.driver_id();
            if ids.iter().any(|&(x, _)| x == d) {
                continue;
            }
            // A driver without this name still gets an entry, so it is looked up once.
            let id = self
                .m
                .find_qualified(self.m.name(d), name)
                .unwrap_or(NO_NAME);
            ids.push((d, id));
        }
        Key { ids }
    }
}

const ANY_DRIVER: u32 = u32::MAX;
const NO_NAME: u32 = u32::MAX;

/// A resolved attribute or capacity name; see [`Input::key`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Key {
    ids: Vec<(u32, u32)>,
}

impl Key {
    /// False when no candidate has an attribute or capacity of this name (the message
    /// carries only the names it uses), so a policy can skip its work at once.
    pub fn is_known(&self) -> bool {
        self.ids.iter().any(|&(_, id)| id != NO_NAME)
    }

    #[inline(always)]
    fn id_for(&self, driver: u32) -> Option<u32> {
        // Nearly always one entry: one driver, or a qualified name.
        let id = match self.ids.as_slice() {
            [(d, id)] if *d == driver || *d == ANY_DRIVER => *id,
            ids => ids
                .iter()
                .find(|&&(d, _)| d == driver || d == ANY_DRIVER)
                .map_or(NO_NAME, |&(_, id)| id),
        };
        (id != NO_NAME).then_some(id)
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
///
/// Equality and hashing are by content, made cheap for grouping: the host stores an equal
/// string value of consecutive candidates once, so two values read from the same place
/// compare equal without comparing their bytes, and a string hashes only its length and
/// its first and last eight bytes.
#[derive(Debug, Clone, Copy, Eq, PartialOrd, Ord)]
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

/// Content equality with a shortcut for the same bytes in the message.
#[inline]
fn same_text(a: &str, b: &str) -> bool {
    a.len() == b.len() && (core::ptr::eq(a.as_ptr(), b.as_ptr()) || a == b)
}

impl PartialEq for Value<'_> {
    #[inline]
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Value::Int(a), Value::Int(b)) => a == b,
            (Value::Bool(a), Value::Bool(b)) => a == b,
            (Value::String(a), Value::String(b)) | (Value::Version(a), Value::Version(b)) => {
                same_text(a, b)
            }
            _ => false,
        }
    }
}

/// The first and last (up to) eight bytes of `s`, as words.
#[inline]
fn ends(s: &[u8]) -> (u64, u64) {
    let n = s.len();
    if n >= 8 {
        let mut first = [0u8; 8];
        let mut last = [0u8; 8];
        first.copy_from_slice(&s[..8]);
        last.copy_from_slice(&s[n - 8..]);
        return (u64::from_le_bytes(first), u64::from_le_bytes(last));
    }
    let mut w = 0u64;
    for (i, &b) in s.iter().enumerate() {
        w |= u64::from(b) << (8 * i);
    }
    (w, w)
}

impl core::hash::Hash for Value<'_> {
    fn hash<H: core::hash::Hasher>(&self, state: &mut H) {
        match self {
            Value::Int(i) => {
                state.write_u8(0);
                state.write_i64(*i);
            }
            Value::Bool(b) => state.write_u8(if *b { 2 } else { 1 }),
            Value::String(s) | Value::Version(s) => {
                let (first, last) = ends(s.as_bytes());
                state.write_u8(if matches!(self, Value::String(_)) {
                    3
                } else {
                    4
                });
                state.write_usize(s.len());
                state.write_u64(first);
                state.write_u64(last);
            }
        }
    }
}

/// A capacity of a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity<'a> {
    /// The qualified name.
    pub name: &'a str,
    /// Kubernetes' `Value()`: rounded away from zero, saturated.
    pub value: i64,
    /// The quantity as written (`"80Gi"`).
    pub text: &'a str,
}

/// A shared counter set (a partitionable device's parent) a candidate draws from.
#[derive(Debug, Clone, Copy)]
pub struct CounterSet<'a> {
    m: Msg<'a>,
    rec: usize,
}

impl<'a> CounterSet<'a> {
    /// The counter set name, unique in the pool.
    pub fn name(&self) -> &'a str {
        text(self.m.name(self.m.u32(self.rec)))
    }

    /// How many already-allocated devices draw from the same set.
    pub fn in_use(&self) -> u32 {
        self.m.u32(self.rec + 4)
    }

    /// The counters the candidate consumes from this set: name and `Value()`.
    pub fn counters(&self) -> impl Iterator<Item = (&'a str, i64)> + use<'a> {
        let m = self.m;
        let (off, n) = (m.usize(self.rec + 8), m.usize(self.rec + 12));
        (0..n).map(move |i| {
            let at = off + i * COUNTER;
            (text(m.name(m.u32(at))), m.i64(at + 8))
        })
    }

    /// The sum of the counters consumed (useful when a set has one counter, e.g. memory).
    pub fn total(&self) -> i128 {
        let m = self.m;
        let (off, n) = (m.usize(self.rec + 8), m.usize(self.rec + 12));
        (0..n)
            .map(|i| i128::from(m.i64(off + i * COUNTER + 8)))
            .sum()
    }
}

/// One candidate device.
#[derive(Debug, Clone, Copy)]
pub struct Candidate<'a> {
    m: Msg<'a>,
    rec: usize,
    index: u32,
}

impl<'a> Candidate<'a> {
    /// Position in the input (what [`Decision`]s refer to).
    pub fn index(&self) -> u32 {
        self.index
    }

    /// Device name.
    pub fn name(&self) -> &'a str {
        self.m.str(self.rec)
    }

    #[inline(always)]
    fn driver_id(&self) -> u32 {
        self.m.u32(self.rec + 8)
    }

    /// Driver name.
    pub fn driver(&self) -> &'a str {
        text(self.m.name(self.driver_id()))
    }

    /// Pool name.
    pub fn pool(&self) -> &'a str {
        text(self.m.name(self.m.u32(self.rec + 12)))
    }

    /// True when the device is already allocated (the allocator will skip it).
    pub fn in_use(&self) -> bool {
        self.m.b[self.rec + 16] & 1 != 0
    }

    /// Health.
    pub fn health(&self) -> Health {
        match self.m.b[self.rec + 17] {
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
        (self.m.b[self.rec + 16] & 2 != 0).then(|| self.m.i64(self.rec + 24))
    }

    #[inline(always)]
    fn value(&self, at: usize) -> Value<'a> {
        match self.m.b[at + 4] {
            TAG_INT => Value::Int(self.m.i64(at + 8)),
            TAG_BOOL => Value::Bool(self.m.b[at + 8] != 0),
            TAG_STRING => Value::String(self.m.str(at + 8)),
            _ => Value::Version(self.m.str(at + 8)),
        }
    }

    /// The record named `id` in the section whose `(offset, count)` is at `at`, records of
    /// `size` bytes starting with their name.
    #[inline(always)]
    fn find(&self, at: usize, size: usize, id: u32) -> Option<usize> {
        let (off, n) = (self.m.usize(at), self.m.usize(at + 4));
        (0..n)
            .map(|i| off + i * size)
            .find(|&r| self.m.u32(r) == id)
    }

    /// The attribute named by `key`.
    #[inline(always)]
    pub fn get(&self, key: &Key) -> Option<Value<'a>> {
        let id = key.id_for(self.driver_id())?;
        let at = self.find(self.rec + 32, ATTRIBUTE, id)?;
        Some(self.value(at))
    }

    /// Every attribute: qualified name and value.
    pub fn attributes(&self) -> impl Iterator<Item = (&'a str, Value<'a>)> + use<'a> {
        let this = *self;
        let (off, n) = (this.m.usize(this.rec + 32), this.m.usize(this.rec + 36));
        (0..n).map(move |i| {
            let at = off + i * ATTRIBUTE;
            (text(this.m.name(this.m.u32(at))), this.value(at))
        })
    }

    /// The attribute `name`: qualified (`domain/id`) or bare (the driver's domain). Resolves
    /// the name on every call; use [`Input::key`] and [`Candidate::get`] in loops.
    pub fn attribute(&self, name: &str) -> Option<Value<'a>> {
        self.get(&self.key(name))
    }

    fn key(&self, name: &str) -> Key {
        let name = name.as_bytes();
        let id = if name.contains(&b'/') {
            self.m.find(name)
        } else {
            self.m.find_qualified(self.m.name(self.driver_id()), name)
        };
        Key {
            ids: id.map(|id| (ANY_DRIVER, id)).into_iter().collect(),
        }
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

    fn capacity_at(&self, at: usize) -> Capacity<'a> {
        Capacity {
            name: text(self.m.name(self.m.u32(at))),
            value: self.m.i64(at + 8),
            text: self.m.str(at + 16),
        }
    }

    /// Every capacity.
    pub fn capacities(&self) -> impl Iterator<Item = Capacity<'a>> + use<'a> {
        let this = *self;
        let (off, n) = (this.m.usize(this.rec + 40), this.m.usize(this.rec + 44));
        (0..n).map(move |i| this.capacity_at(off + i * CAPACITY))
    }

    /// The capacity named by `key`.
    pub fn capacity_of(&self, key: &Key) -> Option<Capacity<'a>> {
        let id = key.id_for(self.driver_id())?;
        let at = self.find(self.rec + 40, CAPACITY, id)?;
        Some(self.capacity_at(at))
    }

    /// The capacity `name` (qualified or bare, as for attributes).
    pub fn capacity(&self, name: &str) -> Option<Capacity<'a>> {
        self.capacity_of(&self.key(name))
    }

    /// The shared counter sets the device draws from.
    pub fn counter_sets(&self) -> impl ExactSizeIterator<Item = CounterSet<'a>> + use<'a> {
        let m = self.m;
        let (off, n) = (m.usize(self.rec + 48), m.usize(self.rec + 52));
        (0..n).map(move |i| CounterSet {
            m,
            rec: off + i * COUNTER_SET,
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
        let items = match &self.kind {
            Kind::Keep => 0,
            Kind::Order(o) => 4 + o.len() * 4,
            Kind::Scores(s) => 4 + s.len() * 8,
        };
        let reasons: usize = self.rejections.iter().map(|(_, r)| 8 + r.len()).sum();
        let mut out = Vec::with_capacity(13 + items + 4 + reasons);
        out.extend_from_slice(OUTPUT_MAGIC);
        out.extend_from_slice(&ABI_VERSION.to_le_bytes());
        // Lists are written with plain stores into space reserved once.
        fn words<const N: usize, T: Copy>(out: &mut Vec<u8>, items: &[T], bytes: fn(T) -> [u8; N]) {
            out.extend_from_slice(&(items.len() as u32).to_le_bytes());
            let start = out.len();
            out.resize(start + items.len() * N, 0);
            for (chunk, &item) in out[start..].chunks_exact_mut(N).zip(items) {
                chunk.copy_from_slice(&bytes(item));
            }
        }
        match &self.kind {
            Kind::Keep => out.push(0),
            Kind::Order(o) => {
                out.push(1);
                words(&mut out, o, u32::to_le_bytes);
            }
            Kind::Scores(s) => {
                out.push(2);
                words(&mut out, s, i64::to_le_bytes);
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

/// FNV-1a: a small, deterministic hash for grouping keys.
struct Fnv(u64);

impl core::hash::Hasher for Fnv {
    /// Eight bytes per step (keys are short strings such as PCIe roots and models).
    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for w in words.by_ref() {
            self.write_u64(u64::from_le_bytes([
                w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7],
            ]));
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            // Byte by byte: a copy of a variable length would be a call.
            let mut tail = (rest.len() as u64) << 56;
            for (i, &b) in rest.iter().enumerate() {
                tail |= u64::from(b) << (8 * i);
            }
            self.write_u64(tail);
        }
    }
    fn write_u8(&mut self, i: u8) {
        self.write_u64(u64::from(i));
    }
    fn write_u64(&mut self, i: u64) {
        self.0 = (self.0 ^ i).wrapping_mul(0x0000_0100_0000_01b3);
    }
    fn write_i64(&mut self, i: i64) {
        self.write_u64(i as u64);
    }
    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64);
    }
    fn finish(&self) -> u64 {
        // Fold the high bits down: slots are picked by the low bits.
        self.0 ^ (self.0 >> 32) ^ (self.0 >> 17)
    }
}

fn hash_of<K: core::hash::Hash>(k: &K) -> u64 {
    let mut h = Fnv(0xcbf2_9ce4_8422_2325);
    k.hash(&mut h);
    core::hash::Hasher::finish(&h)
}

const NONE: u32 = u32::MAX;

/// Candidates split by a key. Groups are numbered in order of first appearance; members
/// of a group are listed in input order.
struct Groups {
    /// Free members of each group, in input order: `members[start[g]..start[g + 1]]`.
    members: Vec<u32>,
    start: Vec<u32>,
    /// Devices of each group that are not free (in use or unhealthy).
    busy_in: Vec<u32>,
    ungrouped: Vec<u32>,
    busy: Vec<u32>,
}

impl Groups {
    fn len(&self) -> usize {
        self.busy_in.len()
    }
    fn free(&self, g: usize) -> &[u32] {
        &self.members[self.start[g] as usize..self.start[g + 1] as usize]
    }
}

fn group_by<'a, K: Eq + core::hash::Hash>(
    input: &Input<'a>,
    key: impl Fn(&Candidate<'a>) -> Option<K>,
) -> Groups {
    let n = input.len();
    // Open addressing over (hash, key) → group number.
    let cap = (n * 2).next_power_of_two().max(8);
    let mut slots: Vec<u32> = alloc::vec![NONE; cap];
    // Sized once: growing several vectors in turn would copy them (bump allocator).
    let mut keys: Vec<(u64, K)> = Vec::with_capacity(n);
    let mut group_of: Vec<u32> = Vec::with_capacity(n);
    let mut free_count: Vec<u32> = Vec::with_capacity(n);
    let mut busy_in: Vec<u32> = Vec::with_capacity(n);
    let mut ungrouped = Vec::with_capacity(n);
    let mut busy = Vec::with_capacity(n);
    for c in input.candidates() {
        let free = c.is_free();
        if !free {
            busy.push(c.index());
        }
        let Some(k) = key(&c) else {
            if free {
                ungrouped.push(c.index());
            }
            group_of.push(NONE);
            continue;
        };
        let h = hash_of(&k);
        let mut i = (h as usize) & (cap - 1);
        let g = loop {
            match slots[i] {
                NONE => {
                    let g = keys.len() as u32;
                    slots[i] = g;
                    keys.push((h, k));
                    free_count.push(0);
                    busy_in.push(0);
                    break g;
                }
                g if keys[g as usize].0 == h && keys[g as usize].1 == k => break g,
                _ => i = (i + 1) & (cap - 1),
            }
        };
        if free {
            free_count[g as usize] += 1;
            group_of.push(g);
        } else {
            busy_in[g as usize] += 1;
            group_of.push(NONE);
        }
    }
    // Counting sort of the free grouped candidates by group, stable.
    let mut start = Vec::with_capacity(free_count.len() + 1);
    let mut total = 0u32;
    for &f in &free_count {
        start.push(total);
        total += f;
    }
    start.push(total);
    let mut next = start.clone();
    let mut members = alloc::vec![0u32; total as usize];
    for (i, &g) in group_of.iter().enumerate() {
        if g != NONE {
            members[next[g as usize] as usize] = i as u32;
            next[g as usize] += 1;
        }
    }
    Groups {
        members,
        start,
        busy_in,
        ungrouped,
        busy,
    }
}

/// Packs the request onto as few groups as possible (NUMA nodes, link groups, switches):
/// first the smallest group that can hold every device still needed (keeping larger groups
/// whole), else the group with the most free devices, and so on; ties go to the group seen
/// first. Within a group the input order stays. Candidates without a group come after the
/// grouped ones, and candidates that are not free (in use or unhealthy) come last. Returns
/// a full order.
pub fn pack_by<'a, K: Eq + core::hash::Hash>(
    input: &Input<'a>,
    key: impl Fn(&Candidate<'a>) -> Option<K>,
) -> Vec<u32> {
    let groups = group_by(input, key);
    let mut order = Vec::with_capacity(input.len());
    let mut left: Vec<usize> = (0..groups.len()).collect();
    let mut need = input.count();
    while !left.is_empty() {
        let mut best = 0;
        let mut best_rank = (true, usize::MAX);
        for (i, &g) in left.iter().enumerate() {
            let free = groups.free(g).len();
            let fits = free >= need;
            let rank = (!fits, if fits { free } else { usize::MAX - free });
            if rank < best_rank {
                best_rank = rank;
                best = i;
            }
        }
        let g = left.remove(best);
        let members = groups.free(g);
        need = need.saturating_sub(members.len());
        order.extend_from_slice(members);
    }
    order.extend_from_slice(&groups.ungrouped);
    order.extend_from_slice(&groups.busy);
    order
}

/// Spreads the request across groups (PCIe roots, switches, hosts): one candidate from
/// each group in turn, groups with fewer devices in use first, then groups with more free
/// devices, then the group seen first. Candidates without a group come after, those not
/// free last. Returns a full order.
pub fn spread_by<'a, K: Eq + core::hash::Hash>(
    input: &Input<'a>,
    key: impl Fn(&Candidate<'a>) -> Option<K>,
) -> Vec<u32> {
    let groups = group_by(input, key);
    let mut by_rank: Vec<usize> = (0..groups.len()).collect();
    // Stable: equal groups keep the order they were seen in.
    by_rank.sort_by_key(|&g| (groups.busy_in[g], usize::MAX - groups.free(g).len()));
    let mut order = Vec::with_capacity(input.len());
    let rounds = by_rank
        .iter()
        .map(|&g| groups.free(g).len())
        .max()
        .unwrap_or(0);
    for round in 0..rounds {
        for &g in &by_rank {
            if let Some(&i) = groups.free(g).get(round) {
                order.push(i);
            }
        }
    }
    order.extend_from_slice(&groups.ungrouped);
    order.extend_from_slice(&groups.busy);
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
        let packed = pack(&out);
        core::mem::forget(out);
        packed
    }

    /// The address and length of `bytes`, packed as the host reads them.
    pub fn pack(bytes: &[u8]) -> i64 {
        (((bytes.as_ptr() as usize as u64) << 32) | bytes.len() as u64) as i64
    }
}

/// Generates the policy exports for `fn(&Input<'_>) -> Decision`, plus the allocator and
/// panic handler a `no_std` WebAssembly module needs. Only on `wasm32`; elsewhere it
/// expands to nothing, so the crate still builds and tests on the host.
///
/// With `inputs = TEXT` the policy also declares what it reads (the
/// `kubedev_policy_inputs` export): one entry per line, `attribute NAME` (bare names are in
/// each device's driver's domain), `capacity NAME` (`*` for every name) or `counters`. The
/// host then sends only those attributes, capacities and counter sets, which makes every
/// call cheaper; name, pool, driver, health, NUMA node and in-use flag are always sent, and
/// so are the attributes of the constraints in force. Without it, everything is sent.
///
/// ```
/// use kubedev_policy_sdk::{Decision, Input, kubedev_policy, pack_by};
///
/// fn by_island(input: &Input<'_>) -> Decision {
///     let island = input.key("linkGroup");
///     Decision::order(pack_by(input, |c| c.get(&island)))
/// }
///
/// kubedev_policy!(by_island, inputs = "attribute linkGroup");
/// ```
#[macro_export]
macro_rules! kubedev_policy {
    ($policy:path) => {
        $crate::kubedev_policy!(@exports $policy);
    };
    ($policy:path, inputs = $inputs:expr $(,)?) => {
        $crate::kubedev_policy!(@exports $policy);

        #[cfg(target_arch = "wasm32")]
        const _: () = {
            #[allow(unsafe_code)]
            #[unsafe(no_mangle)]
            pub extern "C" fn kubedev_policy_inputs() -> i64 {
                const __KUBEDEV_POLICY_INPUTS: &str = $inputs;
                $crate::rt::pack(__KUBEDEV_POLICY_INPUTS.as_bytes())
            }
        };
        #[cfg(not(target_arch = "wasm32"))]
        const _: &str = $inputs;
    };
    (@exports $policy:path) => {
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

#[cfg(test)]
mod tests {
    extern crate std;

    use super::*;

    #[test]
    fn values_compare_and_hash_by_content() {
        let a = String::from("pci0000:00");
        let b = String::from("pci0000:00");
        let c = String::from("pci0000:01");
        let (va, vb, vc) = (Value::String(&a), Value::String(&b), Value::String(&c));
        assert_eq!(va, vb, "equal text at different addresses");
        assert_eq!(va, Value::String(&a[..]));
        assert_ne!(va, vc);
        assert_ne!(va, Value::Version(&a));
        assert_eq!(hash_of(&va), hash_of(&vb));
        assert_ne!(hash_of(&Value::Int(1)), hash_of(&Value::Int(2)));
        // Short strings and long strings that differ only in the middle still compare right.
        let long1 = "aaaaaaaaXbbbbbbbb";
        let long2 = "aaaaaaaaYbbbbbbbb";
        assert_ne!(Value::String(long1), Value::String(long2));
        assert_eq!(hash_of(&Value::String("ab")), hash_of(&Value::String("ab")));
        assert_ne!(Value::String("ab"), Value::String("ac"));
    }

    #[test]
    fn ascii_is_checked_word_by_word() {
        assert!(is_ascii(b"pci0000:00 and a longer tail"));
        assert!(!is_ascii("ascii then \u{e9}".as_bytes()));
        assert!(!is_ascii("\u{e9}".as_bytes()));
        assert_eq!(text("gr\u{fc}n".as_bytes()), "gr\u{fc}n");
        assert_eq!(text(&[0xff, 0xfe]), "");
    }
}
