//! Write a kubedev selection policy as a plain Rust function.
//!
//! A policy is a `no_std` crate of type `cdylib` built for `wasm32-unknown-unknown`. It
//! receives one request and its candidate devices ([`Input`]) and answers a [`Decision`]:
//! a preference order, a score per candidate, or "keep the default order", optionally
//! rejecting candidates with a reason. [`kubedev_policy!`] generates the WebAssembly
//! exports of kubedev's policy ABI (version 1, specified in the `kubedev-sandbox` crate
//! docs), a bump allocator (every call starts from the module's initial memory, so nothing
//! is ever freed) and a panic handler (a panic is a trap; the host then keeps its default
//! order).
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

mod abi;
mod candidate;
mod decision;
mod grouping;
mod input;
mod key;
mod message;
#[cfg(target_arch = "wasm32")]
#[doc(hidden)]
pub mod rt;
mod value;

pub use candidate::{Candidate, Capacity, CounterSet, Health};
pub use decision::Decision;
pub use grouping::{pack_by, spread_by};
pub use input::{Constraint, ConstraintKind, DecodeError, Input};
pub use key::Key;
#[cfg(target_arch = "wasm32")]
pub use rt::BumpAllocator;
pub use value::Value;

pub use abi::{ABI_VERSION, MAX_REASON_BYTES};

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
