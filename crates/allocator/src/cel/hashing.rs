//! Hashing and comparison tuned for the short strings of device data (names, domains,
//! amounts): the interner's maps and the selectors' string comparisons use them.

use std::collections::HashMap;

/// A fast hasher for the interner's short keys (FNV-1a over 8-byte words). The keys come
/// from ResourceSlices published by drivers, which the cluster trusts.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct FastHasher(u64);

/// [`FastHasher`]'s mix of `bytes` into `seed` (FNV-1a over 8-byte words).
#[inline]
fn fast_mix(seed: u64, bytes: &[u8]) -> u64 {
    let mut h = seed ^ 0xcbf2_9ce4_8422_2325;
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        h = (h ^ u64::from_le_bytes(w))
            .wrapping_mul(0x0000_0100_0000_01b3)
            .rotate_left(29);
    }
    for &b in chunks.remainder() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// A fast hash of one string (as [`FastHasher`] mixes it, without `Hash`'s terminator).
#[inline]
pub(crate) fn fast_hash(s: &str) -> u64 {
    let h = fast_mix(0, s.as_bytes());
    h ^ (h >> 32)
}

/// `a == b` for strings, with short strings compared in registers rather than through a
/// `memcmp` call (names and amounts in slices are mostly short).
#[inline]
pub(crate) fn str_eq(a: &str, b: &str) -> bool {
    #[inline(always)]
    fn w8(s: &[u8], i: usize) -> u64 {
        let mut w = [0u8; 8];
        w.copy_from_slice(&s[i..i + 8]);
        u64::from_ne_bytes(w)
    }
    #[inline(always)]
    fn w4(s: &[u8], i: usize) -> u32 {
        let mut w = [0u8; 4];
        w.copy_from_slice(&s[i..i + 4]);
        u32::from_ne_bytes(w)
    }
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let n = a.len();
    if n != b.len() {
        return false;
    }
    match n {
        0 => true,
        1..=3 => a[0] == b[0] && a[n / 2] == b[n / 2] && a[n - 1] == b[n - 1],
        4..=7 => w4(a, 0) == w4(b, 0) && w4(a, n - 4) == w4(b, n - 4),
        8..=16 => w8(a, 0) == w8(b, 0) && w8(a, n - 8) == w8(b, n - 8),
        _ => a == b,
    }
}

impl std::hash::Hasher for FastHasher {
    fn write(&mut self, bytes: &[u8]) {
        self.0 = fast_mix(self.0, bytes);
    }

    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 32)
    }
}

pub(crate) type FastMap<K, V> = HashMap<K, V, std::hash::BuildHasherDefault<FastHasher>>;

/// A set with [`FastHasher`].
pub(crate) type FastSet<K> =
    std::collections::HashSet<K, std::hash::BuildHasherDefault<FastHasher>>;
