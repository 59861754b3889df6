//! The sysfs number parsers and `HostFs` attribute reads on arbitrary file contents: never
//! panic; what they accept prints back to the same number.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Some(v) = kubedev_core::hostfs::parse_hex(&text) {
        assert_eq!(
            kubedev_core::hostfs::parse_hex(&format!("0x{v:x}")),
            Some(v)
        );
    }
    if let Some(v) = kubedev_core::hostfs::parse_dec(&text) {
        assert_eq!(kubedev_core::hostfs::parse_dec(&v.to_string()), Some(v));
    }
    // Through the file system, as a backend reads them.
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("attr"), data).expect("write attr");
    let fs = kubedev_core::HostFs::new(dir.path());
    let _ = fs.read_hex("/attr");
    let _ = fs.read_dec("/attr");
    let _ = fs.read_attr_opt("/attr");
});
