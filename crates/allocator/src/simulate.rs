//! `kubedev simulate`: allocate a scenario's claims and report the result, an explanation
//! and timings, as JSON, YAML or text.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::allocator::{AllocateOptions, Allocator};
use crate::api::AllocationResult;
use crate::explain::Explanation;
use crate::policy::SelectionPolicy;
use crate::scenario::Scenario;

/// Options of [`simulate`].
#[derive(Clone, Copy, Debug, Default)]
#[non_exhaustive]
pub struct SimulateOptions<'p> {
    /// Add an explanation (always computed when the claims do not fit and this is set).
    pub explain: bool,
    /// Run the allocation this many more times after a warm-up and report timings (see
    /// [`Timing`]).
    pub repeat: Option<usize>,
    /// Reorder valid candidates by preference.
    pub policy: Option<&'p dyn SelectionPolicy>,
    /// Stop a search that runs longer than this.
    pub deadline: Option<Duration>,
    /// Refuse the allocation when the policy fails instead of keeping the default order.
    pub fail_closed: bool,
}

impl<'p> SimulateOptions<'p> {
    /// With an explanation.
    pub fn with_explain(mut self, explain: bool) -> Self {
        self.explain = explain;
        self
    }

    /// With timings over `repeat` runs.
    pub fn with_repeat(mut self, repeat: usize) -> Self {
        self.repeat = Some(repeat);
        self
    }

    /// With a selection policy.
    pub fn with_policy(mut self, policy: &'p dyn SelectionPolicy) -> Self {
        self.policy = Some(policy);
        self
    }

    /// With a search deadline.
    pub fn with_deadline(mut self, deadline: Duration) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// Refusing the allocation when the policy fails (`true`), or keeping the default order
    /// (`false`, the default).
    pub fn with_fail_closed(mut self, fail_closed: bool) -> Self {
        self.fail_closed = fail_closed;
        self
    }
}

/// One claim of the output.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct ClaimOutput {
    /// Claim name.
    pub name: String,
    /// Claim namespace.
    pub namespace: String,
    /// The allocation, exactly as `status.allocation` of a v1 ResourceClaim; absent when the
    /// claims do not fit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allocation: Option<AllocationResult>,
}

/// Timings over repeated allocations: the runs are timed in batches (the clocks are read
/// around each batch, not each run, so their cost is shared by the batch's runs), and each
/// figure is the median over batches of the time per run.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct Timing {
    /// Number of measured runs.
    pub repeat: usize,
    /// Runs per timed batch.
    pub batch: usize,
    /// Median wall time of one allocation with warm caches, nanoseconds.
    pub allocate_wall_ns: u64,
    /// Median CPU time of the whole process for one allocation with warm caches, freeing its
    /// result included, nanoseconds.
    pub allocate_cpu_ns: u64,
    /// Median wall time of building the allocator plus one allocation, nanoseconds.
    pub build_allocate_wall_ns: u64,
    /// Median CPU time of the whole process for building the allocator, one allocation and
    /// freeing both (what a scheduler that makes a fresh allocator per pod spends),
    /// nanoseconds.
    pub build_allocate_cpu_ns: u64,
}

/// The result of [`simulate`].
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct SimulateOutput {
    /// Whether all claims fit.
    pub allocatable: bool,
    /// A hard error (the input could not be judged); absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// One entry per claim, in scenario order.
    pub claims: Vec<ClaimOutput>,
    /// Why the claims do not fit (with `explain`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub explanation: Option<Explanation>,
    /// Timings (with `repeat`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timing: Option<Timing>,
}

/// CPU time of the whole process (every thread, e.g. an allocator's helpers and the
/// allocator's own frees), as a scheduler's process would be charged.
fn process_cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    (t.tv_sec as u64).saturating_mul(1_000_000_000) + t.tv_nsec as u64
}

/// Batches a repeated timing is split into (fewer when there are fewer runs).
const TIMING_BATCHES: usize = 25;

fn median(mut v: Vec<u64>) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    v[v.len() / 2]
}

/// Stack of the thread that runs a simulation: the search recurses once per chosen device.
const SIMULATE_STACK: usize = 64 << 20;

/// Allocates the scenario's claims on its node and reports the outcome. Never fails: a hard
/// allocation error is reported in [`SimulateOutput::error`].
pub fn simulate(scenario: &Scenario, options: &SimulateOptions<'_>) -> SimulateOutput {
    std::thread::scope(|s| {
        let handle = std::thread::Builder::new()
            .name("kubedev-simulate".into())
            .stack_size(SIMULATE_STACK)
            .spawn_scoped(s, || simulate_here(scenario, options));
        match handle {
            Ok(h) => h
                .join()
                .unwrap_or_else(|_| failed(scenario, "the allocator panicked".into())),
            Err(_) => simulate_here(scenario, options),
        }
    })
}

fn failed(scenario: &Scenario, error: String) -> SimulateOutput {
    SimulateOutput {
        allocatable: false,
        error: Some(error),
        claims: claim_outputs(scenario, None),
        explanation: None,
        timing: None,
    }
}

fn claim_outputs(scenario: &Scenario, results: Option<Vec<AllocationResult>>) -> Vec<ClaimOutput> {
    let mut results = results.map(|r| r.into_iter());
    scenario
        .claims
        .iter()
        .map(|c| ClaimOutput {
            name: c.metadata.name.clone(),
            namespace: c.metadata.namespace.clone(),
            allocation: results.as_mut().and_then(Iterator::next),
        })
        .collect()
}

/// [`simulate`] on the calling thread (which must have a few MiB of stack).
pub fn simulate_here(scenario: &Scenario, options: &SimulateOptions<'_>) -> SimulateOutput {
    let alloc_options = AllocateOptions {
        deadline: options.deadline,
        policy: options.policy,
        fail_closed: options.fail_closed,
    };
    let features = crate::features::Features::from_gates(&scenario.features);
    let shares = scenario.consumed_capacity();
    let slices = scenario.slices_as_scheduled();
    let mut allocator = Allocator::new(
        &slices,
        &scenario.device_classes,
        &scenario.allocated_devices,
    )
    .with_consumed_capacity(&shares)
    .with_features(features);
    let outcome = allocator.allocate(&scenario.node, &scenario.claims, &alloc_options);
    let mut out = match outcome {
        Err(e) => failed(scenario, kubedev_core::echo::chain(&e)),
        Ok(results) => SimulateOutput {
            allocatable: results.is_some(),
            error: None,
            claims: claim_outputs(scenario, results),
            explanation: None,
            timing: None,
        },
    };
    if options.explain && out.error.is_none() {
        match allocator.explain_with(&scenario.node, &scenario.claims, &alloc_options) {
            Ok(e) => out.explanation = Some(e),
            Err(e) => out.error = Some(kubedev_core::echo::chain(&e)),
        }
    }
    if let Some(n) = options.repeat.filter(|n| *n > 0) {
        // Reading the process CPU clock is a system call: around every run it would be
        // counted in the run (about a microsecond on a virtual machine). Batches of runs
        // share one reading; the median over batches keeps the figure robust to noise.
        let batch = (n / TIMING_BATCHES).max(1);
        let batches = n / batch;
        let time = |run: &mut dyn FnMut()| {
            let (mut wall, mut cpu) = (Vec::with_capacity(batches), Vec::with_capacity(batches));
            for _ in 0..batches {
                let (t0, c0) = (Instant::now(), process_cpu_ns());
                for _ in 0..batch {
                    run();
                }
                let (t1, c1) = (Instant::now(), process_cpu_ns());
                wall.push((t1 - t0).as_nanos() as u64 / batch as u64);
                cpu.push(c1.saturating_sub(c0) / batch as u64);
            }
            (median(wall), median(cpu))
        };
        let (wall, cpu) = time(&mut || {
            let r = allocator.allocate(&scenario.node, &scenario.claims, &alloc_options);
            drop(std::hint::black_box(r.ok()));
        });
        let (bwall, bcpu) = time(&mut || {
            let mut fresh = Allocator::new(
                &slices,
                &scenario.device_classes,
                &scenario.allocated_devices,
            )
            .with_consumed_capacity(&shares)
            .with_features(features);
            let r = fresh.allocate(&scenario.node, &scenario.claims, &alloc_options);
            drop(std::hint::black_box(r.ok()));
            drop(fresh);
        });
        out.timing = Some(Timing {
            repeat: batches * batch,
            batch,
            allocate_wall_ns: wall,
            allocate_cpu_ns: cpu,
            build_allocate_wall_ns: bwall,
            build_allocate_cpu_ns: bcpu,
        });
    }
    out
}

impl SimulateOutput {
    /// The `-o json` form: one pretty-printed object.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self)
            .unwrap_or_else(|e| format!("{{\"error\": {:?}}}", kubedev_core::echo::chain(&e)))
    }

    /// The `-o text` form, for people.
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        if let Some(e) = &self.error {
            let _ = writeln!(s, "error: {e}");
        } else if self.allocatable {
            let _ = writeln!(s, "allocatable: all {} claims fit", self.claims.len());
        } else {
            let _ = writeln!(s, "not allocatable: the claims do not fit on this node");
        }
        for c in &self.claims {
            let Some(a) = &c.allocation else { continue };
            let name = if c.namespace.is_empty() {
                c.name.clone()
            } else {
                format!("{}/{}", c.namespace, c.name)
            };
            let _ = writeln!(s, "claim {name}:");
            for r in &a.devices.results {
                let _ = write!(
                    s,
                    "  {:<20} {}/{}/{}",
                    r.request, r.driver, r.pool, r.device
                );
                if r.admin_access == Some(true) {
                    s.push_str("  (admin access)");
                }
                if !r.consumed_capacity.is_empty() {
                    let caps: Vec<String> = r
                        .consumed_capacity
                        .iter()
                        .map(|(k, v)| format!("{k}={v}"))
                        .collect();
                    let _ = write!(s, "  consumes {}", caps.join(","));
                }
                if !r.binding_conditions.is_empty() {
                    let _ = write!(s, "  waits for {}", r.binding_conditions.join(","));
                }
                s.push('\n');
            }
            if let Some(ns) = &a.node_selector {
                for t in &ns.node_selector_terms {
                    let reqs: Vec<String> = t
                        .match_fields
                        .iter()
                        .chain(&t.match_expressions)
                        .map(|r| format!("{} {} [{}]", r.key, r.operator, r.values.join(",")))
                        .collect();
                    let _ = writeln!(s, "  node selector: {}", reqs.join(" and "));
                }
            }
        }
        if let Some(e) = &self.explanation {
            let _ = writeln!(s, "explanation:");
            for p in &e.pools {
                let _ = writeln!(s, "  pool {p}");
            }
            for line in &e.summary {
                let _ = writeln!(s, "  {line}");
            }
        }
        if let Some(t) = &self.timing {
            let _ = writeln!(
                s,
                "timing over {} runs in batches of {} (median per run, process CPU, freeing included): allocate {:.1} µs wall / {:.1} µs CPU; build + allocate {:.1} µs wall / {:.1} µs CPU",
                t.repeat,
                t.batch,
                t.allocate_wall_ns as f64 / 1000.0,
                t.allocate_cpu_ns as f64 / 1000.0,
                t.build_allocate_wall_ns as f64 / 1000.0,
                t.build_allocate_cpu_ns as f64 / 1000.0
            );
        }
        s
    }
}
