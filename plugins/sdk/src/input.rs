//! The request a policy answers: [`Input`] (the header of the host's message, its claim
//! constraints and candidates) and [`Key`], an attribute or capacity name resolved once.

use alloc::vec::Vec;

use crate::abi::ABI_VERSION;
use crate::candidate::Candidate;
use crate::key::{ANY_DRIVER, Key, NO_NAME};
use crate::message::{CANDIDATE, CONSTRAINT, HEADER, INPUT_MAGIC, Message, NAME, is_ascii, text};

/// Why an input message could not be read (a host/SDK version mismatch; never expected).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeError(pub &'static str);

/// One request and its candidates, read in place from the host's message.
#[derive(Debug, Clone, Copy)]
pub struct Input<'a> {
    message: Message<'a>,
    count: u32,
    constraints: usize,
    constraints_len: usize,
    candidates: usize,
    len: usize,
}

impl<'a> Input<'a> {
    /// Reads an input message (checks its header; records are read when used).
    pub fn decode(bytes: &'a [u8]) -> Result<Input<'a>, DecodeError> {
        if bytes.len() < HEADER || &bytes[0..4] != INPUT_MAGIC {
            return Err(DecodeError("not an input message"));
        }
        let mut message = Message {
            data: bytes,
            strings: 0,
            names: 0,
            names_len: 0,
            ascii: false,
        };
        if message.u32(4) != ABI_VERSION {
            return Err(DecodeError("input is another ABI version"));
        }
        let (strings, strings_len) = (message.usize(56), message.usize(60));
        let (names, names_len) = (message.usize(32), message.usize(36));
        let (constraints, constraints_len) = (message.usize(40), message.usize(44));
        let (candidates, len) = (message.usize(48), message.usize(52));
        let fits = |off: usize, n: usize, size: usize| {
            n.checked_mul(size)
                .and_then(|s| s.checked_add(off))
                .is_some_and(|end| end <= bytes.len())
        };
        if !fits(strings, strings_len, 1)
            || !fits(names, names_len, NAME)
            || !fits(constraints, constraints_len, CONSTRAINT)
            || !fits(candidates, len, CANDIDATE)
        {
            return Err(DecodeError("a region lies outside the message"));
        }
        message.strings = strings;
        message.names = names;
        message.names_len = names_len as u32;
        message.ascii = is_ascii(&bytes[strings..strings + strings_len]);
        Ok(Input {
            message,
            count: message.u32(8),
            constraints,
            constraints_len,
            candidates,
            len,
        })
    }

    /// The claim, as `namespace/name`.
    pub fn claim(&self) -> &'a str {
        self.message.str(16)
    }

    /// `request` or `request/subrequest`.
    pub fn request(&self) -> &'a str {
        self.message.str(24)
    }

    /// How many devices the request wants.
    pub fn count(&self) -> usize {
        self.count as usize
    }

    /// Number of candidates.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when there are no candidates.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Candidate `index` (panics when out of range).
    pub fn candidate(&self, index: usize) -> Candidate<'a> {
        assert!(index < self.len, "candidate index out of range");
        Candidate {
            message: self.message,
            record: self.candidates + index * CANDIDATE,
            index: index as u32,
        }
    }

    /// The candidates, in the allocator's default order.
    pub fn candidates(&self) -> impl ExactSizeIterator<Item = Candidate<'a>> + use<'a> {
        let this = *self;
        (0..self.len).map(move |i| this.candidate(i))
    }

    /// The claim constraints in force for this request.
    pub fn constraints(&self) -> impl Iterator<Item = Constraint<'a>> + use<'a> {
        let (message, base) = (self.message, self.constraints);
        (0..self.constraints_len).map(move |i| {
            let at = base + i * CONSTRAINT;
            Constraint {
                kind: if message.u32(at + 4) == 0 {
                    ConstraintKind::MatchAttribute
                } else {
                    ConstraintKind::DistinctAttribute
                },
                attribute: text(message.name(message.u32(at))),
            }
        })
    }

    /// Resolves an attribute or capacity name once, for fast lookups with
    /// [`Candidate::get`] and [`Candidate::capacity_of`]. A qualified name (`domain/id`) is
    /// taken as it is; a bare name means the id in each candidate's driver's domain.
    pub fn key(&self, name: &str) -> Key {
        let name = name.as_bytes();
        if name.contains(&b'/') {
            return Key {
                ids: self
                    .message
                    .find(name)
                    .map(|id| (ANY_DRIVER, id))
                    .into_iter()
                    .collect(),
            };
        }
        let mut ids: Vec<(u32, u32)> = Vec::new();
        for c in self.candidates() {
            let d = c.driver_id();
            if ids.iter().any(|&(x, _)| x == d) {
                continue;
            }
            // A driver without this name still gets an entry, so it is looked up once.
            let id = self
                .message
                .find_qualified(self.message.name(d), name)
                .unwrap_or(NO_NAME);
            ids.push((d, id));
        }
        Key { ids }
    }
}

/// The kind of a claim constraint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConstraintKind {
    /// All devices must have the same value of the attribute.
    MatchAttribute,
    /// All devices must have different values.
    DistinctAttribute,
}

/// A claim constraint in force for the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Constraint<'a> {
    /// What it demands.
    pub kind: ConstraintKind,
    /// The qualified attribute name.
    pub attribute: &'a str,
}
