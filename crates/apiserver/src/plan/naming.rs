//! Slice names: the hex index a slice name starts with, and the `generateName` of a new
//! slice.

use super::Identity;

/// The shortest slice index in a name, in hex digits.
const MIN_INDEX_LEN: usize = 5;
/// The longest `generateName` the API server keeps (it appends five random characters to at
/// most this many).
const MAX_GENERATE_NAME_LEN: usize = 58;

/// Hex digits needed for the indexes of `slices` slices (at least five).
pub(crate) fn index_len(slices: usize) -> usize {
    let highest = slices.saturating_sub(1);
    let digits = format!("{highest:x}").len();
    digits.max(MIN_INDEX_LEN)
}

/// The index prefix of a slice name.
pub(crate) fn encode_index(index: usize, len: usize) -> String {
    format!("{index:0len$x}")
}

/// The index a slice name starts with, if it starts with exactly `len` hex digits and a '-'.
pub(crate) fn decode_index(name: &str, len: usize) -> Option<usize> {
    let dash = name.find('-')?;
    if dash != len {
        return None;
    }
    let prefix = &name[..dash];
    if !prefix
        .bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return None;
    }
    usize::from_str_radix(prefix, 16).ok()
}

/// `<index>-<driver>-<node>-`, lowercased, with anything a DNS subdomain cannot hold replaced
/// by '-', cut to the length the API server keeps.
pub(crate) fn generate_name(index: usize, len: usize, id: &Identity) -> String {
    let raw = format!("{}-{}-{}-", encode_index(index, len), id.driver, id.node);
    let mut name: String = raw
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    name.truncate(MAX_GENERATE_NAME_LEN);
    name
}
