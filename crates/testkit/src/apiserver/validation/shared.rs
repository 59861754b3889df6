//! What the checks of a slice and of its devices share: the release's slice rules, list-valued
//! attributes and a counter set's counters.

use std::collections::BTreeSet;

use serde_json::Value;

use super::names::dns1123_label;
use super::{Path, map_at, present};
use crate::apiserver::release::KubeRelease;
use crate::apiserver::status::{FieldError, quote};

/// Which of the release-dependent slice rules apply.
#[derive(Debug, Clone, Copy)]
pub(super) struct SliceRules {
    /// 1.35+: counter sets and devices in separate slices of the pool, with per-set and
    /// per-consumption limits; 1.34: counters in the slice of their devices, with totals.
    pub(super) split_counters: bool,
    /// 1.36+: list-valued attributes are part of the type.
    pub(super) list_attributes: bool,
}

impl SliceRules {
    pub(super) fn of(release: KubeRelease) -> Self {
        Self {
            split_counters: release.at_least(KubeRelease::V1_35),
            list_attributes: release.at_least(KubeRelease::V1_36),
        }
    }
}

pub(super) fn has_list_value(attribute: &Value) -> bool {
    LIST_VALUES.iter().any(|k| present(attribute, k))
}

pub(super) const LIST_VALUES: [&str; 4] = ["bools", "ints", "strings", "versions"];

/// Counter names of each shared counter set of a slice (1.34 checks references against them).
pub(super) type CounterNames<'a> = std::collections::BTreeMap<&'a str, BTreeSet<&'a str>>;

pub(super) fn check_counters(errs: &mut Vec<FieldError>, holder: &Value, path: &Path, max: usize) {
    match map_at(holder, "counters") {
        None => errs.push(FieldError::required(path.as_str(), "")),
        Some(counters) if counters.is_empty() => errs.push(FieldError::required(path.as_str(), "")),
        Some(counters) if counters.len() > max => {
            errs.push(FieldError::too_many(path.as_str(), counters.len(), max))
        }
        Some(counters) => {
            for (name, counter) in counters {
                let key_path = path.key(name);
                for msg in dns1123_label(name) {
                    errs.push(FieldError::invalid(key_path.as_str(), &quote(name), &msg));
                }
                if !present(counter, "value") {
                    errs.push(FieldError::required(key_path.child("value").as_str(), ""));
                }
            }
        }
    }
}
