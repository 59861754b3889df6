//! What one node sees: its pools (complete, incomplete or invalid), in allocation order, and
//! the devices it may allocate, prepared once (typed attributes, the CEL `device` variable,
//! parsed quantities, counter indices) and cached per node by the allocator.
//!
//! This module holds the view itself and its per-node caches (selector results, constraint
//! attributes); building it is [`gather`] (the pools the node sees) and [`pool`] (each usable
//! pool's devices, with [`counters`]); a device is [`device`], and its CEL `device` variable
//! [`device_vars`].

use std::sync::Arc;

use kubedev_core::Quantity;

use crate::cel::{self, FastMap, FastSet, Value};

mod attribute_value;
mod counters;
mod device;
mod device_vars;
mod gather;
mod pool;
#[cfg(test)]
mod tests;

pub(crate) use device::{AttrKey, CapacityPolicy, NodeDevice, exact_milli};
pub(crate) use device_vars::LazyDeviceVars;
pub(crate) use gather::build_node_view;

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

/// Everything the node sees.
#[derive(Debug)]
pub(crate) struct NodeView<'a> {
    pub(crate) pools: Vec<PoolView<'a>>,
    pub(crate) devices: Vec<NodeDevice<'a>>,
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
    attr_values: Vec<std::cell::Cell<AttrLookup<'a>>>,
    /// Qualified attribute names by slot.
    attr_names: Vec<String>,
    /// `DRAListTypeAttributes` is on: constraints compare attributes as sets.
    pub(crate) list_attributes: bool,
}

/// Most programs a view finds by comparing them one by one.
const PROGRAMS_LINEAR: usize = 16;

/// A constraint attribute of one device: not looked up yet, or its value if any.
#[derive(Clone, Copy, Debug)]
enum AttrLookup<'a> {
    Pending,
    Done(Option<AttrKey<'a>>),
}

impl<'a> NodeView<'a> {
    /// A view of `pools` with room for `devices` devices, and empty caches.
    fn with_capacity(pools: usize, devices: usize, list_attributes: bool) -> Self {
        NodeView {
            pools: Vec::with_capacity(pools),
            devices: Vec::with_capacity(devices),
            consumption: Vec::new(),
            selector_cache: Vec::new(),
            programs: Vec::new(),
            program_index: FastMap::default(),
            attr_values: Vec::new(),
            attr_names: Vec::new(),
            list_attributes,
        }
    }

    /// What device `dev` consumes: index into its pool's flat counters, amount.
    pub(crate) fn counters(
        &self,
        dev: &NodeDevice<'_>,
    ) -> impl Iterator<Item = (usize, &Quantity)> + Clone + '_ {
        let amounts = &self.pools[dev.pool].amounts;
        self.consumption[dev.consumption.start as usize..dev.consumption.end as usize]
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
            std::cell::Cell::new(AttrLookup::Pending),
            self.devices.len(),
        ));
        self.attr_names.push(qualified.to_string());
        self.attr_names.len() - 1
    }

    /// Device `d`'s value of the attribute in `slot`, looked up once.
    pub(crate) fn attr(&self, slot: usize, d: usize) -> Option<AttrKey<'a>> {
        let cell = &self.attr_values[slot * self.devices.len() + d];
        match cell.get() {
            AttrLookup::Done(v) => v,
            AttrLookup::Pending => {
                let v = self.devices[d].constraint_attr(&self.attr_names[slot], d);
                cell.set(AttrLookup::Done(v));
                v
            }
        }
    }

    /// The program of `expression` and its slot, when this view has results of it already
    /// and few programs (a repeated allocation on the node then skips the compile cache).
    pub(crate) fn known_program(&self, expression: &str) -> Option<(usize, Arc<cel::Program>)> {
        if self.programs.len() > PROGRAMS_LINEAR {
            return None;
        }
        self.programs
            .iter()
            .position(|p| p.expression() == expression)
            .map(|slot| (slot, self.programs[slot].clone()))
    }

    /// The slot of a program's cached results, added on first use.
    pub(crate) fn program_slot(&mut self, program: &Arc<cel::Program>) -> usize {
        const LINEAR: usize = PROGRAMS_LINEAR;
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

    /// The CEL `device` variable of device `d` (which must be [`NodeDevice::readable`]).
    pub(crate) fn device_vars(&self, d: usize) -> LazyDeviceVars<'_, 'a> {
        let dev = &self.devices[d];
        LazyDeviceVars::new(dev, &self.pools[dev.pool].driver_value)
    }

    /// The cached result of the program in `slot` on device `d`.
    pub(crate) fn selector_result(&self, slot: usize, d: usize) -> &std::cell::Cell<u8> {
        &self.selector_cache[slot * self.devices.len() + d]
    }
}
