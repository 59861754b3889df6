//! The input message (ABI version 1): fixed-size records a guest reads in place, names
//! interned in a table, strings in their own region. The layout is documented in the crate
//! docs; this is its only host-side implementation.

mod names;
mod quantity;

use kubedev_allocator::api;
use kubedev_core::{AttributeValue, HealthState};

use crate::abi::{ABI_VERSION, INPUT_MAGIC};
use crate::input::{Candidate, ConstraintKind, CounterUsage, DeviceData, PolicyInput};
use crate::inputs::Inputs;
use names::{LastBytes, M_ATTR, M_CAP, M_COUNTER, MAX_MEMO, NOT_SENT, Names, PLAIN};
use quantity::{Quantities, saturated_value};

pub(crate) const HEADER: usize = 64;
pub(crate) const CANDIDATE: usize = 64;
pub(crate) const CONSTRAINT: usize = 8;
pub(crate) const ATTRIBUTE: usize = 16;
pub(crate) const CAPACITY: usize = 24;
pub(crate) const COUNTER_SET: usize = 16;
pub(crate) const COUNTER: usize = 16;
pub(crate) const NAME: usize = 8;

const TAG_INT: u8 = 0;
const TAG_BOOL: u8 = 1;
const TAG_STRING: u8 = 2;
const TAG_VERSION: u8 = 3;

/// An encoded input message: records (header first), then strings. Its buffers are reused
/// from call to call.
#[derive(Debug, Default)]
pub(crate) struct Message {
    pub(crate) records: Vec<u8>,
    pub(crate) strings: Vec<u8>,
    names: Names,
    last_bytes: LastBytes,
}

impl Message {
    pub(crate) fn len(&self) -> usize {
        self.records.len() + self.strings.len()
    }
}

fn put_u32(buf: &mut [u8], at: usize, v: u32) {
    buf[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_i64(buf: &mut [u8], at: usize, v: i64) {
    buf[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn n32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Appends `s` to the strings region; returns its span.
fn push_str(strings: &mut Vec<u8>, s: &str) -> (u32, u32) {
    let off = n32(strings.len());
    strings.extend_from_slice(s.as_bytes());
    (off, n32(s.len()))
}

fn span_text(strings: &[u8], (off, len): (u32, u32)) -> &[u8] {
    &strings[off as usize..(off + len) as usize]
}

/// Byte equality for short names without a call into `memcmp`: eight bytes at a time, the
/// last word overlapping.
#[inline]
fn same(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    let w8 = |s: &[u8], at: usize| u64::from_ne_bytes(s[at..at + 8].try_into().unwrap_or_default());
    let w4 = |s: &[u8], at: usize| u32::from_ne_bytes(s[at..at + 4].try_into().unwrap_or_default());
    if n >= 8 {
        let mut at = 0;
        while at + 8 < n {
            if w8(a, at) != w8(b, at) {
                return false;
            }
            at += 8;
        }
        w8(a, n - 8) == w8(b, n - 8)
    } else if n >= 4 {
        w4(a, 0) == w4(b, 0) && w4(a, n - 4) == w4(b, n - 4)
    } else {
        a.iter().zip(b).all(|(x, y)| x == y)
    }
}

fn health_byte(h: HealthState) -> u8 {
    match h {
        HealthState::Healthy => 1,
        HealthState::Unhealthy => 2,
        _ => 0,
    }
}

/// A typed value before encoding.
enum Val<'v> {
    Int(i64),
    Bool(bool),
    Str(u8, &'v str),
}

struct Encoder<'m, 'a> {
    records: &'m mut Vec<u8>,
    strings: &'m mut Vec<u8>,
    names: &'m mut Names,
    quantities: Quantities<'a>,
    usage: Option<&'a CounterUsage>,
    inputs: &'m Inputs,
    last_bytes: &'m LastBytes,
}

impl<'a> Encoder<'_, 'a> {
    fn span_at(&mut self, at: usize, s: &str) {
        let (off, len) = push_str(self.strings, s);
        put_u32(self.records, at, off);
        put_u32(self.records, at + 4, len);
    }

    /// The span of a string value at attribute position `pos`, shared with the previous
    /// candidate's when equal.
    fn value_span(&mut self, pos: usize, s: &str) -> (u32, u32) {
        let values = &mut self.names.values;
        if let Some(&(off, len)) = values.get(pos)
            && same(span_text(self.strings, (off, len)), s.as_bytes())
        {
            return (off, len);
        }
        let span = push_str(self.strings, s);
        if pos < values.len() {
            values[pos] = span;
        } else if pos < MAX_MEMO {
            // Skipped positions hold the empty span, which only an empty value matches.
            values.resize(pos, (0, 0));
            values.push(span);
        }
        span
    }

    fn attribute_record(&mut self, id: u32, pos: usize, v: Val<'_>) {
        // Built on the stack and appended once: no zero-fill, no per-field bounds checks.
        let mut r = [0u8; ATTRIBUTE];
        r[0..4].copy_from_slice(&id.to_le_bytes());
        match v {
            Val::Int(i) => {
                r[4] = TAG_INT;
                r[8..16].copy_from_slice(&i.to_le_bytes());
            }
            Val::Bool(b) => {
                r[4] = TAG_BOOL;
                r[8] = u8::from(b);
            }
            Val::Str(tag, s) => {
                r[4] = tag;
                let (off, len) = self.value_span(pos, s);
                r[8..12].copy_from_slice(&off.to_le_bytes());
                r[12..16].copy_from_slice(&len.to_le_bytes());
            }
        }
        self.records.extend_from_slice(&r);
    }

    /// The id of a capacity name, unless the policy does not read it.
    fn capacity_id(&mut self, name: &str, driver: u32, pos: usize) -> Option<u32> {
        let select = Some(&self.inputs.capacities);
        let (id, _) = self
            .names
            .id(self.strings, name, driver, M_CAP, pos, select);
        (id != NOT_SENT).then_some(id)
    }

    /// Appends one capacity record.
    fn capacity(&mut self, id: u32, value: i64, text: &str) {
        let (off, len) = push_str(self.strings, text);
        let mut r = [0u8; CAPACITY];
        r[0..4].copy_from_slice(&id.to_le_bytes());
        r[8..16].copy_from_slice(&value.to_le_bytes());
        r[16..20].copy_from_slice(&off.to_le_bytes());
        r[20..24].copy_from_slice(&len.to_le_bytes());
        self.records.extend_from_slice(&r);
    }

    /// Appends one attribute when the policy reads it; returns its NUMA rank.
    fn attribute(&mut self, name: &'a str, driver: u32, pos: usize, v: Val<'_>) -> u8 {
        let select = Some(&self.inputs.attributes);
        let (id, rank) = self
            .names
            .id(self.strings, name, driver, M_ATTR, pos, select);
        if id != NOT_SENT {
            self.attribute_record(id, pos, v);
        }
        rank
    }

    /// Appends one counter set record (its counters follow later at `counters_at`).
    fn counter_set(&mut self, at: usize, c: &Candidate<'a>, set: &'a str, pos: usize, n: usize) {
        let (id, _) = self
            .names
            .id(self.strings, set, PLAIN, M_COUNTER, pos, None);
        let in_use = self.usage.map_or(0, |u| u.get(c.driver, c.pool, set));
        let counters_at = self.records.len();
        put_u32(self.records, at, id);
        put_u32(self.records, at + 4, in_use);
        put_u32(self.records, at + 8, n32(counters_at));
        put_u32(self.records, at + 12, n32(n));
    }

    fn counter(&mut self, name: &'a str, pos: usize, value: i64) {
        let (id, _) = self
            .names
            .id(self.strings, name, PLAIN, M_COUNTER, pos, None);
        let mut r = [0u8; COUNTER];
        r[0..4].copy_from_slice(&id.to_le_bytes());
        r[8..16].copy_from_slice(&value.to_le_bytes());
        self.records.extend_from_slice(&r);
    }

    /// Writes candidate record `rec` (allocated already) and appends its attributes,
    /// capacities and counter sets.
    fn candidate(&mut self, rec: usize, c: &Candidate<'a>) {
        let driver = self.names.plain(self.strings, c.driver, 0);
        let pool = self.names.plain(self.strings, c.pool, 1);
        self.span_at(rec, c.name());
        put_u32(self.records, rec + 8, driver);
        put_u32(self.records, rec + 12, pool);
        // Attributes; a published device's NUMA node is the best-ranked NUMA attribute.
        let start = self.records.len();
        let mut numa = c.numa_node.map(|n| (0u8, n));
        match c.device {
            DeviceData::Published(d) => self.published_attributes(d, driver, &mut numa),
            DeviceData::Inventory(d) => self.inventory_attributes(d, driver),
        }
        let n = (self.records.len() - start) / ATTRIBUTE;
        put_u32(self.records, rec + 32, n32(start));
        put_u32(self.records, rec + 36, n32(n));
        self.records[rec + 16] = u8::from(c.in_use) | (u8::from(numa.is_some()) << 1);
        self.records[rec + 17] = health_byte(c.health);
        put_i64(self.records, rec + 24, numa.map_or(0, |(_, n)| n));
        let start = self.records.len();
        if !self.inputs.no_capacities() {
            self.capacities(c.device, driver);
        }
        let n = (self.records.len() - start) / CAPACITY;
        put_u32(self.records, rec + 40, n32(start));
        put_u32(self.records, rec + 44, n32(n));
        let start = self.records.len();
        let n = if self.inputs.counters {
            self.counter_sets(c)
        } else {
            0
        };
        put_u32(self.records, rec + 48, n32(start));
        put_u32(self.records, rec + 52, n32(n));
    }

    /// Appends the attributes of a published device the policy reads; `numa` becomes the
    /// value of its best-ranked NUMA attribute.
    fn published_attributes(
        &mut self,
        d: &'a api::Device,
        driver: u32,
        numa: &mut Option<(u8, i64)>,
    ) {
        // Without any attribute to send, only the NUMA attributes are looked at.
        let numa_only = self.inputs.no_attributes() && numa.is_none();
        for (pos, (k, v)) in d.attributes.iter().enumerate() {
            if !self.last_bytes.may_matter(k) {
                continue;
            }
            let val = if let Some(i) = v.int {
                Val::Int(i)
            } else if numa_only {
                continue;
            } else if let Some(b) = v.bool {
                Val::Bool(b)
            } else if let Some(s) = &v.string {
                Val::Str(TAG_STRING, s)
            } else if let Some(s) = &v.version {
                Val::Str(TAG_VERSION, s)
            } else {
                continue;
            };
            let int = v.int;
            let rank = self.attribute(k, driver, pos, val);
            if let Some(i) = int
                && rank != 0
                && numa.is_none_or(|(r, _)| rank < r)
            {
                *numa = Some((rank, i));
            }
        }
    }

    /// Appends the attributes of an inventory device the policy reads.
    fn inventory_attributes(&mut self, d: &'a kubedev_core::Device, driver: u32) {
        if self.inputs.no_attributes() {
            return;
        }
        for (pos, (k, v)) in d.attributes.iter().enumerate() {
            if !self.last_bytes.may_matter(k.as_str()) {
                continue;
            }
            let val = match v {
                AttributeValue::Int(i) => Val::Int(*i),
                AttributeValue::Bool(b) => Val::Bool(*b),
                AttributeValue::String(s) => Val::Str(TAG_STRING, s),
                AttributeValue::Version(v) => Val::Str(TAG_VERSION, v.as_str()),
                // A value kind added to core later is not sent.
                _ => continue,
            };
            self.attribute(k.as_str(), driver, pos, val);
        }
    }

    /// Appends the capacity records of the capacities the policy reads.
    fn capacities(&mut self, device: DeviceData<'a>, driver: u32) {
        match device {
            DeviceData::Published(d) => {
                for (pos, (k, cap)) in d.capacity.iter().enumerate() {
                    let Some(id) = self.capacity_id(k, driver, pos) else {
                        continue;
                    };
                    let text = cap.value.as_str();
                    let value = self.quantities.value(text);
                    self.capacity(id, value, text);
                }
            }
            DeviceData::Inventory(d) => {
                for (pos, (k, cap)) in d.capacity.iter().enumerate() {
                    let Some(id) = self.capacity_id(k.as_str(), driver, pos) else {
                        continue;
                    };
                    self.capacity(id, saturated_value(&cap.value), &cap.value.to_string());
                }
            }
        }
    }

    /// Appends the candidate's counter set records side by side, then the counters of each
    /// in turn; returns how many sets there are.
    fn counter_sets(&mut self, c: &Candidate<'a>) -> usize {
        let start = self.records.len();
        let mut pos = 0;
        match c.device {
            DeviceData::Published(d) => {
                let sets = &d.consumes_counters;
                self.records.resize(start + sets.len() * COUNTER_SET, 0);
                for (i, cc) in sets.iter().enumerate() {
                    let at = start + i * COUNTER_SET;
                    self.counter_set(at, c, &cc.counter_set, pos, cc.counters.len());
                    pos += 1;
                    for (k, v) in &cc.counters {
                        let value = self.quantities.value(v.value.as_str());
                        self.counter(k, pos, value);
                        pos += 1;
                    }
                }
                sets.len()
            }
            DeviceData::Inventory(d) => {
                let sets = &d.consumes_counters;
                self.records.resize(start + sets.len() * COUNTER_SET, 0);
                for (i, cc) in sets.iter().enumerate() {
                    let at = start + i * COUNTER_SET;
                    self.counter_set(at, c, cc.counter_set.as_str(), pos, cc.counters.len());
                    pos += 1;
                    for (k, v) in &cc.counters {
                        self.counter(k.as_str(), pos, saturated_value(v));
                        pos += 1;
                    }
                }
                sets.len()
            }
        }
    }
}

/// Encodes `input` into `msg` (cleared first), with only the `inputs` the policy reads.
pub(crate) fn encode_input(input: &PolicyInput<'_>, inputs: &Inputs, msg: &mut Message) {
    let Message {
        records,
        strings,
        names,
        last_bytes,
    } = msg;
    last_bytes.set(inputs, &input.constraints);
    records.clear();
    strings.clear();
    names.clear();
    let n = input.candidates.len();
    let constraints_off = HEADER;
    let candidates_off = constraints_off + input.constraints.len() * CONSTRAINT;
    records.resize(candidates_off + n * CANDIDATE, 0);
    records[0..4].copy_from_slice(INPUT_MAGIC);
    put_u32(records, 4, ABI_VERSION);
    put_u32(records, 8, n32(input.count));
    let mut e = Encoder {
        records,
        strings,
        names,
        quantities: Quantities { seen: Vec::new() },
        usage: input.usage.filter(|u| !u.is_empty()),
        inputs,
        last_bytes,
    };
    e.span_at(16, input.claim);
    e.span_at(24, input.request);
    // The attributes of the constraints in force are sent whatever the policy declared.
    for (i, c) in input.constraints.iter().enumerate() {
        let (id, _) = e
            .names
            .id(e.strings, c.attribute, PLAIN, M_ATTR, usize::MAX, None);
        e.names.forced.push(id);
        let at = constraints_off + i * CONSTRAINT;
        put_u32(e.records, at, id);
        put_u32(
            e.records,
            at + 4,
            match c.kind {
                ConstraintKind::MatchAttribute => 0,
                ConstraintKind::DistinctAttribute => 1,
            },
        );
    }
    for (i, c) in input.candidates.iter().enumerate() {
        e.candidate(candidates_off + i * CANDIDATE, c);
    }
    let names_off = e.records.len();
    let table = &e.names.table;
    let n_names = table.len();
    e.records.reserve(n_names * NAME);
    for (off, len) in table {
        e.records.extend_from_slice(&off.to_le_bytes());
        e.records.extend_from_slice(&len.to_le_bytes());
    }
    let strings_off = e.records.len();
    let strings_len = e.strings.len();
    let records = e.records;
    put_u32(records, 32, n32(names_off));
    put_u32(records, 36, n32(n_names));
    put_u32(records, 40, n32(constraints_off));
    put_u32(records, 44, n32(input.constraints.len()));
    put_u32(records, 48, n32(candidates_off));
    put_u32(records, 52, n32(n));
    put_u32(records, 56, n32(strings_off));
    put_u32(records, 60, n32(strings_len));
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
