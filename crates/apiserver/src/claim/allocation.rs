//! This driver's part of a fetched ResourceClaim's allocation: its device results (pool, device,
//! request, share ID, tolerations, consumed capacity) and its opaque configurations, class ones
//! first, each device given the parameters that apply to its request.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1 as res;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use kubedev_core::{
    AllocatedDevice, ClaimRef, DeviceName, DeviceRef, DriverName, PoolName, Quantity,
};

use super::reader::check_uid;
use super::{AllocatedClaim, ConfigSource, DeviceResult, DeviceToleration, OpaqueConfig};
use crate::error::Error;

/// This driver's part of an allocated claim. Pure, so every rule is unit-tested.
pub(crate) fn allocated_claim(
    driver: &DriverName,
    expected: &ClaimRef,
    found: &res::ResourceClaim,
) -> Result<AllocatedClaim, Error> {
    check_uid(expected, found)?;
    let Some(allocation) = found.status.as_ref().and_then(|s| s.allocation.as_ref()) else {
        return Err(Error::ClaimNotAllocated {
            namespace: expected.namespace.to_string(),
            name: expected.name.to_string(),
            uid: expected.uid.to_string(),
        });
    };
    let empty = res::DeviceAllocationResult::default();
    let devices = allocation.devices.as_ref().unwrap_or(&empty);
    let config = driver_config(driver, expected, devices)?;
    let mut results = Vec::new();
    for (i, result) in devices.results.iter().flatten().enumerate() {
        if result.driver != driver.as_str() {
            continue;
        }
        results.push(device_result(expected, i, result, &config)?);
    }
    Ok(AllocatedClaim {
        claim: expected.clone(),
        results,
        config,
        pod_claim_name: pod_claim_name(found),
        node_names: node_names(allocation),
    })
}

/// The node names the allocation's node selector matches `metadata.name` against with `In`,
/// over all of its terms, each once.
fn node_names(allocation: &res::AllocationResult) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    let terms = allocation
        .node_selector
        .iter()
        .flat_map(|s| s.node_selector_terms.iter());
    for field in terms.flat_map(|t| t.match_fields.iter().flatten()) {
        if field.key != "metadata.name" || field.operator != "In" {
            continue;
        }
        for name in field.values.iter().flatten() {
            if !names.contains(name) {
                names.push(name.clone());
            }
        }
    }
    names
}

/// A claim whose content cannot be read.
fn content_error(claim: &ClaimRef, message: String) -> Error {
    Error::ClaimContent {
        claim: claim.to_string(),
        message,
    }
}

/// The driver's opaque configurations, class ones first.
fn driver_config(
    driver: &DriverName,
    claim: &ClaimRef,
    devices: &res::DeviceAllocationResult,
) -> Result<Vec<OpaqueConfig>, Error> {
    let mut config = Vec::new();
    for (i, entry) in devices.config.iter().flatten().enumerate() {
        let Some(opaque) = entry.opaque.as_ref() else {
            continue;
        };
        if opaque.driver != driver.as_str() {
            continue;
        }
        let source = match entry.source.as_str() {
            "FromClass" => ConfigSource::Class,
            "FromClaim" => ConfigSource::Claim,
            other => {
                return Err(content_error(
                    claim,
                    format!(
                        "config[{i}] has source {other}; expected FromClass or FromClaim",
                        other = kubedev_core::echo::echo(other)
                    ),
                ));
            }
        };
        let RawExtension(parameters) = &opaque.parameters;
        config.push(OpaqueConfig {
            source,
            index: i,
            requests: entry.requests.clone().unwrap_or_default(),
            parameters: parameters.clone(),
        });
    }
    // Class configuration first, then the claim's, each in its own order: later entries take
    // precedence, so a user can refine what the class sets but not the other way round.
    config.sort_by_key(|c| match c.source {
        ConfigSource::Class => 0,
        ConfigSource::Claim => 1,
    });
    Ok(config)
}

/// Device result `i` of the driver, with the configurations that apply to its request.
fn device_result(
    claim: &ClaimRef,
    i: usize,
    result: &res::DeviceRequestAllocationResult,
    config: &[OpaqueConfig],
) -> Result<DeviceResult, Error> {
    let content = |message: String| content_error(claim, message);
    let pool = PoolName::new(result.pool.clone())
        .map_err(|e| content(format!("results[{i}]: {}", kubedev_core::echo::chain(&e))))?;
    let device = DeviceName::new(result.device.clone())
        .map_err(|e| content(format!("results[{i}]: {}", kubedev_core::echo::chain(&e))))?;
    let mut consumed_capacity = BTreeMap::new();
    for (name, q) in result.consumed_capacity.iter().flatten() {
        let value = Quantity::parse(&q.0).map_err(|e| {
            content(format!(
                "results[{i}]: consumed capacity {name}: {}",
                kubedev_core::echo::chain(&e)
            ))
        })?;
        consumed_capacity.insert(name.clone(), value);
    }
    let applicable = config
        .iter()
        .filter(|c| c.applies_to(&result.request))
        .map(OpaqueConfig::device_config)
        .collect();
    let mut device = AllocatedDevice::new(DeviceRef::new(pool, device));
    device.admin_access = result.admin_access.unwrap_or(false);
    device.request = result.request.clone();
    device.share_id = result.share_id.clone();
    device.config = applicable;
    Ok(DeviceResult {
        device,
        admin_access: result.admin_access.unwrap_or(false),
        tolerations: result
            .tolerations
            .iter()
            .flatten()
            .map(|t| DeviceToleration {
                key: t.key.clone(),
                operator: t.operator.clone(),
                value: t.value.clone(),
                effect: t.effect.clone(),
                toleration_seconds: t.toleration_seconds,
            })
            .collect(),
        consumed_capacity,
    })
}

/// The pod's name for the claim (`resource.kubernetes.io/pod-claim-name`), when set.
fn pod_claim_name(found: &res::ResourceClaim) -> Option<String> {
    found
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("resource.kubernetes.io/pod-claim-name"))
        .filter(|n| !n.is_empty())
        .cloned()
}
