//! The depth-first search over candidates: counters and shares tracked as devices are taken
//! and given back, in the scheduler's order (claims, requests, devices). Constraints are
//! [`constraints`]; the allocation results built from the devices chosen are [`results`].

use std::time::{Duration, Instant};

use kubedev_core::Quantity;
use smallvec::SmallVec;

use super::{
    CapFit, ClaimName, ClaimPlan, Consumption, MAX_DEVICES_PER_CLAIM, Mode, SubPlan, capacity_fit,
    capacity_fits, taint_blocks,
};
use crate::error::AllocationError;
use crate::model::{NodeDevice, NodeView};

mod constraints;
mod results;

use constraints::ConstraintState;

/// One chosen device.
#[derive(Debug, Clone)]
pub(crate) struct Chosen {
    pub(crate) req: usize,
    pub(crate) sub: usize,
    pub(crate) dev: u32,
    /// For a share of a shared device: what it consumes, a range of
    /// [`Search::share_amounts`].
    pub(crate) share: Option<std::ops::Range<u32>>,
}

/// The capacity check of a candidate made before it is taken.
enum Checked {
    /// Not made: taking the device checks.
    No,
    /// The request fits, with what a share of a shared device consumes.
    Fits(Option<Consumption>),
}

/// What taking a device did, so that giving it back undoes exactly that.
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
    /// The work allowed by [`Search::run_for`] is used up.
    Limit,
    Err(Box<AllocationError>),
}

impl From<AllocationError> for Stop {
    fn from(e: AllocationError) -> Stop {
        Stop::Err(Box::new(e))
    }
}

/// Where the search is: the claim, its request, the subrequest tried (of a firstAvailable
/// request), and how many of the request's devices are taken.
#[derive(Clone, Copy)]
struct Position {
    claim: usize,
    req: usize,
    sub: usize,
    dev: usize,
}

impl Position {
    /// The first device of the first claim's first request.
    const START: Position = Position {
        claim: 0,
        req: 0,
        sub: 0,
        dev: 0,
    };

    /// The next device of the same request.
    #[inline]
    fn next_device(self) -> Position {
        Position {
            dev: self.dev + 1,
            ..self
        }
    }

    /// The first device of the claim's next request.
    #[inline]
    fn next_request(self) -> Position {
        Position {
            claim: self.claim,
            req: self.req + 1,
            sub: 0,
            dev: 0,
        }
    }

    /// The first device of the next claim.
    #[inline]
    fn next_claim(self) -> Position {
        Position {
            claim: self.claim + 1,
            req: 0,
            sub: 0,
            dev: 0,
        }
    }
}

/// Buffers a search needs for every device of the node, kept by the allocator between
/// searches so that a repeated allocation does not allocate them again.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    held: Vec<Held>,
}

/// What the search holds of one device.
#[derive(Clone, Copy, Debug, Default)]
struct Held {
    /// The claims that hold it, one bit per claim.
    claims: u128,
    /// Allocations sharing it (devices that allow multiple allocations).
    shares: u32,
}

/// The search over one node's view for a set of planned claims; [`Search::run`] finds the
/// first allocation in the scheduler's order, [`Search::results`] writes it out.
pub(crate) struct Search<'s, 'a, 'c> {
    view: &'s NodeView<'a>,
    plan: &'s [ClaimPlan<'c>],
    held: Vec<Held>,
    consumed: SmallVec<[Vec<Quantity>; 1]>,
    share_capacity: Vec<Consumption>,
    /// What the shares taken consume, per capacity, in the order they were taken (devices
    /// are given back in the reverse order, so this is a stack).
    pub(crate) share_amounts: Vec<Quantity>,
    constraint_state: SmallVec<[SmallVec<[ConstraintState<'a>; 1]>; 1]>,
    pub(crate) chosen: SmallVec<[SmallVec<[Chosen; 2]>; 1]>,
    selected: SmallVec<[SmallVec<[usize; 2]>; 1]>,
    pub(crate) steps: u64,
    /// Steps and candidates looked at, the measure of [`Search::run_for`]'s limit.
    work: std::cell::Cell<u64>,
    /// The search stops with [`Stop::Limit`] once `work` passes this.
    limit: u64,
    deadline: Option<(Instant, Duration)>,
}

impl<'s, 'a, 'c> Search<'s, 'a, 'c> {
    pub(crate) fn new(
        view: &'s NodeView<'a>,
        plan: &'s [ClaimPlan<'c>],
        deadline: Option<Duration>,
        scratch: &mut Scratch,
    ) -> Self {
        let mut held = std::mem::take(&mut scratch.held);
        held.clear();
        held.resize(view.devices.len(), Held::default());
        // Filled in place: the per-claim state is large to move.
        let mut search = Search {
            view,
            held,
            consumed: SmallVec::new(),
            share_capacity: Vec::new(),
            share_amounts: Vec::new(),
            constraint_state: SmallVec::new(),
            chosen: SmallVec::new(),
            selected: SmallVec::new(),
            plan,
            steps: 0,
            work: std::cell::Cell::new(0),
            limit: u64::MAX,
            deadline: deadline.map(|d| (Instant::now(), d)),
        };
        search.consumed.reserve_exact(view.pools.len());
        for p in &view.pools {
            search
                .consumed
                .push(vec![Quantity::default(); p.available.len()]);
        }
        search.constraint_state.reserve_exact(plan.len());
        search.chosen.reserve_exact(plan.len());
        search.selected.reserve_exact(plan.len());
        for c in plan {
            search.constraint_state.push(SmallVec::new());
            if let Some(states) = search.constraint_state.last_mut() {
                states.resize_with(c.constraints.len(), ConstraintState::default);
            }
            search.chosen.push(SmallVec::new());
            search
                .selected
                .push(SmallVec::from_elem(0, c.requests.len()));
        }
        search
    }

    /// Ends the search, keeping its buffers for the next one.
    pub(crate) fn finish(&mut self, scratch: &mut Scratch) {
        scratch.held = std::mem::take(&mut self.held);
    }

    pub(crate) fn run(&mut self) -> Result<bool, AllocationError> {
        self.run_for(u64::MAX).map(|done| done.unwrap_or(false))
    }

    /// Like [`Search::run`], but gives up with `Ok(None)` once it has taken `work` more
    /// steps and looked at candidates. Every device taken is given back then, so the search
    /// can be run again from the start.
    pub(crate) fn run_for(&mut self, work: u64) -> Result<Option<bool>, AllocationError> {
        self.limit = self.work.get().saturating_add(work);
        match self.search_from(Position::START, false, 0) {
            Ok(done) => Ok(Some(done)),
            Err(Stop::MaxSize) => Ok(Some(false)),
            Err(Stop::Limit) => Ok(None),
            Err(Stop::Err(e)) => Err(*e),
        }
    }

    /// The search from `at` on: the rest of the current request (its candidates from the
    /// `start`-th), then the following requests and claims. `in_sub` is set while one
    /// subrequest of a firstAvailable request is tried. `Ok(true)` keeps the devices taken.
    fn search_from(&mut self, at: Position, in_sub: bool, start: usize) -> Result<bool, Stop> {
        self.steps += 1;
        self.count_work()?;
        if self.steps & 255 == 0
            && let Some((t0, limit)) = self.deadline
            && t0.elapsed() > limit
        {
            return Err(AllocationError::Deadline {
                millis: limit.as_millis(),
            }
            .into());
        }
        if at.claim >= self.plan.len() {
            return Ok(true);
        }
        if at.req >= self.plan[at.claim].requests.len() {
            // A claim that outgrows its device limit ends this branch, not the search.
            return match self.search_from(at.next_claim(), false, 0) {
                Err(Stop::MaxSize) => Ok(false),
                other => other,
            };
        }
        let plan = self.plan;
        let rp = &plan[at.claim].requests[at.req];
        if !in_sub && rp.first_available {
            return self.try_subrequests(at, rp.subs.len());
        }
        let sp = &rp.subs[at.sub];
        let all = matches!(sp.mode, Mode::All);
        if all && sp.all_devices.is_empty() {
            return Ok(false);
        }
        if at.dev >= sp.num_devices {
            return self.search_from(at.next_request(), false, 0);
        }
        if self.chosen[at.claim].len() + sp.num_devices - at.dev > MAX_DEVICES_PER_CLAIM {
            return Err(Stop::MaxSize);
        }
        if all {
            self.take_next_of_all(at, sp, in_sub)
        } else {
            self.try_candidates(at, sp, in_sub, start)
        }
    }

    /// A firstAvailable request: its `subs` subrequests in order, the first that leads to an
    /// allocation wins. `MaxSize` only when every one of them outgrew the claim's limit.
    #[inline]
    fn try_subrequests(&mut self, at: Position, subs: usize) -> Result<bool, Stop> {
        let mut all_exceeded = true;
        for sub in 0..subs {
            match self.search_from(Position { sub, ..at }, true, 0) {
                Err(Stop::MaxSize) => continue,
                Err(e) => return Err(e),
                Ok(true) => {
                    self.selected[at.claim][at.req] = sub;
                    return Ok(true);
                }
                Ok(false) => all_exceeded = false,
            }
        }
        if all_exceeded {
            Err(Stop::MaxSize)
        } else {
            Ok(false)
        }
    }

    /// An `All` request: takes its next device (each one must be taken) and goes on.
    #[inline]
    fn take_next_of_all(
        &mut self,
        at: Position,
        sp: &'s SubPlan<'c>,
        in_sub: bool,
    ) -> Result<bool, Stop> {
        let d = sp.all_devices[at.dev];
        let Some(undo) = self.take(at, d, true, Checked::No)? else {
            return Ok(false);
        };
        match self.search_from(at.next_device(), in_sub, 0) {
            Ok(true) => Ok(true),
            other => {
                self.release(at, d, undo);
                other
            }
        }
    }

    /// An `ExactCount` request: tries its candidates from the `start`-th on, each device taken
    /// followed by the search for the rest (combinations, not permutations).
    #[inline]
    fn try_candidates(
        &mut self,
        at: Position,
        sp: &'s SubPlan<'c>,
        in_sub: bool,
        start: usize,
    ) -> Result<bool, Stop> {
        let need = sp.num_devices - at.dev;
        let claim = &self.plan[at.claim].display;
        let mut i = start;
        loop {
            // Fewer than `need` candidates left: no way to fill the request from here. (Only
            // known once every device is evaluated, and then only a search that cannot meet a
            // selector error may stop.)
            if self.candidate(sp, claim, i + need - 1).is_none() && !sp.cands.has_errors() {
                break;
            }
            let Some((d, err)) = self.candidate(sp, claim, i) else {
                break;
            };
            i += 1;
            self.count_work()?;
            if self.unavailable(at.claim, sp.admin, d) {
                continue;
            }
            if let Some(e) = err {
                return Err(sp.cands.error(e).into());
            }
            let Some(checked) = self.capacity_allows(sp, d) else {
                continue;
            };
            let Some(undo) = self.take(at, d, false, checked)? else {
                continue;
            };
            // A `false` has evaluated every candidate, so the errors are known then.
            if need > 1 && !self.match_feasible(at, i - 1, need - 1) && !sp.cands.has_errors() {
                self.release(at, d, undo);
                continue;
            }
            match self.search_from(at.next_device(), in_sub, i) {
                Ok(true) => return Ok(true),
                Ok(false) => self.release(at, d, undo),
                Err(e) => {
                    self.release(at, d, undo);
                    return Err(e);
                }
            }
        }
        Ok(false)
    }

    /// Counts one step or candidate; stops the search once its limit is passed.
    #[inline]
    fn count_work(&self) -> Result<(), Stop> {
        if self.add_work() > self.limit {
            return Err(Stop::Limit);
        }
        Ok(())
    }

    /// Counts one step or candidate; the work so far.
    #[inline]
    fn add_work(&self) -> u64 {
        let work = self.work.get() + 1;
        self.work.set(work);
        work
    }

    /// Whether device `d` is out of reach for `claim`: held by that claim already (admin
    /// access), or allocated or held by any claim.
    #[inline]
    fn unavailable(&self, claim: usize, admin: bool, d: u32) -> bool {
        if admin {
            self.held[d as usize].claims & (1u128 << claim) != 0
        } else {
            self.view.devices[d as usize].allocated || self.held[d as usize].claims != 0
        }
    }

    /// Whether the request's capacity (or the whole device) fits device `d`, with what its
    /// earlier shares took: `None` when it does not, else the check made (for the take).
    #[inline]
    fn capacity_allows(&self, sp: &SubPlan<'_>, d: u32) -> Option<Checked> {
        let dev = &self.view.devices[d as usize];
        if !(sp.capacity.is_some() || dev.allows_multiple || !dev.plain_capacity()) {
            return Some(Checked::No);
        }
        let requests = sp.capacity.as_deref();
        if dev.allows_multiple {
            match capacity_fit(dev, requests, self.share_capacity_of(d)) {
                Ok(CapFit::Fits(consumed)) => Some(Checked::Fits(Some(consumed))),
                _ => None,
            }
        } else if capacity_fits(dev, requests, self.share_capacity_of(d)) {
            Some(Checked::Fits(None))
        } else {
            None
        }
    }

    /// With the current match constraints fixed, can the rest of this request still be
    /// filled from the candidates after position `i`? (Only an upper bound is needed: the
    /// search skips branches that cannot succeed, nothing else.)
    fn match_feasible(&self, at: Position, i: usize, more: usize) -> bool {
        if self.view.list_attributes {
            // Values are sets then; no shortcut.
            return true;
        }
        let sp = &self.plan[at.claim].requests[at.req].subs[at.sub];
        for &ci in &sp.match_constraints {
            let st = &self.constraint_state[at.claim][ci];
            let Some(value) = st.value else {
                continue;
            };
            let slot = self.plan[at.claim].constraints[ci].slot;
            let claim = &self.plan[at.claim].display;
            let mut found = 0;
            let mut j = i + 1;
            while let Some((d, _)) = self.candidate(sp, claim, j) {
                j += 1;
                self.add_work();
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
    fn candidate(
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
        self.share_capacity.get(d as usize).map(|c| c.as_slice())
    }

    /// The scheduler's `allocateDevice`: tries to take device `d` at `at`; `checked` is the
    /// capacity check already made, with nothing taken since.
    fn take(
        &mut self,
        at: Position,
        d: u32,
        must: bool,
        checked: Checked,
    ) -> Result<Option<Undo>, AllocationError> {
        let view = self.view;
        let plan = self.plan;
        let dev = &view.devices[d as usize];
        let sp = &plan[at.claim].requests[at.req].subs[at.sub];
        let multi = dev.allows_multiple;
        let bit = 1u128 << at.claim;
        if !multi && sp.admin && self.held[d as usize].claims & bit != 0 {
            return Ok(None);
        }
        if !sp.admin && (dev.allocated || dev.held_by_share() || self.held[d as usize].claims != 0)
        {
            return Ok(None);
        }
        if !dev.node_operations_ok {
            return Ok(None);
        }
        // A shareable device already shared (before or in this allocation) has its counters
        // consumed once; a further share does not consume them again.
        let skip_counters = multi && (dev.shared_before || self.held[d as usize].shares > 0);
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
        let nconstraints = plan[at.claim].constraints.len();
        for ci in 0..nconstraints {
            if !self.constraint_add(at.claim, ci, base, sub, d) {
                for cj in (0..ci).rev() {
                    self.constraint_remove(at.claim, cj, base, sub);
                }
                self.undo_counters(dev, &undo);
                if must {
                    return Err(AllocationError::AllConstraint {
                        claim: plan[at.claim].display.to_string(),
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
            let fit = match checked {
                Checked::Fits(Some(consumed)) => Ok(CapFit::Fits(consumed)),
                _ => capacity_fit(dev, sp.capacity.as_deref(), self.share_capacity_of(d)),
            };
            match fit {
                Ok(CapFit::Fits(consumed)) => {
                    if self.share_capacity.len() < view.devices.len() {
                        self.share_capacity
                            .resize(view.devices.len(), Consumption::new());
                    }
                    let acc = &mut self.share_capacity[d as usize];
                    if self.held[d as usize].shares == 0 || acc.len() != consumed.len() {
                        acc.clear();
                        acc.resize(consumed.len(), Quantity::default());
                    }
                    for (a, c) in acc.iter_mut().zip(&consumed) {
                        *a = a.checked_add(c).unwrap_or(*a);
                    }
                    self.held[d as usize].shares += 1;
                    undo.share = true;
                    let start = self.share_amounts.len() as u32;
                    self.share_amounts.extend_from_slice(&consumed);
                    Some(start..self.share_amounts.len() as u32)
                }
                _ => {
                    self.rollback(at, d, &undo);
                    return Ok(None);
                }
            }
        } else if matches!(checked, Checked::Fits(_))
            || capacity_fits(dev, sp.capacity.as_deref(), None)
        {
            None
        } else {
            self.rollback(at, d, &undo);
            return Ok(None);
        };
        self.chosen[at.claim].push(Chosen {
            req: at.req,
            sub: at.sub,
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
    fn rollback(&mut self, at: Position, d: u32, undo: &Undo) {
        let view = self.view;
        let dev = &view.devices[d as usize];
        if undo.marked {
            self.held[d as usize].claims &= !(1u128 << at.claim);
        }
        let sp = &self.plan[at.claim].requests[at.req].subs[at.sub];
        let (base, sub) = (sp.base, sp.sub);
        for ci in (0..undo.constraints).rev() {
            self.constraint_remove(at.claim, ci, base, sub);
        }
        self.undo_counters(dev, undo);
    }

    /// Gives back a device taken by [`Search::take`].
    fn release(&mut self, at: Position, d: u32, undo: Undo) {
        if let Some(c) = self.chosen[at.claim].pop()
            && undo.share
            && let Some(range) = c.share
        {
            let consumed = &self.share_amounts[range.start as usize..range.end as usize];
            let acc = &mut self.share_capacity[d as usize];
            for (a, q) in acc.iter_mut().zip(consumed) {
                *a = a.checked_sub(q).unwrap_or_default();
            }
            self.held[d as usize].shares -= 1;
            self.share_amounts.truncate(range.start as usize);
        }
        self.rollback(at, d, &undo);
    }
}
