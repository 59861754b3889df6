//! The selectors of one request: class and request CEL selectors compiled once, their results
//! cached per device in the node view, and per-device node selection; and the candidates of a
//! request, evaluated in device order only as far as the search asks.

use std::cell::{Cell, Ref, RefCell};
use std::sync::Arc;

use smallvec::SmallVec;

use super::{ClaimName, Verdict};
use crate::api::{DeviceClass, DeviceSelector};
use crate::cel;
use crate::error::{AllocationError, SelectorOwner};
use crate::model::NodeView;

/// The selectors of one request: class selectors first, then the request's, each compiled
/// (through the process-wide cache) and mapped to its slot in the node's result cache.
#[derive(Debug)]
pub(crate) struct SelectorSet<'x> {
    class_name: &'x str,
    entries: SmallVec<[SelectorEntry; 2]>,
}

#[derive(Debug)]
struct SelectorEntry {
    is_class: bool,
    index: usize,
    program: Result<(usize, Arc<cel::Program>), String>,
}

impl<'x> SelectorSet<'x> {
    pub(crate) fn new(
        view: &mut NodeView<'_>,
        classes: &'x [DeviceClass],
        class: usize,
        selectors: &[DeviceSelector],
    ) -> SelectorSet<'x> {
        let class_obj = &classes[class];
        let mut entries = SmallVec::with_capacity(class_obj.spec.selectors.len() + selectors.len());
        let groups: [(&[DeviceSelector], bool); 2] =
            [(&class_obj.spec.selectors, true), (selectors, false)];
        for (list, is_class) in groups {
            for (index, sel) in list.iter().enumerate() {
                let expr = sel
                    .cel
                    .as_ref()
                    .map(|c| c.expression.as_str())
                    .unwrap_or("");
                let program = match view.known_program(expr) {
                    Some(known) => Ok(known),
                    None => match cel::compile(expr) {
                        Ok(p) => Ok((view.program_slot(&p), p)),
                        Err(e) => Err(kubedev_core::echo::chain(&e)),
                    },
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
            entries,
        }
    }

    fn owner(&self, e: &SelectorEntry, claim: &ClaimName<'_>) -> SelectorOwner {
        if e.is_class {
            SelectorOwner::Class(self.class_name.to_string())
        } else {
            SelectorOwner::Claim(claim.to_string())
        }
    }

    /// Whether device `d` matches: every selector true (cached per device and program),
    /// then the device's own node selection. `claim` names the claim in errors.
    pub(crate) fn verdict(
        &self,
        view: &NodeView<'_>,
        d: usize,
        claim: &ClaimName<'_>,
        evaluations: &mut u64,
    ) -> Verdict {
        for e in &self.entries {
            let (slot, program) = match &e.program {
                Ok(p) => p,
                Err(message) => {
                    return Verdict::Error(AllocationError::SelectorCompile {
                        owner: self.owner(e, claim),
                        index: e.index,
                        message: message.clone(),
                    });
                }
            };
            let cached = view.selector_result(*slot, d);
            let mut code = cached.get();
            if code == 0 {
                *evaluations += 1;
                let r = match view.devices[d].readable() {
                    Ok(()) => cel::evaluate_vars(program, &view.device_vars(d))
                        .map_err(|e| kubedev_core::echo::chain(&e)),
                    Err(e) => Err(e.clone()),
                };
                code = match r {
                    Ok(false) => 1,
                    Ok(true) => 2,
                    Err(_) => 3,
                };
                cached.set(code);
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
                    let message = match dev.readable() {
                        Ok(()) => match cel::evaluate_vars(program, &view.device_vars(d)) {
                            Err(e) => kubedev_core::echo::chain(&e),
                            Ok(_) => "inconsistent evaluation".to_string(),
                        },
                        Err(e) => e.clone(),
                    };
                    return Verdict::Error(AllocationError::SelectorRuntime {
                        owner: self.owner(e, claim),
                        index: e.index,
                        device: dev.id(),
                        message,
                    });
                }
            }
        }
        match &view.devices[d].node_selected {
            Ok(true) => Verdict::Match,
            Ok(false) => Verdict::Node,
            Err(e) => Verdict::Error(AllocationError::NodeSelection {
                message: e.to_string(),
            }),
        }
    }
}

/// Candidate devices with the index of their selector error, if any.
pub(crate) type CandList = SmallVec<[(u32, Option<usize>); 4]>;

/// The candidates of an `ExactCount` request: the devices that match or whose selectors fail,
/// in device order, with the error if any. Devices are evaluated when the search (or a check)
/// first asks for a position beyond those known, so a search that succeeds early never looks
/// at the rest of the node; the list is the same as evaluating every device up front.
#[derive(Debug)]
pub(crate) struct Cands<'x> {
    set: Option<SelectorSet<'x>>,
    list: RefCell<CandList>,
    errors: RefCell<Vec<AllocationError>>,
    /// The next device to evaluate.
    next: Cell<usize>,
    evaluations: Cell<u64>,
}

impl<'x> Cands<'x> {
    /// Candidates among the devices that `set` accepts.
    pub(crate) fn new(set: SelectorSet<'x>) -> Cands<'x> {
        Cands {
            set: Some(set),
            list: RefCell::new(SmallVec::new()),
            errors: RefCell::new(Vec::new()),
            next: Cell::new(0),
            evaluations: Cell::new(0),
        }
    }

    /// No candidates (`All` requests list their devices themselves).
    pub(crate) fn none() -> Cands<'x> {
        Cands {
            set: None,
            list: RefCell::new(SmallVec::new()),
            errors: RefCell::new(Vec::new()),
            next: Cell::new(usize::MAX),
            evaluations: Cell::new(0),
        }
    }

    /// Candidate `i`, evaluating further devices as needed; `None` past the last.
    pub(crate) fn get(
        &self,
        view: &NodeView<'_>,
        claim: &ClaimName<'_>,
        i: usize,
    ) -> Option<(u32, Option<usize>)> {
        loop {
            if let Some(&c) = self.list.borrow().get(i) {
                return Some(c);
            }
            if !self.advance(view, claim) {
                return None;
            }
        }
    }

    /// Evaluates the next device; `false` when every device has been evaluated.
    fn advance(&self, view: &NodeView<'_>, claim: &ClaimName<'_>) -> bool {
        let d = self.next.get();
        let Some(set) = &self.set else { return false };
        if d >= view.devices.len() {
            return false;
        }
        self.next.set(d + 1);
        let mut evaluations = 0;
        let verdict = set.verdict(view, d, claim, &mut evaluations);
        self.evaluations.set(self.evaluations.get() + evaluations);
        let entry = match verdict {
            Verdict::Match => (d as u32, None),
            Verdict::Error(e) => {
                let mut errors = self.errors.borrow_mut();
                errors.push(e);
                (d as u32, Some(errors.len() - 1))
            }
            _ => return true,
        };
        let mut list = self.list.borrow_mut();
        if list.len() == list.capacity() {
            // Past the inline room: make room for the rest of the node at once.
            list.reserve(view.devices.len() - d);
        }
        list.push(entry);
        true
    }

    /// Evaluates every remaining device.
    pub(crate) fn complete(&self, view: &NodeView<'_>, claim: &ClaimName<'_>) {
        while self.advance(view, claim) {}
    }

    /// The candidates known so far (all of them after [`Cands::complete`]).
    pub(crate) fn known(&self) -> Ref<'_, CandList> {
        self.list.borrow()
    }

    /// Replaces the (complete) list, as a selection policy orders it.
    pub(crate) fn replace(&self, list: Vec<(u32, Option<usize>)>) {
        *self.list.borrow_mut() = list.into();
    }

    /// Whether a selector failed on some candidate evaluated so far.
    pub(crate) fn has_errors(&self) -> bool {
        !self.errors.borrow().is_empty()
    }

    /// The selector error of a candidate.
    pub(crate) fn error(&self, index: usize) -> AllocationError {
        self.errors.borrow()[index].clone()
    }

    /// Selector evaluations run for these candidates.
    pub(crate) fn evaluations(&self) -> u64 {
        self.evaluations.get()
    }
}
