//! A kubelet emulator: the kubelet's side of the Device Plugin API.
//!
//! Like the kubelet it serves `Registration` on `kubelet.sock` in the device-plugin directory,
//! validates each registration (API version, extended resource name), dials the plugin's socket,
//! asks for its options, follows its `ListAndWatch` stream and keeps capacity (all devices) and
//! allocatable (healthy devices) per resource. It calls `Allocate`, `GetPreferredAllocation` and
//! `PreStartContainer` as the kubelet does, and can "restart": delete every socket in the
//! directory and listen again.
//!
//! [`DraKubelet`] is the DRA side: it watches the plugin registry directory like the kubelet's
//! plugin watcher, calls `GetInfo`, validates it, chooses the API version as the kubelet does
//! (the first entry of the plugin's list it supports), sends `NotifyRegistrationStatus`, calls
//! prepare and unprepare, and follows the health stream.

mod device_plugin;
mod dra;
mod pod_resources;

use kubedev_kubelet_grpc::authority::ClientAuthority;

pub use device_plugin::{DeviceState, KubeletEmulator, RegistrationRecord, ResourceState};
pub use dra::{
    ClaimId, DEFAULT_HEALTH_TIMEOUT, DeviceHealthSeen, DraDriverState, DraKubelet,
    KUBELET_DRA_SERVICES, PrepareAnswer, PreparedDeviceAnswer,
};
pub use pod_resources::PodResourcesEmulator;

/// A kubelet release the emulator dials like.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[non_exhaustive]
pub enum KubeletRelease {
    /// Kubernetes 1.34 (grpc-go 1.72).
    V1_34,
    /// Kubernetes 1.35 (grpc-go 1.72).
    V1_35,
    /// Kubernetes 1.36 (grpc-go 1.79).
    V1_36,
    /// Kubernetes 1.37 (grpc-go 1.81).
    V1_37,
    /// Kubernetes 1.38 (planned; dials as 1.37 does).
    #[default]
    V1_38,
}

impl KubeletRelease {
    /// Every release kubedev supports, oldest first.
    pub const ALL: [KubeletRelease; 5] = [
        KubeletRelease::V1_34,
        KubeletRelease::V1_35,
        KubeletRelease::V1_36,
        KubeletRelease::V1_37,
        KubeletRelease::V1_38,
    ];

    /// Whether this release's kubelet opens the resource health stream of every DRA plugin,
    /// advertised or not, as `v1alpha1`, and opens it again 5 s after any failure
    /// (`Unimplemented` included; 1.34 to 1.36 with `ResourceHealthStatus` on). From 1.37 the
    /// kubelet opens it only where the plugin advertises a health service, prefers `v1`, and
    /// stops for good on `Unimplemented` (kubernetes/kubernetes#139477).
    pub fn watches_health_unadvertised(self) -> bool {
        self <= KubeletRelease::V1_36
    }

    /// How this release's kubelet dials plugin sockets.
    pub fn dialing(self) -> KubeletDialing {
        // The same calls in every supported release (read from the kubelet's source at each
        // tag); grpc-go percent-encodes a path target as the authority since 1.57, so all of
        // them send the same bytes.
        KubeletDialing {
            registration: ClientAuthority::EscapedSocketPath,
            dra: ClientAuthority::Localhost,
            device_plugin: ClientAuthority::Localhost,
        }
    }
}

/// The HTTP/2 `:authority` a kubelet sends on each kind of plugin socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeletDialing {
    /// The plugin watcher dialing a registration socket
    /// (`pluginmanager/operationexecutor`): `grpc.DialContext(ctx, socketPath, …,
    /// WithContextDialer(unix))`, a path target, so grpc-go sends the path percent-encoded.
    pub registration: ClientAuthority,
    /// The DRA manager dialing the endpoint from `GetInfo` (`cm/dra/plugin`):
    /// `grpc.NewClient("unix:" + endpoint)`, so `localhost`; the health stream shares the
    /// connection.
    pub dra: ClientAuthority,
    /// The device manager dialing a device plugin (`cm/devicemanager/plugin/v1beta1`):
    /// `grpc.DialContext(…, WithAuthority("localhost"))`.
    pub device_plugin: ClientAuthority,
}
