//! `cargo xtask ci`: everything CI checks, in the order that fails fastest.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::Context as _;

use crate::commands::{ensure_debian_packages, free_bytes, run, run_with_env, target_dir};

/// A project with its own workspace inside this repository: `cargo fmt --check`, then
/// `cargo <command> --locked` (the command's own arguments after a `--` stay last), built into
/// `target`.
fn own_workspace(
    root: &Path,
    manifest: &str,
    command: &[&str],
    target: &Path,
) -> anyhow::Result<()> {
    run(
        root,
        "cargo",
        &["fmt", "--manifest-path", manifest, "--check"],
    )?;
    let (cmd, rest) = command.split_first().context("a cargo command")?;
    let mut args = vec![*cmd, "--locked", "--manifest-path", manifest];
    args.extend_from_slice(rest);
    run_with_env(
        root,
        "cargo",
        &args,
        &[("CARGO_TARGET_DIR", target.as_os_str())],
    )
}

fn has_nextest(root: &Path) -> bool {
    Command::new("cargo")
        .args(["nextest", "--version"])
        .current_dir(root)
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Prints each step's heading: its name, the time since CI started and the free space on the
/// target directory's disk.
struct Steps {
    started: Instant,
    target: PathBuf,
}

impl Steps {
    fn new(root: &Path) -> Steps {
        Steps {
            started: Instant::now(),
            target: target_dir(root),
        }
    }

    /// Announces the step `name`.
    fn step(&self, name: &str) {
        let free = free_bytes(&self.target).map_or_else(String::new, |b| {
            format!(", {:.1} GiB free", b as f64 / f64::from(1u32 << 30))
        });
        eprintln!("\n==> {name} ({:.0?} so far{free})", self.started.elapsed());
    }
}

/// fmt check, codegen check, clippy with warnings denied, then every test.
pub(crate) fn ci(root: &Path) -> anyhow::Result<()> {
    let steps = Steps::new(root);
    static_checks(root, &steps)?;
    reduced_feature_builds(root, &steps)?;
    tests(root, &steps)?;
    system_tests(root, &steps)?;
    own_workspaces(root, &steps)?;
    deployment_and_fuzzing(root, &steps)?;
    eprintln!("\nci passed in {:.0?}", steps.started.elapsed());
    Ok(())
}

/// rustfmt, the generated gRPC code, the selection policies, packaging and clippy.
fn static_checks(root: &Path, steps: &Steps) -> anyhow::Result<()> {
    steps.step("rustfmt");
    run(root, "cargo", &["fmt", "--all", "--check"])?;

    steps.step("generated gRPC code is up to date");
    crate::codegen::run(root, true)?;

    steps.step("selection policies (plugins/, wasm32)");
    crate::plugins::build_plugins(root)?;

    steps.step("every library crate packages (cargo package)");
    // `--no-verify`: verifying builds every crate and all of its dependencies (kube, tonic,
    // wasmtime) a second time, in a target directory of its own with the default profile, and
    // no library crate reads a file outside its package at build time. Verified by hand, the
    // first four crates (core, allocator, apiserver, host) built from their packages. What packaging checks is kept: manifests, metadata, file lists, and that
    // every dependency between kubedev's crates has a version (the nvml stand-in and xtask are
    // not published).
    run(
        root,
        "cargo",
        &[
            "package",
            "--workspace",
            "--exclude",
            "kubedev-nvml-mock",
            "--exclude",
            "xtask",
            "--no-verify",
            "--locked",
        ],
    )?;

    steps.step("clippy");
    run(
        root,
        "cargo",
        &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ],
    )
}

/// The daemon built with some backends left out, and its configuration test without them.
fn reduced_feature_builds(root: &Path, steps: &Steps) -> anyhow::Result<()> {
    steps.step("the daemon built with some backends left out (cargo features)");
    run(
        root,
        "cargo",
        &[
            "check",
            "-p",
            "kubedev",
            "--no-default-features",
            "--features",
            "vfio",
        ],
    )?;
    run(
        root,
        "cargo",
        &[
            "check",
            "-p",
            "kubedev",
            "--no-default-features",
            "--features",
            "usb,host",
        ],
    )?;
    // Configuration that names a backend left out of the build is an error naming the feature.
    run(
        root,
        "cargo",
        &[
            "test",
            "-p",
            "kubedev",
            "--no-default-features",
            "--lib",
            "config",
        ],
    )
}

/// The NVML stand-in, then every test of the workspace (nextest when installed, then the doc
/// tests; else cargo test).
fn tests(root: &Path, steps: &Steps) -> anyhow::Result<()> {
    steps.step("the NVML stand-in library the NVIDIA tests load");
    run(root, "cargo", &["build", "-p", "kubedev-nvml-mock"])?;

    // The kubectl plugin's tests run the plugin through the real kubectl.
    if Command::new("kubectl")
        .arg("version")
        .arg("--client")
        .output()
        .is_err()
    {
        ensure_debian_packages("the kubectl plugin tests", &["kubernetes-client"])?;
    }
    steps.step("tests");
    if has_nextest(root) {
        run(
            root,
            "cargo",
            &["nextest", "run", "--workspace", "--no-fail-fast"],
        )?;
        steps.step("doc tests");
        run(root, "cargo", &["test", "--workspace", "--doc"])
    } else {
        eprintln!("cargo-nextest not found; using cargo test");
        run(root, "cargo", &["test", "--workspace", "--no-fail-fast"])
    }
}

/// The daemon against real outside programs: a container runtime, other gRPC implementations,
/// and the end-to-end scenarios.
fn system_tests(root: &Path, steps: &Steps) -> anyhow::Result<()> {
    steps.step(
        "CDI specs applied by a real container runtime: podman and runc (cargo xtask containers)",
    );
    crate::containers::containers(root)?;

    steps.step("kubelet sockets against Python grpcio and kubelet grpc-go (cargo xtask interop)");
    crate::interop::interop(root)?;

    steps.step(&format!(
        "the allocator against upstream's {} on every conformance scenario and 2,000 random ones \
         (cargo xtask differential)",
        crate::differential::DEFAULT_RELEASE
    ));
    crate::differential::differential(root, &crate::differential::Args::ci())?;

    steps.step("end-to-end scenarios per backend and mode (cargo xtask e2e)");
    crate::e2e::e2e(root)?;

    steps.step(&format!(
        "a real one-node Kubernetes {} built from upstream's Go modules, kubedev installed by \
         its chart (cargo xtask cluster test)",
        crate::cluster::DEFAULT_KUBERNETES
    ));
    crate::cluster::test_default(root)?;

    steps.step(
        "the release daemon's memory, files and threads flat over 20,000 claims, 20,000 pods and \
         400 watch events (cargo xtask soak)",
    );
    crate::soak::soak(root, &crate::soak::Args::ci())
}

/// The projects with workspaces of their own: the out-of-tree driver and the GPU check's tools.
fn own_workspaces(root: &Path, steps: &Steps) -> anyhow::Result<()> {
    steps.step("the out-of-tree driver of docs/writing-a-backend.md (examples/vendor-driver)");
    // Its own workspace: checked and tested on its own, built into this workspace's target
    // directory so nothing is built twice. Its tests also hold the guide to its files.
    own_workspace(
        root,
        "examples/vendor-driver/Cargo.toml",
        &["test"],
        &target_dir(root),
    )?;

    steps.step("the GPU check's tools (tools/gpu-check, tools/cdi-chroot) build and are clean");
    // Its own workspace, run on GPU machines only; checked here so it never rots.
    own_workspace(
        root,
        "tools/cdi-chroot/Cargo.toml",
        &["clippy", "--", "-D", "warnings"],
        &target_dir(root).join("tools"),
    )?;
    run(
        root,
        "cc",
        &[
            "-fsyntax-only",
            "-Wall",
            "-Werror",
            "tools/gpu-check/cudacheck.c",
        ],
    )?;
    for script in ["tools/gpu-check/run.sh", "tools/gpu-check/prepare.sh"] {
        run(root, "bash", &["-n", script])?;
    }
    Ok(())
}

/// `cargo xtask deploy-check`, then every fuzz target briefly.
fn deployment_and_fuzzing(root: &Path, steps: &Steps) -> anyhow::Result<()> {
    steps.step(
        "deployment: the Helm chart renders, every object parses as its type; the image matches",
    );
    run(root, "cargo", &["xtask", "deploy-check"])?;

    steps.step("fuzz targets, briefly");
    crate::fuzz::fuzz(
        root,
        &crate::fuzz::Args {
            seconds: 15,
            runs: None,
            jobs: 2,
            only: Vec::new(),
        },
    )
}
