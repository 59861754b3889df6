//! CDI spec files kubedev reads back: a claim's spec file holding arbitrary bytes is repaired to
//! exactly what kubedev writes, and arbitrary JSON read as a spec is validated without panics;
//! a spec that validates prints and reads back the same.
#![no_main]

use std::path::PathBuf;

use kubedev::cdi::{CdiSpec, CdiWriter, SpecCheck};
use kubedev_core::{
    AllocatedDevice, ClaimUid, ContainerEdits, DeviceName, DeviceRef, DriverName, PoolName,
    PreparedDevice,
};
use libfuzzer_sys::fuzz_target;

const UID: &str = "0b7c2d8e-1111-4000-8000-000000000001";

struct Fixture {
    _root: tempfile::TempDir,
    dir: PathBuf,
    writer: CdiWriter,
    prepared: Vec<PreparedDevice>,
}

fn fixture() -> &'static Fixture {
    static F: std::sync::OnceLock<Fixture> = std::sync::OnceLock::new();
    F.get_or_init(|| {
        let root = tempfile::tempdir().expect("temp dir");
        let dir = root.path().join("cdi");
        let driver = DriverName::new("gpu.example.com").expect("driver");
        let writer = CdiWriter::new(&dir, &driver);
        let device = DeviceRef::new(
            PoolName::new("node-a").expect("pool"),
            DeviceName::new("gpu-0").expect("device"),
        );
        let mut edits = ContainerEdits::default();
        edits.env.insert("VISIBLE".into(), "gpu-0".into());
        edits
            .device_nodes
            .push(kubedev_core::DeviceNode::new("/dev/null", "rw"));
        let prepared = vec![PreparedDevice::new(
            AllocatedDevice::new(device).with_request("gpu"),
            edits,
        )];
        Fixture {
            _root: root,
            dir,
            writer,
            prepared,
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let f = fixture();
    let uid = ClaimUid::new(UID).expect("claim UID");
    std::fs::create_dir_all(&f.dir).expect("cdi dir");
    let path = f.writer.claim_file(&uid).expect("claim file");
    std::fs::write(&path, data).expect("write spec");
    let check = f
        .writer
        .ensure_claim(&uid, &f.prepared)
        .unwrap_or_else(|e| panic!("a damaged spec must be rewritten: {e}"));
    let again = f
        .writer
        .ensure_claim(&uid, &f.prepared)
        .expect("ensure again");
    assert!(
        matches!(again, SpecCheck::Intact),
        "{check:?} then {again:?}"
    );
    assert_eq!(f.writer.list_claim_files().expect("list").len(), 1);

    if let Ok(spec) = serde_json::from_slice::<CdiSpec>(data)
        && spec.validate().is_ok()
    {
        let printed = serde_json::to_vec(&spec).expect("serialize");
        let back: CdiSpec = serde_json::from_slice(&printed).expect("printed spec parses");
        assert_eq!(back, spec);
        back.validate().expect("printed spec validates");
    }
});
