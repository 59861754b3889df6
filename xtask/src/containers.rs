//! `cargo xtask containers`: the CDI specs kubedev writes, applied by a real container runtime
//! (Debian's podman with runc and a busybox root filesystem, `kubedev_testkit::podman`), with
//! what each container sees asserted from inside it. Installs podman, runc and busybox-static
//! from Debian's packages when missing (as root), fails loudly when podman cannot run a
//! container here, then runs the ignored container tests.

use std::path::Path;
use std::time::Instant;

use anyhow::Context as _;
use kubedev_testkit::podman::{DEBIAN_PACKAGES, Podman};

/// Parallel tests: each runs a daemon and a few containers of about 0.3 s each.
const TEST_THREADS: &str = "--test-threads=2";

pub(crate) fn containers(root: &Path) -> anyhow::Result<()> {
    crate::commands::ensure_debian_packages(
        "the container tests (CDI specs applied by podman)",
        DEBIAN_PACKAGES,
    )?;
    let started = Instant::now();
    let podman = Podman::new().context("the podman harness")?;
    podman
        .smoke_test()
        .context("podman cannot run a container on this machine")?;
    eprintln!(
        "podman {} runs containers ({:.1?} for a first one)",
        podman.tools().podman_version,
        started.elapsed()
    );
    drop(podman);
    // The NVIDIA container tests load the NVML stand-in.
    crate::commands::run(
        root,
        "cargo",
        &["build", "--quiet", "-p", "kubedev-nvml-mock"],
    )?;
    let started = Instant::now();
    // `--workspace`: the features of the workspace-wide test build, so nothing is rebuilt.
    crate::commands::run(
        root,
        "cargo",
        &[
            "test",
            "--workspace",
            "--test",
            "podman",
            "--no-fail-fast",
            "--",
            "--ignored",
            TEST_THREADS,
        ],
    )?;
    // kubedev's tests are one binary, `all` (as are some other crates', whose tests match
    // none of these filters): its `containers` and `nvidia_containers` modules, and, also as
    // root, `operator_messages` (a prepare with the CDI directory on a full file system).
    crate::commands::run(
        root,
        "cargo",
        &[
            "test",
            "--workspace",
            "--test",
            "all",
            "--no-fail-fast",
            "--",
            "--ignored",
            TEST_THREADS,
            "containers::",
            "operator_messages::",
        ],
    )?;
    eprintln!("container tests passed in {:.0?}", started.elapsed());
    Ok(())
}
