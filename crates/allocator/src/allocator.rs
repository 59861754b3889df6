//! The allocator: request planning, the depth-first search and result building.
//!
//! This module holds [`Allocator`], its options and the plan types; `plan` (per-claim checks
//! and candidates), `selectors` (CEL selectors per request), `fit` (capacity and taints) and
//! `search` (the search and the results) do the work.

mod fit;
mod plan;
mod search;
mod selectors;

use std::time::Duration;

use kubedev_core::Quantity;
use smallvec::SmallVec;

use crate::api::{
    AllocationResult, DeviceClass, DeviceSelector, DeviceToleration, Node, ResourceClaim,
    ResourceSlice,
};
use crate::cel::{FastMap, FastSet};
use crate::error::AllocationError;
use crate::features::Features;
use crate::model::{InUse, NodeView, PoolState, build_node_view};
use crate::policy::SelectionPolicy;
use crate::scenario::split_device_id;
use crate::slice_index::SliceIndex;
use plan::{direct_path, plan_claims, statically_impossible};
use search::Search;

pub(crate) use fit::{
    CapFit, Consumption, capacity_fit, capacity_fits, static_capacity_fits, taint_blocks, tolerates,
};
pub(crate) use selectors::{Cands, SelectorSet};

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

/// One existing share of a device that allows multiple allocations (a claim's
/// `status.allocation.devices.results[]` entry with a `shareID`) and the capacity it took
/// (its `consumedCapacity`, empty without one).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConsumedCapacity {
    /// The device, `driver/pool/device`.
    pub device: String,
    /// Capacity name as the device lists it, and the amount taken.
    pub capacity: Vec<(String, Quantity)>,
}

/// Search statistics of the last allocation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SearchStats {
    /// Search steps (calls of the per-device step, as the scheduler counts them). A search
    /// that runs long enough to be checked for whether it can succeed at all, and then goes
    /// on, counts its steps before the check too.
    pub steps: u64,
    /// Selector evaluations run (cache misses).
    pub evaluations: u64,
}

/// An allocator over a fixed set of slices, classes and allocated devices. Build it once and
/// call [`Allocator::allocate`] for each set of claims, on one node or on each node in turn as a
/// scheduler does for a pod. It keeps, for the last few nodes asked about, the prepared devices
/// and every selector result, so repeated allocations on a node are cheap.
#[derive(Debug)]
pub struct Allocator<'a> {
    classes: &'a [DeviceClass],
    /// Class positions by name, for many classes (few are searched in order).
    class_index: FastMap<&'a str, usize>,
    views: NodeViews<'a>,
    stats: SearchStats,
    /// The search's buffers, kept between allocations.
    scratch: search::Scratch,
}

/// Most classes looked up by comparing names.
const LINEAR_CLASSES: usize = 8;

/// The position of the class named `name` (the first of that name), through `index` when
/// there are many classes.
fn find_class(classes: &[DeviceClass], index: &FastMap<&str, usize>, name: &str) -> Option<usize> {
    if classes.len() > LINEAR_CLASSES {
        index.get(name).copied()
    } else {
        classes.iter().position(|c| c.metadata.name == name)
    }
}

/// Most node views an allocator keeps.
const MAX_NODE_VIEWS: usize = 8;

/// Each node's view of the slices, built on first use and kept (the last few nodes').
#[derive(Debug)]
struct NodeViews<'a> {
    slices: &'a [ResourceSlice],
    in_use: InUse<'a>,
    features: Features,
    /// The views of the last few nodes, by node name.
    nodes: Vec<(String, Result<NodeView<'a>, String>)>,
    /// Built when a second node is asked for (see [`SliceIndex`]); shared by forks.
    slice_index: Option<std::sync::Arc<SliceIndex<'a>>>,
}

impl<'a> NodeViews<'a> {
    fn get(&mut self, node: &Node) -> Result<&mut NodeView<'a>, AllocationError> {
        let at = match self.nodes.iter().position(|(name, _)| *name == node.name) {
            Some(at) => at,
            None => {
                // One node: one scan of the slices. More nodes: index them once.
                if !self.nodes.is_empty() && self.slice_index.is_none() {
                    self.slice_index = Some(std::sync::Arc::new(SliceIndex::new(self.slices)));
                }
                // A scheduler asks about each node once per pod: keeping every node's view
                // would only grow memory. A few recent ones stay for repeated questions.
                if self.nodes.len() >= MAX_NODE_VIEWS {
                    self.nodes.clear();
                }
                let view = build_node_view(
                    node,
                    self.slices,
                    self.slice_index.as_deref(),
                    &self.in_use,
                    self.features,
                );
                self.nodes.push((node.name.clone(), view));
                self.nodes.len() - 1
            }
        };
        match &mut self.nodes[at].1 {
            Ok(v) => Ok(v),
            Err(message) => Err(AllocationError::NodeSelection {
                message: message.clone(),
            }),
        }
    }
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
    pub(crate) full_name: std::borrow::Cow<'c, str>,
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
    pub(crate) cands: Cands<'c>,
    /// Match constraints of the claim that apply to this subplan.
    pub(crate) match_constraints: SmallVec<[usize; 2]>,
    /// Devices the selection policy rejected for this subplan (left out of `cands`), with
    /// the policy's reason.
    pub(crate) policy_rejected: Vec<(u32, String)>,
}

#[derive(Debug)]
pub(crate) struct RequestPlan<'c> {
    pub(crate) first_available: bool,
    pub(crate) subs: SmallVec<[SubPlan<'c>; 1]>,
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
            crate::cel::str_eq(r, base)
                || sub.is_some_and(|s| {
                    r.len() == base.len() + 1 + s.len()
                        && r.starts_with(base)
                        && r.as_bytes()[base.len()] == b'/'
                        && r.ends_with(s)
                })
        })
    }
}

/// A claim's name as the scheduler prints it (`namespace/name`), made when first needed
/// (errors and explanations name the claim; an allocation that succeeds does not).
#[derive(Debug)]
pub(crate) struct ClaimName<'c> {
    claim: &'c ResourceClaim,
    text: std::cell::OnceCell<String>,
}

impl<'c> ClaimName<'c> {
    pub(crate) fn new(claim: &'c ResourceClaim) -> ClaimName<'c> {
        ClaimName {
            claim,
            text: std::cell::OnceCell::new(),
        }
    }

    /// The name.
    pub(crate) fn get(&self) -> &str {
        self.text.get_or_init(|| claim_display(self.claim))
    }
}

impl std::ops::Deref for ClaimName<'_> {
    type Target = str;

    fn deref(&self) -> &str {
        self.get()
    }
}

impl std::fmt::Display for ClaimName<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.get())
    }
}

#[derive(Debug)]
pub(crate) struct ClaimPlan<'c> {
    pub(crate) claim: &'c ResourceClaim,
    pub(crate) display: ClaimName<'c>,
    pub(crate) requests: SmallVec<[RequestPlan<'c>; 1]>,
    pub(crate) constraints: SmallVec<[Constraint<'c>; 1]>,
}

/// The plans of one allocation's claims (mostly one claim per pod).
pub(crate) type Plans<'c> = Vec<ClaimPlan<'c>>;

/// Selector evaluations of the candidate lists (run as the search asked for candidates).
fn lazy_evaluations(plan: &[ClaimPlan<'_>]) -> u64 {
    plan.iter()
        .flat_map(|cp| &cp.requests)
        .flat_map(|rp| &rp.subs)
        .map(|sp| sp.cands.evaluations())
        .sum()
}

/// `namespace/name`, or `name` without a namespace (as the scheduler prints objects).
pub(crate) fn claim_display(claim: &ResourceClaim) -> String {
    if claim.metadata.namespace.is_empty() {
        claim.metadata.name.clone()
    } else {
        let (ns, name) = (&claim.metadata.namespace, &claim.metadata.name);
        let mut s = String::with_capacity(ns.len() + 1 + name.len());
        s.push_str(ns);
        s.push('/');
        s.push_str(name);
        s
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
            classes,
            class_index: {
                let mut m = FastMap::default();
                if classes.len() > LINEAR_CLASSES {
                    m.reserve(classes.len());
                    for (i, c) in classes.iter().enumerate() {
                        m.entry(c.metadata.name.as_str()).or_insert(i);
                    }
                }
                m
            },
            views: NodeViews {
                slices,
                in_use: InUse {
                    devices: {
                        // Sized once: a cluster's claims can hold hundreds of thousands.
                        let mut set = FastSet::with_capacity_and_hasher(
                            allocated_devices.len(),
                            Default::default(),
                        );
                        set.extend(allocated_devices.iter().filter_map(|s| split_device_id(s)));
                        set
                    },
                    consumed: FastMap::default(),
                },
                features: Features::default(),
                nodes: Vec::new(),
                slice_index: None,
            },
            stats: SearchStats::default(),
            scratch: search::Scratch::default(),
        }
    }

    /// The shares existing allocations hold of devices that allow multiple allocations, with
    /// the capacity each took (each entry one allocation result with a `shareID`; entries for
    /// the same device add up, and entries naming no device of a node are ignored there). As
    /// the scheduler counts them, a device with shares has its counters consumed, and a
    /// further share of it does not consume them again; an entry without capacity still
    /// counts as a share.
    pub fn with_consumed_capacity(mut self, consumed: &'a [ConsumedCapacity]) -> Allocator<'a> {
        let map = &mut self.views.in_use.consumed;
        for c in consumed {
            let Some(id) = split_device_id(&c.device) else {
                continue;
            };
            let entry = map.entry(id).or_default();
            for (name, q) in &c.capacity {
                match entry.iter_mut().find(|(n, _)| *n == name.as_str()) {
                    Some((_, total)) => *total = total.checked_add(q).unwrap_or(*total),
                    None => entry.push((name.as_str(), *q)),
                }
            }
        }
        self.views.nodes.clear();
        self
    }

    /// The allocator with scheduler feature gates set (see [`Features`]).
    pub fn with_features(mut self, features: Features) -> Allocator<'a> {
        self.views.features = features;
        self.views.nodes.clear();
        self
    }

    /// An allocator like this one (same slices, classes, devices in use, consumed capacity
    /// and features) without its nodes' views, sharing its index of the slices (built here
    /// if not yet): for answering other nodes on another thread without building it all again.
    pub fn fork(&mut self) -> Allocator<'a> {
        let views = &mut self.views;
        let index = views
            .slice_index
            .get_or_insert_with(|| std::sync::Arc::new(SliceIndex::new(views.slices)));
        Allocator {
            classes: self.classes,
            class_index: self.class_index.clone(),
            views: NodeViews {
                slices: views.slices,
                in_use: InUse {
                    devices: views.in_use.devices.clone(),
                    consumed: views.in_use.consumed.clone(),
                },
                features: views.features,
                nodes: Vec::new(),
                slice_index: Some(index.clone()),
            },
            stats: SearchStats::default(),
            scratch: search::Scratch::default(),
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
        self.views.get(node)
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
        let view = self.views.get(node)?;
        let index = &self.class_index;
        let class = |name: &str| find_class(classes, index, name);
        let (plan, evaluations) = plan_claims(view, classes, &class, claims, options)?;
        self.stats.evaluations = evaluations;
        let mut search = Search::new(view, &plan, options.deadline, &mut self.scratch);
        // Most searches end within a few times the work of taking the first devices (the
        // bench scenarios that fit within 3.3 times); only one that does not is worth the
        // check that skips a search bound to fail (the outcome is the same either way).
        let done = match search.run_for(4 * direct_path(&plan)) {
            Ok(None) if statically_impossible(view, &plan) => Ok(false),
            Ok(None) => search.run(),
            other => other.map(|done| done.unwrap_or(false)),
        };
        let results = match done {
            Ok(true) => search.results(node, classes).map(Some),
            Ok(false) => Ok(None),
            Err(e) => Err(e),
        };
        let steps = search.steps;
        search.finish(&mut self.scratch);
        self.stats.steps = steps;
        self.stats.evaluations += lazy_evaluations(&plan);
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
    /// Every candidate list is complete.
    pub(crate) fn plan<'c>(
        &mut self,
        node: &Node,
        claims: &'c [ResourceClaim],
        options: &AllocateOptions<'_>,
    ) -> Result<Plans<'c>, AllocationError>
    where
        'a: 'c,
    {
        let classes = self.classes;
        let view = self.views.get(node)?;
        let index = &self.class_index;
        let class = |name: &str| find_class(classes, index, name);
        let (plan, evaluations) = plan_claims(view, classes, &class, claims, options)?;
        for cp in &plan {
            for sp in cp.requests.iter().flat_map(|rp| &rp.subs) {
                sp.cands.complete(view, &cp.display);
            }
        }
        self.stats.evaluations = evaluations + lazy_evaluations(&plan);
        Ok(plan)
    }
}
