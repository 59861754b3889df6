//! Tests of the harness's parts that need no podman: versions, fake node paths, ELF reading
//! and the spec check.
#![allow(clippy::unwrap_used)]

use std::os::unix::fs::MetadataExt as _;
use std::path::Path;

use sha2::Digest as _;

use super::FakeNode;
use super::check::Check;
use super::expect::{SpecExpectations, hex};
use super::tools::{is_static_elf, parse_version};

#[test]
fn versions_compare_as_numbers() {
    assert_eq!(parse_version("4.3.1"), Some((4, 3, 1)));
    assert_eq!(parse_version("4.10"), Some((4, 10, 0)));
    assert_eq!(parse_version("5.0.0-rc1"), Some((5, 0, 0)));
    assert!(parse_version("0.10.0") > parse_version("0.5.0"));
    assert_eq!(parse_version("x"), None);
}

#[test]
fn fake_nodes_stay_below_dev() {
    assert!(FakeNode::char("/dev/vfio/12", 240, 12).validate().is_ok());
    assert!(FakeNode::char("/etc/passwd", 1, 3).validate().is_err());
    assert!(FakeNode::char("/dev/../etc/x", 1, 3).validate().is_err());
}

#[test]
fn a_busybox_test_binary_is_recognised_as_an_elf() {
    // The test binary itself: an ELF file, dynamically linked on glibc targets.
    let me = std::env::current_exe().unwrap();
    assert!(is_static_elf(&me).is_some());
    assert_eq!(is_static_elf(Path::new("/nonexistent")), None);
}

#[test]
fn the_check_reports_every_difference_readably() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("f.txt");
    std::fs::write(&file, "hello\n").unwrap();
    let spec = serde_json::json!({
        "cdiVersion": "0.5.0", "kind": "example.com/x",
        "containerEdits": {"env": ["TOP=1"]},
        "devices": [{"name": "a", "containerEdits": {
            "env": ["A=x y"],
            "deviceNodes": [{"path": "/dev/fake0", "permissions": "rw"}],
            "mounts": [{"hostPath": file, "containerPath": "/etc/f.txt", "options": ["ro", "bind"]}]
        }}]
    })
    .to_string();
    let fakes = [FakeNode::char("/dev/fake0", 240, 1)];
    let e = SpecExpectations::new(&spec, &["example.com/x=a".to_string()], &fakes).unwrap();
    let check = Check::merge(vec![e]);
    let script = check.script();
    assert!(
        script.contains("stat -c '%F|%t|%T|%a|%u|%g' '/dev/fake0'"),
        "{script}"
    );
    let hex_env = hex(b"TOP=1\0A=x y\0PATH=/bin\0");
    let sha = hex(&sha2::Sha256::digest(b"hello\n"));
    let meta = std::fs::metadata(&file).unwrap();
    let good = format!(
        "@kubedev-check n0.stat character special file|f0|1|666|0|0\n\
         @kubedev-check n0.read sh: can't open '/dev/fake0': No such device or address\n\
         @kubedev-check n0.write\n\
         @kubedev-check m0.stat regular file|{}|{}\n\
         @kubedev-check m0.sha {sha}  -\n\
         @kubedev-check m0.ro touch: /etc/f.txt: Read-only file system rc=1\n\
         @kubedev-check env {hex_env}\n",
        meta.dev(),
        meta.ino()
    );
    assert_eq!(check.failures(&good), Vec::<String>::new());
    let bad = good
        .replace("f0|1|", "f0|2|")
        .replace("No such device or address", "Operation not permitted")
        .replace(&sha, "00")
        .replace("Read-only file system rc=1", "rc=0")
        .replace(&hex_env, &hex(b"TOP=2\0"));
    let fails = check.failures(&bad);
    assert_eq!(fails.len(), 6, "{fails:#?}");
    assert!(
        fails[0].contains("expected a character device 240:1"),
        "{fails:#?}"
    );
    assert!(
        fails[1].contains("refused by the device cgroup"),
        "{fails:#?}"
    );
    assert!(fails[2].contains("content differs"), "{fails:#?}");
    assert!(fails[3].contains("options say ro"), "{fails:#?}");
    assert!(
        fails.iter().any(|f| f.contains("env A is not set")),
        "{fails:#?}"
    );
    assert!(
        fails.iter().any(|f| f.contains("env TOP should be \"1\"")),
        "{fails:#?}"
    );
    assert!(
        check.failures("").iter().all(|f| f.contains("printed no")),
        "a container that never ran fails every check"
    );
}
