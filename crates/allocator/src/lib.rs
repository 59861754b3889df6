//! kubedev allocator: structured device allocation that gives the answer the Kubernetes
//! scheduler's structured allocator gives (`k8s.io/dynamic-resource-allocation/structured`,
//! the tier with every DRA feature on) for `resource.k8s.io/v1` objects, says why when
//! nothing fits, and runs fast.
//!
//! The crate is pure: inputs in, allocation out, no YAML and no I/O (reading cluster dumps and
//! scenario files is `kubedev-inputs`'). It takes ResourceSlices, DeviceClasses,
//! the devices already in use and the claims of one pod ([`api`], [`Scenario`]), and returns
//! one `status.allocation` per claim, "does not fit", or an [`AllocationError`] for input it
//! cannot judge. `SEMANTICS.md` in the crate states the rules; `tests/conformance/` pins them
//! with 161 scenarios taken from the scheduler allocator's documented behaviour.
//!
//! ```
//! use kubedev_allocator::{AllocateOptions, Allocator, Scenario};
//!
//! let scenario: Scenario = serde_json::from_value(serde_json::json!({
//!     "node": {"name": "node-1"},
//!     "deviceClasses": [{
//!         "metadata": {"name": "gpu"},
//!         "spec": {"selectors": [{"cel": {"expression": "device.driver == \"gpu.example.com\""}}]},
//!     }],
//!     "resourceSlices": [{
//!         "metadata": {"name": "node-1-gpus"},
//!         "spec": {
//!             "driver": "gpu.example.com",
//!             "nodeName": "node-1",
//!             "pool": {"name": "node-1", "generation": 1, "resourceSliceCount": 1},
//!             "devices": [{"name": "gpu-0", "attributes": {"model": {"string": "h100"}}}],
//!         },
//!     }],
//!     "claims": [{
//!         "metadata": {"name": "train", "namespace": "default"},
//!         "spec": {"devices": {"requests": [{
//!             "name": "gpu",
//!             "exactly": {
//!                 "deviceClassName": "gpu",
//!                 "selectors": [{"cel": {"expression":
//!                     "device.attributes[\"gpu.example.com\"].model == \"h100\""}}],
//!             },
//!         }]}},
//!     }],
//! }))?;
//! let mut allocator = Allocator::new(&scenario.resource_slices, &scenario.device_classes, &scenario.allocated_devices);
//! let results = allocator
//!     .allocate(&scenario.node, &scenario.claims, &AllocateOptions::default())?
//!     .expect("fits");
//! assert_eq!(results[0].devices.results[0].device, "gpu-0");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Pieces
//!
//! - [`Allocator`]: built once over slices, classes and allocated devices; [`Allocator::allocate`]
//!   for each set of claims, [`Allocator::explain`] for why they do not fit. Per node it caches
//!   the gathered pools, the prepared devices and every selector result, so a warm allocation
//!   is a search over bitsets and small vectors.
//! - [`simulate()`]: what `kubedev simulate` prints ([`SimulateOutput::to_json`],
//!   [`SimulateOutput::to_text`]; it serializes to any serde format), with an explanation and
//!   timings on request.
//! - [`SelectionPolicy`]: reorders valid candidates by preference and may reject some (the
//!   WASM policies plug in here); without one, results are the scheduler's. A failing policy
//!   leaves the default order, or refuses the allocation with [`AllocationError::Policy`]
//!   when [`AllocateOptions::fail_closed`] is set.
//! - [`cel`]: the DRA CEL environment.
//!
//! # The search
//!
//! Depth-first with backtracking in the scheduler's order (claims, requests, devices; pools
//! by driver and name with binding-condition pools last, slices by name), trying
//! combinations rather than permutations within a request. Three prunings never change the
//! answer, only skip subtrees without one: a request that cannot get enough candidates from
//! the remaining positions, a matchAttribute whose chosen value has too few remaining
//! candidates, and, before searching, a request that no choice of the others can satisfy
//! (too few candidates, no value group big enough, too few distinct values, an `All` device
//! in use). They are switched off when a selector error could be reached, because the
//! scheduler would report that error. A deadline ([`AllocateOptions::deadline`]) stops a
//! search that is still too long.
//!
//! # Hostile CEL: what bounds it, and why
//!
//! Selectors come from users' claims. The `cel` crate has no cost accounting and a deep
//! expression overflows the stack, which aborts the process. Two ways to bound it were on the
//! table: a static cost estimate plus structural limits with evaluation on threads of known
//! stack, or running the evaluator inside the WASM sandbox with fuel. kubedev does a third,
//! stronger variant of the first:
//!
//! - **Parsing** uses the `cel` crate (its parser and macro expansion), behind a lexical
//!   check of the length (100,000 code points) and of bracket nesting (250), the limits of
//!   cel-go's parser that the scheduler keeps, on a dedicated thread with a 16 MiB stack, once
//!   per expression per process (compile cache). The API server's 10 KiB applies only when a
//!   selector is written ([`cel::validate_new`]): stored selectors stay valid. A 5,000-byte
//!   left-deep chain is refused in about 40 ms on that thread, a 66,000-byte one in 0.7 s.
//! - **The parsed tree** is refused beyond depth 250 (the depth cel-go's parser accepts),
//!   measured without recursion.
//! - **Evaluation** is kubedev's own tree walker over the parsed tree, with a runtime cost
//!   meter charged like cel-go's (1 per node, string and list work by size, list and map
//!   creation, one per comprehension iteration). Exceeding 1,000,000 units is the same
//!   runtime error the scheduler reports; nested comprehensions over 100-element lists stop
//!   after 12–19 ms (release). Metering at run time replaces the static estimate: it is
//!   exact where an estimate must be pessimistic, and it also bounds memory (list growth is
//!   charged per element).
//! - **Stack**: the deepest accepted expression (depth 247) evaluates on a 128 KiB stack in
//!   release and a 512 KiB stack in debug builds (measured with `examples/cel_limits.rs`), so
//!   evaluation on ordinary threads (2 MiB) is safe. [`simulate()`] runs on its own 64 MiB
//!   thread because the search itself recurses once per chosen device.
//! - Owning the evaluator also gives CEL's error semantics that the crate lacks (`false &&
//!   error` is `false`, `error || true` is `true`) and the Kubernetes functions (semver,
//!   quantity, regex, lists, sets, strings, optionals, `cel.bind`).
//!
//! The WASM route would make a stack overflow a trap rather than an abort, but each
//! evaluation would cross into the sandbox (measured elsewhere at 0.08–0.15 µs per call on an
//! existing instance, more than a whole native evaluation: 0.17 µs for a two-clause selector,
//! 0.08 µs for `device.driver == "…"`), and fuel counts WASM instructions, not CEL cost, so
//! the scheduler's limit could not be reproduced. With the tree depth bounded, the native
//! evaluator cannot overflow, so the sandbox is kept for vendor policies.

//! # Benchmarks
//!
//! `cargo bench -p kubedev-allocator -- --warm-up-time 1 --measurement-time 3` runs the
//! criterion benches over `../shared/bench-scenarios` (per allocation with warm caches, build
//! plus allocation, raw selector evaluation); `cargo run --release -p kubedev-inputs --example
//! bench_table` prints one table with kubedev's median CPU time per allocation, the
//! upstream reference from the scenarios' README and the ratio. `kubedev simulate --repeat N`
//! measures any scenario file the same way.

#![warn(missing_docs)]

mod allocator;
pub mod api;
pub mod cel;
mod error;
mod explain;
mod features;
mod model;
mod nodesel;
mod policy;
pub mod scenario;
mod simulate;
mod slice_index;

pub use allocator::{
    AllocateOptions, Allocator, ConsumedCapacity, MAX_CLAIMS, MAX_DEVICES_PER_CLAIM, SearchStats,
};
pub use error::{AllocationError, SelectorOwner};
pub use explain::{ClaimExplanation, Explanation, Reason, Rejection, RequestExplanation};
pub use features::Features;
pub use policy::{
    PolicyConstraint, PolicyConstraintKind, PolicyDevice, PolicyFailure, PolicyOutcome,
    PolicyRejection, PolicyRequest, SelectionPolicy,
};
pub use scenario::Scenario;
pub use simulate::{ClaimOutput, SimulateOptions, SimulateOutput, Timing, simulate, simulate_here};
