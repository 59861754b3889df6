//! kubedev as a kubectl plugin: `kubectl kubedev explain|status` against the API-server
//! emulator, through a kubeconfig with two contexts (the current one dead, the one named by
//! `--context` the emulator's), so a command that ignored `--context` fails; `-n` and the
//! context's namespace as the default namespace; and the shell completions and manual pages
//! generated from the command line.
//!
//! The real `kubectl` runs the plugin when it is on `PATH` (`cargo xtask ci` installs Debian's
//! `kubernetes-client` when it is missing); without it, the plugin is started the way kubectl
//! starts it: as `kubectl-kubedev` from `PATH`, with the arguments after `kubedev`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kubedev_testkit::apiserver::{ApiServer, Resource};
use serde_json::{Value, json};

const DRIVER: &str = "gpu.example.com";

/// The emulator with node-a's three GPUs (gpu-1 tainted), a GPU class, a pod in `ml` whose
/// 1-GPU claim is pending, and two claims allocated node-a's gpu-0: `ml/serving`, reserved
/// for a pod and with a Ready condition, and `other/batch`.
async fn emulator() -> ApiServer {
    let api = ApiServer::builder().start().await.unwrap();
    api.put_raw(
        Resource::ResourceSlices,
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
               "metadata": {"name": "node-a-gpus"},
               "spec": {"driver": DRIVER, "nodeName": "node-a",
                        "pool": {"name": "node-a", "generation": 3, "resourceSliceCount": 1},
                        "devices": [
                            {"name": "gpu-0"},
                            {"name": "gpu-1", "taints": [{"key": "example.com/ecc", "value": "uncorrectable", "effect": "NoSchedule"}]},
                            {"name": "gpu-2"},
                        ]}}),
    )
    .unwrap();
    api.put_raw(
        Resource::Nodes,
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}}),
    )
    .unwrap();
    api.put_raw(
        Resource::DeviceClasses,
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu"},
               "spec": {"selectors": [{"cel": {"expression": format!("device.driver == {DRIVER:?}")}}]}}),
    )
    .unwrap();
    api.put_raw(Resource::ResourceClaims, claim("ml", "train", None))
        .unwrap();
    api.put_raw(
        Resource::ResourceClaims,
        claim("ml", "serving", Some("server-0")),
    )
    .unwrap();
    api.put_raw(Resource::ResourceClaims, claim("other", "batch", None))
        .unwrap();
    api.put_raw(
        Resource::Pods,
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "trainer", "namespace": "ml"},
            "spec": {"containers": [{"name": "c", "image": "x"}],
                     "resourceClaims": [{"name": "gpus", "resourceClaimName": "train"}]},
            "status": {"phase": "Pending"}}),
    )
    .unwrap();
    api
}

/// A 1-GPU claim; `serving` and `batch` are allocated node-a's gpu-0, `serving` reserved for
/// the pod `reserved_for` with a Ready condition.
fn claim(namespace: &str, name: &str, reserved_for: Option<&str>) -> Value {
    let mut c = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": format!("uid-{name}")},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu", "count": 1}}]}}});
    if name != "train" {
        c["status"] = json!({"allocation": {
            "devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": "gpu-0"}]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}]}}});
    }
    if let Some(pod) = reserved_for {
        c["status"]["reservedFor"] = json!([{"resource": "pods", "name": pod, "uid": "uid-pod"}]);
        c["status"]["devices"] = json!([{"driver": DRIVER, "pool": "node-a", "device": "gpu-0",
            "conditions": [{"type": "Ready", "status": "True", "reason": "Prepared", "message": "",
                            "lastTransitionTime": "2026-01-01T00:00:00Z"}]}]);
    }
    c
}

/// A kubeconfig whose current context, `dead`, points at a port nothing listens on, and whose
/// context `emulator` points at `api` with namespace `ml`.
fn kubeconfig(api: &ApiServer, path: &Path) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let text = format!(
        "apiVersion: v1\nkind: Config\n\
         clusters:\n\
         - name: dead\n  cluster:\n    server: {dead}\n\
         - name: emulator\n  cluster:\n    server: {url}\n\
         users:\n\
         - name: u\n  user:\n    token: kubedev-emulator\n\
         contexts:\n\
         - name: dead\n  context:\n    cluster: dead\n    user: u\n    namespace: ml\n\
         - name: emulator\n  context:\n    cluster: emulator\n    user: u\n    namespace: ml\n\
         current-context: dead\n",
        url = api.url()
    );
    std::fs::write(path, text).unwrap();
}

/// A directory holding `kubectl-kubedev`, a link to the built binary, for `PATH`.
fn plugin_dir(dir: &Path) -> PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_kubedev"), bin.join("kubectl-kubedev")).unwrap();
    bin
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()))
}

/// `kubectl kubedev ARGS` with `KUBECONFIG=kubeconfig` and `bin` first on `PATH`.
fn kubectl_kubedev(bin: &Path, kubeconfig: &Path, args: &[&str]) -> Output {
    let path = std::env::join_paths(std::iter::once(bin.to_path_buf()).chain(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
    ))
    .unwrap();
    let mut command = if on_path("kubectl") {
        let mut c = Command::new("kubectl");
        c.arg("kubedev");
        c
    } else {
        Command::new(bin.join("kubectl-kubedev"))
    };
    command
        .args(args)
        .env("PATH", path)
        .env("KUBECONFIG", kubeconfig)
        .output()
        .unwrap()
}

fn stdout_of(out: Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The files of a test: the kubeconfig and the plugin's directory.
struct Setup {
    _dir: tempfile::TempDir,
    bin: PathBuf,
    kubeconfig: PathBuf,
}

fn setup(api: &ApiServer) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig_path = dir.path().join("kubeconfig");
    kubeconfig(api, &kubeconfig_path);
    Setup {
        bin: plugin_dir(dir.path()),
        kubeconfig: kubeconfig_path,
        _dir: dir,
    }
}

#[tokio::test]
async fn kubectl_kubedev_explain_reads_the_cluster_of_the_named_context() {
    let api = emulator().await;
    let s = setup(&api);
    tokio::task::spawn_blocking(move || {
        let run = |args: &[&str]| kubectl_kubedev(&s.bin, &s.kubeconfig, args);

        let text = stdout_of(run(&[
            "explain",
            "--pod",
            "ml/trainer",
            "-n",
            "ml",
            "--context",
            "emulator",
        ]));
        assert!(
            text.starts_with("1 of 1 nodes can take ml/train\n"),
            "{text}"
        );

        // A bare name is in the context's namespace, or in -n's.
        let text = stdout_of(run(&[
            "explain",
            "--pod",
            "trainer",
            "--context",
            "emulator",
        ]));
        assert!(
            text.starts_with("1 of 1 nodes can take ml/train\n"),
            "{text}"
        );
        let out = run(&[
            "explain",
            "--claim",
            "train",
            "-n",
            "default",
            "--context",
            "emulator",
        ]);
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("claim default/train is not in the input"),
            "{stderr}"
        );

        // Without --context the current context, which nothing answers, is used.
        let out = run(&["explain", "--pod", "ml/trainer", "-n", "ml"]);
        assert!(!out.status.success(), "the dead context answered");

        // As a plugin, usage names `kubectl kubedev`.
        let help = stdout_of(run(&["explain", "--help"]));
        assert!(help.contains("Usage: kubectl kubedev explain"), "{help}");
        assert!(help.contains("--context <CONTEXT>"), "{help}");
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn kubectl_kubedev_status_shows_slices_taints_and_claims_per_node() {
    let api = emulator().await;
    let s = setup(&api);
    tokio::task::spawn_blocking(move || {
        let run = |args: &[&str]| kubectl_kubedev(&s.bin, &s.kubeconfig, args);
        let status = |args: &[&str]| -> Value {
            let all = [&["status", "--driver", DRIVER, "--context", "emulator", "-o", "json"][..], args].concat();
            serde_json::from_str(&stdout_of(run(&all))).unwrap()
        };

        // The context's namespace, ml: its one allocated claim.
        let json = status(&[]);
        assert_eq!(json["driver"], DRIVER);
        assert_eq!(json["namespace"], "ml");
        let nodes = json["nodes"].as_array().unwrap();
        assert_eq!(nodes.len(), 1, "{json}");
        let node = &nodes[0];
        assert_eq!(node["node"], "node-a");
        assert_eq!(
            node["pools"],
            json!([{"name": "node-a", "generation": 3, "slices": ["node-a-gpus"], "resourceSliceCount": 1}])
        );
        assert_eq!(node["devices"].as_array().unwrap().len(), 3);
        assert_eq!(
            node["devices"][1]["taints"],
            json!([{"key": "example.com/ecc", "value": "uncorrectable", "effect": "NoSchedule"}])
        );
        assert_eq!(node["devices"][0]["claim"], "ml/serving");
        assert_eq!(
            node["claims"],
            json!([{"namespace": "ml", "name": "serving", "devices": ["node-a/gpu-0"],
                    "reservedFor": ["ml/server-0"], "conditions": ["node-a/gpu-0: Ready=True"]}])
        );

        // -n and -A choose the claims' namespaces.
        let json = status(&["-n", "other"]);
        let claims = &json["nodes"][0]["claims"];
        assert_eq!(claims.as_array().unwrap().len(), 1, "{json}");
        assert_eq!(claims[0]["name"], "batch");
        let json = status(&["-A"]);
        assert_eq!(json["namespace"], Value::Null);
        assert_eq!(json["nodes"][0]["claims"].as_array().unwrap().len(), 2, "{json}");

        // Another driver has nothing here.
        let text = stdout_of(run(&["status", "--driver", "fpga.example.com", "--context", "emulator"]));
        assert!(text.contains("No ResourceSlice of this driver"), "{text}");

        // The table, and -o wide with every device.
        let text = stdout_of(run(&["status", "--driver", DRIVER, "--context", "emulator", "-o", "wide"]));
        for expected in [
            "Driver gpu.example.com (claims in namespace ml)",
            "node-a  node-a (3)",
            "node-a  node-a/gpu-1  example.com/ecc  uncorrectable  NoSchedule",
            "node-a  ml         serving  node-a/gpu-0  ml/server-0",
            "node-a  node-a/gpu-0  -",
        ] {
            assert!(text.contains(expected), "{expected:?} not in\n{text}");
        }

        // Without --context the current context, which nothing answers, is used.
        let out = run(&["status", "--driver", DRIVER]);
        assert!(!out.status.success(), "the dead context answered");
    })
    .await
    .unwrap();
}

fn kubedev(args: &[&str]) -> String {
    stdout_of(
        Command::new(env!("CARGO_BIN_EXE_kubedev"))
            .args(args)
            .output()
            .unwrap(),
    )
}

#[test]
fn kubectl_plugin_completions_are_valid_scripts_for_every_shell() {
    let dir = tempfile::tempdir().unwrap();
    let bash = dir.path().join("kubedev.bash");
    std::fs::write(&bash, kubedev(&["completion", "bash"])).unwrap();
    let check = Command::new("bash").arg("-n").arg(&bash).output().unwrap();
    assert!(
        check.status.success(),
        "bash -n: {}",
        String::from_utf8_lossy(&check.stderr)
    );
    for shell in ["bash", "zsh", "fish", "powershell", "elvish"] {
        let script = kubedev(&["completion", shell]);
        for word in ["explain", "status", "who-uses", "context", "all-namespaces"] {
            assert!(script.contains(word), "{shell}: {word} missing");
        }
    }
}

#[test]
fn kubectl_plugin_man_pages_render_for_every_command() {
    let dir = tempfile::tempdir().unwrap();
    let listing = kubedev(&["man", "--dir", dir.path().to_str().unwrap()]);
    let help = kubedev(&["--help"]);
    // Every visible subcommand in the help has a page (and so do nested ones).
    let commands: Vec<&str> = help
        .lines()
        .skip_while(|l| *l != "Commands:")
        .skip(1)
        .take_while(|l| !l.is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .collect();
    assert!(commands.contains(&"status"), "{help}");
    let mut pages = vec!["kubedev.1".to_string(), "kubedev-cdi-generate.1".into()];
    pages.extend(commands.iter().map(|c| format!("kubedev-{c}.1")));
    for page in &pages {
        let path = dir.path().join(page);
        assert!(
            listing.contains(path.to_str().unwrap()),
            "{page} not listed"
        );
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.contains("\n.TH ") || text.starts_with(".TH "),
            "{page}: no .TH"
        );
        assert!(text.contains(".SH NAME"), "{page}: no NAME section");
    }
    if on_path("man") {
        let out = Command::new("man")
            .arg("-l")
            .arg(dir.path().join("kubedev-status.1"))
            .env("MANWIDTH", "100")
            .env("MANPAGER", "cat")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            text.contains("--all-namespaces") || text.contains("‐‐all‐namespaces"),
            "{text}"
        );
    }
}
