//! What a policy is asked: a request and its candidate devices, borrowed from the caller.

use std::collections::{HashMap, HashSet};

use kubedev_allocator::api;
use kubedev_core::HealthState;

/// One request a policy orders candidates for.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct PolicyInput<'a> {
    /// The claim, as `namespace/name`.
    pub claim: &'a str,
    /// `request` or `request/subrequest`.
    pub request: &'a str,
    /// How many devices the request wants.
    pub count: usize,
    /// Constraints of the claim that apply to this request.
    pub constraints: Vec<Constraint<'a>>,
    /// The candidates, in the allocator's default order.
    pub candidates: Vec<Candidate<'a>>,
    /// How many allocated devices draw from each shared counter set, if known.
    pub usage: Option<&'a CounterUsage>,
}

impl<'a> PolicyInput<'a> {
    /// A request for `count` devices among `candidates`, with no constraints.
    pub fn new(
        claim: &'a str,
        request: &'a str,
        count: usize,
        candidates: Vec<Candidate<'a>>,
    ) -> Self {
        PolicyInput {
            claim,
            request,
            count,
            constraints: Vec::new(),
            candidates,
            usage: None,
        }
    }

    /// With the constraints in force for this request.
    pub fn with_constraints(mut self, constraints: Vec<Constraint<'a>>) -> Self {
        self.constraints = constraints;
        self
    }

    /// With the usage of shared counter sets by devices already allocated.
    pub fn with_counter_usage(mut self, usage: &'a CounterUsage) -> Self {
        self.usage = Some(usage);
        self
    }
}

/// The kind of a claim constraint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConstraintKind {
    /// All devices must have the same value of the attribute.
    MatchAttribute,
    /// All devices must have different values of the attribute.
    DistinctAttribute,
}

/// A constraint in force for a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Constraint<'a> {
    /// What the constraint demands.
    pub kind: ConstraintKind,
    /// The qualified attribute name.
    pub attribute: &'a str,
}

/// The device data a candidate carries: as published in a ResourceSlice, or as in the
/// daemon's inventory.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub enum DeviceData<'a> {
    /// A device of a ResourceSlice (allocator, `kubedev simulate`).
    Published(&'a api::Device),
    /// A device of the inventory (the device-plugin server's `GetPreferredAllocation`).
    Inventory(&'a kubedev_core::Device),
}

/// One candidate device.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct Candidate<'a> {
    /// Driver name.
    pub driver: &'a str,
    /// Pool name.
    pub pool: &'a str,
    /// The device.
    pub device: DeviceData<'a>,
    /// The device is already allocated.
    pub in_use: bool,
    /// The device's health.
    pub health: HealthState,
    /// The device's NUMA node, when known besides its attributes (inventory devices). For
    /// a published device this is `None` and the NUMA node is read from its attributes when
    /// the input is encoded: `resource.kubernetes.io/numaNode`, else the driver's
    /// `numaNode`, else `numa` (integers).
    pub numa_node: Option<i64>,
}

impl<'a> Candidate<'a> {
    /// A published device. It counts as healthy unless a taint key ends in `unhealthy`
    /// (kubedev taints unhealthy devices `<driver>/unhealthy`); its NUMA node comes from its
    /// attributes (see [`Candidate::numa_node`]).
    pub fn published(driver: &'a str, pool: &'a str, device: &'a api::Device) -> Self {
        let unhealthy = device
            .taints
            .iter()
            .any(|t| t.key.ends_with("/unhealthy") || t.key == "unhealthy");
        Candidate {
            driver,
            pool,
            device: DeviceData::Published(device),
            in_use: false,
            health: if unhealthy {
                HealthState::Unhealthy
            } else {
                HealthState::Healthy
            },
            numa_node: None,
        }
    }

    /// An inventory device, with its own health and NUMA node.
    pub fn inventory(driver: &'a str, pool: &'a str, device: &'a kubedev_core::Device) -> Self {
        Candidate {
            driver,
            pool,
            device: DeviceData::Inventory(device),
            in_use: false,
            health: device.health.state,
            numa_node: device.numa_node,
        }
    }

    /// Marks the candidate as already allocated (or not).
    pub fn with_in_use(mut self, in_use: bool) -> Self {
        self.in_use = in_use;
        self
    }

    /// The device name.
    pub fn name(&self) -> &'a str {
        match self.device {
            DeviceData::Published(d) => &d.name,
            DeviceData::Inventory(d) => d.name.as_str(),
        }
    }
}

/// How many already-allocated devices draw from each shared counter set (a partitionable
/// device's parent), by driver, pool and counter set name. Policies such as `binpack` use
/// it to tell which parents are already in use.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CounterUsage {
    by_driver: HashMap<String, HashMap<String, HashMap<String, u32>>>,
}

impl CounterUsage {
    /// No usage.
    pub fn new() -> Self {
        CounterUsage::default()
    }

    /// Counts one allocated device drawing from `counter_set` of `driver`'s `pool`.
    pub fn add(&mut self, driver: &str, pool: &str, counter_set: &str) {
        *self
            .by_driver
            .entry(driver.to_string())
            .or_default()
            .entry(pool.to_string())
            .or_default()
            .entry(counter_set.to_string())
            .or_default() += 1;
    }

    /// How many allocated devices draw from the counter set.
    pub fn get(&self, driver: &str, pool: &str, counter_set: &str) -> u32 {
        self.by_driver
            .get(driver)
            .and_then(|p| p.get(pool))
            .and_then(|s| s.get(counter_set))
            .copied()
            .unwrap_or(0)
    }

    /// True when no allocated device draws from any counter set.
    pub fn is_empty(&self) -> bool {
        self.by_driver.is_empty()
    }

    /// The usage by the `allocated` devices (`driver/pool/device`) of the current generation
    /// of each pool in `slices`.
    pub fn from_allocated(slices: &[api::ResourceSlice], allocated: &[String]) -> Self {
        let mut usage = CounterUsage::new();
        let ids: HashSet<(&str, &str, &str)> = allocated
            .iter()
            .filter_map(|s| kubedev_allocator::scenario::split_device_id(s))
            .collect();
        if ids.is_empty() {
            return usage;
        }
        let mut generation: HashMap<(&str, &str), i64> = HashMap::new();
        for s in slices {
            let g = generation
                .entry((&s.spec.driver, &s.spec.pool.name))
                .or_insert(i64::MIN);
            *g = (*g).max(s.spec.pool.generation);
        }
        for s in slices {
            let (driver, pool) = (s.spec.driver.as_str(), s.spec.pool.name.as_str());
            if generation.get(&(driver, pool)) != Some(&s.spec.pool.generation) {
                continue;
            }
            for d in &s.spec.devices {
                if ids.contains(&(driver, pool, d.name.as_str())) {
                    for cc in &d.consumes_counters {
                        usage.add(driver, pool, &cc.counter_set);
                    }
                }
            }
        }
        usage
    }
}
