//! The content of a CDI spec (`cdiVersion`, `kind`, devices, `containerEdits`), built from
//! kubedev's container edits, and the lowest CDI version that content needs.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use kubedev_core::{ContainerEdits, DeviceNode, Hook, Mount};

use super::CdiError;

/// A CDI spec file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct CdiSpec {
    /// The CDI spec version, e.g. `0.5.0`.
    pub cdi_version: String,
    /// `<vendor>/<class>`.
    pub kind: String,
    /// Spec-level annotations (CDI metadata; they do not reach the container).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// The devices.
    pub devices: Vec<CdiDevice>,
    /// Edits applied whenever any device of the spec is used.
    #[serde(default, skip_serializing_if = "CdiContainerEdits::is_empty")]
    pub container_edits: CdiContainerEdits,
}

/// One device of a CDI spec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct CdiDevice {
    /// The device name within the kind.
    pub name: String,
    /// Device annotations (CDI metadata).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// What the container needs for this device.
    pub container_edits: CdiContainerEdits,
}

/// CDI `containerEdits`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct CdiContainerEdits {
    /// Environment variables, `KEY=VALUE`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Device nodes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
    /// OCI hooks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<Hook>,
    /// Mounts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
    /// Additional group IDs for the container's process (CDI 0.7.0).
    #[serde(
        default,
        rename = "additionalGIDs",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub additional_gids: Vec<u32>,
}

impl CdiContainerEdits {
    /// True when the edits change nothing.
    pub fn is_empty(&self) -> bool {
        self.env.is_empty()
            && self.device_nodes.is_empty()
            && self.hooks.is_empty()
            && self.mounts.is_empty()
            && self.additional_gids.is_empty()
    }

    /// The CDI form of kubedev's container edits (annotations are not edits; they go on the
    /// device). Empty host paths and mount types are dropped, and a host path equal to the
    /// container path is left out, which is what it defaults to.
    pub fn from_edits(edits: &ContainerEdits) -> Self {
        CdiContainerEdits {
            env: edits.env.iter().map(|(k, v)| format!("{k}={v}")).collect(),
            device_nodes: edits
                .device_nodes
                .iter()
                .map(|n| {
                    let mut n = n.clone();
                    if n.host_path
                        .as_deref()
                        .is_some_and(|h| h.is_empty() || h == n.path)
                    {
                        n.host_path = None;
                    }
                    if n.permissions.as_deref() == Some("") {
                        n.permissions = None;
                    }
                    n
                })
                .collect(),
            hooks: edits.hooks.clone(),
            mounts: edits
                .mounts
                .iter()
                .map(|m| {
                    let mut m = m.clone();
                    if m.mount_type.as_deref() == Some("") {
                        m.mount_type = None;
                    }
                    m
                })
                .collect(),
            additional_gids: Vec::new(),
        }
    }

    /// These edits less every item `other` has.
    fn without(&self, other: &CdiContainerEdits) -> CdiContainerEdits {
        fn less<T: Clone + PartialEq>(items: &[T], other: &[T]) -> Vec<T> {
            items
                .iter()
                .filter(|x| !other.contains(x))
                .cloned()
                .collect()
        }
        CdiContainerEdits {
            env: less(&self.env, &other.env),
            device_nodes: less(&self.device_nodes, &other.device_nodes),
            hooks: less(&self.hooks, &other.hooks),
            mounts: less(&self.mounts, &other.mounts),
            additional_gids: less(&self.additional_gids, &other.additional_gids),
        }
    }

    /// Adds every item of `other` these edits lack, in `other`'s order.
    fn add_missing(&mut self, other: CdiContainerEdits) {
        fn add<T: PartialEq>(items: &mut Vec<T>, other: Vec<T>) {
            for x in other {
                if !items.contains(&x) {
                    items.push(x);
                }
            }
        }
        add(&mut self.env, other.env);
        add(&mut self.device_nodes, other.device_nodes);
        add(&mut self.hooks, other.hooks);
        add(&mut self.mounts, other.mounts);
        add(&mut self.additional_gids, other.additional_gids);
    }

    fn needs_host_path(&self) -> bool {
        self.device_nodes
            .iter()
            .any(|n| n.host_path.as_deref().is_some_and(|h| !h.is_empty()))
    }

    fn needs_mount_type(&self) -> bool {
        self.mounts
            .iter()
            .any(|m| m.mount_type.as_deref().is_some_and(|t| !t.is_empty()))
    }
}

impl CdiSpec {
    /// Moves the edits every device of the spec has in common to the spec's own
    /// `containerEdits`, which a runtime applies whenever any device of the spec is used, so
    /// they are written once (a GPU claim's driver libraries, tools and hooks). Mounts and hooks
    /// move whenever all devices share them; device nodes and environment variables only when
    /// every device still has an edit of its own afterwards (a CDI device must change the
    /// container). Nothing moves when the spec has fewer than two devices, or when a device
    /// would be left without edits.
    pub fn hoist_common_edits(&mut self) {
        if self.devices.len() < 2 {
            return;
        }
        fn common<T: Clone + PartialEq>(
            devices: &[CdiDevice],
            items: impl Fn(&CdiContainerEdits) -> &Vec<T>,
        ) -> Vec<T> {
            items(&devices[0].container_edits)
                .iter()
                .filter(|x| {
                    devices[1..]
                        .iter()
                        .all(|d| items(&d.container_edits).contains(x))
                })
                .cloned()
                .collect()
        }
        let mut shared = CdiContainerEdits {
            env: common(&self.devices, |e| &e.env),
            device_nodes: common(&self.devices, |e| &e.device_nodes),
            hooks: common(&self.devices, |e| &e.hooks),
            mounts: common(&self.devices, |e| &e.mounts),
            additional_gids: Vec::new(),
        };
        let all_keep_own = |shared: &CdiContainerEdits| {
            self.devices
                .iter()
                .all(|d| !d.container_edits.without(shared).is_empty())
        };
        if !all_keep_own(&shared) {
            shared.device_nodes.clear();
            shared.env.clear();
            if !all_keep_own(&shared) {
                return;
            }
        }
        for d in &mut self.devices {
            d.container_edits = d.container_edits.without(&shared);
        }
        self.container_edits.add_missing(shared);
    }

    /// The lowest CDI version whose features this spec uses (the rules of the CDI reference
    /// implementation):
    /// - 0.3.0: the baseline;
    /// - 0.4.0: a mount with a `type`;
    /// - 0.5.0: a device name that does not start with a letter, or a device node `hostPath`;
    /// - 0.6.0: annotations on the spec or a device, or a '.' in the class;
    /// - 0.7.0: `additionalGIDs`.
    pub fn minimum_version(&self) -> &'static str {
        let edits = || {
            std::iter::once(&self.container_edits)
                .chain(self.devices.iter().map(|d| &d.container_edits))
        };
        let class_has_dot = self
            .kind
            .split_once('/')
            .is_some_and(|(_, class)| class.contains('.'));
        if edits().any(|e| !e.additional_gids.is_empty()) {
            "0.7.0"
        } else if !self.annotations.is_empty()
            || self.devices.iter().any(|d| !d.annotations.is_empty())
            || class_has_dot
        {
            "0.6.0"
        } else if self
            .devices
            .iter()
            .any(|d| !d.name.starts_with(|c: char| c.is_ascii_alphabetic()))
            || edits().any(CdiContainerEdits::needs_host_path)
        {
            "0.5.0"
        } else if edits().any(CdiContainerEdits::needs_mount_type) {
            "0.4.0"
        } else {
            "0.3.0"
        }
    }

    /// A spec of `kind` (`<vendor>/<class>`) with one CDI device per named set of edits, in the
    /// order given, at the lowest version its content needs; validated (names, unique devices,
    /// non-empty edits). Each device keeps its own values: unlike a claim's spec, nothing is
    /// joined across devices; edits all devices share are written once, at the spec level
    /// ([`CdiSpec::hoist_common_edits`]).
    pub fn for_devices(kind: &str, devices: &[(String, ContainerEdits)]) -> Result<Self, CdiError> {
        let mut spec = CdiSpec {
            cdi_version: String::new(),
            kind: kind.to_owned(),
            annotations: BTreeMap::new(),
            devices: devices
                .iter()
                .map(|(name, edits)| CdiDevice {
                    name: name.clone(),
                    annotations: edits.annotations.clone(),
                    container_edits: CdiContainerEdits::from_edits(edits),
                })
                .collect(),
            container_edits: CdiContainerEdits::default(),
        };
        spec.hoist_common_edits();
        spec.cdi_version = spec.minimum_version().to_owned();
        spec.validate()?;
        Ok(spec)
    }
}
