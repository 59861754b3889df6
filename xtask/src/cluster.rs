//! `cargo xtask cluster`: a real one-node Kubernetes on this machine, built from upstream's Go
//! modules, with kubedev installed by its Helm chart, and tests that assert what a user sees.
//!
//! - `build`: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kubectl,
//!   containerd (with its runc shim and ctr) and the CNI loopback, bridge and host-local plugins, from the modules in
//!   `tools/cluster/`, into a cache outside the clone (see the `build` module);
//! - `up`: certificates, then every component on 127.0.0.1 (the `node` module) but the API
//!   server, which listens on the host's address on the pods' bridge (`network`), the sandbox,
//!   busybox and kubedev images imported into containerd (`image`), kubedev installed with
//!   Helm; prints how to point `kubectl` at it;
//! - `test`: `up`, every test (the `tests` module), `down`, whatever happens;
//! - `down`: every process, container, mount, cgroup and directory of the cluster removed.

mod build;
mod gates;
mod host;
pub(crate) mod image;
mod network;
mod node;
mod pki;
mod tests;

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context as _;

pub(crate) use build::DEFAULT_KUBERNETES;

/// Options of `cargo xtask cluster`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(subcommand)]
    action: Action,
    /// The Kubernetes release to build and run (a module under tools/cluster/).
    #[arg(long, global = true, default_value = DEFAULT_KUBERNETES)]
    kubernetes: String,
}

/// What `cargo xtask cluster` does.
#[derive(Debug, clap::Subcommand)]
enum Action {
    /// Build the components (or find them in the cache) and print where they are.
    Build,
    /// Start the cluster and install kubedev; it keeps running until `down`.
    Up,
    /// Start the cluster, run every test against it, and tear it down.
    Test {
        /// Only the tests whose name contains this (or one of these, comma-separated).
        #[arg(long)]
        only: Option<String>,
    },
    /// Tear down a running cluster: processes, containers, mounts, cgroups, directories; the
    /// kernel settings and iptables chains the kubelet changed put back.
    Down,
    /// Compare the API server emulator's feature gates with the release's `kube_features.go`
    /// (`test` does this first).
    Gates,
}

pub(crate) fn cluster(root: &Path, args: &Args) -> anyhow::Result<()> {
    match &args.action {
        Action::Build => {
            let bins = build::build_all(root, &args.kubernetes)?;
            eprintln!("{bins:#?}");
            Ok(())
        }
        Action::Up => {
            let node = up(root, &args.kubernetes)?;
            eprintln!(
                "\nthe cluster runs (Kubernetes {}); try:\n  export KUBECONFIG={}\n  {} get nodes,resourceslices,pods -A\nand tear it down with `cargo xtask cluster down`",
                node.bins.version,
                node.kubeconfig().display(),
                node.bins.kube("kubectl").display()
            );
            Ok(())
        }
        Action::Test { only } => test(root, &args.kubernetes, only.as_deref()),
        Action::Down => node::down(),
        Action::Gates => gates::check(root, &args.kubernetes),
    }
}

/// `cargo xtask cluster test` at the default release, every test: CI's step.
pub(crate) fn test_default(root: &Path) -> anyhow::Result<()> {
    test(root, DEFAULT_KUBERNETES, None)
}

/// Where the components' logs go: `target/cluster-logs`, kept after `down`.
fn logs_dir(root: &Path) -> PathBuf {
    crate::commands::target_dir(root).join("cluster-logs")
}

/// What a cluster run needs from the network (Go modules, crates, Debian packages, Helm), got
/// before anything starts: from then on nothing may leave the machine (loopback and the pods'
/// bridge).
struct Built {
    bins: build::Binaries,
    images: Vec<PathBuf>,
    helm: PathBuf,
}

/// Builds the components and images and finds Helm.
fn build(root: &Path, version: &str) -> anyhow::Result<Built> {
    let started = Instant::now();
    crate::commands::ensure_debian_packages(
        "the real cluster (runc for containerd, ip for the pods' bridge)",
        &["runc", "iproute2"],
    )?;
    build::test_own_modules(root)?;
    let bins = build::build_all(root, version)?;
    let images = tests::build_images(root).context("building the images")?;
    let helm = crate::deploy::helm::binary(root)?;
    eprintln!("built in {:.0?}", started.elapsed());
    Ok(Built { bins, images, helm })
}

/// Starts the cluster from what `build` made and installs kubedev.
fn start(root: &Path, built: Built) -> anyhow::Result<node::Node> {
    let started = Instant::now();
    let node = node::up(built.bins, logs_dir(root), &built.images)?;
    eprintln!("node Ready after {:.0?}", started.elapsed());
    tests::install_kubedev(root, &node, &built.helm)?;
    eprintln!("kubedev installed after {:.0?}", started.elapsed());
    Ok(node)
}

/// Builds what is needed, starts the cluster and installs kubedev.
fn up(root: &Path, version: &str) -> anyhow::Result<node::Node> {
    start(root, build(root, version)?)
}

/// Builds, then starts the cluster, runs the tests and tears it down (always); the first
/// failure is the result, with the end of each component's log. Sockets are watched from
/// the start on: nothing but the builds may reach beyond loopback and the pods' bridge.
fn test(root: &Path, version: &str, only: Option<&str>) -> anyhow::Result<()> {
    let started = Instant::now();
    let built = build(root, version)?;
    gates::check(root, version)?;
    let before = tests::connections();
    let sampler = tests::Sampler::start();
    let result = start(root, built).and_then(|node| {
        let outcome = tests::run_all(root, &node, only, &before, sampler);
        if outcome.is_err() {
            eprintln!("{}", node.log_tails(40));
        }
        outcome
    });
    node::keep_pod_logs(&logs_dir(root));
    let teardown = node::down();
    eprintln!("cluster tests took {:.0?}", started.elapsed());
    result?;
    teardown
}
