//! Fault injection and request accounting.

use parking_lot::{Mutex, MutexGuard};
use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use super::resource::{Resource, Verb};
use super::status::ApiError;

/// A failure the emulator can answer a request with instead of serving it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// HTTP 500 with reason `InternalError`.
    InternalError,
    /// HTTP 409 with reason `Conflict`, as after a concurrent write.
    Conflict,
    /// HTTP 429 with reason `TooManyRequests` and `Retry-After: 1`.
    TooManyRequests,
    /// HTTP 503 with reason `ServiceUnavailable`.
    ServiceUnavailable,
    /// HTTP 400 with reason `BadRequest`, as an admission webhook that does not support dry
    /// run answers a `dryRun` request.
    DryRunUnsupported,
}

impl Fault {
    pub(crate) fn to_error(self, verb: Verb, resource: Resource) -> ApiError {
        match self {
            Fault::DryRunUnsupported => ApiError::bad_request(
                "admission webhook \"policy.example.com\" does not support dry run",
            ),
            Fault::InternalError => ApiError::internal(format!(
                "injected fault: internal error on {verb} {resource}"
            )),
            Fault::Conflict => ApiError::new(
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {resource}: injected fault: the object has been modified; please apply your changes to the latest version and try again"
                ),
            ),
            Fault::TooManyRequests => ApiError::new(
                429,
                "TooManyRequests",
                format!(
                    "injected fault: too many requests for {verb} {resource}, please try again later"
                ),
            ),
            Fault::ServiceUnavailable => ApiError::new(
                503,
                "ServiceUnavailable",
                format!(
                    "injected fault: the server is currently unable to handle {verb} {resource}"
                ),
            ),
        }
    }
}

#[derive(Debug)]
struct Rule {
    verb: Verb,
    resource: Resource,
    remaining: usize,
    fault: Fault,
}

#[derive(Debug, Default)]
struct Inner {
    rules: VecDeque<Rule>,
    latency: Duration,
    counts: BTreeMap<(Verb, Resource), u64>,
}

/// Shared fault plan and request counters.
#[derive(Debug, Default)]
pub(crate) struct Faults {
    inner: Mutex<Inner>,
}

impl Faults {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock()
    }

    pub(crate) fn fail_next(&self, verb: Verb, resource: Resource, count: usize, fault: Fault) {
        if count > 0 {
            self.lock().rules.push_back(Rule {
                verb,
                resource,
                remaining: count,
                fault,
            });
        }
    }

    pub(crate) fn clear(&self) {
        self.lock().rules.clear();
    }

    pub(crate) fn set_latency(&self, latency: Duration) {
        self.lock().latency = latency;
    }

    /// Counts a request and tells whether it must fail, and how long to delay it.
    pub(crate) fn admit(&self, verb: Verb, resource: Resource) -> (Duration, Option<Fault>) {
        let mut inner = self.lock();
        *inner.counts.entry((verb, resource)).or_default() += 1;
        let latency = inner.latency;
        let mut fault = None;
        if let Some(i) = inner
            .rules
            .iter()
            .position(|r| r.verb == verb && r.resource == resource)
        {
            let rule = &mut inner.rules[i];
            fault = Some(rule.fault);
            rule.remaining -= 1;
            if rule.remaining == 0 {
                inner.rules.remove(i);
            }
        }
        (latency, fault)
    }

    pub(crate) fn count(&self, verb: Verb, resource: Resource) -> u64 {
        self.lock()
            .counts
            .get(&(verb, resource))
            .copied()
            .unwrap_or(0)
    }

    pub(crate) fn counts(&self) -> BTreeMap<(Verb, Resource), u64> {
        self.lock().counts.clone()
    }

    pub(crate) fn reset_counts(&self) {
        self.lock().counts.clear();
    }
}
