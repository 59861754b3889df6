//! Tests of the CDI specs, by topic in the modules below; the helpers they share are here.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use serde_json::json;

use super::*;
use crate::test_dir::TestDir;
use kubedev_core::{
    AllocatedDevice, ContainerEdits, DeviceName, DeviceNode, DeviceNodeType, DeviceRef, DriverName,
    Hook, Mount, PoolName, PreparedDevice,
};

const UID: &str = "a1b2c3d4-0000-4000-8000-000000000001";
const DIGIT_UID: &str = "0b8a6c3e-1111-4111-8111-000000000002";

/// `s` as a checked claim UID.
fn cuid(s: &str) -> kubedev_core::ClaimUid {
    kubedev_core::ClaimUid::new(s).unwrap()
}

fn writer(dir: &Path) -> CdiWriter {
    CdiWriter::new(dir, &DriverName::new("gpu.example.com").unwrap())
}

fn allocated(device: &str, share: Option<&str>) -> AllocatedDevice {
    {
        let mut v = AllocatedDevice::new(DeviceRef::new(
            PoolName::new("node-a").unwrap(),
            DeviceName::new(device).unwrap(),
        ));
        v.request = "gpu".into();
        v.share_id = share.map(str::to_owned);
        v
    }
}

fn prepared(device: &str) -> PreparedDevice {
    let mut edits = ContainerEdits::default();
    edits.env.insert("GPU_VISIBLE".into(), device.into());
    edits
        .device_nodes
        .push(DeviceNode::new(format!("/dev/{device}"), "rw"));
    PreparedDevice::new(allocated(device, None), edits)
}

mod content;
mod files;
mod validation;
