//! `kubedev policy check`: the report for good and bad modules.

use kubedev_sandbox::{PolicyError, check};

use crate::common::*;

#[test]
fn example_policies_pass_the_check() {
    for name in ["numa-pack", "nvlink-pack", "spread", "binpack"] {
        let report = check(plugin_path(name)).unwrap();
        assert!(report.passed(), "{report}");
        assert_eq!(report.name, name);
        assert_eq!(report.samples.len(), 3);
        assert!(report.max_fuel() > 0 && report.max_fuel() < report.limits.fuel / 10);
        assert!(report.max_memory() >= 64 << 10);
        let text = report.to_string();
        assert!(text.contains(&format!("policy {name} (")), "{text}");
        assert!(
            text.contains("sample gpus-64 (64 candidates, 8 wanted): ok"),
            "{text}"
        );
        assert!(text.contains("result         PASS"), "{text}");
    }
}

#[test]
fn the_check_shows_what_the_sample_answers_are() {
    let report = check(plugin_path("binpack")).unwrap();
    let partitions = report
        .samples
        .iter()
        .find(|s| s.name == "partitions")
        .unwrap();
    let run = partitions.outcome.as_ref().unwrap();
    // gpu-1-a is in use: its sibling gpu-1-b comes first.
    assert_eq!(run.order[0], "gpu-1-b");
}

#[test]
fn a_policy_that_fails_the_samples_fails_the_check() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trap.wasm");
    std::fs::write(&path, wat_policy("(unreachable)")).unwrap();
    let report = check(&path).unwrap();
    assert!(!report.passed());
    assert!(
        report
            .samples
            .iter()
            .all(|s| matches!(s.outcome, Err(PolicyError::Trap { .. })))
    );
    let text = report.to_string();
    assert!(text.contains("FAILED: policy trap: trapped"), "{text}");
    assert!(text.contains("result         FAIL"), "{text}");
}

#[test]
fn unreadable_and_invalid_files_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    match check(dir.path().join("missing.wasm")) {
        Err(e @ PolicyError::Io { .. }) => assert!(e.to_string().contains("missing.wasm")),
        other => panic!("expected Io, got {other:?}"),
    }
    let path = dir.path().join("junk.wasm");
    std::fs::write(&path, b"junk").unwrap();
    match check(&path) {
        Err(e @ PolicyError::NotWasm { .. }) => {
            assert_eq!(
                e.to_string(),
                format!(
                    "{} is not a WebAssembly module (it does not start with \\0asm)",
                    path.display()
                )
            );
            assert_eq!(e.kind(), "bad-module");
            assert_eq!(e.policy(), Some("junk"));
        }
        other => panic!("expected NotWasm, got {other:?}"),
    }
    let path = dir.path().join("broken.wasm");
    std::fs::write(&path, b"\0asm garbage").unwrap();
    assert!(matches!(check(&path), Err(PolicyError::BadModule { .. })));
}
