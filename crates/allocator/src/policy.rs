//! The selection-policy hook: a policy may reorder the devices that are valid for a request,
//! by preference, and reject some of them with a reason. It only changes which valid
//! solution the search finds first, or removes candidates; every rule of the allocator still
//! applies, so a policy can never make an invalid allocation valid.

use std::fmt;

use crate::api::Device;

/// The kind of a claim constraint in force for a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PolicyConstraintKind {
    /// `matchAttribute`: every device of the constrained requests has the same value.
    MatchAttribute,
    /// `distinctAttribute`: every device of the constrained requests has a different value.
    DistinctAttribute,
}

/// A claim constraint that applies to the request being filled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PolicyConstraint<'r> {
    /// What the constraint demands.
    pub kind: PolicyConstraintKind,
    /// The attribute, as written in the claim (a qualified name).
    pub attribute: &'r str,
}

impl<'r> PolicyConstraint<'r> {
    /// A constraint of `kind` over `attribute`.
    pub fn new(kind: PolicyConstraintKind, attribute: &'r str) -> Self {
        PolicyConstraint { kind, attribute }
    }
}

/// A request the search is about to fill.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct PolicyRequest<'r> {
    /// Claim as `namespace/name`.
    pub claim: &'r str,
    /// `request` or `request/subrequest`.
    pub request: &'r str,
    /// Devices wanted.
    pub count: usize,
    /// The claim's constraints that apply to this request, in claim order.
    pub constraints: &'r [PolicyConstraint<'r>],
}

impl<'r> PolicyRequest<'r> {
    /// A request of `claim` for `count` devices, without constraints.
    pub fn new(claim: &'r str, request: &'r str, count: usize) -> Self {
        PolicyRequest {
            claim,
            request,
            count,
            constraints: &[],
        }
    }

    /// With the constraints in force.
    pub fn with_constraints(mut self, constraints: &'r [PolicyConstraint<'r>]) -> Self {
        self.constraints = constraints;
        self
    }
}

/// A candidate device: it passed the class and request selectors and the node check.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct PolicyDevice<'d> {
    /// Driver name.
    pub driver: &'d str,
    /// Pool name.
    pub pool: &'d str,
    /// The device as published.
    pub device: &'d Device,
    /// The device is already allocated (listed in the allocated devices). The search skips
    /// it unless the request has admin access.
    pub allocated: bool,
}

impl<'d> PolicyDevice<'d> {
    /// A candidate `device` of `driver`'s `pool`, not allocated.
    pub fn new(driver: &'d str, pool: &'d str, device: &'d Device) -> Self {
        PolicyDevice {
            driver,
            pool,
            device,
            allocated: false,
        }
    }

    /// Marks the candidate as already allocated (or not).
    pub fn with_allocated(mut self, allocated: bool) -> Self {
        self.allocated = allocated;
        self
    }
}

/// A candidate the policy refuses, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PolicyRejection {
    /// Index of the candidate.
    pub index: usize,
    /// The policy's reason, for explanations.
    pub reason: String,
}

/// A policy's answer for one request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PolicyOutcome {
    /// Candidate indices in preferred order (a permutation of `0..candidates.len()`), or
    /// `None` to keep the default order.
    pub order: Option<Vec<usize>>,
    /// Candidates the policy refuses: the allocator leaves them out of this request.
    pub rejected: Vec<PolicyRejection>,
}

impl PolicyOutcome {
    /// No preference and no rejection: the default order stands.
    pub fn keep() -> Self {
        PolicyOutcome::default()
    }

    /// The candidates in this order of preference.
    pub fn ordered(order: Vec<usize>) -> Self {
        PolicyOutcome {
            order: Some(order),
            rejected: Vec::new(),
        }
    }

    /// Also refuses candidate `index`, for `reason`.
    pub fn with_rejection(mut self, index: usize, reason: impl Into<String>) -> Self {
        self.rejected.push(PolicyRejection {
            index,
            reason: reason.into(),
        });
        self
    }

    /// Checks the outcome against `n` candidates: the order is a permutation, every
    /// rejected index is in range and rejected once.
    pub(crate) fn check(&self, n: usize) -> Result<(), String> {
        if let Some(order) = &self.order
            && !is_permutation(order, n)
        {
            return Err(format!(
                "the order {order:?} is not a permutation of the {n} candidates"
            ));
        }
        let mut seen = vec![false; n];
        for r in &self.rejected {
            match seen.get_mut(r.index) {
                None => {
                    return Err(format!("rejects candidate {}, there are {n}", r.index));
                }
                Some(s) if *s => return Err(format!("rejects candidate {} twice", r.index)),
                Some(s) => *s = true,
            }
        }
        Ok(())
    }
}

/// Why a policy gave no answer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("policy {policy} failed ({kind}): {message}")]
#[non_exhaustive]
pub struct PolicyFailure {
    /// The policy's name.
    pub policy: String,
    /// A short stable name of the failure (`out-of-fuel`, `trap`, `bad-output`, ...).
    pub kind: String,
    /// What went wrong.
    pub message: String,
}

impl PolicyFailure {
    /// A failure of `policy` of `kind`, described by `message`.
    pub fn new(
        policy: impl Into<String>,
        kind: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        PolicyFailure {
            policy: policy.into(),
            kind: kind.into(),
            message: message.into(),
        }
    }
}

/// Orders valid candidates by preference and may reject some. The default (no policy) keeps
/// the scheduler's order (pools by driver and name, slices by name, devices as listed), so
/// results are identical to the scheduler's.
///
/// The allocator asks the policy once per `ExactCount` request (or subrequest) that has
/// candidates; `All` requests take every matching device and are not asked. When the policy
/// fails — an error, or an outcome that is not a permutation or rejects a candidate that does
/// not exist — the allocator keeps the default order, or with
/// [`AllocateOptions::fail_closed`](crate::AllocateOptions::fail_closed) refuses with
/// [`AllocationError::Policy`](crate::AllocationError::Policy).
pub trait SelectionPolicy: fmt::Debug + Send + Sync {
    /// The policy's name, for errors and explanations.
    fn name(&self) -> &str;

    /// The preference order and the rejected candidates for `request`, or why there is no
    /// answer.
    fn order(
        &self,
        request: &PolicyRequest<'_>,
        candidates: &[PolicyDevice<'_>],
    ) -> Result<PolicyOutcome, PolicyFailure>;
}

/// Checks that `order` is a permutation of `0..n`.
fn is_permutation(order: &[usize], n: usize) -> bool {
    if order.len() != n {
        return false;
    }
    let mut seen = vec![false; n];
    for &i in order {
        if i >= n || seen[i] {
            return false;
        }
        seen[i] = true;
    }
    true
}
