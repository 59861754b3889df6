//! The CEL `device` variable of a node's device: attribute values converted as the scheduler
//! converts them, read from the slice one entry at a time as an expression asks, or built
//! whole when an expression reads attributes or capacities as maps.

use super::attribute_value::attribute_value;
use super::device::{Capacity, NodeDevice};
use crate::api::Device;
use crate::cel::numeric::Quantity;
use crate::cel::{self, DeviceContext, Interner, Value};

/// The CEL `device` variable of one device, read from its slice as an expression asks:
/// a selector that reads a few attributes converts only those.
pub(crate) struct LazyDeviceVars<'d, 'a> {
    dev: &'d NodeDevice<'a>,
    driver: &'d Value,
}

impl<'d, 'a> LazyDeviceVars<'d, 'a> {
    /// The variable of `dev`, whose pool's driver is `driver`.
    #[inline]
    pub(super) fn new(dev: &'d NodeDevice<'a>, driver: &'d Value) -> Self {
        LazyDeviceVars { dev, driver }
    }

    /// The capacity `domain`/`id` (bare names are the driver's).
    fn capacity_entry(&self, domain: &str, id: &str) -> Option<Quantity> {
        let dev = self.dev;
        dev.capacity()
            .iter()
            .find(|c| cel::split_qualified(c.key, dev.driver()) == (domain, id))
            .map(|c| c.value)
    }

    /// The whole variable, built on first use.
    fn full(&self) -> &DeviceContext {
        let dev = self.dev;
        dev.details().full.get_or_init(|| {
            let capacities = dev.parsed_capacities();
            Box::new(
                cel::with_interner(|interner| {
                    device_context(dev.device, dev.driver(), &capacities.list, interner)
                })
                .unwrap_or_else(|_| {
                    // Not readable: selectors are not evaluated on such a device.
                    DeviceContext::new(dev.driver(), [], [], false)
                }),
            )
        })
    }
}

impl cel::DeviceVars for LazyDeviceVars<'_, '_> {
    fn driver(&self) -> Value {
        self.driver.clone()
    }

    fn allow_multiple(&self) -> bool {
        self.dev.allows_multiple
    }

    fn driver_is(&self, name: &str) -> bool {
        cel::str_eq(self.dev.driver(), name)
    }

    fn attributes(&self) -> Value {
        self.full().attributes().clone()
    }

    fn capacity(&self) -> Value {
        self.full().capacity().clone()
    }

    fn entry(&self, capacity: bool, domain: &str, id: &str) -> Option<Value> {
        if capacity {
            let q = self.capacity_entry(domain, id)?;
            return Some(cel::with_interner(|interner| interner.quantity(q)));
        }
        let (name, a) = self.dev.attribute(domain, id)?;
        cel::with_interner(|interner| attribute_value(name, a, interner).ok())
    }

    fn entry_ref(&self, capacity: bool, domain: &str, id: &str) -> Option<cel::EntryRef<'_>> {
        if capacity {
            return self.capacity_entry(domain, id).map(cel::EntryRef::Quantity);
        }
        if let Some((_, a)) = self.dev.attribute(domain, id)
            && a.int.is_none()
            && a.bool.is_none()
            && let Some(s) = &a.string
        {
            return Some(cel::EntryRef::Str(s));
        }
        self.entry(capacity, domain, id).map(cel::EntryRef::Value)
    }
}

/// Builds the `device` variable as the scheduler does: the first set field of each attribute
/// (int, bool, string, version); none set or an invalid version is an error for every
/// selector evaluated on the device.
pub(super) fn device_context(
    dev: &Device,
    driver: &str,
    capacities: &[Capacity<'_>],
    interner: &mut Interner,
) -> Result<DeviceContext, String> {
    let mut ctx = DeviceContext::empty(
        interner,
        driver,
        dev.allow_multiple_allocations.unwrap_or(false),
        (dev.attributes.len(), capacities.len()),
    );
    for (name, a) in &dev.attributes {
        let v = attribute_value(name, a, interner)?;
        ctx.push_attribute(interner, driver, name, v);
    }
    for c in capacities {
        ctx.push_capacity(interner, driver, c.key, c.value);
    }
    Ok(ctx)
}
