//! The input message (ABI version 1): fixed-size records a guest reads in place, names
//! interned in a table, strings in their own region. The layout is documented in the crate
//! docs; this is its only host-side implementation.

use kubedev_core::{AttributeValue, HealthState, Quantity};

use crate::abi::{ABI_VERSION, INPUT_MAGIC, NUMA_NODE_ATTRIBUTE};
use crate::input::{Candidate, ConstraintKind, CounterUsage, DeviceData, PolicyInput};
use crate::inputs::{self, Inputs};

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

/// Positions remembered per section kind (more attributes than this are looked up by scan).
const MAX_MEMO: usize = 4096;

/// No driver: the name is taken as written.
const PLAIN: u32 = u32::MAX;
/// The id of a name the policy did not declare: its records are not sent.
const NOT_SENT: u32 = u32::MAX;

/// Section kinds, each with its own memo of the previous candidate's names by position.
const M_ATTR: usize = 0;
const M_CAP: usize = 1;
const M_COUNTER: usize = 2;
/// Drivers, then pools (`M_DRIVER + 1`).
const M_DRIVER: usize = 3;

/// The name table. Devices of one pool list the same names in the same order, so a name is
/// first looked up where it was for the previous candidate; a miss scans the aliases. Its
/// buffers live in the reused [`Message`], so a call allocates nothing once warm.
#[derive(Debug, Default)]
pub(crate) struct Names {
    /// (driver id or PLAIN, offset and length of the name as written in `raw`, name id or
    /// NOT_SENT, NUMA rank: 1, 2 or 3 when it is a NUMA attribute name — the standard one,
    /// the driver's `numaNode`, the driver's `numa` — else 0).
    aliases: Vec<(u32, u32, u32, u32, u8)>,
    raw: Vec<u8>,
    /// Name id → span of the (qualified) text.
    table: Vec<(u32, u32)>,
    /// Ids of names that are always sent (those of the constraints in force).
    forced: Vec<u32>,
    memo: [Vec<u32>; 5],
    /// The last driver or pool looked up: same address, same text.
    last: [(usize, usize, u32); 2],
    /// Span of the previous candidate's string value by attribute position: equal values
    /// (a model, a driver version, a shared PCIe root) are stored once.
    values: Vec<(u32, u32)>,
}

impl Names {
    fn clear(&mut self) {
        self.aliases.clear();
        self.raw.clear();
        self.table.clear();
        self.forced.clear();
        for m in &mut self.memo {
            m.clear();
        }
        self.last = [(0, 0, 0); 2];
        self.values.clear();
    }

    /// The id of a driver or pool name (`slot` 0 or 1): names of one slice are one string.
    fn plain(&mut self, strings: &mut Vec<u8>, raw: &str, slot: usize) -> u32 {
        let (ptr, len, id) = self.last[slot];
        if ptr == raw.as_ptr() as usize && len == raw.len() && len != 0 {
            return id;
        }
        let (id, _) = self.id(strings, raw, PLAIN, M_DRIVER + slot, 0, None);
        self.last[slot] = (raw.as_ptr() as usize, raw.len(), id);
        id
    }

    #[inline]
    fn alias_is(&self, a: usize, driver: u32, raw: &[u8]) -> bool {
        let (d, off, len, _, _) = self.aliases[a];
        d == driver && same(&self.raw[off as usize..(off + len) as usize], raw)
    }

    /// The id of `raw` and its NUMA rank; with a driver, a bare name is qualified with the
    /// driver's domain. With a selection, a name outside it is `NOT_SENT`. Nearly always
    /// the name the previous candidate had at this position: that is checked inline.
    #[inline(always)]
    fn id(
        &mut self,
        strings: &mut Vec<u8>,
        raw: &str,
        driver: u32,
        kind: usize,
        pos: usize,
        select: Option<&inputs::Names>,
    ) -> (u32, u8) {
        let bytes = raw.as_bytes();
        if let Some(&a) = self.memo[kind].get(pos)
            && let Some(&(d, off, len, id, rank)) = self.aliases.get(a as usize)
            && d == driver
            && same(&self.raw[off as usize..(off + len) as usize], bytes)
        {
            return (id, rank);
        }
        self.id_slow(strings, bytes, driver, kind, pos, select)
    }

    /// [`Names::id`] when the memo misses: scans the aliases, adds a new one.
    #[inline(never)]
    fn id_slow(
        &mut self,
        strings: &mut Vec<u8>,
        raw: &[u8],
        driver: u32,
        kind: usize,
        pos: usize,
        select: Option<&inputs::Names>,
    ) -> (u32, u8) {
        let alias = match (0..self.aliases.len()).find(|&a| self.alias_is(a, driver, raw)) {
            Some(a) => a,
            None => {
                let (id, rank) = self.add(strings, raw, driver, select);
                let off = n32(self.raw.len());
                self.raw.extend_from_slice(raw);
                self.aliases.push((driver, off, n32(raw.len()), id, rank));
                self.aliases.len() - 1
            }
        };
        // Positions skipped so far hold no alias (u32::MAX never is one).
        let memo = &mut self.memo[kind];
        if pos < memo.len() {
            memo[pos] = n32(alias);
        } else if pos < MAX_MEMO {
            memo.resize(pos, u32::MAX);
            memo.push(n32(alias));
        }
        let (_, _, _, id, rank) = self.aliases[alias];
        (id, rank)
    }

    /// Adds the text of a new alias to the table, unless an equal text is there already or
    /// the selection leaves it out; returns its id (or `NOT_SENT`) and NUMA rank.
    fn add(
        &mut self,
        strings: &mut Vec<u8>,
        raw: &[u8],
        driver: u32,
        select: Option<&inputs::Names>,
    ) -> (u32, u8) {
        let start = strings.len();
        if driver != PLAIN && !raw.contains(&b'/') {
            let (off, len) = self.table[driver as usize];
            strings.extend_from_within(off as usize..(off + len) as usize);
            strings.push(b'/');
        }
        strings.extend_from_slice(raw);
        let text = start..strings.len();
        let t = &strings[text.clone()];
        let domain = if driver == PLAIN {
            &[][..]
        } else {
            let (off, len) = self.table[driver as usize];
            &strings[off as usize..(off + len) as usize]
        };
        // In the device's driver's domain: `<driver>/...`.
        let own = driver != PLAIN
            && t.len() > domain.len()
            && t.starts_with(domain)
            && t[domain.len()] == b'/';
        let rank = if t == NUMA_NODE_ATTRIBUTE.as_bytes() {
            1
        } else if own && t.ends_with(b"/numaNode") {
            2
        } else if own && t.ends_with(b"/numa") {
            3
        } else {
            0
        };
        let wanted = select.is_none_or(|s| s.wants(t, domain));
        if let Some(id) = self
            .table
            .iter()
            .position(|&s| span_text(strings, s) == &strings[text.clone()])
        {
            strings.truncate(start);
            let id = n32(id);
            let sent = wanted || self.forced.contains(&id);
            return (if sent { id } else { NOT_SENT }, rank);
        }
        if !wanted {
            strings.truncate(start);
            return (NOT_SENT, rank);
        }
        self.table.push((n32(start), n32(text.len())));
        (n32(self.table.len() - 1), rank)
    }
}

/// Which attribute names can matter, by their last byte: a name is sent when it is
/// declared or belongs to a constraint in force, and read when it may be a NUMA attribute
/// (`…numaNode`, `…numa`). Qualifying a bare name only puts a domain in front, so a name
/// whose last byte is none of theirs is skipped without a lookup.
#[derive(Debug)]
pub(crate) struct LastBytes([bool; 256]);

impl Default for LastBytes {
    fn default() -> Self {
        LastBytes([true; 256])
    }
}

impl LastBytes {
    fn set(&mut self, inputs: &Inputs, constraints: &[crate::input::Constraint<'_>]) {
        let inputs::Names::Listed(names) = &inputs.attributes else {
            self.0 = [true; 256];
            return;
        };
        self.0 = [false; 256];
        let names = names
            .iter()
            .map(String::as_str)
            .chain(constraints.iter().map(|c| c.attribute))
            .chain(["numaNode", "numa"]);
        for name in names {
            match name.as_bytes().last() {
                Some(&b) => self.0[b as usize] = true,
                None => self.0 = [true; 256],
            }
        }
    }

    #[inline(always)]
    fn may_matter(&self, name: &str) -> bool {
        name.as_bytes().last().is_none_or(|&b| self.0[b as usize])
    }
}

/// Parsed quantities of this message, by text: capacities and counters repeat across
/// devices, and parsing is the costly part.
struct Quantities<'a> {
    seen: Vec<(&'a str, i64)>,
}

impl<'a> Quantities<'a> {
    fn value(&mut self, text: &'a str) -> i64 {
        if let Some(&(_, v)) = self
            .seen
            .iter()
            .rev()
            .find(|(t, _)| same(t.as_bytes(), text.as_bytes()))
        {
            return v;
        }
        let v = quantity_value(text);
        if self.seen.len() < 32 {
            self.seen.push((text, v));
        }
        v
    }
}

/// Kubernetes' `Value()` of a quantity as written: rounded away from zero, saturated to the
/// `i64` range; 0 when the text is not a quantity (the allocator rejects such devices before
/// a policy sees them).
pub(crate) fn quantity_value(text: &str) -> i64 {
    if let Some(v) = simple_quantity(text) {
        return v;
    }
    match Quantity::parse(text) {
        Ok(q) => saturated_value(&q),
        Err(_) => 0,
    }
}

/// The common forms exactly, without the general parser: digits with an optional binary
/// (`Ki` … `Ei`) or decimal (`k`, `M` … `E`) suffix, when the value fits an `i64`.
fn simple_quantity(text: &str) -> Option<i64> {
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 || digits > 18 {
        return None;
    }
    let n: i64 = text[..digits].parse().ok()?;
    let factor: i64 = match &text[digits..] {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        "Ei" => 1 << 60,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        "E" => 1_000_000_000_000_000_000,
        _ => return None,
    };
    n.checked_mul(factor)
}

fn saturated_value(q: &Quantity) -> i64 {
    q.value()
        .unwrap_or(if q.sign() < 0 { i64::MIN } else { i64::MAX })
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
            DeviceData::Published(d) => {
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
                        numa = Some((rank, i));
                    }
                }
            }
            DeviceData::Inventory(d) => {
                if !self.inputs.no_attributes() {
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
            }
        }
        let n = (self.records.len() - start) / ATTRIBUTE;
        put_u32(self.records, rec + 32, n32(start));
        put_u32(self.records, rec + 36, n32(n));
        self.records[rec + 16] = u8::from(c.in_use) | (u8::from(numa.is_some()) << 1);
        self.records[rec + 17] = health_byte(c.health);
        put_i64(self.records, rec + 24, numa.map_or(0, |(_, n)| n));
        // Capacities.
        let start = self.records.len();
        match c.device {
            _ if self.inputs.no_capacities() => {}
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
        let n = (self.records.len() - start) / CAPACITY;
        put_u32(self.records, rec + 40, n32(start));
        put_u32(self.records, rec + 44, n32(n));
        // Counter sets (records side by side), then the counters of each in turn.
        let start = self.records.len();
        let mut pos = 0;
        match c.device {
            _ if !self.inputs.counters => {}
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
            }
        }
        let n = match c.device {
            _ if !self.inputs.counters => 0,
            DeviceData::Published(d) => d.consumes_counters.len(),
            DeviceData::Inventory(d) => d.consumes_counters.len(),
        };
        put_u32(self.records, rec + 48, n32(start));
        put_u32(self.records, rec + 52, n32(n));
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
mod tests {
    use std::collections::BTreeMap;

    use kubedev_allocator::api::{self, DeviceAttribute, DeviceCapacity, RawQuantity};

    use super::*;

    fn u32_at(b: &[u8], at: usize) -> u32 {
        u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
    }

    fn i64_at(b: &[u8], at: usize) -> i64 {
        i64::from_le_bytes(b[at..at + 8].try_into().unwrap())
    }

    fn text(msg: &[u8], at: usize) -> &str {
        let base = u32_at(msg, 56) as usize;
        let (off, len) = (u32_at(msg, at) as usize, u32_at(msg, at + 4) as usize);
        std::str::from_utf8(&msg[base + off..base + off + len]).unwrap()
    }

    fn name(msg: &[u8], id: u32) -> &str {
        text(msg, u32_at(msg, 32) as usize + id as usize * NAME)
    }

    fn device(name: &str, numa: i64, extra: &str) -> api::Device {
        let mut attributes = BTreeMap::new();
        attributes.insert(
            "resource.kubernetes.io/numaNode".to_string(),
            DeviceAttribute {
                int: Some(numa),
                ..Default::default()
            },
        );
        attributes.insert(
            extra.to_string(),
            DeviceAttribute {
                string: Some("x".into()),
                ..Default::default()
            },
        );
        let mut capacity = BTreeMap::new();
        capacity.insert(
            "memory".to_string(),
            DeviceCapacity {
                value: RawQuantity::from("40Gi"),
                request_policy: None,
            },
        );
        api::Device {
            name: name.into(),
            attributes,
            capacity,
            ..Default::default()
        }
    }

    #[test]
    fn records_names_and_strings_round_trip() {
        let a = device("gpu-0", 1, "model");
        let b = device("gpu-1", 0, "gpu.example.com/model");
        let c = device("gpu-2", 0, "brand");
        let input = PolicyInput::new(
            "ns/claim",
            "req",
            2,
            vec![
                Candidate::published("gpu.example.com", "pool", &a).with_in_use(true),
                Candidate::published("gpu.example.com", "pool", &b),
                Candidate::published("gpu.example.com", "pool", &c),
            ],
        );
        let mut m = Message::default();
        encode_input(&input, &Inputs::default(), &mut m);
        let msg = [m.records.clone(), m.strings.clone()].concat();
        assert_eq!(&msg[0..4], b"KDPI");
        assert_eq!(u32_at(&msg, 8), 2);
        assert_eq!(text(&msg, 16), "ns/claim");
        assert_eq!(u32_at(&msg, 52), 3);
        assert_eq!(u32_at(&msg, 56) as usize, m.records.len());
        let cand = |i: usize| u32_at(&msg, 48) as usize + i * CANDIDATE;
        assert_eq!(text(&msg, cand(1)), "gpu-1");
        assert_eq!(name(&msg, u32_at(&msg, cand(0) + 8)), "gpu.example.com");
        assert_eq!(msg[cand(0) + 16], 0b11, "in use, NUMA known");
        assert_eq!(i64_at(&msg, cand(0) + 24), 1);
        // A bare name and its qualified form are one name.
        let attr = |i: usize, j: usize| u32_at(&msg, cand(i) + 32) as usize + j * ATTRIBUTE;
        let model_a = u32_at(&msg, attr(0, 0));
        let model_b = u32_at(&msg, attr(1, 0));
        assert_eq!(name(&msg, model_a), "gpu.example.com/model");
        assert_eq!(model_a, model_b);
        assert_eq!(
            name(&msg, u32_at(&msg, attr(2, 0))),
            "gpu.example.com/brand"
        );
        assert_eq!(text(&msg, attr(0, 0) + 8), "x");
        let cap = u32_at(&msg, cand(2) + 40) as usize;
        assert_eq!(name(&msg, u32_at(&msg, cap)), "gpu.example.com/memory");
        assert_eq!(i64_at(&msg, cap + 8), 40 << 30);
        assert_eq!(text(&msg, cap + 16), "40Gi");
        // Names are stored once.
        let names: Vec<&str> = (0..u32_at(&msg, 36)).map(|i| name(&msg, i)).collect();
        let mut unique = names.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(names.len(), unique.len(), "{names:?}");
    }

    #[test]
    fn numa_nodes_come_from_the_best_attribute_and_equal_values_are_shared() {
        let int = |v| DeviceAttribute {
            int: Some(v),
            ..Default::default()
        };
        let string = |v: &str| DeviceAttribute {
            string: Some(v.into()),
            ..Default::default()
        };
        let mut bare = api::Device {
            name: "a".into(),
            ..Default::default()
        };
        bare.attributes.insert("numa".into(), int(3));
        bare.attributes.insert("model".into(), string("X100"));
        let mut both = bare.clone();
        both.name = "b".into();
        both.attributes.insert("numaNode".into(), int(5));
        let mut other_domain = bare.clone();
        other_domain.name = "c".into();
        other_domain.attributes.clear();
        other_domain
            .attributes
            .insert("other.example.com/numa".into(), int(7));
        other_domain
            .attributes
            .insert("model".into(), string("X100"));
        let input = PolicyInput::new(
            "",
            "",
            1,
            vec![
                Candidate::published("gpu.example.com", "p", &bare),
                Candidate::published("gpu.example.com", "p", &both),
                Candidate::published("gpu.example.com", "p", &other_domain),
            ],
        );
        let mut m = Message::default();
        encode_input(&input, &Inputs::default(), &mut m);
        let msg = [m.records.clone(), m.strings.clone()].concat();
        let cand = |i: usize| u32_at(&msg, 48) as usize + i * CANDIDATE;
        assert_eq!((msg[cand(0) + 16] & 2, i64_at(&msg, cand(0) + 24)), (2, 3));
        assert_eq!((msg[cand(1) + 16] & 2, i64_at(&msg, cand(1) + 24)), (2, 5));
        assert_eq!(
            msg[cand(2) + 16] & 2,
            0,
            "another domain's numa is not the NUMA node"
        );
        // "X100" is stored once for the two candidates that list it at the same position.
        let x100 = m.strings.windows(4).filter(|w| w == b"X100").count();
        assert_eq!(x100, 1);
        // A policy that reads no attribute still gets the same NUMA nodes.
        for declared in ["", "attribute model", "counters"] {
            encode_input(&input, &Inputs::parse(declared).unwrap(), &mut m);
            let msg = [m.records.clone(), m.strings.clone()].concat();
            let numa = |i: usize| (msg[cand(i) + 16] & 2, i64_at(&msg, cand(i) + 24));
            assert_eq!(
                [numa(0), numa(1), (numa(2).0, 0)],
                [(2, 3), (2, 5), (0, 0)],
                "{declared:?}"
            );
        }
    }

    #[test]
    fn only_declared_inputs_and_constraint_attributes_are_sent() {
        use crate::input::Constraint;
        let a = device("gpu-0", 1, "model");
        let b = device("gpu-1", 0, "brand");
        let input = PolicyInput::new(
            "ns/claim",
            "req",
            1,
            vec![
                Candidate::published("gpu.example.com", "pool", &a),
                Candidate::published("gpu.example.com", "pool", &b),
            ],
        )
        .with_constraints(vec![Constraint {
            kind: ConstraintKind::MatchAttribute,
            attribute: "gpu.example.com/brand",
        }]);
        let inputs = Inputs::parse("attribute model").unwrap();
        let mut m = Message::default();
        encode_input(&input, &inputs, &mut m);
        let msg = [m.records.clone(), m.strings.clone()].concat();
        let cand = |i: usize| u32_at(&msg, 48) as usize + i * CANDIDATE;
        let attrs = |i: usize| -> Vec<&str> {
            let (off, n) = (
                u32_at(&msg, cand(i) + 32) as usize,
                u32_at(&msg, cand(i) + 36),
            );
            (0..n as usize)
                .map(|j| name(&msg, u32_at(&msg, off + j * ATTRIBUTE)))
                .collect()
        };
        // The declared attribute, and the constraint's attribute; not the NUMA attribute,
        // whose value is still in the record, and no capacity or counter.
        assert_eq!(attrs(0), vec!["gpu.example.com/model"]);
        assert_eq!(attrs(1), vec!["gpu.example.com/brand"]);
        assert_eq!((msg[cand(0) + 16] & 2, i64_at(&msg, cand(0) + 24)), (2, 1));
        assert_eq!(u32_at(&msg, cand(0) + 44), 0, "no capacities");
        let names: Vec<&str> = (0..u32_at(&msg, 36)).map(|i| name(&msg, i)).collect();
        assert!(
            !names.contains(&"resource.kubernetes.io/numaNode")
                && !names.contains(&"gpu.example.com/memory"),
            "{names:?}"
        );
        // Nothing declared: only the records themselves.
        encode_input(&input, &Inputs::parse("").unwrap(), &mut m);
        let small = m.len();
        encode_input(&input, &Inputs::default(), &mut m);
        assert!(small < m.len(), "{small} < {}", m.len());
    }

    #[test]
    fn quantities_round_up_and_saturate() {
        assert_eq!(quantity_value("7"), 7);
        assert_eq!(quantity_value("40Gi"), 40 << 30);
        assert_eq!(quantity_value("1500m"), 2);
        assert_eq!(quantity_value("1e30"), i64::MAX);
        assert_eq!(quantity_value("3k"), 3000);
        assert_eq!(
            quantity_value("16Ei"),
            i64::MAX,
            "overflow falls back and saturates"
        );
        assert_eq!(quantity_value("0.5Gi"), 1 << 29);
        assert_eq!(quantity_value("not a quantity"), 0);
    }
}
