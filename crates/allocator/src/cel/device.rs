//! The `device` variable: [`DeviceContext`], built once per device, and [`DeviceVars`], what
//! an evaluation reads of any device.

use std::sync::{Arc, OnceLock};

use super::interner::Interner;
use super::numeric::Quantity;
use super::value::{MapValue, Value};
use kubedev_core::AttributeValue;

/// The `device` variable of one device, built once and reused for every evaluation.
///
/// Attribute and capacity entries are kept flat; the nested `domain -> id -> value` maps are
/// only built when an expression uses them as maps (iteration, `in`, `size`), since direct
/// lookups (`device.attributes["domain"].id`) read the flat entries.
#[derive(Debug)]
pub struct DeviceContext {
    driver: Value,
    attribute_entries: Vec<(Arc<str>, Arc<str>, Value)>,
    capacity_entries: Vec<(Arc<str>, Arc<str>, Value)>,
    allow_multiple: bool,
    attributes: OnceLock<Value>,
    capacity: OnceLock<Value>,
}

/// The nested `domain -> id -> value` map of flat entries (the first of a repeated id wins);
/// a missing domain reads as an empty map.
fn materialize(entries: &[(Arc<str>, Arc<str>, Value)]) -> Value {
    let mut domains: Vec<(Arc<str>, MapValue)> = Vec::new();
    for (domain, id, value) in entries {
        let pos = match domains.iter().position(|(d, _)| d == domain) {
            Some(p) => p,
            None => {
                domains.push((domain.clone(), MapValue::default()));
                domains.len() - 1
            }
        };
        let inner = &mut domains[pos].1;
        if inner.get_str(id).is_none() {
            inner
                .entries
                .push((Value::String(id.clone()), value.clone()));
        }
    }
    Value::Map(Arc::new(MapValue {
        entries: domains
            .into_iter()
            .map(|(d, m)| (Value::String(d), Value::Map(Arc::new(m))))
            .collect(),
        missing_is_empty: true,
    }))
}

impl DeviceContext {
    /// Builds the `device` variable from typed attributes and capacities (names as in the
    /// ResourceSlice: bare or `domain/id`).
    pub fn new(
        driver: &str,
        attributes: impl IntoIterator<Item = (String, AttributeValue)>,
        capacity: impl IntoIterator<Item = (String, Quantity)>,
        allow_multiple_allocations: bool,
    ) -> DeviceContext {
        let mut interner = Interner::default();
        let mut ctx =
            DeviceContext::empty(&mut interner, driver, allow_multiple_allocations, (0, 0));
        for (name, a) in attributes {
            let value = match a {
                AttributeValue::Int(i) => Value::Int(i),
                AttributeValue::Bool(b) => Value::Bool(b),
                AttributeValue::String(s) => Value::String(interner.str(&s)),
                AttributeValue::Version(v) => Value::Semver(Arc::new(v)),
                // Future attribute types are not visible to selectors.
                _ => Value::Null,
            };
            ctx.push_attribute(&mut interner, driver, &name, value);
        }
        for (name, q) in capacity {
            ctx.push_capacity(&mut interner, driver, &name, q);
        }
        ctx
    }

    /// A context without attributes and capacities, with room for as many as given.
    pub(crate) fn empty(
        interner: &mut Interner,
        driver: &str,
        allow_multiple: bool,
        room: (usize, usize),
    ) -> DeviceContext {
        DeviceContext {
            driver: Value::String(interner.str(driver)),
            attribute_entries: Vec::with_capacity(room.0),
            capacity_entries: Vec::with_capacity(room.1),
            allow_multiple,
            attributes: OnceLock::new(),
            capacity: OnceLock::new(),
        }
    }

    pub(crate) fn push_attribute(
        &mut self,
        interner: &mut Interner,
        driver: &str,
        name: &str,
        value: Value,
    ) {
        let (domain, id) = interner.name(name, driver);
        self.attribute_entries.push((domain, id, value));
    }

    pub(crate) fn push_capacity(
        &mut self,
        interner: &mut Interner,
        driver: &str,
        name: &str,
        q: Quantity,
    ) {
        let (domain, id) = interner.name(name, driver);
        let value = interner.quantity(q);
        self.capacity_entries.push((domain, id, value));
    }

    pub(crate) fn attributes(&self) -> &Value {
        self.attributes
            .get_or_init(|| materialize(&self.attribute_entries))
    }

    pub(crate) fn capacity(&self) -> &Value {
        self.capacity
            .get_or_init(|| materialize(&self.capacity_entries))
    }

    /// `device.attributes[domain][id]` (or capacity) without building maps; `None` when the
    /// id is missing.
    pub(crate) fn entry(&self, capacity: bool, domain: &str, id: &str) -> Option<&Value> {
        let list = if capacity {
            &self.capacity_entries
        } else {
            &self.attribute_entries
        };
        list.iter()
            .find(|(d, i, _)| &**d == domain && &**i == id)
            .map(|(_, _, v)| v)
    }
}

/// What an evaluation reads of the `device` variable: a [`DeviceContext`] built up front, or
/// a device read from its slice as the expression asks.
pub(crate) trait DeviceVars {
    /// `device.driver`.
    fn driver(&self) -> Value;
    /// `device.allowMultipleAllocations`.
    fn allow_multiple(&self) -> bool;
    /// Whether `device.driver` is `name`.
    fn driver_is(&self, name: &str) -> bool {
        matches!(self.driver(), Value::String(s) if *s == *name)
    }
    /// `device.attributes` as a map of maps.
    fn attributes(&self) -> Value;
    /// `device.capacity` as a map of maps.
    fn capacity(&self) -> Value;
    /// `device.attributes[domain][id]` (or capacity) without building maps; `None` when the
    /// id is missing.
    fn entry(&self, capacity: bool, domain: &str, id: &str) -> Option<Value>;
    /// [`DeviceVars::entry`], with a string borrowed rather than made a value (selectors
    /// mostly compare string attributes with literals).
    fn entry_ref(&self, capacity: bool, domain: &str, id: &str) -> Option<EntryRef<'_>> {
        self.entry(capacity, domain, id).map(EntryRef::Value)
    }
}

/// A device entry as [`DeviceVars::entry_ref`] reads it.
pub(crate) enum EntryRef<'x> {
    Str(&'x str),
    /// A capacity, read without making it a value.
    Quantity(super::numeric::Quantity),
    Value(Value),
}

impl DeviceVars for DeviceContext {
    fn driver(&self) -> Value {
        self.driver.clone()
    }

    fn allow_multiple(&self) -> bool {
        self.allow_multiple
    }

    fn attributes(&self) -> Value {
        DeviceContext::attributes(self).clone()
    }

    fn capacity(&self) -> Value {
        DeviceContext::capacity(self).clone()
    }

    fn entry(&self, capacity: bool, domain: &str, id: &str) -> Option<Value> {
        DeviceContext::entry(self, capacity, domain, id).cloned()
    }

    fn entry_ref(&self, capacity: bool, domain: &str, id: &str) -> Option<EntryRef<'_>> {
        DeviceContext::entry(self, capacity, domain, id).map(|v| match v {
            Value::String(s) => EntryRef::Str(s),
            other => EntryRef::Value(other.clone()),
        })
    }
}
