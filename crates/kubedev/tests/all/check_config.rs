//! `kubedev check-config`, run as a process: files that `kubedev run` would refuse are refused
//! here too, naming the field and its line.

use std::path::Path;
use std::process::Command;

/// A configuration that passes, with one device-plugin resource of the static backend.
const GOOD: &str = "\
nodeName: node-a
devicePlugin:
  directory: /tmp/kubedev-check/dp
  resources:
    - name: example.com/gpu
      selector:
        cel: device.attributes[\"example.com\"].model == \"x1\"
backends:
  static:
    pool: node-a
    devices:
      - name: gpu-0
        attributes: {model: {string: x1}}
        deviceNodes: [/dev/null]
      - name: gpu-1
        attributes: {model: {string: x1}}
metrics:
  address: 127.0.0.1:9464
";

/// Runs `kubedev check-config` on `text` written to `dir/c.yaml`.
fn check(dir: &Path, text: &str) -> std::process::Output {
    let path = dir.join("c.yaml");
    std::fs::write(&path, text).unwrap();
    Command::new(env!("CARGO_BIN_EXE_kubedev"))
        .args(["check-config", "--config"])
        .arg(&path)
        .env("RUST_BACKTRACE", "0")
        .env_remove("NODE_NAME")
        .output()
        .unwrap()
}

/// The 1-based line of `text` that contains `marker`.
fn line_of(text: &str, marker: &str) -> usize {
    text.lines()
        .position(|l| l.contains(marker))
        .unwrap_or_else(|| panic!("{marker:?} is not in the text"))
        + 1
}

/// Expects check-config to refuse `text` with `c.yaml: line N: <field>: ...`, N being the line
/// that contains `marker`, and the message to contain `what`.
fn refused(text: &str, marker: &str, field: &str, what: &str) {
    let dir = tempfile::tempdir().unwrap();
    let out = check(dir.path(), text);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success(),
        "check-config passed a file naming {field}:\n{text}\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let at = format!("c.yaml: line {}: {field}: ", line_of(text, marker));
    assert!(stderr.contains(&at), "stderr lacks {at:?}:\n{stderr}");
    assert!(stderr.contains(what), "stderr lacks {what:?}:\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn a_good_file_is_ok() {
    let dir = tempfile::tempdir().unwrap();
    let out = check(dir.path(), GOOD);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).ends_with("c.yaml: ok\n"));
}

#[test]
fn duplicate_static_device_names_are_refused() {
    let text = GOOD.replace("- name: gpu-1", "- name: gpu-0 # again");
    refused(
        &text,
        "gpu-0 # again",
        "backends.static.devices[1].name",
        "\"gpu-0\" is also the name of devices[0]",
    );
}

#[test]
fn dot_dot_in_a_host_path_is_refused() {
    let text = GOOD.replace(
        "metrics:\n",
        "  host:\n    characterDevices:\n      - name: serial\n        path: /dev/../etc/shadow\nmetrics:\n",
    );
    refused(
        &text,
        "/dev/../etc/shadow",
        "backends.host.characterDevices[0].path",
        "must not contain '.' or '..' components",
    );
}

#[test]
fn a_missing_policy_file_is_refused() {
    let text = GOOD.replace(
        "    - name: example.com/gpu\n",
        "    - name: example.com/gpu\n      policy: /nonexistent/numa-pack.wasm\n",
    );
    refused(
        &text,
        "policy: /nonexistent",
        "devicePlugin.resources[0].policy",
        "/nonexistent/numa-pack.wasm",
    );
}

#[test]
fn a_missing_policy_directory_is_refused() {
    let text = GOOD
        .replace(
            "  directory: /tmp/kubedev-check/dp\n",
            "  directory: /tmp/kubedev-check/dp\n  policyDir: /nonexistent/policies\n",
        )
        .replace(
            "    - name: example.com/gpu\n",
            "    - name: example.com/gpu\n      policy: numa-pack\n",
        );
    refused(
        &text,
        "policyDir:",
        "devicePlugin.policyDir",
        "/nonexistent/policies",
    );
}

fn dra(kubeconfig: &Path) -> String {
    format!(
        "{GOOD}dra:\n  enabled: true\n  driverName: gpu.example.com\n  kubeconfig: {}\n",
        kubeconfig.display()
    )
}

#[test]
fn a_missing_or_broken_kubeconfig_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-kubeconfig");
    refused(
        &dra(&missing),
        "kubeconfig:",
        "dra.kubeconfig",
        "no-such-kubeconfig",
    );
    let broken = dir.path().join("kubeconfig");
    std::fs::write(
        &broken,
        "apiVersion: v1\nkind: Config\ncurrent-context: nowhere\nclusters: []\ncontexts: []\nusers: []\n",
    )
    .unwrap();
    refused(&dra(&broken), "kubeconfig:", "dra.kubeconfig", "nowhere");

    // A kubeconfig that works passes; nothing is sent to its server.
    std::fs::write(
        &broken,
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n\
         clusters: [{name: c, cluster: {server: \"https://127.0.0.1:1\"}}]\n\
         contexts: [{name: c, context: {cluster: c, user: u}}]\n\
         users: [{name: u, user: {token: t}}]\n",
    )
    .unwrap();
    let out = check(dir.path(), &dra(&broken));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_metrics_address_without_a_port_number_is_refused() {
    let text = GOOD.replace("127.0.0.1:9464", "localhost:notaport");
    refused(
        &text,
        "localhost:notaport",
        "metrics.address",
        "\"notaport\" is not a port number",
    );
}

#[test]
fn an_invalid_regular_expression_is_refused() {
    let text = GOOD.replace("model == \"x1\"", "model.matches(\"[\")");
    refused(
        &text,
        "cel:",
        "devicePlugin.resources[0].selector.cel",
        "invalid regular expression \"[\"",
    );
}

#[test]
fn a_cel_type_error_is_refused() {
    let text = GOOD.replace(
        "device.attributes[\"example.com\"].model == \"x1\"",
        "device.driver + 1 == 2",
    );
    refused(
        &text,
        "cel:",
        "devicePlugin.resources[0].selector.cel",
        "no matching overload for '_+_' applied to '(string, int)'",
    );
}
