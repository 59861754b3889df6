//! `cargo xtask interop`: kubedev's kubelet-facing servers against gRPC stacks kubedev did not
//! write — Python's grpcio (from the Python package index) and grpc-go with the kubelet's own
//! generated stubs (Go module `k8s.io/kubelet`, built with the machine's Go from the Go module
//! proxy) — each acting as the kubelet does: registration, DRA prepare/unprepare on v1 and
//! v1beta1, the health stream, and the device-plugin API with kubedev registering at the
//! client's `kubelet.sock`.
//!
//! The servers run in `interop_target` (an example of `kubedev-kubelet-grpc`), under a
//! directory as long as `/var/lib/kubelet`, for the longest driver name (63 characters) with a
//! pod UID set. Each client run gets a fresh target; afterwards the target's summary must show
//! what the client did, and its log the `:authority` the client sent, which this command
//! prints as a table.

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context as _, bail, ensure};
use serde_json::Value;

/// grpcio and its code generator, pinned together.
const GRPCIO: &str = "1.85.1";

/// The longest driver name the API allows (63 characters).
fn driver() -> String {
    format!("{}.example.com", "a".repeat(51))
}

const RESOURCE: &str = "example.com/gpu";
const POD_UID: &str = "0b4c6a8e-8c4f-4d7e-9d1e-3f6b2a1c9e77";

/// One client run: which stack, how it dials, and what `:authority` it must be seen sending on
/// the registration socket (`path` stands for the socket path).
struct Client {
    name: &'static str,
    command: Vec<String>,
    registration_authority: fn(&str) -> String,
}

pub(crate) fn interop(root: &Path) -> anyhow::Result<()> {
    ensure_go()?;
    crate::commands::build_debug_binaries(root)?;
    let target = crate::commands::target_dir(root).join("debug/examples/interop_target");
    let python = python_env(root)?;
    let stubs = tempfile::tempdir()?;
    generate_python_stubs(root, &python, stubs.path())?;
    let script = root.join("crates/kubelet-grpc/interop/python/kubelet_client.py");
    let go_script = root.join("crates/kubelet-grpc/interop/go/run.sh");

    let python_client = |authority: &'static str| {
        vec![
            python.display().to_string(),
            script.display().to_string(),
            "--stubs".into(),
            stubs.path().display().to_string(),
            "--authority".into(),
            authority.into(),
            "--target".into(),
        ]
    };
    let clients = [
        Client {
            name: "grpcio, default unix: channel",
            command: python_client("default"),
            // grpcio percent-encodes the path without its leading '/'.
            registration_authority: |p| escape(p.trim_start_matches('/')),
        },
        Client {
            name: "grpcio, the path as authority",
            command: python_client("raw"),
            registration_authority: |p| p.to_string(),
        },
        Client {
            name: "grpc-go with k8s.io/kubelet's stubs, as the kubelet dials",
            command: vec!["bash".into(), go_script.display().to_string()],
            // The plugin watcher dials the path itself (passthrough resolver); grpc-go 1.82
            // (k8s.io/kubelet v0.37.2's) sends it percent-encoded, leading '/' included (1.33
            // sent it as it is). Its `unix:` targets send `localhost`.
            registration_authority: escape,
        },
    ];
    let mut table = Vec::new();
    for client in &clients {
        eprintln!("\n==> interop: {}", client.name);
        let seen =
            run_client(&target, client).with_context(|| format!("interop with {}", client.name))?;
        table.push((client.name, seen));
    }
    eprintln!("\n:authority each client sent, by socket (as kubedev's layer logged it):");
    let width = table.iter().map(|(name, _)| name.len()).max().unwrap_or(0);
    for (name, seen) in &table {
        for (socket, authorities) in seen {
            eprintln!("  {name:<width$} {socket:<14} {}", authorities.join(" | "));
        }
    }
    Ok(())
}

/// The grpc-go client builds with whatever `go` is on PATH (its `run.sh` checks the version,
/// Go 1.26 or newer, and `go build` fetches the modules its `go.sum` pins from the Go module
/// proxy). Debian's `golang-go` is not installed: it is older, and would sit beside that Go.
fn ensure_go() -> anyhow::Result<()> {
    let found = Command::new("go")
        .args(["env", "GOVERSION"])
        .output()
        .is_ok_and(|o| o.status.success());
    ensure!(
        found,
        "no `go` on PATH: the grpc-go interop client needs Go 1.26 or newer (from go.dev/dl, \
         e.g. /usr/local/go/bin on PATH); `go build` then fetches k8s.io/kubelet and grpc-go \
         from the Go module proxy"
    );
    Ok(())
}

/// Percent-encodes as a URI authority (RFC 3986 §3.2), the way gRPC clients do.
fn escape(raw: &str) -> String {
    let mut out = String::new();
    for b in raw.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:[]@".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A directory exactly as long as `/var/lib/kubelet`, so socket paths are as long as on a node.
fn kubelet_length_dir() -> anyhow::Result<PathBuf> {
    const LEN: usize = "/var/lib/kubelet".len();
    for _ in 0..100 {
        let name = format!("/tmp/kdvi-{:06x}", fastrand::u32(..0x100_0000));
        let dir = PathBuf::from(&name);
        debug_assert_eq!(name.len(), LEN);
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e).with_context(|| format!("creating {name}")),
        }
    }
    bail!("could not create a fresh /tmp/kdvi-* directory")
}

/// Runs one client against a fresh target; returns the authorities seen per socket.
fn run_client(target: &Path, client: &Client) -> anyhow::Result<Vec<(String, Vec<String>)>> {
    let dir = kubelet_length_dir()?;
    let result = run_client_in(target, client, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn run_client_in(
    target: &Path,
    client: &Client,
    dir: &Path,
) -> anyhow::Result<Vec<(String, Vec<String>)>> {
    let log_path = dir.join("target.log");
    let log = std::fs::File::create(&log_path)?;
    let mut child = Command::new(target)
        .args(["--dir", &dir.display().to_string()])
        .args(["--driver", &driver(), "--resource", RESOURCE])
        .args(["--pod-uid", POD_UID])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {}", target.display()))?;
    let stdout = child.stdout.take().context("target stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let info_line = lines.next().context("the target printed nothing")??;
    let info: Value = serde_json::from_str(&info_line).context("the target's first line")?;
    let info_path = dir.join("target.json");
    std::fs::write(&info_path, &info_line)?;

    let mut command = client.command.clone();
    command.push(info_path.display().to_string());
    let output = Command::new(&command[0])
        .args(&command[1..])
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", command.join(" ")))?;
    let printed = String::from_utf8_lossy(&output.stdout).into_owned();
    eprint!("{printed}");

    // Closing stdin stops the target, which prints its summary.
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.flush();
    }
    let summary_line = lines.next().context("the target printed no summary")??;
    let status = child.wait()?;
    ensure!(status.success(), "the target exited with {status}");
    ensure!(
        output.status.success(),
        "the client failed ({}); the target's log is in {}",
        output.status,
        log_path.display()
    );
    let summary: Value = serde_json::from_str(&summary_line).context("the target's summary")?;
    check_summary(&summary, &printed)?;
    let seen = authorities(&std::fs::read_to_string(&log_path)?, &info);
    let registration = info["registration_socket"].as_str().unwrap_or_default();
    let expected = (client.registration_authority)(registration);
    let on_registration = seen
        .iter()
        .find(|(s, _)| s == "registration")
        .map(|(_, a)| a.clone())
        .unwrap_or_default();
    ensure!(
        on_registration.contains(&expected),
        "expected the client to send :authority {expected:?} on the registration socket; \
         kubedev saw {on_registration:?}"
    );
    Ok(seen)
}

/// The target's summary agrees with what the client says it did.
fn check_summary(summary: &Value, printed: &str) -> anyhow::Result<()> {
    let count = |key: &str| summary[key].as_u64().unwrap_or(0);
    ensure!(
        count("dra_registrations") >= 1,
        "kubedev never saw NotifyRegistrationStatus: {summary}"
    );
    ensure!(
        summary["dra_last_error"].is_null(),
        "the registration was refused: {summary}"
    );
    ensure!(
        count("device_plugin_registrations") >= 1,
        "kubedev never registered its device plugin: {summary}"
    );
    ensure!(
        count("allocations") >= 1,
        "no Allocate reached kubedev: {summary}"
    );
    ensure!(
        count("pre_starts") >= 1,
        "no PreStartContainer reached kubedev: {summary}"
    );
    ensure!(
        count("preferred") >= 1,
        "no GetPreferredAllocation reached kubedev: {summary}"
    );
    // The claim UIDs the client prepared and unprepared, from its last line.
    let claims: Vec<String> = printed
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str::<Value>(l).ok())
        .and_then(|v| v["prepared"].as_array().cloned())
        .unwrap_or_default()
        .into_iter()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect();
    ensure!(
        claims.len() >= 2,
        "the client reported no prepared claims for v1 and v1beta1"
    );
    let unprepared = summary["unprepared"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for uid in &claims {
        ensure!(
            summary["prepared"].get(uid).is_some(),
            "claim {uid} did not reach kubedev's prepare: {summary}"
        );
        ensure!(
            unprepared.iter().any(|u| u == uid.as_str()),
            "claim {uid} did not reach kubedev's unprepare: {summary}"
        );
    }
    Ok(())
}

/// The `:authority` values kubedev logged per socket kind, from the target's JSON log.
fn authorities(log: &str, info: &Value) -> Vec<(String, Vec<String>)> {
    let kinds = [
        ("registration", info["registration_socket"].as_str()),
        ("dra", info["dra_socket"].as_str()),
        ("device-plugin", info["device_plugin_socket"].as_str()),
    ];
    let mut seen: Vec<(String, Vec<String>)> = kinds
        .iter()
        .map(|(k, _)| (k.to_string(), Vec::new()))
        .collect();
    for line in log.lines() {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if v["fields"]["message"] != "client :authority" {
            continue;
        }
        let socket = v["fields"]["socket"].as_str().unwrap_or_default();
        let authority = v["fields"]["authority"].as_str().unwrap_or_default();
        let shown = if authority.is_empty() {
            "(empty)".to_string()
        } else {
            authority.to_string()
        };
        if let Some(i) = kinds.iter().position(|(_, s)| *s == Some(socket))
            && !seen[i].1.contains(&shown)
        {
            seen[i].1.push(shown);
        }
    }
    seen
}

/// A virtual environment under the target directory with grpcio and grpcio-tools; created on
/// first use. Returns its Python.
fn python_env(root: &Path) -> anyhow::Result<PathBuf> {
    let dir = crate::commands::target_dir(root)
        .join("tools")
        .join(format!("interop-python-{GRPCIO}"));
    let python = dir.join("bin/python");
    let ready = dir.join(".installed");
    if ready.exists() {
        return Ok(python);
    }
    let _ = std::fs::remove_dir_all(&dir);
    let system = which_python()?;
    crate::commands::run(root, &system, &["-m", "venv", &dir.display().to_string()])
        .context("creating a Python virtual environment (needs python3 with venv)")?;
    crate::commands::run(
        root,
        &python.display().to_string(),
        &[
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            &format!("grpcio=={GRPCIO}"),
            &format!("grpcio-tools=={GRPCIO}"),
        ],
    )
    .context("installing grpcio from the Python package index")?;
    std::fs::write(&ready, "")?;
    Ok(python)
}

fn which_python() -> anyhow::Result<String> {
    for candidate in ["python3", "python"] {
        if Command::new(candidate)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
        {
            return Ok(candidate.to_string());
        }
    }
    bail!("no python3 found; the interop tests need Python 3 with venv")
}

/// Python modules for kubedev's own `.proto` files, generated with grpcio-tools.
fn generate_python_stubs(root: &Path, python: &Path, out: &Path) -> anyhow::Result<()> {
    let proto = root.join("crates/kubelet-grpc/proto");
    let mut files = Vec::new();
    for api in std::fs::read_dir(&proto)? {
        let api = api?.path();
        for version in std::fs::read_dir(&api)? {
            let file = version?.path().join("api.proto");
            if file.is_file() {
                files.push(file.strip_prefix(&proto)?.display().to_string());
            }
        }
    }
    files.sort();
    let status = Command::new(python)
        .args(["-m", "grpc_tools.protoc", "-I", "."])
        .arg(format!("--python_out={}", out.display()))
        .arg(format!("--grpc_python_out={}", out.display()))
        .args(&files)
        .current_dir(&proto)
        .status()
        .context("running grpc_tools.protoc")?;
    ensure!(status.success(), "grpc_tools.protoc failed on {files:?}");
    Ok(())
}
