//! The `kubedev` command line, run as a process.
#![allow(clippy::unwrap_used)]

use std::process::Command;

fn kubedev(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kubedev"))
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap()
}

fn scenario(name: &str) -> String {
    format!(
        "{}/../../../shared/bench-scenarios/{name}",
        env!("CARGO_MANIFEST_DIR")
    )
}

#[test]
fn simulate_prints_allocations_as_json() {
    let out = kubedev(&["simulate", "-f", &scenario("gpu8-c2.yaml"), "-o", "json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["allocatable"], true);
    let results = v["claims"][0]["allocation"]["devices"]["results"]
        .as_array()
        .unwrap();
    assert_eq!(results.len(), 2);
    assert!(v.get("error").is_none());
}

#[test]
fn simulate_explains_and_exits_zero_when_nothing_fits() {
    let out = kubedev(&[
        "simulate",
        "-f",
        &scenario("gpu8-c8-numa-unsat.yaml"),
        "--explain",
        "-o",
        "json",
    ]);
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["allocatable"], false);
    assert!(v.get("explanation").is_some(), "{v}");
}

#[test]
fn unreadable_input_is_an_error_naming_the_file() {
    let out = kubedev(&["simulate", "-f", "/nonexistent/scenario.yaml"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/scenario.yaml"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn check_config_names_the_bad_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.yaml");
    std::fs::write(
        &path,
        "devicePlugin:\n  resources:\n    - name: gpu\nbackends:\n  static:\n    pool: p\n    devices: []\n",
    )
    .unwrap();
    let out = kubedev(&["check-config", "--config", path.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("devicePlugin.resources[0].name"), "{err}");
}

fn plugin(name: &str) -> String {
    let dir = std::env::var("KUBEDEV_PLUGIN_DIR")
        .unwrap_or_else(|_| format!("{}/../../target/plugins/wasm", env!("CARGO_MANIFEST_DIR")));
    let p = format!("{dir}/{name}.wasm");
    assert!(
        std::path::Path::new(&p).exists(),
        "{p} is missing: run `cargo xtask build-plugins` first"
    );
    p
}

#[test]
fn policy_check_passes_a_good_module_and_fails_a_bad_one() {
    let out = kubedev(&["policy", "check", &plugin("numa-pack")]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("PASS") && text.contains("fuel"), "{text}");

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.wasm");
    std::fs::write(&bad, b"\0asm garbage").unwrap();
    let out = kubedev(&["policy", "check", bad.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("bad.wasm"));
}

#[test]
fn simulate_with_a_policy_uses_it() {
    let out = kubedev(&[
        "simulate",
        "-f",
        &scenario("gpu8-c2.yaml"),
        "--policy",
        &plugin("spread"),
        "-o",
        "json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["allocatable"], true);
    assert!(
        String::from_utf8_lossy(&out.stderr).is_empty(),
        "the policy failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
