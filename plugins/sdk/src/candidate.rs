//! One candidate device as a policy reads it: [`Candidate`] (name, driver, pool, health, NUMA
//! node, attributes, capacities), the [`CounterSet`]s it draws from and its [`Capacity`]s.

use crate::key::{ANY_DRIVER, Key};
use crate::message::{
    ATTRIBUTE, CANDIDATE, CAPACITY, COUNTER, COUNTER_SET, Message, TAG_BOOL, TAG_INT, TAG_STRING,
    text,
};
use crate::value::Value;

/// The little-endian `u32` at `at` of a record (`at` is a constant: no bounds check).
#[inline(always)]
fn le32<const N: usize>(record: &[u8; N], at: usize) -> u32 {
    u32::from_le_bytes([record[at], record[at + 1], record[at + 2], record[at + 3]])
}

/// The little-endian `i64` at `at` of a record.
#[inline(always)]
fn le64<const N: usize>(record: &[u8; N], at: usize) -> i64 {
    (u64::from(le32(record, at)) | u64::from(le32(record, at + 4)) << 32) as i64
}

/// Device health as the host knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    /// Not known.
    Unknown,
    /// Healthy.
    Healthy,
    /// Unhealthy.
    Unhealthy,
}

/// A capacity of a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity<'a> {
    /// The qualified name.
    pub name: &'a str,
    /// Kubernetes' `Value()`: rounded away from zero, saturated.
    pub value: i64,
    /// The quantity as written (`"80Gi"`).
    pub text: &'a str,
}

/// A shared counter set (a partitionable device's parent) a candidate draws from.
#[derive(Debug, Clone, Copy)]
pub struct CounterSet<'a> {
    message: Message<'a>,
    /// Where its record starts in the message.
    record: usize,
}

impl<'a> CounterSet<'a> {
    /// The counter set name, unique in the pool.
    pub fn name(&self) -> &'a str {
        text(self.message.name(self.message.u32(self.record)))
    }

    /// How many already-allocated devices draw from the same set.
    pub fn in_use(&self) -> u32 {
        self.message.u32(self.record + 4)
    }

    /// The counters the candidate consumes from this set: name and `Value()`.
    pub fn counters(&self) -> impl Iterator<Item = (&'a str, i64)> + use<'a> {
        let message = self.message;
        let (off, n) = (
            message.usize(self.record + 8),
            message.usize(self.record + 12),
        );
        (0..n).map(move |i| {
            let at = off + i * COUNTER;
            (text(message.name(message.u32(at))), message.i64(at + 8))
        })
    }

    /// The sum of the counters consumed (useful when a set has one counter, e.g. memory).
    pub fn total(&self) -> i128 {
        let message = self.message;
        let (off, n) = (
            message.usize(self.record + 8),
            message.usize(self.record + 12),
        );
        (0..n)
            .map(|i| i128::from(message.i64(off + i * COUNTER + 8)))
            .sum()
    }
}

/// One candidate device.
#[derive(Debug, Clone, Copy)]
pub struct Candidate<'a> {
    pub(crate) message: Message<'a>,
    /// Where its record starts in the message.
    pub(crate) record: usize,
    pub(crate) index: u32,
}

impl<'a> Candidate<'a> {
    /// Position in the input (what a `Decision` refers to).
    pub fn index(&self) -> u32 {
        self.index
    }

    /// Device name.
    pub fn name(&self) -> &'a str {
        self.message.str(self.record)
    }

    /// The name id of its driver.
    #[inline(always)]
    pub(crate) fn driver_id(&self) -> u32 {
        self.message.u32(self.record + 8)
    }

    /// Driver name.
    pub fn driver(&self) -> &'a str {
        text(self.message.name(self.driver_id()))
    }

    /// Pool name.
    pub fn pool(&self) -> &'a str {
        text(self.message.name(self.message.u32(self.record + 12)))
    }

    /// True when the device is already allocated (the allocator will skip it).
    pub fn in_use(&self) -> bool {
        self.message.data[self.record + 16] & 1 != 0
    }

    /// Health.
    pub fn health(&self) -> Health {
        match self.message.data[self.record + 17] {
            1 => Health::Healthy,
            2 => Health::Unhealthy,
            _ => Health::Unknown,
        }
    }

    /// Free to allocate: not in use and not unhealthy.
    pub fn is_free(&self) -> bool {
        !self.in_use() && self.health() != Health::Unhealthy
    }

    /// NUMA node, when known.
    pub fn numa_node(&self) -> Option<i64> {
        (self.message.data[self.record + 16] & 2 != 0).then(|| self.message.i64(self.record + 24))
    }

    /// The value of attribute record `a`.
    #[inline(always)]
    fn value(&self, a: &[u8; ATTRIBUTE]) -> Value<'a> {
        match a[4] {
            TAG_INT => Value::Int(le64(a, 8)),
            TAG_BOOL => Value::Bool(a[8] != 0),
            TAG_STRING => Value::String(self.message.span(le32(a, 8), le32(a, 12))),
            _ => Value::Version(self.message.span(le32(a, 8), le32(a, 12))),
        }
    }

    /// The candidate's record, bounds-checked once.
    #[inline(always)]
    fn record(&self) -> &'a [u8; CANDIDATE] {
        let Some(rec) = self.message.data[self.record..].first_chunk::<CANDIDATE>() else {
            panic!("a candidate record lies outside the message");
        };
        rec
    }

    /// The candidate's attribute records.
    #[inline(always)]
    fn attribute_records(&self) -> &'a [[u8; ATTRIBUTE]] {
        let rec = self.record();
        let (off, n) = (le32(rec, 32) as usize, le32(rec, 36) as usize);
        self.message.data[off..off + n * ATTRIBUTE]
            .as_chunks::<ATTRIBUTE>()
            .0
    }

    /// The record named `id` in the section whose `(offset, count)` is at `at`, records of
    /// `size` bytes starting with their name.
    #[inline(always)]
    fn find(&self, at: usize, size: usize, id: u32) -> Option<usize> {
        let (off, n) = (self.message.usize(at), self.message.usize(at + 4));
        (0..n)
            .map(|i| off + i * size)
            .find(|&r| self.message.u32(r) == id)
    }

    /// The attribute named by `key`.
    #[inline(always)]
    pub fn get(&self, key: &Key) -> Option<Value<'a>> {
        // The candidate record and its attribute records are each bounds-checked once, then
        // read as fixed-size arrays: this runs once per candidate in most policies.
        let id = key.id_for(le32(self.record(), 8))?;
        let a = self.attribute_records().iter().find(|a| le32(a, 0) == id)?;
        Some(self.value(a))
    }

    /// Every attribute: qualified name and value.
    pub fn attributes(&self) -> impl Iterator<Item = (&'a str, Value<'a>)> + use<'a> {
        let this = *self;
        self.attribute_records()
            .iter()
            .map(move |a| (text(this.message.name(le32(a, 0))), this.value(a)))
    }

    /// The attribute `name`: qualified (`domain/id`) or bare (the driver's domain). Resolves
    /// the name on every call; use `Input::key` and [`Candidate::get`] in loops.
    pub fn attribute(&self, name: &str) -> Option<Value<'a>> {
        self.get(&self.key(name))
    }

    fn key(&self, name: &str) -> Key {
        let name = name.as_bytes();
        let id = if name.contains(&b'/') {
            self.message.find(name)
        } else {
            self.message
                .find_qualified(self.message.name(self.driver_id()), name)
        };
        Key {
            ids: id.map(|id| (ANY_DRIVER, id)).into_iter().collect(),
        }
    }

    /// An integer attribute.
    pub fn int(&self, name: &str) -> Option<i64> {
        match self.attribute(name)? {
            Value::Int(i) => Some(i),
            _ => None,
        }
    }

    /// A string attribute.
    pub fn string(&self, name: &str) -> Option<&'a str> {
        match self.attribute(name)? {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// A boolean attribute.
    pub fn bool(&self, name: &str) -> Option<bool> {
        match self.attribute(name)? {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    fn capacity_at(&self, at: usize) -> Capacity<'a> {
        Capacity {
            name: text(self.message.name(self.message.u32(at))),
            value: self.message.i64(at + 8),
            text: self.message.str(at + 16),
        }
    }

    /// Every capacity.
    pub fn capacities(&self) -> impl Iterator<Item = Capacity<'a>> + use<'a> {
        let this = *self;
        let (off, n) = (
            this.message.usize(this.record + 40),
            this.message.usize(this.record + 44),
        );
        (0..n).map(move |i| this.capacity_at(off + i * CAPACITY))
    }

    /// The capacity named by `key`.
    pub fn capacity_of(&self, key: &Key) -> Option<Capacity<'a>> {
        let id = key.id_for(self.driver_id())?;
        let at = self.find(self.record + 40, CAPACITY, id)?;
        Some(self.capacity_at(at))
    }

    /// The capacity `name` (qualified or bare, as for attributes).
    pub fn capacity(&self, name: &str) -> Option<Capacity<'a>> {
        self.capacity_of(&self.key(name))
    }

    /// The shared counter sets the device draws from.
    pub fn counter_sets(&self) -> impl ExactSizeIterator<Item = CounterSet<'a>> + use<'a> {
        let message = self.message;
        let (off, n) = (
            message.usize(self.record + 48),
            message.usize(self.record + 52),
        );
        (0..n).map(move |i| CounterSet {
            message,
            record: off + i * COUNTER_SET,
        })
    }
}
