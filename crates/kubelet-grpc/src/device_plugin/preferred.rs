//! `GetPreferredAllocation`: the rules an answer must keep, and the default NUMA packing.

use std::collections::{BTreeMap, HashSet};

use super::PluginDevice;

/// One container's `GetPreferredAllocation` request, checked.
#[derive(Debug, Clone)]
pub struct PreferenceRequest<'a> {
    /// Devices the kubelet may give, in the kubelet's order.
    pub available: &'a [String],
    /// Devices the answer must contain.
    pub must_include: &'a [String],
    /// How many devices the answer must contain.
    pub size: usize,
    /// What the server knows of every device (NUMA node, health).
    pub devices: &'a [PluginDevice],
}

impl<'a> PreferenceRequest<'a> {
    /// Checks the kubelet's request: no duplicates, must-include within available, and a size
    /// between the two counts.
    pub fn new(
        available: &'a [String],
        must_include: &'a [String],
        size: usize,
        devices: &'a [PluginDevice],
    ) -> Result<Self, String> {
        let mut avail = HashSet::new();
        for id in available {
            if !avail.insert(id.as_str()) {
                return Err(format!(
                    "available_deviceIDs lists {id} twice",
                    id = kubedev_core::echo::echo(id)
                ));
            }
        }
        let mut must = HashSet::new();
        for id in must_include {
            if !must.insert(id.as_str()) {
                return Err(format!(
                    "must_include_deviceIDs lists {id} twice",
                    id = kubedev_core::echo::echo(id)
                ));
            }
            if !avail.contains(id.as_str()) {
                return Err(format!(
                    "must_include_deviceIDs has {id}, which is not in available_deviceIDs",
                    id = kubedev_core::echo::echo(id)
                ));
            }
        }
        if size < must_include.len() {
            return Err(format!(
                "allocation_size {size} is smaller than the {} must-include devices",
                must_include.len()
            ));
        }
        if size > available.len() {
            return Err(format!(
                "allocation_size {size} is larger than the {} available devices",
                available.len()
            ));
        }
        Ok(PreferenceRequest {
            available,
            must_include,
            size,
            devices,
        })
    }

    /// What the server knows of the device with ID `id`, if it serves one.
    pub fn device(&self, id: &str) -> Option<&'a PluginDevice> {
        self.devices.iter().find(|d| d.id == id)
    }

    fn numa_of(&self, id: &str) -> Option<i64> {
        self.device(id).and_then(|d| d.numa_node)
    }
}

/// Checks that `answer` keeps the API's rules: a subset of the available devices, containing
/// every must-include device, of exactly the requested size, without duplicates.
pub fn check_preference(req: &PreferenceRequest<'_>, answer: &[String]) -> Result<(), String> {
    if answer.len() != req.size {
        return Err(format!(
            "answer has {} devices, {} were requested",
            answer.len(),
            req.size
        ));
    }
    let mut seen = HashSet::new();
    for id in answer {
        if !seen.insert(id.as_str()) {
            return Err(format!(
                "answer lists {id} twice",
                id = kubedev_core::echo::echo(id)
            ));
        }
        if !req.available.contains(id) {
            return Err(format!(
                "answer has {id}, which is not available",
                id = kubedev_core::echo::echo(id)
            ));
        }
    }
    if let Some(missing) = req.must_include.iter().find(|m| !seen.contains(m.as_str())) {
        return Err(format!(
            "answer leaves out must-include device {missing}",
            missing = kubedev_core::echo::echo(missing)
        ));
    }
    Ok(())
}

/// The default preference: the must-include devices, then devices packed onto as few NUMA nodes
/// as possible — first the nodes the must-include devices are on, then a node that can hold all
/// that is still needed (the smallest such node, to keep larger ones whole), then the largest
/// nodes. Within a node, the kubelet's order is kept.
pub fn default_preference(req: &PreferenceRequest<'_>) -> Vec<String> {
    let mut chosen: Vec<String> = req.must_include.to_vec();
    let need = req.size - chosen.len();
    if need == 0 {
        return chosen;
    }
    let must_nodes: HashSet<Option<i64>> =
        req.must_include.iter().map(|id| req.numa_of(id)).collect();
    // NUMA node → remaining candidates in the kubelet's order.
    let mut by_node: BTreeMap<Option<i64>, Vec<&String>> = BTreeMap::new();
    for id in req.available {
        if !req.must_include.contains(id) {
            by_node.entry(req.numa_of(id)).or_default().push(id);
        }
    }
    let mut nodes: Vec<(Option<i64>, Vec<&String>)> = by_node.into_iter().collect();
    let mut remaining = need;
    while remaining > 0 && !nodes.is_empty() {
        // Rank: nodes shared with must-include first; then nodes that fit what remains (smallest
        // first); then the largest nodes; unknown NUMA last; ties by node number.
        let best = (0..nodes.len())
            .min_by_key(|&i| {
                let (node, ids) = &nodes[i];
                let fits = ids.len() >= remaining;
                (
                    !must_nodes.contains(node),
                    node.is_none(),
                    !fits,
                    if fits {
                        ids.len()
                    } else {
                        usize::MAX - ids.len()
                    },
                    *node,
                )
            })
            .unwrap_or(0);
        let (_, ids) = nodes.remove(best);
        for id in ids.into_iter().take(remaining) {
            chosen.push(id.clone());
            remaining -= 1;
        }
    }
    chosen
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn devs(numa: &[Option<i64>]) -> (Vec<String>, Vec<PluginDevice>) {
        let ids: Vec<String> = (0..numa.len()).map(|i| format!("d{i}")).collect();
        let devices = ids
            .iter()
            .zip(numa)
            .map(|(id, n)| {
                let device = kubedev_core::DeviceRef::new(
                    kubedev_core::PoolName::new("node").unwrap(),
                    kubedev_core::DeviceName::new(id).unwrap(),
                );
                PluginDevice::new(id, device).with_numa_node(*n)
            })
            .collect();
        (ids, devices)
    }

    fn numa_nodes_of(answer: &[String], devices: &[PluginDevice]) -> HashSet<Option<i64>> {
        answer
            .iter()
            .map(|id| devices.iter().find(|d| &d.id == id).unwrap().numa_node)
            .collect()
    }

    #[test]
    fn packs_onto_one_numa_node_when_possible() {
        // d0,d2,d4,d6 on node 0; d1,d3,d5,d7 on node 1; node 1 has d1 in must-include.
        let numa: Vec<_> = (0..8).map(|i| Some(i % 2)).collect();
        let (ids, devices) = devs(&numa);
        let must = vec!["d1".to_string()];
        let req = PreferenceRequest::new(&ids, &must, 3, &devices).unwrap();
        let got = default_preference(&req);
        check_preference(&req, &got).unwrap();
        assert_eq!(got, ["d1", "d3", "d5"]);
    }

    #[test]
    fn prefers_the_smallest_node_that_fits() {
        // node 0: 1 device, node 1: 2 devices, node 2: 4 devices; want 2.
        let numa = [
            Some(0),
            Some(1),
            Some(1),
            Some(2),
            Some(2),
            Some(2),
            Some(2),
        ];
        let (ids, devices) = devs(&numa);
        let req = PreferenceRequest::new(&ids, &[], 2, &devices).unwrap();
        assert_eq!(default_preference(&req), ["d1", "d2"]);
    }

    #[test]
    fn rejects_inconsistent_requests_naming_the_field() {
        let (ids, devices) = devs(&[Some(0), Some(0)]);
        let must = vec!["x".to_string()];
        let err = PreferenceRequest::new(&ids, &must, 1, &devices).unwrap_err();
        assert!(err.contains("must_include_deviceIDs"), "{err}");
        let err = PreferenceRequest::new(&ids, &[], 3, &devices).unwrap_err();
        assert!(err.contains("allocation_size 3"), "{err}");
        let must = ids.clone();
        let err = PreferenceRequest::new(&ids, &must, 1, &devices).unwrap_err();
        assert!(err.contains("smaller"), "{err}");
    }

    proptest! {
        #[test]
        fn default_answer_always_keeps_the_rules(
            numa in proptest::collection::vec(proptest::option::of(0i64..4), 1..24),
            must_mask in proptest::collection::vec(any::<bool>(), 24),
            extra in 0usize..24,
        ) {
            let (ids, devices) = devs(&numa);
            let must: Vec<String> = ids.iter().zip(&must_mask).filter(|(_, m)| **m).map(|(i, _)| i.clone()).collect();
            let size = (must.len() + extra).min(ids.len());
            let req = PreferenceRequest::new(&ids, &must, size, &devices).unwrap();
            let got = default_preference(&req);
            prop_assert!(check_preference(&req, &got).is_ok(), "{:?}", check_preference(&req, &got));
            // If the non-must devices needed fit on one NUMA node and there is no must-include,
            // the answer uses one node.
            if must.is_empty() && size > 0 {
                let mut counts: BTreeMap<Option<i64>, usize> = BTreeMap::new();
                for d in &devices { *counts.entry(d.numa_node).or_default() += 1; }
                if counts.iter().any(|(n, c)| n.is_some() && *c >= size) {
                    prop_assert_eq!(numa_nodes_of(&got, &devices).len(), 1);
                }
            }
        }
    }
}
