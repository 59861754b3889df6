//! The per-thread interner that device contexts share: names split into domain and id,
//! strings, versions and quantities, each built once.

use std::sync::Arc;

use super::Value;
use super::hashing::FastMap;
use super::numeric::{Quantity, Version};

/// A name split for a driver: (driver, domain, id).
type SplitName = (Arc<str>, Arc<str>, Arc<str>);

/// Most entries one interner map keeps; past it values are built without sharing, so a
/// stream of distinct names cannot grow a thread's interner without bound.
pub(super) const MAX_INTERNED: usize = 1 << 16;

thread_local! {
    static SHARED: std::cell::RefCell<Interner> = std::cell::RefCell::new(Interner::default());
}

/// Runs `f` with this thread's interner, which device contexts of every allocator on the
/// thread share (the names and values of a cluster's devices repeat across nodes and pods).
pub(crate) fn with_interner<R>(f: impl FnOnce(&mut Interner) -> R) -> R {
    SHARED.with(|shared| match shared.try_borrow_mut() {
        Ok(mut interner) => f(&mut interner),
        Err(_) => f(&mut Interner::default()),
    })
}

/// Shares the strings and values of device contexts (names, domains, string values,
/// versions and quantities repeat across the devices of a node and of a cluster).
#[derive(Debug, Default)]
pub(crate) struct Interner {
    pub(super) strings: FastMap<Box<str>, Arc<str>>,
    /// Name -> (driver it was split for, domain, id).
    pub(super) names: FastMap<Box<str>, SplitName>,
    versions: FastMap<Box<str>, Value>,
    quantities: FastMap<Quantity, Value>,
}

impl Interner {
    /// Domain and id of an attribute or capacity name (bare names belong to `driver`).
    pub(crate) fn name(&mut self, name: &str, driver: &str) -> (Arc<str>, Arc<str>) {
        if let Some((d, domain, id)) = self.names.get(name)
            && (name.contains('/') || &**d == driver)
        {
            return (domain.clone(), id.clone());
        }
        let (domain, id) = split_qualified(name, driver);
        let entry = (self.str(driver), self.str(domain), self.str(id));
        let pair = (entry.1.clone(), entry.2.clone());
        if self.names.len() < MAX_INTERNED {
            self.names.insert(Box::from(name), entry);
        }
        pair
    }

    pub(crate) fn str(&mut self, s: &str) -> Arc<str> {
        if let Some(a) = self.strings.get(s) {
            return a.clone();
        }
        let a: Arc<str> = Arc::from(s);
        if self.strings.len() < MAX_INTERNED {
            self.strings.insert(Box::from(s), a.clone());
        }
        a
    }

    pub(crate) fn version(&mut self, text: &str) -> Result<Value, String> {
        if let Some(v) = self.versions.get(text) {
            return Ok(v.clone());
        }
        let v = Value::Semver(Arc::new(
            Version::parse(text).map_err(|e| kubedev_core::echo::chain(&e))?,
        ));
        if self.versions.len() < MAX_INTERNED {
            self.versions.insert(Box::from(text), v.clone());
        }
        Ok(v)
    }

    pub(crate) fn quantity(&mut self, q: Quantity) -> Value {
        if let Some(v) = self.quantities.get(&q) {
            return v.clone();
        }
        let v = Value::Quantity(Arc::new(q));
        if self.quantities.len() < MAX_INTERNED {
            self.quantities.insert(q, v.clone());
        }
        v
    }
}

/// Splits a qualified name into domain and id; bare names get the driver as domain.
pub fn split_qualified<'a>(name: &'a str, driver: &'a str) -> (&'a str, &'a str) {
    match name.find('/') {
        Some(i) => (&name[..i], &name[i + 1..]),
        None => (driver, name),
    }
}
