//! The contract's names and the output message (ABI version 1); the input message is in
//! [`crate::encode`]. The layout is documented in the crate docs.

/// The ABI version this host speaks.
pub(crate) const ABI_VERSION: u32 = 1;
/// First bytes of an input message.
pub(crate) const INPUT_MAGIC: &[u8; 4] = b"KDPI";
/// First bytes of an output message.
pub(crate) const OUTPUT_MAGIC: &[u8; 4] = b"KDPO";
/// Longest rejection reason, in bytes.
pub(crate) const MAX_REASON_BYTES: usize = 256;

/// How a policy expressed its preference.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecisionKind {
    /// No preference: the input order stands (rejections may still apply).
    Keep,
    /// An explicit order of (some of) the candidates.
    Order,
    /// A score per candidate, higher first.
    Scores,
}

/// Export names of the contract.
pub(crate) const EXPORT_MEMORY: &str = "memory";
pub(crate) const EXPORT_VERSION: &str = "kubedev_policy_abi_version";
pub(crate) const EXPORT_ALLOC: &str = "kubedev_alloc";
pub(crate) const EXPORT_SELECT: &str = "kubedev_select";
/// The optional export declaring what a policy reads.
pub(crate) const EXPORT_INPUTS: &str = "kubedev_policy_inputs";
/// The one import a policy may have.
pub(crate) const IMPORT_MODULE: &str = "kubedev";
pub(crate) const IMPORT_LOG: &str = "log";

/// The standard attribute for a device's NUMA node, shared by DRA drivers.
pub(crate) const NUMA_NODE_ATTRIBUTE: &str = "resource.kubernetes.io/numaNode";

/// Output kinds.
const KIND_KEEP: u8 = 0;
const KIND_ORDER: u8 = 1;
const KIND_SCORES: u8 = 2;

/// What a policy answered, checked against the number of candidates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RawDecision {
    pub(crate) kind: DecisionKind,
    /// Full preference order (a permutation of the candidates), before rejections.
    pub(crate) order: Vec<usize>,
    pub(crate) rejections: Vec<(usize, String)>,
}

struct Reader<'b> {
    buf: &'b [u8],
    at: usize,
}

impl<'b> Reader<'b> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'b [u8], String> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| {
                format!(
                    "output ends at byte {} while reading {what} ({n} bytes needed)",
                    self.buf.len()
                )
            })?;
        let s = &self.buf[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u8(&mut self, what: &str) -> Result<u8, String> {
        Ok(self.take(1, what)?[0])
    }
    fn u32(&mut self, what: &str) -> Result<u32, String> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn i64(&mut self, what: &str) -> Result<i64, String> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(i64::from_le_bytes(a))
    }
}

/// Flags of a candidate while an output is decoded.
const SEEN: u8 = 1;
const REJECTED: u8 = 2;

/// Checks order index `i` of `n` candidates and marks it seen.
#[inline]
fn order_index(flags: &mut [u8], i: usize, n: usize) -> Result<(), String> {
    let Some(f) = flags.get_mut(i) else {
        return Err(format!("order names candidate {i}, there are {n}"));
    };
    if *f & SEEN != 0 {
        return Err(format!("order names candidate {i} twice"));
    }
    *f |= SEEN;
    Ok(())
}

/// Decodes and checks an output message for `n` candidates.
pub(crate) fn decode_output(buf: &[u8], n: usize) -> Result<RawDecision, String> {
    let mut r = Reader { buf, at: 0 };
    let magic = r.take(4, "the magic")?;
    if magic != OUTPUT_MAGIC {
        return Err(format!(
            "output does not start with {:?} but with {:02x?}",
            String::from_utf8_lossy(OUTPUT_MAGIC),
            magic
        ));
    }
    let version = r.u32("the ABI version")?;
    if version != ABI_VERSION {
        return Err(format!(
            "output is ABI version {version}, the host speaks {ABI_VERSION}"
        ));
    }
    let kind = r.u8("the decision kind")?;
    // Per candidate: listed in the order (SEEN), rejected (REJECTED).
    let mut flags = vec![0u8; n];
    let (kind, order) = match kind {
        KIND_KEEP => (DecisionKind::Keep, (0..n).collect()),
        KIND_ORDER => {
            let m = r.u32("the order length")? as usize;
            if m > n {
                return Err(format!("order lists {m} candidates, there are {n}"));
            }
            let mut order = Vec::with_capacity(n);
            match m
                .checked_mul(4)
                .and_then(|len| r.at.checked_add(len))
                .and_then(|end| r.buf.get(r.at..end))
            {
                // The whole list is there: read it without a bounds check per index.
                Some(list) => {
                    r.at += list.len();
                    for w in list.chunks_exact(4) {
                        let i = u32::from_le_bytes([w[0], w[1], w[2], w[3]]) as usize;
                        order_index(&mut flags, i, n)?;
                        order.push(i);
                    }
                }
                // Cut short: read index by index, to fail where the list ends.
                None => {
                    for _ in 0..m {
                        let i = r.u32("an order index")? as usize;
                        order_index(&mut flags, i, n)?;
                        order.push(i);
                    }
                }
            }
            order.extend((0..n).filter(|&i| flags[i] & SEEN == 0));
            (DecisionKind::Order, order)
        }
        KIND_SCORES => {
            let m = r.u32("the score count")? as usize;
            if m != n {
                return Err(format!("{m} scores for {n} candidates"));
            }
            let mut scores = Vec::with_capacity(n);
            for _ in 0..n {
                scores.push(r.i64("a score")?);
            }
            let mut order: Vec<usize> = (0..n).collect();
            // Stable: equal scores keep the input order.
            order.sort_by_key(|&i| std::cmp::Reverse(scores[i]));
            (DecisionKind::Scores, order)
        }
        other => return Err(format!("unknown decision kind {other}")),
    };
    let nrej = r.u32("the rejection count")? as usize;
    if nrej > n {
        return Err(format!("{nrej} rejections for {n} candidates"));
    }
    let mut rejections = Vec::with_capacity(nrej);
    for _ in 0..nrej {
        let i = r.u32("a rejected index")? as usize;
        if i >= n {
            return Err(format!("rejection names candidate {i}, there are {n}"));
        }
        if flags[i] & REJECTED != 0 {
            return Err(format!("candidate {i} is rejected twice"));
        }
        flags[i] |= REJECTED;
        let len = r.u32("a reason length")? as usize;
        if len > MAX_REASON_BYTES {
            return Err(format!(
                "rejection reason of candidate {i} has {len} bytes, the limit is {MAX_REASON_BYTES}"
            ));
        }
        let bytes = r.take(len, "a rejection reason")?;
        let reason = std::str::from_utf8(bytes).map_err(|e| {
            format!(
                "rejection reason of candidate {i} is not UTF-8: {}",
                kubedev_core::echo::chain(&e)
            )
        })?;
        rejections.push((i, reason.to_string()));
    }
    if r.at != buf.len() {
        return Err(format!(
            "{} bytes after the end of the output message",
            buf.len() - r.at
        ));
    }
    Ok(RawDecision {
        kind,
        order,
        rejections,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn out(kind: u8, body: &[u8], rejections: &[(u32, &str)]) -> Vec<u8> {
        let mut v = OUTPUT_MAGIC.to_vec();
        v.extend_from_slice(&1u32.to_le_bytes());
        v.push(kind);
        v.extend_from_slice(body);
        v.extend_from_slice(&(rejections.len() as u32).to_le_bytes());
        for (i, r) in rejections {
            v.extend_from_slice(&i.to_le_bytes());
            v.extend_from_slice(&(r.len() as u32).to_le_bytes());
            v.extend_from_slice(r.as_bytes());
        }
        v
    }

    fn u32s(v: &[u32]) -> Vec<u8> {
        let mut b = (v.len() as u32).to_le_bytes().to_vec();
        for x in v {
            b.extend_from_slice(&x.to_le_bytes());
        }
        b
    }

    #[test]
    fn partial_order_puts_unlisted_candidates_after_in_input_order() {
        let d = decode_output(&out(KIND_ORDER, &u32s(&[3, 1]), &[]), 5).unwrap();
        assert_eq!(d.order, vec![3, 1, 0, 2, 4]);
    }

    #[test]
    fn scores_sort_descending_and_ties_keep_input_order() {
        let mut body = 4u32.to_le_bytes().to_vec();
        for s in [1i64, 5, 1, 7] {
            body.extend_from_slice(&s.to_le_bytes());
        }
        let d = decode_output(&out(KIND_SCORES, &body, &[(0, "too slow")]), 4).unwrap();
        assert_eq!(d.order, vec![3, 1, 0, 2]);
        assert_eq!(d.rejections, vec![(0, "too slow".to_string())]);
    }

    #[test]
    fn malformed_outputs_are_named() {
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (b"nope".to_vec(), "does not start"),
            (out(KIND_ORDER, &u32s(&[0, 0]), &[]), "twice"),
            (out(KIND_ORDER, &u32s(&[9]), &[]), "candidate 9"),
            (out(KIND_ORDER, &u32s(&[0, 1, 2, 3]), &[]), "4 candidates"),
            (out(7, &[], &[]), "unknown decision kind 7"),
            (out(KIND_KEEP, &[], &[(1, "a"), (1, "b")]), "rejected twice"),
            (
                out(KIND_KEEP, &[], &[(0, &"x".repeat(300))]),
                "has 300 bytes",
            ),
            (
                [out(KIND_KEEP, &[], &[]), vec![0]].concat(),
                "1 bytes after",
            ),
            (out(KIND_SCORES, &u32s(&[1]), &[]), "1 scores for 3"),
            (
                out(KIND_ORDER, &u32s(&[1, 2]), &[])[..17].to_vec(),
                "while reading an order index",
            ),
            (
                out(KIND_ORDER, &u32s(&[5, 2]), &[])[..17].to_vec(),
                "order names candidate 5",
            ),
        ];
        for (bytes, want) in cases {
            let err = decode_output(&bytes, 3).unwrap_err();
            assert!(err.contains(want), "{err:?} should contain {want:?}");
        }
    }
}
