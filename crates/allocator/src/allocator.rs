//! The allocator: request planning, the depth-first search and result building.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kubedev_core::Quantity;

use crate::api::{
    AllocationResult, DeviceAllocationConfiguration, DeviceAllocationResult, DeviceClass,
    DeviceRequestAllocationResult, DeviceSelector, DeviceToleration, Node, NodeSelector,
    NodeSelectorRequirement, NodeSelectorTerm, ResourceClaim, ResourceSlice,
};
use crate::cel;
use crate::error::{AllocationError, SelectorOwner};
use crate::model::{AttrKey, Dev, NodeView, PoolState, build_node_view};
use crate::policy::{
    PolicyConstraint, PolicyConstraintKind, PolicyDevice, PolicyRequest, SelectionPolicy,
};
use crate::scenario::split_device_id;

/// Most devices one claim can get (the API's `AllocationResultsMaxSize`).
pub const MAX_DEVICES_PER_CLAIM: usize = 32;
/// Most claims allocated together.
pub const MAX_CLAIMS: usize = 128;

/// Options of one allocation.
#[derive(Clone, Copy, Debug, Default)]
#[non_exhaustive]
pub struct AllocateOptions<'p> {
    /// Stop with [`AllocationError::Deadline`] when the search runs longer than this.
    pub deadline: Option<Duration>,
    /// Reorders valid candidates by preference and may reject some; `None` keeps the
    /// scheduler's order.
    pub policy: Option<&'p dyn SelectionPolicy>,
    /// When the policy fails: `false` (the default) keeps the default order for that
    /// request, `true` refuses the allocation with [`AllocationError::Policy`].
    pub fail_closed: bool,
}

impl<'p> AllocateOptions<'p> {
    /// Options with a search deadline.
    pub fn with_deadline(mut self, deadline: Duration) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// Options with a selection policy.
    pub fn with_policy(mut self, policy: &'p dyn SelectionPolicy) -> Self {
        self.policy = Some(policy);
        self
    }

    /// Options that refuse the allocation when the policy fails (`true`) or keep the
    /// default order (`false`, the default).
    pub fn with_fail_closed(mut self, fail_closed: bool) -> Self {
        self.fail_closed = fail_closed;
        self
    }
}

/// Search statistics of the last allocation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SearchStats {
    /// Search steps (calls of the per-device step, as the scheduler counts them).
    pub steps: u64,
    /// Selector evaluations run (cache misses).
    pub evaluations: u64,
}

/// An allocator over a fixed set of slices, classes and allocated devices. Build it once and
/// call [`Allocator::allocate`] for each set of claims; it caches per node the prepared
/// devices and every selector result, so repeated allocations are cheap.
#[derive(Debug)]
pub struct Allocator<'a> {
    slices: &'a [ResourceSlice],
    classes: &'a [DeviceClass],
    allocated: HashSet<(&'a str, &'a str, &'a str)>,
    class_index: HashMap<&'a str, usize>,
    nodes: HashMap<String, Result<NodeView<'a>, String>>,
    stats: SearchStats,
}

/// The selector results of one device for one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    Match,
    /// The first failing selector: class (true) or request selector, its index.
    Selector {
        class: bool,
        index: usize,
    },
    /// Per-device node selection excludes the node.
    Node,
    Error(AllocationError),
}

#[derive(Debug)]
pub(crate) enum Mode {
    Exact(usize),
    All,
}

/// One request, or one subrequest of a `firstAvailable` request.
#[derive(Debug)]
pub(crate) struct SubPlan<'c> {
    pub(crate) full_name: String,
    pub(crate) base: &'c str,
    pub(crate) sub: Option<&'c str>,
    pub(crate) class: usize,
    pub(crate) selectors: &'c [DeviceSelector],
    pub(crate) admin: bool,
    pub(crate) tolerations: &'c [DeviceToleration],
    pub(crate) capacity: Option<Vec<(&'c str, Quantity)>>,
    pub(crate) mode: Mode,
    pub(crate) num_devices: usize,
    pub(crate) all_devices: Vec<u32>,
    /// Devices that match or whose selectors fail, in search order; with the error if any.
    pub(crate) cands: Vec<(u32, Option<usize>)>,
    pub(crate) errors: Vec<AllocationError>,
    /// Match constraints of the claim that apply to this subplan.
    pub(crate) match_constraints: Vec<usize>,
    /// Devices the selection policy rejected for this subplan (left out of `cands`), with
    /// the policy's reason.
    pub(crate) policy_rejected: Vec<(u32, String)>,
}

#[derive(Debug)]
pub(crate) struct RequestPlan<'c> {
    pub(crate) first_available: bool,
    pub(crate) subs: Vec<SubPlan<'c>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ConstraintKind {
    Match,
    Distinct,
}

#[derive(Debug)]
pub(crate) struct Constraint<'c> {
    pub(crate) kind: ConstraintKind,
    pub(crate) attribute: &'c str,
    pub(crate) requests: &'c [String],
    /// The attribute's slot in the node view's attribute cache.
    pub(crate) slot: usize,
}

impl Constraint<'_> {
    pub(crate) fn applies(&self, base: &str, sub: Option<&str>) -> bool {
        if self.requests.is_empty() {
            return true;
        }
        self.requests.iter().any(|r| {
            r == base
                || sub.is_some_and(|s| {
                    r.len() == base.len() + 1 + s.len()
                        && r.starts_with(base)
                        && r.as_bytes()[base.len()] == b'/'
                        && r.ends_with(s)
                })
        })
    }
}

#[derive(Debug)]
pub(crate) struct ClaimPlan<'c> {
    pub(crate) claim: &'c ResourceClaim,
    pub(crate) display: String,
    pub(crate) requests: Vec<RequestPlan<'c>>,
    pub(crate) constraints: Vec<Constraint<'c>>,
}

/// `namespace/name`, or `name` without a namespace (as the scheduler prints objects).
pub(crate) fn claim_display(claim: &ResourceClaim) -> String {
    if claim.metadata.namespace.is_empty() {
        claim.metadata.name.clone()
    } else {
        format!("{}/{}", claim.metadata.namespace, claim.metadata.name)
    }
}

impl<'a> Allocator<'a> {
    /// An allocator over all ResourceSlices, DeviceClasses and the devices already in use
    /// (`driver/pool/device`; malformed entries are ignored, the scenario loader rejects them).
    pub fn new(
        slices: &'a [ResourceSlice],
        classes: &'a [DeviceClass],
        allocated_devices: &'a [String],
    ) -> Allocator<'a> {
        Allocator {
            slices,
            classes,
            allocated: allocated_devices
                .iter()
                .filter_map(|s| split_device_id(s))
                .collect(),
            class_index: {
                let mut m = HashMap::with_capacity(classes.len());
                for (i, c) in classes.iter().enumerate() {
                    m.entry(c.metadata.name.as_str()).or_insert(i);
                }
                m
            },
            nodes: HashMap::new(),
            stats: SearchStats::default(),
        }
    }

    pub(crate) fn classes_slice(&self) -> &'a [DeviceClass] {
        self.classes
    }

    /// Statistics of the last [`Allocator::allocate`] call.
    pub fn stats(&self) -> SearchStats {
        self.stats
    }

    pub(crate) fn node_view(&mut self, node: &Node) -> Result<&mut NodeView<'a>, AllocationError> {
        Self::view_in(&mut self.nodes, self.slices, &self.allocated, node)
    }

    fn view_in<'m>(
        nodes: &'m mut HashMap<String, Result<NodeView<'a>, String>>,
        slices: &'a [ResourceSlice],
        allocated: &HashSet<(&'a str, &'a str, &'a str)>,
        node: &Node,
    ) -> Result<&'m mut NodeView<'a>, AllocationError> {
        if !nodes.contains_key(&node.name) {
            let view = build_node_view(node, slices, allocated);
            nodes.insert(node.name.clone(), view);
        }
        match nodes.get_mut(&node.name) {
            Some(Ok(v)) => Ok(v),
            Some(Err(message)) => Err(AllocationError::NodeSelection {
                message: message.clone(),
            }),
            None => Err(AllocationError::NodeSelection {
                message: "node view missing".into(),
            }),
        }
    }

    /// Allocates devices for `claims` (as for one pod) on `node`. `Ok(None)` means the claims
    /// do not fit; errors are inputs the allocator cannot judge.
    pub fn allocate(
        &mut self,
        node: &Node,
        claims: &[ResourceClaim],
        options: &AllocateOptions<'_>,
    ) -> Result<Option<Vec<AllocationResult>>, AllocationError> {
        self.stats = SearchStats::default();
        let classes = self.classes;
        let view = Self::view_in(&mut self.nodes, self.slices, &self.allocated, node)?;
        let (plan, evaluations) = plan_claims(view, classes, &self.class_index, claims, options)?;
        self.stats.evaluations = evaluations;
        let (results, steps) = if statically_impossible(view, &plan) {
            (Ok(None), 0)
        } else {
            let mut search = Search::new(view, &plan, options.deadline);
            let outcome = match search.run() {
                Ok(true) => search.results(node, classes).map(Some),
                Ok(false) => Ok(None),
                Err(e) => Err(e),
            };
            (outcome, search.steps)
        };
        self.stats.steps = steps;
        let results = results?;
        if results.is_none() {
            let invalid: Vec<String> = view
                .pools
                .iter()
                .filter_map(|p| match &p.state {
                    PoolState::Invalid(reason) => Some(format!("{}: {reason}", p.id())),
                    _ => None,
                })
                .collect();
            if !invalid.is_empty() {
                return Err(AllocationError::InvalidPools {
                    reasons: invalid.join("; "),
                });
            }
        }
        Ok(results)
    }

    /// Validates the claims and computes, for every request, its candidates (the scheduler's
    /// per-claim checks, in its order).
    pub(crate) fn plan<'c>(
        &mut self,
        node: &Node,
        claims: &'c [ResourceClaim],
        options: &AllocateOptions<'_>,
    ) -> Result<Vec<ClaimPlan<'c>>, AllocationError> {
        let classes = self.classes;
        let view = Self::view_in(&mut self.nodes, self.slices, &self.allocated, node)?;
        let (plan, evaluations) = plan_claims(view, classes, &self.class_index, claims, options)?;
        self.stats.evaluations = evaluations;
        Ok(plan)
    }
}

/// The per-claim checks and candidate lists of [`Allocator::plan`].
fn plan_claims<'c>(
    view: &mut NodeView<'_>,
    classes: &[DeviceClass],
    class_index: &HashMap<&str, usize>,
    claims: &'c [ResourceClaim],
    options: &AllocateOptions<'_>,
) -> Result<(Vec<ClaimPlan<'c>>, u64), AllocationError> {
    if claims.len() > MAX_CLAIMS {
        return Err(AllocationError::TooManyClaims {
            count: claims.len(),
            limit: MAX_CLAIMS,
        });
    }
    let class = |name: &str| class_index.get(name).copied();
    let mut plans = Vec::with_capacity(claims.len());
    let mut evaluations = 0u64;
    for claim in claims {
        let display = claim_display(claim);
        let mut requests = Vec::with_capacity(claim.spec.devices.requests.len());
        let mut min_total = 0usize;
        for r in &claim.spec.devices.requests {
            let mut subs = Vec::new();
            let first_available = !r.first_available.is_empty();
            if first_available {
                for s in &r.first_available {
                    let p = SubSpec {
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
                    };
                    subs.push(plan_sub(view, classes, &display, p, &mut evaluations)?);
                }
                min_total += subs.iter().map(|s| s.num_devices).min().unwrap_or(0);
            } else {
                let Some(e) = &r.exactly else {
                    return Err(AllocationError::EmptyRequest {
                        claim: display,
                        request: r.name.clone(),
                    });
                };
                let p = SubSpec {
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
                };
                let sp = plan_sub(view, classes, &display, p, &mut evaluations)?;
                min_total += sp.num_devices;
                subs.push(sp);
            }
            requests.push(RequestPlan {
                first_available,
                subs,
            });
        }
        if min_total > MAX_DEVICES_PER_CLAIM {
            return Err(AllocationError::TooManyDevices {
                claim: display,
                count: min_total,
                limit: MAX_DEVICES_PER_CLAIM,
            });
        }
        let mut constraints = Vec::new();
        for (i, c) in claim.spec.devices.constraints.iter().enumerate() {
            let (kind, attribute) = match (&c.match_attribute, &c.distinct_attribute) {
                (Some(a), _) => (ConstraintKind::Match, a.as_str()),
                (None, Some(a)) => (ConstraintKind::Distinct, a.as_str()),
                (None, None) => {
                    return Err(AllocationError::EmptyConstraint {
                        claim: display,
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
        for rp in &mut requests {
            for sp in &mut rp.subs {
                sp.match_constraints = constraints
                    .iter()
                    .enumerate()
                    .filter(|(_, c)| c.kind == ConstraintKind::Match && c.applies(sp.base, sp.sub))
                    .map(|(i, _)| i)
                    .collect();
                if let Some(policy) = options.policy {
                    apply_policy(
                        view,
                        policy,
                        options.fail_closed,
                        &display,
                        &constraints,
                        sp,
                    )?;
                }
            }
        }
        plans.push(ClaimPlan {
            claim,
            display,
            requests,
            constraints,
        });
    }
    Ok((plans, evaluations))
}

/// Whether some request cannot be satisfied whatever the other requests get: too few
/// candidates, no group of candidates sharing a matchAttribute value, too few distinct values,
/// or an `All` request over a device that is in use or tainted. Then the claims do not fit and
/// the search is skipped. Only used when the search could not end in an error instead
/// (no selector errors, no `All` request in a claim with constraints), so the outcome is the
/// one the full search would reach.
fn statically_impossible(view: &NodeView<'_>, plans: &[ClaimPlan<'_>]) -> bool {
    let mut possible_errors = false;
    for cp in plans {
        for rp in &cp.requests {
            for sp in &rp.subs {
                if !sp.errors.is_empty()
                    || (matches!(sp.mode, Mode::All) && !cp.constraints.is_empty())
                {
                    possible_errors = true;
                }
            }
        }
    }
    if possible_errors {
        return false;
    }
    plans.iter().any(|cp| {
        cp.requests
            .iter()
            .any(|rp| rp.subs.iter().all(|sp| !sub_possible(view, cp, sp)))
    })
}

fn sub_possible(view: &NodeView<'_>, cp: &ClaimPlan<'_>, sp: &SubPlan<'_>) -> bool {
    let usable = |dev: &Dev<'_>| (sp.admin || !dev.allocated) && !taint_blocks(dev, sp.tolerations);
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
            let count = sp
                .cands
                .iter()
                .filter(|&&(d, _)| usable(&view.devices[d as usize]))
                .count();
            if count < n {
                return false;
            }
            for c in cp.constraints.iter().filter(|c| c.applies(sp.base, sp.sub)) {
                let values = &view.attr_values[c.slot];
                let mut groups: Vec<(AttrKey<'_>, usize)> = Vec::new();
                for &(d, _) in &sp.cands {
                    if !usable(&view.devices[d as usize]) {
                        continue;
                    }
                    if let Some(v) = values[d as usize] {
                        match groups.iter_mut().find(|(k, _)| *k == v) {
                            Some(g) => g.1 += 1,
                            None => groups.push((v, 1)),
                        }
                    }
                }
                let enough = match c.kind {
                    ConstraintKind::Match => groups.iter().any(|&(_, k)| k >= n),
                    ConstraintKind::Distinct => groups.len() >= n,
                };
                if !enough {
                    return false;
                }
            }
            true
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
    claim: &str,
    constraints: &[Constraint<'_>],
    sp: &mut SubPlan<'_>,
) -> Result<(), AllocationError> {
    if !matches!(sp.mode, Mode::Exact(_)) || sp.cands.is_empty() {
        return Ok(());
    }
    let devices: Vec<PolicyDevice<'_>> = sp
        .cands
        .iter()
        .map(|&(d, _)| {
            let dev = &view.devices[d as usize];
            PolicyDevice::new(dev.driver, dev.pool_name, dev.device).with_allocated(dev.allocated)
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
        o.check(devices.len())
            .map(|()| o)
            .map_err(|message| crate::PolicyFailure::new(policy.name(), "bad-output", message))
    });
    let outcome = match outcome {
        Ok(o) => o,
        Err(failure) if fail_closed => {
            return Err(AllocationError::Policy {
                claim: claim.to_string(),
                request: sp.full_name.clone(),
                failure: Box::new(failure),
            });
        }
        Err(_) => return Ok(()),
    };
    let old = std::mem::take(&mut sp.cands);
    let mut reason: Vec<Option<String>> = vec![None; old.len()];
    for r in outcome.rejected {
        reason[r.index] = Some(r.reason);
    }
    let order = outcome.order.unwrap_or_else(|| (0..old.len()).collect());
    sp.cands = Vec::with_capacity(old.len());
    for i in order {
        let (d, err) = old[i];
        match reason[i].take() {
            Some(why) if err.is_none() => sp.policy_rejected.push((d, why)),
            _ => sp.cands.push((d, err)),
        }
    }
    Ok(())
}

struct SubSpec<'c> {
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

/// The selectors of one request: class selectors first, then the request's, each compiled
/// (through the process-wide cache) and mapped to its slot in the node's result cache.
pub(crate) struct SelectorSet<'x> {
    class_name: &'x str,
    claim: &'x str,
    entries: Vec<SelectorEntry>,
}

struct SelectorEntry {
    is_class: bool,
    index: usize,
    program: Result<(usize, Arc<cel::Program>), String>,
}

impl<'x> SelectorSet<'x> {
    pub(crate) fn new(
        view: &mut NodeView<'_>,
        classes: &'x [DeviceClass],
        claim: &'x str,
        class: usize,
        selectors: &[DeviceSelector],
    ) -> SelectorSet<'x> {
        let class_obj = &classes[class];
        let mut entries = Vec::with_capacity(class_obj.spec.selectors.len() + selectors.len());
        let groups: [(&[DeviceSelector], bool); 2] =
            [(&class_obj.spec.selectors, true), (selectors, false)];
        for (list, is_class) in groups {
            for (index, sel) in list.iter().enumerate() {
                let expr = sel
                    .cel
                    .as_ref()
                    .map(|c| c.expression.as_str())
                    .unwrap_or("");
                let program = match cel::compile(expr) {
                    Ok(p) => {
                        let key = Arc::as_ptr(&p) as usize;
                        let slot = match view.program_index.get(&key) {
                            Some(&slot) => slot,
                            None => {
                                let slot = view.programs.len();
                                view.programs.push(p.clone());
                                view.selector_cache.push(vec![0u8; view.devices.len()]);
                                view.program_index.insert(key, slot);
                                slot
                            }
                        };
                        Ok((slot, p))
                    }
                    Err(e) => Err(e.to_string()),
                };
                entries.push(SelectorEntry {
                    is_class,
                    index,
                    program,
                });
            }
        }
        SelectorSet {
            class_name: &class_obj.metadata.name,
            claim,
            entries,
        }
    }

    fn owner(&self, e: &SelectorEntry) -> SelectorOwner {
        if e.is_class {
            SelectorOwner::Class(self.class_name.to_string())
        } else {
            SelectorOwner::Claim(self.claim.to_string())
        }
    }

    /// Whether device `d` matches: every selector true (cached per device and program),
    /// then the device's own node selection.
    pub(crate) fn verdict(
        &self,
        view: &mut NodeView<'_>,
        d: usize,
        evaluations: &mut u64,
    ) -> Verdict {
        for e in &self.entries {
            let (slot, program) = match &e.program {
                Ok(p) => p,
                Err(message) => {
                    return Verdict::Error(AllocationError::SelectorCompile {
                        owner: self.owner(e),
                        index: e.index,
                        message: message.clone(),
                    });
                }
            };
            let mut code = view.selector_cache[*slot][d];
            if code == 0 {
                *evaluations += 1;
                let r = match view.devices[d].context(&view.interner) {
                    Ok(ctx) => cel::evaluate(program, ctx).map_err(|e| e.to_string()),
                    Err(e) => Err(e.clone()),
                };
                code = match r {
                    Ok(false) => 1,
                    Ok(true) => 2,
                    Err(_) => 3,
                };
                view.selector_cache[*slot][d] = code;
            }
            match code {
                1 => {
                    return Verdict::Selector {
                        class: e.is_class,
                        index: e.index,
                    };
                }
                2 => {}
                _ => {
                    let dev = &view.devices[d];
                    let message = match dev.context(&view.interner) {
                        Ok(ctx) => match cel::evaluate(program, ctx) {
                            Err(e) => e.to_string(),
                            Ok(_) => "inconsistent evaluation".to_string(),
                        },
                        Err(e) => e.clone(),
                    };
                    return Verdict::Error(AllocationError::SelectorRuntime {
                        owner: self.owner(e),
                        index: e.index,
                        device: dev.id(),
                        message,
                    });
                }
            }
        }
        match &view.devices[d].node_ok {
            Ok(true) => Verdict::Match,
            Ok(false) => Verdict::Node,
            Err(e) => Verdict::Error(AllocationError::NodeSelection { message: e.clone() }),
        }
    }
}

fn plan_sub<'c>(
    view: &mut NodeView<'_>,
    classes: &[DeviceClass],
    claim: &str,
    s: SubSpec<'c>,
    evaluations: &mut u64,
) -> Result<SubPlan<'c>, AllocationError> {
    let full_name = match s.sub {
        Some(sub) => format!("{}/{}", s.base, sub),
        None => s.base.to_string(),
    };
    for (i, sel) in s.selectors.iter().enumerate() {
        if sel.cel.is_none() {
            return Err(AllocationError::EmptySelector {
                claim: claim.to_string(),
                request: s.name.to_string(),
                index: i,
            });
        }
    }
    if s.class_name.is_empty() {
        return Err(AllocationError::MissingClassName {
            claim: claim.to_string(),
            request: s.name.to_string(),
        });
    }
    let Some(class) = s.class else {
        return Err(AllocationError::ClassNotFound {
            claim: claim.to_string(),
            request: s.name.to_string(),
            class: s.class_name.to_string(),
        });
    };
    for (i, sel) in classes[class].spec.selectors.iter().enumerate() {
        if sel.cel.is_none() {
            return Err(AllocationError::EmptySelector {
                claim: claim.to_string(),
                request: s.name.to_string(),
                index: i,
            });
        }
    }
    let capacity = match s.capacity {
        None => None,
        Some(req) => {
            let mut out = Vec::with_capacity(req.requests.len());
            for (name, q) in &req.requests {
                let q =
                    Quantity::parse(q.as_str()).map_err(|e| AllocationError::CapacityRequest {
                        claim: claim.to_string(),
                        request: s.name.to_string(),
                        message: format!("capacity request {name}: {e}"),
                    })?;
                out.push((name.as_str(), q));
            }
            Some(out)
        }
    };
    let mut plan = SubPlan {
        full_name,
        base: s.base,
        sub: s.sub,
        class,
        selectors: s.selectors,
        admin: s.admin,
        tolerations: s.tolerations,
        capacity,
        mode: Mode::Exact(0),
        num_devices: 0,
        all_devices: Vec::new(),
        cands: Vec::new(),
        errors: Vec::new(),
        match_constraints: Vec::new(),
        policy_rejected: Vec::new(),
    };
    match s.mode.unwrap_or("ExactCount") {
        "ExactCount" => {
            let n = match s.count {
                None | Some(0) => 1,
                Some(n) => usize::try_from(n).unwrap_or(0),
            };
            plan.mode = Mode::Exact(n);
            plan.num_devices = n;
            let set = SelectorSet::new(view, classes, claim, class, s.selectors);
            for d in 0..view.devices.len() {
                match set.verdict(view, d, evaluations) {
                    Verdict::Match => plan.cands.push((d as u32, None)),
                    Verdict::Error(e) => {
                        plan.cands.push((d as u32, Some(plan.errors.len())));
                        plan.errors.push(e);
                    }
                    _ => {}
                }
            }
        }
        "All" => {
            plan.mode = Mode::All;
            let set = SelectorSet::new(view, classes, claim, class, s.selectors);
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
                    match set.verdict(view, d, evaluations) {
                        Verdict::Match => {
                            let dev = &view.devices[d];
                            if let Ok(CapFit::Fits(_)) =
                                capacity_fit(dev, plan.capacity.as_deref(), None)
                            {
                                plan.all_devices.push(d as u32);
                            }
                        }
                        Verdict::Error(e) => return Err(e),
                        _ => {}
                    }
                }
            }
            plan.num_devices = plan.all_devices.len();
        }
        other => {
            return Err(AllocationError::UnsupportedMode {
                claim: claim.to_string(),
                request: s.name.to_string(),
                mode: other.to_string(),
            });
        }
    }
    Ok(plan)
}

/// Whether a capacity request fits a device.
#[derive(Debug)]
pub(crate) enum CapFit {
    /// Consumption per device capacity (same order as `Dev::capacity`).
    Fits(Vec<Quantity>),
    NoFit,
}

fn ceil_int(q: &Quantity) -> Result<i64, String> {
    q.value()
        .ok_or_else(|| format!("quantity {q} does not fit an int64"))
}

/// The consumption of one capacity: the request rounded by the policy, or the policy's
/// default, or the whole capacity.
fn consumed_amount(
    requested: Option<&Quantity>,
    total: &Quantity,
    policy: Option<&crate::model::Policy>,
) -> Result<Quantity, String> {
    let Some(req) = requested else {
        return Ok(policy.and_then(|p| p.default).unwrap_or(*total));
    };
    let Some(p) = policy else {
        return Ok(*req);
    };
    if let Some(r) = &p.range
        && let Some(min) = &r.min
    {
        if req < min {
            return Ok(*min);
        }
        let Some(step) = &r.step else {
            return Ok(*req);
        };
        let (ri, si, mi) = (ceil_int(req)?, ceil_int(step)?, ceil_int(min)?);
        if si <= 0 {
            return Ok(*req);
        }
        let added = ri - mi;
        let mut n = added / si;
        if added % si != 0 {
            n += 1;
        }
        let v = n
            .checked_mul(si)
            .and_then(|x| x.checked_add(mi))
            .ok_or_else(|| {
                format!("capacity request {req} cannot be rounded up to the next step")
            })?;
        return Ok(Quantity::from_i64(v, step.format()));
    }
    if !p.valid_values.is_empty() {
        for v in &p.valid_values {
            if req <= v {
                return Ok(*v);
            }
        }
    }
    Ok(*req)
}

fn violates_policy(consumed: &Quantity, policy: Option<&crate::model::Policy>) -> bool {
    let Some(p) = policy else {
        return false;
    };
    if p.default.as_ref() == Some(consumed) {
        return false;
    }
    if let Some(r) = &p.range {
        if r.max.as_ref().is_some_and(|m| consumed > m) {
            return true;
        }
        if let Some(step) = &r.step {
            let min = r.min.unwrap_or_default();
            match (consumed.value(), step.value(), min.value()) {
                (Some(c), Some(s), Some(m)) if s != 0 => return (c - m) % s != 0,
                _ => return true,
            }
        }
        return false;
    }
    if !p.valid_values.is_empty() {
        return !p.valid_values.iter().any(|v| v == consumed);
    }
    false
}

/// The scheduler's capacity check for one device: resolves requested names (bare names
/// belong to the driver), computes the consumption of every capacity and checks the policy
/// and what earlier shares (`allocating`) already took.
pub(crate) fn capacity_fit(
    dev: &Dev<'_>,
    requests: Option<&[(&str, Quantity)]>,
    allocating: Option<&[Quantity]>,
) -> Result<CapFit, String> {
    let mut resolved: Vec<Option<Quantity>> = vec![None; dev.capacity.len()];
    for (name, q) in requests.unwrap_or(&[]) {
        let idx = dev
            .capacity
            .iter()
            .position(|c| c.key == *name)
            .or_else(|| match name.split_once('/') {
                Some((domain, id)) if domain == dev.driver => {
                    dev.capacity.iter().position(|c| c.key == id)
                }
                Some(_) => None,
                None => dev.capacity.iter().position(|c| {
                    c.key.len() == dev.driver.len() + 1 + name.len()
                        && c.key.starts_with(dev.driver)
                        && c.key.ends_with(name)
                        && c.key.as_bytes()[dev.driver.len()] == b'/'
                }),
            });
        let Some(idx) = idx else {
            return Ok(CapFit::NoFit);
        };
        if resolved[idx].is_some() {
            return Err(format!("capacity {name} requested twice"));
        }
        resolved[idx] = Some(*q);
    }
    let mut consumed = Vec::with_capacity(dev.capacity.len());
    for (i, cap) in dev.capacity.iter().enumerate() {
        let c = consumed_amount(resolved[i].as_ref(), &cap.value, cap.policy.as_ref())?;
        if c.sign() < 0 {
            return Err(format!("capacity {}: capacity value is negative", cap.key));
        }
        consumed.push(c);
    }
    for (i, cap) in dev.capacity.iter().enumerate() {
        if violates_policy(&consumed[i], cap.policy.as_ref()) {
            return Ok(CapFit::NoFit);
        }
        let mut total = consumed[i];
        if let Some(a) = allocating.and_then(|a| a.get(i)) {
            match total.checked_add(a) {
                Some(t) => total = t,
                None => return Ok(CapFit::NoFit),
            }
        }
        if total > cap.value {
            return Ok(CapFit::NoFit);
        }
    }
    Ok(CapFit::Fits(consumed))
}

pub(crate) fn tolerates(t: &DeviceToleration, taint: &crate::api::DeviceTaint) -> bool {
    if !t.effect.is_empty() && t.effect != taint.effect {
        return false;
    }
    if !t.key.is_empty() && t.key != taint.key {
        return false;
    }
    match t.operator.as_str() {
        "" | "Equal" => t.value == taint.value,
        "Exists" => true,
        _ => false,
    }
}

pub(crate) fn taint_blocks(dev: &Dev<'_>, tolerations: &[DeviceToleration]) -> bool {
    dev.taints
        .iter()
        .any(|taint| !tolerations.iter().any(|t| tolerates(t, taint)))
}

/// One chosen device.
#[derive(Debug, Clone)]
pub(crate) struct Chosen {
    pub(crate) req: usize,
    pub(crate) sub: usize,
    pub(crate) dev: u32,
    pub(crate) share: Option<Vec<Quantity>>,
}

struct Undo {
    counters: bool,
    marked: bool,
    constraints: usize,
    share: bool,
}

/// Why the search stops early. The error is boxed: it is rare, and it keeps the result of
/// every search step small.
enum Stop {
    MaxSize,
    Err(Box<AllocationError>),
}

impl From<AllocationError> for Stop {
    fn from(e: AllocationError) -> Stop {
        Stop::Err(Box::new(e))
    }
}

#[derive(Clone, Copy)]
struct At {
    claim: usize,
    req: usize,
    sub: usize,
    dev: usize,
}

struct ConstraintState<'a> {
    value: Option<AttrKey<'a>>,
    count: usize,
    values: Vec<AttrKey<'a>>,
}

pub(crate) struct Search<'s, 'a, 'c> {
    view: &'s NodeView<'a>,
    plan: &'s [ClaimPlan<'c>],
    claim_bits: Vec<u128>,
    consumed: Vec<Vec<Quantity>>,
    shares: Vec<u32>,
    share_capacity: Vec<Vec<Quantity>>,
    constraint_state: Vec<Vec<ConstraintState<'a>>>,
    pub(crate) chosen: Vec<Vec<Chosen>>,
    selected: Vec<Vec<usize>>,
    pub(crate) steps: u64,
    deadline: Option<(Instant, Duration)>,
}

impl<'s, 'a, 'c> Search<'s, 'a, 'c> {
    pub(crate) fn new(
        view: &'s NodeView<'a>,
        plan: &'s [ClaimPlan<'c>],
        deadline: Option<Duration>,
    ) -> Self {
        let n = view.devices.len();
        Search {
            view,
            claim_bits: vec![0; n],
            consumed: view
                .pools
                .iter()
                .map(|p| vec![Quantity::default(); p.available.len()])
                .collect(),
            shares: vec![0; n],
            share_capacity: Vec::new(),
            constraint_state: plan
                .iter()
                .map(|c| {
                    c.constraints
                        .iter()
                        .map(|_| ConstraintState {
                            value: None,
                            count: 0,
                            values: Vec::new(),
                        })
                        .collect()
                })
                .collect(),
            chosen: plan.iter().map(|_| Vec::new()).collect(),
            selected: plan.iter().map(|c| vec![0; c.requests.len()]).collect(),
            plan,
            steps: 0,
            deadline: deadline.map(|d| (Instant::now(), d)),
        }
    }

    pub(crate) fn run(&mut self) -> Result<bool, AllocationError> {
        match self.one(
            At {
                claim: 0,
                req: 0,
                sub: 0,
                dev: 0,
            },
            false,
            0,
        ) {
            Ok(done) => Ok(done),
            Err(Stop::MaxSize) => Ok(false),
            Err(Stop::Err(e)) => Err(*e),
        }
    }

    fn one(&mut self, r: At, in_sub: bool, start: usize) -> Result<bool, Stop> {
        self.steps += 1;
        if self.steps & 255 == 0
            && let Some((t0, limit)) = self.deadline
            && t0.elapsed() > limit
        {
            return Err(AllocationError::Deadline {
                millis: limit.as_millis(),
            }
            .into());
        }
        if r.claim >= self.plan.len() {
            return Ok(true);
        }
        if r.req >= self.plan[r.claim].requests.len() {
            return match self.one(
                At {
                    claim: r.claim + 1,
                    req: 0,
                    sub: 0,
                    dev: 0,
                },
                false,
                0,
            ) {
                Err(Stop::MaxSize) => Ok(false),
                other => other,
            };
        }
        let plan = self.plan;
        let rp = &plan[r.claim].requests[r.req];
        if !in_sub && rp.first_available {
            let n = rp.subs.len();
            let mut all_exceeded = true;
            for sub in 0..n {
                match self.one(At { sub, ..r }, true, 0) {
                    Err(Stop::MaxSize) => continue,
                    Err(e) => return Err(e),
                    Ok(true) => {
                        self.selected[r.claim][r.req] = sub;
                        return Ok(true);
                    }
                    Ok(false) => all_exceeded = false,
                }
            }
            return if all_exceeded {
                Err(Stop::MaxSize)
            } else {
                Ok(false)
            };
        }
        let sp = &rp.subs[r.sub];
        let all = matches!(sp.mode, Mode::All);
        if all && sp.all_devices.is_empty() {
            return Ok(false);
        }
        if r.dev >= sp.num_devices {
            return self.one(
                At {
                    claim: r.claim,
                    req: r.req + 1,
                    sub: 0,
                    dev: 0,
                },
                false,
                0,
            );
        }
        if self.chosen[r.claim].len() + sp.num_devices - r.dev > MAX_DEVICES_PER_CLAIM {
            return Err(Stop::MaxSize);
        }
        if all {
            let d = sp.all_devices[r.dev];
            let Some(undo) = self.take(r, d, true)? else {
                return Ok(false);
            };
            let next = At {
                dev: r.dev + 1,
                ..r
            };
            return match self.one(next, in_sub, 0) {
                Ok(true) => Ok(true),
                other => {
                    self.release(r, d, undo);
                    other
                }
            };
        }
        let need = sp.num_devices - r.dev;
        let prune = sp.errors.is_empty();
        let ncands = sp.cands.len();
        for i in start..ncands {
            if prune && ncands - i < need {
                break;
            }
            let (d, err) = sp.cands[i];
            let admin = sp.admin;
            let dev = &self.view.devices[d as usize];
            if admin {
                if self.claim_bits[d as usize] & (1u128 << r.claim) != 0 {
                    continue;
                }
            } else if dev.allocated || self.claim_bits[d as usize] != 0 {
                continue;
            }
            if let Some(e) = err {
                return Err(sp.errors[e].clone().into());
            }
            if (sp.capacity.is_some() || dev.multi || !dev.plain_capacity)
                && !matches!(
                    capacity_fit(dev, sp.capacity.as_deref(), self.share_capacity_of(d)),
                    Ok(CapFit::Fits(_))
                )
            {
                continue;
            }
            let Some(undo) = self.take(r, d, false)? else {
                continue;
            };
            if prune && need > 1 && !self.match_feasible(r, i, need - 1) {
                self.release(r, d, undo);
                continue;
            }
            match self.one(
                At {
                    dev: r.dev + 1,
                    ..r
                },
                in_sub,
                i + 1,
            ) {
                Ok(true) => return Ok(true),
                Ok(false) => self.release(r, d, undo),
                Err(e) => {
                    self.release(r, d, undo);
                    return Err(e);
                }
            }
        }
        Ok(false)
    }

    /// With the current match constraints fixed, can the rest of this request still be
    /// filled from the candidates after position `i`? (Only an upper bound is needed: the
    /// search skips branches that cannot succeed, nothing else.)
    fn match_feasible(&self, r: At, i: usize, more: usize) -> bool {
        let sp = &self.plan[r.claim].requests[r.req].subs[r.sub];
        for &ci in &sp.match_constraints {
            let st = &self.constraint_state[r.claim][ci];
            let Some(value) = st.value else {
                continue;
            };
            let values = &self.view.attr_values[self.plan[r.claim].constraints[ci].slot];
            let mut found = 0;
            for &(d, _) in &sp.cands[i + 1..] {
                if values[d as usize] == Some(value) {
                    found += 1;
                    if found >= more {
                        break;
                    }
                }
            }
            if found < more {
                return false;
            }
        }
        true
    }

    fn share_capacity_of(&self, d: u32) -> Option<&[Quantity]> {
        if self.shares[d as usize] == 0 {
            return None;
        }
        self.share_capacity.get(d as usize).map(Vec::as_slice)
    }

    /// The scheduler's `allocateDevice`: tries to take device `d` for `r`.
    fn take(&mut self, r: At, d: u32, must: bool) -> Result<Option<Undo>, AllocationError> {
        let view = self.view;
        let plan = self.plan;
        let dev = &view.devices[d as usize];
        let sp = &plan[r.claim].requests[r.req].subs[r.sub];
        let multi = dev.multi;
        let bit = 1u128 << r.claim;
        if !multi && sp.admin && self.claim_bits[d as usize] & bit != 0 {
            return Ok(None);
        }
        if !sp.admin && (dev.allocated || self.claim_bits[d as usize] != 0) {
            return Ok(None);
        }
        let skip_counters = multi && self.shares[d as usize] > 0;
        let mut undo = Undo {
            counters: false,
            marked: false,
            constraints: 0,
            share: false,
        };
        if !skip_counters && !dev.counters.is_empty() {
            if !self.reserve_counters(dev) {
                return Ok(None);
            }
            undo.counters = true;
        }
        if taint_blocks(dev, sp.tolerations) {
            self.undo_counters(dev, &undo);
            return Ok(None);
        }
        let (base, sub) = (sp.base, sp.sub);
        let nconstraints = plan[r.claim].constraints.len();
        for ci in 0..nconstraints {
            if !self.constraint_add(r.claim, ci, base, sub, d) {
                for cj in (0..ci).rev() {
                    self.constraint_remove(r.claim, cj, base, sub);
                }
                self.undo_counters(dev, &undo);
                if must {
                    return Err(AllocationError::AllConstraint {
                        claim: plan[r.claim].display.clone(),
                        request: sp.sub.unwrap_or(sp.base).to_string(),
                        device: dev.id(),
                    });
                }
                return Ok(None);
            }
            undo.constraints += 1;
        }
        if !multi {
            self.claim_bits[d as usize] |= bit;
            undo.marked = true;
        }
        let fit = capacity_fit(dev, sp.capacity.as_deref(), self.share_capacity_of(d));
        let share = match fit {
            Ok(CapFit::Fits(consumed)) => {
                if multi {
                    if self.share_capacity.len() < view.devices.len() {
                        self.share_capacity.resize(view.devices.len(), Vec::new());
                    }
                    let acc = &mut self.share_capacity[d as usize];
                    if self.shares[d as usize] == 0 || acc.len() != consumed.len() {
                        *acc = vec![Quantity::default(); consumed.len()];
                    }
                    for (a, c) in acc.iter_mut().zip(&consumed) {
                        *a = a.checked_add(c).unwrap_or(*a);
                    }
                    self.shares[d as usize] += 1;
                    undo.share = true;
                    Some(consumed)
                } else {
                    None
                }
            }
            _ => {
                self.rollback(r, d, &undo);
                return Ok(None);
            }
        };
        self.chosen[r.claim].push(Chosen {
            req: r.req,
            sub: r.sub,
            dev: d,
            share,
        });
        Ok(Some(undo))
    }

    fn reserve_counters(&mut self, dev: &Dev<'_>) -> bool {
        let pool = &self.view.pools[dev.pool];
        if pool.overdrawn {
            return false;
        }
        let consumed = &mut self.consumed[dev.pool];
        let mut ok = true;
        let mut applied = 0;
        for (idx, q) in &dev.counters {
            match consumed[*idx].checked_add(q) {
                Some(v) => {
                    consumed[*idx] = v;
                    applied += 1;
                    if v > pool.available[*idx] {
                        ok = false;
                        break;
                    }
                }
                None => {
                    ok = false;
                    break;
                }
            }
        }
        if !ok {
            for (idx, q) in dev.counters.iter().take(applied) {
                consumed[*idx] = consumed[*idx].checked_sub(q).unwrap_or_default();
            }
        }
        ok
    }

    fn undo_counters(&mut self, dev: &Dev<'_>, undo: &Undo) {
        if undo.counters {
            let consumed = &mut self.consumed[dev.pool];
            for (idx, q) in &dev.counters {
                consumed[*idx] = consumed[*idx].checked_sub(q).unwrap_or_default();
            }
        }
    }

    /// Undoes a take that did not record a result.
    fn rollback(&mut self, r: At, d: u32, undo: &Undo) {
        let view = self.view;
        let dev = &view.devices[d as usize];
        if undo.marked {
            self.claim_bits[d as usize] &= !(1u128 << r.claim);
        }
        let sp = &self.plan[r.claim].requests[r.req].subs[r.sub];
        let (base, sub) = (sp.base, sp.sub);
        for ci in (0..undo.constraints).rev() {
            self.constraint_remove(r.claim, ci, base, sub);
        }
        self.undo_counters(dev, undo);
    }

    /// Gives back a device taken by [`Search::take`].
    fn release(&mut self, r: At, d: u32, undo: Undo) {
        if let Some(c) = self.chosen[r.claim].pop()
            && undo.share
            && let Some(consumed) = c.share
        {
            let acc = &mut self.share_capacity[d as usize];
            for (a, q) in acc.iter_mut().zip(&consumed) {
                *a = a.checked_sub(q).unwrap_or_default();
            }
            self.shares[d as usize] -= 1;
        }
        self.rollback(r, d, &undo);
    }

    fn constraint_add(
        &mut self,
        claim: usize,
        ci: usize,
        base: &str,
        sub: Option<&str>,
        d: u32,
    ) -> bool {
        let plan = self.plan;
        let c = &plan[claim].constraints[ci];
        if !c.applies(base, sub) {
            return true;
        }
        let Some(v) = self.view.attr_values[c.slot][d as usize] else {
            return false;
        };
        let kind = c.kind;
        let st = &mut self.constraint_state[claim][ci];
        match kind {
            ConstraintKind::Match => {
                if st.count == 0 {
                    st.value = Some(v);
                    st.count = 1;
                    true
                } else if st.value == Some(v) {
                    st.count += 1;
                    true
                } else {
                    false
                }
            }
            ConstraintKind::Distinct => {
                if st.values.contains(&v) {
                    false
                } else {
                    st.values.push(v);
                    true
                }
            }
        }
    }

    fn constraint_remove(&mut self, claim: usize, ci: usize, base: &str, sub: Option<&str>) {
        let plan = self.plan;
        let c = &plan[claim].constraints[ci];
        if !c.applies(base, sub) {
            return;
        }
        let kind = c.kind;
        let st = &mut self.constraint_state[claim][ci];
        match kind {
            ConstraintKind::Match => {
                st.count = st.count.saturating_sub(1);
                if st.count == 0 {
                    st.value = None;
                }
            }
            ConstraintKind::Distinct => {
                st.values.pop();
            }
        }
    }

    /// Builds the `status.allocation` of every claim.
    pub(crate) fn results(
        &self,
        node: &Node,
        classes: &[DeviceClass],
    ) -> Result<Vec<AllocationResult>, AllocationError> {
        let mut out = Vec::with_capacity(self.plan.len());
        for (ci, cp) in self.plan.iter().enumerate() {
            let mut results = Vec::with_capacity(self.chosen[ci].len());
            for (k, c) in self.chosen[ci].iter().enumerate() {
                let sp = &cp.requests[c.req].subs[c.sub];
                let dev = &self.view.devices[c.dev as usize];
                let mut consumed_capacity = std::collections::BTreeMap::new();
                let mut share_id = None;
                if let Some(consumed) = &c.share {
                    for (cap, q) in dev.capacity.iter().zip(consumed) {
                        consumed_capacity.insert(cap.key.to_string(), q.to_string());
                    }
                    share_id = Some(share_id_for(cp, &sp.full_name, &dev.id(), k));
                }
                results.push(DeviceRequestAllocationResult {
                    request: sp.full_name.clone(),
                    driver: dev.driver.to_string(),
                    pool: dev.pool_name.to_string(),
                    device: dev.device.name.clone(),
                    admin_access: sp.admin.then_some(true),
                    tolerations: sp.tolerations.to_vec(),
                    binding_conditions: dev.device.binding_conditions.clone(),
                    binding_failure_conditions: dev.device.binding_failure_conditions.clone(),
                    share_id,
                    consumed_capacity,
                });
            }
            let config = self.configs(ci, classes);
            let node_selector =
                self.node_selector(ci, node)
                    .map_err(|message| AllocationError::NodeSelection {
                        message: format!(
                            "create NodeSelector for claim {}: {message}",
                            cp.claim.metadata.name
                        ),
                    })?;
            out.push(AllocationResult {
                devices: DeviceAllocationResult { results, config },
                node_selector,
            });
        }
        Ok(out)
    }

    fn selected_sub(&self, ci: usize, ri: usize) -> usize {
        if self.plan[ci].requests[ri].first_available {
            self.selected[ci][ri]
        } else {
            0
        }
    }

    fn configs(&self, ci: usize, classes: &[DeviceClass]) -> Vec<DeviceAllocationConfiguration> {
        let cp = &self.plan[ci];
        let mut config: Vec<DeviceAllocationConfiguration> = Vec::new();
        let mut by_class: HashMap<usize, (usize, usize)> = HashMap::new();
        for (ri, rp) in cp.requests.iter().enumerate() {
            let sp = &rp.subs[self.selected_sub(ci, ri)];
            if let Some(&(start, end)) = by_class.get(&sp.class) {
                for c in &mut config[start..end] {
                    c.requests.push(sp.full_name.clone());
                }
                continue;
            }
            let start = config.len();
            for cc in &classes[sp.class].spec.config {
                config.push(DeviceAllocationConfiguration {
                    source: "FromClass".into(),
                    requests: vec![sp.full_name.clone()],
                    opaque: cc.opaque.clone(),
                });
            }
            by_class.insert(sp.class, (start, config.len()));
        }
        for cc in &cp.claim.spec.devices.config {
            if cc.requests.is_empty() {
                config.push(DeviceAllocationConfiguration {
                    source: "FromClaim".into(),
                    requests: Vec::new(),
                    opaque: cc.opaque.clone(),
                });
                continue;
            }
            for (ri, rp) in cp.requests.iter().enumerate() {
                let name = &cp.claim.spec.devices.requests[ri].name;
                let applies = cc.requests.contains(name)
                    || (rp.first_available
                        && cc
                            .requests
                            .contains(&rp.subs[self.selected_sub(ci, ri)].full_name));
                if applies {
                    config.push(DeviceAllocationConfiguration {
                        source: "FromClaim".into(),
                        requests: cc.requests.clone(),
                        opaque: cc.opaque.clone(),
                    });
                    break;
                }
            }
        }
        config
    }

    fn node_selector(&self, ci: usize, node: &Node) -> Result<Option<NodeSelector>, String> {
        let mut term = NodeSelectorTerm::default();
        for c in &self.chosen[ci] {
            let dev = &self.view.devices[c.dev as usize];
            let spec = &dev.slice.spec;
            let (name, selector) = if spec.per_device_node_selection.unwrap_or(false) {
                (
                    dev.device.node_name.as_deref(),
                    dev.device.node_selector.as_ref(),
                )
            } else {
                (spec.node_name.as_deref(), spec.node_selector.as_ref())
            };
            if name.is_some_and(|n| !n.is_empty()) || dev.binds_to_node {
                return Ok(Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm {
                        match_expressions: Vec::new(),
                        match_fields: vec![NodeSelectorRequirement {
                            key: "metadata.name".into(),
                            operator: "In".into(),
                            values: vec![node.name.clone()],
                        }],
                    }],
                }));
            }
            if let Some(sel) = selector {
                match sel.node_selector_terms.len() {
                    0 => {}
                    1 => {
                        let t = &sel.node_selector_terms[0];
                        merge_requirements(&t.match_fields, &mut term.match_fields);
                        merge_requirements(&t.match_expressions, &mut term.match_expressions);
                    }
                    n => {
                        return Err(format!(
                            "unsupported ResourceSlice.NodeSelector with {n} terms"
                        ));
                    }
                }
            }
        }
        if term.match_fields.is_empty() && term.match_expressions.is_empty() {
            Ok(None)
        } else {
            Ok(Some(NodeSelector {
                node_selector_terms: vec![term],
            }))
        }
    }
}

fn merge_requirements(from: &[NodeSelectorRequirement], to: &mut Vec<NodeSelectorRequirement>) {
    for r in from {
        let present = to.iter().any(|e| {
            e.key == r.key && e.operator == r.operator && {
                let a: HashSet<&String> = e.values.iter().collect();
                let b: HashSet<&String> = r.values.iter().collect();
                a == b
            }
        });
        if !present {
            to.push(r.clone());
        }
    }
}

/// A share ID for a multi-allocatable device. The scheduler draws a random UUID; kubedev
/// derives one from the claim, request, device and position, so results are reproducible.
fn share_id_for(cp: &ClaimPlan<'_>, request: &str, device: &str, position: usize) -> String {
    // FNV-1a over the identifying text, two lanes for 128 bits.
    let text = format!(
        "{}\u{0}{}\u{0}{}\u{0}{}\u{0}{}",
        cp.claim.metadata.uid, cp.display, request, device, position
    );
    let mut a: u64 = 0xcbf2_9ce4_8422_2325;
    let mut b: u64 = 0x8422_2325_cbf2_9ce4;
    for byte in text.bytes() {
        a = (a ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3);
        b = (b ^ u64::from(byte))
            .wrapping_mul(0x0000_0100_0000_01b3)
            .rotate_left(5);
    }
    let x = (u128::from(a) << 64) | u128::from(b);
    let h = format!("{x:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}
