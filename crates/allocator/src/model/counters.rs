//! The counter sets of a pool, flattened for the search: `(set, counter)` names, what is
//! available of each, and the amounts devices consume, each distinct text parsed once.

use kubedev_core::Quantity;

use super::device::parse_quantity;
use crate::api::{Device, ResourceSlice};
use crate::cel::{self, FastMap};

/// The counter sets of a pool, flattened: `(set, counter)` names, what is available of each,
/// and per set the range of its counters in the flat lists; and the amounts devices consume,
/// each distinct text parsed once.
pub(super) struct CounterSets<'a> {
    pub(super) names: Vec<(&'a str, &'a str)>,
    pub(super) available: Vec<Quantity>,
    /// Each set: its name, and its counters' flat indices.
    pub(super) sets: Vec<(&'a str, std::ops::Range<usize>)>,
    /// Set name -> position in `sets`, when there are many sets.
    index: FastMap<&'a str, usize>,
    /// The set found last.
    last_set: std::cell::Cell<Option<usize>>,
    /// Consumed amounts: the pool's table of values, and the texts of the first few.
    pub(super) amounts: std::cell::RefCell<Amounts<'a>>,
}

/// The amounts devices of a pool consume.
#[derive(Default)]
pub(super) struct Amounts<'a> {
    /// Every amount read (entries of consumption index it).
    pub(super) values: Vec<Quantity>,
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
        let q = parse_quantity(text, what)?;
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
    pub(super) fn flatten(
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
    #[inline]
    pub(super) fn consumption(
        &self,
        d: &'a Device,
        out: &mut Vec<(u32, u32)>,
    ) -> Result<(), String> {
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
    #[inline]
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
    #[inline]
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
    #[inline]
    pub(super) fn value(&self, at: u32) -> Quantity {
        self.amounts.borrow().values[at as usize]
    }
}
