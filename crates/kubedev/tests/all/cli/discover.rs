//! `kubedev discover` and `kubedev who-uses`: which API serves each device (a CEL selector
//! splitting them), and the pods holding this daemon's devices.

use super::{SPLIT_CONFIG, fails_naming, kubedev, succeeds, write_config};

#[test]
fn discover_shows_which_api_serves_each_device() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), SPLIT_CONFIG);
    let out = succeeds(&["discover", "--config", &config]);
    let table = String::from_utf8_lossy(&out.stdout);
    let row = |dev: &str| {
        table
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(dev))
            .unwrap_or_else(|| panic!("no row for {dev} in\n{table}"))
            .to_string()
    };
    assert!(
        row("gpu-0").contains("device-plugin example.com/gpu"),
        "{table}"
    );
    assert!(row("nic-0").contains(" dra "), "{table}");
    assert!(row("nic-1").contains("type=\"nic\""), "{table}");
    assert!(
        table.contains("3 device(s) in 1 pool(s) from static."),
        "{table}"
    );

    // As ResourceSlices: only what DRA serves.
    let out = succeeds(&["discover", "--config", &config, "-o", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["kind"], "List");
    let slice = &v["items"][0];
    assert_eq!(slice["kind"], "ResourceSlice");
    assert_eq!(slice["spec"]["driver"], "devices.example.com");
    assert_eq!(slice["spec"]["nodeName"], "node-a");
    let names: Vec<&str> = slice["spec"]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["nic-0", "nic-1"]);

    let out = kubedev(&["discover", "--config", &config, "-o", "yaml"]);
    assert!(out.status.success());
    let yaml = String::from_utf8_lossy(&out.stdout);
    assert!(yaml.contains("kind: ResourceSlice"), "{yaml}");
}

#[test]
fn discover_says_plainly_when_nothing_is_found() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        "nodeName: node-a\nbackends:\n  static:\n    pool: node-a\n    devices: []\n",
    );
    let out = succeeds(&["discover", "--config", &config]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "No devices found: the static backend found nothing to offer on this host.\n"
    );
}

#[tokio::test]
async fn who_uses_shows_pods_holding_this_daemons_devices_in_both_apis() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("kubelet.sock");
    let kubelet = kubedev_testkit::kubelet::PodResourcesEmulator::start(&socket).unwrap();
    kubelet.assign_devices("ml", "trainer", "main", "example.com/gpu", &["gpu-0"]);
    kubelet.assign_devices("ml", "trainer", "main", "other.com/fpga", &["f-1"]);
    kubelet.assign_claim(
        "web",
        "nginx",
        "proxy",
        "nics",
        "devices.example.com",
        &[("node-a", "nic-1")],
    );
    kubelet.add_pod("kube-system", "coredns", "coredns");
    let config = write_config(dir.path(), SPLIT_CONFIG);
    let s = socket.to_string_lossy().into_owned();
    let run = move |args: Vec<String>| {
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            kubedev(&args)
        })
    };
    let out = run(vec![
        "who-uses".into(),
        "--socket".into(),
        s.clone(),
        "--config".into(),
        config.clone(),
    ])
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(table.lines().count(), 3, "header + 2 rows: {table}");
    assert!(
        table.lines().any(|l| l.contains("trainer")
            && l.contains("example.com/gpu")
            && l.ends_with("gpu-0")),
        "{table}"
    );
    assert!(
        table.lines().any(|l| l.contains("nginx")
            && l.contains("web/nics (devices.example.com)")
            && l.ends_with("node-a/nic-1")),
        "{table}"
    );
    assert!(
        !table.contains("f-1"),
        "another plugin's device is not ours: {table}"
    );

    // One device, as JSON.
    let out = run(vec![
        "who-uses".into(),
        "--socket".into(),
        s.clone(),
        "-o".into(),
        "json".into(),
        "node-a/nic-1".into(),
    ])
    .await
    .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 1, "{v}");
    assert_eq!(v[0]["pod"], "nginx");
    assert_eq!(v[0]["api"], "dra");

    let out = run(vec![
        "who-uses".into(),
        "--socket".into(),
        s,
        "gpu-7".into(),
    ])
    .await
    .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "No pod holds any of these devices.\n"
    );
    kubelet.stop().await;

    let out = run(vec![
        "who-uses".into(),
        "--socket".into(),
        "/nonexistent/kubelet.sock".into(),
    ])
    .await
    .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/kubelet.sock"));
}

#[test]
fn a_cel_selector_splits_devices_between_the_apis() {
    let dir = tempfile::tempdir().unwrap();
    let text = SPLIT_CONFIG.replace(
        "      selector:\n        attributes:\n          type: {string: gpu}\n",
        "      selector:\n        cel: device.attributes[\"devices.example.com\"].type == \"gpu\"\n",
    );
    assert_ne!(text, SPLIT_CONFIG);
    let config = write_config(dir.path(), &text);
    let out = succeeds(&["discover", "--config", &config]);
    let table = String::from_utf8_lossy(&out.stdout);
    let served = |dev: &str| {
        table
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(dev))
            .map(|l| l.contains("device-plugin"))
            .unwrap()
    };
    assert!(
        served("gpu-0") && !served("nic-1") && !served("nic-0"),
        "{table}"
    );

    let bad = write_config(dir.path(), &text.replace("== \"gpu\"", "== "));
    fails_naming(
        &["check-config", "--config", &bad],
        "devicePlugin.resources[0].selector.cel",
    );
}
