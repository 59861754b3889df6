//! The `kubedev` command line, run as a process.

use std::process::Command;

mod cdi_generate;
mod config_and_policy;
mod discover;
mod logs_signals_help;
mod simulate;

fn kubedev(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kubedev"))
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap()
}

/// Runs kubedev and expects it to succeed (stderr shown when it does not).
fn succeeds(args: &[&str]) -> std::process::Output {
    let out = kubedev(args);
    assert!(
        out.status.success(),
        "{args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Runs kubedev, expects it to fail, and expects stderr to name `what`; returns stderr.
fn fails_naming(args: &[&str], what: &str) -> String {
    let out = kubedev(args);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{args:?} succeeded:\n{err}");
    assert!(
        err.contains(what),
        "{args:?}: stderr lacks {what:?}:\n{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    err
}

fn scenario(name: &str) -> String {
    format!(
        "{}/../../../shared/bench-scenarios/{name}",
        env!("CARGO_MANIFEST_DIR")
    )
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

fn write_config(dir: &std::path::Path, text: &str) -> String {
    let p = dir.join("config.yaml");
    std::fs::write(&p, text).unwrap();
    p.to_string_lossy().into_owned()
}

const SPLIT_CONFIG: &str = "nodeName: node-a
devicePlugin:
  resources:
    - name: example.com/gpu
      selector:
        attributes:
          type: {string: gpu}
dra:
  enabled: true
  driverName: devices.example.com
backends:
  static:
    pool: node-a
    devices:
      - {name: gpu-0, numaNode: 0, attributes: {type: {string: gpu}}}
      - {name: nic-0, attributes: {type: {string: nic}}}
      - {name: nic-1, attributes: {type: {string: nic}}}
";
