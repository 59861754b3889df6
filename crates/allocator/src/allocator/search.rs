//! The depth-first search over candidates: constraints, counters and shares tracked as devices
//! are taken and given back, and the allocation results built from the devices chosen.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use kubedev_core::Quantity;
use smallvec::SmallVec;

use super::{
    CapFit, ClaimName, ClaimPlan, ConstraintKind, MAX_DEVICES_PER_CLAIM, Mode, SubPlan,
    capacity_fit, capacity_fits, taint_blocks,
};
use crate::api::{
    AllocationResult, DeviceAllocationConfiguration, DeviceAllocationResult, DeviceClass,
    DeviceRequestAllocationResult, Node, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
};
use crate::error::AllocationError;
use crate::model::{AttrKey, NodeDevice, NodeView};

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
    /// With list-type attributes: what all devices of a match constraint share so far.
    common: Vec<AttrKey<'a>>,
    /// With list-type attributes: the value sets of a distinct constraint's devices.
    sets: Vec<Vec<AttrKey<'a>>>,
}

/// What the search holds of one device.
#[derive(Clone, Copy, Default)]
struct Held {
    /// The claims that hold it, one bit per claim.
    claims: u128,
    /// Allocations sharing it (devices that allow multiple allocations).
    shares: u32,
}

pub(crate) struct Search<'s, 'a, 'c> {
    view: &'s NodeView<'a>,
    plan: &'s [ClaimPlan<'c>],
    held: Vec<Held>,
    consumed: SmallVec<[Vec<Quantity>; 1]>,
    share_capacity: Vec<Vec<Quantity>>,
    constraint_state: SmallVec<[SmallVec<[ConstraintState<'a>; 1]>; 1]>,
    pub(crate) chosen: SmallVec<[SmallVec<[Chosen; 2]>; 1]>,
    selected: SmallVec<[SmallVec<[usize; 2]>; 1]>,
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
            held: vec![Held::default(); n],
            consumed: view
                .pools
                .iter()
                .map(|p| vec![Quantity::default(); p.available.len()])
                .collect(),
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
                            common: Vec::new(),
                            sets: Vec::new(),
                        })
                        .collect()
                })
                .collect(),
            chosen: plan.iter().map(|_| SmallVec::new()).collect(),
            selected: plan
                .iter()
                .map(|c| std::iter::repeat_n(0, c.requests.len()).collect())
                .collect(),
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
        let claim = &self.plan[r.claim].display;
        let mut i = start;
        loop {
            // Fewer than `need` candidates left: no way to fill the request from here. (Only
            // known once every device is evaluated, and then only a search that cannot meet a
            // selector error may stop.)
            if self.view_cand(sp, claim, i + need - 1).is_none() && !sp.cands.has_errors() {
                break;
            }
            let Some((d, err)) = self.view_cand(sp, claim, i) else {
                break;
            };
            i += 1;
            let admin = sp.admin;
            let dev = &self.view.devices[d as usize];
            if admin {
                if self.held[d as usize].claims & (1u128 << r.claim) != 0 {
                    continue;
                }
            } else if dev.allocated || self.held[d as usize].claims != 0 {
                continue;
            }
            if let Some(e) = err {
                return Err(sp.cands.error(e).into());
            }
            if (sp.capacity.is_some() || dev.allows_multiple || !dev.plain_capacity())
                && !capacity_fits(dev, sp.capacity.as_deref(), self.share_capacity_of(d))
            {
                continue;
            }
            let Some(undo) = self.take(r, d, false)? else {
                continue;
            };
            // A `false` has evaluated every candidate, so the errors are known then.
            if need > 1 && !self.match_feasible(r, i - 1, need - 1) && !sp.cands.has_errors() {
                self.release(r, d, undo);
                continue;
            }
            match self.one(
                At {
                    dev: r.dev + 1,
                    ..r
                },
                in_sub,
                i,
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
        if self.view.list_attributes {
            // Values are sets then; no shortcut.
            return true;
        }
        let sp = &self.plan[r.claim].requests[r.req].subs[r.sub];
        for &ci in &sp.match_constraints {
            let st = &self.constraint_state[r.claim][ci];
            let Some(value) = st.value else {
                continue;
            };
            let slot = self.plan[r.claim].constraints[ci].slot;
            let claim = &self.plan[r.claim].display;
            let mut found = 0;
            let mut j = i + 1;
            while let Some((d, _)) = self.view_cand(sp, claim, j) {
                j += 1;
                if self.view.attr(slot, d as usize) == Some(value) {
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

    /// Candidate `i` of a subplan, evaluated on first use.
    fn view_cand(
        &self,
        sp: &SubPlan<'_>,
        claim: &ClaimName<'_>,
        i: usize,
    ) -> Option<(u32, Option<usize>)> {
        sp.cands.get(self.view, claim, i)
    }

    fn share_capacity_of(&self, d: u32) -> Option<&[Quantity]> {
        if self.held[d as usize].shares == 0 {
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
        let multi = dev.allows_multiple;
        let bit = 1u128 << r.claim;
        if !multi && sp.admin && self.held[d as usize].claims & bit != 0 {
            return Ok(None);
        }
        if !sp.admin && (dev.allocated || self.held[d as usize].claims != 0) {
            return Ok(None);
        }
        let skip_counters = multi && self.held[d as usize].shares > 0;
        let mut undo = Undo {
            counters: false,
            marked: false,
            constraints: 0,
            share: false,
        };
        if !skip_counters && dev.consumes_counters() {
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
                        claim: plan[r.claim].display.to_string(),
                        request: sp.sub.unwrap_or(sp.base).to_string(),
                        device: dev.id(),
                    });
                }
                return Ok(None);
            }
            undo.constraints += 1;
        }
        if !multi {
            self.held[d as usize].claims |= bit;
            undo.marked = true;
        }
        // Only a shared device keeps what each allocation consumed.
        let share = if multi {
            match capacity_fit(dev, sp.capacity.as_deref(), self.share_capacity_of(d)) {
                Ok(CapFit::Fits(consumed)) => {
                    if self.share_capacity.len() < view.devices.len() {
                        self.share_capacity.resize(view.devices.len(), Vec::new());
                    }
                    let acc = &mut self.share_capacity[d as usize];
                    if self.held[d as usize].shares == 0 || acc.len() != consumed.len() {
                        *acc = vec![Quantity::default(); consumed.len()];
                    }
                    for (a, c) in acc.iter_mut().zip(&consumed) {
                        *a = a.checked_add(c).unwrap_or(*a);
                    }
                    self.held[d as usize].shares += 1;
                    undo.share = true;
                    Some(consumed)
                }
                _ => {
                    self.rollback(r, d, &undo);
                    return Ok(None);
                }
            }
        } else if capacity_fits(dev, sp.capacity.as_deref(), None) {
            None
        } else {
            self.rollback(r, d, &undo);
            return Ok(None);
        };
        self.chosen[r.claim].push(Chosen {
            req: r.req,
            sub: r.sub,
            dev: d,
            share,
        });
        Ok(Some(undo))
    }

    fn reserve_counters(&mut self, dev: &NodeDevice<'_>) -> bool {
        let view = self.view;
        let pool = &view.pools[dev.pool];
        if pool.overdrawn {
            return false;
        }
        let consumed = &mut self.consumed[dev.pool];
        let mut ok = true;
        let mut applied = 0;
        for (idx, q) in view.counters(dev) {
            match consumed[idx].checked_add(q) {
                Some(v) => {
                    consumed[idx] = v;
                    applied += 1;
                    if v > pool.available[idx] {
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
            for (idx, q) in view.counters(dev).take(applied) {
                consumed[idx] = consumed[idx].checked_sub(q).unwrap_or_default();
            }
        }
        ok
    }

    fn undo_counters(&mut self, dev: &NodeDevice<'_>, undo: &Undo) {
        if undo.counters {
            let consumed = &mut self.consumed[dev.pool];
            for (idx, q) in self.view.counters(dev) {
                consumed[idx] = consumed[idx].checked_sub(q).unwrap_or_default();
            }
        }
    }

    /// Undoes a take that did not record a result.
    fn rollback(&mut self, r: At, d: u32, undo: &Undo) {
        let view = self.view;
        let dev = &view.devices[d as usize];
        if undo.marked {
            self.held[d as usize].claims &= !(1u128 << r.claim);
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
            self.held[d as usize].shares -= 1;
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
        if self.view.list_attributes {
            return self.constraint_add_set(claim, ci, d);
        }
        let Some(v) = self.view.attr(c.slot, d as usize) else {
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
                // A list value (with list-type attributes off) is only accepted first, as
                // the scheduler's scalar comparison refuses it.
                let unusable = |k: &AttrKey<'_>| matches!(k, AttrKey::Unusable(_));
                if st.values.contains(&v)
                    || (!st.values.is_empty() && (unusable(&v) || st.values.iter().any(unusable)))
                {
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
        let lists = self.view.list_attributes;
        let st = &mut self.constraint_state[claim][ci];
        match kind {
            ConstraintKind::Match => {
                st.count = st.count.saturating_sub(1);
                if st.count == 0 {
                    st.value = None;
                    st.common.clear();
                }
                // With list-type attributes, the common values narrowed by the device given
                // back stay narrowed until no device is left, as in the scheduler.
            }
            ConstraintKind::Distinct if lists => {
                st.sets.pop();
            }
            ConstraintKind::Distinct => {
                st.values.pop();
            }
        }
    }

    /// `constraint_add` with list-type attributes: a match constraint keeps the values all its
    /// devices share (which must not become empty), a distinct constraint wants each device's
    /// values disjoint from every other's. A scalar is a set of one.
    fn constraint_add_set(&mut self, claim: usize, ci: usize, d: u32) -> bool {
        let c = &self.plan[claim].constraints[ci];
        let Some(set) = self.view.devices[d as usize].constraint_set(c.attribute) else {
            return false;
        };
        let st = &mut self.constraint_state[claim][ci];
        match c.kind {
            ConstraintKind::Match => {
                if st.count == 0 {
                    st.common = set;
                } else {
                    let common: Vec<AttrKey<'a>> = st
                        .common
                        .iter()
                        .copied()
                        .filter(|k| set.contains(k))
                        .collect();
                    if common.is_empty() {
                        return false;
                    }
                    st.common = common;
                }
                st.count += 1;
                true
            }
            ConstraintKind::Distinct => {
                if st.sets.iter().any(|s| s.iter().any(|k| set.contains(k))) {
                    return false;
                }
                st.sets.push(set);
                true
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
                    for (cap, q) in dev.capacity().iter().zip(consumed) {
                        consumed_capacity.insert(cap.key.to_string(), q.to_string());
                    }
                    share_id = Some(share_id_for(cp, &sp.full_name, &dev.id(), k));
                }
                results.push(DeviceRequestAllocationResult {
                    request: sp.full_name.to_string(),
                    driver: dev.driver().to_string(),
                    pool: dev.pool_name().to_string(),
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
        // The configuration entries of each class with configuration: class, their range.
        let mut by_class: Vec<(usize, (usize, usize))> = Vec::new();
        for (ri, rp) in cp.requests.iter().enumerate() {
            let sp = &rp.subs[self.selected_sub(ci, ri)];
            let class_config = &classes[sp.class].spec.config;
            if class_config.is_empty() {
                continue;
            }
            if let Some(&(_, (start, end))) = by_class.iter().find(|(c, _)| *c == sp.class) {
                for c in &mut config[start..end] {
                    c.requests.push(sp.full_name.to_string());
                }
                continue;
            }
            let start = config.len();
            for cc in class_config {
                config.push(DeviceAllocationConfiguration {
                    source: "FromClass".into(),
                    requests: vec![sp.full_name.to_string()],
                    opaque: cc.opaque.clone(),
                });
            }
            by_class.push((sp.class, (start, config.len())));
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
                            .iter()
                            .any(|r| *r == *rp.subs[self.selected_sub(ci, ri)].full_name));
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
