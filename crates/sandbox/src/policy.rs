//! [`WasmPolicy`]: a loaded policy, its calls, and its use as the allocator's
//! [`SelectionPolicy`].

use parking_lot::Mutex;
use std::cell::RefCell;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use kubedev_allocator::api::ResourceSlice;
use kubedev_allocator::{
    PolicyConstraintKind, PolicyDevice, PolicyFailure, PolicyOutcome, PolicyRequest,
    SelectionPolicy,
};

use crate::abi::DecisionKind;
use crate::encode::{Message, encode_input};
use crate::error::PolicyError;
use crate::input::{Candidate, Constraint, ConstraintKind, CounterUsage, PolicyInput};
use crate::ratelimit::{TokenBucket, failure_warning_limit, guest_log_limit};
use crate::sandbox::{
    Compiled, LogSink, Sandbox, check_magic, policy_name, read_module, strip_policy,
};

/// A policy module loaded into a [`Sandbox`]: call it with [`WasmPolicy::evaluate`], or hand
/// it to the allocator as a [`SelectionPolicy`]. Cheap to clone; clones share statistics.
#[derive(Clone)]
pub struct WasmPolicy {
    inner: Arc<PolicyInner>,
}

struct PolicyInner {
    name: Arc<str>,
    compiled: Arc<Compiled>,
    sandbox: Sandbox,
    calls: AtomicU64,
    failures: AtomicU64,
    last_error: Mutex<Option<PolicyError>>,
    log_bucket: Arc<Mutex<TokenBucket>>,
    warn_bucket: Mutex<TokenBucket>,
}

impl std::fmt::Debug for WasmPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WasmPolicy")
            .field("name", &self.name())
            .field("digest", &self.digest())
            .field("module_bytes", &self.module_bytes())
            .finish_non_exhaustive()
    }
}

/// A candidate the policy refuses, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    /// Index of the candidate in the input.
    pub index: usize,
    /// The policy's reason.
    pub reason: String,
}

/// A policy's answer for one request.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Decision {
    /// How the policy answered.
    pub kind: DecisionKind,
    /// Every candidate index, most preferred first (rejected candidates included, where the
    /// policy ranked them).
    pub order: Vec<usize>,
    /// Candidates the policy refuses.
    pub rejections: Vec<Rejection>,
}

impl Decision {
    /// True when the candidate is rejected.
    pub fn is_rejected(&self, index: usize) -> bool {
        self.rejections.iter().any(|r| r.index == index)
    }

    /// The candidates the policy accepts, most preferred first.
    pub fn accepted(&self) -> Vec<usize> {
        self.order
            .iter()
            .copied()
            .filter(|&i| !self.is_rejected(i))
            .collect()
    }

    /// A full permutation: the accepted candidates in order, then the rejected ones.
    pub fn preference(&self) -> Vec<usize> {
        let mut p = self.accepted();
        p.extend(self.order.iter().copied().filter(|&i| self.is_rejected(i)));
        p
    }

    /// For `GetPreferredAllocation`: `must_include` first, then accepted candidates in order,
    /// `size` in all; `None` when the accepted candidates cannot fill it.
    pub fn preferred(&self, size: usize, must_include: &[usize]) -> Option<Vec<usize>> {
        let mut out: Vec<usize> = must_include.to_vec();
        for i in self.accepted() {
            if out.len() >= size {
                break;
            }
            if !must_include.contains(&i) {
                out.push(i);
            }
        }
        (out.len() == size).then_some(out)
    }
}

/// The result of one call, with what it cost.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Evaluation {
    /// The answer.
    pub decision: Decision,
    /// Fuel the call used (deterministic for a module and an input).
    pub fuel_used: u64,
    /// Largest linear memory during the call, bytes.
    pub memory_bytes: usize,
    /// Wall time of the call, including instantiating or restoring the instance.
    pub elapsed: Duration,
    /// Lines the policy wrote with `kubedev.log` (at most the per-call limit).
    pub log: Vec<String>,
}

/// Counters of a policy's calls.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct PolicyStats {
    /// Calls made.
    pub calls: u64,
    /// Calls that failed.
    pub failures: u64,
    /// The most recent failure.
    pub last_error: Option<PolicyError>,
}

thread_local! {
    static INPUT_BUF: RefCell<Message> = RefCell::new(Message::default());
}

/// Loading policies: what makes a [`WasmPolicy`] of a module.
impl Sandbox {
    /// Compiles (or takes from the cache) and checks a policy module. The module must keep
    /// the contract of the crate docs; the check calls its ABI-version export once.
    pub fn load(&self, name: &str, wasm: &[u8]) -> Result<WasmPolicy, PolicyError> {
        let compiled = self.compile(name, wasm)?;
        Ok(WasmPolicy::new(name, compiled, self.clone()))
    }

    /// [`Sandbox::load`] of a file; the policy is named after the file stem.
    pub fn load_file(&self, path: &Path) -> Result<WasmPolicy, PolicyError> {
        let bytes = read_module(path, self.inner.limits.max_module_bytes)?;
        check_magic(path, &bytes)?;
        self.load(&policy_name(path), &bytes)
    }
}

impl WasmPolicy {
    pub(crate) fn new(name: &str, compiled: Arc<Compiled>, sandbox: Sandbox) -> Self {
        WasmPolicy {
            inner: Arc::new(PolicyInner {
                name: Arc::from(name),
                compiled,
                sandbox,
                calls: AtomicU64::new(0),
                failures: AtomicU64::new(0),
                last_error: Mutex::new(None),
                log_bucket: Arc::new(Mutex::new(guest_log_limit())),
                warn_bucket: Mutex::new(failure_warning_limit()),
            }),
        }
    }

    /// The policy's name (the file stem for files).
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// SHA-256 of the module bytes, in hex.
    pub fn digest(&self) -> String {
        hex(&self.inner.compiled.digest)
    }

    /// Size of the module, bytes.
    pub fn module_bytes(&self) -> usize {
        self.inner.compiled.size
    }

    /// How long compiling the module took.
    pub fn compile_time(&self) -> Duration {
        self.inner.compiled.compile_time
    }

    /// The policy's input declaration (what it reads; see the crate docs), or `None` when
    /// it reads everything.
    pub fn input_declaration(&self) -> Option<&str> {
        self.inner.compiled.declaration_text.as_deref()
    }

    /// True when the module imports `kubedev.log`.
    pub fn imports_log(&self) -> bool {
        self.inner.compiled.imports_log
    }

    /// Calls, failures and the last failure so far.
    pub fn stats(&self) -> PolicyStats {
        PolicyStats {
            calls: self.inner.calls.load(Ordering::Relaxed),
            failures: self.inner.failures.load(Ordering::Relaxed),
            last_error: self.inner.last_error.lock().clone(),
        }
    }

    /// Asks the policy about one request, from the module's initial state, under the
    /// sandbox's limits.
    pub fn evaluate(&self, input: &PolicyInput<'_>) -> Result<Evaluation, PolicyError> {
        self.inner.calls.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        let result = INPUT_BUF.with(|buf| match buf.try_borrow_mut() {
            Ok(mut buf) => self.call(input, &mut buf),
            Err(_) => self.call(input, &mut Message::default()),
        });
        match result {
            Ok(out) => Ok(Evaluation {
                decision: Decision {
                    kind: out.decision.kind,
                    order: out.decision.order,
                    rejections: out
                        .decision
                        .rejections
                        .into_iter()
                        .map(|(index, reason)| Rejection { index, reason })
                        .collect(),
                },
                fuel_used: out.fuel_used,
                memory_bytes: out.memory_bytes,
                elapsed: started.elapsed(),
                log: out.log,
            }),
            Err(e) => {
                self.inner.failures.fetch_add(1, Ordering::Relaxed);
                *self.inner.last_error.lock() = Some(e.clone());
                Err(e)
            }
        }
    }

    fn call(
        &self,
        input: &PolicyInput<'_>,
        buf: &mut Message,
    ) -> Result<crate::sandbox::CallOutput, PolicyError> {
        encode_input(input, &self.inner.compiled.inputs, buf);
        let limits = &self.inner.sandbox.inner.limits;
        let log = LogSink {
            policy: self.inner.name.clone(),
            lines_left: limits.log_lines_per_call,
            line_bytes: limits.log_line_bytes,
            lines: Vec::new(),
            dropped: 0,
            bucket: self.inner.log_bucket.clone(),
        };
        self.inner
            .sandbox
            .inner
            .call_select(&self.inner.compiled, buf, input.candidates.len(), log)
    }

    /// A view of this policy for one allocation over `slices` with `allocated` devices
    /// (`driver/pool/device`) in use: the usage of shared counter sets by those devices is
    /// passed on (what `binpack` needs). It records the first failure, so a caller can tell
    /// that the default order was used.
    pub fn session<'a>(
        &'a self,
        slices: &'a [ResourceSlice],
        allocated: &'a [String],
    ) -> PolicySession<'a> {
        PolicySession {
            policy: self,
            usage: CounterUsage::from_allocated(slices, allocated),
            failure: Mutex::new(None),
        }
    }

    /// The allocator hook. The allocator says which candidates are allocated and which
    /// constraints are in force.
    fn outcome(
        &self,
        request: &PolicyRequest<'_>,
        candidates: &[PolicyDevice<'_>],
        usage: Option<&CounterUsage>,
    ) -> Result<PolicyOutcome, PolicyError> {
        let cands = candidates
            .iter()
            .map(|d| Candidate::published(d.driver, d.pool, d.device).with_in_use(d.allocated))
            .collect();
        let constraints = request
            .constraints
            .iter()
            .map(|c| Constraint {
                kind: match c.kind {
                    PolicyConstraintKind::DistinctAttribute => ConstraintKind::DistinctAttribute,
                    _ => ConstraintKind::MatchAttribute,
                },
                attribute: c.attribute,
            })
            .collect();
        let mut input = PolicyInput::new(request.claim, request.request, request.count, cands)
            .with_constraints(constraints);
        if let Some(u) = usage.filter(|u| !u.is_empty()) {
            input = input.with_counter_usage(u);
        }
        let d = self.evaluate(&input)?.decision;
        let mut outcome = if d.kind == DecisionKind::Keep {
            PolicyOutcome::keep()
        } else {
            PolicyOutcome::ordered(d.order)
        };
        for r in d.rejections {
            outcome = outcome.with_rejection(r.index, r.reason);
        }
        Ok(outcome)
    }

    /// Turns a failed call into the allocator's failure, logging it (rate-limited).
    fn failure(&self, error: &PolicyError) -> PolicyFailure {
        let allowed = self.inner.warn_bucket.lock().take();
        if allowed {
            tracing::warn!(
                policy = %self.name(),
                kind = error.kind(),
                %error,
                "selection policy failed"
            );
        }
        PolicyFailure::new(self.name(), error.kind(), strip_policy(error, self.name()))
    }
}

impl SelectionPolicy for WasmPolicy {
    fn name(&self) -> &str {
        &self.inner.name
    }

    /// Asks the policy; a failure is logged (rate-limited) and returned. Shared counter
    /// usage is not known: use [`WasmPolicy::session`] for that.
    fn order(
        &self,
        request: &PolicyRequest<'_>,
        candidates: &[PolicyDevice<'_>],
    ) -> Result<PolicyOutcome, PolicyFailure> {
        self.outcome(request, candidates, None)
            .map_err(|e| self.failure(&e))
    }
}

/// A [`WasmPolicy`] bound to one allocation's devices in use; see [`WasmPolicy::session`].
#[derive(Debug)]
pub struct PolicySession<'a> {
    policy: &'a WasmPolicy,
    usage: CounterUsage,
    failure: Mutex<Option<PolicyError>>,
}

impl PolicySession<'_> {
    /// The first failure of a call made through this session, if any.
    pub fn failure(&self) -> Option<PolicyError> {
        self.failure.lock().clone()
    }

    /// The usage of shared counter sets by the allocated devices.
    pub fn counter_usage(&self) -> &CounterUsage {
        &self.usage
    }
}

impl SelectionPolicy for PolicySession<'_> {
    fn name(&self) -> &str {
        self.policy.name()
    }

    fn order(
        &self,
        request: &PolicyRequest<'_>,
        candidates: &[PolicyDevice<'_>],
    ) -> Result<PolicyOutcome, PolicyFailure> {
        self.policy
            .outcome(request, candidates, Some(&self.usage))
            .map_err(|e| {
                let failure = self.policy.failure(&e);
                self.failure.lock().get_or_insert(e);
                failure
            })
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}
