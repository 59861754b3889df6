//! What the objects with Kubernetes fields that allocation does not use are read as: those
//! fields are named (so any other key is an error) and dropped.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde::de::IgnoredAny;

use super::{DeviceClassConfiguration, DeviceSelector, ResourceClaimSpec, ResourceSliceSpec};

/// `metadata`: every ObjectMeta field of Kubernetes.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
#[allow(dead_code, reason = "fields read only to be accepted")]
pub(super) struct ObjectMeta {
    name: String,
    namespace: String,
    uid: String,
    labels: BTreeMap<String, String>,
    annotations: IgnoredAny,
    creation_timestamp: IgnoredAny,
    deletion_grace_period_seconds: IgnoredAny,
    deletion_timestamp: IgnoredAny,
    finalizers: IgnoredAny,
    generate_name: IgnoredAny,
    generation: IgnoredAny,
    managed_fields: IgnoredAny,
    owner_references: IgnoredAny,
    resource_version: IgnoredAny,
    self_link: IgnoredAny,
}

impl From<ObjectMeta> for super::ObjectMeta {
    fn from(m: ObjectMeta) -> Self {
        super::ObjectMeta {
            name: m.name,
            namespace: m.namespace,
            uid: m.uid,
            labels: m.labels,
        }
    }
}

/// A ResourceSlice with its type fields.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
#[allow(dead_code, reason = "fields read only to be accepted")]
pub(super) struct ResourceSlice {
    api_version: IgnoredAny,
    kind: IgnoredAny,
    metadata: super::ObjectMeta,
    spec: ResourceSliceSpec,
}

impl From<ResourceSlice> for super::ResourceSlice {
    fn from(s: ResourceSlice) -> Self {
        super::ResourceSlice {
            metadata: s.metadata,
            spec: s.spec,
        }
    }
}

/// A DeviceClass with its type fields.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
#[allow(dead_code, reason = "fields read only to be accepted")]
pub(super) struct DeviceClass {
    api_version: IgnoredAny,
    kind: IgnoredAny,
    metadata: super::ObjectMeta,
    spec: super::DeviceClassSpec,
}

impl From<DeviceClass> for super::DeviceClass {
    fn from(c: DeviceClass) -> Self {
        super::DeviceClass {
            metadata: c.metadata,
            spec: c.spec,
        }
    }
}

/// DeviceClass `spec` with `extendedResourceName`, which only the scheduler's
/// extended-resource path reads.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
#[allow(dead_code, reason = "fields read only to be accepted")]
pub(super) struct DeviceClassSpec {
    selectors: Vec<DeviceSelector>,
    config: Vec<DeviceClassConfiguration>,
    extended_resource_name: IgnoredAny,
}

impl From<DeviceClassSpec> for super::DeviceClassSpec {
    fn from(s: DeviceClassSpec) -> Self {
        super::DeviceClassSpec {
            selectors: s.selectors,
            config: s.config,
        }
    }
}

/// A ResourceClaim with its type fields and status.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
#[allow(dead_code, reason = "fields read only to be accepted")]
pub(super) struct ResourceClaim {
    api_version: IgnoredAny,
    kind: IgnoredAny,
    metadata: super::ObjectMeta,
    spec: ResourceClaimSpec,
    status: IgnoredAny,
}

impl From<ResourceClaim> for super::ResourceClaim {
    /// The claim as the API server stores it: a toleration without an operator has `Equal`
    /// (the scheduler copies tolerations into the allocation as stored).
    fn from(mut c: ResourceClaim) -> Self {
        let default = |ts: &mut Vec<super::DeviceToleration>| {
            for t in ts.iter_mut().filter(|t| t.operator.is_empty()) {
                t.operator = "Equal".into();
            }
        };
        for r in &mut c.spec.devices.requests {
            if let Some(e) = &mut r.exactly {
                default(&mut e.tolerations);
            }
            for s in &mut r.first_available {
                default(&mut s.tolerations);
            }
        }
        super::ResourceClaim {
            metadata: c.metadata,
            spec: c.spec,
        }
    }
}

/// A device taint with `timeAdded`, which allocation does not use.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
#[allow(dead_code, reason = "fields read only to be accepted")]
pub(super) struct DeviceTaint {
    key: String,
    value: String,
    effect: String,
    time_added: IgnoredAny,
}

/// `resource.k8s.io/v1` DeviceTaintRule, with its `status` (conditions the allocator does not
/// read).
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
#[allow(dead_code, reason = "fields read only to be accepted")]
pub(super) struct DeviceTaintRule {
    api_version: IgnoredAny,
    kind: IgnoredAny,
    metadata: super::ObjectMeta,
    spec: super::DeviceTaintRuleSpec,
    status: IgnoredAny,
}

impl From<DeviceTaintRule> for super::DeviceTaintRule {
    fn from(r: DeviceTaintRule) -> Self {
        super::DeviceTaintRule {
            metadata: r.metadata,
            spec: r.spec,
        }
    }
}

impl From<DeviceTaint> for super::DeviceTaint {
    fn from(t: DeviceTaint) -> Self {
        super::DeviceTaint {
            key: t.key,
            value: t.value,
            effect: t.effect,
        }
    }
}
