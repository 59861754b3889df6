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

pub use device_plugin::{DeviceState, KubeletEmulator, RegistrationRecord, ResourceState};
pub use dra::{
    ClaimId, DeviceHealthSeen, DraDriverState, DraKubelet, KUBELET_DRA_SERVICES, PrepareAnswer,
    PreparedDeviceAnswer,
};
pub use pod_resources::PodResourcesEmulator;
