//! The NVIDIA backend's CDI specs applied by a real container runtime (podman with runc): a fake
//! driver root made of real files (shared objects with SONAMEs and the installer's links,
//! `nvidia-smi`, GSP firmware, the persistenced socket, `mknod`-made device nodes), the NVML
//! stand-in for the GPUs, kubedev's spec installed unchanged, and what a CUDA user relies on
//! checked from inside a busybox container: nodes, libraries at their SONAME paths (found by the
//! container's own loader), tools, firmware, the UUID in `NVIDIA_VISIBLE_DEVICES`, read-only
//! mounts. Also the device plugin's CDI mode, and `kubedev cdi generate` against a claim's spec.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use crate::common::{self, Claims, DevicePluginDaemon, DraDaemon};
use kubedev_core::DeviceRef;
use kubedev_testkit::kubelet::ClaimId;
use kubedev_testkit::podman::{Container, Podman};
use serde_json::{Value, json};

const DRIVER: &str = "devices.example.com";
const WAIT: Duration = Duration::from_secs(15);
/// The driver version of the `dgx-a100` NVML stand-in.
const VERSION: &str = "550.54.15";
const LIB_DIR: &str = "usr/lib/x86_64-linux-gnu";
const SMI_MARKER: &str = "kubedev-fake-nvidia-smi";
const CUDA_MARKER: &str = "kubedev-fake-libcuda";
const FIRMWARE: &str = "fake GSP firmware for ga10x\n";

/// A fake NVIDIA driver installation below a temporary directory, as the driver's installer
/// lays it out, with real device nodes in its `dev/`.
struct DriverRoot {
    dir: tempfile::TempDir,
    /// The persistenced socket is bound while this lives.
    _socket: UnixListener,
}

fn sh(cmd: &mut Command) {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl DriverRoot {
    fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("kubedev-driver-root")
            .tempdir()
            .unwrap();
        let root = dir.path();
        let lib = root.join(LIB_DIR);
        std::fs::create_dir_all(&lib).unwrap();
        // Real shared objects with their SONAMEs, and the links an installer makes.
        for (name, body) in [
            (
                "cuda",
                format!(
                    "const char *kubedev_fake_marker(void) {{ return \"{CUDA_MARKER}\"; }}\n\
                     int cuInit(unsigned int flags) {{ (void)flags; return 0; }}\n"
                ),
            ),
            (
                "nvidia-ml",
                "int nvmlInit_v2(void) { return 0; }\n".to_string(),
            ),
        ] {
            let src = root.join(format!("{name}.c"));
            std::fs::write(&src, body).unwrap();
            let file = format!("lib{name}.so.{VERSION}");
            sh(Command::new("cc")
                .args(["-shared", "-fPIC", "-nostdlib"])
                .arg(format!("-Wl,-soname,lib{name}.so.1"))
                .arg("-o")
                .arg(lib.join(&file))
                .arg(&src));
            std::fs::remove_file(&src).unwrap();
            std::os::unix::fs::symlink(&file, lib.join(format!("lib{name}.so.1"))).unwrap();
            std::os::unix::fs::symlink(
                format!("lib{name}.so.1"),
                lib.join(format!("lib{name}.so")),
            )
            .unwrap();
        }
        let bin = root.join("usr/bin");
        std::fs::create_dir_all(&bin).unwrap();
        // A static ELF executable: kubedev mounts only ELF tools (a wrapper script would run
        // the real tool from elsewhere), and busybox has no C library for a dynamic one.
        let smi_src = root.join("nvidia-smi.c");
        std::fs::write(
            &smi_src,
            format!(
                "#include <stdio.h>\nint main(int argc, char **argv) {{\n\
                 printf(\"{SMI_MARKER}\");\n\
                 for (int i = 1; i < argc; i++) printf(\" %s\", argv[i]);\n\
                 printf(\"\\n\");\n return 0;\n}}\n"
            ),
        )
        .unwrap();
        sh(Command::new("cc")
            .arg("-static")
            .arg("-o")
            .arg(bin.join("nvidia-smi"))
            .arg(&smi_src));
        std::fs::remove_file(&smi_src).unwrap();
        let fw = root.join(format!("lib/firmware/nvidia/{VERSION}"));
        std::fs::create_dir_all(&fw).unwrap();
        std::fs::write(fw.join("gsp_ga10x.bin"), FIRMWARE).unwrap();
        let run = root.join("run/nvidia-persistenced");
        std::fs::create_dir_all(&run).unwrap();
        let socket = UnixListener::bind(run.join("socket")).unwrap();
        let dev = root.join("dev");
        std::fs::create_dir_all(&dev).unwrap();
        let mut nodes = vec![
            ("nvidiactl".to_string(), 195, 255),
            ("nvidia-uvm".to_string(), 235, 0),
        ];
        nodes.extend((0..8).map(|i| (format!("nvidia{i}"), 195, i)));
        for (name, major, minor) in nodes {
            sh(Command::new("mknod")
                .args(["-m", "0666"])
                .arg(dev.join(name))
                .args(["c", &major.to_string(), &minor.to_string()]));
        }
        DriverRoot {
            dir,
            _socket: socket,
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn libcuda(&self) -> PathBuf {
        self.path()
            .join(LIB_DIR)
            .join(format!("libcuda.so.{VERSION}"))
    }
}

/// A copy of the NVML stand-in bound to the DGX A100 machine.
fn nvml(dir: &Path) -> PathBuf {
    nvml_mock::isolated_library(dir, &nvml_mock::machine_path("dgx-a100"), None).unwrap()
}

fn nvidia_backend(lib: &Path, root: &DriverRoot) -> String {
    format!(
        "  nvidia:\n    libraryPath: {}\n    driverRoot: {}\n",
        lib.display(),
        root.path().display()
    )
}

/// A daemon in DRA mode on the real host root (`/`) with the NVIDIA backend.
async fn dra_node(dir: &Path, backends: &str) -> DraDaemon {
    dra_node_on(dir, Path::new("/"), backends).await
}

/// A daemon in DRA mode with the NVIDIA backend, seeing the host through `host`.
async fn dra_node_on(dir: &Path, host: &Path, backends: &str) -> DraDaemon {
    std::fs::write(
        dir.join("boot_id"),
        "8b7c1f6e-0000-4000-8000-0000000000bb\n",
    )
    .unwrap();
    let text = format!(
        "nodeName: node-a\nhostRoot: {h}\nstateDir: {r}/state\ndevicePlugin:\n  enabled: false\n{dra}backends:\n{backends}",
        h = host.display(),
        r = dir.display(),
        dra = common::dra_section(DRIVER, dir, &dir.join("plugins")),
    );
    DraDaemon::start(
        dir,
        &dir.join("dra.yaml"),
        &text,
        DRIVER,
        Arc::new(Claims::default()),
        WAIT,
    )
    .await
}

/// The published GPUs `names`, and their UUIDs.
async fn gpus(node: &DraDaemon, names: &[&str]) -> Vec<(DeviceRef, String)> {
    let inv = node.slices.wait_last(WAIT).await;
    names
        .iter()
        .map(|name| {
            let (pool, dev) = inv
                .devices()
                .find(|(_, d)| d.name.as_str() == *name)
                .unwrap_or_else(|| panic!("{name} is not published: {inv:?}"));
            let device = DeviceRef::new(pool.name.clone(), dev.name.clone());
            let uuid = dev
                .attributes
                .iter()
                .find(|(k, _)| k.as_str() == "gpu.nvidia.com/uuid")
                .map(|(_, v)| v.to_string().trim_matches('"').to_string())
                .unwrap_or_else(|| panic!("{name} has no UUID: {dev:?}"));
            (device, uuid)
        })
        .collect()
}

/// Allocates `devices` to the claim `uid`, prepares it through the kubelet and returns the
/// claim's CDI spec file content.
async fn prepare(node: &DraDaemon, dir: &Path, uid: &str, devices: &[DeviceRef]) -> String {
    node.claims.allocate(uid, "req", devices);
    prepare_allocated(node, dir, uid, devices.len()).await
}

/// Prepares the claim `uid` (allocated `count` devices by the test) through the kubelet and
/// returns the claim's CDI spec file content.
async fn prepare_allocated(node: &DraDaemon, dir: &Path, uid: &str, count: usize) -> String {
    let id = ClaimId::new("default", &format!("claim-{uid}"), uid);
    let answers = node.kubelet.prepare(DRIVER, &[id]).await.unwrap();
    assert_eq!(answers[uid].as_ref().unwrap().len(), count, "{answers:?}");
    let files: Vec<PathBuf> = common::cdi_files(&dir.join("cdi"))
        .into_iter()
        .filter(|p| p.to_string_lossy().contains(uid))
        .collect();
    assert_eq!(files.len(), 1, "one CDI spec for the claim: {files:?}");
    std::fs::read_to_string(&files[0]).unwrap()
}

async fn unprepare(node: &DraDaemon, uid: &str) {
    let id = ClaimId::new("default", &format!("claim-{uid}"), uid);
    let answers = node.kubelet.unprepare(DRIVER, &[id]).await.unwrap();
    assert!(answers[uid].is_ok(), "{:?}", answers[uid]);
}

/// The script asserting what a CUDA user relies on; prints `key=value` lines and fails on the
/// first thing missing.
fn user_script(minors: &[u32]) -> String {
    let lib = format!("/{LIB_DIR}");
    let mut s = String::from("set -e\n");
    for m in minors {
        s.push_str(&format!(
            "echo nvidia{m}=$(stat -c '%F %t:%T' /dev/nvidia{m})\n"
        ));
    }
    s.push_str(&format!(
        "echo ctl=$(stat -c '%F %t:%T' /dev/nvidiactl)\n\
         echo cuda1=$(sha256sum < {lib}/libcuda.so.1 | cut -d' ' -f1)\n\
         echo cuda=$(sha256sum < {lib}/libcuda.so | cut -d' ' -f1)\n\
         echo cudaver=$(sha256sum < {lib}/libcuda.so.{VERSION} | cut -d' ' -f1)\n\
         test -f {lib}/libnvidia-ml.so.1\n\
         echo smi=$(/usr/bin/nvidia-smi -L)\n\
         echo fw=$(cat /lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin)\n\
         echo socket=$(stat -c %F /run/nvidia-persistenced/socket)\n\
         echo visible=$NVIDIA_VISIBLE_DEVICES\n\
         if (echo x > {lib}/libcuda.so.1) 2>/tmp/err; then echo write=allowed; \
         else echo write=$(cat /tmp/err); fi\n"
    ));
    s
}

fn sha256(path: &Path) -> String {
    let out = Command::new("sha256sum").arg(path).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

/// Asserts the user-visible facts printed by [`user_script`].
fn assert_user_view(
    out: &kubedev_testkit::podman::RunOutput,
    minors: &[u32],
    uuids: &[String],
    cuda_sha: &str,
) {
    let report = out.report();
    for m in minors {
        assert_eq!(
            out.value(&format!("nvidia{m}")),
            Some(format!("character special file c3:{m:x}").as_str()),
            "{report}"
        );
    }
    assert_eq!(
        out.value("ctl"),
        Some("character special file c3:ff"),
        "{report}"
    );
    for key in ["cuda1", "cuda", "cudaver"] {
        assert_eq!(out.value(key), Some(cuda_sha), "{key}: {report}");
    }
    assert_eq!(
        out.value("smi"),
        Some(format!("{SMI_MARKER} -L").as_str()),
        "{report}"
    );
    assert_eq!(out.value("fw"), Some(FIRMWARE.trim_end()), "{report}");
    assert_eq!(out.value("socket"), Some("socket"), "{report}");
    let visible: BTreeSet<&str> = out
        .value("visible")
        .unwrap_or_default()
        .split(',')
        .collect();
    let want: BTreeSet<&str> = uuids.iter().map(String::as_str).collect();
    assert_eq!(visible, want, "NVIDIA_VISIBLE_DEVICES: {report}");
    let write = out.value("write").unwrap_or_default();
    assert!(write.contains("Read-only file system"), "{write}: {report}");
}

/// A program linked against `libcuda.so.1` (the SONAME), and a spec of the test's own that
/// gives the container the host's loader and C library, so the container's loader must find
/// the driver library where kubedev's spec put it, by SONAME, without any `ld.so.cache`.
struct LoaderProbe {
    dir: tempfile::TempDir,
    spec: String,
}

impl LoaderProbe {
    fn new(root: &DriverRoot) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("probe.c");
        std::fs::write(
            &src,
            "#include <stdio.h>\nconst char *kubedev_fake_marker(void);\n\
             int cuInit(unsigned int);\n\
             int main(void) { printf(\"loaded=%s %d\\n\", kubedev_fake_marker(), cuInit(0)); return 0; }\n",
        )
        .unwrap();
        let probe = dir.path().join("probe");
        sh(Command::new("cc")
            .arg("-o")
            .arg(&probe)
            .arg(&src)
            .arg("-L")
            .arg(root.path().join(LIB_DIR))
            .arg("-lcuda"));
        let bytes = std::fs::read(&probe).unwrap();
        assert!(
            bytes.windows(13).any(|w| w == b"libcuda.so.1\0"),
            "the probe needs libcuda.so.1 by its SONAME"
        );
        let canon = |p: &str| std::fs::canonicalize(p).unwrap();
        let ld = canon("/lib64/ld-linux-x86-64.so.2");
        let libc = canon("/lib/x86_64-linux-gnu/libc.so.6");
        let ro = json!(["ro", "nosuid", "nodev", "bind"]);
        let spec = json!({
            "cdiVersion": "0.5.0",
            "kind": "loader.kubedev.test/probe",
            "devices": [{"name": "probe", "containerEdits": {"mounts": [
                {"hostPath": ld, "containerPath": "/lib64/ld-linux-x86-64.so.2", "options": ro},
                {"hostPath": libc, "containerPath": "/lib/x86_64-linux-gnu/libc.so.6", "options": ro},
                {"hostPath": probe, "containerPath": "/opt/probe", "options": ["ro", "bind"]}
            ]}}]
        })
        .to_string();
        LoaderProbe { dir, spec }
    }
}

/// What the NVIDIA container tests start from: the podman harness, a fake driver root, the
/// checksum of its `libcuda`, a work directory and a copy of the NVML stand-in in it.
struct Fixture {
    podman: Podman,
    root: DriverRoot,
    cuda_sha: String,
    dir: tempfile::TempDir,
    lib: PathBuf,
}

impl Fixture {
    fn new() -> Self {
        let root = DriverRoot::new();
        let dir = tempfile::tempdir().unwrap();
        Fixture {
            podman: Podman::new().unwrap(),
            cuda_sha: sha256(&root.libcuda()),
            lib: nvml(dir.path()),
            root,
            dir,
        }
    }
}

/// Installs kubedev's `spec` unchanged, runs `script` in a container given every device of it,
/// and checks every edit of the spec from inside; the spec stays installed while the guard
/// lives.
fn run_spec(
    podman: &Podman,
    spec: &str,
    script: impl Into<String>,
) -> (
    kubedev_testkit::podman::InstalledSpec,
    kubedev_testkit::podman::RunOutput,
) {
    let installed = podman.install_spec(spec).unwrap();
    let out = podman
        .run(
            Container::new(script)
                .devices(installed.device_ids())
                .check(spec, &installed.device_names()),
        )
        .unwrap();
    out.assert_ok();
    (installed, out)
}

#[tokio::test]
#[ignore = "needs root, podman and runc: run by cargo xtask ci"]
async fn a_dra_claim_gives_the_container_the_gpu_and_a_usable_driver() {
    let Fixture {
        podman,
        root,
        cuda_sha,
        dir,
        lib,
    } = Fixture::new();
    let node = dra_node(dir.path(), &nvidia_backend(&lib, &root)).await;

    // One GPU: everything a CUDA user needs, checked edit by edit and from the user's side,
    // and the container's loader finds libcuda.so.1 by SONAME.
    let one = gpus(&node, &["gpu-0"]).await;
    let spec = prepare(&node, dir.path(), "uid-one", &[one[0].0.clone()]).await;
    assert!(spec.contains(&root.path().display().to_string()), "{spec}");
    let installed = podman.install_spec(&spec).unwrap();
    let probe = LoaderProbe::new(&root);
    let helper = podman.install_spec(&probe.spec).unwrap();
    let script = format!("{}\n/opt/probe\n", user_script(&[0]));
    let out = podman
        .run(
            Container::new(script)
                .devices(installed.device_ids())
                .devices(helper.device_ids())
                .check(&spec, &installed.device_names()),
        )
        .unwrap();
    out.assert_ok();
    assert_user_view(&out, &[0], &[one[0].1.clone()], &cuda_sha);
    assert_eq!(
        out.value("loaded"),
        Some(format!("{CUDA_MARKER} 0").as_str()),
        "{}",
        out.report()
    );
    drop(helper);
    drop(probe.dir);
    drop(installed);
    unprepare(&node, "uid-one").await;

    // Two GPUs in one claim: both nodes, both UUIDs, the driver files once.
    let two = gpus(&node, &["gpu-0", "gpu-1"]).await;
    let devices: Vec<DeviceRef> = two.iter().map(|(d, _)| d.clone()).collect();
    let spec = prepare(&node, dir.path(), "uid-two", &devices).await;
    let (installed, out) = run_spec(&podman, &spec, user_script(&[0, 1]));
    let uuids: Vec<String> = two.iter().map(|(_, u)| u.clone()).collect();
    assert_user_view(&out, &[0, 1], &uuids, &cuda_sha);
    drop(installed);
    unprepare(&node, "uid-two").await;
    node.stop().await;
}

#[tokio::test]
#[ignore = "needs root, podman and runc: run by cargo xtask ci"]
async fn the_device_plugin_in_cdi_mode_gives_the_container_the_gpu_and_the_driver() {
    let Fixture {
        podman,
        root,
        cuda_sha,
        dir,
        lib,
    } = Fixture::new();
    let dp = dir.path().join("dp");
    std::fs::create_dir_all(&dp).unwrap();
    let resource = "nvidia.com/gpu";
    let text = format!(
        "nodeName: node-a\nhostRoot: /\nstateDir: {d}/state\ndevicePlugin:\n  directory: {dp}\n  cdi: true\n  cdiDir: {d}/cdi\n  resources:\n    - name: {resource}\nbackends:\n{backends}",
        d = dir.path().display(),
        dp = dp.display(),
        backends = nvidia_backend(&lib, &root),
    );
    let node = DevicePluginDaemon::start(&dir.path().join("dp.yaml"), &text, &dp).await;
    node.kubelet
        .wait_for(resource, WAIT, |r| r.connected && r.capacity == 8)
        .await
        .unwrap();
    let a = node.kubelet.allocate(resource, &["gpu-1"]).await.unwrap();
    assert!(
        a.devices.is_empty() && a.envs.is_empty(),
        "CDI mode leaves the edits to the runtime: {a:?}"
    );
    let ids: Vec<String> = a.cdi_devices.iter().map(|d| d.name.clone()).collect();
    assert_eq!(ids.len(), 1, "{a:?}");
    let files = common::cdi_files(&dir.path().join("cdi"));
    assert_eq!(files.len(), 1, "{files:?}");
    let spec = std::fs::read_to_string(&files[0]).unwrap();
    let uuid = serde_json::from_str::<Value>(&spec).unwrap()["devices"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|d| {
            d["containerEdits"]["env"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .chain(
            serde_json::from_str::<Value>(&spec).unwrap()["containerEdits"]["env"]
                .as_array()
                .cloned()
                .unwrap_or_default(),
        )
        .filter_map(|e| {
            e.as_str()?
                .strip_prefix("NVIDIA_VISIBLE_DEVICES=")
                .map(str::to_string)
        })
        .next()
        .unwrap_or_else(|| panic!("no NVIDIA_VISIBLE_DEVICES: {spec}"));
    assert!(uuid.starts_with("GPU-"), "{uuid}");
    let installed = podman.install_spec(&spec).unwrap();
    let names: Vec<String> = ids
        .iter()
        .map(|id| {
            id.strip_prefix(&format!("{}=", installed.kind()))
                .unwrap_or_else(|| panic!("{id} is not of the kind {}", installed.kind()))
                .to_string()
        })
        .collect();
    let out = podman
        .run(
            Container::new(user_script(&[1]))
                .devices(&ids)
                .check(&spec, &names),
        )
        .unwrap();
    out.assert_ok();
    assert_user_view(&out, &[1], &[uuid], &cuda_sha);
    drop(installed);
    node.stop().await;
}

/// The union of a spec's own edits and those of its device `name`, each edit as sorted JSON
/// text: (env, device nodes, mounts, hooks).
fn edits_of(spec: &Value, name: &str) -> [BTreeSet<String>; 4] {
    let device = spec["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == name)
        .unwrap_or_else(|| panic!("no device {name}: {spec:#}"));
    let mut out: [BTreeSet<String>; 4] = Default::default();
    for edits in [&spec["containerEdits"], &device["containerEdits"]] {
        for (i, key) in ["env", "deviceNodes", "mounts", "hooks"].iter().enumerate() {
            for e in edits[*key].as_array().into_iter().flatten() {
                out[i].insert(e.to_string());
            }
        }
    }
    out
}

#[tokio::test]
#[ignore = "needs root, podman and runc: run by cargo xtask ci"]
async fn cdi_generate_gives_a_gpu_what_a_dra_claim_gives_it() {
    let root = DriverRoot::new();
    let dir = tempfile::tempdir().unwrap();
    let lib = nvml(dir.path());
    let backends = nvidia_backend(&lib, &root);

    let node = dra_node(dir.path(), &backends).await;
    let gpu0 = gpus(&node, &["gpu-0"]).await;
    let claim: Value =
        serde_json::from_str(&prepare(&node, dir.path(), "uid-gen", &[gpu0[0].0.clone()]).await)
            .unwrap();
    node.stop().await;
    let claim_devices = claim["devices"].as_array().unwrap();
    assert_eq!(claim_devices.len(), 1, "{claim:#}");
    let claim_edits = edits_of(&claim, claim_devices[0]["name"].as_str().unwrap());

    let gen_dir = tempfile::tempdir().unwrap();
    let path = gen_dir.path().join("kubedev.yaml");
    std::fs::write(
        &path,
        format!(
            "nodeName: node-a\nhostRoot: /\nstateDir: {}/state\ndra:\n  enabled: true\n  driverName: {DRIVER}\nbackends:\n{backends}",
            gen_dir.path().display()
        ),
    )
    .unwrap();
    let config = kubedev::config::Config::load(&path).unwrap();
    let generated = kubedev::cdi_generate::generate(&config, &path, &format!("{DRIVER}/device"))
        .await
        .unwrap();
    let spec = serde_json::to_value(generated.spec.as_ref().unwrap()).unwrap();
    let names: Vec<&str> = spec["devices"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|d| d["name"].as_str())
        .collect();
    let name = names
        .iter()
        .find(|n| **n == "gpu-0" || n.ends_with("-gpu-0"))
        .unwrap_or_else(|| panic!("no device for gpu-0 among {names:?}"));
    let gen_edits = edits_of(&spec, name);
    for (i, what) in ["env", "deviceNodes", "mounts", "hooks"].iter().enumerate() {
        assert_eq!(
            gen_edits[i], claim_edits[i],
            "{what} of gpu-0 differ between `cdi generate` and the claim's spec"
        );
    }
    assert!(
        claim_edits[2]
            .iter()
            .any(|m| m.contains(&format!("libcuda.so.{VERSION}"))),
        "the driver's libraries are mounted: {:?}",
        claim_edits[2]
    );
}

/// A copy of the NVML stand-in bound to the machine `machine`.
fn nvml_of(dir: &Path, machine: &str) -> PathBuf {
    nvml_mock::isolated_library(dir, &nvml_mock::machine_path(machine), None).unwrap()
}

/// The published device `name` and its attributes (`gpu.nvidia.com/uuid` → value, strings
/// unquoted).
async fn published(node: &DraDaemon, name: &str) -> (DeviceRef, BTreeMap<String, String>) {
    let inv = node.slices.wait_last(WAIT).await;
    let names: Vec<&str> = inv.devices().map(|(_, d)| d.name.as_str()).collect();
    let (pool, dev) = inv
        .devices()
        .find(|(_, d)| d.name.as_str() == name)
        .unwrap_or_else(|| panic!("{name} is not published, only {names:?}"));
    let attrs = dev
        .attributes
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_string(),
                v.to_string().trim_matches('"').to_string(),
            )
        })
        .collect();
    (DeviceRef::new(pool.name.clone(), dev.name.clone()), attrs)
}

/// What the container's `/dev` holds besides the control node: its GPU nodes (`gpus=`, names),
/// `nvidia-uvm` (`uvm=`) and the MIG capability nodes (`caps=nvidia-cap<N>=<major>:<minor> ...`
/// in hexadecimal, or `none` without `/dev/nvidia-caps`).
const NODES_SCRIPT: &str = "echo gpus=$(ls /dev | grep '^nvidia[0-9]' | sort | tr '\\n' ' ')\n\
     echo uvm=$(stat -c '%F %t:%T' /dev/nvidia-uvm)\n\
     if [ -d /dev/nvidia-caps ]; then \
     echo caps=$(cd /dev/nvidia-caps && for f in *; do stat -c '%n=%t:%T' $f; done | sort | tr '\\n' ' '); \
     else echo caps=none; fi\n";

/// Asserts what [`NODES_SCRIPT`] printed: exactly the GPU nodes `minors`, `nvidia-uvm`, and
/// exactly the capability nodes `caps` (minor numbers of the `nvidia-caps` major), or no
/// `/dev/nvidia-caps` at all when `caps` is `None`.
fn assert_nodes(out: &kubedev_testkit::podman::RunOutput, minors: &[u32], caps: Option<&[u32]>) {
    let report = out.report();
    let mut want: Vec<String> = minors.iter().map(|m| format!("nvidia{m}")).collect();
    want.sort();
    assert_eq!(
        out.value("gpus").map(str::trim),
        Some(want.join(" ").as_str()),
        "the GPU nodes the container sees: {report}"
    );
    assert_eq!(
        out.value("uvm"),
        Some("character special file eb:0"),
        "{report}"
    );
    let want_caps = match caps {
        None => "none".to_string(),
        Some(caps) => {
            let mut v: Vec<String> = caps
                .iter()
                .map(|n| format!("nvidia-cap{n}={CAPS_MAJOR:x}:{n:x}"))
                .collect();
            v.sort();
            v.join(" ")
        }
    };
    assert_eq!(
        out.value("caps").map(str::trim),
        Some(want_caps.as_str()),
        "the MIG capability nodes: {report}"
    );
}

/// The major number of the fake `nvidia-caps` nodes (a dynamic major on a real host).
const CAPS_MAJOR: u32 = 239;

/// `/proc/driver/nvidia-caps/mig-minors` as the driver numbers it for GPU 0: `config`,
/// `monitor`, then per GPU instance 0-14 its `access` followed by those of its compute
/// instances 0-7.
fn mig_minors() -> Vec<(String, u32)> {
    let mut v = vec![("config".to_string(), 1), ("monitor".to_string(), 2)];
    for gi in 0..15u32 {
        let access = 3 + gi * 9;
        v.push((format!("gpu0/gi{gi}/access"), access));
        for ci in 0..8u32 {
            v.push((format!("gpu0/gi{gi}/ci{ci}/access"), access + 1 + ci));
        }
    }
    v
}

/// A host root for kubedev in which the driver root `root` lies at its real path, as hard
/// links to the same files, nodes and socket (so every host path the spec names exists on the
/// real host, with the same content, for podman), and which has the driver's
/// `/proc/driver/nvidia-caps/mig-minors` listing `minors`. The capability nodes
/// `nvidia-cap<N>` are made in the driver root's `dev/nvidia-caps`, where the spec takes them
/// from (the dev root is the driver root, which has `dev/nvidiactl`).
fn mig_host_root(root: &DriverRoot, minors: &[(String, u32)]) -> tempfile::TempDir {
    let caps = root.path().join("dev/nvidia-caps");
    std::fs::create_dir_all(&caps).unwrap();
    let script: String = minors
        .iter()
        .map(|(_, n)| {
            format!(
                "mknod -m 0666 '{}/nvidia-cap{n}' c {CAPS_MAJOR} {n}\n",
                caps.display()
            )
        })
        .collect();
    sh(Command::new("sh").args(["-ec", &script]));
    // Beside the driver root, so hard links work (one file system).
    let host = tempfile::Builder::new()
        .prefix("kubedev-host-root")
        .tempdir_in(root.path().parent().unwrap())
        .unwrap();
    let mirror = host
        .path()
        .join(root.path().strip_prefix("/").unwrap())
        .parent()
        .unwrap()
        .to_path_buf();
    std::fs::create_dir_all(&mirror).unwrap();
    sh(Command::new("cp").arg("-al").arg(root.path()).arg(&mirror));
    let proc_dir = host.path().join("proc/driver/nvidia-caps");
    std::fs::create_dir_all(&proc_dir).unwrap();
    let text: String = minors.iter().map(|(k, n)| format!("{k} {n}\n")).collect();
    std::fs::write(proc_dir.join("mig-minors"), text).unwrap();
    host
}

#[tokio::test]
#[ignore = "needs root, podman and runc: run by cargo xtask ci"]
async fn a_static_mig_device_gives_the_container_its_gpu_capabilities_and_mig_uuid() {
    let podman = Podman::new().unwrap();
    let root = DriverRoot::new();
    let cuda_sha = sha256(&root.libcuda());
    // kubedev reads the capability minors from the host's
    // `/proc/driver/nvidia-caps/mig-minors`, which this CI machine (no NVIDIA driver) does
    // not have: with hostRoot `/` no capability node would be given (see the partitionable
    // test). A host root of the test's own provides the file, and shows the driver root at
    // its real path, so the spec still names paths that exist on the real host.
    let minors = mig_minors();
    let host = mig_host_root(&root, &minors);
    let dir = tempfile::tempdir().unwrap();
    let lib = nvml_of(dir.path(), "h100-mig");
    let backends = format!("{}    migStrategy: static\n", nvidia_backend(&lib, &root));
    let node = dra_node_on(dir.path(), host.path(), &backends).await;

    // The GPU's seven existing MIG devices are published instead of the GPU.
    let inv = node.slices.wait_last(WAIT).await;
    let names: BTreeSet<&str> = inv.devices().map(|(_, d)| d.name.as_str()).collect();
    assert_eq!(
        names,
        (0..7)
            .map(|s| format!("gpu-0-mig-1g10gb-{s}"))
            .collect::<BTreeSet<_>>()
            .iter()
            .map(String::as_str)
            .collect(),
        "{inv:?}"
    );
    let (device, attrs) = published(&node, "gpu-0-mig-1g10gb-3").await;
    let uuid = attrs["gpu.nvidia.com/uuid"].clone();
    assert!(uuid.starts_with("MIG-"), "{attrs:?}");
    assert_eq!(attrs["gpu.nvidia.com/parentIndex"], "0", "{attrs:?}");
    let gi = &attrs["gpu.nvidia.com/gpuInstanceId"];
    let ci = &attrs["gpu.nvidia.com/computeInstanceId"];
    let minor_of = |cap: String| {
        minors
            .iter()
            .find(|(k, _)| *k == cap)
            .unwrap_or_else(|| panic!("{cap} is not in mig-minors"))
            .1
    };
    let caps = [
        minor_of(format!("gpu0/gi{gi}/access")),
        minor_of(format!("gpu0/gi{gi}/ci{ci}/access")),
    ];

    let spec = prepare(&node, dir.path(), "uid-mig", &[device]).await;
    let (installed, out) = run_spec(
        &podman,
        &spec,
        format!("{}{NODES_SCRIPT}", user_script(&[0])),
    );
    // The parent GPU's node (minor 0 on this machine), the driver, and the MIG UUID alone.
    assert_user_view(&out, &[0], std::slice::from_ref(&uuid), &cuda_sha);
    assert_eq!(
        out.value("visible"),
        Some(uuid.as_str()),
        "{}",
        out.report()
    );
    // Exactly the capability nodes of the device's GPU instance and compute instance.
    assert_nodes(&out, &[0], Some(&caps));
    drop(installed);
    unprepare(&node, "uid-mig").await;
    node.stop().await;
}

#[tokio::test]
#[ignore = "needs root, podman and runc: run by cargo xtask ci"]
async fn a_mig_placement_created_on_prepare_gives_the_container_its_gpu_and_mig_uuid() {
    let Fixture {
        podman,
        root,
        cuda_sha,
        dir,
        lib,
    } = Fixture::new();
    let backends = format!(
        "{}    migStrategy: partitionable\n",
        nvidia_backend(&lib, &root)
    );
    let node = dra_node(dir.path(), &backends).await;
    let inv = node.slices.wait_last(WAIT).await;
    let chosen = common::schedule_mig(&inv, DRIVER, "1g.5gb", 1, &[]);
    assert_eq!(chosen.len(), 1, "{chosen:?}");
    let (_, attrs) = published(&node, chosen[0].device.as_str()).await;
    // The GPU indices of the `dgx-a100` machine are its minor numbers.
    let minor: u32 = attrs["gpu.nvidia.com/parentIndex"].parse().unwrap();
    let parent = attrs["gpu.nvidia.com/parentUUID"].clone();
    assert!(
        !attrs.contains_key("gpu.nvidia.com/uuid"),
        "a placement has no UUID before prepare: {attrs:?}"
    );

    let spec = prepare(&node, dir.path(), "uid-place", &chosen).await;
    // The MIG device prepare created, named in the spec.
    let uuids: BTreeSet<&str> = spec
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .filter(|t| t.starts_with("MIG-"))
        .collect();
    assert_eq!(uuids.len(), 1, "{spec}");
    let uuid = uuids.into_iter().next().unwrap().to_string();
    assert_ne!(
        uuid.trim_start_matches("MIG-"),
        parent.trim_start_matches("GPU-")
    );
    // kubedev reads the MIG capability minors from `/proc/driver/nvidia-caps/mig-minors`
    // through the host root; on this CI machine (hostRoot `/`, no NVIDIA driver) the file does
    // not exist, so the spec names no capability node and the container gets none. The static
    // test covers them with a host root of its own.
    assert!(!spec.contains("nvidia-caps"), "{spec}");
    let (installed, out) = run_spec(
        &podman,
        &spec,
        format!("{}{NODES_SCRIPT}", user_script(&[minor])),
    );
    assert_user_view(&out, &[minor], std::slice::from_ref(&uuid), &cuda_sha);
    assert_eq!(
        out.value("visible"),
        Some(uuid.as_str()),
        "{}",
        out.report()
    );
    assert_nodes(&out, &[minor], None);
    drop(installed);
    unprepare(&node, "uid-place").await;
    node.stop().await;
}

#[tokio::test]
#[ignore = "needs root, podman and runc: run by cargo xtask ci"]
async fn both_time_sliced_replicas_of_a_gpu_in_one_claim_give_the_container_that_gpu() {
    let Fixture {
        podman,
        root,
        cuda_sha,
        dir,
        lib,
    } = Fixture::new();
    let backends = format!("{}    replicas: 2\n", nvidia_backend(&lib, &root));
    let node = dra_node(dir.path(), &backends).await;
    let replicas = gpus(&node, &["gpu-0-replica-0", "gpu-0-replica-1"]).await;
    let uuid = replicas[0].1.clone();
    assert_eq!(replicas[1].1, uuid, "replicas of one GPU");
    let (_, attrs) = published(&node, "gpu-0-replica-1").await;
    assert_eq!(attrs["gpu.nvidia.com/replica"], "1", "{attrs:?}");
    assert_eq!(attrs["gpu.nvidia.com/minor"], "0", "{attrs:?}");

    let devices: Vec<DeviceRef> = replicas.iter().map(|(d, _)| d.clone()).collect();
    let spec = prepare(&node, dir.path(), "uid-replicas", &devices).await;
    // Two CDI devices with the same device nodes, /dev/nvidia0 among them.
    let parsed: Value = serde_json::from_str(&spec).unwrap();
    let names: Vec<&str> = parsed["devices"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|d| d["name"].as_str())
        .collect();
    assert_eq!(names.len(), 2, "{spec}");
    let nodes: Vec<BTreeSet<String>> = names
        .iter()
        .map(|n| edits_of(&parsed, n)[1].clone())
        .collect();
    assert_eq!(nodes[0], nodes[1], "{spec}");
    assert!(
        nodes[0].iter().any(|n| n.contains("\"/dev/nvidia0\"")),
        "{spec}"
    );
    let (installed, out) = run_spec(
        &podman,
        &spec,
        format!("{}{NODES_SCRIPT}", user_script(&[0])),
    );
    assert_user_view(&out, &[0], std::slice::from_ref(&uuid), &cuda_sha);
    assert_eq!(
        out.value("visible"),
        Some(uuid.as_str()),
        "{}",
        out.report()
    );
    assert_nodes(&out, &[0], None);
    drop(installed);
    unprepare(&node, "uid-replicas").await;
    node.stop().await;
}

#[tokio::test]
#[ignore = "needs root, podman and runc: run by cargo xtask ci"]
async fn an_mps_claim_gives_the_container_its_mps_pipe_directory() {
    let Fixture {
        podman,
        root,
        cuda_sha,
        dir,
        lib,
    } = Fixture::new();
    let smi = nvml_mock::tools::smi_wrapper(
        &dir.path().join("nvidia-smi"),
        &dir.path().join("gpu-settings.json"),
        &nvml_mock::machine_path("dgx-a100"),
    )
    .expect("run `cargo build -p kubedev-nvml-mock` first");
    let mps = nvml_mock::tools::tool_path("mock-nvidia-cuda-mps-control").unwrap();
    let backends = format!(
        "{}    nvidiaSmiPath: {}\n    mpsControlPath: {}\n",
        nvidia_backend(&lib, &root),
        smi.display(),
        mps.display()
    );
    let node = dra_node(dir.path(), &backends).await;
    let gpu0 = gpus(&node, &["gpu-0"]).await;
    let config = kubedev_core::DeviceConfig::new(
        kubedev_core::ConfigSource::Claim,
        0,
        json!({"apiVersion": "gpu.kubedev.io/v1alpha1", "kind": "GpuConfig",
               "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 40}}}),
    );
    node.claims.allocate_devices(
        "uid-mps",
        vec![
            kubedev_core::AllocatedDevice::new(gpu0[0].0.clone())
                .with_request("req")
                .with_config(vec![config]),
        ],
    );
    let spec = prepare_allocated(&node, dir.path(), "uid-mps", 1).await;
    // What kubedev's MPS control daemon made in the claim's pipe directory.
    let pipe = dir.path().join("state/nvidia/mps/uid-mps/pipe");
    let pid = std::fs::read_to_string(pipe.join("nvidia-cuda-mps-control.pid")).unwrap();
    let mut files: Vec<String> = std::fs::read_dir(&pipe)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert!(files.contains(&"control".to_string()), "{files:?}");

    let installed = podman.install_spec(&spec).unwrap();
    let script = format!(
        "{}{NODES_SCRIPT}\
         echo mpsenv=$CUDA_MPS_PIPE_DIRECTORY\n\
         echo mpsfiles=$(ls /tmp/nvidia-mps | sort | tr '\\n' ' ')\n\
         echo mpspid=$(cat /tmp/nvidia-mps/nvidia-cuda-mps-control.pid)\n\
         echo mpscontrol=$(stat -c %F /tmp/nvidia-mps/control)\n",
        user_script(&[0])
    );
    let out = podman
        .run(
            Container::new(script)
                .devices(installed.device_ids())
                .check(&spec, &installed.device_names()),
        )
        .unwrap();
    out.assert_ok();
    let report = out.report();
    assert_user_view(&out, &[0], std::slice::from_ref(&gpu0[0].1), &cuda_sha);
    assert_nodes(&out, &[0], None);
    assert_eq!(out.value("mpsenv"), Some("/tmp/nvidia-mps"), "{report}");
    assert_eq!(
        out.value("mpsfiles").map(str::trim),
        Some(files.join(" ").as_str()),
        "{report}"
    );
    assert_eq!(out.value("mpspid"), Some(pid.trim()), "{report}");
    assert_eq!(out.value("mpscontrol"), Some("socket"), "{report}");
    drop(installed);
    unprepare(&node, "uid-mps").await;
    assert!(!pipe.exists(), "unprepare removes the pipe directory");
    node.stop().await;
}

#[tokio::test]
#[ignore = "needs root, podman and runc: run by cargo xtask ci"]
async fn with_a_cdi_hook_the_runtime_runs_it_to_link_and_cache_the_libraries() {
    let Fixture {
        podman,
        root,
        dir,
        lib,
        ..
    } = Fixture::new();
    // A stand-in for NVIDIA's hook: it records its arguments and the container state the
    // runtime hands it on standard input, one file per run.
    let log = dir.path().join("hook-log");
    std::fs::create_dir_all(&log).unwrap();
    let hook = dir.path().join("nvidia-cdi-hook");
    std::fs::write(
        &hook,
        format!(
            "#!/bin/sh\nf={}/$$\necho \"$@\" > \"$f.args\"\ncat > \"$f.state\"\n",
            log.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&hook, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let backends = format!(
        "{}    cdiHookPath: {}\n",
        nvidia_backend(&lib, &root),
        hook.display()
    );
    let node = dra_node(dir.path(), &backends).await;
    let one = gpus(&node, &["gpu-0"]).await;
    let spec = prepare(&node, dir.path(), "uid-hook", &[one[0].0.clone()]).await;
    let parsed: Value = serde_json::from_str(&spec).unwrap();
    assert_eq!(
        parsed["containerEdits"]["hooks"].as_array().map(Vec::len),
        None,
        "one device: its hooks stay on it"
    );
    // The libraries are mounted under their own names only; the hook makes the other names.
    let mounted: Vec<&str> = parsed["devices"][0]["containerEdits"]["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["containerPath"].as_str())
        .collect();
    assert!(
        mounted.contains(&format!("/{LIB_DIR}/libcuda.so.{VERSION}").as_str())
            && !mounted.iter().any(|m| m.ends_with("/libcuda.so.1")),
        "{mounted:?}"
    );
    let (installed, out) = run_spec(
        &podman,
        &spec,
        format!("ls /{LIB_DIR} | tr '\\n' ' ' | sed 's/^/libs=/'; echo"),
    );
    assert!(
        out.value("libs")
            .is_some_and(|l| l.contains(&format!("libcuda.so.{VERSION}"))),
        "{}",
        out.report()
    );
    drop(installed);
    let mut runs: Vec<String> = std::fs::read_dir(&log)
        .unwrap()
        .filter_map(|e| {
            let p = e.unwrap().path();
            (p.extension()? == "args").then(|| std::fs::read_to_string(&p).unwrap())
        })
        .collect();
    runs.sort();
    let dir_in_container = format!("/{LIB_DIR}");
    assert_eq!(runs.len(), 2, "both hooks ran once: {runs:?}");
    assert!(
        runs.iter().any(|r| r.starts_with("create-symlinks")
            && r.contains(&format!(
                "--link libcuda.so.{VERSION}::{dir_in_container}/libcuda.so.1"
            ))),
        "{runs:?}"
    );
    assert!(
        runs.iter()
            .any(|r| r.trim() == format!("update-ldcache --folder {dir_in_container}")),
        "{runs:?}"
    );
    // Each ran with the container's state, as a createContainer hook does.
    for entry in std::fs::read_dir(&log).unwrap() {
        let p = entry.unwrap().path();
        if p.extension().is_some_and(|e| e == "state") {
            let state: Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
            assert!(state["bundle"].is_string(), "{state}");
            assert!(state["pid"].as_u64().is_some_and(|p| p > 0), "{state}");
        }
    }
    unprepare(&node, "uid-hook").await;
    node.stop().await;
}
