//! `kubedev simulate`: allocations as JSON, explanations when nothing fits, policies (and their
//! failures), and input errors naming the file and line.

use super::{fails_naming, kubedev, plugin, scenario, succeeds};

#[test]
fn simulate_prints_allocations_as_json() {
    let out = succeeds(&["simulate", "-f", &scenario("gpu8-c2.yaml"), "-o", "json"]);
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
    let err = fails_naming(
        &["simulate", "-f", "/nonexistent/scenario.yaml"],
        "/nonexistent/scenario.yaml",
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn simulate_with_a_policy_uses_it() {
    let out = succeeds(&[
        "simulate",
        "-f",
        &scenario("gpu8-c2.yaml"),
        "--policy",
        &plugin("spread"),
        "-o",
        "json",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["allocatable"], true);
    assert!(
        String::from_utf8_lossy(&out.stderr).is_empty(),
        "the policy failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn simulate_with_a_failing_policy_falls_back_or_refuses_with_fail_closed() {
    let dir = tempfile::tempdir().unwrap();
    let wasm = crate::common::trapping_policy();
    let policy = dir.path().join("trap.wasm");
    std::fs::write(&policy, wasm).unwrap();
    let p = policy.to_string_lossy().into_owned();
    let open = kubedev(&[
        "simulate",
        "-f",
        &scenario("gpu8-c2.yaml"),
        "--policy",
        &p,
        "-o",
        "json",
    ]);
    assert!(open.status.success());
    let v: serde_json::Value = serde_json::from_slice(&open.stdout).unwrap();
    assert_eq!(
        v["allocatable"], true,
        "fail-open: the default order is used"
    );
    assert!(String::from_utf8_lossy(&open.stderr).contains("default order"));

    let closed = kubedev(&[
        "simulate",
        "-f",
        &scenario("gpu8-c2.yaml"),
        "--policy",
        &p,
        "--fail-closed",
        "-o",
        "json",
    ]);
    // A script can tell: the refusal is exit code 3, and stderr says so without also claiming
    // that the default order was used.
    assert_eq!(
        closed.status.code(),
        Some(3),
        "fail-closed: the policy failed"
    );
    let v: serde_json::Value = serde_json::from_slice(&closed.stdout).unwrap();
    assert_eq!(v["allocatable"], false, "{v}");
    let err = v["error"].as_str().unwrap_or_default();
    assert!(err.contains("selection policy trap failed (trap)"), "{err}");
    let stderr = String::from_utf8_lossy(&closed.stderr);
    assert!(!stderr.contains("default order"), "{stderr}");
    assert!(
        stderr.lines().any(|l| l.starts_with(
            "kubedev: the policy failed and --fail-closed refused the allocation: policy trap: trapped"
        )),
        "{stderr}"
    );
}

#[test]
fn simulate_refuses_unknown_and_repeated_keys_naming_the_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("typo.yaml");
    let good = std::fs::read_to_string(scenario("gpu8-c2.yaml")).unwrap();
    let line = good.lines().position(|l| l.starts_with("claims:")).unwrap() + 1;
    let typo: String = good
        .lines()
        .map(|l| match l.strip_prefix("claims:") {
            Some(rest) => format!("claim:{rest}\n"),
            None => format!("{l}\n"),
        })
        .collect();
    std::fs::write(&path, typo).unwrap();
    let p = path.to_string_lossy().into_owned();
    let out = kubedev(&["simulate", "-f", &p]);
    assert!(!out.status.success());
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with(&format!(
            "kubedev: {p}: line {line}: unknown key `claim`; the keys allowed here are node, "
        )),
        "{err}"
    );

    // Inside an object too.
    std::fs::write(&path, good.replacen("deviceClassName:", "deviceClass:", 1)).unwrap();
    let err = fails_naming(&["simulate", "-f", &p], "unknown key `deviceClass`");
    assert!(err.contains(&format!("{p}: line ")), "{err}");

    // A key given twice.
    std::fs::write(&path, format!("{good}node:\n  name: other\n")).unwrap();
    let twice = good.lines().count() + 1;
    let err = fails_naming(&["simulate", "-f", &p], "appears twice");
    assert_eq!(
        err,
        format!("kubedev: {p}: line {twice}: key `node` appears twice\n")
    );
}
