//! The input message as the host lays it out (ABI version 1): the sizes of its records, the
//! tags of attribute values, and [`Message`], which reads records, names and strings in place.

/// The first four bytes of an input message.
pub(crate) const INPUT_MAGIC: &[u8; 4] = b"KDPI";

/// Record sizes, bytes.
pub(crate) const HEADER: usize = 64;
pub(crate) const CANDIDATE: usize = 64;
pub(crate) const CONSTRAINT: usize = 8;
pub(crate) const ATTRIBUTE: usize = 16;
pub(crate) const CAPACITY: usize = 24;
pub(crate) const COUNTER_SET: usize = 16;
pub(crate) const COUNTER: usize = 16;
pub(crate) const NAME: usize = 8;

/// Attribute value tags (any other tag is a version).
pub(crate) const TAG_INT: u8 = 0;
pub(crate) const TAG_BOOL: u8 = 1;
pub(crate) const TAG_STRING: u8 = 2;

/// True when every byte is below 0x80, checked eight bytes at a time.
pub(crate) fn is_ascii(bytes: &[u8]) -> bool {
    let mut words = bytes.chunks_exact(8);
    words.by_ref().all(|w| {
        u64::from_ne_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]) & 0x8080_8080_8080_8080
            == 0
    }) && words.remainder().iter().all(|b| *b < 0x80)
}

/// UTF-8 text of host bytes. Names and values are nearly always ASCII: checking that is a
/// few operations per word, where full validation costs a few hundred per string.
#[inline]
pub(crate) fn text(bytes: &[u8]) -> &str {
    if is_ascii(bytes) {
        #[allow(unsafe_code)]
        // SAFETY: every byte is below 0x80, so the bytes are ASCII, which is valid UTF-8.
        unsafe {
            core::str::from_utf8_unchecked(bytes)
        }
    } else {
        core::str::from_utf8(bytes).unwrap_or("")
    }
}

/// The message, read in place. Reads out of bounds panic (a trap: the host keeps its
/// default order); the host never sends such a message.
#[derive(Clone, Copy)]
pub(crate) struct Message<'a> {
    /// The whole message.
    pub(crate) data: &'a [u8],
    /// Where the string region starts.
    pub(crate) strings: usize,
    /// Where the name table starts.
    pub(crate) names: usize,
    /// How many names the table holds.
    pub(crate) names_len: u32,
    /// The whole string region is ASCII, so every span is valid UTF-8 without a check.
    pub(crate) ascii: bool,
}

impl core::fmt::Debug for Message<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Message")
            .field("bytes", &self.data.len())
            .finish()
    }
}

impl<'a> Message<'a> {
    #[inline(always)]
    pub(crate) fn u32(&self, at: usize) -> u32 {
        let mut a = [0u8; 4];
        a.copy_from_slice(&self.data[at..at + 4]);
        u32::from_le_bytes(a)
    }

    #[inline(always)]
    pub(crate) fn i64(&self, at: usize) -> i64 {
        let mut a = [0u8; 8];
        a.copy_from_slice(&self.data[at..at + 8]);
        i64::from_le_bytes(a)
    }

    #[inline(always)]
    pub(crate) fn usize(&self, at: usize) -> usize {
        self.u32(at) as usize
    }

    /// The bytes of the span at `at`.
    #[inline]
    pub(crate) fn bytes(&self, at: usize) -> &'a [u8] {
        let off = self.strings + self.usize(at);
        &self.data[off..off + self.usize(at + 4)]
    }

    /// The text of the span at `at`.
    pub(crate) fn str(&self, at: usize) -> &'a str {
        self.text_of(self.bytes(at))
    }

    /// The text of the span of `len` bytes at `off` in the string region.
    #[inline]
    pub(crate) fn span(&self, off: u32, len: u32) -> &'a str {
        let off = self.strings + off as usize;
        self.text_of(&self.data[off..off + len as usize])
    }

    /// Bytes of the string region (only those) as text.
    #[inline]
    fn text_of(&self, bytes: &'a [u8]) -> &'a str {
        if self.ascii {
            #[allow(unsafe_code)]
            // SAFETY: the string region is all ASCII (checked once in `Input::decode`), so
            // every slice of it is valid UTF-8.
            unsafe {
                core::str::from_utf8_unchecked(bytes)
            }
        } else {
            text(bytes)
        }
    }

    /// The text of name `id`.
    pub(crate) fn name(&self, id: u32) -> &'a [u8] {
        if id >= self.names_len {
            return &[];
        }
        self.bytes(self.names + id as usize * NAME)
    }

    /// The id of the name whose text is `text`.
    pub(crate) fn find(&self, text: &[u8]) -> Option<u32> {
        (0..self.names_len).find(|&id| self.name(id) == text)
    }

    /// The id of `driver/bare`.
    pub(crate) fn find_qualified(&self, driver: &[u8], bare: &[u8]) -> Option<u32> {
        (0..self.names_len).find(|&id| {
            let n = self.name(id);
            n.len() == driver.len() + 1 + bare.len()
                && n.starts_with(driver)
                && n[driver.len()] == b'/'
                && n.ends_with(bare)
        })
    }
}

#[cfg(test)]
mod tests {
    extern crate std;

    use super::*;

    #[test]
    fn ascii_is_checked_word_by_word() {
        assert!(is_ascii(b"pci0000:00 and a longer tail"));
        assert!(!is_ascii("ascii then \u{e9}".as_bytes()));
        assert!(!is_ascii("\u{e9}".as_bytes()));
        assert_eq!(text("gr\u{fc}n".as_bytes()), "gr\u{fc}n");
        assert_eq!(text(&[0xff, 0xfe]), "");
    }
}
