//! Which slices a node's view reads. The first node of an allocator scans every slice (one
//! pass, nothing built); from the second node on, an index built once per allocator (slices by
//! node name, the slices of no single node, and the slices of each pool) gives each node its
//! own slices and the cluster-wide ones, so a scheduler's pass over all nodes of a cluster costs
//! in proportion to the slices, not nodes × slices.

use std::collections::HashMap;

use crate::api::ResourceSlice;

/// Slices by node and by pool, in their original order (names borrowed from the slices).
#[derive(Debug, Default)]
pub(crate) struct SliceIndex<'a> {
    by_node: HashMap<&'a str, Vec<usize>>,
    /// Slices without a node name: all nodes, a node selector, per-device node selection,
    /// counter sets only.
    elsewhere: Vec<usize>,
    by_pool: HashMap<(&'a str, &'a str), Vec<usize>>,
}

impl<'a> SliceIndex<'a> {
    pub(crate) fn new(slices: &'a [ResourceSlice]) -> SliceIndex<'a> {
        let mut index = SliceIndex::default();
        for (i, s) in slices.iter().enumerate() {
            match s.spec.node_name.as_deref().filter(|n| !n.is_empty()) {
                // A slice of counter sets only is read by every node its pool serves.
                Some(n) if s.spec.shared_counters.is_empty() || !s.spec.devices.is_empty() => {
                    index.by_node.entry(n).or_default().push(i);
                }
                _ => index.elsewhere.push(i),
            }
            index
                .by_pool
                .entry((s.spec.driver.as_str(), s.spec.pool.name.as_str()))
                .or_default()
                .push(i);
        }
        index
    }

    /// The slices that may serve `node`, in their original order: the node's own and those of
    /// no single node. Every other slice names another node.
    pub(crate) fn for_node<'s>(
        &self,
        slices: &'s [ResourceSlice],
        node: &str,
    ) -> Vec<&'s ResourceSlice> {
        let own = self.by_node.get(node).map(Vec::as_slice).unwrap_or(&[]);
        let mut out = Vec::with_capacity(own.len() + self.elsewhere.len());
        let (mut a, mut b) = (own.iter().peekable(), self.elsewhere.iter().peekable());
        loop {
            let next = match (a.peek(), b.peek()) {
                (Some(&&x), Some(&&y)) if x < y => a.next(),
                (Some(_), Some(_)) => b.next(),
                (Some(_), None) => a.next(),
                (None, Some(_)) => b.next(),
                (None, None) => break,
            };
            if let Some(&i) = next {
                out.push(&slices[i]);
            }
        }
        out
    }

    /// Every slice of a pool, in original order.
    pub(crate) fn pool<'s>(
        &self,
        slices: &'s [ResourceSlice],
        driver: &str,
        pool: &str,
    ) -> Vec<&'s ResourceSlice> {
        self.by_pool
            .get(&(driver, pool))
            .map(|v| v.iter().map(|&i| &slices[i]).collect())
            .unwrap_or_default()
    }
}
