//! Orders built from groups of candidates that share a key: [`pack_by`] fills as few groups
//! as it can, [`spread_by`] takes one candidate from each group in turn.

use alloc::vec::Vec;

use crate::candidate::Candidate;
use crate::input::Input;

/// FNV-1a: a small, deterministic hash for grouping keys.
struct FnvHasher(u64);

impl core::hash::Hasher for FnvHasher {
    /// Eight bytes per step (keys are short strings such as PCIe roots and models).
    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for w in words.by_ref() {
            self.write_u64(u64::from_le_bytes([
                w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7],
            ]));
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            // Byte by byte: a copy of a variable length would be a call.
            let mut tail = (rest.len() as u64) << 56;
            for (i, &b) in rest.iter().enumerate() {
                tail |= u64::from(b) << (8 * i);
            }
            self.write_u64(tail);
        }
    }
    fn write_u8(&mut self, i: u8) {
        self.write_u64(u64::from(i));
    }
    fn write_u64(&mut self, i: u64) {
        self.0 = (self.0 ^ i).wrapping_mul(0x0000_0100_0000_01b3);
    }
    fn write_i64(&mut self, i: i64) {
        self.write_u64(i as u64);
    }
    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64);
    }
    fn finish(&self) -> u64 {
        // Fold the high bits down: slots are picked by the low bits.
        self.0 ^ (self.0 >> 32) ^ (self.0 >> 17)
    }
}

/// The grouping hash of `k`.
pub(crate) fn hash_of<K: core::hash::Hash>(k: &K) -> u64 {
    let mut h = FnvHasher(0xcbf2_9ce4_8422_2325);
    k.hash(&mut h);
    core::hash::Hasher::finish(&h)
}

/// No group: a candidate without a key, or one that is not free.
const NO_GROUP: u32 = u32::MAX;

/// Candidates split by a key. Groups are numbered in order of first appearance; members
/// of a group are listed in input order.
struct Groups {
    /// Free members of each group, in input order: `members[start[g]..start[g + 1]]`.
    members: Vec<u32>,
    /// Where each group's members start, and the end of the last group's.
    start: Vec<u32>,
    /// Devices of each group that are not free (in use or unhealthy).
    busy_in: Vec<u32>,
    /// Free candidates without a key, in input order.
    ungrouped: Vec<u32>,
    /// Candidates that are not free, in input order.
    busy: Vec<u32>,
}

impl Groups {
    fn len(&self) -> usize {
        self.busy_in.len()
    }
    fn free(&self, g: usize) -> &[u32] {
        &self.members[self.start[g] as usize..self.start[g + 1] as usize]
    }
}

/// Splits the candidates by `key`.
fn group_by<'a, K: Eq + core::hash::Hash>(
    input: &Input<'a>,
    key: impl Fn(&Candidate<'a>) -> Option<K>,
) -> Groups {
    let n = input.len();
    // Open addressing over (hash, key) → group number.
    let cap = (n * 2).next_power_of_two().max(8);
    let mut slots: Vec<u32> = alloc::vec![NO_GROUP; cap];
    // Sized once: growing several vectors in turn would copy them (bump allocator).
    let mut keys: Vec<(u64, K)> = Vec::with_capacity(n);
    let mut group_of: Vec<u32> = Vec::with_capacity(n);
    let mut free_count: Vec<u32> = Vec::with_capacity(n);
    let mut busy_in: Vec<u32> = Vec::with_capacity(n);
    let mut ungrouped = Vec::with_capacity(n);
    let mut busy = Vec::with_capacity(n);
    for c in input.candidates() {
        let free = c.is_free();
        if !free {
            busy.push(c.index());
        }
        let Some(k) = key(&c) else {
            if free {
                ungrouped.push(c.index());
            }
            group_of.push(NO_GROUP);
            continue;
        };
        let h = hash_of(&k);
        let mut i = (h as usize) & (cap - 1);
        let g = loop {
            match slots[i] {
                NO_GROUP => {
                    let g = keys.len() as u32;
                    slots[i] = g;
                    keys.push((h, k));
                    free_count.push(0);
                    busy_in.push(0);
                    break g;
                }
                g if keys[g as usize].0 == h && keys[g as usize].1 == k => break g,
                _ => i = (i + 1) & (cap - 1),
            }
        };
        if free {
            free_count[g as usize] += 1;
            group_of.push(g);
        } else {
            busy_in[g as usize] += 1;
            group_of.push(NO_GROUP);
        }
    }
    // Counting sort of the free grouped candidates by group, stable.
    let mut start = Vec::with_capacity(free_count.len() + 1);
    let mut total = 0u32;
    for &f in &free_count {
        start.push(total);
        total += f;
    }
    start.push(total);
    let mut next = start.clone();
    let mut members = alloc::vec![0u32; total as usize];
    for (i, &g) in group_of.iter().enumerate() {
        if g != NO_GROUP {
            members[next[g as usize] as usize] = i as u32;
            next[g as usize] += 1;
        }
    }
    Groups {
        members,
        start,
        busy_in,
        ungrouped,
        busy,
    }
}

/// Packs the request onto as few groups as possible (NUMA nodes, link groups, switches):
/// first the smallest group that can hold every device still needed (keeping larger groups
/// whole), else the group with the most free devices, and so on; ties go to the group seen
/// first. Within a group the input order stays. Candidates without a group come after the
/// grouped ones, and candidates that are not free (in use or unhealthy) come last. Returns
/// a full order.
pub fn pack_by<'a, K: Eq + core::hash::Hash>(
    input: &Input<'a>,
    key: impl Fn(&Candidate<'a>) -> Option<K>,
) -> Vec<u32> {
    let groups = group_by(input, key);
    let mut order = Vec::with_capacity(input.len());
    let mut left: Vec<usize> = (0..groups.len()).collect();
    let mut need = input.count();
    while !left.is_empty() {
        let mut best = 0;
        let mut best_rank = (true, usize::MAX);
        for (i, &g) in left.iter().enumerate() {
            let free = groups.free(g).len();
            let fits = free >= need;
            let rank = (!fits, if fits { free } else { usize::MAX - free });
            if rank < best_rank {
                best_rank = rank;
                best = i;
            }
        }
        let g = left.remove(best);
        let members = groups.free(g);
        need = need.saturating_sub(members.len());
        order.extend_from_slice(members);
    }
    order.extend_from_slice(&groups.ungrouped);
    order.extend_from_slice(&groups.busy);
    order
}

/// Spreads the request across groups (PCIe roots, switches, hosts): one candidate from
/// each group in turn, groups with fewer devices in use first, then groups with more free
/// devices, then the group seen first. Candidates without a group come after, those not
/// free last. Returns a full order.
pub fn spread_by<'a, K: Eq + core::hash::Hash>(
    input: &Input<'a>,
    key: impl Fn(&Candidate<'a>) -> Option<K>,
) -> Vec<u32> {
    let groups = group_by(input, key);
    let mut by_rank: Vec<usize> = (0..groups.len()).collect();
    // Stable: equal groups keep the order they were seen in.
    by_rank.sort_by_key(|&g| (groups.busy_in[g], usize::MAX - groups.free(g).len()));
    let mut order = Vec::with_capacity(input.len());
    let rounds = by_rank
        .iter()
        .map(|&g| groups.free(g).len())
        .max()
        .unwrap_or(0);
    for round in 0..rounds {
        for &g in &by_rank {
            if let Some(&i) = groups.free(g).get(round) {
                order.push(i);
            }
        }
    }
    order.extend_from_slice(&groups.ungrouped);
    order.extend_from_slice(&groups.busy);
    order
}
