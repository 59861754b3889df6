//! The device model: devices, pools and the node's inventory.
//!
//! One model feeds both kubelet APIs: DRA publishes it as ResourceSlices, the device-plugin side
//! derives extended resources from it with selectors.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::attribute::AttributeValue;
use crate::names::{CounterName, DeviceName, PoolName, QualifiedName};
use crate::quantity::Quantity;

/// Whether a device can be used right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub enum HealthState {
    /// The device works.
    #[default]
    Healthy,
    /// The device is broken or gone.
    Unhealthy,
    /// The backend cannot tell.
    Unknown,
}

impl fmt::Display for HealthState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HealthState::Healthy => "Healthy",
            HealthState::Unhealthy => "Unhealthy",
            HealthState::Unknown => "Unknown",
        })
    }
}

/// A device's health and, when it is not healthy, why.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Health {
    /// The state.
    pub state: HealthState,
    /// A human-readable reason, e.g. "Xid 79: GPU has fallen off the bus".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Whether an unhealthy device is unusable even for the workloads already running on it
    /// (an NVIDIA Xid that needs a GPU reset, a device that is gone), so they should be
    /// stopped: published in a ResourceSlice as a `NoExecute` taint rather than `NoSchedule`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub evict: bool,
}

impl Health {
    /// A healthy device.
    pub fn healthy() -> Self {
        Health::default()
    }

    /// An unhealthy device, with the reason: nothing new should be placed on it.
    pub fn unhealthy(reason: impl Into<String>) -> Self {
        Health {
            state: HealthState::Unhealthy,
            reason: Some(reason.into()),
            evict: false,
        }
    }

    /// An unhealthy device that the workloads already using it cannot keep using either (see
    /// [`Health::evict`]), with the reason.
    pub fn unusable(reason: impl Into<String>) -> Self {
        Health {
            evict: true,
            ..Health::unhealthy(reason)
        }
    }

    /// A device whose health is unknown, with the reason.
    pub fn unknown(reason: impl Into<String>) -> Self {
        Health {
            state: HealthState::Unknown,
            reason: Some(reason.into()),
            evict: false,
        }
    }

    /// True when the state is `Healthy`.
    pub fn is_healthy(&self) -> bool {
        self.state == HealthState::Healthy
    }
}

/// What a taint does to claims that do not tolerate it.
///
/// Kubernetes adds effects over time (`None` came after `NoSchedule` and `NoExecute`), so more
/// may follow; [`as_str`](Self::as_str) spells every one as the API does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum TaintEffect {
    /// Not taken for new allocations.
    NoSchedule,
    /// Not taken, and pods already using it are evicted.
    NoExecute,
    /// Informational only.
    None,
}

impl TaintEffect {
    /// The effect as the Kubernetes API writes it (`NoSchedule`, `NoExecute`, `None`).
    pub fn as_str(self) -> &'static str {
        match self {
            TaintEffect::NoSchedule => "NoSchedule",
            TaintEffect::NoExecute => "NoExecute",
            TaintEffect::None => "None",
        }
    }
}

impl fmt::Display for TaintEffect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A device taint, as in `resource.k8s.io/v1` DeviceTaint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Taint {
    /// The taint key (a qualified name).
    pub key: String,
    /// The taint value, may be empty.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub value: String,
    /// The effect.
    pub effect: TaintEffect,
}

impl Taint {
    /// A taint `key` with `effect` and an empty value.
    pub fn new(key: impl Into<String>, effect: TaintEffect) -> Self {
        Taint {
            key: key.into(),
            value: String::new(),
            effect,
        }
    }

    /// With the value `value`.
    pub fn with_value(mut self, value: impl Into<String>) -> Self {
        self.value = value.into();
        self
    }
}

/// A device's capacity entry, e.g. `memory: 40Gi`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct Capacity {
    /// The amount.
    pub value: Quantity,
    /// How much of it one allocation of a device that allows multiple allocations takes (DRA
    /// consumable capacity); `None`: an allocation takes what its request asks for, or all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_policy: Option<RequestPolicy>,
}

impl Capacity {
    /// `value`, without a request policy.
    pub fn new(value: Quantity) -> Self {
        Capacity {
            value,
            request_policy: None,
        }
    }

    /// With the request policy `policy` (DRA consumable capacity).
    pub fn with_request_policy(mut self, policy: RequestPolicy) -> Self {
        self.request_policy = Some(policy);
        self
    }
}

/// How much of a consumable capacity one allocation takes, as `resource.k8s.io/v1`
/// `CapacityRequestPolicy` has it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct RequestPolicy {
    /// What a request that does not name the capacity takes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<Quantity>,
    /// The amounts a request may take (ascending); exclusive with `valid_range`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub valid_values: Vec<Quantity>,
    /// The range a request may take, `min` and optional `max` and `step`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub valid_range: Option<RequestRange>,
}

/// The range of a [`RequestPolicy`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct RequestRange {
    /// The least a request takes.
    pub min: Quantity,
    /// The most a request takes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<Quantity>,
    /// Requests are `min` plus a multiple of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<Quantity>,
}

impl RequestPolicy {
    /// Requests take `default` unless they ask for an amount from `min` to `max` in steps of
    /// `step`.
    pub fn range(
        default: Quantity,
        min: Quantity,
        max: Option<Quantity>,
        step: Option<Quantity>,
    ) -> Self {
        RequestPolicy {
            default: Some(default),
            valid_values: Vec::new(),
            valid_range: Some(RequestRange { min, max, step }),
        }
    }
}

impl RequestRange {
    /// Requests take at least `min`, with no most and no step.
    pub fn new(min: Quantity) -> Self {
        RequestRange {
            min,
            max: None,
            step: None,
        }
    }

    /// With the most a request takes.
    pub fn with_max(mut self, max: Quantity) -> Self {
        self.max = Some(max);
        self
    }

    /// With the step: requests are `min` plus a multiple of `step`.
    pub fn with_step(mut self, step: Quantity) -> Self {
        self.step = Some(step);
        self
    }
}

/// Counters that a device consumes from one shared counter set of its pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct CounterConsumption {
    /// The counter set (by name) in the same pool.
    pub counter_set: CounterName,
    /// Counter name → amount consumed.
    pub counters: BTreeMap<CounterName, Quantity>,
}

impl CounterConsumption {
    /// Consumes `counters` (counter name → amount) from the set `counter_set` of the pool.
    pub fn new(counter_set: CounterName, counters: BTreeMap<CounterName, Quantity>) -> Self {
        CounterConsumption {
            counter_set,
            counters,
        }
    }
}

/// A set of counters that partitionable devices of a pool draw from, e.g. a GPU's memory slices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct CounterSet {
    /// The set's name, unique within the pool.
    pub name: CounterName,
    /// Counter name → amount available.
    pub counters: BTreeMap<CounterName, Quantity>,
}

impl CounterSet {
    /// The set `name` offering `counters` (counter name → amount available).
    pub fn new(name: CounterName, counters: BTreeMap<CounterName, Quantity>) -> Self {
        CounterSet { name, counters }
    }
}

/// One device as a backend discovered it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct Device {
    /// The name, unique within its pool.
    pub name: DeviceName,
    /// Typed attributes (bare names belong to the driver's domain).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub attributes: BTreeMap<QualifiedName, AttributeValue>,
    /// Capacities.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub capacity: BTreeMap<QualifiedName, Capacity>,
    /// Shared counters this device consumes when allocated.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub consumes_counters: Vec<CounterConsumption>,
    /// Taints.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub taints: Vec<Taint>,
    /// Current health.
    #[serde(default)]
    pub health: Health,
    /// The NUMA node the device is attached to, if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<i64>,
    /// Whether several claims may share the device at once.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_multiple_allocations: bool,
}

impl Device {
    /// A healthy device with no attributes.
    pub fn new(name: DeviceName) -> Self {
        Device {
            name,
            attributes: BTreeMap::new(),
            capacity: BTreeMap::new(),
            consumes_counters: Vec::new(),
            taints: Vec::new(),
            health: Health::healthy(),
            numa_node: None,
            allow_multiple_allocations: false,
        }
    }

    /// Sets an attribute (builder style).
    pub fn with_attribute(mut self, name: QualifiedName, value: AttributeValue) -> Self {
        self.attributes.insert(name, value);
        self
    }

    /// Sets a capacity (builder style).
    pub fn with_capacity(mut self, name: QualifiedName, value: Quantity) -> Self {
        self.capacity.insert(name, Capacity::new(value));
        self
    }

    /// Sets the NUMA node (builder style).
    pub fn with_numa_node(mut self, node: i64) -> Self {
        self.numa_node = Some(node);
        self
    }

    /// Sets the health (builder style).
    pub fn with_health(mut self, health: Health) -> Self {
        self.health = health;
        self
    }

    /// Looks an attribute up by its name as written (`domain/id` or bare `id`).
    pub fn attribute(&self, name: &str) -> Option<&AttributeValue> {
        self.attributes
            .iter()
            .find(|(k, _)| k.as_str() == name)
            .map(|(_, v)| v)
    }
}

/// A pool of devices published together, e.g. all GPUs of one node for one driver.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct Pool {
    /// The pool's name (by default the node name).
    pub name: PoolName,
    /// The devices, in the order they are published.
    pub devices: Vec<Device>,
    /// Shared counter sets that the devices consume from.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shared_counters: Vec<CounterSet>,
}

impl Pool {
    /// Each device of the pool with its health: the snapshot
    /// [`watch_health`](crate::rescan::watch_health) takes.
    pub fn device_health(&self) -> Vec<(DeviceRef, Health)> {
        let at = |d: &Device| DeviceRef::new(self.name.clone(), d.name.clone());
        self.devices
            .iter()
            .map(|d| (at(d), d.health.clone()))
            .collect()
    }

    /// A pool with the given devices and no counters.
    pub fn new(name: PoolName, devices: Vec<Device>) -> Self {
        Pool {
            name,
            devices,
            shared_counters: Vec::new(),
        }
    }

    /// Finds a device by name.
    pub fn device(&self, name: &str) -> Option<&Device> {
        self.devices.iter().find(|d| d.name.as_str() == name)
    }

    /// Checks what Kubernetes checks within one pool: device names unique, counter sets unique,
    /// and every consumed counter defined in a set of the pool.
    pub fn validate(&self) -> Result<(), crate::error::ModelError> {
        let mut seen = std::collections::BTreeSet::new();
        for d in &self.devices {
            if !seen.insert(d.name.as_str()) {
                return Err(crate::error::ModelError::DuplicateDevice {
                    pool: self.name.to_string(),
                    device: d.name.to_string(),
                });
            }
        }
        let mut sets = BTreeMap::new();
        for s in &self.shared_counters {
            if sets.insert(s.name.as_str(), s).is_some() {
                return Err(crate::error::ModelError::DuplicateCounterSet {
                    pool: self.name.to_string(),
                    set: s.name.to_string(),
                });
            }
        }
        for d in &self.devices {
            for c in &d.consumes_counters {
                let Some(set) = sets.get(c.counter_set.as_str()) else {
                    return Err(crate::error::ModelError::UnknownCounter {
                        pool: self.name.to_string(),
                        device: d.name.to_string(),
                        counter: c.counter_set.to_string(),
                    });
                };
                for name in c.counters.keys() {
                    if !set.counters.contains_key(name) {
                        return Err(crate::error::ModelError::UnknownCounter {
                            pool: self.name.to_string(),
                            device: d.name.to_string(),
                            counter: format!("{}/{}", c.counter_set, name),
                        });
                    }
                }
            }
        }
        Ok(())
    }
}

/// A reference to one device of the inventory.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub struct DeviceRef {
    /// The pool.
    pub pool: PoolName,
    /// The device within the pool.
    pub device: DeviceName,
}

impl DeviceRef {
    /// The device `device` of pool `pool`.
    pub fn new(pool: PoolName, device: DeviceName) -> Self {
        DeviceRef { pool, device }
    }
}

impl fmt::Display for DeviceRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.pool, self.device)
    }
}

/// Everything a node offers, as its backends see it now.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Inventory {
    /// The pools, in a stable order.
    pub pools: Vec<Pool>,
}

impl Inventory {
    /// An inventory of the given pools.
    pub fn new(pools: Vec<Pool>) -> Self {
        Inventory { pools }
    }

    /// All devices with their pools, in order.
    pub fn devices(&self) -> impl Iterator<Item = (&Pool, &Device)> {
        self.pools
            .iter()
            .flat_map(|p| p.devices.iter().map(move |d| (p, d)))
    }

    /// Finds a device.
    pub fn device(&self, r: &DeviceRef) -> Option<&Device> {
        self.pools
            .iter()
            .find(|p| p.name == r.pool)
            .and_then(|p| p.device(r.device.as_str()))
    }

    /// Sets a device's health; returns false when the device is unknown or already had it.
    pub fn set_health(&mut self, r: &DeviceRef, health: Health) -> bool {
        let Some(pool) = self.pools.iter_mut().find(|p| p.name == r.pool) else {
            return false;
        };
        let Some(dev) = pool.devices.iter_mut().find(|d| d.name == r.device) else {
            return false;
        };
        if dev.health == health {
            return false;
        }
        dev.health = health;
        true
    }

    /// Validates every pool and checks pool names are unique.
    pub fn validate(&self) -> Result<(), crate::error::ModelError> {
        let mut seen = std::collections::BTreeSet::new();
        for p in &self.pools {
            if !seen.insert(p.name.as_str()) {
                return Err(crate::error::ModelError::DuplicatePool {
                    pool: p.name.to_string(),
                });
            }
            p.validate()?;
        }
        Ok(())
    }
}

/// Decides whether a device belongs to something, e.g. a device-plugin extended resource.
///
/// Implementations must be pure and cheap; they run on every inventory change.
pub trait DeviceFilter: Send + Sync + fmt::Debug {
    /// True when `device` (in `pool`) matches. An error means the filter itself is broken for
    /// this device (e.g. a CEL runtime error); callers treat the device as not matching and
    /// report the error.
    fn matches(&self, pool: &Pool, device: &Device) -> Result<bool, crate::error::ModelError>;
}

/// A filter that matches devices whose attributes equal all the given values (an empty set
/// matches every device).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct AttributeMatch {
    /// Attribute name (as written on the device) → required value.
    pub attributes: BTreeMap<QualifiedName, AttributeValue>,
}

impl AttributeMatch {
    /// Matches devices whose attributes equal all of `attributes` (attribute name → value).
    pub fn new(attributes: BTreeMap<QualifiedName, AttributeValue>) -> Self {
        AttributeMatch { attributes }
    }

    /// Also requires the attribute `name` to equal `value`.
    pub fn with_attribute(mut self, name: QualifiedName, value: AttributeValue) -> Self {
        self.attributes.insert(name, value);
        self
    }
}

impl DeviceFilter for AttributeMatch {
    fn matches(&self, _pool: &Pool, device: &Device) -> Result<bool, crate::error::ModelError> {
        Ok(self
            .attributes
            .iter()
            .all(|(k, v)| device.attributes.get(k) == Some(v)))
    }
}
