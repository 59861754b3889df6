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

use crate::common::{self, Claims, DraDaemon};
use kubedev_core::DeviceRef;
use kubedev_testkit::kubelet::ClaimId;
use kubedev_testkit::podman::{Container, Podman};
use serde_json::{Value, json};

mod hooks;
mod mig;
mod sharing;
mod whole_gpus;

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
