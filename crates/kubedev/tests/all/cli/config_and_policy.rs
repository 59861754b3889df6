//! `kubedev check-config` and `kubedev policy-check`: bad fields and YAML errors worded for
//! people, good and bad policy modules.

use super::{SPLIT_CONFIG, fails_naming, plugin, scenario, succeeds, write_config};

#[test]
fn check_config_names_the_bad_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.yaml");
    std::fs::write(
        &path,
        "devicePlugin:\n  resources:\n    - name: gpu\nbackends:\n  static:\n    pool: p\n    devices: []\n",
    )
    .unwrap();
    fails_naming(
        &["check-config", "--config", path.to_str().unwrap()],
        "devicePlugin.resources[0].name",
    );
}

#[test]
fn policy_check_passes_a_good_module_and_fails_a_bad_one() {
    let out = succeeds(&["policy", "check", &plugin("numa-pack")]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("PASS") && text.contains("fuel"), "{text}");

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.wasm");
    std::fs::write(&bad, b"\0asm garbage").unwrap();
    fails_naming(&["policy", "check", bad.to_str().unwrap()], "bad.wasm");
}

#[test]
fn check_config_words_yaml_errors_for_people() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &format!("{SPLIT_CONFIG}nodeName: node-b\n"));
    let line = SPLIT_CONFIG.lines().count() + 1;
    let err = fails_naming(&["check-config", "--config", &config], "appears twice");
    assert_eq!(
        err,
        format!("kubedev: {config}: line {line}: key `nodeName` appears twice\n")
    );
    assert!(!err.contains("DuplicateKeyPolicy") && !err.contains("<input>"));
}

#[test]
fn policy_check_says_a_file_that_is_not_webassembly_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("readme.wasm");
    std::fs::write(&path, b"hello, this is text").unwrap();
    let p = path.to_string_lossy().into_owned();
    let err = fails_naming(&["policy", "check", &p], "is not a WebAssembly module");
    assert_eq!(
        err,
        format!("kubedev: {p} is not a WebAssembly module (it does not start with \\0asm)\n")
    );
    let err = fails_naming(
        &["simulate", "-f", &scenario("gpu8-c2.yaml"), "--policy", &p],
        "is not a WebAssembly module",
    );
    assert!(!err.contains("0x"), "{err}");
}
