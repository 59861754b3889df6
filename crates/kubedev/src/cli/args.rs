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

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(super) enum StatusOutput {
    /// Per node, then the device taints and the claims.
    Table,
    /// The table with every device listed too.
    Wide,
    Json,
    Yaml,
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
    /// The scenario file has `node`, `deviceClasses`, `resourceSlices`, `allocatedDevices`,
    /// `allocatedShares` (shares of devices that allow multiple allocations, each a `device` and
    /// its `consumedCapacity`) and `claims` (and may have `description`, `expect` and `features`, which are not read); any
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
    /// resourceslices,deviceclasses,devicetaintrules,resourceclaims,nodes,pods -o json` (or `-o yaml`; JSON
    /// reads several times faster) prints: List objects or single objects, in one or several
    /// files, `-` for standard input. Fields the allocator does not use are ignored. Devices
    /// other claims hold (their `status.allocation`) are in use as the scheduler counts them:
    /// a result with admin access leaves its device to others, and a result with a `shareID`
    /// is a share that takes the capacity it consumed. Without Node objects,
    /// the nodes the slices name are asked about. The exit code is 0 whether or not a node
    /// fits, 1 when the input cannot be read.
    #[command(
        after_help = "Examples:\n  kubedev explain --pod default/trainer            # the live cluster, read-only\n  kubectl get resourceslices,deviceclasses,devicetaintrules,resourceclaims,nodes,pods -A -o yaml > cluster.yaml\n  kubedev explain -f cluster.yaml --pod default/trainer\n  kubedev explain -f cluster.yaml --claim default/gpus --details\n  kubectl get resourceslices,deviceclasses,resourceclaims -A -o json | kubedev explain -f - --claim ml/big -o json"
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
    /// Asks the kubelet's pod resources API, so it runs on the node (`kubectl debug node/NAME`
    /// or the daemon's pod): device-plugin allocations are only visible there. With `--config`,
    /// only this daemon's device-plugin resources and DRA driver are shown; device names given
    /// as arguments narrow it further (a DRA device as `device` or `pool/device`). For the DRA
    /// claims of every node, from the cluster, see `status`.
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
    /// A DRA driver's state across the cluster, per node: its ResourceSlices, devices, device
    /// taints and the claims allocated its devices.
    ///
    /// Read-only, through a kubeconfig as `kubectl` reads it. Per node: each pool the driver
    /// publishes (generation, slices), its devices (listed with `-o wide`), device taints (key,
    /// effect) and the ResourceClaims whose allocation holds its devices, with the pods they
    /// are reserved for and the device conditions the driver reported. Claims are those of the
    /// namespace (`-n`, else the context's) unless `-A` is given. The driver is `--driver`, or
    /// the `dra.driverName` of `--config`.
    #[command(
        after_help = "Examples:\n  kubedev status --driver gpu.example.com -A\n  kubectl kubedev status --config /etc/kubedev/config.yaml -o wide\n  kubectl kubedev status --driver gpu.example.com --context prod -n ml -o yaml"
    )]
    Status(StatusArgs),
    /// Print a shell completion script for this command line.
    ///
    /// Bash: `source <(kubedev completion bash)`, or write it to
    /// `/usr/share/bash-completion/completions/kubedev`. Zsh: write it as `_kubedev` in a
    /// directory of `$fpath`. Fish: `kubedev completion fish > ~/.config/fish/completions/kubedev.fish`.
    #[command(
        after_help = "Examples:\n  source <(kubedev completion bash)\n  kubedev completion zsh > \"${fpath[1]}/_kubedev\""
    )]
    Completion {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Write the manual pages (section 1) of the command and of each subcommand into a
    /// directory, for packaging.
    #[command(hide = true)]
    Man {
        /// The directory (created if missing).
        #[arg(long)]
        dir: PathBuf,
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
    #[arg(long, short = 'f', conflicts_with_all = ["kubeconfig", "context"])]
    pub(super) file: Vec<PathBuf>,
    #[command(flatten)]
    pub(super) kube: KubeArgs,
    /// The pod whose claims to explain, `namespace/name` or a name in the namespace.
    #[arg(long, conflicts_with = "claim", required_unless_present = "claim")]
    pub(super) pod: Option<String>,
    /// The claim to explain, `namespace/name` or a name in the namespace.
    #[arg(long)]
    pub(super) claim: Option<String>,
    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value_t = Output::Text)]
    pub(super) output: Output,
    /// In text, also each node that does not fit and why.
    #[arg(long)]
    pub(super) details: bool,
}

/// How a command reaches the cluster, with kubectl's flags and defaults.
#[derive(Debug, Clone, clap::Args)]
pub(super) struct KubeArgs {
    /// The kubeconfig file (default: `KUBECONFIG`, `~/.kube/config`, or the in-cluster
    /// configuration).
    #[arg(long)]
    pub(super) kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: the current context).
    #[arg(long)]
    pub(super) context: Option<String>,
    /// The namespace: of names given without `namespace/`, and of what is listed (default:
    /// the context's namespace, else `default`).
    #[arg(long, short = 'n')]
    pub(super) namespace: Option<String>,
}

// The options of `kubedev status` (its help is the doc comment of `Command::Status`).
#[derive(Debug, clap::Args)]
pub(super) struct StatusArgs {
    #[command(flatten)]
    pub(super) kube: KubeArgs,
    /// The DRA driver, e.g. `gpu.example.com`.
    #[arg(long, required_unless_present = "config", conflicts_with = "config")]
    pub(super) driver: Option<String>,
    /// Take the driver from this configuration file's `dra.driverName`.
    #[arg(long, short)]
    pub(super) config: Option<PathBuf>,
    /// Claims of every namespace.
    #[arg(long, short = 'A', conflicts_with = "namespace")]
    pub(super) all_namespaces: bool,
    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value_t = StatusOutput::Table)]
    pub(super) output: StatusOutput,
}
