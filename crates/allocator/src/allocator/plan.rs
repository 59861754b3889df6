//! Planning: the scheduler's per-claim checks in its order, each request's (or subrequest's)
//! candidates, the check that skips a search that cannot succeed, and the selection policy's
//! reordering of candidates.

use kubedev_core::Quantity;
use smallvec::SmallVec;

use super::{
    AllocateOptions, Cands, ClaimName, ClaimPlan, Constraint, ConstraintKind, MAX_CLAIMS,
    MAX_DEVICES_PER_CLAIM, Mode, Plans, RequestPlan, SelectorSet, SubPlan, Verdict,
    static_capacity_fits, taint_blocks,
};
use crate::api::{
    DeviceClass, DeviceRequest, DeviceSelector, DeviceSubRequest, DeviceToleration,
    ExactDeviceRequest, ResourceClaim,
};
use crate::error::AllocationError;
use crate::model::{AttrKey, NodeDevice, NodeView, PoolState};
use crate::policy::{
    PolicyConstraint, PolicyConstraintKind, PolicyDevice, PolicyRequest, SelectionPolicy,
};

/// The per-claim checks and candidate lists of [`Allocator::plan`](super::Allocator::plan).
pub(super) fn plan_claims<'c>(
    view: &mut NodeView<'_>,
    classes: &'c [DeviceClass],
    class: &dyn Fn(&str) -> Option<usize>,
    claims: &'c [ResourceClaim],
    options: &AllocateOptions<'_>,
) -> Result<(Plans<'c>, u64), AllocationError> {
    if claims.len() > MAX_CLAIMS {
        return Err(AllocationError::TooManyClaims {
            count: claims.len(),
            limit: MAX_CLAIMS,
        });
    }
    let mut plans = Plans::with_capacity(claims.len());
    let mut evaluations = 0u64;
    for claim in claims {
        plan_claim(
            view,
            classes,
            class,
            claim,
            options,
            &mut evaluations,
            &mut plans,
        )?;
    }
    Ok((plans, evaluations))
}

/// Appends one claim's plan to `plans`: its requests in order, the check of its device
/// limit, its constraints, and for each subplan the match constraints that apply and the
/// selection policy's order. (Plans are built in place: they are large to move.)
fn plan_claim<'c>(
    view: &mut NodeView<'_>,
    classes: &'c [DeviceClass],
    class: &dyn Fn(&str) -> Option<usize>,
    claim: &'c ResourceClaim,
    options: &AllocateOptions<'_>,
    evaluations: &mut u64,
    plans: &mut Plans<'c>,
) -> Result<(), AllocationError> {
    plans.push(ClaimPlan {
        claim,
        display: ClaimName::new(claim),
        requests: SmallVec::with_capacity(claim.spec.devices.requests.len()),
        constraints: SmallVec::new(),
    });
    let at = plans.len() - 1;
    let ClaimPlan {
        display,
        requests,
        constraints,
        ..
    } = &mut plans[at];
    // The fewest devices the claim can get: each request's smallest alternative.
    let mut min_total = 0usize;
    for r in &claim.spec.devices.requests {
        min_total += plan_request(view, classes, class, display, r, evaluations, requests)?;
    }
    if min_total > MAX_DEVICES_PER_CLAIM {
        return Err(AllocationError::TooManyDevices {
            claim: display.to_string(),
            count: min_total,
            limit: MAX_DEVICES_PER_CLAIM,
        });
    }
    plan_constraints(view, claim, display, constraints)?;
    for rp in requests.iter_mut() {
        for sp in &mut rp.subs {
            sp.match_constraints = constraints
                .iter()
                .enumerate()
                .filter(|(_, c)| c.kind == ConstraintKind::Match && c.applies(sp.base, sp.sub))
                .map(|(i, _)| i)
                .collect();
            if let Some(policy) = options.policy {
                apply_policy(view, policy, options.fail_closed, display, constraints, sp)?;
            }
        }
    }
    Ok(())
}

/// Appends one request's plan to `requests`: each alternative of a `firstAvailable` request,
/// or its `exactly`. Returns the fewest devices the request can get (its smallest
/// alternative).
fn plan_request<'c>(
    view: &mut NodeView<'_>,
    classes: &'c [DeviceClass],
    class: &dyn Fn(&str) -> Option<usize>,
    claim: &ClaimName<'_>,
    r: &'c DeviceRequest,
    evaluations: &mut u64,
    requests: &mut SmallVec<[RequestPlan<'c>; 1]>,
) -> Result<usize, AllocationError> {
    let first_available = !r.first_available.is_empty();
    requests.push(RequestPlan {
        first_available,
        subs: SmallVec::new(),
    });
    let at = requests.len() - 1;
    let subs = &mut requests[at].subs;
    if first_available {
        for s in &r.first_available {
            let spec = SubSpec::subrequest(r, s, class);
            plan_sub(view, classes, claim, spec, evaluations, subs)?;
        }
        Ok(subs.iter().map(|s| s.num_devices).min().unwrap_or(0))
    } else {
        let Some(e) = &r.exactly else {
            return Err(AllocationError::EmptyRequest {
                claim: claim.to_string(),
                request: r.name.clone(),
            });
        };
        let spec = SubSpec::exactly(r, e, class);
        plan_sub(view, classes, claim, spec, evaluations, subs)?;
        Ok(subs.last().map_or(0, |s| s.num_devices))
    }
}

/// The claim's constraints, each with its attribute's slot in the view's cache; a
/// constraint that names no attribute is an error.
fn plan_constraints<'c>(
    view: &mut NodeView<'_>,
    claim: &'c ResourceClaim,
    display: &ClaimName<'_>,
    constraints: &mut SmallVec<[Constraint<'c>; 1]>,
) -> Result<(), AllocationError> {
    for (i, c) in claim.spec.devices.constraints.iter().enumerate() {
        let (kind, attribute) = match (&c.match_attribute, &c.distinct_attribute) {
            (Some(a), _) => (ConstraintKind::Match, a.as_str()),
            (None, Some(a)) => (ConstraintKind::Distinct, a.as_str()),
            (None, None) => {
                return Err(AllocationError::EmptyConstraint {
                    claim: display.to_string(),
                    index: i,
                });
            }
        };
        constraints.push(Constraint {
            kind,
            attribute,
            requests: &c.requests,
            slot: view.attr_slot(attribute),
        });
    }
    Ok(())
}

/// The steps and candidates a search looks at when each request takes its first candidates
/// (of its largest alternative): the work of a search that does not need to go back.
pub(super) fn direct_path(plans: &[ClaimPlan<'_>]) -> u64 {
    let mut work = 1;
    for cp in plans {
        work += 1;
        for rp in &cp.requests {
            let most = rp.subs.iter().map(|sp| sp.num_devices).max().unwrap_or(0);
            work += 1 + 2 * most as u64;
        }
    }
    work
}

/// Whether some request cannot be satisfied whatever the other requests get: too few
/// candidates, no group of candidates sharing a matchAttribute value, too few distinct values,
/// or an `All` request over a device that is in use or tainted. Then the claims do not fit and
/// the search is skipped. Only used when the search could not end in an error instead
/// (no selector errors, no `All` request in a claim with constraints), so the outcome is the
/// one the full search would reach. Candidates are evaluated only until each request is seen
/// to be possible; all of them only when one is not.
pub(super) fn statically_impossible(view: &NodeView<'_>, plans: &[ClaimPlan<'_>]) -> bool {
    let all_with_constraints = plans.iter().any(|cp| {
        !cp.constraints.is_empty()
            && cp
                .requests
                .iter()
                .any(|rp| rp.subs.iter().any(|sp| matches!(sp.mode, Mode::All)))
    });
    if all_with_constraints {
        return false;
    }
    let impossible = plans.iter().any(|cp| {
        cp.requests
            .iter()
            .any(|rp| rp.subs.iter().all(|sp| !sub_possible(view, cp, sp)))
    });
    if !impossible {
        return false;
    }
    // A selector error anywhere would end the search with that error instead.
    !plans.iter().any(|cp| {
        cp.requests.iter().any(|rp| {
            rp.subs.iter().any(|sp| {
                sp.cands.complete(view, &cp.display);
                sp.cands.has_errors()
            })
        })
    })
}

fn sub_possible(view: &NodeView<'_>, cp: &ClaimPlan<'_>, sp: &SubPlan<'_>) -> bool {
    let usable = |dev: &NodeDevice<'_>| {
        (sp.admin || !(dev.allocated || dev.held_by_share()))
            && dev.node_operations_ok
            && !taint_blocks(dev, sp.tolerations)
    };
    match sp.mode {
        Mode::All => {
            !sp.all_devices.is_empty()
                && sp
                    .all_devices
                    .iter()
                    .all(|&d| usable(&view.devices[d as usize]))
        }
        Mode::Exact(_) => {
            let n = sp.num_devices;
            if n == 0 {
                return true;
            }
            // With list-type attributes values are sets: only the count is checked.
            let applicable: SmallVec<[usize; 4]> = cp
                .constraints
                .iter()
                .enumerate()
                .filter(|(_, c)| !view.list_attributes && c.applies(sp.base, sp.sub))
                .map(|(ci, _)| ci)
                .collect();
            let in_force = || applicable.iter().map(|&ci| (ci, &cp.constraints[ci]));
            // The values seen among usable candidates, with their counts: (constraint, value,
            // count).
            let mut groups: SmallVec<[(usize, AttrKey<'_>, usize); 4]> = SmallVec::new();
            let mut count = 0;
            let mut i = 0;
            while let Some((d, _)) = sp.cands.get(view, &cp.display, i) {
                i += 1;
                if !usable(&view.devices[d as usize]) {
                    continue;
                }
                count += 1;
                for (ci, c) in in_force() {
                    if let Some(v) = view.attr(c.slot, d as usize) {
                        match groups.iter_mut().find(|(k, key, _)| *k == ci && *key == v) {
                            Some(g) => g.2 += 1,
                            None => groups.push((ci, v, 1)),
                        }
                    }
                }
                let enough = count >= n
                    && in_force().all(|(ci, c)| match c.kind {
                        ConstraintKind::Match => groups.iter().any(|&(k, _, m)| k == ci && m >= n),
                        ConstraintKind::Distinct => {
                            groups.iter().filter(|&&(k, _, _)| k == ci).count() >= n
                        }
                    });
                if enough {
                    return true;
                }
            }
            false
        }
    }
}

/// Asks the policy about one `ExactCount` subplan: reorders its candidates and leaves out
/// the ones it rejects. Candidates whose selectors failed stay where they are (the search
/// must still reach their error, as the scheduler would). On a failure the default order
/// stands, or with `fail_closed` the allocation is refused.
fn apply_policy(
    view: &NodeView<'_>,
    policy: &dyn SelectionPolicy,
    fail_closed: bool,
    claim: &ClaimName<'_>,
    constraints: &[Constraint<'_>],
    sp: &mut SubPlan<'_>,
) -> Result<(), AllocationError> {
    if !matches!(sp.mode, Mode::Exact(_)) {
        return Ok(());
    }
    sp.cands.complete(view, claim);
    let old: Vec<(u32, Option<usize>)> = sp.cands.known().to_vec();
    if old.is_empty() {
        return Ok(());
    }
    let devices: Vec<PolicyDevice<'_>> = old
        .iter()
        .map(|&(d, _)| {
            let dev = &view.devices[d as usize];
            PolicyDevice::new(dev.driver(), dev.pool_name(), dev.device)
                .with_allocated(dev.allocated)
        })
        .collect();
    let in_force: Vec<PolicyConstraint<'_>> = constraints
        .iter()
        .filter(|c| c.applies(sp.base, sp.sub))
        .map(|c| {
            let kind = match c.kind {
                ConstraintKind::Match => PolicyConstraintKind::MatchAttribute,
                ConstraintKind::Distinct => PolicyConstraintKind::DistinctAttribute,
            };
            PolicyConstraint::new(kind, c.attribute)
        })
        .collect();
    let request =
        PolicyRequest::new(claim, &sp.full_name, sp.num_devices).with_constraints(&in_force);
    let outcome = policy.order(&request, &devices).and_then(|o| {
        o.check(devices.len()).map(|()| o).map_err(|message| {
            crate::policy::PolicyFailure::new(policy.name(), "bad-output", message)
        })
    });
    let outcome = match outcome {
        Ok(o) => o,
        Err(failure) if fail_closed => {
            return Err(AllocationError::Policy {
                claim: claim.to_string(),
                request: sp.full_name.to_string(),
                failure: Box::new(failure),
            });
        }
        Err(_) => return Ok(()),
    };
    let mut reason: Vec<Option<String>> = vec![None; old.len()];
    for r in outcome.rejected {
        reason[r.index] = Some(r.reason);
    }
    let order = outcome.order.unwrap_or_else(|| (0..old.len()).collect());
    let mut cands = Vec::with_capacity(old.len());
    for i in order {
        let (d, err) = old[i];
        match reason[i].take() {
            Some(why) if err.is_none() => sp.policy_rejected.push((d, why)),
            _ => cands.push((d, err)),
        }
    }
    sp.cands.replace(cands);
    Ok(())
}

/// What a request or a subrequest asks for, whichever of the two it is.
struct SubSpec<'c> {
    /// The name errors give it (the subrequest's own name for a subrequest).
    name: &'c str,
    base: &'c str,
    sub: Option<&'c str>,
    class_name: &'c str,
    class: Option<usize>,
    selectors: &'c [DeviceSelector],
    mode: Option<&'c str>,
    count: Option<i64>,
    admin: bool,
    tolerations: &'c [DeviceToleration],
    capacity: Option<&'c crate::api::CapacityRequirements>,
}

impl<'c> SubSpec<'c> {
    /// Alternative `s` of request `r`'s `firstAvailable`.
    fn subrequest(
        r: &'c DeviceRequest,
        s: &'c DeviceSubRequest,
        class: &dyn Fn(&str) -> Option<usize>,
    ) -> SubSpec<'c> {
        SubSpec {
            name: &s.name,
            base: &r.name,
            sub: Some(&s.name),
            class_name: &s.device_class_name,
            class: class(&s.device_class_name),
            selectors: &s.selectors,
            mode: s.allocation_mode.as_deref(),
            count: s.count,
            admin: false,
            tolerations: &s.tolerations,
            capacity: s.capacity.as_ref(),
        }
    }

    /// Request `r`'s `exactly`.
    fn exactly(
        r: &'c DeviceRequest,
        e: &'c ExactDeviceRequest,
        class: &dyn Fn(&str) -> Option<usize>,
    ) -> SubSpec<'c> {
        SubSpec {
            name: &r.name,
            base: &r.name,
            sub: None,
            class_name: &e.device_class_name,
            class: class(&e.device_class_name),
            selectors: &e.selectors,
            mode: e.allocation_mode.as_deref(),
            count: e.count,
            admin: e.admin_access.unwrap_or(false),
            tolerations: &e.tolerations,
            capacity: e.capacity.as_ref(),
        }
    }

    /// The index of the class, once the request's selectors, its class name, the class and
    /// the class's selectors are checked, in the scheduler's order.
    fn checked_class(
        &self,
        classes: &[DeviceClass],
        claim: &ClaimName<'_>,
    ) -> Result<usize, AllocationError> {
        self.check_selectors(self.selectors, claim)?;
        if self.class_name.is_empty() {
            return Err(AllocationError::MissingClassName {
                claim: claim.to_string(),
                request: self.name.to_string(),
            });
        }
        let Some(class) = self.class else {
            return Err(AllocationError::ClassNotFound {
                claim: claim.to_string(),
                request: self.name.to_string(),
                class: self.class_name.to_string(),
            });
        };
        self.check_selectors(&classes[class].spec.selectors, claim)?;
        Ok(class)
    }

    /// Fails on the first selector without a CEL expression.
    #[inline]
    fn check_selectors(
        &self,
        selectors: &[DeviceSelector],
        claim: &ClaimName<'_>,
    ) -> Result<(), AllocationError> {
        match selectors.iter().position(|sel| sel.cel.is_none()) {
            Some(index) => Err(AllocationError::EmptySelector {
                claim: claim.to_string(),
                request: self.name.to_string(),
                index,
            }),
            None => Ok(()),
        }
    }

    /// The capacity requested, parsed (capacity name, amount).
    fn capacity_request(
        &self,
        claim: &ClaimName<'_>,
    ) -> Result<Option<Vec<(&'c str, Quantity)>>, AllocationError> {
        let Some(req) = self.capacity else {
            return Ok(None);
        };
        let mut out = Vec::with_capacity(req.requests.len());
        for (name, q) in &req.requests {
            let q = Quantity::parse(q.as_str()).map_err(|e| AllocationError::CapacityRequest {
                claim: claim.to_string(),
                request: self.name.to_string(),
                message: format!("capacity request {name}: {}", kubedev_core::echo::chain(&e)),
            })?;
            out.push((name.as_str(), q));
        }
        Ok(Some(out))
    }
}

/// One request's or subrequest's plan: checked, its capacity request parsed, and its
/// candidates (`ExactCount`, evaluated as the search asks) or its devices (`All`, all of
/// them evaluated now).
fn plan_sub<'c>(
    view: &mut NodeView<'_>,
    classes: &'c [DeviceClass],
    claim: &ClaimName<'_>,
    s: SubSpec<'c>,
    evaluations: &mut u64,
    subs: &mut SmallVec<[SubPlan<'c>; 1]>,
) -> Result<(), AllocationError> {
    let class = s.checked_class(classes, claim)?;
    let capacity = s.capacity_request(claim)?;
    let (mode, cands, all_devices) = match s.mode.unwrap_or("ExactCount") {
        "ExactCount" => {
            let n = match s.count {
                None | Some(0) => 1,
                Some(n) => usize::try_from(n).unwrap_or(0),
            };
            let set = SelectorSet::new(view, classes, class, s.selectors);
            (Mode::Exact(n), Cands::new(set), Vec::new())
        }
        "All" => {
            let devices = all_mode_devices(
                view,
                classes,
                claim,
                &s,
                class,
                capacity.as_deref(),
                evaluations,
            )?;
            (Mode::All, Cands::none(), devices)
        }
        other => {
            return Err(AllocationError::UnsupportedMode {
                claim: claim.to_string(),
                request: s.name.to_string(),
                mode: other.to_string(),
            });
        }
    };
    let num_devices = match mode {
        Mode::Exact(n) => n,
        Mode::All => all_devices.len(),
    };
    subs.push(SubPlan {
        full_name: match s.sub {
            Some(sub) => std::borrow::Cow::Owned(format!("{}/{}", s.base, sub)),
            None => std::borrow::Cow::Borrowed(s.base),
        },
        base: s.base,
        sub: s.sub,
        class,
        selectors: s.selectors,
        admin: s.admin,
        tolerations: s.tolerations,
        capacity,
        mode,
        num_devices,
        all_devices,
        cands,
        match_constraints: SmallVec::new(),
        policy_rejected: Vec::new(),
    });
    Ok(())
}

/// The devices an `All` request takes: every device of every pool that matches and has the
/// capacity requested. An incomplete or invalid pool is an error, as is a selector error.
fn all_mode_devices(
    view: &mut NodeView<'_>,
    classes: &[DeviceClass],
    claim: &ClaimName<'_>,
    s: &SubSpec<'_>,
    class: usize,
    capacity: Option<&[(&str, Quantity)]>,
    evaluations: &mut u64,
) -> Result<Vec<u32>, AllocationError> {
    let set = SelectorSet::new(view, classes, class, s.selectors);
    let mut devices = Vec::new();
    for pi in 0..view.pools.len() {
        let pool = &view.pools[pi];
        match &pool.state {
            PoolState::Incomplete => {
                return Err(AllocationError::AllIncompletePool {
                    claim: claim.to_string(),
                    request: s.name.to_string(),
                    pool: pool.id(),
                });
            }
            PoolState::Invalid(_) => {
                return Err(AllocationError::AllInvalidPool {
                    claim: claim.to_string(),
                    request: s.name.to_string(),
                    pool: pool.id(),
                });
            }
            PoolState::Usable => {}
        }
        for d in pool.devices.clone() {
            match set.verdict(view, d, claim, evaluations) {
                Verdict::Match => {
                    let dev = &view.devices[d];
                    if static_capacity_fits(dev, capacity) {
                        devices.push(d as u32);
                    }
                }
                Verdict::Error(e) => return Err(e),
                _ => {}
            }
        }
    }
    Ok(devices)
}
