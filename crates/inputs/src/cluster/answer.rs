//! The question asked of a cluster: the claims a subject needs, the devices other claims
//! hold, every node's answer (fits, or why not), and the answer as text.

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::fmt::Write as _;

use super::read::name_of;
use super::{Cluster, ClusterAnswer, NodeAnswer, Subject};
use kubedev_allocator::api::{Node, ResourceClaim, ResourceSlice, apply_device_taint_rules};
use kubedev_allocator::{AllocateOptions, Allocator};

/// Nodes a thread answers for at a time (see `par.rs`).
const NODES_PER_BLOCK: usize = 64;

impl Cluster {
    /// The position of claim `key` (`namespace/name`, or `name` for a claim without a
    /// namespace) in [`Cluster::claims`].
    fn claim_index(&self, key: &str) -> Option<usize> {
        self.claims.iter().position(|(c, _)| {
            let (ns, name) = (c.metadata.namespace.as_str(), c.metadata.name.as_str());
            let qualified = key
                .strip_prefix(ns)
                .and_then(|rest| rest.strip_prefix('/'))
                .is_some_and(|rest| rest == name);
            qualified || (ns.is_empty() && key == name)
        })
    }

    /// The claims `subject` needs, `namespace/name`.
    fn subject_claims(&self, subject: &Subject) -> Result<Vec<String>, String> {
        match subject {
            Subject::Claim(c) => Ok(vec![c.clone()]),
            Subject::Pod(p) => {
                let pod = self
                    .pods
                    .iter()
                    .find(|v| name_of(v) == *p)
                    .ok_or_else(|| format!("pod {p} is not in the input"))?;
                let ns = pod["metadata"]["namespace"].as_str().unwrap_or("default");
                let statuses = pod["status"]["resourceClaimStatuses"].as_array();
                let mut out = Vec::new();
                for rc in pod["spec"]["resourceClaims"]
                    .as_array()
                    .into_iter()
                    .flatten()
                {
                    let entry = rc["name"].as_str().unwrap_or_default();
                    let name = match rc["resourceClaimName"].as_str() {
                        Some(n) => n.to_string(),
                        None => statuses
                            .into_iter()
                            .flatten()
                            .find(|s| s["name"] == entry)
                            .and_then(|s| s["resourceClaimName"].as_str())
                            .ok_or_else(|| {
                                format!(
                                    "pod {p}: the claim of its entry {entry:?} (from a template) \
                                     is not created yet (no status.resourceClaimStatuses)"
                                )
                            })?
                            .to_string(),
                    };
                    out.push(format!("{ns}/{name}"));
                }
                if out.is_empty() {
                    return Err(format!("pod {p} has no resource claims"));
                }
                Ok(out)
            }
        }
    }

    /// Which nodes can take `subject`'s claims, and why each other node cannot.
    pub fn explain(&self, subject: &Subject) -> Result<ClusterAnswer, String> {
        let wanted = self.subject_claims(subject)?;
        let (claims, already) = self.split_allocated(&wanted)?;
        let nodes = self.nodes_to_explain();
        let options = AllocateOptions::default();
        let features = kubedev_allocator::Features::default()
            .with_list_type_attributes(self.has_list_type_attributes())
            .with_optional_node_operations(self.slices.iter().any(|s| {
                // The API server keeps `skipNodeOperations` only with DRAOptionalNodeOperations
                // on: a slice that has it says the gate is on.
                !s.spec.skip_node_operations.is_empty()
            }));
        // Each node's answer is independent of the others': the nodes are answered on every
        // core, each thread with its own allocator (forks of one, sharing what it built), and
        // the answers kept in the nodes' order.
        // The slices as the scheduler sees them: with the DeviceTaintRules' taints.
        let tainted;
        let slices: &[ResourceSlice] = if self.taint_rules.is_empty() {
            &self.slices
        } else {
            let mut copy = self.slices.clone();
            apply_device_taint_rules(&mut copy, &self.taint_rules);
            tainted = copy;
            &tainted
        };
        let mut allocator = Allocator::new(slices, &self.classes, &self.in_use)
            .with_consumed_capacity(&self.consumed)
            .with_features(features);
        let threads = super::par::threads_for(nodes.len(), NODES_PER_BLOCK);
        let mut allocators: Vec<Allocator<'_>> = Vec::with_capacity(threads);
        if threads > 1 {
            allocators.extend((1..threads).map(|_| allocator.fork()));
        }
        allocators.push(allocator);
        let blocks = super::par::map_blocks(
            nodes.len(),
            NODES_PER_BLOCK,
            allocators,
            |allocator, range| {
                nodes[range]
                    .iter()
                    .map(|node| node_answer(allocator, node, &claims, &options))
                    .collect::<Vec<_>>()
            },
            |_| false,
        );
        let mut answers: Vec<NodeAnswer> = blocks.into_iter().flatten().collect();
        answers.sort_by_key(|a| !a.fits);
        Ok(ClusterAnswer {
            claims: wanted
                .into_iter()
                .filter(|w| !already.contains(w))
                .collect(),
            already_allocated: already,
            nodes: answers,
        })
    }

    /// The `wanted` claims still to allocate, and those already allocated (`namespace/name`);
    /// a claim not in the input is an error.
    fn split_allocated(
        &self,
        wanted: &[String],
    ) -> Result<(Vec<ResourceClaim>, Vec<String>), String> {
        let mut claims = Vec::new();
        let mut already = Vec::new();
        for key in wanted {
            let i = self
                .claim_index(key)
                .ok_or_else(|| format!("claim {key} is not in the input"))?;
            if self.claims[i].1.is_empty() {
                claims.push(self.claims[i].0.clone());
            } else {
                already.push(key.clone());
            }
        }
        Ok((claims, already))
    }

    /// The nodes read, or without any, the nodes the slices name (without labels).
    fn nodes_to_explain(&self) -> Cow<'_, [Node]> {
        if !self.nodes.is_empty() {
            return Cow::Borrowed(&self.nodes);
        }
        let names: BTreeSet<&str> = self
            .slices
            .iter()
            .filter_map(|s| s.spec.node_name.as_deref())
            .collect();
        names
            .into_iter()
            .map(|n| Node {
                name: n.to_string(),
                ..Node::default()
            })
            .collect::<Vec<_>>()
            .into()
    }

    /// Whether a slice has a list-type attribute: the API server keeps those only with
    /// DRAListTypeAttributes on, so a slice that has one says the gate is on.
    fn has_list_type_attributes(&self) -> bool {
        self.slices.iter().any(|s| {
            s.spec.devices.iter().any(|d| {
                d.attributes.values().any(|a| {
                    a.ints.is_some()
                        || a.bools.is_some()
                        || a.strings.is_some()
                        || a.versions.is_some()
                })
            })
        })
    }
}

/// Whether `claims` fit `node`, and if not why (the explanation's pool and request lines),
/// or the error that stopped the allocator.
fn node_answer(
    allocator: &mut Allocator<'_>,
    node: &Node,
    claims: &[ResourceClaim],
    options: &AllocateOptions<'_>,
) -> NodeAnswer {
    if claims.is_empty() {
        return NodeAnswer {
            node: node.name.clone(),
            fits: true,
            reasons: Vec::new(),
        };
    }
    match allocator.allocate(node, claims, options) {
        Ok(Some(_)) => NodeAnswer {
            node: node.name.clone(),
            fits: true,
            reasons: Vec::new(),
        },
        Ok(None) => {
            let reasons = match allocator.explain_with(node, claims, options) {
                Ok(e) => e.pools.iter().cloned().chain(e.summary).collect(),
                Err(e) => vec![kubedev_core::echo::chain(&e)],
            };
            NodeAnswer {
                node: node.name.clone(),
                fits: false,
                reasons,
            }
        }
        Err(e) => NodeAnswer {
            node: node.name.clone(),
            fits: false,
            reasons: vec![kubedev_core::echo::chain(&e)],
        },
    }
}

impl ClusterAnswer {
    /// The `-o text` form: a summary first (how many nodes fit, which reasons keep the others
    /// out and how often), then with `details` each node that does not fit and why.
    pub fn to_text(&self, details: bool) -> String {
        let mut s = String::new();
        let fit: Vec<&str> = self
            .nodes
            .iter()
            .filter(|n| n.fits)
            .map(|n| n.node.as_str())
            .collect();
        if !self.already_allocated.is_empty() {
            let _ = writeln!(
                s,
                "already allocated: {}",
                self.already_allocated.join(", ")
            );
        }
        let _ = writeln!(
            s,
            "{} of {} nodes can take {}",
            fit.len(),
            self.nodes.len(),
            if self.claims.is_empty() {
                "the claims (nothing left to allocate)".to_string()
            } else {
                self.claims.join(", ")
            }
        );
        if !fit.is_empty() {
            let shown: Vec<&str> = fit.iter().take(10).copied().collect();
            let more = fit.len().saturating_sub(shown.len());
            let _ = writeln!(
                s,
                "  fit: {}{}",
                shown.join(", "),
                if more > 0 {
                    format!(" and {more} more")
                } else {
                    String::new()
                }
            );
        }
        let mut counts: std::collections::BTreeMap<&str, usize> = Default::default();
        for n in self.nodes.iter().filter(|n| !n.fits) {
            for r in &n.reasons {
                *counts.entry(r.as_str()).or_default() += 1;
            }
        }
        if !counts.is_empty() {
            let _ = writeln!(s, "why the other nodes do not fit (nodes: reason):");
            let mut by_count: Vec<(&str, usize)> = counts.into_iter().collect();
            by_count.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
            for (reason, n) in by_count {
                let _ = writeln!(s, "  {n}: {reason}");
            }
        }
        if details {
            for n in self.nodes.iter().filter(|n| !n.fits) {
                let _ = writeln!(s, "node {}:", n.node);
                for r in &n.reasons {
                    let _ = writeln!(s, "  {r}");
                }
            }
        }
        s
    }
}
