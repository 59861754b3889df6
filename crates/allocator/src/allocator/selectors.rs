//! The selectors of one request: class and request CEL selectors compiled once, their results
//! cached per device in the node view, and per-device node selection.

use std::sync::Arc;

use super::Verdict;
use crate::api::{DeviceClass, DeviceSelector};
use crate::cel;
use crate::error::{AllocationError, SelectorOwner};
use crate::model::NodeView;

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
