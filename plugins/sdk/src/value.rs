//! [`Value`], a typed attribute value, with equality and hashing made cheap for grouping.

/// A typed attribute value.
///
/// Equality and hashing are by content, made cheap for grouping: the host stores an equal
/// string value of consecutive candidates once, so two values read from the same place
/// compare equal without comparing their bytes, and a string hashes only its length and
/// its first and last eight bytes.
#[derive(Debug, Clone, Copy, Eq, PartialOrd, Ord)]
pub enum Value<'a> {
    /// An integer.
    Int(i64),
    /// A boolean.
    Bool(bool),
    /// A string.
    String(&'a str),
    /// A semantic version, as written.
    Version(&'a str),
}

/// Content equality with a shortcut for the same bytes in the message.
#[inline]
fn same_text(a: &str, b: &str) -> bool {
    a.len() == b.len() && (core::ptr::eq(a.as_ptr(), b.as_ptr()) || a == b)
}

impl PartialEq for Value<'_> {
    #[inline]
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Value::Int(a), Value::Int(b)) => a == b,
            (Value::Bool(a), Value::Bool(b)) => a == b,
            (Value::String(a), Value::String(b)) | (Value::Version(a), Value::Version(b)) => {
                same_text(a, b)
            }
            _ => false,
        }
    }
}

/// The first and last (up to) eight bytes of `s`, as words.
#[inline]
fn ends(s: &[u8]) -> (u64, u64) {
    let n = s.len();
    if n >= 8 {
        let mut first = [0u8; 8];
        let mut last = [0u8; 8];
        first.copy_from_slice(&s[..8]);
        last.copy_from_slice(&s[n - 8..]);
        return (u64::from_le_bytes(first), u64::from_le_bytes(last));
    }
    let mut w = 0u64;
    for (i, &b) in s.iter().enumerate() {
        w |= u64::from(b) << (8 * i);
    }
    (w, w)
}

impl core::hash::Hash for Value<'_> {
    fn hash<H: core::hash::Hasher>(&self, state: &mut H) {
        match self {
            Value::Int(i) => {
                state.write_u8(0);
                state.write_i64(*i);
            }
            Value::Bool(b) => state.write_u8(if *b { 2 } else { 1 }),
            Value::String(s) | Value::Version(s) => {
                let (first, last) = ends(s.as_bytes());
                state.write_u8(if matches!(self, Value::String(_)) {
                    3
                } else {
                    4
                });
                state.write_usize(s.len());
                state.write_u64(first);
                state.write_u64(last);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    extern crate std;

    use alloc::string::String;

    use super::*;
    use crate::grouping::hash_of;

    #[test]
    fn values_compare_and_hash_by_content() {
        let a = String::from("pci0000:00");
        let b = String::from("pci0000:00");
        let c = String::from("pci0000:01");
        let (va, vb, vc) = (Value::String(&a), Value::String(&b), Value::String(&c));
        assert_eq!(va, vb, "equal text at different addresses");
        assert_eq!(va, Value::String(&a[..]));
        assert_ne!(va, vc);
        assert_ne!(va, Value::Version(&a));
        assert_eq!(hash_of(&va), hash_of(&vb));
        assert_ne!(hash_of(&Value::Int(1)), hash_of(&Value::Int(2)));
        // Short strings and long strings that differ only in the middle still compare right.
        let long1 = "aaaaaaaaXbbbbbbbb";
        let long2 = "aaaaaaaaYbbbbbbbb";
        assert_ne!(Value::String(long1), Value::String(long2));
        assert_eq!(hash_of(&Value::String("ab")), hash_of(&Value::String("ab")));
        assert_ne!(Value::String("ab"), Value::String("ac"));
    }
}
