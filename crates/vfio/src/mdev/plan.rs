//! The type manager's pure planning step: which wanted type each governed parent holds and
//! which instances go, from what sysfs shows.

use std::collections::BTreeMap;

use super::MdevParent;
use crate::config::DesiredRule;
use crate::naming::PciAddress;

/// The type manager's decision for one parent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParentPlan {
    /// The parent.
    pub parent: PciAddress,
    /// The type it will hold (directory name), or `None` when it supports none of the wanted
    /// types.
    pub type_id: Option<String>,
    /// Instances to remove (of other types).
    pub remove: Vec<String>,
}

/// What the type manager will do: per parent governed by a desired-types entry.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MdevPlan {
    /// One entry per governed parent, by address.
    pub parents: Vec<ParentPlan>,
}

/// The pure planning step of the type manager (see [`MdevTypeManager`](super::MdevTypeManager));
/// `parents` sorted by address.
pub(crate) fn plan(parents: &[MdevParent], rules: &[DesiredRule]) -> MdevPlan {
    // Governed parents by rule index.
    let mut by_rule: BTreeMap<usize, Vec<&MdevParent>> = BTreeMap::new();
    for p in parents {
        if let Some(r) = rules
            .iter()
            .position(|r| r.parents.is_empty() || r.parents.contains(&p.ids))
        {
            by_rule.entry(r).or_default().push(p);
        }
    }
    let mut out = Vec::new();
    for (ri, ps) in by_rule {
        let wanted = &rules[ri].types;
        // The parent's type id for wanted type index w, if it supports it.
        let supported = |p: &MdevParent, w: usize| -> Option<String> {
            p.types
                .iter()
                .find(|t| t.id == wanted[w] || t.name == wanted[w])
                .map(|t| t.id.clone())
        };
        let mut held = vec![0usize; wanted.len()];
        let mut chosen: BTreeMap<PciAddress, Option<String>> = BTreeMap::new();
        // Keep a wanted type a parent already holds (the one with most instances).
        for p in &ps {
            let keep = (0..wanted.len())
                .filter_map(|w| {
                    let id = supported(p, w)?;
                    let n = p.types.iter().find(|t| t.id == id)?.instances.len();
                    (n > 0).then_some((n, std::cmp::Reverse(w), id))
                })
                .max();
            if let Some((_, std::cmp::Reverse(w), id)) = keep {
                held[w] += 1;
                chosen.insert(p.address, Some(id));
            }
        }
        for p in &ps {
            if chosen.contains_key(&p.address) {
                continue;
            }
            let pick = (0..wanted.len())
                .filter_map(|w| supported(p, w).map(|id| (held[w], w, id)))
                .min();
            match pick {
                Some((_, w, id)) => {
                    held[w] += 1;
                    chosen.insert(p.address, Some(id));
                }
                None => {
                    tracing::debug!(parent = %p.address, "mdev parent supports none of the wanted types");
                    chosen.insert(p.address, None);
                }
            }
        }
        for p in ps {
            let type_id = chosen.get(&p.address).cloned().flatten();
            let remove = p
                .types
                .iter()
                .filter(|t| Some(&t.id) != type_id.as_ref())
                .flat_map(|t| t.instances.iter().cloned())
                .collect();
            out.push(ParentPlan {
                parent: p.address,
                type_id,
                remove,
            });
        }
    }
    out.sort_by_key(|p| p.parent);
    MdevPlan { parents: out }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
