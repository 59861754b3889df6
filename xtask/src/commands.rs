//! Commands run on this machine for every task: cargo's target directory, the debug daemon,
//! a command echoed and checked, and the Debian packages a task needs.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};

/// Cargo's target directory for the workspace at `root` (`CARGO_TARGET_DIR` when set).
pub(crate) fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"))
}

/// Builds the debug daemon (`target/debug/kubedev`) and the interoperability tests' server
/// (`target/debug/examples/interop_target`) with the dependency features the workspace's tests
/// are built with.
pub(crate) fn build_debug_binaries(root: &Path) -> anyhow::Result<()> {
    // `--workspace`, and an example among the targets: cargo then turns on the features every
    // member and every dev-dependency asks for (tokio's `test-util`, axum's `query`), as `cargo
    // test --workspace` does, and links the dependencies the tests compiled. Built with `-p
    // kubedev` alone, tokio, hyper, kube, wasmtime and kubedev's own crates are compiled a
    // second time with fewer features (about 2 minutes on a fresh 2-core machine).
    run(
        root,
        "cargo",
        &[
            "build",
            "--quiet",
            "--workspace",
            "--bin",
            "kubedev",
            "--example",
            "interop_target",
        ],
    )
}

/// Builds the debug daemon and the NVML stand-in it loads in scenarios; returns the daemon.
pub(crate) fn build_daemon(root: &Path) -> anyhow::Result<PathBuf> {
    build_debug_binaries(root)?;
    run(
        root,
        "cargo",
        &["build", "--quiet", "-p", "kubedev-nvml-mock"],
    )?;
    let bin = target_dir(root).join("debug").join("kubedev");
    anyhow::ensure!(bin.exists(), "built daemon not found at {}", bin.display());
    Ok(bin)
}

/// Runs one command in `root`, echoing it; fails when it fails.
pub(crate) fn run(root: &Path, program: &str, args: &[&str]) -> anyhow::Result<()> {
    run_with_env(root, program, args, &[])
}

/// Like [`run`], with environment variables set for the command.
pub(crate) fn run_with_env(
    root: &Path,
    program: &str,
    args: &[&str],
    env: &[(&str, &std::ffi::OsStr)],
) -> anyhow::Result<()> {
    let shown: Vec<String> = env
        .iter()
        .map(|(k, v)| format!("{k}={} ", v.to_string_lossy()))
        .collect();
    eprintln!("$ {}{program} {}", shown.concat(), args.join(" "));
    let status = Command::new(program)
        .args(args)
        .envs(env.iter().copied())
        .current_dir(root)
        .status()
        .with_context(|| format!("starting {program}"))?;
    if !status.success() {
        bail!(
            "`{program} {}` failed ({status}){}",
            args.join(" "),
            disk_note(&target_dir(root))
        );
    }
    Ok(())
}

/// Below this much free space a failed build is most likely the disk, not the code.
const LOW_DISK_BYTES: u64 = 4 << 30;

/// Free space on the file system holding `dir` (or its nearest existing parent), in bytes.
pub(crate) fn free_bytes(dir: &Path) -> Option<u64> {
    let existing = dir.ancestors().find(|d| d.exists())?;
    let stat = rustix::fs::statvfs(existing).ok()?;
    Some(stat.f_bavail.saturating_mul(stat.f_frsize))
}

/// A sentence to add to a failure when the target directory's disk is nearly full.
fn disk_note(target: &Path) -> String {
    match free_bytes(target) {
        Some(free) if free < LOW_DISK_BYTES => format!(
            "; only {} MiB are free on the disk of {}: a linker or compiler that fails \
             here has most likely run out of space",
            free >> 20,
            target.display()
        ),
        _ => String::new(),
    }
}

/// Installs the Debian packages that are missing, when this process may (root with apt-get);
/// otherwise fails naming them and `purpose` (what needs them).
pub(crate) fn ensure_debian_packages(purpose: &str, packages: &[&str]) -> anyhow::Result<()> {
    let missing: Vec<&str> = packages
        .iter()
        .copied()
        .filter(|p| {
            !Command::new("dpkg-query")
                .args(["-W", "-f=${Status}", p])
                .output()
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        })
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let root_user = rustix::process::geteuid().is_root();
    let apt = Command::new("apt-get").arg("--version").output().is_ok();
    if !(root_user && apt) {
        bail!(
            "{purpose} needs these Debian packages: {} (install them with \
             `apt-get install -y --no-install-recommends {}` as root)",
            missing.join(" "),
            missing.join(" ")
        );
    }
    eprintln!("$ apt-get install {}", missing.join(" "));
    let quiet = |cmd: &mut Command| -> anyhow::Result<()> {
        let out = cmd
            .env("DEBIAN_FRONTEND", "noninteractive")
            .output()
            .context("running apt-get")?;
        anyhow::ensure!(
            out.status.success(),
            "apt-get failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    };
    quiet(Command::new("apt-get").args(["update", "-q"]))?;
    quiet(
        Command::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(&missing),
    )
}

/// GETs `path` from `address` (`host:port`) over HTTP/1.0 and returns the body; fails when no
/// answer comes within `timeout` or the status is not 200.
pub(crate) fn http_get(
    address: &str,
    path: &str,
    timeout: std::time::Duration,
) -> anyhow::Result<String> {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(address)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n")?;
    let mut response = Vec::new();
    stream
        .read_to_end(&mut response)
        .with_context(|| format!("GET {path}: no whole answer within {timeout:?}"))?;
    let response = String::from_utf8(response).context("the answer is not UTF-8")?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .with_context(|| format!("GET {path}: the answer is not HTTP"))?;
    let status = head.lines().next().unwrap_or_default();
    if status.split_whitespace().nth(1) != Some("200") {
        bail!("GET {path}: answered {status:?}");
    }
    Ok(body.to_string())
}

/// The workspace root: the parent of this crate's directory.
pub(crate) fn workspace_root() -> anyhow::Result<PathBuf> {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir
        .parent()
        .map(Path::to_path_buf)
        .with_context(|| format!("xtask directory {} has no parent", manifest_dir.display()))
}

/// Runs `cmd`, which `what` names in errors; its standard output, or an error with what it
/// printed on standard error.
pub(crate) fn stdout_of(cmd: &mut Command, what: &str) -> anyhow::Result<String> {
    let out = cmd.output().with_context(|| format!("running {what}"))?;
    if !out.status.success() {
        bail!(
            "{what} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// What the example `name` of `package` (release build) prints with `args`.
pub(crate) fn run_example(
    root: &Path,
    package: &str,
    name: &str,
    args: &[&str],
) -> anyhow::Result<String> {
    stdout_of(
        Command::new("cargo")
            .current_dir(root)
            .args(["run", "--release", "-q", "-p", package])
            .args(["--example", name, "--"])
            .args(args),
        &format!("the {name} example"),
    )
}
