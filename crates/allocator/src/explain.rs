//! Why claims do not fit: for every request, the devices considered and the first reason
//! each was rejected, plus what the remaining devices lack together (count, constraints).

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Serialize;

use crate::allocator::AllocateOptions;
use crate::allocator::{
    Allocator, CapFit, ClaimPlan, ConstraintKind, Mode, SelectorSet, SubPlan, Verdict,
    capacity_fit, taint_blocks,
};
use crate::api::{DeviceClass, Node, ResourceClaim};
use crate::error::AllocationError;
use crate::model::{NodeView, PoolState};

/// The first reason a device was rejected for a request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "reason", rename_all = "camelCase")]
#[non_exhaustive]
pub enum Reason {
    /// A selector evaluated to false.
    #[serde(rename_all = "camelCase")]
    Selector {
        /// `class NAME` or `claim NAME`.
        owner: String,
        /// Selector index.
        index: usize,
        /// The expression.
        expression: String,
    },
    /// The device's own node selection excludes the node.
    NodeMismatch,
    /// Listed as already allocated.
    InUse,
    /// Its slice skips node operations, which the node does not declare it can
    /// (`DRAOptionalNodeOperations`).
    NodeOperationsUnsupported,
    /// A taint the request does not tolerate.
    #[serde(rename_all = "camelCase")]
    TaintNotTolerated {
        /// Taint key.
        key: String,
        /// Taint value.
        value: String,
        /// Taint effect.
        effect: String,
    },
    /// Shared counters left by allocated devices are not enough for this device.
    #[serde(rename_all = "camelCase")]
    CountersExhausted {
        /// Counter set.
        counter_set: String,
        /// Counter.
        counter: String,
    },
    /// The requested capacity does not fit the device (or its request policy).
    CapacityInsufficient,
    /// The device lacks an attribute a constraint needs.
    #[serde(rename_all = "camelCase")]
    ConstraintConflict {
        /// The attribute.
        attribute: String,
    },
    /// The selection policy rejected the device for this request.
    #[serde(rename_all = "camelCase")]
    PolicyRejected {
        /// The policy's name.
        policy: String,
        /// The policy's reason.
        message: String,
    },
    /// Evaluating a selector failed.
    #[serde(rename_all = "camelCase")]
    SelectorError {
        /// The error.
        message: String,
    },
}

impl Reason {
    fn kind(&self) -> &'static str {
        match self {
            Reason::Selector { .. } => "rejected by selector",
            Reason::NodeMismatch => "not reachable from the node",
            Reason::InUse => "in use",
            Reason::NodeOperationsUnsupported => "skips node operations the node does not",
            Reason::TaintNotTolerated { .. } => "tainted",
            Reason::CountersExhausted { .. } => "counters exhausted",
            Reason::CapacityInsufficient => "capacity insufficient",
            Reason::ConstraintConflict { .. } => "missing a constraint attribute",
            Reason::PolicyRejected { .. } => "rejected by policy",
            Reason::SelectorError { .. } => "selector error",
        }
    }
}

/// One rejected device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Rejection {
    /// `driver/pool/device`.
    pub device: String,
    /// Why.
    #[serde(flatten)]
    pub reason: Reason,
}

/// Why one request (or subrequest) found no devices.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct RequestExplanation {
    /// `request` or `request/subrequest`.
    pub request: String,
    /// Devices wanted (`All` requests want every matching device).
    pub wanted: String,
    /// Devices of the node's usable pools.
    pub considered: usize,
    /// Devices usable for this request on their own.
    pub usable: usize,
    /// Rejected devices with the first reason.
    pub rejected: Vec<Rejection>,
    /// Further findings: constraints no group of usable devices satisfies, competition
    /// between requests.
    pub notes: Vec<String>,
    /// One line for people.
    pub summary: String,
}

/// Why one claim does not fit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct ClaimExplanation {
    /// Claim as `namespace/name`.
    pub claim: String,
    /// One entry per request, or per subrequest of a `firstAvailable` request.
    pub requests: Vec<RequestExplanation>,
}

/// A structured explanation of an allocation that did not succeed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Explanation {
    /// Pools that could not be used, with the reason.
    pub pools: Vec<String>,
    /// Per claim.
    pub claims: Vec<ClaimExplanation>,
    /// The request summaries, one per line.
    pub summary: Vec<String>,
}

fn shorten(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(n).collect();
        t.push('…');
        t
    }
}

impl<'a> Allocator<'a> {
    /// Explains why `claims` do not fit on `node` (also meaningful when they do: every
    /// request then lists its usable devices). Errors are the same hard errors
    /// [`Allocator::allocate`] reports.
    pub fn explain(
        &mut self,
        node: &Node,
        claims: &[ResourceClaim],
    ) -> Result<Explanation, AllocationError> {
        self.explain_with(node, claims, &AllocateOptions::default())
    }

    /// [`Allocator::explain`] under `options`: with a selection policy, the devices it
    /// rejects are listed with its reason ([`Reason::PolicyRejected`]); a failing policy is
    /// the same error [`Allocator::allocate`] reports when the options are fail-closed.
    pub fn explain_with(
        &mut self,
        node: &Node,
        claims: &[ResourceClaim],
        options: &AllocateOptions<'_>,
    ) -> Result<Explanation, AllocationError> {
        let plans = self.plan(node, claims, options)?;
        let policy = options.policy.map(|p| p.name().to_string());
        let classes = self.classes_slice();
        let view = self.node_view(node)?;
        let mut out = Explanation {
            pools: view
                .pools
                .iter()
                .filter_map(|p| match &p.state {
                    PoolState::Usable => None,
                    PoolState::Incomplete => Some(format!(
                        "{}: incomplete (not all slices are published), skipped",
                        p.id()
                    )),
                    PoolState::Invalid(r) => Some(format!("{}: invalid ({r}), skipped", p.id())),
                })
                .collect(),
            claims: Vec::new(),
            summary: Vec::new(),
        };
        for cp in &plans {
            let mut ce = ClaimExplanation {
                claim: cp.display.to_string(),
                requests: Vec::new(),
            };
            for rp in &cp.requests {
                for sp in &rp.subs {
                    let re = explain_sub(view, classes, cp, sp, policy.as_deref());
                    out.summary.push(re.summary.clone());
                    ce.requests.push(re);
                }
            }
            competition(view, cp, &mut ce);
            out.claims.push(ce);
        }
        Ok(out)
    }
}

/// Explains one request (or subrequest): every device of the node with the first reason it
/// is rejected, the shortfall notes, and a one-line summary.
fn explain_sub(
    view: &mut NodeView<'_>,
    classes: &[DeviceClass],
    cp: &ClaimPlan<'_>,
    sp: &SubPlan<'_>,
    policy: Option<&str>,
) -> RequestExplanation {
    let (rejected, usable) = classify_devices(view, classes, cp, sp, policy);
    let wanted = match sp.mode {
        Mode::All => "all".to_string(),
        Mode::Exact(n) => n.to_string(),
    };
    let need = match sp.mode {
        Mode::All => usable.len().max(1),
        Mode::Exact(n) => n,
    };
    let notes = shortfall_notes(view, cp, sp, &usable, need);
    let mut re = RequestExplanation {
        request: sp.full_name.to_string(),
        wanted,
        considered: view.devices.len(),
        usable: usable.len(),
        rejected,
        notes,
        summary: String::new(),
    };
    re.summary = summarize(cp, sp, &re, policy);
    re
}

/// Checks every device of the node against the request: the rejected devices with their
/// first reason, and the indices of the usable ones.
fn classify_devices(
    view: &mut NodeView<'_>,
    classes: &[DeviceClass],
    cp: &ClaimPlan<'_>,
    sp: &SubPlan<'_>,
    policy: Option<&str>,
) -> (Vec<Rejection>, Vec<usize>) {
    let mut rejected = Vec::new();
    let mut usable = Vec::new();
    let mut evaluations = 0;
    let set = SelectorSet::new(view, classes, sp.class, sp.selectors);
    for d in 0..view.devices.len() {
        let verdict = set.verdict(view, d, &cp.display, &mut evaluations);
        let reason = match verdict {
            Verdict::Selector { class, index } => {
                Some(selector_reason(classes, cp, sp, class, index))
            }
            Verdict::Node => Some(Reason::NodeMismatch),
            Verdict::Error(e) => Some(Reason::SelectorError {
                message: kubedev_core::echo::chain(&e),
            }),
            Verdict::Match => fit_reason(view, cp, sp, d, policy),
        };
        match reason {
            Some(reason) => rejected.push(Rejection {
                device: view.devices[d].id(),
                reason,
            }),
            None => usable.push(d),
        }
    }
    (rejected, usable)
}

/// The rejection by the failing selector `index` of the class (`class`) or of the request.
fn selector_reason(
    classes: &[DeviceClass],
    cp: &ClaimPlan<'_>,
    sp: &SubPlan<'_>,
    class: bool,
    index: usize,
) -> Reason {
    let (owner, list): (String, &[crate::api::DeviceSelector]) = if class {
        (
            format!("class {}", classes[sp.class].metadata.name),
            &classes[sp.class].spec.selectors,
        )
    } else {
        (format!("claim {}", cp.display), sp.selectors)
    };
    Reason::Selector {
        owner,
        index,
        expression: list
            .get(index)
            .and_then(|s| s.cel.as_ref())
            .map(|c| c.expression.clone())
            .unwrap_or_default(),
    }
}

/// Why a device whose selectors match cannot serve the request (in use, tainted, counters,
/// capacity, a constraint attribute, the policy), or `None` when it is usable.
fn fit_reason(
    view: &NodeView<'_>,
    cp: &ClaimPlan<'_>,
    sp: &SubPlan<'_>,
    d: usize,
    policy: Option<&str>,
) -> Option<Reason> {
    let dev = &view.devices[d];
    if (dev.allocated || dev.held_by_share()) && !sp.admin {
        Some(Reason::InUse)
    } else if !dev.node_operations_ok {
        Some(Reason::NodeOperationsUnsupported)
    } else if taint_blocks(dev, sp.tolerations) {
        let t = dev.taints().find(|t| {
            !sp.tolerations
                .iter()
                .any(|x| crate::allocator::tolerates(x, t))
        });
        t.map(|t| Reason::TaintNotTolerated {
            key: t.key.clone(),
            value: t.value.clone(),
            effect: t.effect.clone(),
        })
    } else if let Some((set, counter)) = counters_short(view, d) {
        Some(Reason::CountersExhausted {
            counter_set: set,
            counter,
        })
    } else if !matches!(
        capacity_fit(dev, sp.capacity.as_deref(), None),
        Ok(CapFit::Fits(_))
    ) {
        Some(Reason::CapacityInsufficient)
    } else if let Some(c) = cp
        .constraints
        .iter()
        .filter(|c| c.applies(sp.base, sp.sub))
        .find(|c| dev.constraint_attr(c.attribute, d).is_none())
    {
        Some(Reason::ConstraintConflict {
            attribute: c.attribute.to_string(),
        })
    } else {
        sp.policy_rejected
            .iter()
            .find(|(r, _)| *r as usize == d)
            .map(|(_, why)| Reason::PolicyRejected {
                policy: policy.unwrap_or("policy").to_string(),
                message: why.clone(),
            })
    }
}

/// What the usable devices lack together: too few for an `All` request or for the count
/// needed, and constraints no group of them satisfies.
fn shortfall_notes(
    view: &NodeView<'_>,
    cp: &ClaimPlan<'_>,
    sp: &SubPlan<'_>,
    usable: &[usize],
    need: usize,
) -> Vec<String> {
    let mut notes = Vec::new();
    if matches!(sp.mode, Mode::All) && usable.len() < sp.all_devices.len() {
        notes.push(format!(
            "all {} matching devices must be usable, {} are",
            sp.all_devices.len(),
            usable.len()
        ));
    }
    if usable.len() < need {
        notes.push(format!("needs {need} devices, {} usable", usable.len()));
    }
    for c in cp.constraints.iter().filter(|c| c.applies(sp.base, sp.sub)) {
        let mut groups: HashMap<_, usize> = HashMap::new();
        for &d in usable {
            if let Some(v) = view.devices[d].constraint_attr(c.attribute, d) {
                *groups.entry(v).or_default() += 1;
            }
        }
        match c.kind {
            ConstraintKind::Match => {
                let best = groups.values().copied().max().unwrap_or(0);
                if best < need {
                    notes.push(format!(
                        "matchAttribute {}: at most {best} usable devices share a value, {need} needed",
                        c.attribute
                    ));
                }
            }
            ConstraintKind::Distinct => {
                if groups.len() < need {
                    notes.push(format!(
                        "distinctAttribute {}: only {} distinct values among usable devices, {need} needed",
                        c.attribute,
                        groups.len()
                    ));
                }
            }
        }
    }
    notes
}

/// The one-line summary of a request: devices considered, rejections counted by reason (the
/// most frequent selector and the first policy reasons shown), usable and wanted, then the
/// notes.
fn summarize(
    cp: &ClaimPlan<'_>,
    sp: &SubPlan<'_>,
    re: &RequestExplanation,
    policy: Option<&str>,
) -> String {
    let mut counts: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut selector_texts: BTreeMap<String, usize> = BTreeMap::new();
    let mut policy_texts: Vec<String> = Vec::new();
    for r in &re.rejected {
        *counts.entry(r.reason.kind()).or_default() += 1;
        match &r.reason {
            Reason::Selector { expression, .. } => {
                *selector_texts.entry(expression.clone()).or_default() += 1;
            }
            Reason::PolicyRejected { message, .. } => {
                policy_texts.push(format!("{}: {}", r.device, shorten(message, 80)));
            }
            _ => {}
        }
    }
    let mut parts = vec![format!("{} devices", re.considered)];
    for (kind, n) in &counts {
        if *kind == "rejected by selector" {
            let top = selector_texts
                .iter()
                .max_by_key(|(_, n)| **n)
                .map(|(e, _)| shorten(e, 80))
                .unwrap_or_default();
            parts.push(format!("{n} rejected by selector ({top})"));
        } else if *kind == "rejected by policy" {
            let mut shown: Vec<&str> = policy_texts.iter().map(String::as_str).take(3).collect();
            if policy_texts.len() > 3 {
                shown.push("…");
            }
            parts.push(format!(
                "{n} rejected by policy {} ({})",
                policy.unwrap_or("policy"),
                shown.join("; ")
            ));
        } else {
            parts.push(format!("{n} {kind}"));
        }
    }
    parts.push(format!("{} usable, {} wanted", re.usable, re.wanted));
    let mut summary = format!(
        "claim {} request {}: {}",
        cp.display,
        sp.full_name,
        parts.join(", ")
    );
    if !re.notes.is_empty() {
        summary.push_str("; ");
        summary.push_str(&re.notes.join("; "));
    }
    summary
}

/// A counter that allocated devices left too small for this device on its own (a shareable
/// device already shared consumes none again).
fn counters_short(view: &NodeView<'_>, d: usize) -> Option<(String, String)> {
    let dev = &view.devices[d];
    if dev.allows_multiple && dev.shared_before {
        return None;
    }
    let pool = &view.pools[dev.pool];
    for (idx, q) in view.counters(dev) {
        if *q > pool.available[idx] || pool.overdrawn {
            let (set, counter) = pool.counter_names[idx];
            return Some((set.to_string(), counter.to_string()));
        }
    }
    None
}

/// Requests of one claim that each fit alone but not together.
fn competition(view: &NodeView<'_>, cp: &ClaimPlan<'_>, ce: &mut ClaimExplanation) {
    let mut total = 0;
    let mut union: HashSet<u32> = HashSet::new();
    for rp in &cp.requests {
        let Some(sp) = rp.subs.first() else { continue };
        if sp.admin {
            continue;
        }
        total += sp.num_devices;
        for &(d, _) in sp.cands.known().iter() {
            if !view.devices[d as usize].allocated {
                union.insert(d);
            }
        }
    }
    if cp.requests.len() > 1 && total > union.len() {
        let note = format!(
            "the requests of claim {} want {total} devices together, only {} distinct devices match any of them",
            cp.display,
            union.len()
        );
        if let Some(first) = ce.requests.first_mut() {
            first.notes.push(note);
        }
    }
}
