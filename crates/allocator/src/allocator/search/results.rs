//! The allocation results of a finished search: each claim's devices with their requests,
//! tolerations and consumed capacity, the configuration of their classes and claim, and the
//! node selector the allocation binds the pod to.

use std::collections::HashSet;

use kubedev_core::Quantity;

use super::Search;
use crate::allocator::ClaimPlan;
use crate::api::{
    AllocationResult, CompactString, DeviceAllocationConfiguration, DeviceAllocationResult,
    DeviceClass, DeviceRequestAllocationResult, Node, NodeSelector, NodeSelectorRequirement,
    NodeSelectorTerm,
};
use crate::error::AllocationError;
use crate::model::NodeDevice;

impl Search<'_, '_, '_> {
    /// Builds the `status.allocation` of every claim.
    pub(crate) fn results(
        &self,
        node: &Node,
        classes: &[DeviceClass],
    ) -> Result<Vec<AllocationResult>, AllocationError> {
        let mut out = Vec::with_capacity(self.plan.len());
        // The text of each amount consumed, written once (shares mostly consume the same).
        let mut amounts: Vec<(Quantity, String)> = Vec::new();
        for (ci, cp) in self.plan.iter().enumerate() {
            let mut results = Vec::with_capacity(self.chosen[ci].len());
            // The hash of the claim's part of its share IDs, made for its first share.
            let mut claim_hash = None;
            for (k, c) in self.chosen[ci].iter().enumerate() {
                let sp = &cp.requests[c.req].subs[c.sub];
                let dev = &self.view.devices[c.dev as usize];
                let mut consumed_capacity = std::collections::BTreeMap::new();
                let mut share_id = None;
                if let Some(range) = &c.share {
                    let consumed = &self.share_amounts[range.start as usize..range.end as usize];
                    for (cap, q) in dev.capacity().iter().zip(consumed) {
                        consumed_capacity.insert(cap.key.to_string(), amount_text(&mut amounts, q));
                    }
                    let claim_hash = claim_hash.get_or_insert_with(|| ShareHash::claim(cp));
                    share_id = Some(share_id_for(claim_hash, &sp.full_name, dev, k));
                }
                results.push(DeviceRequestAllocationResult {
                    request: CompactString::from(&*sp.full_name),
                    driver: dev.driver().into(),
                    pool: dev.pool_name().into(),
                    device: dev.device.name.as_str().into(),
                    admin_access: sp.admin.then_some(true),
                    tolerations: sp.tolerations.to_vec(),
                    binding_conditions: dev.device.binding_conditions.clone(),
                    binding_failure_conditions: dev.device.binding_failure_conditions.clone(),
                    share_id,
                    consumed_capacity,
                    skip_node_operations: dev.skip_node_operations.to_vec(),
                });
            }
            let config = self.configs(ci, classes);
            let node_selector =
                self.node_selector(ci, node)
                    .map_err(|message| AllocationError::NodeSelection {
                        message: format!(
                            "create NodeSelector for claim {}: {message}",
                            cp.claim.metadata.name
                        ),
                    })?;
            out.push(AllocationResult {
                devices: DeviceAllocationResult { results, config },
                node_selector,
            });
        }
        Ok(out)
    }

    fn selected_sub(&self, ci: usize, ri: usize) -> usize {
        if self.plan[ci].requests[ri].first_available {
            self.selected[ci][ri]
        } else {
            0
        }
    }

    fn configs(&self, ci: usize, classes: &[DeviceClass]) -> Vec<DeviceAllocationConfiguration> {
        let cp = &self.plan[ci];
        let mut config: Vec<DeviceAllocationConfiguration> = Vec::new();
        // The configuration entries of each class with configuration: class, their range.
        let mut by_class: Vec<(usize, (usize, usize))> = Vec::new();
        for (ri, rp) in cp.requests.iter().enumerate() {
            let sp = &rp.subs[self.selected_sub(ci, ri)];
            let class_config = &classes[sp.class].spec.config;
            if class_config.is_empty() {
                continue;
            }
            if let Some(&(_, (start, end))) = by_class.iter().find(|(c, _)| *c == sp.class) {
                for c in &mut config[start..end] {
                    c.requests.push(sp.full_name.to_string());
                }
                continue;
            }
            let start = config.len();
            for cc in class_config {
                config.push(DeviceAllocationConfiguration {
                    source: "FromClass".into(),
                    requests: vec![sp.full_name.to_string()],
                    opaque: cc.opaque.clone(),
                });
            }
            by_class.push((sp.class, (start, config.len())));
        }
        for cc in &cp.claim.spec.devices.config {
            if cc.requests.is_empty() {
                config.push(DeviceAllocationConfiguration {
                    source: "FromClaim".into(),
                    requests: Vec::new(),
                    opaque: cc.opaque.clone(),
                });
                continue;
            }
            for (ri, rp) in cp.requests.iter().enumerate() {
                let name = &cp.claim.spec.devices.requests[ri].name;
                let applies = cc.requests.contains(name)
                    || (rp.first_available
                        && cc
                            .requests
                            .iter()
                            .any(|r| *r == *rp.subs[self.selected_sub(ci, ri)].full_name));
                if applies {
                    config.push(DeviceAllocationConfiguration {
                        source: "FromClaim".into(),
                        requests: cc.requests.clone(),
                        opaque: cc.opaque.clone(),
                    });
                    break;
                }
            }
        }
        // An entry that names every request of the claim (each by its name, or by its chosen
        // subrequest's) applies to all: its list is cleared, as empty means all.
        for entry in &mut config {
            if entry.requests.is_empty() {
                continue;
            }
            let applies_to_all = cp.requests.iter().enumerate().all(|(ri, rp)| {
                let name = &cp.claim.spec.devices.requests[ri].name;
                entry.requests.contains(name)
                    || (rp.first_available
                        && entry
                            .requests
                            .iter()
                            .any(|r| *r == *rp.subs[self.selected_sub(ci, ri)].full_name))
            });
            if applies_to_all {
                entry.requests.clear();
            }
        }
        config
    }

    fn node_selector(&self, ci: usize, node: &Node) -> Result<Option<NodeSelector>, String> {
        let mut term = NodeSelectorTerm::default();
        for c in &self.chosen[ci] {
            let dev = &self.view.devices[c.dev as usize];
            let spec = &dev.slice.spec;
            let (name, selector) = if spec.per_device_node_selection.unwrap_or(false) {
                (
                    dev.device.node_name.as_deref(),
                    dev.device.node_selector.as_ref(),
                )
            } else {
                (spec.node_name.as_deref(), spec.node_selector.as_ref())
            };
            if name.is_some_and(|n| !n.is_empty()) || dev.binds_to_node {
                return Ok(Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm {
                        match_expressions: Vec::new(),
                        match_fields: vec![NodeSelectorRequirement {
                            key: "metadata.name".into(),
                            operator: "In".into(),
                            values: vec![node.name.as_str().into()],
                        }],
                    }],
                }));
            }
            if let Some(sel) = selector {
                match sel.node_selector_terms.len() {
                    0 => {}
                    1 => {
                        let t = &sel.node_selector_terms[0];
                        merge_requirements(&t.match_fields, &mut term.match_fields);
                        merge_requirements(&t.match_expressions, &mut term.match_expressions);
                    }
                    n => {
                        return Err(format!(
                            "unsupported ResourceSlice.NodeSelector with {n} terms"
                        ));
                    }
                }
            }
        }
        if term.match_fields.is_empty() && term.match_expressions.is_empty() {
            Ok(None)
        } else {
            Ok(Some(NodeSelector {
                node_selector_terms: vec![term],
            }))
        }
    }
}

fn merge_requirements(from: &[NodeSelectorRequirement], to: &mut Vec<NodeSelectorRequirement>) {
    for r in from {
        let present = to.iter().any(|e| {
            e.key == r.key && e.operator == r.operator && {
                let a: HashSet<&str> = e.values.iter().map(|v| v.as_str()).collect();
                let b: HashSet<&str> = r.values.iter().map(|v| v.as_str()).collect();
                a == b
            }
        });
        if !present {
            to.push(r.clone());
        }
    }
}

/// The canonical text of `q`, from `seen` when an amount of the same value and format was
/// written before.
fn amount_text(seen: &mut Vec<(Quantity, String)>, q: &Quantity) -> String {
    if let Some((_, text)) = seen
        .iter()
        .find(|(k, _)| k == q && k.format() == q.format())
    {
        return text.clone();
    }
    let text = q.to_string();
    if seen.len() < 8 {
        seen.push((*q, text.clone()));
    }
    text
}

/// FNV-1a in two lanes (128 bits) over the text that identifies a share.
#[derive(Clone)]
struct ShareHash {
    a: u64,
    b: u64,
}

impl ShareHash {
    /// The hash of a share's claim part: its UID and `namespace/name`.
    fn claim(cp: &ClaimPlan<'_>) -> ShareHash {
        let meta = &cp.claim.metadata;
        let mut h = ShareHash {
            a: 0xcbf2_9ce4_8422_2325,
            b: 0x8422_2325_cbf2_9ce4,
        };
        h.write(meta.uid.as_bytes());
        h.write(b"\0");
        if !meta.namespace.is_empty() {
            h.write(meta.namespace.as_bytes());
            h.write(b"/");
        }
        h.write(meta.name.as_bytes());
        h.write(b"\0");
        h
    }

    fn write(&mut self, text: &[u8]) {
        let (mut a, mut b) = (self.a, self.b);
        for &byte in text {
            a = (a ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3);
            b = (b ^ u64::from(byte))
                .wrapping_mul(0x0000_0100_0000_01b3)
                .rotate_left(5);
        }
        (self.a, self.b) = (a, b);
    }

    /// The hash as a UUID's text: 32 lowercase hex digits (lane `a`, then lane `b`) in
    /// groups of 8-4-4-4-12.
    fn uuid(&self) -> String {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut text = [b'-'; 36];
        let mut at = 0;
        for (i, lane) in [self.a, self.b].into_iter().enumerate() {
            for n in 0..16 {
                if matches!(16 * i + n, 8 | 12 | 16 | 20) {
                    at += 1;
                }
                text[at] = HEX[((lane >> (60 - 4 * n)) & 0xf) as usize];
                at += 1;
            }
        }
        // ASCII only: the text is always valid.
        String::from_utf8(text.to_vec()).unwrap_or_default()
    }
}

/// A share ID for a multi-allocatable device. The scheduler draws a random UUID; kubedev
/// derives one from the claim (UID and `namespace/name`, hashed in `claim`), the request, the
/// device (`driver/pool/device`) and the result's position, so results are reproducible.
fn share_id_for(claim: &ShareHash, request: &str, dev: &NodeDevice<'_>, position: usize) -> String {
    let mut h = claim.clone();
    h.write(request.as_bytes());
    h.write(b"\0");
    h.write(dev.driver().as_bytes());
    h.write(b"/");
    h.write(dev.pool_name().as_bytes());
    h.write(b"/");
    h.write(dev.device.name.as_bytes());
    h.write(b"\0");
    // The position in decimal.
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut n = position;
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    h.write(&digits[at..]);
    h.uuid()
}
