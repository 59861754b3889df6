//! A policy's answer, [`Decision`], and the output message it becomes.

use alloc::string::String;
use alloc::vec::Vec;

use crate::abi::{ABI_VERSION, MAX_REASON_BYTES};

/// The first four bytes of an output message.
const OUTPUT_MAGIC: &[u8; 4] = b"KDPO";

/// What a decision asks of the order: nothing, an order, or scores.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    Keep,
    Order(Vec<u32>),
    Scores(Vec<i64>),
}

/// A policy's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    kind: Kind,
    rejections: Vec<(u32, String)>,
}

impl Decision {
    /// No preference: keep the allocator's order.
    pub fn keep() -> Self {
        Decision {
            kind: Kind::Keep,
            rejections: Vec::new(),
        }
    }

    /// Candidate indices, most preferred first. Candidates left out follow in input order;
    /// an index must not repeat.
    pub fn order(order: Vec<u32>) -> Self {
        Decision {
            kind: Kind::Order(order),
            rejections: Vec::new(),
        }
    }

    /// One score per candidate, in input order; higher is preferred, ties keep input order.
    pub fn scores(scores: Vec<i64>) -> Self {
        Decision {
            kind: Kind::Scores(scores),
            rejections: Vec::new(),
        }
    }

    /// Rejects a candidate, with a reason (cut to [`MAX_REASON_BYTES`]).
    pub fn reject(mut self, index: u32, reason: &str) -> Self {
        let mut cut = reason.len().min(MAX_REASON_BYTES);
        while !reason.is_char_boundary(cut) {
            cut -= 1;
        }
        self.rejections.push((index, String::from(&reason[..cut])));
        self
    }

    /// The output message.
    pub fn encode(&self) -> Vec<u8> {
        let items = match &self.kind {
            Kind::Keep => 0,
            Kind::Order(o) => 4 + o.len() * 4,
            Kind::Scores(s) => 4 + s.len() * 8,
        };
        let reasons: usize = self.rejections.iter().map(|(_, r)| 8 + r.len()).sum();
        let mut out = Vec::with_capacity(13 + items + 4 + reasons);
        out.extend_from_slice(OUTPUT_MAGIC);
        out.extend_from_slice(&ABI_VERSION.to_le_bytes());
        // Lists are written with plain stores into space reserved once.
        fn words<const N: usize, T: Copy>(out: &mut Vec<u8>, items: &[T], bytes: fn(T) -> [u8; N]) {
            out.extend_from_slice(&(items.len() as u32).to_le_bytes());
            let start = out.len();
            out.resize(start + items.len() * N, 0);
            for (chunk, &item) in out[start..].chunks_exact_mut(N).zip(items) {
                chunk.copy_from_slice(&bytes(item));
            }
        }
        match &self.kind {
            Kind::Keep => out.push(0),
            Kind::Order(o) => {
                out.push(1);
                words(&mut out, o, u32::to_le_bytes);
            }
            Kind::Scores(s) => {
                out.push(2);
                words(&mut out, s, i64::to_le_bytes);
            }
        }
        out.extend_from_slice(&(self.rejections.len() as u32).to_le_bytes());
        for (i, reason) in &self.rejections {
            out.extend_from_slice(&i.to_le_bytes());
            out.extend_from_slice(&(reason.len() as u32).to_le_bytes());
            out.extend_from_slice(reason.as_bytes());
        }
        out
    }
}
