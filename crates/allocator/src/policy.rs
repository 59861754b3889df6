//! The selection-policy hook: a policy may reorder the devices that are valid for a request,
//! by preference. It only changes which valid solution the search finds first; every rule of
//! the allocator still applies, so a policy can never make an invalid allocation valid.

use std::fmt;

use crate::api::Device;

/// A request the search is about to fill.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct PolicyRequest<'r> {
    /// Claim as `namespace/name`.
    pub claim: &'r str,
    /// `request` or `request/subrequest`.
    pub request: &'r str,
    /// Devices wanted (for `All`, every candidate).
    pub count: usize,
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
}

/// Orders valid candidates by preference. The default (no policy) keeps the scheduler's order
/// (pools by driver and name, slices by name, devices as listed), so results are identical to
/// the scheduler's.
pub trait SelectionPolicy: fmt::Debug + Send + Sync {
    /// Returns the candidates' indices in preferred order, or `None` to keep the order. A
    /// result that is not a permutation of `0..candidates.len()` is ignored.
    fn order(
        &self,
        request: &PolicyRequest<'_>,
        candidates: &[PolicyDevice<'_>],
    ) -> Option<Vec<usize>>;
}

/// Checks that `order` is a permutation of `0..n`.
pub(crate) fn is_permutation(order: &[usize], n: usize) -> bool {
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
