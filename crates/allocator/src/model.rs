//! What one node sees: its pools (complete, incomplete or invalid), in allocation order, and
//! the devices it may allocate, prepared once (typed attributes, the CEL `device` variable,
//! parsed quantities, counter indices) and cached per node by the allocator.

use std::collections::HashSet;
use std::sync::Arc;

use kubedev_core::Quantity;

use crate::api::{Device, DeviceAttribute, DeviceCapacity, DeviceTaint, Node, ResourceSlice};
use crate::cel::{self, DeviceContext, FastMap, FastSet, Interner, Value};
use crate::nodesel::node_matches;
use crate::slice_index::SliceIndex;

/// What existing allocations hold: devices in use (`driver, pool, device`), and the capacity
/// taken from devices that allow multiple allocations, per device (capacity name, amount).
#[derive(Debug, Default)]
pub(crate) struct InUse<'a> {
    pub(crate) devices: FastSet<DeviceKey<'a>>,
    pub(crate) consumed: FastMap<DeviceKey<'a>, Vec<(&'a str, Quantity)>>,
}

/// A device: driver, pool, name.
pub(crate) type DeviceKey<'a> = (&'a str, &'a str, &'a str);

/// Whether a pool can be allocated from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum PoolState {
    Usable,
    Incomplete,
    Invalid(String),
}

/// A pool as seen from one node.
#[derive(Debug)]
pub(crate) struct PoolView<'a> {
    pub(crate) driver: &'a str,
    pub(crate) name: &'a str,
    pub(crate) state: PoolState,
    /// Devices of this pool in [`NodeView::devices`].
    pub(crate) devices: std::ops::Range<usize>,
    /// `(counter set, counter)` names, flat.
    pub(crate) counter_names: Vec<(&'a str, &'a str)>,
    /// What is left of each counter after the already-allocated devices (may be negative).
    pub(crate) available: Vec<Quantity>,
    /// The amounts devices consume (entries of their consumption index them).
    pub(crate) amounts: Vec<Quantity>,
    /// Some counter is overdrawn by allocated devices: no device consuming from this pool fits.
    pub(crate) overdrawn: bool,
    /// The driver's name as a CEL value (`device.driver` of the pool's devices).
    pub(crate) driver_value: Value,
}

impl PoolView<'_> {
    pub(crate) fn id(&self) -> String {
        format!("{}/{}", self.driver, self.name)
    }
}

/// A request policy of a consumable capacity, parsed.
#[derive(Clone, Debug, Default)]
pub(crate) struct Policy {
    pub(crate) default: Option<Quantity>,
    pub(crate) valid_values: Vec<Quantity>,
    pub(crate) range: Option<Range>,
}

#[derive(Clone, Debug, Default)]
pub(crate) struct Range {
    pub(crate) min: Option<Quantity>,
    pub(crate) max: Option<Quantity>,
    pub(crate) step: Option<Quantity>,
}

/// A capacity of a device, parsed.
#[derive(Clone, Debug)]
pub(crate) struct Capacity<'a> {
    /// The name as the device writes it (also the key in results).
    pub(crate) key: &'a str,
    pub(crate) value: Quantity,
    pub(crate) policy: Option<Box<Policy>>,
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
pub(crate) struct Dev<'a> {
    pub(crate) pool: usize,
    pub(crate) slice: &'a ResourceSlice,
    pub(crate) device: &'a Device,
    /// Listed in `allocatedDevices`.
    pub(crate) allocated: bool,
    /// Per-device node selection result (true when the slice selects nodes).
    pub(crate) node_ok: Result<bool, Box<str>>,
    /// What selectors and capacity checks need, prepared on first use.
    prepared: std::cell::OnceCell<Box<Prepared<'a>>>,
    /// Counter consumption: a range of [`NodeView::consumption`].
    counters: std::ops::Range<u32>,
    pub(crate) multi: bool,
    pub(crate) binds_to_node: bool,
    /// Capacity existing allocations took from this (shareable) device: name, amount.
    pub(crate) consumed_before: Box<[(&'a str, Quantity)]>,
    /// `DRAListTypeAttributes` is on.
    lists: bool,
}

/// What selectors and capacity checks need of a device, prepared when first needed (most
/// devices of a node are never looked at closely).
#[derive(Debug)]
struct Prepared<'a> {
    caps: Caps<'a>,
    /// Whether selectors can read the device, or why not (an attribute without a value
    /// the scheduler converts, an invalid version or capacity), checked on first use.
    readable: std::cell::OnceCell<Result<(), String>>,
    /// The whole CEL `device` variable, built only when an expression reads attributes or
    /// capacities as maps.
    full: std::cell::OnceCell<Box<DeviceContext>>,
}

/// A device's capacities, parsed.
#[derive(Debug)]
struct Caps<'a> {
    list: smallvec::SmallVec<[Capacity<'a>; 2]>,
    /// A capacity that does not parse.
    error: Option<String>,
    /// No capacity has a request policy.
    plain: bool,
    /// No capacity has a request policy or a negative value: an allocation that requests no
    /// capacity (and consumes all of it) fits, unless earlier ones took some.
    whole_fits: bool,
}

impl<'a> Dev<'a> {
    /// Whether selectors can read the device: `Err` (for every selector) when an attribute
    /// has no value the scheduler converts or an invalid version, or a capacity does not
    /// parse. The first problem is reported: capacities first, then attributes by name.
    pub(crate) fn readable(&self) -> &Result<(), String> {
        self.prepared().readable.get_or_init(|| {
            if let Some(e) = &self.caps().error {
                return Err(e.clone());
            }
            for (name, a) in &self.device.attributes {
                // Scalars always convert; versions must parse (the interner keeps each text's
                // answer), and anything else is unsupported.
                if a.int.is_none() && a.bool.is_none() && a.string.is_none() {
                    cel::with_interner(|interner| attribute_value(name, a, self.lists, interner))?;
                }
            }
            Ok(())
        })
    }

    /// The attribute named `domain`/`id` as the `device` variable has it: of the names that
    /// qualify to it (bare for the driver's domain, or `domain/id`), the first by name.
    fn attribute(&self, domain: &str, id: &str) -> Option<(&'a String, &'a DeviceAttribute)> {
        // Names split at their first `/`: a bare name is the driver's, and a domain with a
        // `/` names nothing.
        let bare = domain == self.driver() && !id.contains('/');
        let qualified = !domain.contains('/');
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

    fn prepared(&self) -> &Prepared<'a> {
        self.prepared.get_or_init(|| {
            Box::new(Prepared {
                caps: parse_caps(self.device),
                readable: std::cell::OnceCell::new(),
                full: std::cell::OnceCell::new(),
            })
        })
    }

    fn caps(&self) -> &Caps<'a> {
        &self.prepared().caps
    }

    /// The device's capacities (those that parse).
    pub(crate) fn capacity(&self) -> &[Capacity<'a>] {
        &self.caps().list
    }

    /// No capacity has a request policy.
    pub(crate) fn plain_capacity(&self) -> bool {
        self.caps().plain
    }

    /// An allocation that requests no capacity fits the device when nothing else took from
    /// it (no capacity has a request policy or a negative value).
    pub(crate) fn whole_fits(&self) -> bool {
        self.caps().whole_fits
    }

    /// The driver (of the device's pool).
    pub(crate) fn driver(&self) -> &'a str {
        &self.slice.spec.driver
    }

    /// The name of the device's pool.
    pub(crate) fn pool_name(&self) -> &'a str {
        &self.slice.spec.pool.name
    }

    /// The device's taints with an effect that blocks allocation.
    pub(crate) fn taints(&self) -> impl Iterator<Item = &'a DeviceTaint> + use<'a> {
        self.device
            .taints
            .iter()
            .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
    }

    /// Whether the device consumes counters.
    pub(crate) fn consumes_counters(&self) -> bool {
        !self.counters.is_empty()
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
    fn find_attr(&self, qualified: &str) -> Option<&'a DeviceAttribute> {
        let attrs = &self.device.attributes;
        attrs.get(qualified).or_else(|| {
            let (domain, id) = qualified.split_once('/')?;
            if domain != self.driver() {
                return None;
            }
            attrs.get(id)
        })
    }

    /// Looks up an attribute for a constraint, as one value (`index` is the device's index,
    /// which keeps a list value apart from every other).
    pub(crate) fn constraint_attr(&self, qualified: &str, index: usize) -> Option<AttrKey<'a>> {
        let found = self.find_attr(qualified)?;
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
        let found = self.find_attr(qualified)?;
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

/// Everything the node sees.
#[derive(Debug)]
pub(crate) struct NodeView<'a> {
    pub(crate) pools: Vec<PoolView<'a>>,
    pub(crate) devices: Vec<Dev<'a>>,
    /// The counter consumption of every device, flat: index into the pool's flat counters,
    /// index into the pool's amounts.
    consumption: Vec<(u32, u32)>,
    /// Selector results per program and device, program-major (`slot * devices + d`):
    /// 0 = not evaluated, 1 = false, 2 = true, 3 = error.
    selector_cache: Vec<std::cell::Cell<u8>>,
    /// Programs with cached results, by slot.
    programs: Vec<Arc<cel::Program>>,
    /// Program slots by address, once there are many programs.
    program_index: FastMap<usize, usize>,
    /// Constraint attributes per slot and device (`slot * devices + d`), looked up on first
    /// use.
    attr_values: Vec<std::cell::Cell<Looked<'a>>>,
    /// Qualified attribute names by slot.
    attr_names: Vec<String>,
    /// `DRAListTypeAttributes` is on: constraints compare attributes as sets.
    pub(crate) list_attributes: bool,
}

/// A constraint attribute of one device: not looked up yet, or its value if any.
#[derive(Clone, Copy, Debug)]
enum Looked<'a> {
    Unknown,
    Found(Option<AttrKey<'a>>),
}

impl<'a> NodeView<'a> {
    /// What device `dev` consumes: index into its pool's flat counters, amount.
    pub(crate) fn counters(
        &self,
        dev: &Dev<'_>,
    ) -> impl Iterator<Item = (usize, &Quantity)> + Clone + '_ {
        let amounts = &self.pools[dev.pool].amounts;
        self.consumption[dev.counters.start as usize..dev.counters.end as usize]
            .iter()
            .map(move |&(idx, at)| (idx as usize, &amounts[at as usize]))
    }

    /// The slot of a constraint attribute (`qualified` is the constraint's name for it).
    pub(crate) fn attr_slot(&mut self, qualified: &str) -> usize {
        if let Some(slot) = self
            .attr_names
            .iter()
            .position(|n| cel::str_eq(n, qualified))
        {
            return slot;
        }
        self.attr_values.extend(std::iter::repeat_n(
            std::cell::Cell::new(Looked::Unknown),
            self.devices.len(),
        ));
        self.attr_names.push(qualified.to_string());
        self.attr_names.len() - 1
    }

    /// Device `d`'s value of the attribute in `slot`, looked up once.
    pub(crate) fn attr(&self, slot: usize, d: usize) -> Option<AttrKey<'a>> {
        let cell = &self.attr_values[slot * self.devices.len() + d];
        match cell.get() {
            Looked::Found(v) => v,
            Looked::Unknown => {
                let v = self.devices[d].constraint_attr(&self.attr_names[slot], d);
                cell.set(Looked::Found(v));
                v
            }
        }
    }

    /// The slot of a program's cached results, added on first use.
    pub(crate) fn program_slot(&mut self, program: &Arc<cel::Program>) -> usize {
        const LINEAR: usize = 16;
        let key = Arc::as_ptr(program) as usize;
        let found = if self.programs.len() <= LINEAR {
            self.programs.iter().position(|p| Arc::ptr_eq(p, program))
        } else {
            self.program_index.get(&key).copied()
        };
        if let Some(slot) = found {
            return slot;
        }
        let slot = self.programs.len();
        if self.programs.is_empty() {
            // A class selector and a request selector or two, usually.
            self.programs.reserve(4);
            self.selector_cache.reserve(4 * self.devices.len());
        }
        self.programs.push(program.clone());
        self.selector_cache.extend(std::iter::repeat_n(
            std::cell::Cell::new(0u8),
            self.devices.len(),
        ));
        if self.programs.len() > LINEAR {
            if self.program_index.is_empty() {
                for (i, p) in self.programs.iter().enumerate() {
                    self.program_index.insert(Arc::as_ptr(p) as usize, i);
                }
            } else {
                self.program_index.insert(key, slot);
            }
        }
        slot
    }

    /// The CEL `device` variable of device `d` (which must be [`Dev::readable`]).
    pub(crate) fn device_vars(&self, d: usize) -> DevVars<'_, 'a> {
        let dev = &self.devices[d];
        DevVars {
            dev,
            driver: &self.pools[dev.pool].driver_value,
        }
    }

    /// The cached result of the program in `slot` on device `d`.
    pub(crate) fn selector_result(&self, slot: usize, d: usize) -> &std::cell::Cell<u8> {
        &self.selector_cache[slot * self.devices.len() + d]
    }
}

fn slice_relevant(node: &Node, slice: &ResourceSlice) -> Result<bool, String> {
    let spec = &slice.spec;
    // A slice of counter sets only (1.35+) serves every node its pool's devices serve.
    if !spec.shared_counters.is_empty() && spec.devices.is_empty() {
        return Ok(true);
    }
    let node_name = spec.node_name.as_deref().filter(|n| !n.is_empty());
    let all = spec.all_nodes.unwrap_or(false);
    if node_name.is_some() || all || spec.node_selector.is_some() {
        return node_matches(node, node_name, all, spec.node_selector.as_ref()).map_err(|e| {
            format!(
                "failed to perform node selection for slice {}: {e}",
                slice.metadata.name
            )
        });
    }
    if spec.per_device_node_selection.unwrap_or(false) {
        for d in &spec.devices {
            let m = node_matches(
                node,
                d.node_name.as_deref(),
                d.all_nodes.unwrap_or(false),
                d.node_selector.as_ref(),
            )
            .map_err(|e| {
                format!(
                    "failed to perform node selection for device {} in slice {}: {e}",
                    d.name, slice.metadata.name
                )
            })?;
            if m {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

fn parse_q(text: &str, what: &dyn Fn() -> String) -> Result<Quantity, String> {
    Quantity::parse(text).map_err(|e| format!("{}: {e}", what()))
}

fn parse_policy(cap: &DeviceCapacity, name: &str) -> Result<Option<Box<Policy>>, String> {
    let Some(p) = &cap.request_policy else {
        return Ok(None);
    };
    let what = || format!("capacity {name} request policy");
    let opt = |q: &Option<crate::api::RawQuantity>| -> Result<Option<Quantity>, String> {
        q.as_ref().map(|q| parse_q(q.as_str(), &what)).transpose()
    };
    Ok(Some(Box::new(Policy {
        default: opt(&p.default)?,
        valid_values: p
            .valid_values
            .iter()
            .map(|q| parse_q(q.as_str(), &what))
            .collect::<Result<_, _>>()?,
        range: match &p.valid_range {
            None => None,
            Some(r) => Some(Range {
                min: opt(&r.min)?,
                max: opt(&r.max)?,
                step: opt(&r.step)?,
            }),
        },
    })))
}

/// Builds the `device` variable as the scheduler does: the first set field of each attribute
/// (int, bool, string, version); none set or an invalid version is an error for every
/// selector evaluated on the device.
fn device_context(
    dev: &Device,
    driver: &str,
    caps: &[Capacity<'_>],
    lists: bool,
    interner: &mut Interner,
) -> Result<DeviceContext, String> {
    let mut ctx = DeviceContext::empty(
        interner,
        driver,
        dev.allow_multiple_allocations.unwrap_or(false),
        (dev.attributes.len(), caps.len()),
    );
    for (name, a) in &dev.attributes {
        let v = attribute_value(name, a, lists, interner)?;
        ctx.push_attribute(interner, driver, name, v);
    }
    for c in caps {
        ctx.push_capacity(interner, driver, c.key, c.value);
    }
    Ok(ctx)
}

/// An attribute as the `device` variable has it: the first set field of int, bool, string,
/// version (and with `lists`, the list fields); none set or an invalid version is an error.
fn attribute_value(
    name: &str,
    a: &DeviceAttribute,
    lists: bool,
    interner: &mut Interner,
) -> Result<Value, String> {
    Ok(if let Some(i) = a.int {
        Value::Int(i)
    } else if let Some(b) = a.bool {
        Value::Bool(b)
    } else if let Some(s) = &a.string {
        Value::String(interner.str(s))
    } else if let Some(v) = &a.version {
        interner
            .version(v)
            .map_err(|e| format!("attribute {name}: parse semantic version: {e}"))?
    } else if let Some(list) = lists.then(|| list_value(a, interner)).flatten() {
        list.map_err(|e| format!("attribute {name}: parse semantic version: {e}"))?
    } else {
        return Err(format!("attribute {name}: unsupported attribute value"));
    })
}

/// The CEL `device` variable of one device, read from its slice as an expression asks:
/// a selector that reads a few attributes converts only those.
pub(crate) struct DevVars<'d, 'a> {
    dev: &'d Dev<'a>,
    driver: &'d Value,
}

impl DevVars<'_, '_> {
    fn full(&self) -> &DeviceContext {
        let dev = self.dev;
        dev.prepared().full.get_or_init(|| {
            let caps = dev.caps();
            Box::new(
                cel::with_interner(|interner| {
                    device_context(dev.device, dev.driver(), &caps.list, dev.lists, interner)
                })
                .unwrap_or_else(|_| {
                    // Not readable: selectors are not evaluated on such a device.
                    DeviceContext::new(dev.driver(), [], [], false)
                }),
            )
        })
    }
}

impl cel::DeviceVars for DevVars<'_, '_> {
    fn driver(&self) -> Value {
        self.driver.clone()
    }

    fn allow_multiple(&self) -> bool {
        self.dev.multi
    }

    fn attributes(&self) -> Value {
        self.full().attributes().clone()
    }

    fn capacity(&self) -> Value {
        self.full().capacity().clone()
    }

    fn entry(&self, capacity: bool, domain: &str, id: &str) -> Option<Value> {
        let dev = self.dev;
        if capacity {
            let c = dev
                .capacity()
                .iter()
                .find(|c| cel::split_qualified(c.key, dev.driver()) == (domain, id))?;
            return Some(cel::with_interner(|interner| interner.quantity(c.value)));
        }
        let (name, a) = dev.attribute(domain, id)?;
        cel::with_interner(|interner| attribute_value(name, a, dev.lists, interner).ok())
    }

    fn entry_ref(&self, capacity: bool, domain: &str, id: &str) -> Option<cel::EntryRef<'_>> {
        if !capacity
            && let Some((_, a)) = self.dev.attribute(domain, id)
            && a.int.is_none()
            && a.bool.is_none()
            && let Some(s) = &a.string
        {
            return Some(cel::EntryRef::Str(s));
        }
        self.entry(capacity, domain, id).map(cel::EntryRef::Value)
    }
}

/// Parses a device's capacities; the first that does not parse is the error.
fn parse_caps(d: &Device) -> Caps<'_> {
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
    Caps {
        plain: list.iter().all(|c| c.policy.is_none()),
        whole_fits: list
            .iter()
            .all(|c| c.policy.is_none() && c.value.sign() >= 0),
        list,
        error,
    }
}

/// A list-type attribute as a CEL list (`None` when it has no list value).
fn list_value(a: &DeviceAttribute, interner: &mut Interner) -> Option<Result<Value, String>> {
    let list = |items: Vec<Value>| Value::List(std::sync::Arc::new(items));
    Some(Ok(if let Some(l) = &a.ints {
        list(l.iter().map(|&i| Value::Int(i)).collect())
    } else if let Some(l) = &a.bools {
        list(l.iter().map(|&b| Value::Bool(b)).collect())
    } else if let Some(l) = &a.strings {
        list(l.iter().map(|s| Value::String(interner.str(s))).collect())
    } else if let Some(l) = &a.versions {
        let mut items = Vec::with_capacity(l.len());
        for v in l {
            match interner.version(v) {
                Ok(v) => items.push(v),
                Err(e) => return Some(Err(e)),
            }
        }
        list(items)
    } else {
        return None;
    }))
}

struct RawPool<'a> {
    driver: &'a str,
    name: &'a str,
    generation: i64,
    slices: Slices<'a>,
}

/// Some slices of a pool (mostly one or two).
type Slices<'a> = smallvec::SmallVec<[&'a ResourceSlice; 2]>;

/// Gathers the pools relevant for `node` (the scheduler's `GatherPools`) and prepares their
/// devices.
pub(crate) fn build_node_view<'a>(
    node: &Node,
    slices: &'a [ResourceSlice],
    slice_index: Option<&SliceIndex>,
    in_use: &InUse<'a>,
    features: crate::Features,
) -> Result<NodeView<'a>, String> {
    let mut raw: smallvec::SmallVec<[RawPool<'a>; 2]> = smallvec::SmallVec::new();
    // Pools by (driver, name): searched in `raw` while there are few, then indexed.
    let mut index: FastMap<(&'a str, &'a str), usize> = FastMap::default();
    let indexed: Option<Vec<&'a ResourceSlice>> =
        slice_index.map(|ix| ix.for_node(slices, &node.name));
    let mut from_index = indexed.iter().flatten().copied();
    let mut every = slices.iter();
    let candidates: &mut dyn Iterator<Item = &'a ResourceSlice> = if indexed.is_some() {
        &mut from_index
    } else {
        &mut every
    };
    for slice in candidates {
        if !slice_relevant(node, slice)? {
            continue;
        }
        let key = (slice.spec.driver.as_str(), slice.spec.pool.name.as_str());
        let generation = slice.spec.pool.generation;
        let found = if raw.len() <= 8 {
            raw.iter().position(|p| (p.driver, p.name) == key)
        } else {
            if index.is_empty() {
                index.extend(raw.iter().enumerate().map(|(i, p)| ((p.driver, p.name), i)));
            }
            index.get(&key).copied()
        };
        match found.as_ref() {
            None => {
                if !index.is_empty() {
                    index.insert(key, raw.len());
                }
                let mut pool_slices = Slices::new();
                pool_slices.reserve(slice.spec.pool.resource_slice_count.clamp(1, 64) as usize);
                pool_slices.push(slice);
                raw.push(RawPool {
                    driver: key.0,
                    name: key.1,
                    generation,
                    slices: pool_slices,
                });
            }
            Some(&i) => {
                let p = &mut raw[i];
                if generation < p.generation {
                    continue;
                }
                if generation > p.generation {
                    p.generation = generation;
                    p.slices.clear();
                }
                p.slices.push(slice);
            }
        }
    }

    /// A pool gathered for the node: its view, its slices (relevant for the node, and the
    /// pool's other slices), whether a device has binding conditions.
    struct Gathered<'a> {
        pool: PoolView<'a>,
        relevant: Slices<'a>,
        others: Vec<&'a ResourceSlice>,
        binding: bool,
    }
    let mut gathered: smallvec::SmallVec<[Gathered<'a>; 2]> =
        smallvec::SmallVec::with_capacity(raw.len());
    for p in raw {
        let wanted = p.slices[0].spec.pool.resource_slice_count;
        let mut others: Vec<&'a ResourceSlice> = Vec::new();
        if p.slices.len() as i64 != wanted {
            // Look at every slice of the pool, also those not relevant for this node.
            let mut obsolete = false;
            let mut all = Vec::new();
            let of_pool: Vec<&'a ResourceSlice> = match slice_index {
                Some(ix) => ix.pool(slices, p.driver, p.name),
                None => slices.iter().collect(),
            };
            for s in of_pool {
                if s.spec.driver != p.driver || s.spec.pool.name != p.name {
                    continue;
                }
                if s.spec.pool.generation == p.generation {
                    all.push(s);
                } else if s.spec.pool.generation > p.generation {
                    obsolete = true;
                    break;
                }
            }
            if obsolete {
                continue;
            }
            if all.len() as i64 != wanted {
                gathered.push(Gathered {
                    pool: PoolView {
                        driver: p.driver,
                        name: p.name,
                        state: PoolState::Incomplete,
                        devices: 0..0,
                        counter_names: Vec::new(),
                        available: Vec::new(),
                        amounts: Vec::new(),
                        overdrawn: false,
                        driver_value: Value::Null,
                    },
                    relevant: Slices::new(),
                    others: Vec::new(),
                    binding: false,
                });
                continue;
            }
            let relevant: HashSet<&str> =
                p.slices.iter().map(|s| s.metadata.name.as_str()).collect();
            others = all
                .into_iter()
                .filter(|s| !relevant.contains(s.metadata.name.as_str()))
                .collect();
        }
        let mut relevant = p.slices;
        relevant.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        let has_binding = relevant.iter().any(|s| {
            s.spec
                .devices
                .iter()
                .any(|d| !d.binding_conditions.is_empty())
        });
        gathered.push(Gathered {
            pool: PoolView {
                driver: p.driver,
                name: p.name,
                state: PoolState::Usable,
                devices: 0..0,
                counter_names: Vec::new(),
                available: Vec::new(),
                amounts: Vec::new(),
                overdrawn: false,
                driver_value: cel::with_interner(|interner| Value::String(interner.str(p.driver))),
            },
            relevant,
            others,
            binding: has_binding,
        });
    }

    // Sort by (driver, pool), pools with binding conditions last.
    if gathered.len() > 1 {
        gathered.sort_by(|a, b| {
            (a.binding, a.pool.driver, a.pool.name).cmp(&(b.binding, b.pool.driver, b.pool.name))
        });
    }
    let total: usize = gathered
        .iter()
        .flat_map(|g| g.relevant.iter())
        .map(|s| s.spec.devices.len())
        .sum();
    let mut view = NodeView {
        pools: Vec::with_capacity(gathered.len()),
        devices: Vec::with_capacity(total),
        consumption: Vec::new(),
        selector_cache: Vec::new(),
        programs: Vec::new(),
        program_index: FastMap::default(),
        attr_values: Vec::new(),
        attr_names: Vec::new(),
        list_attributes: features.list_type_attributes,
    };
    for g in gathered {
        let pi = view.pools.len();
        let usable = g.pool.state == PoolState::Usable;
        view.pools.push(g.pool);
        if !usable {
            continue;
        }
        if let Err(reason) = prepare_pool(
            &mut view,
            pi,
            node,
            &g.relevant,
            &g.others,
            in_use,
            features,
        ) {
            let pool = &mut view.pools[pi];
            view.devices.truncate(pool.devices.start);
            pool.devices = pool.devices.start..pool.devices.start;
            pool.state = PoolState::Invalid(reason);
        }
    }
    Ok(view)
}

/// Prepares the devices of one usable pool for the node: checks device and counter set
/// names, flattens the counter sets, subtracts what allocated devices consume, and appends
/// the pool's candidate devices to the view. An error makes the pool invalid.
fn prepare_pool<'a>(
    view: &mut NodeView<'a>,
    pi: usize,
    node: &Node,
    relevant: &[&'a ResourceSlice],
    others: &[&'a ResourceSlice],
    in_use: &InUse<'a>,
    features: crate::Features,
) -> Result<(), String> {
    let (driver, pool_name) = (view.pools[pi].driver, view.pools[pi].name);
    let start = view.devices.len();
    view.pools[pi].devices = start..start;
    // Kubernetes 1.35+ keeps counter sets and devices in separate slices; 1.34 put the sets in
    // the slice of the devices consuming them. A slice may therefore be in both lists.
    let device_slices = || relevant.iter().copied().filter(|s| is_device_slice(s));
    check_device_names(device_slices())?;
    let mut prep = PoolPrep {
        pi,
        driver,
        pool_name,
        in_use,
        lists: features.list_type_attributes,
        counters: CounterSets::flatten(
            relevant
                .iter()
                .copied()
                .filter(|s| !s.spec.shared_counters.is_empty()),
        )?,
    };
    prep.subtract_allocated(relevant, others)?;
    let overdrawn = prep.counters.available.iter().any(|q| q.sign() < 0);

    let consumption_start = view.consumption.len();
    if !prep.counters.sets.is_empty() {
        // Partitions mostly consume two or three counters.
        let devices: usize = device_slices().map(|s| s.spec.devices.len()).sum();
        view.consumption.reserve(2 * devices);
    }
    let result = (|| {
        for s in device_slices() {
            for d in &s.spec.devices {
                let dev = prep.device(node, s, d, &mut view.consumption)?;
                view.devices.push(dev);
            }
        }
        Ok(())
    })();
    if let Err(e) = result {
        view.consumption.truncate(consumption_start);
        return Err(e);
    }
    let pool = &mut view.pools[pi];
    pool.devices = start..view.devices.len();
    pool.counter_names = prep.counters.names;
    pool.available = prep.counters.available;
    pool.amounts = prep.counters.amounts.into_inner().values;
    pool.overdrawn = overdrawn;
    Ok(())
}

/// Whether a slice of a pool lists devices the node may allocate (a slice of counter sets
/// only does not).
fn is_device_slice(s: &ResourceSlice) -> bool {
    s.spec.shared_counters.is_empty() || !s.spec.devices.is_empty()
}

/// Fails on a device name that two devices of the pool's slices share.
fn check_device_names<'s>(
    device_slices: impl Iterator<Item = &'s ResourceSlice> + Clone,
) -> Result<(), String> {
    let total: usize = device_slices.clone().map(|s| s.spec.devices.len()).sum();
    let names = || {
        device_slices
            .clone()
            .flat_map(|s| s.spec.devices.iter().map(|d| d.name.as_str()))
    };
    if total <= 16 {
        // Few names: comparing each pair is cheaper than hashing.
        let names: smallvec::SmallVec<[&str; 16]> = names().collect();
        for (i, a) in names.iter().enumerate() {
            if names[..i].iter().any(|b| cel::str_eq(a, b)) {
                return Err(format!("duplicate device name {a}"));
            }
        }
        return Ok(());
    }
    // Open addressing over the names' positions; equal hashes are compared as text.
    let size = (total * 2).next_power_of_two();
    let mask = size - 1;
    let mut table: Vec<(u32, u32)> = vec![(u32::MAX, 0); size];
    let mut seen: Vec<&str> = Vec::with_capacity(total);
    for name in names() {
        let h = cel::fast_hash(name);
        let mut at = h as usize & mask;
        loop {
            let (i, short) = table[at];
            if i == u32::MAX {
                table[at] = (seen.len() as u32, h as u32);
                seen.push(name);
                break;
            }
            if short == h as u32 && seen[i as usize] == name {
                return Err(format!("duplicate device name {name}"));
            }
            at = (at + 1) & mask;
        }
    }
    Ok(())
}

/// The counter sets of a pool, flattened: `(set, counter)` names, what is available of each,
/// and per set the range of its counters in the flat lists; and the amounts devices consume,
/// each distinct text parsed once.
struct CounterSets<'a> {
    names: Vec<(&'a str, &'a str)>,
    available: Vec<Quantity>,
    /// Each set: its name, and its counters' flat indices.
    sets: Vec<(&'a str, std::ops::Range<usize>)>,
    /// Set name -> position in `sets`, when there are many sets.
    index: FastMap<&'a str, usize>,
    /// The set found last.
    last_set: std::cell::Cell<Option<usize>>,
    /// Consumed amounts: the pool's table of values, and the texts of the first few.
    amounts: std::cell::RefCell<Amounts<'a>>,
}

/// The amounts devices of a pool consume.
#[derive(Default)]
struct Amounts<'a> {
    /// Every amount read (entries of consumption index it).
    values: Vec<Quantity>,
    /// The texts of the first [`MAX_AMOUNTS`] values, looked up by text.
    texts: Vec<&'a str>,
    /// Per flat counter, the amount its last consumer named (devices mostly repeat it).
    last: Vec<u32>,
}

impl<'a> Amounts<'a> {
    /// The index of the amount written `text`, parsed once per distinct text (the first
    /// [`MAX_AMOUNTS`] texts; later ones are parsed each time); `what` names it in errors.
    fn index_of(&mut self, text: &'a str, what: &dyn Fn() -> String) -> Result<u32, String> {
        if let Some(at) = self.texts.iter().position(|t| cel::str_eq(t, text)) {
            return Ok(at as u32);
        }
        let q = parse_q(text, what)?;
        if self.texts.len() < MAX_AMOUNTS && self.texts.len() == self.values.len() {
            self.texts.push(text);
        }
        self.values.push(q);
        Ok((self.values.len() - 1) as u32)
    }
}

/// Most counter sets looked up by comparing names; a pool with more indexes them.
const LINEAR_SETS: usize = 8;
/// Most distinct amount texts a pool remembers parsed.
const MAX_AMOUNTS: usize = 16;

impl<'a> CounterSets<'a> {
    /// Flattens the counter sets of `counter_slices`; a set name may be used once.
    fn flatten(
        counter_slices: impl Iterator<Item = &'a ResourceSlice> + Clone,
    ) -> Result<CounterSets<'a>, String> {
        let all_sets = counter_slices.flat_map(|s| s.spec.shared_counters.iter());
        let (nsets, ncounters) = all_sets
            .clone()
            .fold((0, 0), |(n, c), set| (n + 1, c + set.counters.len()));
        let mut names: Vec<(&'a str, &'a str)> = Vec::with_capacity(ncounters);
        let mut available: Vec<Quantity> = Vec::with_capacity(ncounters);
        let mut sets: Vec<(&str, std::ops::Range<usize>)> = Vec::with_capacity(nsets);
        let mut index: FastMap<&str, usize> = FastMap::default();
        // The sets' amounts start the table: devices mostly consume the same ones.
        let mut amounts = Amounts {
            last: vec![u32::MAX; ncounters],
            ..Amounts::default()
        };
        for set in all_sets {
            let name = set.name.as_str();
            let duplicate = if nsets <= LINEAR_SETS {
                sets.iter().any(|(n, _)| cel::str_eq(n, name))
            } else {
                index.insert(name, sets.len()).is_some()
            };
            if duplicate {
                return Err(format!("duplicate counter set name {}", set.name));
            }
            let start = names.len();
            for (cname, c) in &set.counters {
                names.push((name, cname.as_str()));
                let at = amounts.index_of(c.value.as_str(), &|| {
                    format!("counter {cname} in counter set {}", set.name)
                })?;
                available.push(amounts.values[at as usize]);
            }
            sets.push((name, start..names.len()));
        }
        Ok(CounterSets {
            names,
            available,
            index,
            sets,
            last_set: std::cell::Cell::new(None),
            amounts: std::cell::RefCell::new(amounts),
        })
    }

    /// What device `d` consumes (flat counter index, amount index), appended to `out`; fails
    /// on an unknown counter set or counter, or an amount that does not parse.
    fn consumption(&self, d: &'a Device, out: &mut Vec<(u32, u32)>) -> Result<(), String> {
        for cc in &d.consumes_counters {
            let set = self.set(cc.counter_set.as_str())?;
            for (k, (cname, c)) in cc.counters.iter().enumerate() {
                // Counters are listed by name in the set and in the device alike: the k-th
                // is mostly the set's k-th.
                let guess = set.start + k;
                let idx = if guess < set.end && cel::str_eq(self.names[guess].1, cname) {
                    guess
                } else {
                    set.clone()
                        .find(|&i| cel::str_eq(self.names[i].1, cname))
                        .ok_or_else(|| {
                            format!(
                                "counter {cname} not found in counter set {}",
                                cc.counter_set
                            )
                        })?
                };
                let amount = self.amount(idx, c.value.as_str(), d, cname)?;
                out.push((idx as u32, amount));
            }
        }
        Ok(())
    }

    /// The counters of set `name`; the devices of a slice mostly consume from the set the
    /// previous device named, so that one is compared first.
    fn set(&self, name: &str) -> Result<std::ops::Range<usize>, String> {
        if let Some(i) = self.last_set.get()
            && cel::str_eq(self.sets[i].0, name)
        {
            return Ok(self.sets[i].1.clone());
        }
        let found = if self.sets.len() <= LINEAR_SETS {
            self.sets.iter().position(|(n, _)| cel::str_eq(n, name))
        } else {
            self.index.get(name).copied()
        };
        let i = found.ok_or_else(|| format!("counter set {name} not found"))?;
        self.last_set.set(Some(i));
        Ok(self.sets[i].1.clone())
    }

    /// The index of an amount counter `idx` is consumed by, parsed once per distinct text
    /// (the first few texts; later ones are parsed each time).
    fn amount(&self, idx: usize, text: &'a str, d: &Device, counter: &str) -> Result<u32, String> {
        let mut amounts = self.amounts.borrow_mut();
        let last = amounts.last[idx];
        if let Some(t) = amounts.texts.get(last as usize)
            && cel::str_eq(t, text)
        {
            return Ok(last);
        }
        let at = amounts.index_of(text, &|| format!("device {} counter {counter}", d.name))?;
        amounts.last[idx] = at;
        Ok(at)
    }

    /// The value of amount `at`.
    fn value(&self, at: u32) -> Quantity {
        self.amounts.borrow().values[at as usize]
    }
}

/// The pool being prepared: its index in the view, driver and name, the allocated devices,
/// and its flattened counter sets.
struct PoolPrep<'a, 'x> {
    pi: usize,
    driver: &'a str,
    pool_name: &'a str,
    in_use: &'x InUse<'a>,
    lists: bool,
    counters: CounterSets<'a>,
}

impl<'a> PoolPrep<'a, '_> {
    /// Whether device `d` of this pool is listed as allocated.
    fn is_allocated(&self, d: &Device) -> bool {
        !self.in_use.devices.is_empty()
            && self
                .in_use
                .devices
                .contains(&(self.driver, self.pool_name, d.name.as_str()))
    }

    /// Validates the consumption of every device of the pool and subtracts what allocated
    /// devices consume. Candidates are parsed once, in [`PoolPrep::device`].
    fn subtract_allocated(
        &mut self,
        relevant: &[&'a ResourceSlice],
        others: &[&'a ResourceSlice],
    ) -> Result<(), String> {
        let mut used = Vec::new();
        let slices = relevant
            .iter()
            .map(|s| (*s, is_device_slice(s)))
            .chain(others.iter().map(|s| (*s, false)));
        for (s, candidate_slice) in slices {
            for d in &s.spec.devices {
                let is_allocated = self.is_allocated(d);
                if candidate_slice && !is_allocated {
                    continue;
                }
                used.clear();
                self.counters.consumption(d, &mut used)?;
                if is_allocated {
                    for &(idx, at) in &used {
                        let q = self.counters.value(at);
                        let available = &mut self.counters.available;
                        let idx = idx as usize;
                        available[idx] = available[idx].checked_sub(&q).ok_or_else(|| {
                            format!("counter arithmetic overflow on device {}", d.name)
                        })?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Prepares candidate device `d` of slice `s`: per-device node selection, counter
    /// consumption (appended to `consumption`). Capacities are parsed when first needed.
    fn device(
        &self,
        node: &Node,
        s: &'a ResourceSlice,
        d: &'a Device,
        consumption: &mut Vec<(u32, u32)>,
    ) -> Result<Dev<'a>, String> {
        let per_device = s.spec.per_device_node_selection.unwrap_or(false);
        let node_ok = if per_device {
            node_matches(
                node,
                d.node_name.as_deref(),
                d.all_nodes.unwrap_or(false),
                d.node_selector.as_ref(),
            )
            .map_err(Box::from)
        } else {
            Ok(true)
        };
        let start = consumption.len();
        self.counters.consumption(d, consumption)?;
        let counters = start as u32..consumption.len() as u32;
        Ok(Dev {
            pool: self.pi,
            slice: s,
            device: d,
            allocated: self.is_allocated(d),
            node_ok,
            prepared: std::cell::OnceCell::new(),
            counters,
            multi: d.allow_multiple_allocations.unwrap_or(false),
            binds_to_node: d.binds_to_node.unwrap_or(false),
            lists: self.lists,
            consumed_before: if self.in_use.consumed.is_empty() {
                Box::default()
            } else {
                self.in_use
                    .consumed
                    .get(&(self.driver, self.pool_name, d.name.as_str()))
                    .map(|c| c.as_slice().into())
                    .unwrap_or_default()
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice(names: &[String]) -> ResourceSlice {
        let mut s = ResourceSlice::default();
        s.spec.devices = names
            .iter()
            .map(|n| Device {
                name: n.clone(),
                ..Default::default()
            })
            .collect();
        s
    }

    /// A selector reads an attribute or capacity from the slice exactly as from the whole
    /// `device` variable: bare names in the driver's domain, qualified names, a name given
    /// both ways (the first by name wins), names with more than one `/`, missing names.
    #[test]
    fn device_entries_read_from_the_slice_equal_the_built_variable() {
        use crate::api::{DeviceCapacity, RawQuantity};
        let attr = |f: &dyn Fn(&mut DeviceAttribute)| {
            let mut a = DeviceAttribute::default();
            f(&mut a);
            a
        };
        let mut device = Device {
            name: "gpu-0".into(),
            ..Default::default()
        };
        let attrs = [
            ("model", attr(&|a| a.string = Some("bare".into()))),
            (
                "gpu.example.com/model",
                attr(&|a| a.string = Some("qualified".into())),
            ),
            ("gpu.example.com/numa", attr(&|a| a.int = Some(1))),
            ("zeta", attr(&|a| a.bool = Some(true))),
            ("other.org/zeta", attr(&|a| a.int = Some(7))),
            ("a/b/c", attr(&|a| a.version = Some("1.2.3".into()))),
            ("gpu.example.com.x/model", attr(&|a| a.int = Some(9))),
        ];
        for (k, v) in attrs {
            device.attributes.insert(k.to_string(), v);
        }
        for (k, v) in [("memory", "80Gi"), ("other.org/memory", "1Gi")] {
            device.capacity.insert(
                k.to_string(),
                DeviceCapacity {
                    value: RawQuantity::from(v),
                    ..Default::default()
                },
            );
        }
        let driver = "gpu.example.com";
        let caps = parse_caps(&device);
        let built = cel::with_interner(|i| device_context(&device, driver, &caps.list, false, i))
            .expect("device variable");
        let dev = Dev {
            pool: 0,
            slice: Box::leak(Box::new({
                let mut s = ResourceSlice::default();
                s.spec.driver = driver.to_string();
                s
            })),
            device: &device,
            allocated: false,
            node_ok: Ok(true),
            prepared: std::cell::OnceCell::new(),
            counters: 0..0,
            multi: false,
            binds_to_node: false,
            consumed_before: Box::default(),
            lists: false,
        };
        assert_eq!(dev.readable(), &Ok(()));
        let driver_value = Value::String(driver.into());
        let vars = DevVars {
            dev: &dev,
            driver: &driver_value,
        };
        let lookups = [
            (false, driver, "model"),
            (false, driver, "numa"),
            (false, driver, "zeta"),
            (false, "other.org", "zeta"),
            (false, "a", "b/c"),
            (false, "a/b", "c"),
            (false, driver, "missing"),
            (false, "gpu.example.com.x", "model"),
            (true, driver, "memory"),
            (true, "other.org", "memory"),
            (true, "other.org", "missing"),
        ];
        for (capacity, domain, id) in lookups {
            let lazy = cel::DeviceVars::entry(&vars, capacity, domain, id);
            let whole = built.entry(capacity, domain, id);
            match (&lazy, whole) {
                (Some(a), Some(b)) => assert!(a.equals(b), "{domain}/{id}: {a:?} vs {b:?}"),
                (None, None) => {}
                _ => panic!("{domain}/{id}: {lazy:?} vs {whole:?}"),
            }
        }
    }

    /// Duplicate names across a pool's slices are found whether the pool has few devices
    /// (compared pairwise) or many (hashed).
    #[test]
    fn duplicate_device_names_are_found_in_small_and_large_pools() {
        for n in [3, 16, 17, 200] {
            let names: Vec<String> = (0..n).map(|i| format!("gpu-{i}")).collect();
            let (a, b) = names.split_at(n / 2);
            let (a, b) = (slice(a), slice(b));
            assert_eq!(
                check_device_names([&a, &b].into_iter()),
                Ok(()),
                "{n} devices"
            );
            let again = slice(&names[n - 1..]);
            assert_eq!(
                check_device_names([&a, &b, &again].into_iter()),
                Err(format!("duplicate device name gpu-{}", n - 1)),
                "{n} devices"
            );
        }
    }
}
