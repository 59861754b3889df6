//! A device-metadata file left by an earlier daemon (or by anyone who can write the plugin
//! directory) holding arbitrary bytes: bringing it up to date never panics or fails on content,
//! its generation never goes below 1, and the file it leaves is stable (a second update leaves
//! it unchanged) and readable as a stream of metadata objects.
#![no_main]

use std::path::PathBuf;

use kubedev::metadata::{FileUpdate, MetadataWriter};
use kubedev_core::{
    AllocatedDevice, ClaimRef, ClaimUid, ContainerEdits, DeviceName, DeviceRef, DriverName,
    PoolName, PreparedDevice,
};
use libfuzzer_sys::fuzz_target;

struct Fixture {
    _root: tempfile::TempDir,
    writer: MetadataWriter,
    claim: ClaimRef,
    prepared: Vec<PreparedDevice>,
    file: kubedev::metadata::RequestFile,
}

fn fixture() -> &'static Fixture {
    static F: std::sync::OnceLock<Fixture> = std::sync::OnceLock::new();
    F.get_or_init(|| {
        let root = tempfile::tempdir().expect("temp dir");
        let plugins: PathBuf = root.path().join("plugins");
        let driver = DriverName::new("gpu.example.com").expect("driver");
        let writer = MetadataWriter::new(&plugins, &root.path().join("cdi"), &driver);
        let claim = ClaimRef::new(
            ClaimUid::new("0b7c2d8e-1111-4000-8000-000000000001").expect("uid"),
            "default".parse().expect("namespace"),
            "train".parse().expect("name"),
        );
        let device = DeviceRef::new(
            PoolName::new("node-a").expect("pool"),
            DeviceName::new("gpu-0").expect("device"),
        );
        let prepared = vec![PreparedDevice::new(
            AllocatedDevice::new(device).with_request("gpu"),
            ContainerEdits::default(),
        )];
        let file = writer
            .files(&claim, None, &prepared)
            .expect("files")
            .remove(0);
        std::fs::create_dir_all(file.host_path.parent().expect("parent")).expect("dir");
        Fixture {
            _root: root,
            writer,
            claim,
            prepared,
            file,
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let f = fixture();
    std::fs::write(&f.file.host_path, data).expect("write file");
    let first = f
        .writer
        .update_file(&f.claim, None, &f.file, &f.prepared, None)
        .unwrap_or_else(|e| panic!("an unreadable file must be replaced: {e}"));
    assert!(first.generation() >= 1, "{first:?}");
    let second = f
        .writer
        .update_file(&f.claim, None, &f.file, &f.prepared, None)
        .expect("update again");
    assert_eq!(
        second,
        FileUpdate::Unchanged {
            generation: first.generation()
        }
    );
    let bytes = std::fs::read(&f.file.host_path).expect("read back");
    for object in serde_json::Deserializer::from_slice(&bytes).into_iter::<serde_json::Value>() {
        let object = object.expect("the file is a stream of JSON objects");
        assert_eq!(object["metadata"]["generation"], first.generation());
    }
});
