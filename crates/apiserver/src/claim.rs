//! `ClaimReader`: what a ResourceClaim's allocation says this driver must prepare, and the
//! per-device status the driver reports back.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::resource::v1 as res;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use kubedev_core::{
    AllocatedDevice, ClaimRef, DeviceName, DeviceRef, DriverName, PoolName, Quantity,
};

use crate::Error;
use crate::error::api_code;

/// Where an opaque configuration came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConfigSource {
    /// From the DeviceClass (set by an administrator).
    Class,
    /// From the ResourceClaim (set by the user).
    Claim,
}

/// One opaque configuration entry for this driver from `status.allocation.devices.config`.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct OpaqueConfig {
    /// Class or claim.
    pub source: ConfigSource,
    /// The requests it applies to (`request` or `request/subrequest`); empty means all.
    pub requests: Vec<String>,
    /// The driver-defined parameters.
    pub parameters: serde_json::Value,
}

impl OpaqueConfig {
    /// Whether this configuration applies to devices allocated for `request` (as written in the
    /// allocation result, `request` or `request/subrequest`). A configuration naming the main
    /// request applies to all its subrequests.
    pub fn applies_to(&self, request: &str) -> bool {
        self.requests.is_empty()
            || self
                .requests
                .iter()
                .any(|r| r == request || r == base_request(request))
    }
}

/// The main request of a result's request name: `gpu` for `gpu/large`.
pub fn base_request(request: &str) -> &str {
    request.split_once('/').map_or(request, |(base, _)| base)
}

/// A toleration copied into an allocation result.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct DeviceToleration {
    /// The taint key it matches (empty: all keys).
    pub key: Option<String>,
    /// `Equal` (the default) or `Exists`.
    pub operator: Option<String>,
    /// The taint value for `Equal`.
    pub value: Option<String>,
    /// The effect it matches (empty: all effects).
    pub effect: Option<String>,
    /// For `NoExecute`: how long the taint is tolerated.
    pub toleration_seconds: Option<i64>,
}

/// One device allocated to the claim for this driver.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct DeviceResult {
    /// The device, the request it satisfies (as written: `request` or `request/subrequest`),
    /// its share ID, and the opaque parameters that apply to it (class first, then claim).
    pub device: AllocatedDevice,
    /// Allocated for administrative access (the device may be in use by others too).
    pub admin_access: bool,
    /// Tolerations of the request at allocation time.
    pub tolerations: Vec<DeviceToleration>,
    /// Capacity consumed from a shared device, by capacity name.
    pub consumed_capacity: BTreeMap<String, Quantity>,
}

/// What a ResourceClaim's allocation holds for this driver.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct AllocatedClaim {
    /// The claim.
    pub claim: ClaimRef,
    /// This driver's devices, in the order of the allocation.
    pub results: Vec<DeviceResult>,
    /// This driver's opaque configurations, class ones first, then claim ones.
    pub config: Vec<OpaqueConfig>,
}

impl AllocatedClaim {
    /// The devices as the core model's [`AllocatedDevice`]s, in order.
    pub fn devices(&self) -> Vec<AllocatedDevice> {
        self.results.iter().map(|r| r.device.clone()).collect()
    }
}

/// The status of a condition: `True`, `False` or `Unknown`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConditionStatus {
    /// The condition holds.
    True,
    /// It does not.
    False,
    /// Cannot tell.
    Unknown,
}

impl ConditionStatus {
    fn as_str(self) -> &'static str {
        match self {
            ConditionStatus::True => "True",
            ConditionStatus::False => "False",
            ConditionStatus::Unknown => "Unknown",
        }
    }
}

/// One condition of a prepared device (a `metav1.Condition` without the timestamps, which are
/// managed here).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceCondition {
    /// The condition type, e.g. `Ready`.
    pub kind: String,
    /// Its status.
    pub status: ConditionStatus,
    /// A CamelCase reason, e.g. `Prepared`.
    pub reason: String,
    /// A human-readable message.
    pub message: String,
}

impl DeviceCondition {
    /// A condition.
    pub fn new(
        kind: impl Into<String>,
        status: ConditionStatus,
        reason: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        DeviceCondition {
            kind: kind.into(),
            status,
            reason: reason.into(),
            message: message.into(),
        }
    }
}

/// The status this driver reports for one allocated device (an entry of `status.devices`).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct DeviceStatus {
    /// The device.
    pub device: DeviceRef,
    /// Its share ID, for a shared device.
    pub share_id: Option<String>,
    /// Conditions (at most 8).
    pub conditions: Vec<DeviceCondition>,
    /// Driver-specific data.
    pub data: Option<serde_json::Value>,
}

impl DeviceStatus {
    /// A device that is prepared: condition `Ready` is `True` with reason `Prepared`.
    pub fn ready(device: DeviceRef, share_id: Option<String>) -> Self {
        DeviceStatus {
            device,
            share_id,
            conditions: vec![DeviceCondition::new(
                "Ready",
                ConditionStatus::True,
                "Prepared",
                "the device is prepared for the claim",
            )],
            data: None,
        }
    }
}

/// Reads ResourceClaims for prepare and writes this driver's device status.
#[derive(Clone)]
pub struct ClaimReader {
    pub(crate) client: Client,
    pub(crate) driver: DriverName,
}

impl fmt::Debug for ClaimReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClaimReader")
            .field("driver", &self.driver)
            .finish_non_exhaustive()
    }
}

/// How many times a status write is tried when it keeps conflicting.
const STATUS_ATTEMPTS: u32 = 5;

impl ClaimReader {
    /// A reader for `driver`, talking through `client`.
    pub fn new(client: Client, driver: DriverName) -> Self {
        ClaimReader { client, driver }
    }

    fn api(&self, namespace: &str) -> Api<res::ResourceClaim> {
        Api::namespaced(self.client.clone(), namespace)
    }

    async fn fetch(&self, claim: &ClaimRef) -> Result<res::ResourceClaim, Error> {
        match self.api(&claim.namespace).get(&claim.name).await {
            Ok(found) => Ok(found),
            Err(error) if api_code(&error) == Some(404) => Err(Error::ClaimNotFound {
                namespace: claim.namespace.clone(),
                name: claim.name.clone(),
            }),
            Err(error) => Err(Error::Claim {
                operation: "reading",
                namespace: claim.namespace.clone(),
                name: claim.name.clone(),
                error: Box::new(error),
            }),
        }
    }

    /// Fetches the claim, checks it is the one asked for (same UID) and allocated, and returns
    /// this driver's part of the allocation. A name or namespace that breaks Kubernetes' naming
    /// rules is refused before any request.
    pub async fn get(&self, claim: &ClaimRef) -> Result<AllocatedClaim, Error> {
        check_claim_names(claim)?;
        let found = self.fetch(claim).await?;
        allocated_claim(&self.driver, claim, &found)
    }

    /// Writes `devices` into the claim's `status.devices` (a merge patch of the status
    /// subresource, conditional on the claim's resourceVersion and UID): entries of this driver
    /// for the same device and share ID are replaced, everything else is kept. A condition keeps
    /// its transition time when its status did not change. Conflicts are retried after
    /// re-reading the claim. A name or namespace that breaks Kubernetes' naming rules is refused
    /// before any request.
    pub async fn set_device_status(
        &self,
        claim: &ClaimRef,
        devices: &[DeviceStatus],
    ) -> Result<(), Error> {
        check_claim_names(claim)?;
        let api = self.api(&claim.namespace);
        for _ in 0..STATUS_ATTEMPTS {
            let found = self.fetch(claim).await?;
            check_uid(claim, &found)?;
            let mut entries = found.status.and_then(|s| s.devices).unwrap_or_default();
            merge_device_status(&mut entries, &self.driver, devices, Timestamp::now());
            // A merge patch of the status alone: the spec (and any status field this client's
            // API types do not know) is left as the server has it. The resourceVersion and UID
            // make it conditional on the claim being the one just read.
            let patch = serde_json::json!({
                "metadata": {
                    "uid": found.metadata.uid,
                    "resourceVersion": found.metadata.resource_version,
                },
                "status": {"devices": entries},
            });
            match api
                .patch_status(&claim.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => return Ok(()),
                Err(error) if api_code(&error) == Some(409) => continue,
                Err(error) if api_code(&error) == Some(404) => {
                    return Err(Error::ClaimNotFound {
                        namespace: claim.namespace.clone(),
                        name: claim.name.clone(),
                    });
                }
                Err(error) => {
                    return Err(Error::Claim {
                        operation: "writing the status of",
                        namespace: claim.namespace.clone(),
                        name: claim.name.clone(),
                        error: Box::new(error),
                    });
                }
            }
        }
        Err(Error::ClaimConflict {
            claim: claim.to_string(),
            attempts: STATUS_ATTEMPTS,
        })
    }
}

/// The rule a ResourceClaim's name follows (Kubernetes object names).
const NAME_RULE: &str = "DNS subdomain (at most 253 lowercase letters, digits, '-' or '.', \
     starting and ending with a letter or digit)";

/// The rule a namespace follows.
const NAMESPACE_RULE: &str = "DNS label (at most 63 lowercase letters, digits or '-', \
     starting and ending with a letter or digit)";

/// Checks the claim's namespace (a DNS label) and name (a DNS subdomain) before they become part
/// of a request path: a name such as `../../api/v1/nodes/x` must never reach the URL.
fn check_claim_names(claim: &ClaimRef) -> Result<(), Error> {
    if let Err(reason) = kubedev_core::check_dns_label(&claim.namespace) {
        return Err(Error::InvalidClaimName {
            field: "namespace",
            value: claim.namespace.clone(),
            claim: format!("name {:?}, UID {}", claim.name, claim.uid),
            rule: NAMESPACE_RULE,
            reason,
        });
    }
    if let Err(reason) = kubedev_core::check_dns_subdomain(&claim.name, 253) {
        return Err(Error::InvalidClaimName {
            field: "name",
            value: claim.name.clone(),
            claim: format!("namespace {}, UID {}", claim.namespace, claim.uid),
            rule: NAME_RULE,
            reason,
        });
    }
    Ok(())
}

fn check_uid(expected: &ClaimRef, found: &res::ResourceClaim) -> Result<(), Error> {
    let actual = found.metadata.uid.clone().unwrap_or_default();
    if actual != expected.uid {
        return Err(Error::ClaimUidMismatch {
            namespace: expected.namespace.clone(),
            name: expected.name.clone(),
            expected: expected.uid.to_string(),
            actual,
        });
    }
    Ok(())
}

/// This driver's part of an allocated claim. Pure, so every rule is unit-tested.
pub(crate) fn allocated_claim(
    driver: &DriverName,
    expected: &ClaimRef,
    found: &res::ResourceClaim,
) -> Result<AllocatedClaim, Error> {
    check_uid(expected, found)?;
    let Some(allocation) = found.status.as_ref().and_then(|s| s.allocation.as_ref()) else {
        return Err(Error::ClaimNotAllocated {
            namespace: expected.namespace.clone(),
            name: expected.name.clone(),
            uid: expected.uid.to_string(),
        });
    };
    let content = |message: String| Error::ClaimContent {
        claim: expected.to_string(),
        message,
    };
    let empty = res::DeviceAllocationResult::default();
    let devices = allocation.devices.as_ref().unwrap_or(&empty);

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
                return Err(content(format!(
                    "config[{i}] has source {other:?}; expected FromClass or FromClaim"
                )));
            }
        };
        let RawExtension(parameters) = &opaque.parameters;
        config.push(OpaqueConfig {
            source,
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

    let mut results = Vec::new();
    for (i, result) in devices.results.iter().flatten().enumerate() {
        if result.driver != driver.as_str() {
            continue;
        }
        let pool = PoolName::new(result.pool.clone())
            .map_err(|e| content(format!("results[{i}]: {e}")))?;
        let device = DeviceName::new(result.device.clone())
            .map_err(|e| content(format!("results[{i}]: {e}")))?;
        let mut consumed_capacity = BTreeMap::new();
        for (name, q) in result.consumed_capacity.iter().flatten() {
            let value = Quantity::parse(&q.0)
                .map_err(|e| content(format!("results[{i}]: consumed capacity {name}: {e}")))?;
            consumed_capacity.insert(name.clone(), value);
        }
        let applicable = config
            .iter()
            .filter(|c| c.applies_to(&result.request))
            .map(|c| c.parameters.clone())
            .collect();
        results.push(DeviceResult {
            device: {
                let mut v = AllocatedDevice::new(DeviceRef { pool, device });
                v.admin_access = result.admin_access.unwrap_or(false);
                v.request = result.request.clone();
                v.share_id = result.share_id.clone();
                v.config = applicable;
                v
            },
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
        });
    }
    Ok(AllocatedClaim {
        claim: expected.clone(),
        results,
        config,
    })
}

/// Replaces this driver's entries for the given devices in `entries`.
pub(crate) fn merge_device_status(
    entries: &mut Vec<res::AllocatedDeviceStatus>,
    driver: &DriverName,
    devices: &[DeviceStatus],
    now: Timestamp,
) {
    for status in devices {
        let same = |e: &res::AllocatedDeviceStatus| {
            e.driver == driver.as_str()
                && e.pool == status.device.pool.as_str()
                && e.device == status.device.device.as_str()
                && e.share_id == status.share_id
        };
        let previous = entries.iter().position(same).map(|i| entries.remove(i));
        let old_conditions = previous
            .as_ref()
            .and_then(|p| p.conditions.clone())
            .unwrap_or_default();
        let conditions: Vec<Condition> = status
            .conditions
            .iter()
            .map(|c| {
                let kept = old_conditions
                    .iter()
                    .find(|o| o.type_ == c.kind && o.status == c.status.as_str())
                    .map(|o| o.last_transition_time.clone());
                Condition {
                    type_: c.kind.clone(),
                    status: c.status.as_str().to_owned(),
                    reason: c.reason.clone(),
                    message: c.message.clone(),
                    observed_generation: None,
                    last_transition_time: kept.unwrap_or(Time(now)),
                }
            })
            .collect();
        entries.push(res::AllocatedDeviceStatus {
            driver: driver.to_string(),
            pool: status.device.pool.to_string(),
            device: status.device.device.to_string(),
            share_id: status.share_id.clone(),
            conditions: (!conditions.is_empty()).then_some(conditions),
            data: status.data.clone().map(RawExtension),
            network_data: previous.and_then(|p| p.network_data),
        });
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::json;

    use super::*;

    fn driver() -> DriverName {
        DriverName::new("gpu.example.com").unwrap()
    }

    fn claim_ref() -> ClaimRef {
        ClaimRef::new("uid-1".parse().unwrap(), "team-a", "train")
    }

    fn claim(status: serde_json::Value) -> res::ResourceClaim {
        serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "train", "namespace": "team-a", "uid": "uid-1"},
            "spec": {},
            "status": status,
        }))
        .unwrap()
    }

    fn allocated() -> res::ResourceClaim {
        claim(json!({
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": "gpu.example.com", "pool": "node-a", "device": "gpu-0"},
                        {"request": "nic", "driver": "net.example.com", "pool": "node-a", "device": "eth-1"},
                        {"request": "gpu/large", "driver": "gpu.example.com", "pool": "node-a", "device": "gpu-1",
                         "shareID": "4b1e0a1c-5f5e-4a43-9d3c-8a5f0e1c2d3e", "adminAccess": true,
                         "consumedCapacity": {"memory": "10Gi"},
                         "tolerations": [{"key": "example.com/flaky", "operator": "Exists", "effect": "NoSchedule"}]}
                    ],
                    "config": [
                        {"source": "FromClaim", "requests": ["gpu"],
                         "opaque": {"driver": "gpu.example.com", "parameters": {"claim": "gpu"}}},
                        {"source": "FromClaim",
                         "opaque": {"driver": "gpu.example.com", "parameters": {"claim": "all"}}},
                        {"source": "FromClass", "requests": ["gpu"],
                         "opaque": {"driver": "gpu.example.com", "parameters": {"class": "gpu"}}},
                        {"source": "FromClass",
                         "opaque": {"driver": "net.example.com", "parameters": {"class": "net"}}},
                        {"source": "FromClaim", "requests": ["gpu/small"],
                         "opaque": {"driver": "gpu.example.com", "parameters": {"claim": "small"}}}
                    ]
                }
            }
        }))
    }

    #[test]
    fn results_of_other_drivers_are_left_out_and_config_is_ordered() {
        let out = allocated_claim(&driver(), &claim_ref(), &allocated()).unwrap();
        let devices: Vec<String> = out
            .results
            .iter()
            .map(|r| r.device.device.to_string())
            .collect();
        assert_eq!(devices, vec!["node-a/gpu-0", "node-a/gpu-1"]);

        let first = &out.results[0];
        assert_eq!(first.device.request, "gpu");
        assert_eq!(first.device.share_id, None);
        assert_eq!(
            first.device.config,
            vec![
                json!({"class": "gpu"}),
                json!({"claim": "gpu"}),
                json!({"claim": "all"})
            ]
        );
        assert!(!first.admin_access);

        // "gpu/large": configs for the main request "gpu" apply, the one for "gpu/small" not.
        let second = &out.results[1];
        assert_eq!(second.device.request, "gpu/large");
        assert_eq!(
            second.device.share_id.as_deref(),
            Some("4b1e0a1c-5f5e-4a43-9d3c-8a5f0e1c2d3e")
        );
        assert_eq!(
            second.device.config,
            vec![
                json!({"class": "gpu"}),
                json!({"claim": "gpu"}),
                json!({"claim": "all"})
            ]
        );
        assert!(second.admin_access);
        assert_eq!(
            second.consumed_capacity["memory"],
            Quantity::parse("10Gi").unwrap()
        );
        assert_eq!(second.tolerations.len(), 1);
        assert_eq!(second.tolerations[0].operator.as_deref(), Some("Exists"));

        let sources: Vec<ConfigSource> = out.config.iter().map(|c| c.source).collect();
        assert_eq!(
            sources,
            vec![
                ConfigSource::Class,
                ConfigSource::Claim,
                ConfigSource::Claim,
                ConfigSource::Claim
            ]
        );
        assert_eq!(out.devices().len(), 2);
    }

    #[test]
    fn a_different_uid_is_named() {
        let mut other = claim_ref();
        other.uid = "uid-0".parse().unwrap();
        let err = allocated_claim(&driver(), &other, &allocated()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "ResourceClaim team-a/train has UID uid-1, expected uid-0"
        );
    }

    #[test]
    fn an_unallocated_claim_is_an_error() {
        let err = allocated_claim(&driver(), &claim_ref(), &claim(json!({}))).unwrap_err();
        assert_eq!(
            err.to_string(),
            "ResourceClaim team-a/train (uid-1) is not allocated"
        );
        let mut no_status = claim(json!({}));
        no_status.status = None;
        assert!(matches!(
            allocated_claim(&driver(), &claim_ref(), &no_status),
            Err(Error::ClaimNotAllocated { .. })
        ));
    }

    #[test]
    fn an_allocation_without_our_devices_is_empty() {
        let out =
            allocated_claim(&driver(), &claim_ref(), &claim(json!({"allocation": {}}))).unwrap();
        assert!(out.results.is_empty() && out.config.is_empty());
    }

    #[test]
    fn bad_content_is_an_error_naming_the_value() {
        let bad = claim(json!({"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": "gpu.example.com", "pool": "node-a", "device": "GPU_0"}
        ]}}}));
        let err = allocated_claim(&driver(), &claim_ref(), &bad).unwrap_err();
        assert!(err.to_string().contains("\"GPU_0\""), "{err}");

        let bad = claim(json!({"allocation": {"devices": {"config": [
            {"source": "FromSomewhere", "opaque": {"driver": "gpu.example.com", "parameters": {}}}
        ]}}}));
        let err = allocated_claim(&driver(), &claim_ref(), &bad).unwrap_err();
        assert!(err.to_string().contains("FromSomewhere"), "{err}");

        let bad = claim(json!({"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": "gpu.example.com", "pool": "node-a", "device": "gpu-0",
             "consumedCapacity": {"memory": "lots"}}
        ]}}}));
        let err = allocated_claim(&driver(), &claim_ref(), &bad).unwrap_err();
        assert!(err.to_string().contains("memory"), "{err}");
    }

    #[test]
    fn device_status_replaces_our_entries_and_keeps_others() {
        let dev = |d: &str| DeviceRef {
            pool: PoolName::new("node-a").unwrap(),
            device: DeviceName::new(d).unwrap(),
        };
        let t0 = Timestamp::from_second(1_700_000_000).unwrap();
        let t1 = Timestamp::from_second(1_700_000_100).unwrap();
        let mut entries = vec![res::AllocatedDeviceStatus {
            driver: "net.example.com".into(),
            pool: "node-a".into(),
            device: "eth-1".into(),
            ..Default::default()
        }];
        merge_device_status(
            &mut entries,
            &driver(),
            &[DeviceStatus::ready(dev("gpu-0"), None)],
            t0,
        );
        assert_eq!(entries.len(), 2);
        let ready = &entries[1].conditions.as_ref().unwrap()[0];
        assert_eq!(
            (ready.type_.as_str(), ready.status.as_str()),
            ("Ready", "True")
        );
        assert_eq!(ready.last_transition_time, Time(t0));

        // Same status again: the transition time stays. A new status: it moves.
        merge_device_status(
            &mut entries,
            &driver(),
            &[DeviceStatus::ready(dev("gpu-0"), None)],
            t1,
        );
        assert_eq!(entries.len(), 2);
        assert_eq!(
            entries[1].conditions.as_ref().unwrap()[0].last_transition_time,
            Time(t0)
        );
        let mut failed = DeviceStatus::ready(dev("gpu-0"), None);
        failed.conditions = vec![DeviceCondition::new(
            "Ready",
            ConditionStatus::False,
            "Failed",
            "boom",
        )];
        merge_device_status(&mut entries, &driver(), &[failed], t1);
        assert_eq!(
            entries[1].conditions.as_ref().unwrap()[0].last_transition_time,
            Time(t1)
        );
        assert_eq!(entries[0].driver, "net.example.com");
    }

    #[test]
    fn applies_to_matches_main_requests_and_subrequests() {
        let c = |requests: &[&str]| OpaqueConfig {
            source: ConfigSource::Claim,
            requests: requests.iter().map(|s| s.to_string()).collect(),
            parameters: json!({}),
        };
        assert!(c(&[]).applies_to("gpu"));
        assert!(c(&["gpu"]).applies_to("gpu"));
        assert!(c(&["gpu"]).applies_to("gpu/large"));
        assert!(c(&["gpu/large"]).applies_to("gpu/large"));
        assert!(!c(&["gpu/large"]).applies_to("gpu/small"));
        assert!(!c(&["gpu/large"]).applies_to("gpu"));
        assert!(!c(&["nic"]).applies_to("gpu"));
        assert_eq!(base_request("gpu/large"), "gpu");
        assert_eq!(base_request("gpu"), "gpu");
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod client_tests {
    use std::sync::{Arc, Mutex};

    use http::{Request, Response, StatusCode};
    use kube::client::Body;
    use serde_json::json;

    use super::*;

    fn claim_json() -> serde_json::Value {
        json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "train", "namespace": "team-a", "uid": "uid-1", "resourceVersion": "7"},
            "spec": {},
            "status": {"allocation": {"devices": {"results": [
                {"request": "gpu", "driver": "gpu.example.com", "pool": "node-a", "device": "gpu-0"}
            ]}}}
        })
    }

    fn not_found() -> Response<Body> {
        let body = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "reason": "NotFound", "code": 404, "message": "not found"});
        Response::builder()
            .status(StatusCode::NOT_FOUND)
            .body(Body::from(serde_json::to_vec(&body).unwrap()))
            .unwrap()
    }

    fn conflict() -> Response<Body> {
        let body = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "reason": "Conflict", "code": 409, "message": "the object has been modified"});
        Response::builder()
            .status(StatusCode::CONFLICT)
            .body(Body::from(serde_json::to_vec(&body).unwrap()))
            .unwrap()
    }

    fn ok(value: &serde_json::Value) -> Response<Body> {
        Response::builder()
            .status(StatusCode::OK)
            .body(Body::from(serde_json::to_vec(value).unwrap()))
            .unwrap()
    }

    type Log = Arc<Mutex<Vec<(String, String, Vec<u8>)>>>;

    /// A fake API server holding one claim; the first `conflicts` status writes answer 409.
    fn fake(conflicts: usize) -> (Client, Log) {
        let log: Log = Arc::default();
        let seen = log.clone();
        let remaining = Arc::new(Mutex::new(conflicts));
        let service = tower::service_fn(move |req: Request<Body>| {
            let seen = seen.clone();
            let remaining = remaining.clone();
            async move {
                let method = req.method().to_string();
                let path = req.uri().path().to_owned();
                let body = http_body_util_collect(req.into_body()).await;
                seen.lock()
                    .unwrap()
                    .push((method.clone(), path.clone(), body));
                let base = "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/train";
                let response = match (method.as_str(), path.as_str()) {
                    ("GET", p) if p == base => ok(&claim_json()),
                    ("PATCH", p) if p == format!("{base}/status") => {
                        let mut left = remaining.lock().unwrap();
                        if *left > 0 {
                            *left -= 1;
                            conflict()
                        } else {
                            ok(&claim_json())
                        }
                    }
                    _ => not_found(),
                };
                Ok::<_, std::convert::Infallible>(response)
            }
        });
        (Client::new(service, "default"), log)
    }

    async fn http_body_util_collect(body: Body) -> Vec<u8> {
        use http_body_util::BodyExt;
        body.collect()
            .await
            .map(|c| c.to_bytes().to_vec())
            .unwrap_or_default()
    }

    fn claim_ref(uid: &str, name: &str) -> ClaimRef {
        ClaimRef::new(uid.parse().unwrap(), "team-a", name)
    }

    fn driver() -> DriverName {
        DriverName::new("gpu.example.com").unwrap()
    }

    #[tokio::test]
    async fn get_reads_the_claim_from_the_api_server() {
        let (client, log) = fake(0);
        let reader = ClaimReader::new(client, driver());
        let claim = reader.get(&claim_ref("uid-1", "train")).await.unwrap();
        assert_eq!(claim.results.len(), 1);
        assert_eq!(claim.results[0].device.device.to_string(), "node-a/gpu-0");
        {
            let log = log.lock().unwrap();
            assert_eq!(log.len(), 1);
            assert_eq!(log[0].0, "GET");
        }

        let err = reader.get(&claim_ref("uid-2", "train")).await.unwrap_err();
        assert!(matches!(err, Error::ClaimUidMismatch { .. }), "{err}");
    }

    #[tokio::test]
    async fn a_missing_claim_is_not_found() {
        let (client, _) = fake(0);
        let reader = ClaimReader::new(client, driver());
        let err = reader.get(&claim_ref("uid-1", "gone")).await.unwrap_err();
        assert_eq!(err.to_string(), "ResourceClaim team-a/gone not found");
    }

    #[tokio::test]
    async fn bad_claim_names_are_refused_before_any_request() {
        let dev = DeviceRef {
            pool: PoolName::new("node-a").unwrap(),
            device: DeviceName::new("gpu-0").unwrap(),
        };
        let (client, log) = fake(0);
        let reader = ClaimReader::new(client, driver());

        let traversal = claim_ref("uid-1", "../../../api/v1/nodes/x");
        let err = reader.get(&traversal).await.unwrap_err();
        assert!(
            matches!(err, Error::InvalidClaimName { field: "name", .. }),
            "{err}"
        );
        let text = err.to_string();
        assert!(
            text.starts_with(
                "ResourceClaim name \"../../../api/v1/nodes/x\" (namespace team-a, UID uid-1) \
                 is not a valid DNS subdomain"
            ),
            "{text}"
        );
        let err = reader
            .set_device_status(&traversal, &[DeviceStatus::ready(dev.clone(), None)])
            .await
            .unwrap_err();
        assert!(matches!(err, Error::InvalidClaimName { .. }), "{err}");

        let slash = claim_ref("uid-1", "train/status");
        let err = reader.get(&slash).await.unwrap_err();
        assert!(err.to_string().contains("contains '/'"), "{err}");

        let mut bad_namespace = claim_ref("uid-1", "train");
        bad_namespace.namespace = "team-a/resourceclaims/other".into();
        let err = reader.get(&bad_namespace).await.unwrap_err();
        assert_eq!(
            err.to_string(),
            "ResourceClaim namespace \"team-a/resourceclaims/other\" (name \"train\", UID uid-1) \
             is not a valid DNS label (at most 63 lowercase letters, digits or '-', starting and \
             ending with a letter or digit): contains '/'; only lowercase letters, digits and '-' \
             are allowed"
        );
        let mut long_namespace = claim_ref("uid-1", "train");
        long_namespace.namespace = "a".repeat(64);
        let err = reader.get(&long_namespace).await.unwrap_err();
        assert!(err.to_string().contains("no more than 63"), "{err}");

        assert!(log.lock().unwrap().is_empty(), "no request may be made");

        // Names longer than a DNS label are fine: a claim name is a subdomain.
        let long = "a".repeat(100);
        let err = reader.get(&claim_ref("uid-1", &long)).await.unwrap_err();
        assert!(matches!(err, Error::ClaimNotFound { .. }), "{err}");
        assert_eq!(log.lock().unwrap().len(), 1);
    }

    #[tokio::test]
    async fn status_writes_retry_conflicts_and_give_up_eventually() {
        let dev = DeviceRef {
            pool: PoolName::new("node-a").unwrap(),
            device: DeviceName::new("gpu-0").unwrap(),
        };
        let (client, log) = fake(2);
        let reader = ClaimReader::new(client, driver());
        reader
            .set_device_status(
                &claim_ref("uid-1", "train"),
                &[DeviceStatus::ready(dev.clone(), None)],
            )
            .await
            .unwrap();
        {
            let log = log.lock().unwrap();
            let patches: Vec<&(String, String, Vec<u8>)> =
                log.iter().filter(|(m, _, _)| m == "PATCH").collect();
            assert_eq!(patches.len(), 3, "two conflicts, then success");
            let sent: serde_json::Value = serde_json::from_slice(&patches[2].2).unwrap();
            assert_eq!(sent["metadata"]["resourceVersion"], "7");
            assert_eq!(sent["metadata"]["uid"], "uid-1");
            assert!(sent.get("spec").is_none(), "{sent}");
            let entry = &sent["status"]["devices"][0];
            assert_eq!(entry["driver"], "gpu.example.com");
            assert_eq!(entry["device"], "gpu-0");
            assert_eq!(entry["conditions"][0]["type"], "Ready");
            assert_eq!(entry["conditions"][0]["status"], "True");
        }

        let (client, _) = fake(100);
        let reader = ClaimReader::new(client, driver());
        let err = reader
            .set_device_status(
                &claim_ref("uid-1", "train"),
                &[DeviceStatus::ready(dev, None)],
            )
            .await
            .unwrap_err();
        assert!(
            matches!(err, Error::ClaimConflict { attempts: 5, .. }),
            "{err}"
        );
    }
}
