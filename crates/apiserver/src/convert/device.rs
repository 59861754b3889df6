//! Mapping one core device to its `resource.k8s.io/v1` form: attributes (with the NUMA node),
//! capacity, counter consumptions and taints (with the unhealthy taint), each checked against the
//! API's per-device limits.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1 as res;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use kubedev_core::{AttributeValue, Device, DriverName, HealthState, Pool};

use super::{
    MAX_ATTRIBUTES_AND_CAPACITIES, MAX_CONSUMPTIONS_PER_DEVICE, MAX_COUNTERS_PER_CONSUMPTION,
    MAX_TAINTS, NUMA_NODE_ATTRIBUTE, invalid,
};
use crate::error::Error;

pub(super) fn counters(
    map: &BTreeMap<kubedev_core::CounterName, kubedev_core::Quantity>,
) -> BTreeMap<String, res::Counter> {
    map.iter()
        .map(|(name, value)| {
            (
                name.to_string(),
                res::Counter {
                    value: K8sQuantity(value.to_string()),
                },
            )
        })
        .collect()
}

/// A capacity's request policy as the API has it.
fn request_policy(p: &kubedev_core::RequestPolicy) -> res::CapacityRequestPolicy {
    let q = |v: &kubedev_core::Quantity| K8sQuantity(v.to_string());
    res::CapacityRequestPolicy {
        default: p.default.as_ref().map(q),
        valid_values: (!p.valid_values.is_empty()).then(|| p.valid_values.iter().map(q).collect()),
        valid_range: p
            .valid_range
            .as_ref()
            .map(|r| res::CapacityRequestPolicyRange {
                min: q(&r.min),
                max: r.max.as_ref().map(q),
                step: r.step.as_ref().map(q),
            }),
    }
}

fn attribute(
    pool: &Pool,
    device: &Device,
    name: &str,
    value: &AttributeValue,
) -> Result<res::DeviceAttribute, Error> {
    value.validate().map_err(|e| {
        invalid(
            pool,
            format!("device {}: attribute {name}: {e}", device.name),
        )
    })?;
    let mut out = res::DeviceAttribute::default();
    match value {
        AttributeValue::Int(v) => out.int = Some(*v),
        AttributeValue::Bool(v) => out.bool = Some(*v),
        AttributeValue::String(v) => out.string = Some(v.clone()),
        AttributeValue::Version(v) => out.version = Some(v.to_string()),
        other => {
            return Err(invalid(
                pool,
                format!(
                    "device {}: attribute {name} has type {}, which ResourceSlices cannot carry",
                    device.name,
                    other.type_name()
                ),
            ));
        }
    }
    Ok(out)
}

/// The key of the taint put on unhealthy devices under
/// [`UnhealthyDevices::Taint`](super::UnhealthyDevices::Taint).
pub(crate) fn unhealthy_taint_key(driver: &DriverName) -> String {
    format!("{driver}/unhealthy")
}

/// The taint an unhealthy device is published with: `<driver>/unhealthy`, the reason as its
/// value, `NoExecute` when the device is unusable for running workloads.
pub(crate) fn unhealthy_taint(
    driver: &DriverName,
    health: &kubedev_core::Health,
) -> res::DeviceTaint {
    let value = taint_value(health.reason.as_deref().unwrap_or_default());
    res::DeviceTaint {
        key: unhealthy_taint_key(driver),
        value: (!value.is_empty()).then_some(value),
        effect: if health.evict {
            "NoExecute"
        } else {
            "NoSchedule"
        }
        .to_owned(),
        time_added: None,
    }
}

/// `reason` as a Kubernetes label value (what a taint value must be): at most 63 characters,
/// letters, digits, '-', '_' and '.', starting and ending with a letter or digit; every other
/// run of characters becomes one '-'.
pub(crate) fn taint_value(reason: &str) -> String {
    let mut out = String::with_capacity(reason.len().min(63));
    for c in reason.chars() {
        if c.is_ascii_alphanumeric() || matches!(c, '_' | '.') {
            out.push(c);
        } else if !out.is_empty() && !out.ends_with('-') {
            out.push('-');
        }
    }
    out.truncate(63);
    out.trim_end_matches(|c: char| !c.is_ascii_alphanumeric())
        .trim_start_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_owned()
}

/// The name under which an attribute or capacity `name` of `device` is published: a name in the
/// driver's own domain (`gpu.example.com/model` for the driver `gpu.example.com`) without its
/// domain (`model`). The two mean the same to the scheduler and in CEL, and the API server is
/// to refuse the qualified form (kubernetes/kubernetes#142218). An error when both forms are
/// set, as they would be one name.
fn published_name<V>(
    pool: &Pool,
    device: &Device,
    driver: &DriverName,
    name: &kubedev_core::QualifiedName,
    taken: &BTreeMap<String, V>,
    what: &str,
) -> Result<String, Error> {
    let published = match name.domain() {
        Some(domain) if domain == driver.as_str() => name.id().to_owned(),
        _ => name.to_string(),
    };
    if taken.contains_key(&published) {
        return Err(invalid(
            pool,
            format!(
                "device {} sets the {what} {published} twice, bare and in the driver's own domain {driver}",
                device.name
            ),
        ));
    }
    Ok(published)
}

/// Maps one device. The standard attribute `resource.kubernetes.io/numaNode` is added from
/// `numa_node` when the device does not set it itself and there is room for it.
pub(crate) fn map_device(
    pool: &Pool,
    device: &Device,
    driver: &DriverName,
) -> Result<res::Device, Error> {
    let (attributes, capacity) = attributes_and_capacity(pool, device, driver)?;
    let consumes = counter_consumption(pool, device)?;
    let taints = taints(pool, device, driver)?;
    Ok(res::Device {
        name: device.name.to_string(),
        attributes: (!attributes.is_empty()).then_some(attributes),
        capacity: (!capacity.is_empty()).then_some(capacity),
        consumes_counters: (!consumes.is_empty()).then_some(consumes),
        taints: (!taints.is_empty()).then_some(taints),
        allow_multiple_allocations: device.allow_multiple_allocations.then_some(true),
        ..Default::default()
    })
}

/// A device's published attributes, by published name.
type Attributes = BTreeMap<String, res::DeviceAttribute>;
/// A device's published capacities, by published name.
type Capacities = BTreeMap<String, res::DeviceCapacity>;

/// A device's published attributes (with the NUMA node's standard attribute where there is
/// room) and capacities, within the API's limit on both together.
fn attributes_and_capacity(
    pool: &Pool,
    device: &Device,
    driver: &DriverName,
) -> Result<(Attributes, Capacities), Error> {
    let mut attributes = BTreeMap::new();
    for (name, value) in &device.attributes {
        let published = published_name(pool, device, driver, name, &attributes, "attribute")?;
        attributes.insert(published, attribute(pool, device, name.as_str(), value)?);
    }
    let mut capacity = BTreeMap::new();
    for (name, cap) in &device.capacity {
        let published = published_name(pool, device, driver, name, &capacity, "capacity")?;
        capacity.insert(
            published,
            res::DeviceCapacity {
                value: K8sQuantity(cap.value.to_string()),
                request_policy: cap.request_policy.as_ref().map(request_policy),
            },
        );
    }
    if let Some(numa) = device.numa_node
        && !attributes.contains_key(NUMA_NODE_ATTRIBUTE)
        && attributes.len() + capacity.len() < MAX_ATTRIBUTES_AND_CAPACITIES
    {
        attributes.insert(
            NUMA_NODE_ATTRIBUTE.to_owned(),
            res::DeviceAttribute {
                int: Some(numa),
                ..Default::default()
            },
        );
    }
    let total = attributes.len() + capacity.len();
    if total > MAX_ATTRIBUTES_AND_CAPACITIES {
        return Err(invalid(
            pool,
            format!(
                "device {} has {total} attributes and capacities; at most {MAX_ATTRIBUTES_AND_CAPACITIES} are allowed",
                device.name
            ),
        ));
    }
    Ok((attributes, capacity))
}

/// What a device consumes from the pool's counter sets, within the API's limits.
fn counter_consumption(
    pool: &Pool,
    device: &Device,
) -> Result<Vec<res::DeviceCounterConsumption>, Error> {
    if device.consumes_counters.len() > MAX_CONSUMPTIONS_PER_DEVICE {
        return Err(invalid(
            pool,
            format!(
                "device {} consumes from {} counter sets; at most {MAX_CONSUMPTIONS_PER_DEVICE} are allowed",
                device.name,
                device.consumes_counters.len()
            ),
        ));
    }
    let mut consumes = Vec::with_capacity(device.consumes_counters.len());
    for c in &device.consumes_counters {
        if c.counters.len() > MAX_COUNTERS_PER_CONSUMPTION {
            return Err(invalid(
                pool,
                format!(
                    "device {} consumes {} counters from set {}; at most {MAX_COUNTERS_PER_CONSUMPTION} are allowed",
                    device.name,
                    c.counters.len(),
                    c.counter_set
                ),
            ));
        }
        if consumes
            .iter()
            .any(|e: &res::DeviceCounterConsumption| e.counter_set == c.counter_set.as_str())
        {
            return Err(invalid(
                pool,
                format!(
                    "device {} consumes from counter set {} twice",
                    device.name, c.counter_set
                ),
            ));
        }
        consumes.push(res::DeviceCounterConsumption {
            // Compatibility groups (1.37) are not written: older API servers drop them.
            compatibility_groups: None,
            counter_set: c.counter_set.to_string(),
            counters: counters(&c.counters),
        });
    }
    Ok(consumes)
}

/// A device's taints: its own, and the unhealthy taint when it is published unhealthy, within
/// the API's limit.
fn taints(
    pool: &Pool,
    device: &Device,
    driver: &DriverName,
) -> Result<Vec<res::DeviceTaint>, Error> {
    let mut taints: Vec<res::DeviceTaint> = device
        .taints
        .iter()
        .map(|t| res::DeviceTaint {
            key: t.key.clone(),
            value: (!t.value.is_empty()).then(|| t.value.clone()),
            effect: t.effect.as_str().to_owned(),
            time_added: None,
        })
        .collect();
    if device.health.state == HealthState::Unhealthy {
        let taint = unhealthy_taint(driver, &device.health);
        if !taints.iter().any(|t| t.key == taint.key) {
            taints.push(taint);
        }
    }
    if taints.len() > MAX_TAINTS {
        return Err(invalid(
            pool,
            format!(
                "device {} has {} taints; at most {MAX_TAINTS} are allowed",
                device.name,
                taints.len()
            ),
        ));
    }
    Ok(taints)
}
