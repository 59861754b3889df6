//! Tests of the checkpoint, by topic in the modules below; the fixture they share is here.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use super::*;
use crate::test_dir::TestDir;
use kubedev_core::{
    AllocatedDevice, ClaimRef, ContainerEdits, DeviceName, DeviceNode, DeviceRef, PoolName,
    PreparedDevice,
};

const BOOT_A: &str = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
const BOOT_B: &str = "11111111-2222-3333-4444-555555555555";

/// A data directory with a boot ID file outside it.
struct Fixture {
    dir: TestDir,
    boot_dir: TestDir,
}

impl Fixture {
    fn new() -> Self {
        let f = Fixture {
            dir: TestDir::new("ckpt"),
            boot_dir: TestDir::new("boot"),
        };
        f.set_boot(BOOT_A);
        f
    }
    fn set_boot(&self, id: &str) {
        fs::write(self.boot_path(), format!("{id}\n")).unwrap();
    }
    fn boot_path(&self) -> PathBuf {
        self.boot_dir.path().join("boot_id")
    }
    fn open(&self) -> (CheckpointStore, LoadOutcome) {
        CheckpointStore::open(self.dir.path(), self.boot_path()).unwrap()
    }
    fn file(&self) -> PathBuf {
        self.dir.path().join(CHECKPOINT_FILE)
    }
}

/// One change at a time, as the tests make them (the driver commits several at once).
impl CheckpointStore {
    fn apply_one(&mut self, change: Change) -> Result<(), CheckpointError> {
        self.apply(vec![change])?.pop().unwrap_or(Ok(()))
    }

    fn start_prepare(
        &mut self,
        claim: &ClaimRef,
        devices: &[AllocatedDevice],
    ) -> Result<(), CheckpointError> {
        self.apply_one(Change::Start {
            claim: claim.clone(),
            devices: devices.to_vec(),
        })
    }

    fn complete_prepare(
        &mut self,
        uid: &str,
        prepared: &[PreparedDevice],
        cdi_file: Option<&str>,
    ) -> Result<(), CheckpointError> {
        self.apply_one(Change::Complete {
            uid: uid.parse().unwrap(),
            prepared: prepared.to_vec(),
            cdi_file: cdi_file.map(str::to_owned),
            pod_claim_name: None,
        })
    }
}

fn claim(uid: &str) -> ClaimRef {
    ClaimRef::parse(uid, "default", &format!("claim-{uid}")).unwrap()
}

fn allocated(device: &str) -> AllocatedDevice {
    AllocatedDevice::new(DeviceRef::new(
        PoolName::new("node-a").unwrap(),
        DeviceName::new(device).unwrap(),
    ))
    .with_request("gpu")
    .with_config(vec![kubedev_core::DeviceConfig::new(
        kubedev_core::ConfigSource::Claim,
        0,
        serde_json::json!({"mode": "exclusive", "ratio": 0.25}),
    )])
}

fn prepared(device: &str) -> PreparedDevice {
    let mut edits = ContainerEdits::default();
    edits.env.insert("VISIBLE".into(), device.into());
    edits
        .device_nodes
        .push(DeviceNode::new(format!("/dev/{device}"), "rw"));
    PreparedDevice::new(allocated(device), edits)
}

mod boot;
mod file_format;
mod instances;
mod records;
