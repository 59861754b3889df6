//! The command line's syntax: every subcommand, its options and its help text.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// kubedev serves a node's devices to the kubelet, as Device Plugins and DRA drivers.
#[derive(Debug, Parser)]
#[command(version, about, long_about = None)]
pub(super) struct Cli {
    #[command(subcommand)]
    pub(super) command: Command,
    /// Log format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub(super) log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(super) enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(super) enum Output {
    Text,
    Json,
    Yaml,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(super) enum DiscoverOutput {
    Table,
    Yaml,
    Json,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(super) enum WhoUsesOutput {
    Table,
    Json,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(super) enum SpecFormat {
    Yaml,
    Json,
}

#[derive(Debug, Subcommand)]
pub(super) enum CdiCommand {
    /// Write a CDI spec for the devices the configured backends find on this host.
    ///
    /// Each device becomes a CDI device named after it, with the edits a container would get
    /// for it; `all` holds every device. Devices whose edits only exist once prepared (a MIG
    /// placement, a function still to be bound to vfio-pci) are left out and listed on stderr.
    /// Nothing on the host is changed. The kind is `<dra.driverName>/device` unless `--kind`
    /// says otherwise.
    #[command(
        after_help = "Examples:\n  kubedev cdi generate --config /etc/kubedev/config.yaml\n  kubedev cdi generate --config config.yaml --kind example.com/gpu --output-file /etc/cdi/example.yaml\n  podman run --device example.com/gpu=gpu-0 ..."
    )]
    Generate {
        /// The configuration file (YAML).
        #[arg(long, short)]
        config: PathBuf,
        /// The CDI kind, `<vendor>/<class>`.
        #[arg(long)]
        kind: Option<String>,
        /// Format (for stdout; a file's format follows its extension, `.json` or `.yaml`).
        #[arg(long, short = 'o', value_enum, default_value_t = SpecFormat::Yaml)]
        output: SpecFormat,
        /// Write the spec to this file (atomically, mode 0644) instead of stdout.
        #[arg(long)]
        output_file: Option<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
pub(super) enum PolicyCommand {
    /// Validate a policy's contract, run it on sample input, report fuel and memory used.
    #[command(after_help = "Examples:\n  kubedev policy check numa-pack.wasm")]
    Check {
        /// The policy module (.wasm).
        path: PathBuf,
    },
}

#[derive(Debug, Subcommand)]
pub(super) enum Command {
    /// Run the daemon.
    #[command(after_help = "Examples:\n  kubedev run --config /etc/kubedev/config.yaml")]
    Run {
        /// The configuration file (YAML).
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Allocate a scenario's claims as the scheduler would, and say why when they do not fit.
    ///
    /// The scenario file has `node`, `deviceClasses`, `resourceSlices`, `allocatedDevices` and
    /// `claims` (and may have `description`, `expect` and `features`, which are not read); any
    /// other key is an error naming the key and its line. The exit code is 0 whether or not the
    /// claims fit, 1 when the scenario or the policy cannot be read, and 3 when the policy failed
    /// and `--fail-closed` refused the allocation.
    #[command(
        after_help = "Examples:\n  kubedev simulate -f scenario.yaml\n  kubedev simulate -f scenario.yaml --explain -o json\n  kubedev simulate -f scenario.yaml --repeat 1000"
    )]
    Simulate(SimulateArgs),
    /// Which nodes of a whole cluster can take a pod's (or a claim's) device claims, and why
    /// every other node cannot.
    ///
    /// Input is the live cluster (read-only, through a kubeconfig), or what `kubectl get
    /// resourceslices,deviceclasses,resourceclaims,nodes,pods -o json` (or `-o yaml`; JSON
    /// reads several times faster) prints: List objects or single objects, in one or several
    /// files, `-` for standard input. Fields the allocator does not use are ignored. Devices
    /// other claims hold (their `status.allocation`) are in use; of devices that allow
    /// multiple allocations, the capacity the claims consumed is taken. Without Node objects,
    /// the nodes the slices name are asked about. The exit code is 0 whether or not a node
    /// fits, 1 when the input cannot be read.
    #[command(
        after_help = "Examples:\n  kubedev explain --pod default/trainer            # the live cluster, read-only\n  kubectl get resourceslices,deviceclasses,resourceclaims,nodes,pods -A -o yaml > cluster.yaml\n  kubedev explain -f cluster.yaml --pod default/trainer\n  kubedev explain -f cluster.yaml --claim default/gpus --details\n  kubectl get resourceslices,deviceclasses,resourceclaims -A -o json | kubedev explain -f - --claim ml/big -o json"
    )]
    Explain(ExplainArgs),
    /// Work with WebAssembly selection policies.
    Policy {
        #[command(subcommand)]
        command: PolicyCommand,
    },
    /// Show what the configured backends find on this host, and which API serves each device.
    ///
    /// `-o table` (the default) lists every device with its pool, health, NUMA node, attributes
    /// and whether a device-plugin resource or DRA serves it; `-o yaml|json` prints the
    /// ResourceSlices DRA would publish. Nothing is published and no socket is opened.
    #[command(
        after_help = "Examples:\n  kubedev discover --config /etc/kubedev/config.yaml\n  kubedev discover --config config.yaml -o yaml"
    )]
    Discover {
        /// The configuration file (YAML).
        #[arg(long, short)]
        config: PathBuf,
        /// Output format.
        #[arg(long, short = 'o', value_enum, default_value_t = DiscoverOutput::Table)]
        output: DiscoverOutput,
    },
    /// Container Device Interface specs for what is found.
    Cdi {
        #[command(subcommand)]
        command: CdiCommand,
    },
    /// Show which pod and container hold each device, in both kubelet APIs.
    ///
    /// Asks the kubelet's pod resources API. With `--config`, only this daemon's device-plugin
    /// resources and DRA driver are shown; device names given as arguments narrow it further
    /// (a DRA device as `device` or `pool/device`).
    #[command(
        after_help = "Examples:\n  kubedev who-uses\n  kubedev who-uses --config /etc/kubedev/config.yaml gpu-3\n  kubedev who-uses -o json"
    )]
    WhoUses {
        /// The kubelet's pod resources socket.
        #[arg(long, default_value = kubedev_kubelet_grpc::pod_resources::DEFAULT_SOCKET)]
        socket: PathBuf,
        /// Only this daemon's resources and driver.
        #[arg(long, short)]
        config: Option<PathBuf>,
        /// Output format.
        #[arg(long, short = 'o', value_enum, default_value_t = WhoUsesOutput::Table)]
        output: WhoUsesOutput,
        /// Only these devices.
        devices: Vec<String>,
    },
    /// Check a configuration file and exit.
    #[command(after_help = "Examples:\n  kubedev check-config --config /etc/kubedev/config.yaml")]
    CheckConfig {
        /// The configuration file (YAML).
        #[arg(long, short)]
        config: PathBuf,
    },
}

// The options of `kubedev simulate` (its help is the doc comment of `Command::Simulate`).
#[derive(Debug, clap::Args)]
pub(super) struct SimulateArgs {
    /// The scenario file (YAML or JSON).
    #[arg(long, short = 'f')]
    pub(super) file: PathBuf,
    /// Explain why claims do not fit (per request, per device).
    #[arg(long)]
    pub(super) explain: bool,
    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value_t = Output::Text)]
    pub(super) output: Output,
    /// Repeat the allocation N times after a warm-up and report the median times (whole-process
    /// CPU and wall, freeing included).
    #[arg(long)]
    pub(super) repeat: Option<usize>,
    /// A WebAssembly selection policy that orders the valid candidates.
    #[arg(long)]
    pub(super) policy: Option<PathBuf>,
    /// When the policy fails, refuse the allocation instead of using the default order, and
    /// exit with code 3.
    #[arg(long, requires = "policy")]
    pub(super) fail_closed: bool,
}

// The options of `kubedev explain` (its help is the doc comment of `Command::Explain`).
#[derive(Debug, clap::Args)]
pub(super) struct ExplainArgs {
    /// A dump (YAML or JSON); repeat for several, `-` for standard input. Without it, the
    /// live cluster is read (read-only).
    #[arg(long, short = 'f')]
    pub(super) file: Vec<PathBuf>,
    /// The kubeconfig for reading the live cluster (default: `KUBECONFIG`,
    /// `~/.kube/config`, or the in-cluster configuration).
    #[arg(long, conflicts_with = "file")]
    pub(super) kubeconfig: Option<PathBuf>,
    /// The pod whose claims to explain, `namespace/name`.
    #[arg(long, conflicts_with = "claim", required_unless_present = "claim")]
    pub(super) pod: Option<String>,
    /// The claim to explain, `namespace/name`.
    #[arg(long)]
    pub(super) claim: Option<String>,
    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value_t = Output::Text)]
    pub(super) output: Output,
    /// In text, also each node that does not fit and why.
    #[arg(long)]
    pub(super) details: bool,
}
