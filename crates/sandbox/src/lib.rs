//! kubedev sandbox: vendor selection policies compiled to WebAssembly, run under fuel,
//! memory and wall-clock limits, as the allocator's [`SelectionPolicy`].
//!
//! A policy sees one request at a time — the claim, the request, how many devices it wants,
//! the constraints in force — and the candidate devices that are valid for it (name, pool,
//! driver, typed attributes, capacities, shared counters consumed, NUMA node, health, whether
//! already allocated). It answers with a preference order or a score per candidate, and may
//! reject candidates with a reason. It only changes which valid allocation the allocator
//! finds first, or leaves rejected candidates out: it can never make an invalid allocation
//! valid.
//!
//! ```no_run
//! use kubedev_allocator::{SimulateOptions, simulate};
//! use kubedev_sandbox::{Limits, Sandbox};
//!
//! let sandbox = Sandbox::new(Limits::default())?;
//! let policy = sandbox.load_file("target/plugins/wasm/numa-pack.wasm".as_ref())?;
//! let scenario = kubedev_inputs::read_scenario("scenario.yaml")?;
//! // A session passes on how much of each shared counter set the allocated devices use.
//! let session = policy.session(&scenario.resource_slices, &scenario.allocated_devices);
//! let out = simulate(&scenario, &SimulateOptions::default().with_policy(&session));
//! if let Some(e) = session.failure() {
//!     eprintln!("policy failed, default order used: {e}");
//! }
//! println!("allocatable: {}", out.allocatable);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Why a core-module ABI and not the component model
//!
//! The contract is a small core WebAssembly module interface, versioned by an export, with
//! one compact binary message in and one out through linear memory:
//!
//! - **Cost per call.** A call must stay within about ten microseconds for 64 candidates.
//!   Here the host writes one message of fixed-size records into guest memory (two copies:
//!   records, then strings), names are interned so the guest compares integers, and the
//!   guest reads everything in place without allocating per field. The component model's
//!   canonical ABI would lower every attribute name and value as its own list or string,
//!   with a guest allocation (`cabi_realloc`) and a UTF-8 check for each.
//! - **Weight.** wasmtime stays without its `component-model` feature (less code compiled
//!   into the daemon, a smaller attack surface), and a policy is a plain
//!   `cargo build --target wasm32-unknown-unknown` of a `no_std` crate: no `wit-bindgen`,
//!   no `cargo component`, no WASI adapter. Policies of a few tens of KiB load in
//!   milliseconds, and the contract can be met from any language, or from hand-written WAT
//!   as the tests do.
//! - **No WASI, nothing to link.** A policy may import only `kubedev.log`; everything
//!   else it needs is in the message.
//!
//! What it costs: no generated bindings. The Rust SDK (`plugins/sdk`) hides the format; the
//! layout below is the reference for other languages. A future version can move to a WIT
//! world without changing this crate's public API.
//!
//! # The contract (ABI version 1)
//!
//! Exports (any other exports are ignored):
//!
//! | export | type | meaning |
//! |---|---|---|
//! | `memory` | 32-bit memory | its initial size must be within the memory limit |
//! | `kubedev_policy_abi_version` | `() -> i32` | returns `1` |
//! | `kubedev_alloc` | `(len: i32) -> i32` | returns a pointer to `len` writable bytes for the input (0 on failure) |
//! | `kubedev_select` | `(ptr: i32, len: i32) -> i64` | reads the input at `ptr`, returns `(out_ptr << 32) \| out_len` |
//! | `kubedev_policy_inputs` (optional) | `() -> i64` | returns `(ptr << 32) \| len` of the input declaration below |
//!
//! **Input declaration.** A policy that exports `kubedev_policy_inputs` declares what it
//! reads, as UTF-8 text of at most 64 KiB, one entry per line: `attribute NAME`,
//! `capacity NAME` (a bare name means that id in each device's driver's domain, a qualified
//! one is taken as written; `*` means every name), or `counters` (the shared counter sets
//! a device draws from); blank lines and `#` comments are ignored, anything else makes the
//! module a [`PolicyError::BadModule`]. The host reads it once, at load, and then sends
//! only the declared attributes, capacities and counter sets (plus the attributes of the
//! constraints in force); a name nobody declared is left out of the name table as well.
//! Everything else (the header, every candidate record with its name, driver, pool, flags,
//! health and NUMA node) is always sent, and the layout is unchanged, so this stays ABI
//! version 1: a module without the export gets everything, as before. Declaring inputs is
//! what keeps calls cheap with many candidates (`numa-pack` declares nothing, `spread` one
//! attribute).
//!
//! Imports: none, except optionally `kubedev.log: (ptr: i32, len: i32) -> ()`, which logs
//! UTF-8 text (at most [`Limits::log_lines_per_call`] lines of
//! [`Limits::log_line_bytes`] bytes per call, rate-limited in the host's log, each costing
//! 1000 fuel plus one per byte). Every call starts from the state instantiation leaves (a
//! fresh instance, or one whose memory and mutable globals were put back after the last
//! call), so a policy keeps no state between calls and a bump allocator that never frees is
//! enough.
//!
//! All integers are little-endian. The input is a set of fixed-size records a guest reads
//! in place (no parsing, no allocation per field): a header, tables of records, a name
//! table and a string region. An *offset* is a byte offset from the start of the message; a
//! *span* is `(offset u32, length u32)` of UTF-8 bytes relative to the string region; a
//! *name* is a `u32` index into the name table, where every distinct name (drivers, pools,
//! attribute, capacity, counter-set and counter names) is stored once, so a guest compares
//! names as integers. Attribute and capacity names are qualified: a bare name published by a
//! driver is sent as `<driver>/<name>`.
//!
//! ```text
//! header (64 bytes)
//!    0 magic "KDPI"            4 version u32 = 1        8 count u32 (devices wanted)
//!   12 reserved u32           16 claim span            24 request span
//!   32 names offset, count    40 constraints offset, count
//!   48 candidates offset, count                        56 strings offset, length
//! name table entry (8):    span of the name
//! constraint (8):          0 attribute name, 4 kind u32 (0 matchAttribute, 1 distinctAttribute)
//! candidate (64):          0 device name span, 8 driver name, 12 pool name,
//!                          16 flags u8 (bit 0 already allocated, bit 1 NUMA node known),
//!                          17 health u8 (0 unknown, 1 healthy, 2 unhealthy), 24 NUMA node i64,
//!                          32 attributes offset, count     40 capacities offset, count
//!                          48 counter sets offset, count   56 reserved
//! attribute (16):          0 name, 4 tag u8 (0 int, 1 bool, 2 string, 3 version),
//!                          8 value: i64 | u8 | span
//! capacity (24):           0 name, 8 value i64, 16 text span (the quantity as written)
//! counter set (16):        0 counter set name, 4 in use u32, 8 counters offset, count
//! counter (16):            0 counter name, 8 value i64
//! ```
//!
//! Quantities are given as written and as Kubernetes' `Value()` (rounded away from zero,
//! saturated to `i64`). A published device's NUMA node is its integer attribute
//! `resource.kubernetes.io/numaNode`, else the driver's `numaNode`, else `numa`; an
//! inventory device's is its own. A counter set's *in use* counts the already-allocated
//! devices that draw from the same shared counter set (the partitionable device's parent),
//! when the caller knows them (see [`WasmPolicy::session`] and [`CounterUsage`]).
//!
//! Output (a plain stream: a list is a `u32` count then its items, a `str` a `u32` length
//! then UTF-8 bytes):
//!
//! ```text
//! magic "KDPO", version u32 = 1, kind u8
//!   kind 0 keep:   nothing (the input order stands)
//!   kind 1 order:  list of u32 candidate indices, distinct; unlisted candidates follow in
//!                  input order
//!   kind 2 scores: list of i64, one per candidate; higher first, ties keep input order
//! rejections: list of { index u32, reason str (at most 256 bytes) }
//! ```
//!
//! Nothing may follow the message. An output over [`Limits::max_output_bytes`], outside
//! memory, or malformed in any way is [`PolicyError::BadOutput`]. The allocator leaves
//! rejected candidates out of the request (its explanation names the policy's reason);
//! [`Decision::preferred`] leaves them out of `GetPreferredAllocation`'s answer.
//!
//! As the allocator's [`SelectionPolicy`], a policy is told which candidates are already
//! allocated (the in-use flag) and which claim constraints are in force for the request
//! (the constraint records); a [`WasmPolicy::session`] adds the usage of shared counter
//! sets. A failure is returned to the allocator, which keeps its default order or, with
//! `AllocateOptions::fail_closed`, refuses the allocation naming the policy and the
//! [`PolicyError::kind`].
//!
//! # Limits and determinism
//!
//! Each call gets [`Limits::fuel`] fuel (about one unit per instruction) — the meter that
//! decides, the same on every machine — a memory limit enforced when memory grows, and a
//! wall-clock deadline (engine epochs advanced by a ticker thread) as a backstop. NaNs are
//! canonicalised and relaxed SIMD is off, so an answer depends only on the module and the
//! input. One engine per [`Sandbox`]; modules are compiled once and cached by SHA-256 of
//! their bytes; instances come from the pooling allocator. A module whose state the host can
//! put back (no start function, no instruction that changes a table or drops a segment, only
//! numeric mutable globals) keeps up to two instances for reuse, restored after each
//! successful call; an instance that trapped, ran out of fuel or grew its memory is dropped. Every failure is a
//! [`PolicyError`]; callers keep the default order, or refuse when they run fail-closed.
//!
//! # Loading and reloading
//!
//! [`Sandbox::load`] compiles a module and checks its imports, exports and ABI version.
//! [`PolicyDir`] keeps a directory of `.wasm` files loaded: a new or changed module must
//! also answer the sample requests that [`check`] runs before it replaces the old one; a
//! module that fails leaves the old policy in place and the reason in the log.

mod abi;
mod check;
mod dir;
mod encode;
mod error;
mod input;
mod inputs;
mod limits;
mod policy;
mod ratelimit;
mod restore;
mod samples;
mod sandbox;
mod shape;

pub use abi::DecisionKind;
pub use check::{CheckReport, SampleReport, SampleRun, check};
pub use dir::{PolicyDir, ReloadReport};
pub use error::PolicyError;
pub use input::{Candidate, Constraint, ConstraintKind, CounterUsage, DeviceData, PolicyInput};
pub use limits::Limits;
pub use policy::{Decision, Evaluation, PolicySession, PolicyStats, Rejection, WasmPolicy};
pub use sandbox::Sandbox;

/// The allocator's hook this crate implements, re-exported for convenience.
pub use kubedev_allocator::SelectionPolicy;

/// Decodes a policy's output message for `candidates` candidates as the sandbox does after each
/// call: the preference order (a permutation of the candidates) and the rejected candidates with
/// their reasons, or why the message is malformed. For kubedev's fuzz targets; not part of the
/// stable API.
#[doc(hidden)]
#[allow(clippy::type_complexity)]
pub fn decode_policy_output(
    bytes: &[u8],
    candidates: usize,
) -> Result<(Vec<usize>, Vec<(usize, String)>), String> {
    abi::decode_output(bytes, candidates).map(|d| (d.order, d.rejections))
}
