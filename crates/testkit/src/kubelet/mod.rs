//! A kubelet emulator: the kubelet's side of the Device Plugin API.
//!
//! Like the kubelet it serves `Registration` on `kubelet.sock` in the device-plugin directory,
//! validates each registration (API version, extended resource name), dials the plugin's socket,
//! asks for its options, follows its `ListAndWatch` stream and keeps capacity (all devices) and
//! allocatable (healthy devices) per resource. It calls `Allocate`, `GetPreferredAllocation` and
//! `PreStartContainer` as the kubelet does, and can "restart": delete every socket in the
//! directory and listen again.

mod device_plugin;

pub use device_plugin::{DeviceState, KubeletEmulator, RegistrationRecord, ResourceState};
