//! kubedev's command line in the driver's binary: `check-config` refuses a bad `backends.fpga`
//! naming the field and its line, and knows no backend but `fpga`; `discover` and
//! `cdi generate` see the cards of the host root.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;

use common::{Host, run};

/// Writes `text` as `fpga.yaml` in `dir` and runs `check-config` on it: the exit status and
/// standard error.
fn check_config(dir: &Path, text: &str) -> (bool, String) {
    let path = dir.join("fpga.yaml");
    std::fs::write(&path, text).unwrap();
    let out = run(&["check-config", "--config", path.to_str().unwrap()]);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn check_config_names_the_field_of_backends_fpga_and_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, err) = check_config(
        dir.path(),
        "nodeName: node-a\nbackends:\n  fpga:\n    cardsRoot: /sys/class/fpga_manager\n    bitstreamDir: firmware\n",
    );
    assert!(!ok);
    assert!(
        err.contains("line 5: backends.fpga.bitstreamDir: \"firmware\" must be absolute"),
        "{err}"
    );

    let (ok, err) = check_config(
        dir.path(),
        "nodeName: node-a\nbackends:\n  fpga:\n    cardsRoot: sys\n",
    );
    assert!(!ok);
    assert!(
        err.contains("line 4: backends.fpga.cardsRoot: \"sys\" must be absolute"),
        "{err}"
    );

    // serde refuses an unknown key (deny_unknown_fields) and says which keys there are.
    let (ok, err) = check_config(
        dir.path(),
        "nodeName: node-a\nbackends:\n  fpga:\n    bitstreamdir: /lib/firmware\n",
    );
    assert!(!ok);
    assert!(
        err.contains("line 4: backends.fpga.bitstreamdir: unknown field `bitstreamdir`"),
        "{err}"
    );
    assert!(err.contains("`cardsRoot` or `bitstreamDir`"), "{err}");

    let (ok, err) = check_config(dir.path(), "nodeName: node-a\nbackends:\n  fpga: {}\n");
    assert!(ok, "{err}");
    // `fpga:` with nothing after it is the section with its defaults too.
    let (ok, err) = check_config(dir.path(), "nodeName: node-a\nbackends:\n  fpga:\n");
    assert!(ok, "{err}");
    // Messages name the driver, not kubedev.
    assert!(err.is_empty(), "{err}");
    let (_, err) = check_config(dir.path(), "backends:\n  fpga: []\n");
    assert!(err.starts_with("fpga-driver: "), "{err}");
}

#[test]
fn the_command_line_presents_the_driver() {
    let out = run(&["--version"]);
    let version = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        version.trim(),
        format!("fpga-driver {}", env!("CARGO_PKG_VERSION"))
    );
    let out = run(&["--help"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("Usage: fpga-driver"));
}

#[test]
fn the_built_in_backends_are_not_linked() {
    let dir = tempfile::tempdir().unwrap();
    for kind in ["static", "nvidia", "vfio", "usb", "host"] {
        let (ok, err) = check_config(dir.path(), &format!("backends:\n  {kind}: {{}}\n"));
        assert!(!ok);
        assert!(err.contains(&format!("line 2: backends.{kind}: ")), "{err}");
        assert!(err.contains("the known kinds are: fpga"), "{err}");
    }
}

/// A configuration for `host` with `dra.driverName` (the CDI kind) and no kubelet.
fn config(host: &Host, dir: &Path) -> String {
    let path = dir.join("fpga.yaml");
    let text = format!(
        "nodeName: node-a\nhostRoot: {}\nstateDir: {}/state\ndra:\n  driverName: fpga.example.com\nbackends:\n  fpga:\n    bitstreamDir: /lib/firmware\n",
        host.path().display(),
        dir.display()
    );
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn discover_lists_the_cards_with_their_health() {
    let host = Host::with_cards(&[
        ("fpga0", "operating"),
        ("fpga1", "power off"),
        ("fpga2", "operating"),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let out = run(&["discover", "--config", &config(&host, dir.path())]);
    assert!(out.status.success(), "{out:?}");
    let table = String::from_utf8(out.stdout).unwrap();
    let row = |card: &str| {
        table
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(card))
    };
    assert!(
        row("fpga0").unwrap().starts_with("node-a-fpga  fpga0"),
        "{table}"
    );
    assert!(
        table.contains("Unhealthy (state is \"power off\")"),
        "{table}"
    );
    for (card, state) in [
        ("fpga0", "Healthy"),
        ("fpga1", "Unhealthy"),
        ("fpga2", "Healthy"),
    ] {
        assert!(
            row(card).unwrap().contains(&format!(" {state} ")),
            "{table}"
        );
    }
    assert!(
        table.contains("3 device(s) in 1 pool(s) from fpga."),
        "{table}"
    );

    let out = run(&[
        "discover",
        "--config",
        &config(&host, dir.path()),
        "-o",
        "json",
    ]);
    assert!(out.status.success(), "{out:?}");
    let slices: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        slices["items"][0]["spec"]["driver"], "fpga.example.com",
        "{slices:#}"
    );
    assert_eq!(
        slices["items"][0]["spec"]["pool"]["name"], "node-a-fpga",
        "{slices:#}"
    );
}

#[test]
fn cdi_generate_describes_every_operating_card() {
    let host = Host::with_cards(&[
        ("fpga0", "operating"),
        ("fpga1", "power off"),
        ("fpga2", "operating"),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("fpga.json");
    let out = run(&[
        "cdi",
        "generate",
        "--config",
        &config(&host, dir.path()),
        "--output-file",
        file.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("left out node-a-fpga/fpga1"), "{stderr}");
    let spec: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(spec["kind"], "fpga.example.com/device");
    let names: Vec<_> = spec["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    // `all` is every card the spec describes.
    assert_eq!(names, ["fpga0", "fpga2", "all"]);
    let edits = &spec["devices"][1]["containerEdits"];
    assert_eq!(edits["deviceNodes"][0]["path"], "/dev/fpga2");
    assert_eq!(edits["env"], serde_json::json!(["FPGA_CARDS=fpga2"]));
    let all = &spec["devices"][2]["containerEdits"];
    assert_eq!(
        all["env"],
        serde_json::json!(["FPGA_CARDS=fpga0,fpga2"]),
        "{spec:#}"
    );
}

/// A scenario of one card and one claim whose selector wraps `device.driver == "…"` in `depth`
/// parentheses; its path.
fn nested_selector_scenario(dir: &Path, depth: usize) -> String {
    let expression = format!(
        "{}device.driver == \"fpga.example.com\"{}",
        "(".repeat(depth),
        ")".repeat(depth)
    );
    let scenario = serde_json::json!({
        "node": {"name": "node-a"},
        "resourceSlices": [{
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": "node-a-fpga"},
            "spec": {"driver": "fpga.example.com", "nodeName": "node-a",
                     "pool": {"name": "node-a-fpga", "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": "fpga0"}]}
        }],
        "deviceClasses": [{
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": "fpga.example.com"}, "spec": {}
        }],
        "claims": [{
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "card", "namespace": "default", "uid": "uid-card"},
            "spec": {"devices": {"requests": [{"name": "card", "exactly": {
                "deviceClassName": "fpga.example.com",
                "selectors": [{"cel": {"expression": expression}}]
            }}]}}
        }]
    });
    let path = dir.join(format!("nested-{depth}.json"));
    std::fs::write(&path, scenario.to_string()).unwrap();
    path.to_str().unwrap().to_string()
}

/// This crate sets no optimisation for kubedev's CEL parser, and its tests run unoptimised: a
/// selector nested to the API server's limit is parsed, and one past it is refused by name,
/// never by a stack overflow.
#[test]
fn selectors_nested_to_the_limit_work_in_a_debug_build() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(&[
        "simulate",
        "-f",
        &nested_selector_scenario(dir.path(), 240),
        "-o",
        "json",
    ]);
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["allocatable"], true, "{v:#}");

    let out = run(&[
        "simulate",
        "-f",
        &nested_selector_scenario(dir.path(), 20_000),
        "-o",
        "json",
    ]);
    assert!(out.status.code().is_some(), "killed by a signal: {out:?}");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("recursion limit exceeded"), "{said}");
}
