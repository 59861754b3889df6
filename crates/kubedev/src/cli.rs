//! The `kubedev` command line, for the `kubedev` binary and for vendors' drivers: [`main`]
//! with the backend kinds to serve.
//!
//! `cli/args.rs` is the command line's syntax and `cli/output.rs` what it writes (logs, its
//! own messages, its answers); each subcommand runs in its own module: `run.rs` (`run`,
//! `check-config`), `simulate.rs` (`simulate`, `policy check`), `explain.rs`, `host.rs`
//! (`discover`, `who-uses`) and `cdi.rs` (`cdi generate`).

use std::process::ExitCode;

use anyhow::Context as _;

use crate::registry::Registry;

mod args;
mod cdi;
mod explain;
mod host;
mod output;
mod run;
mod simulate;

use args::{CdiCommand, Cli, Command, PolicyCommand};
use output::{Level, say};

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
        output::set_program_name(p.name);
    }
    let cli = match Cli::from_arg_matches(&command.get_matches()) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    output::init_logging(cli.log_format);
    match run_command(cli.command, registry) {
        Ok(code) => code,
        Err(e) => {
            say(Level::Error, &format!("{e:#}"));
            ExitCode::FAILURE
        }
    }
}

/// Runs the subcommand `command` with the backend kinds of `registry`.
fn run_command(command: Command, registry: Registry) -> anyhow::Result<ExitCode> {
    match command {
        Command::Simulate(args) => simulate::simulate(args),
        Command::Explain(args) => explain::explain(args),
        Command::Policy {
            command: PolicyCommand::Check { path },
        } => simulate::check_policy(&path).map(|()| ExitCode::SUCCESS),
        Command::Discover { config, output } => host::discover(&config, output, registry),
        Command::Cdi {
            command:
                CdiCommand::Generate {
                    config,
                    kind,
                    output,
                    output_file,
                },
        } => cdi::generate(
            registry,
            &config,
            kind.as_deref(),
            output,
            output_file.as_deref(),
        ),
        Command::WhoUses {
            socket,
            config,
            output,
            devices,
        } => host::who_uses(&socket, config, output, &devices, registry),
        Command::CheckConfig { config } => run::check_config(&config, registry),
        Command::Run { config } => run::run(&config, registry),
    }
}

/// A single-threaded async runtime for a subcommand's requests.
fn current_thread_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}
