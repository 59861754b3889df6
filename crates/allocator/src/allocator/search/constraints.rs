//! The claim's constraints as the search takes and gives back devices: a matchAttribute
//! keeps the value (or, with list-type attributes, the values) its devices share, a
//! distinctAttribute the values already used.

use super::Search;
use crate::allocator::ConstraintKind;
use crate::model::AttrKey;

/// The state of one constraint of a claim during the search.
#[derive(Default)]
pub(super) struct ConstraintState<'a> {
    pub(super) value: Option<AttrKey<'a>>,
    count: usize,
    values: Vec<AttrKey<'a>>,
    /// With list-type attributes: what the devices of a match constraint share, after each
    /// device taken (a stack: giving a device back restores what the earlier ones share).
    common: Vec<Vec<AttrKey<'a>>>,
    /// With list-type attributes: the value sets of a distinct constraint's devices.
    sets: Vec<Vec<AttrKey<'a>>>,
}

impl<'a> Search<'_, 'a, '_> {
    /// Adds device `d` to constraint `ci` of `claim` when the constraint applies to the
    /// request (`base`, subrequest `sub`); `false` when the device's value breaks it.
    #[inline]
    pub(super) fn constraint_add(
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

    /// Takes back what [`Search::constraint_add`] added for the last device.
    #[inline]
    pub(super) fn constraint_remove(
        &mut self,
        claim: usize,
        ci: usize,
        base: &str,
        sub: Option<&str>,
    ) {
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
                if lists {
                    // What the devices still taken share, as the scheduler keeps it.
                    st.common.truncate(st.count);
                }
                if st.count == 0 {
                    st.value = None;
                }
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
    /// devices share (which must not become empty; giving the last device back restores what
    /// the others share), a distinct constraint wants each device's
    /// values disjoint from every other's. A scalar is a set of one.
    #[inline]
    fn constraint_add_set(&mut self, claim: usize, ci: usize, d: u32) -> bool {
        let c = &self.plan[claim].constraints[ci];
        let Some(set) = self.view.devices[d as usize].constraint_set(c.attribute) else {
            return false;
        };
        let st = &mut self.constraint_state[claim][ci];
        match c.kind {
            ConstraintKind::Match => {
                if st.count == 0 {
                    st.common.clear();
                    st.common.push(set);
                } else {
                    let common: Vec<AttrKey<'a>> = st
                        .common
                        .last()
                        .into_iter()
                        .flatten()
                        .copied()
                        .filter(|k| set.contains(k))
                        .collect();
                    if common.is_empty() {
                        return false;
                    }
                    st.common.push(common);
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
}
