//! `kubedev cdi generate`: a spec for what was found, the reason when there is nothing to
//! generate, and no MIG placements that only prepare creates.

use super::{SPLIT_CONFIG, fails_naming, kubedev, succeeds, write_config};

#[test]
fn cdi_generate_writes_a_spec_for_what_was_found() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), SPLIT_CONFIG);
    let out = succeeds(&["cdi", "generate", "--config", &config]);
    let spec: serde_json::Value = serde_saphyr::from_slice(&out.stdout).unwrap();
    assert_eq!(spec["kind"], "devices.example.com/device");
    let names: Vec<&str> = spec["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    // Every device, whichever API serves it, and one holding them all.
    assert_eq!(names, ["gpu-0", "nic-0", "nic-1", "all"]);
    let env = |i: usize| spec["devices"][i]["containerEdits"]["env"].clone();
    assert_eq!(env(1), serde_json::json!(["STATIC_VISIBLE_DEVICES=nic-0"]));
    assert_eq!(
        env(3),
        serde_json::json!(["STATIC_VISIBLE_DEVICES=gpu-0,nic-0,nic-1"])
    );

    // To a file, as JSON by its extension, with --kind.
    let file = dir.path().join("cdi/example.json");
    succeeds(&[
        "cdi",
        "generate",
        "--config",
        &config,
        "--kind",
        "example.com/gpu",
        "--output-file",
        file.to_str().unwrap(),
    ]);
    use std::os::unix::fs::PermissionsExt as _;
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o644
    );
    let spec: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(spec["kind"], "example.com/gpu");

    // Bad kinds and file names are refused, naming the problem.
    fails_naming(
        &["cdi", "generate", "--config", &config, "--kind", "nokind"],
        "nokind",
    );
    fails_naming(
        &[
            "cdi",
            "generate",
            "--config",
            &config,
            "--output-file",
            dir.path().join("x.txt").to_str().unwrap(),
        ],
        ".txt",
    );
}

#[test]
fn cdi_generate_without_a_kind_or_devices_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        "nodeName: node-a\nbackends:\n  static:\n    pool: node-a\n    devices: []\n",
    );
    fails_naming(&["cdi", "generate", "--config", &config], "--kind");
    fails_naming(
        &[
            "cdi",
            "generate",
            "--config",
            &config,
            "--kind",
            "example.com/dev",
        ],
        "found no devices",
    );
}

#[test]
fn cdi_generate_leaves_out_mig_placements_that_only_prepare_creates() {
    let dir = tempfile::tempdir().unwrap();
    let lib = nvml_mock::isolated_library(dir.path(), &nvml_mock::machine_path("dgx-a100"), None)
        .unwrap();
    let config = write_config(
        dir.path(),
        &format!(
            "nodeName: node-a\nhostRoot: {}\ndra:\n  enabled: true\n  driverName: gpu.example.com\nbackends:\n  nvidia:\n    libraryPath: {}\n    migStrategy: partitionable\n",
            dir.path().display(),
            lib.display()
        ),
    );
    let out = kubedev(&["cdi", "generate", "--config", &config, "-o", "json"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let spec: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let devices = spec["devices"].as_array().unwrap();
    let gpu0 = devices.iter().find(|d| d["name"] == "gpu-0").unwrap();
    let nodes: Vec<&str> = gpu0["containerEdits"]["deviceNodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["path"].as_str().unwrap())
        .collect();
    assert!(nodes.contains(&"/dev/nvidia0"), "{nodes:?}");
    assert!(
        gpu0["containerEdits"]["env"][0]
            .as_str()
            .unwrap()
            .starts_with("NVIDIA_VISIBLE_DEVICES=GPU-"),
        "{gpu0}"
    );
    // GPU 6 has MIG on and no instances: its placements have no instance before a prepare
    // creates one, so they are left out, and said so. GPU 7's existing instances are in.
    assert!(
        stderr.contains("left out node-a-nvidia/gpu-6-mig-1g5gb-0: its container edits are only known once it is prepared"),
        "{stderr}"
    );
    let names: Vec<&str> = devices
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert!(
        !names.iter().any(|n| n.starts_with("gpu-6-mig")),
        "{names:?}"
    );
    assert!(names.contains(&"gpu-7-mig-1g5gb-6"), "{names:?}");
}
