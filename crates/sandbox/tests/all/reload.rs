//! Hot reload from a directory: a bad module never replaces a good one.

use kubedev_sandbox::{PolicyDir, PolicyError};

use crate::common::*;

#[test]
fn a_directory_loads_good_policies_and_reports_bad_ones() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("numa-pack.wasm"), plugin_bytes("numa-pack")).unwrap();
    std::fs::write(dir.path().join("spread.wasm"), plugin_bytes("spread")).unwrap();
    std::fs::write(dir.path().join("broken.wasm"), b"not wasm").unwrap();
    std::fs::write(dir.path().join("README.md"), b"ignored").unwrap();
    let (policies, report) = PolicyDir::open(&sandbox(), dir.path()).unwrap();
    assert_eq!(policies.names(), names(&["numa-pack", "spread"]));
    assert_eq!(sorted(report.added), names(&["numa-pack", "spread"]));
    assert_eq!(report.rejected.len(), 1);
    assert_eq!(report.rejected[0].0, "broken");
    let not_wasm = &report.rejected[0].1;
    assert!(
        matches!(not_wasm, PolicyError::NotWasm { .. }),
        "{not_wasm:?}"
    );
    assert_eq!(
        not_wasm.to_string(),
        format!(
            "{} is not a WebAssembly module (it does not start with \\0asm)",
            dir.path().join("broken.wasm").display()
        )
    );
    // Nothing changed: nothing to do, and the broken file is not retried.
    assert!(policies.reload().is_empty());
}

#[test]
fn a_bad_replacement_keeps_the_old_policy() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vendor.wasm");
    std::fs::write(&path, plugin_bytes("numa-pack")).unwrap();
    let (policies, _) = PolicyDir::open(&sandbox(), dir.path()).unwrap();
    let original = policies.get("vendor").unwrap().digest();

    // Garbage: refused at compile time.
    std::fs::write(&path, b"\0asm garbage").unwrap();
    let report = policies.reload();
    assert!(matches!(
        report.rejected.as_slice(),
        [(name, PolicyError::BadModule { .. })] if name == "vendor"
    ));
    assert_eq!(policies.get("vendor").unwrap().digest(), original);

    // Keeps the contract but loops: refused by the sample run.
    std::fs::write(&path, wat_policy("(loop $l (br $l)) (unreachable)")).unwrap();
    let report = policies.reload();
    assert!(matches!(
        report.rejected.as_slice(),
        [(_, PolicyError::OutOfFuel { .. })]
    ));
    assert_eq!(policies.get("vendor").unwrap().digest(), original);

    // Keeps the contract but answers garbage.
    std::fs::write(&path, fixed_output_policy(b"garbage")).unwrap();
    assert!(matches!(
        policies.reload().rejected.as_slice(),
        [(_, PolicyError::BadOutput { .. })]
    ));
    assert_eq!(policies.get("vendor").unwrap().digest(), original);

    // A good module replaces it.
    std::fs::write(&path, plugin_bytes("spread")).unwrap();
    let report = policies.reload();
    assert_eq!(report.replaced, names(&["vendor"]));
    assert_ne!(policies.get("vendor").unwrap().digest(), original);

    // The file goes: so does the policy.
    std::fs::remove_file(&path).unwrap();
    assert_eq!(policies.reload().removed, names(&["vendor"]));
    assert!(policies.get("vendor").is_none());
}

#[test]
fn a_policy_in_use_survives_its_replacement() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.wasm");
    std::fs::write(&path, plugin_bytes("numa-pack")).unwrap();
    let (policies, _) = PolicyDir::open(&sandbox(), dir.path()).unwrap();
    let held = policies.get("p").unwrap();
    std::fs::write(&path, plugin_bytes("binpack")).unwrap();
    assert_eq!(policies.reload().replaced, names(&["p"]));
    // A caller holding the old policy can still use it.
    let s = scenario(
        (0..4)
            .map(|i| {
                device(
                    &format!("gpu-{i}"),
                    serde_json::json!({ "numa": { "int": i % 2 } }),
                )
            })
            .collect(),
        vec![],
        &[],
        2,
    );
    assert_eq!(
        sorted(allocate(&s, Some(&held)).unwrap()),
        names(&["gpu-0", "gpu-2"])
    );
}

#[test]
fn a_deferred_directory_loads_new_files_at_its_next_reload() {
    let dir = tempfile::tempdir().unwrap();
    let policies = PolicyDir::open_deferred(&sandbox(), dir.path()).unwrap();
    std::fs::write(dir.path().join("late.wasm"), plugin_bytes("nvlink-pack")).unwrap();
    assert!(
        policies.get("late").is_none(),
        "nothing is loaded before a reload"
    );
    let report = policies.reload();
    assert_eq!(report.added, ["late"]);
    assert!(policies.get("late").is_some());
}

#[test]
fn a_missing_directory_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope");
    assert!(matches!(
        PolicyDir::open(&sandbox(), &missing),
        Err(PolicyError::Io { .. })
    ));
}
