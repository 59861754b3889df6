//! The `Preparer` trait: how a backend turns allocated devices into container edits.

use std::fmt;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::edits::ContainerEdits;
use crate::error::PrepareError;
use crate::model::DeviceRef;
use crate::names::{ClaimName, ClaimUid, NameError, Namespace};
use crate::opaque::DeviceConfig;

/// The ResourceClaim a DRA prepare is for.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ClaimRef {
    /// The claim's UID (unique for the claim's lifetime).
    pub uid: ClaimUid,
    /// Namespace.
    pub namespace: Namespace,
    /// Name.
    pub name: ClaimName,
}

impl ClaimRef {
    /// The claim `namespace/name` with `uid`.
    pub fn new(uid: ClaimUid, namespace: Namespace, name: ClaimName) -> Self {
        ClaimRef {
            uid,
            namespace,
            name,
        }
    }

    /// The claim `namespace/name` with `uid`, each checked; the error names the first that
    /// breaks its rule.
    pub fn parse(uid: &str, namespace: &str, name: &str) -> Result<Self, NameError> {
        Ok(ClaimRef::new(
            uid.parse()?,
            namespace.parse()?,
            name.parse()?,
        ))
    }
}

impl fmt::Display for ClaimRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{} ({})", self.namespace, self.name, self.uid)
    }
}

/// Who devices are being prepared for.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Consumer {
    /// A DRA ResourceClaim; `unprepare` will be called for it later.
    Claim(ClaimRef),
    /// A container through the device-plugin API (`Allocate`); there is no unprepare in that
    /// API, so host changes made for it are never undone by the kubelet.
    Container {
        /// The extended resource name the devices were requested as.
        resource: String,
    },
}

/// One device the scheduler (DRA) or the kubelet (device plugin) allocated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct AllocatedDevice {
    /// The device.
    pub device: DeviceRef,
    /// The request it satisfies (DRA; empty for device-plugin allocations).
    #[serde(default)]
    pub request: String,
    /// The share ID when the device allows multiple allocations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
    /// The opaque configuration entries for this driver that apply to this device's request, in
    /// order of precedence (class entries first, then the claim's, each in list order); see
    /// [`effective_config`](crate::opaque::effective_config).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub config: Vec<DeviceConfig>,
    /// The device was allocated with admin access (DRA `adminAccess`): for monitoring or
    /// maintenance next to its users, so it does not count as a use of an exclusive device.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub admin_access: bool,
}

impl AllocatedDevice {
    /// `device`, allocated for no named request, without share ID, configuration or admin
    /// access (what the device-plugin API allocates).
    pub fn new(device: DeviceRef) -> Self {
        AllocatedDevice {
            device,
            request: String::new(),
            share_id: None,
            config: Vec::new(),
            admin_access: false,
        }
    }

    /// For the request named `request`.
    pub fn with_request(mut self, request: impl Into<String>) -> Self {
        self.request = request.into();
        self
    }

    /// With the share ID of a device allowing multiple allocations.
    pub fn with_share_id(mut self, share_id: impl Into<String>) -> Self {
        self.share_id = Some(share_id.into());
        self
    }

    /// With the opaque configuration for this driver, class first, claim last.
    pub fn with_config(mut self, config: Vec<DeviceConfig>) -> Self {
        self.config = config;
        self
    }

    /// Allocated with admin access or not.
    pub fn with_admin_access(mut self, admin_access: bool) -> Self {
        self.admin_access = admin_access;
        self
    }
}

/// One prepared device and what a container needs to use it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct PreparedDevice {
    /// The device as allocated.
    pub device: AllocatedDevice,
    /// The container edits for this device alone.
    pub edits: ContainerEdits,
    /// What the backend tells the cluster about the prepared device, written as the device's
    /// `data` in the ResourceClaim's `status.devices` (e.g. a PCI address, a GPU UUID and MIG
    /// instance); a JSON object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_data: Option<serde_json::Value>,
    /// The network interface the device is, for `status.devices[].networkData`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkData>,
}

impl PreparedDevice {
    /// `device`, prepared into `edits`.
    pub fn new(device: AllocatedDevice, edits: ContainerEdits) -> Self {
        PreparedDevice {
            device,
            edits,
            status_data: None,
            network: None,
        }
    }

    /// With `data` for the claim's status (a JSON object).
    pub fn with_status_data(mut self, data: serde_json::Value) -> Self {
        self.status_data = Some(data);
        self
    }

    /// With the network interface the device is.
    pub fn with_network(mut self, network: NetworkData) -> Self {
        self.network = Some(network);
        self
    }
}

/// A prepared device as a network interface, as `resource.k8s.io/v1` `NetworkDeviceData` has
/// it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct NetworkData {
    /// The interface name in the pod's network namespace (at most 256 characters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface_name: Option<String>,
    /// Its addresses in CIDR notation (`10.0.0.5/24`), at most 16.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ips: Vec<String>,
    /// Its hardware (MAC) address (at most 128 characters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hardware_address: Option<String>,
}

impl NetworkData {
    /// The interface `name`, without addresses.
    pub fn interface(name: impl Into<String>) -> Self {
        NetworkData {
            interface_name: Some(name.into()),
            ..Default::default()
        }
    }

    /// With the addresses `ips` (CIDR notation).
    pub fn with_ips(mut self, ips: Vec<String>) -> Self {
        self.ips = ips;
        self
    }

    /// With the hardware address `mac`.
    pub fn with_hardware_address(mut self, mac: impl Into<String>) -> Self {
        self.hardware_address = Some(mac.into());
        self
    }
}

/// A backend's way of handing devices to containers.
///
/// Contract:
/// - `prepare` is idempotent: preparing the same consumer and devices again returns an equal
///   answer and does not repeat host changes that are already in place.
/// - `unprepare` is idempotent and succeeds for devices that were never prepared or are already
///   unprepared; it undoes every host change `prepare` made (an mdev created, a driver rebound).
/// - The runtime serialises calls for one claim; different claims may be prepared concurrently,
///   so host changes must be safe against each other (distinct devices never share state unless
///   the backend locks it).
/// - The runtime records each prepare in its checkpoint before and after the call; after a crash
///   it calls `unprepare` for a prepare that had started but not completed. The backend cleans up
///   its own host changes; the runtime cleans up CDI files and the checkpoint.
/// - Errors name the device and what failed; they never panic on unknown devices.
#[async_trait]
pub trait Preparer: Send + Sync + 'static {
    /// Prepares `devices` for `consumer`, returning one entry per device in the same order.
    async fn prepare(
        &self,
        consumer: &Consumer,
        devices: &[AllocatedDevice],
    ) -> Result<Vec<PreparedDevice>, PrepareError>;

    /// Undoes `prepare` for a claim.
    async fn unprepare(
        &self,
        claim: &ClaimRef,
        devices: &[AllocatedDevice],
    ) -> Result<(), PrepareError>;

    /// The container edits `device` gives a container, worked out without changing the host;
    /// `kubedev cdi generate` writes them as a CDI spec ahead of any allocation.
    ///
    /// `Ok(None)` means they are only known once `prepare` has acted on the host (a MIG instance
    /// it creates, a driver it binds) or depend on who asks; the default says so for every
    /// device. An unknown or unusable device is an error, as in `prepare`.
    async fn planned_edits(
        &self,
        device: &DeviceRef,
    ) -> Result<Option<ContainerEdits>, PrepareError> {
        let _ = device;
        Ok(None)
    }

    /// The container edits `prepared` (a device this backend prepared earlier) gives a container
    /// now, when they are no longer `prepared.edits`: a driver upgraded or reloaded under a
    /// running daemon replaces the files its edits mount. `Ok(None)` when they still hold; the
    /// runtime rewrites the claim's CDI spec and record with new edits. The default: a
    /// device's edits never change once prepared.
    async fn refreshed_edits(
        &self,
        prepared: &PreparedDevice,
    ) -> Result<Option<ContainerEdits>, PrepareError> {
        let _ = prepared;
        Ok(None)
    }

    /// Called by the device-plugin API before a container starts (`PreStartContainer`), e.g. to
    /// reset a device. Must finish well within the kubelet's 30 s; the default does nothing.
    async fn pre_start(&self, devices: &[DeviceRef]) -> Result<(), PrepareError> {
        let _ = devices;
        Ok(())
    }

    /// Whether `pre_start` does anything (advertised to the kubelet).
    fn needs_pre_start(&self) -> bool {
        false
    }
}

/// The main request of a request name: `gpu` for the FirstAvailable subrequest `gpu/large`, and
/// `gpu` itself for `gpu`.
pub fn base_request(request: &str) -> &str {
    request.split_once('/').map_or(request, |(base, _)| base)
}
