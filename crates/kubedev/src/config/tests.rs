//! Tests of loading a configuration: a complete file, errors naming the field, file and line,
//! DRA defaults and the environment, the slice request rate, socket directories, duplicate resources, backends and
//! policies left out of the build.

use super::*;

const GOOD: &str = r#"
devicePlugin:
  directory: /tmp/dp
  resources:
    - name: example.com/dev
      selector:
        attributes:
          model: {string: x1}
backends:
  static:
    pool: node-a
    devices:
      - name: dev-0
        attributes: {model: {string: x1}}
"#;

#[test]
fn parses_a_complete_config() {
    let c = Config::parse(GOOD, Path::new("c.yaml")).unwrap();
    assert_eq!(c.device_plugin.directory, PathBuf::from("/tmp/dp"));
    let r = c.resources(Path::new("c.yaml")).unwrap();
    assert_eq!(r[0].name.as_str(), "example.com/dev");
    assert_eq!(
        c.backends["static"]["devices"].as_array().map(Vec::len),
        Some(1)
    );
}

#[test]
fn errors_name_the_field_and_line() {
    let bad = GOOD.replace("example.com/dev", "dev");
    let err = Config::parse(&bad, Path::new("c.yaml"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("devicePlugin.resources[0].name"), "{err}");
    assert!(err.contains("fully qualified"), "{err}");

    let bad = GOOD.replace("directory:", "dirctory:");
    let err = Config::parse(&bad, Path::new("c.yaml"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("dirctory"), "{err}");
    assert!(err.contains("line 3") || err.contains("3:"), "{err}");

    let bad = GOOD.replace("name: dev-0", "name: Dev_0");
    let err = Config::parse(&bad, Path::new("c.yaml"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("Dev_0"), "{err}");
}

#[test]
fn yaml_errors_are_sentences_naming_the_file_and_line() {
    let twice = format!("{GOOD}backends: {{}}\n");
    let line = twice.lines().count();
    let err = Config::parse(&twice, Path::new("c.yaml"))
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        format!("c.yaml: line {line}: key `backends` appears twice")
    );

    let bad = GOOD.replace("directory:", "dirctory:");
    let err = Config::parse(&bad, Path::new("c.yaml"))
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("c.yaml: line 3: unknown key `dirctory`; the keys allowed here are "),
        "{err}"
    );
    assert!(!err.contains("<input>") && !err.contains('\n'), "{err}");

    // Over the reader's limit of values: the limit is named, not the parser's internals.
    let many: String = (0..100_000)
        .map(|i| format!("      - name: dev-{i}\n"))
        .collect();
    let big = format!("{GOOD}{many}");
    let err = Config::parse(&big, Path::new("c.yaml"))
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("c.yaml: "), "{err}");
    assert!(err.contains("more than 250000 values"), "{err}");
    assert!(!err.contains("budget") && !err.contains("Nodes {"), "{err}");
}

#[test]
fn dra_settings_take_defaults_and_the_environment() {
    let text =
        format!("nodeName: null\ndra:\n  enabled: true\n  driverName: gpu.example.com\n{GOOD}");
    let c: Config = serde_saphyr::from_str(&text).unwrap();
    let env = |k: &str| match k {
        "NODE_NAME" => Some("node-7".to_string()),
        "POD_UID" => Some("1234-abcd".to_string()),
        _ => None,
    };
    let d = c.dra(Path::new("c.yaml"), env).unwrap().unwrap();
    assert_eq!(d.node_name, "node-7");
    assert_eq!(d.pod_uid.as_deref(), Some("1234-abcd"));
    assert_eq!(
        d.plugin_dir,
        PathBuf::from("/var/lib/kubelet/plugins/gpu.example.com")
    );
    assert_eq!(d.state_dir, d.plugin_dir);
    assert_eq!(d.cdi_dir, PathBuf::from("/var/run/cdi"));
    let err = c
        .dra(Path::new("c.yaml"), |_| None)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("nodeName") && err.contains("NODE_NAME"),
        "{err}"
    );
    let bad = text.replace("gpu.example.com", "GPU");
    let c: Config = serde_saphyr::from_str(&bad).unwrap();
    let err = c.dra(Path::new("c.yaml"), env).unwrap_err().to_string();
    assert!(err.contains("dra.driverName"), "{err}");
}

#[test]
fn the_slice_request_rate_defaults_to_client_go_and_refuses_what_would_stall_publishing() {
    let dra = |extra: &str| {
        let text = format!(
            "nodeName: n\ndra:\n  enabled: true\n  driverName: gpu.example.com\n{extra}{GOOD}"
        );
        let c: Config = serde_saphyr::from_str(&text).unwrap();
        c.dra(Path::new("c.yaml"), |_| None)
    };
    let d = dra("").unwrap().unwrap();
    assert_eq!((d.slice_requests.qps, d.slice_requests.burst), (5.0, 10));
    let d = dra("  sliceRequests: {qps: 0}\n").unwrap().unwrap();
    assert_eq!((d.slice_requests.qps, d.slice_requests.burst), (0.0, 10));
    let d = dra("  sliceRequests: {qps: 50, burst: 100}\n")
        .unwrap()
        .unwrap();
    assert_eq!((d.slice_requests.qps, d.slice_requests.burst), (50.0, 100));
    for (bad, field) in [
        ("{qps: -1}", "dra.sliceRequests.qps"),
        ("{qps: .nan}", "dra.sliceRequests.qps"),
        ("{burst: 0}", "dra.sliceRequests.burst"),
    ] {
        let err = dra(&format!("  sliceRequests: {bad}\n"))
            .unwrap_err()
            .to_string();
        assert!(err.contains(field), "{bad}: {err}");
    }
}

#[test]
fn socket_directories_that_leave_no_room_are_refused_naming_the_field_and_path() {
    let deep = format!("/{}", "d".repeat(100));
    let longest = format!("{}.example.com", "a".repeat(51));
    let dra = |field: &str| {
        format!(
            "nodeName: n\ndra:\n  enabled: true\n  driverName: {longest}\n  {field}: {deep}\n{GOOD}"
        )
    };
    let env = |k: &str| (k == "POD_UID").then(|| "0b4c6a8e-8c4f-4d7e".to_string());
    for field in ["pluginDir", "registryDir"] {
        let c: Config = serde_saphyr::from_str(&dra(field)).unwrap();
        let err = c.dra(Path::new("c.yaml"), env).unwrap_err().to_string();
        assert!(err.contains(&format!("dra.{field}")), "{err}");
        assert!(err.contains(&deep) && err.contains("107 bytes"), "{err}");
    }
    // The longest driver name in the kubelet's directories, with a pod UID, is fine.
    let ok = format!("nodeName: n\ndra:\n  enabled: true\n  driverName: {longest}\n{GOOD}");
    let c: Config = serde_saphyr::from_str(&ok).unwrap();
    assert!(c.dra(Path::new("c.yaml"), env).is_ok());
    let bad = GOOD.replace("/tmp/dp", &deep);
    let err = Config::parse(&bad, Path::new("c.yaml"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("devicePlugin.directory") && err.contains(&deep),
        "{err}"
    );
}

#[test]
fn duplicate_resources_are_rejected() {
    let bad = GOOD.replace("backends:", "    - name: example.com/dev\nbackends:");
    let err = Config::parse(&bad, Path::new("c.yaml"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("configured twice"), "{err}");
}

#[cfg(not(feature = "usb"))]
#[test]
fn a_backend_left_out_of_the_build_is_named_with_its_feature() {
    let text = format!("{GOOD}  usb:\n    resources: []\n");
    let err = Config::parse(&text, Path::new("c.yaml"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("backends.usb") && err.contains("--features usb"),
        "{err}"
    );
}

#[test]
fn host_root_and_state_dir_have_defaults() {
    let c = Config::parse(GOOD, Path::new("c.yaml")).unwrap();
    assert_eq!(c.host_root, PathBuf::from("/"));
    assert_eq!(c.state_dir, PathBuf::from("/var/lib/kubedev"));
}

#[cfg(not(feature = "wasm"))]
#[test]
fn a_policy_without_the_wasm_feature_is_named() {
    let text = GOOD.replace(
        "    - name: example.com/dev\n",
        "    - name: example.com/dev\n      policy: numa-pack.wasm\n",
    );
    let err = Config::parse(&text, Path::new("c.yaml"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("devicePlugin.resources[0].policy") && err.contains("--features wasm"),
        "{err}"
    );
}
