//! The `kubedev` command line, run as a process.

use std::process::Command;

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
fn check_config_names_the_bad_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.yaml");
    std::fs::write(
        &path,
        "devicePlugin:\n  resources:\n    - name: gpu\nbackends:\n  static:\n    pool: p\n    devices: []\n",
    )
    .unwrap();
    fails_naming(
        &["check-config", "--config", path.to_str().unwrap()],
        "devicePlugin.resources[0].name",
    );
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
    let out = succeeds(&["policy", "check", &plugin("numa-pack")]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("PASS") && text.contains("fuel"), "{text}");

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.wasm");
    std::fs::write(&bad, b"\0asm garbage").unwrap();
    fails_naming(&["policy", "check", bad.to_str().unwrap()], "bad.wasm");
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

#[test]
fn simulate_with_a_failing_policy_falls_back_or_refuses_with_fail_closed() {
    let dir = tempfile::tempdir().unwrap();
    // Keeps the contract at load, traps on every call.
    let wasm = wat::parse_str(
        r#"(module
          (memory (export "memory") 1)
          (func (export "kubedev_policy_abi_version") (result i32) (i32.const 1))
          (func (export "kubedev_alloc") (param i32) (result i32) (i32.const 1024))
          (func (export "kubedev_select") (param i32 i32) (result i64) (unreachable)))"#,
    )
    .unwrap();
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

#[test]
fn check_config_words_yaml_errors_for_people() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &format!("{SPLIT_CONFIG}nodeName: node-b\n"));
    let line = SPLIT_CONFIG.lines().count() + 1;
    let err = fails_naming(&["check-config", "--config", &config], "appears twice");
    assert_eq!(
        err,
        format!("kubedev: {config}: line {line}: key `nodeName` appears twice\n")
    );
    assert!(!err.contains("DuplicateKeyPolicy") && !err.contains("<input>"));
}

#[test]
fn policy_check_says_a_file_that_is_not_webassembly_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("readme.wasm");
    std::fs::write(&path, b"hello, this is text").unwrap();
    let p = path.to_string_lossy().into_owned();
    let err = fails_naming(&["policy", "check", &p], "is not a WebAssembly module");
    assert_eq!(
        err,
        format!("kubedev: {p} is not a WebAssembly module (it does not start with \\0asm)\n")
    );
    let err = fails_naming(
        &["simulate", "-f", &scenario("gpu8-c2.yaml"), "--policy", &p],
        "is not a WebAssembly module",
    );
    assert!(!err.contains("0x"), "{err}");
}

#[test]
fn fatal_errors_are_json_lines_under_log_format_json() {
    let out = kubedev(&[
        "--log-format",
        "json",
        "simulate",
        "-f",
        "/nonexistent/scenario.yaml",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    let line: serde_json::Value = serde_json::from_str(err.trim_end()).unwrap();
    assert_eq!(line["level"], "ERROR", "{line}");
    assert_eq!(line["target"], "kubedev", "{line}");
    let message = line["fields"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("read scenario file /nonexistent/scenario.yaml: "),
        "{message}"
    );
    assert!(
        line["timestamp"].as_str().is_some_and(|t| !t.is_empty()),
        "{line}"
    );

    // Text stays text.
    let err = fails_naming(
        &["simulate", "-f", "/nonexistent/scenario.yaml"],
        "kubedev: read scenario file /nonexistent/scenario.yaml: ",
    );
    assert!(!err.starts_with('{'), "{err}");
}

#[test]
fn sigterm_stops_the_daemon_even_when_nobody_reads_its_logs() {
    let dir = tempfile::tempdir().unwrap();
    let dp = dir.path().join("dp");
    std::fs::create_dir_all(&dp).unwrap();
    let config = write_config(
        dir.path(),
        &format!(
            "devicePlugin:\n  directory: {}\n  resources:\n    - name: example.com/dev\nbackends:\n  static:\n    pool: p\n    devices:\n      - name: dev-0\n",
            dp.display()
        ),
    );
    let mut child = Command::new(env!("CARGO_BIN_EXE_kubedev"))
        .args(["run", "--config", &config])
        .env("RUST_LOG", "debug")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until it serves (its socket appears), then close the read end of its stderr.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !std::fs::read_dir(&dp).unwrap().any(|e| {
        e.unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with("kubedev-")
    }) {
        assert!(
            std::time::Instant::now() < deadline,
            "kubedev did not start"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    drop(child.stderr.take());
    let pid = rustix::process::Pid::from_raw(i32::try_from(child.id()).unwrap()).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("kubedev did not stop after SIGTERM with its stderr closed");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert!(status.success(), "{status}");
}

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

#[test]
fn every_command_has_help_with_examples_one_per_line() {
    for cmd in [
        &["run"][..],
        &["simulate"],
        &["discover"],
        &["who-uses"],
        &["check-config"],
        &["cdi", "generate"],
        &["policy", "check"],
    ] {
        let mut args = cmd.to_vec();
        args.push("--help");
        let out = kubedev(&args);
        assert!(out.status.success(), "{cmd:?}");
        let help = String::from_utf8_lossy(&out.stdout);
        let examples: Vec<&str> = help
            .split("Examples:\n")
            .nth(1)
            .unwrap_or_else(|| panic!("{cmd:?} --help has no examples:\n{help}"))
            .lines()
            .take_while(|l| l.starts_with("  "))
            .collect();
        assert!(!examples.is_empty(), "{cmd:?}:\n{help}");
        let prefix = format!("kubedev {}", cmd.join(" "));
        // One command per line, each starting with the command it documents.
        assert!(
            examples[0].trim_start().starts_with(&prefix),
            "{cmd:?}: {examples:?}"
        );
        for e in &examples {
            assert!(e.matches("kubedev ").count() <= 1, "{cmd:?}: {e:?}");
        }
    }
}
