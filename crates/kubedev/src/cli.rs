//! The `kubedev` command line, for the `kubedev` binary and for vendors' drivers: [`main`]
//! with the backend kinds to serve.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use tokio_util::sync::CancellationToken;

use crate::registry::Registry;

/// kubedev serves a node's devices to the kubelet, as Device Plugins and DRA drivers.
#[derive(Debug, Parser)]
#[command(version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum Output {
    Text,
    Json,
    Yaml,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum DiscoverOutput {
    Table,
    Yaml,
    Json,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum WhoUsesOutput {
    Table,
    Json,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum SpecFormat {
    Yaml,
    Json,
}

#[derive(Debug, Subcommand)]
enum CdiCommand {
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
enum PolicyCommand {
    /// Validate a policy's contract, run it on sample input, report fuel and memory used.
    #[command(after_help = "Examples:\n  kubedev policy check numa-pack.wasm")]
    Check {
        /// The policy module (.wasm).
        path: PathBuf,
    },
}

#[derive(Debug, Subcommand)]
enum Command {
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
    Simulate {
        /// The scenario file (YAML or JSON).
        #[arg(long, short = 'f')]
        file: PathBuf,
        /// Explain why claims do not fit (per request, per device).
        #[arg(long)]
        explain: bool,
        /// Output format.
        #[arg(long, short = 'o', value_enum, default_value_t = Output::Text)]
        output: Output,
        /// Repeat the allocation N times after a warm-up and report the median times (whole-process
        /// CPU and wall, freeing included).
        #[arg(long)]
        repeat: Option<usize>,
        /// A WebAssembly selection policy that orders the valid candidates.
        #[arg(long)]
        policy: Option<PathBuf>,
        /// When the policy fails, refuse the allocation instead of using the default order, and
        /// exit with code 3.
        #[arg(long, requires = "policy")]
        fail_closed: bool,
    },
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
    Explain {
        /// A dump (YAML or JSON); repeat for several, `-` for standard input. Without it, the
        /// live cluster is read (read-only).
        #[arg(long, short = 'f')]
        file: Vec<PathBuf>,
        /// The kubeconfig for reading the live cluster (default: `KUBECONFIG`,
        /// `~/.kube/config`, or the in-cluster configuration).
        #[arg(long, conflicts_with = "file")]
        kubeconfig: Option<PathBuf>,
        /// The pod whose claims to explain, `namespace/name`.
        #[arg(long, conflicts_with = "claim", required_unless_present = "claim")]
        pod: Option<String>,
        /// The claim to explain, `namespace/name`.
        #[arg(long)]
        claim: Option<String>,
        /// Output format.
        #[arg(long, short = 'o', value_enum, default_value_t = Output::Text)]
        output: Output,
        /// In text, also each node that does not fit and why.
        #[arg(long)]
        details: bool,
    },
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

fn init_logging(format: LogFormat) {
    // kube-rs logs each failed API request at ERROR without saying what it was for; kubedev
    // logs those failures itself, with their context and at a bounded rate.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new("info,kube_client::client::builder=off")
    });
    // A closed stderr (the reader of our logs went away) must not panic a task mid-log:
    // tracing-subscriber would report its write error with `eprintln!`, which panics.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .log_internal_errors(false)
        .with_writer(move || OneLineStderr { colours: ansi });
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// Standard error for log events: each event is written whole, with every control character
/// escaped but its final newline, so that a value from a request can never start a forged log
/// line or reach the operator's terminal as an escape sequence (the terminal's own colours stay).
struct OneLineStderr {
    colours: bool,
}

impl std::io::Write for OneLineStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        let line = kubedev_core::echo::escape_log_line(&text, self.colours);
        std::io::Write::write_all(&mut std::io::stderr().lock(), line.as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::Write::flush(&mut std::io::stderr())
    }
}

/// Set when `--log-format json` is given: messages of the command line itself (fatal errors,
/// warnings) are then JSON lines like the daemon's logs.
static JSON_MESSAGES: AtomicBool = AtomicBool::new(false);

/// The program's name in its messages (`kubedev`, or a vendor's driver's).
static PROGRAM: std::sync::OnceLock<String> = std::sync::OnceLock::new();

fn program() -> &'static str {
    PROGRAM.get().map_or("kubedev", String::as_str)
}

/// How a driver built on kubedev presents itself on its command line: in `--help`,
/// `--version` and the prefix of its messages.
#[derive(Debug, Clone)]
pub struct Program {
    /// The command's name, e.g. `fpga-driver`.
    pub name: String,
    /// Its version, e.g. `env!("CARGO_PKG_VERSION")` of the driver's crate.
    pub version: String,
    /// One line saying what it serves (default: kubedev's).
    pub about: Option<String>,
}

impl Program {
    /// A program named `name` at `version`.
    pub fn new(name: impl Into<String>, version: impl Into<String>) -> Self {
        Program {
            name: name.into(),
            version: version.into(),
            about: None,
        }
    }

    /// With `about` as its description.
    pub fn about(mut self, about: impl Into<String>) -> Self {
        self.about = Some(about.into());
        self
    }
}

/// The exit code of `simulate --fail-closed` when the policy failed and the allocation was
/// refused.
const EXIT_POLICY_REFUSED: u8 = 3;

/// Severity of a message of the command line.
#[derive(Debug, Clone, Copy)]
enum Level {
    Error,
    Warn,
    Info,
}

/// Prints a message of the command line on stderr: `kubedev: MESSAGE`, or under
/// `--log-format json` one JSON line shaped like the daemon's log lines (`timestamp`, `level`,
/// `fields.message`, `target`), so a log pipeline reads every line.
fn say(level: Level, message: &str) {
    use std::io::Write as _;
    let line = if JSON_MESSAGES.load(Ordering::Relaxed) {
        json_line(level, message)
    } else {
        format!("{}: {message}", program())
    };
    // A closed stderr leaves nobody to tell; it must not panic.
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

fn json_line(level: Level, message: &str) -> String {
    use tracing_subscriber::fmt::format::Writer;
    use tracing_subscriber::fmt::time::{FormatTime as _, SystemTime};
    let mut timestamp = String::new();
    // Formatting into a String cannot fail; without a timestamp the line is still valid.
    let _ = SystemTime.format_time(&mut Writer::new(&mut timestamp));
    let level = match level {
        Level::Error => "ERROR",
        Level::Warn => "WARN",
        Level::Info => "INFO",
    };
    serde_json::json!({
        "timestamp": timestamp,
        "level": level,
        "fields": {"message": message},
        "target": program(),
    })
    .to_string()
}

/// Runs the `kubedev` command line (`run`, `check-config`, `discover`, `cdi generate`,
/// `who-uses`, `simulate`, `policy check`) with the backend kinds of `registry`: the whole
/// `main` of the `kubedev` binary, and of a vendor's driver built on kubedev.
pub fn main(registry: Registry) -> ExitCode {
    main_as(None, registry)
}

/// [`main`] for a program that presents itself as `program` (kubedev when `None`).
pub fn main_as(program: Option<Program>, registry: Registry) -> ExitCode {
    use clap::{CommandFactory as _, FromArgMatches as _};
    let mut command = Cli::command();
    if let Some(p) = program {
        command = command
            .name(p.name.clone())
            .bin_name(p.name.clone())
            .version(p.version);
        if let Some(about) = p.about {
            command = command.about(about);
        }
        let _ = PROGRAM.set(p.name);
    }
    let cli = match Cli::from_arg_matches(&command.get_matches()) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    JSON_MESSAGES.store(matches!(cli.log_format, LogFormat::Json), Ordering::Relaxed);
    init_logging(cli.log_format);
    match real_main(cli, registry) {
        Ok(code) => code,
        Err(e) => {
            say(Level::Error, &format!("{e:#}"));
            ExitCode::FAILURE
        }
    }
}

fn real_main(cli: Cli, registry: Registry) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Simulate {
            file,
            explain,
            output,
            repeat,
            policy,
            fail_closed,
        } => {
            // Every scenario error names the file (and the line, for what is in it).
            let scenario = kubedev_allocator::Scenario::from_path(&file)?;
            let mut options = kubedev_allocator::SimulateOptions::default()
                .with_explain(explain)
                .with_fail_closed(fail_closed);
            if let Some(n) = repeat {
                options = options.with_repeat(n);
            }
            let (out, policy_failure) =
                simulate_with_policy(&scenario, options, policy.as_deref())?;
            let text = match output {
                Output::Text => out.to_text(),
                Output::Json => format!("{}\n", out.to_json()),
                Output::Yaml => out.to_yaml(),
            };
            write_stdout(&text)?;
            match policy_failure {
                Some(failure) if fail_closed => {
                    say(
                        Level::Error,
                        &format!(
                            "the policy failed and --fail-closed refused the allocation: {failure}"
                        ),
                    );
                    Ok(ExitCode::from(EXIT_POLICY_REFUSED))
                }
                Some(failure) => {
                    say(
                        Level::Warn,
                        &format!("the policy failed, the default order was used: {failure}"),
                    );
                    Ok(ExitCode::SUCCESS)
                }
                None => Ok(ExitCode::SUCCESS),
            }
        }
        Command::Explain {
            file,
            kubeconfig,
            pod,
            claim,
            output,
            details,
        } => {
            let mut cluster = kubedev_allocator::cluster::Cluster::default();
            if file.is_empty() {
                let pod_key = pod.as_deref().map(|p| match p.split_once('/') {
                    Some((ns, name)) => (ns.to_string(), name.to_string()),
                    None => ("default".to_string(), p.to_string()),
                });
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .context("starting the async runtime")?;
                let texts = rt.block_on(async {
                    let client = kubedev_apiserver::connect(kubeconfig.as_deref()).await?;
                    let pod = pod_key.as_ref().map(|(ns, n)| (ns.as_str(), n.as_str()));
                    anyhow::Ok(kubedev_apiserver::read_explain_inputs(&client, pod).await?)
                })?;
                for text in &texts {
                    cluster.add_text(text, "the cluster")?;
                }
            }
            for f in &file {
                let (text, origin) = if f.as_os_str() == "-" {
                    let mut text = String::new();
                    std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
                        .context("reading standard input")?;
                    (text, "stdin".to_string())
                } else {
                    let text = std::fs::read_to_string(f)
                        .with_context(|| format!("reading {}", f.display()))?;
                    (text, f.display().to_string())
                };
                cluster.add_text(&text, &origin)?;
            }
            let subject = match (pod, claim) {
                (Some(p), _) => kubedev_allocator::cluster::Subject::Pod(p),
                (None, Some(c)) => kubedev_allocator::cluster::Subject::Claim(c),
                (None, None) => anyhow::bail!("give --pod or --claim"),
            };
            let answer = cluster.explain(&subject).map_err(anyhow::Error::msg)?;
            let text = match output {
                Output::Text => answer.to_text(details),
                Output::Json => format!("{}\n", serde_json::to_string_pretty(&answer)?),
                Output::Yaml => serde_saphyr::to_string(&answer)?,
            };
            write_stdout(&text)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Policy {
            command: PolicyCommand::Check { path },
        } => check_policy(&path).map(|()| ExitCode::SUCCESS),
        Command::Discover {
            config: path,
            output,
        } => {
            let config = crate::config::Config::load_with(&path, registry.clone())?;
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("starting the async runtime")?;
            let found = rt.block_on(crate::discover::discover(&config, &path))?;
            let text = match output {
                DiscoverOutput::Table => found.table(),
                DiscoverOutput::Json => {
                    format!("{:#}\n", found.slices(&config)?)
                }
                DiscoverOutput::Yaml => {
                    serde_saphyr::to_string(&found.slices(&config)?).context("encoding YAML")?
                }
            };
            write_stdout(&text).map(|()| ExitCode::SUCCESS)
        }
        Command::Cdi {
            command:
                CdiCommand::Generate {
                    config: path,
                    kind,
                    output,
                    output_file,
                },
        } => cdi_generate(
            registry,
            &path,
            kind.as_deref(),
            output,
            output_file.as_deref(),
        )
        .map(|()| ExitCode::SUCCESS),
        Command::WhoUses {
            socket,
            config,
            output,
            devices,
        } => {
            let config = config
                .map(|p| crate::config::Config::load_with(&p, registry.clone()))
                .transpose()?;
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("starting the async runtime")?;
            let pods = rt.block_on(async {
                let mut client = kubedev_kubelet_grpc::pod_resources::PodResourcesClient::connect(
                    &socket,
                    std::time::Duration::from_secs(5),
                )
                .await?;
                client.list().await
            })?;
            let rows = crate::who_uses::filter(
                kubedev_kubelet_grpc::pod_resources::device_uses(&pods),
                config.as_ref(),
                &devices,
            );
            let text = match output {
                WhoUsesOutput::Table => crate::who_uses::table(&rows),
                WhoUsesOutput::Json => format!("{:#}\n", serde_json::to_value(&rows)?),
            };
            write_stdout(&text).map(|()| ExitCode::SUCCESS)
        }
        Command::CheckConfig { config } => {
            crate::config::Config::check_with(&config, registry.clone())?;
            write_stdout(&format!("{}: ok\n", config.display())).map(|()| ExitCode::SUCCESS)
        }
        Command::Run { config: path } => {
            let config = crate::config::Config::load_with(&path, registry.clone())?;
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .context("starting the async runtime")?;
            rt.block_on(async move {
                let cancel = CancellationToken::new();
                let signals = cancel.clone();
                tokio::spawn(async move {
                    wait_for_signal().await;
                    // Stop first: logging may fail if stderr is gone.
                    signals.cancel();
                    tracing::info!("signal received; shutting down");
                });
                crate::runtime::serve(config, &path, cancel).await
            })
            .map(|()| ExitCode::SUCCESS)
        }
    }
}

/// Runs the allocator on `scenario`, with the WebAssembly policy at `policy` ordering the
/// candidates; returns the output and how the policy failed, if it did (the caller says what
/// that meant: the default order, or with `--fail-closed` a refused allocation).
#[cfg(feature = "wasm")]
fn simulate_with_policy(
    scenario: &kubedev_allocator::Scenario,
    options: kubedev_allocator::SimulateOptions<'_>,
    policy: Option<&std::path::Path>,
) -> anyhow::Result<(kubedev_allocator::SimulateOutput, Option<String>)> {
    let Some(path) = policy else {
        return Ok((kubedev_allocator::simulate(scenario, &options), None));
    };
    let sandbox = kubedev_sandbox::Sandbox::new(kubedev_sandbox::Limits::default())?;
    let loaded = sandbox
        .load_file(path)
        .map_err(|e| policy_error("loading policy", path, e))?;
    let session = loaded.session(&scenario.resource_slices, &scenario.allocated_devices);
    // The options live only as long as the session they now point at.
    let options: kubedev_allocator::SimulateOptions<'_> = options;
    let options = options.with_policy(&session);
    let out = kubedev_allocator::simulate(scenario, &options);
    let failure = session.failure().map(|e| kubedev_core::echo::chain(&e));
    Ok((out, failure))
}

/// A policy error with `doing` and the path in front, unless the error already names the file.
#[cfg(feature = "wasm")]
fn policy_error(
    doing: &str,
    path: &std::path::Path,
    error: kubedev_sandbox::PolicyError,
) -> anyhow::Error {
    match error {
        kubedev_sandbox::PolicyError::NotWasm { .. } | kubedev_sandbox::PolicyError::Io { .. } => {
            error.into()
        }
        other => anyhow::Error::new(other).context(format!("{doing} {}", path.display())),
    }
}

/// Without the `wasm` feature there is no sandbox: a policy is refused.
#[cfg(not(feature = "wasm"))]
fn simulate_with_policy(
    scenario: &kubedev_allocator::Scenario,
    options: kubedev_allocator::SimulateOptions<'_>,
    policy: Option<&std::path::Path>,
) -> anyhow::Result<(kubedev_allocator::SimulateOutput, Option<String>)> {
    if let Some(path) = policy {
        anyhow::bail!(
            "--policy {}: this kubedev was built without the `wasm` feature",
            path.display()
        );
    }
    Ok((kubedev_allocator::simulate(scenario, &options), None))
}

/// `kubedev policy check`.
#[cfg(feature = "wasm")]
fn check_policy(path: &std::path::Path) -> anyhow::Result<()> {
    let report =
        kubedev_sandbox::check(path).map_err(|e| policy_error("checking policy", path, e))?;
    write_stdout(&format!("{report}\n"))?;
    anyhow::ensure!(
        report.passed(),
        "policy {} failed its check",
        path.display()
    );
    Ok(())
}

/// Without the `wasm` feature there is no sandbox to check a policy in.
#[cfg(not(feature = "wasm"))]
fn check_policy(path: &std::path::Path) -> anyhow::Result<()> {
    anyhow::bail!(
        "policy check {}: this kubedev was built without the `wasm` feature",
        path.display()
    )
}

/// Writes to stdout; a closed pipe (`| head`) is not an error.
fn cdi_generate(
    registry: Registry,
    path: &std::path::Path,
    kind: Option<&str>,
    output: SpecFormat,
    file: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    let config = crate::config::Config::load_with(path, registry)?;
    let kind = crate::cdi_generate::kind_for(&config, kind)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let out = rt.block_on(crate::cdi_generate::generate(&config, path, &kind))?;
    for s in &out.skipped {
        say(Level::Warn, &format!("left out {}: {}", s.device, s.reason));
    }
    let Some(spec) = out.spec else {
        anyhow::bail!(
            "no CDI spec written: {}",
            if out.backends.is_empty() {
                "no backend is configured".to_string()
            } else if out.found == 0 {
                format!(
                    "the {} backend(s) found no devices",
                    out.backends.join(", ")
                )
            } else {
                format!(
                    "none of the {} device(s) found could be described",
                    out.found
                )
            }
        );
    };
    let format = match file.and_then(|f| f.extension()).and_then(|e| e.to_str()) {
        Some("json") => SpecFormat::Json,
        Some("yaml" | "yml") => SpecFormat::Yaml,
        Some(other) => anyhow::bail!(
            "--output-file: container runtimes read CDI specs from .json or .yaml files, not .{other}"
        ),
        None if file.is_some() => {
            anyhow::bail!("--output-file: the name must end in .json or .yaml")
        }
        None => output,
    };
    let text = match format {
        SpecFormat::Json => format!("{}\n", serde_json::to_string_pretty(&spec)?),
        SpecFormat::Yaml => serde_saphyr::to_string(&spec).context("encoding YAML")?,
    };
    match file {
        Some(f) => {
            crate::cdi::write_spec_file(f, text.as_bytes())
                .with_context(|| format!("writing {}", f.display()))?;
            say(
                Level::Info,
                &format!(
                    "wrote {} with {} CDI device(s) of kind {kind}",
                    f.display(),
                    spec.devices.len()
                ),
            );
            Ok(())
        }
        None => write_stdout(&text),
    }
}

fn write_stdout(text: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => {
            tracing::error!("cannot install signal handlers; stopping only on Ctrl-C");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
