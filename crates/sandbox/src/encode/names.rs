//! The name table of a message: names interned once with their ids, looked up where they were
//! for the previous candidate, and the last-byte filter that skips names no policy can want.

use crate::abi::NUMA_NODE_ATTRIBUTE;
use crate::inputs::{self, Inputs};

use super::{n32, same, span_text};

/// Positions remembered per section kind (more attributes than this are looked up by scan).
pub(super) const MAX_MEMO: usize = 4096;

/// No driver: the name is taken as written.
pub(super) const PLAIN: u32 = u32::MAX;
/// The id of a name the policy did not declare: its records are not sent.
pub(super) const NOT_SENT: u32 = u32::MAX;

/// Section kinds, each with its own memo of the previous candidate's names by position.
pub(super) const M_ATTR: usize = 0;
pub(super) const M_CAP: usize = 1;
pub(super) const M_COUNTER: usize = 2;
/// Drivers, then pools (`M_DRIVER + 1`).
const M_DRIVER: usize = 3;

/// The name table. Devices of one pool list the same names in the same order, so a name is
/// first looked up where it was for the previous candidate; a miss scans the aliases. Its
/// buffers live in the reused [`Message`](super::Message), so a call allocates nothing once
/// warm.
#[derive(Debug, Default)]
pub(crate) struct Names {
    /// (driver id or PLAIN, offset and length of the name as written in `raw`, name id or
    /// NOT_SENT, NUMA rank: 1, 2 or 3 when it is a NUMA attribute name — the standard one,
    /// the driver's `numaNode`, the driver's `numa` — else 0).
    aliases: Vec<(u32, u32, u32, u32, u8)>,
    raw: Vec<u8>,
    /// Name id → span of the (qualified) text.
    pub(super) table: Vec<(u32, u32)>,
    /// Ids of names that are always sent (those of the constraints in force).
    pub(super) forced: Vec<u32>,
    memo: [Vec<u32>; 5],
    /// The last driver or pool looked up: same address, same text.
    last: [(usize, usize, u32); 2],
    /// Span of the previous candidate's string value by attribute position: equal values
    /// (a model, a driver version, a shared PCIe root) are stored once.
    pub(super) values: Vec<(u32, u32)>,
}

impl Names {
    pub(super) fn clear(&mut self) {
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
    pub(super) fn plain(&mut self, strings: &mut Vec<u8>, raw: &str, slot: usize) -> u32 {
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
    pub(super) fn id(
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
    pub(super) fn set(&mut self, inputs: &Inputs, constraints: &[crate::input::Constraint<'_>]) {
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
    pub(super) fn may_matter(&self, name: &str) -> bool {
        name.as_bytes().last().is_none_or(|&b| self.0[b as usize])
    }
}
