//! A device the node may allocate, as the search reads it: where it is (pool, slice), what
//! it is (allocated, shareable, node selection), its capacities parsed when first needed,
//! and the attribute values constraints compare.

use kubedev_core::Quantity;

use super::attribute_value::attribute_value;
use crate::api::{
    Device, DeviceAttribute, DeviceCapacity, DeviceTaint, RawQuantity, ResourceSlice,
};
use crate::cel::{self, DeviceContext};

/// A request policy of a consumable capacity, parsed.
#[derive(Clone, Debug, Default)]
pub(crate) struct CapacityPolicy {
    pub(crate) default: Option<Quantity>,
    pub(crate) valid_values: Vec<Quantity>,
    pub(crate) range: Option<ValidRange>,
}

/// The valid range of a capacity request policy, parsed.
#[derive(Clone, Debug, Default)]
pub(crate) struct ValidRange {
    pub(crate) min: Option<Quantity>,
    pub(crate) max: Option<Quantity>,
    pub(crate) step: Option<Quantity>,
    /// The whole value of `min` (zero without one), if it fits an `i64` (what rounding to a
    /// step computes with).
    pub(crate) min_value: Option<i64>,
    /// The whole value of `step`, if there is one and it fits an `i64`.
    pub(crate) step_value: Option<i64>,
    /// `min` and `step` in thousandths when rounding to a step counts in thousandths
    /// (`DRAFractionalCapacityRange`, on from Kubernetes 1.37): each of min, max and step is a
    /// whole number of thousandths that fits an `i64`, and the step at least one.
    pub(crate) milli: Option<(i64, i64)>,
}

/// `q` in thousandths, when it is a whole number of them that fits an `i64`.
pub(crate) fn exact_milli(q: &Quantity) -> Option<i64> {
    let milli = q.milli_value()?;
    Quantity::from_scaled(milli, -3, q.format())
        .ok()
        .filter(|back| back == q)
        .map(|_| milli)
}

/// A capacity of a device, parsed.
#[derive(Clone, Debug)]
pub(crate) struct Capacity<'a> {
    /// The name as the device writes it (also the key in results).
    pub(crate) key: &'a str,
    pub(crate) value: Quantity,
    pub(crate) policy: Option<Box<CapacityPolicy>>,
}

/// A scalar attribute value, as constraints compare them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum AttrKey<'a> {
    Int(i64),
    Bool(bool),
    Str(&'a str),
    Version(&'a str),
    /// A list-valued attribute with `DRAListTypeAttributes` off: equal to nothing (the
    /// device's index keeps it apart), as the scheduler's scalar comparison refuses lists.
    Unusable(usize),
}

/// A device the node may allocate, prepared.
#[derive(Debug)]
pub(crate) struct NodeDevice<'a> {
    pub(crate) pool: usize,
    pub(crate) slice: &'a ResourceSlice,
    pub(crate) device: &'a Device,
    /// Listed in `allocatedDevices`.
    pub(crate) allocated: bool,
    /// Per-device node selection result (true when the slice selects nodes).
    pub(crate) node_selected: Result<bool, Box<str>>,
    /// What selectors and capacity checks need, prepared on first use.
    pub(super) details: std::cell::OnceCell<Box<DeviceDetails<'a>>>,
    /// Counter consumption: a range of [`NodeView::consumption`](super::NodeView).
    pub(super) consumption: std::ops::Range<u32>,
    /// The device allows multiple allocations.
    pub(crate) allows_multiple: bool,
    pub(crate) binds_to_node: bool,
    /// Shares of this device are allocated already: its counters are consumed (and a further
    /// share of a shareable device does not consume them again).
    pub(crate) shared_before: bool,
    /// Capacity existing allocations took from this (shareable) device: name, amount.
    pub(crate) consumed_before: Box<[(&'a str, Quantity)]>,
    /// Whether the device may be allocated as far as node operations go: its slice skips
    /// none, `DRAOptionalNodeOperations` is off (the scheduler then does not look), or the
    /// node declares it.
    pub(crate) node_operations_ok: bool,
    /// The node operations its results say the kubelet skips (the slice's, with the gate on).
    pub(crate) skip_node_operations: &'a [String],
}

/// What selectors and capacity checks need of a device, prepared when first needed (most
/// devices of a node are never looked at closely).
#[derive(Debug)]
pub(super) struct DeviceDetails<'a> {
    pub(super) capacities: ParsedCapacities<'a>,
    /// Whether selectors can read the device, or why not (an attribute without a value
    /// the scheduler converts, an invalid version or capacity), checked on first use.
    readable: std::cell::OnceCell<Result<(), String>>,
    /// The whole CEL `device` variable, built only when an expression reads attributes or
    /// capacities as maps.
    pub(super) full: std::cell::OnceCell<Box<DeviceContext>>,
}

/// A device's capacities, parsed.
#[derive(Debug)]
pub(super) struct ParsedCapacities<'a> {
    pub(super) list: smallvec::SmallVec<[Capacity<'a>; 2]>,
    /// A capacity that does not parse.
    error: Option<String>,
    /// No capacity has a request policy.
    plain: bool,
    /// No capacity has a request policy or a negative value: an allocation that requests no
    /// capacity (and consumes all of it) fits, unless earlier ones took some.
    whole_fits: bool,
}

impl<'a> NodeDevice<'a> {
    /// Whether selectors can read the device: `Err` (for every selector) when an attribute
    /// has no value the scheduler converts or an invalid version, or a capacity does not
    /// parse. The first problem is reported: capacities first, then attributes by name.
    pub(crate) fn readable(&self) -> &Result<(), String> {
        self.details().readable.get_or_init(|| {
            if let Some(e) = &self.parsed_capacities().error {
                return Err(e.clone());
            }
            for (name, a) in &self.device.attributes {
                // Scalars always convert; versions must parse (the interner keeps each text's
                // answer), and anything else is unsupported.
                if a.int.is_none() && a.bool.is_none() && a.string.is_none() {
                    cel::with_interner(|interner| attribute_value(name, a, interner))?;
                }
            }
            Ok(())
        })
    }

    /// The attribute named `domain`/`id` as the `device` variable has it: of the names that
    /// qualify to it (bare for the driver's domain, or `domain/id`), the first by name.
    pub(super) fn attribute(
        &self,
        domain: &str,
        id: &str,
    ) -> Option<(&'a String, &'a DeviceAttribute)> {
        // Names split at their first `/`: a bare name is the driver's, and a domain with a
        // `/` names nothing.
        let bare = !has_slash(id) && cel::str_eq(domain, self.driver());
        let qualified = !has_slash(domain);
        let qualified_len = domain.len() + 1 + id.len();
        // One pass in name order: the first name that qualifies to `domain`/`id` wins.
        self.device.attributes.iter().find(|(k, _)| {
            (bare && cel::str_eq(k, id))
                || (qualified
                    && k.len() == qualified_len
                    && k.as_bytes()[domain.len()] == b'/'
                    && k.starts_with(domain)
                    && k.ends_with(id))
        })
    }

    /// The device does not allow multiple allocations but has shares already (its slice
    /// changed since): no request without admin access may take it, as from Kubernetes 1.38
    /// (kubernetes/kubernetes#140798). Unlike an allocated device, its selectors are still
    /// evaluated first.
    #[inline]
    pub(crate) fn held_by_share(&self) -> bool {
        self.shared_before && !self.allows_multiple
    }

    #[inline]
    pub(super) fn details(&self) -> &DeviceDetails<'a> {
        self.details.get_or_init(|| {
            Box::new(DeviceDetails {
                capacities: parse_capacities(self.device),
                readable: std::cell::OnceCell::new(),
                full: std::cell::OnceCell::new(),
            })
        })
    }

    #[inline]
    pub(super) fn parsed_capacities(&self) -> &ParsedCapacities<'a> {
        &self.details().capacities
    }

    /// The device's capacities (those that parse).
    #[inline]
    pub(crate) fn capacity(&self) -> &[Capacity<'a>] {
        &self.parsed_capacities().list
    }

    /// No capacity has a request policy.
    #[inline]
    pub(crate) fn plain_capacity(&self) -> bool {
        self.parsed_capacities().plain
    }

    /// An allocation that requests no capacity fits the device when nothing else took from
    /// it (no capacity has a request policy or a negative value).
    #[inline]
    pub(crate) fn whole_fits(&self) -> bool {
        self.parsed_capacities().whole_fits
    }

    /// The driver (of the device's pool).
    #[inline]
    pub(crate) fn driver(&self) -> &'a str {
        &self.slice.spec.driver
    }

    /// The name of the device's pool.
    #[inline]
    pub(crate) fn pool_name(&self) -> &'a str {
        &self.slice.spec.pool.name
    }

    /// The device's taints with an effect that blocks allocation.
    #[inline]
    pub(crate) fn taints(&self) -> impl Iterator<Item = &'a DeviceTaint> + use<'a> {
        self.device
            .taints
            .iter()
            .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
    }

    /// Whether the device consumes counters.
    #[inline]
    pub(crate) fn consumes_counters(&self) -> bool {
        !self.consumption.is_empty()
    }

    pub(crate) fn id(&self) -> String {
        format!(
            "{}/{}/{}",
            self.driver(),
            self.pool_name(),
            self.device.name
        )
    }

    /// The attribute a constraint names: the fully qualified name as written, else the bare
    /// id when the domain is the driver's.
    fn find_attribute(&self, qualified: &str) -> Option<&'a DeviceAttribute> {
        // One pass: the qualified name wins wherever it is; the bare id (only for the
        // driver's domain) is kept until the pass ends.
        let bare_id = qualified
            .bytes()
            .position(|b| b == b'/')
            .map(|at| (&qualified[..at], &qualified[at + 1..]))
            .filter(|(domain, _)| cel::str_eq(domain, self.driver()))
            .map(|(_, id)| id);
        let mut bare = None;
        for (k, a) in &self.device.attributes {
            if cel::str_eq(k, qualified) {
                return Some(a);
            }
            if bare.is_none() && bare_id.is_some_and(|id| cel::str_eq(k, id)) {
                bare = Some(a);
            }
        }
        bare
    }

    /// Looks up an attribute for a constraint, as one value (`index` is the device's index,
    /// which keeps a list value apart from every other).
    pub(crate) fn constraint_attr(&self, qualified: &str, index: usize) -> Option<AttrKey<'a>> {
        let found = self.find_attribute(qualified)?;
        if let Some(i) = found.int {
            Some(AttrKey::Int(i))
        } else if let Some(b) = found.bool {
            Some(AttrKey::Bool(b))
        } else if let Some(s) = &found.string {
            Some(AttrKey::Str(s))
        } else if let Some(v) = &found.version {
            Some(AttrKey::Version(v))
        } else if found.ints.is_some()
            || found.bools.is_some()
            || found.strings.is_some()
            || found.versions.is_some()
        {
            Some(AttrKey::Unusable(index))
        } else {
            None
        }
    }

    /// Looks up an attribute for a constraint as a set (`DRAListTypeAttributes`): a scalar is
    /// a set of one, a list its values; an empty list or no attribute is `None`. Versions
    /// compare as written.
    pub(crate) fn constraint_set(&self, qualified: &str) -> Option<Vec<AttrKey<'a>>> {
        let found = self.find_attribute(qualified)?;
        let set: Vec<AttrKey<'a>> = if let Some(i) = found.int {
            vec![AttrKey::Int(i)]
        } else if let Some(b) = found.bool {
            vec![AttrKey::Bool(b)]
        } else if let Some(s) = &found.string {
            vec![AttrKey::Str(s)]
        } else if let Some(v) = &found.version {
            vec![AttrKey::Version(v)]
        } else if let Some(l) = &found.ints {
            l.iter().map(|&i| AttrKey::Int(i)).collect()
        } else if let Some(l) = &found.bools {
            l.iter().map(|&b| AttrKey::Bool(b)).collect()
        } else if let Some(l) = &found.strings {
            l.iter().map(|s| AttrKey::Str(s)).collect()
        } else if let Some(l) = &found.versions {
            l.iter().map(|v| AttrKey::Version(v)).collect()
        } else {
            Vec::new()
        };
        (!set.is_empty()).then_some(set)
    }
}

/// Parses a quantity; `what` names it in the error.
pub(super) fn parse_quantity(text: &str, what: &dyn Fn() -> String) -> Result<Quantity, String> {
    Quantity::parse(text).map_err(|e| format!("{}: {e}", what()))
}

/// Parses the request policy of capacity `name`, if it has one.
fn parse_policy(cap: &DeviceCapacity, name: &str) -> Result<Option<Box<CapacityPolicy>>, String> {
    let Some(p) = &cap.request_policy else {
        return Ok(None);
    };
    let what = || format!("capacity {name} request policy");
    let opt = |q: &Option<RawQuantity>| -> Result<Option<Quantity>, String> {
        q.as_ref()
            .map(|q| parse_quantity(q.as_str(), &what))
            .transpose()
    };
    Ok(Some(Box::new(CapacityPolicy {
        default: opt(&p.default)?,
        valid_values: p
            .valid_values
            .iter()
            .map(|q| parse_quantity(q.as_str(), &what))
            .collect::<Result<_, _>>()?,
        range: match &p.valid_range {
            None => None,
            Some(r) => {
                let (min, max, step) = (opt(&r.min)?, opt(&r.max)?, opt(&r.step)?);
                let all_milli = [min, max, step]
                    .iter()
                    .flatten()
                    .all(|q| exact_milli(q).is_some());
                let milli = match (min, step) {
                    (Some(m), Some(st)) if all_milli => exact_milli(&m)
                        .zip(exact_milli(&st))
                        .filter(|(_, st)| *st >= 1),
                    _ => None,
                };
                Some(ValidRange {
                    min,
                    max,
                    step,
                    min_value: min.unwrap_or_default().value(),
                    step_value: step.and_then(|s| s.value()),
                    milli,
                })
            }
        },
    })))
}

/// Parses a device's capacities; the first that does not parse is the error.
pub(super) fn parse_capacities(d: &Device) -> ParsedCapacities<'_> {
    let mut list: smallvec::SmallVec<[Capacity<'_>; 2]> =
        smallvec::SmallVec::with_capacity(d.capacity.len());
    let mut error = None;
    for (name, c) in &d.capacity {
        match (Quantity::parse(c.value.as_str()), parse_policy(c, name)) {
            (Ok(value), Ok(policy)) => list.push(Capacity {
                key: name.as_str(),
                value,
                policy,
            }),
            (Err(e), _) => {
                error = Some(format!(
                    "capacity {name}: {}",
                    kubedev_core::echo::chain(&e)
                ))
            }
            (_, Err(e)) => error = Some(e),
        }
    }
    ParsedCapacities {
        plain: list.iter().all(|c| c.policy.is_none()),
        whole_fits: list
            .iter()
            .all(|c| c.policy.is_none() && c.value.sign() >= 0),
        list,
        error,
    }
}

/// Whether `s` holds a `/` (names are short: a byte loop, not a `memchr` call).
#[inline]
fn has_slash(s: &str) -> bool {
    s.bytes().any(|b| b == b'/')
}
