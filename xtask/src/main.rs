//! kubedev's task runner, run as `cargo xtask <command>`.
//!
//! Each subcommand lives in its own module; this file only parses the
//! command line and dispatches.

#[cfg(test)]
mod architecture;
mod bench;
mod ci;
mod cluster;
mod codegen;
mod commands;
mod containers;
mod demo;
mod deploy;
mod differential;
mod e2e;
mod fuzz;
mod gomod;
mod interop;
mod plugins;
mod soak;

use clap::{Parser, Subcommand};

/// kubedev's development tasks.
#[derive(Debug, Parser)]
#[command(name = "cargo xtask", bin_name = "cargo xtask")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// The tasks `cargo xtask` knows.
#[derive(Debug, Subcommand)]
enum Command {
    /// Run every check CI runs: fmt, generated-code check, clippy, all tests.
    Ci,
    /// Run kubedev against the emulated kubelet and tell the story step by step.
    Demo,
    /// Whole scenarios per backend and mode through the real daemon, with a kubelet restart,
    /// API-server faults and kill -9; a summary table at the end.
    E2e,
    /// Run every benchmark and write a table of medians to target/bench.md.
    Bench,
    /// Regenerate the kubelet gRPC bindings in crates/kubelet-grpc/src/generated
    /// from the .proto files in crates/kubelet-grpc/proto.
    Codegen {
        /// Do not write anything; fail if the committed bindings differ from
        /// what the .proto files generate.
        #[arg(long)]
        check: bool,
    },
    /// Build the example selection policies in plugins/ for wasm32-unknown-unknown and copy
    /// them to target/plugins/wasm/.
    BuildPlugins,
    /// Lint and render the Helm chart in deploy/ and check every object it renders, and that
    /// the container image (deploy/Dockerfile) matches the chart, the workspace and the binary.
    DeployCheck(deploy::Args),
    /// kubedev's kubelet sockets against Python's grpcio and Debian's grpc-go acting as the
    /// kubelet (installs what they need); prints the :authority each client sent.
    Interop,
    /// The CDI specs kubedev writes, applied by podman with runc (installs them from Debian's
    /// packages, as root), with what each container sees asserted from inside it.
    Containers,
    /// A real one-node Kubernetes built from upstream's Go modules, kubedev installed by its
    /// Helm chart: `build`, `up`, `test` (up, every test, down) or `down` (as root).
    Cluster(cluster::Args),
    /// The release daemon in DRA mode through its real sockets for tens of thousands of claims
    /// prepared and unprepared, failures mixed in; fails when its memory, open files, threads,
    /// checkpoint, files on disk or metric series grow after the warm-up.
    Soak(soak::Args),
    /// kubedev's allocator against upstream's (k8s.io/dynamic-resource-allocation, built from
    /// its Go module by tools/allocsim) on every conformance scenario and on seeded random ones.
    Differential(differential::Args),
    /// Run every fuzz target in fuzz/ (cargo-fuzz, no sanitizer) for a while, seeded from
    /// fuzz/seeds/ and the test fixtures; prints each target's executions.
    Fuzz(fuzz::Args),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let root = commands::workspace_root()?;
    match cli.command {
        Command::Ci => ci::ci(&root),
        Command::Demo => demo::demo(&root),
        Command::E2e => e2e::e2e(&root),
        Command::Bench => bench::bench(&root),
        Command::Codegen { check } => codegen::run(&root, check),
        Command::DeployCheck(args) => deploy::deploy_check(&root, &args),
        Command::BuildPlugins => plugins::build_plugins(&root).map(|_| ()),
        Command::Fuzz(args) => fuzz::fuzz(&root, &args),
        Command::Interop => interop::interop(&root),
        Command::Containers => containers::containers(&root),
        Command::Cluster(args) => cluster::cluster(&root, &args),
        Command::Soak(args) => soak::soak(&root, &args),
        Command::Differential(args) => differential::differential(&root, &args),
    }
}
