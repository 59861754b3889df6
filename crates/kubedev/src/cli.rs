//! The `kubedev` command line, for the `kubedev` binary and for vendors' drivers: [`main`]
//! with the backend kinds to serve.
//!
//! `cli/args.rs` is the command line's syntax and `cli/output.rs` what it writes (logs, its
//! own messages, its answers); each subcommand runs in its own module: `run.rs` (`run`,
//! `check-config`), `simulate.rs` (`simulate`, `policy check`), `explain.rs`, `status.rs`,
//! `host.rs` (`discover`, `who-uses`), `cdi.rs` (`cdi generate`) and `docs.rs` (`completion`,
//! the manual pages).
//!
//! Run under the name `kubectl-kubedev` (a link or copy on `PATH`), the same binary is a
//! kubectl plugin: `kubectl kubedev explain …`, with usage and help saying so.

use std::process::ExitCode;

use anyhow::Context as _;

use crate::registry::Registry;

mod args;
mod cdi;
mod docs;
mod explain;
mod host;
mod output;
mod run;
mod simulate;
mod status;

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

/// The file name under which the binary is a kubectl plugin (`kubectl kubedev`).
pub const KUBECTL_PLUGIN_NAME: &str = "kubectl-kubedev";

/// Runs the `kubedev` command line (`run`, `check-config`, `discover`, `cdi generate`,
/// `who-uses`, `simulate`, `explain`, `status`, `policy check`, `completion`) with the backend kinds of `registry`: the whole
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
    let plugin = std::env::args_os()
        .next()
        .is_some_and(|argv0| is_kubectl_plugin(&argv0));
    let matches = if plugin {
        command.clone().bin_name("kubectl kubedev").get_matches()
    } else {
        command.clone().get_matches()
    };
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    output::init_logging(cli.log_format);
    match run_command(cli.command, command, registry) {
        Ok(code) => code,
        Err(e) => {
            say(Level::Error, &format!("{e:#}"));
            ExitCode::FAILURE
        }
    }
}

/// Whether the program was started as `kubectl-kubedev` (`argv0` is its path), as kubectl
/// starts its plugins.
fn is_kubectl_plugin(argv0: &std::ffi::OsStr) -> bool {
    std::path::Path::new(argv0)
        .file_stem()
        .is_some_and(|stem| stem == KUBECTL_PLUGIN_NAME)
}

/// Runs the subcommand `command` of the command line `definition` with the backend kinds of
/// `registry`.
fn run_command(
    command: Command,
    definition: clap::Command,
    registry: Registry,
) -> anyhow::Result<ExitCode> {
    match command {
        Command::Simulate(args) => simulate::simulate(args),
        Command::Explain(args) => explain::explain(args),
        Command::Status(args) => status::status(args, registry),
        Command::Completion { shell } => docs::completion(definition, shell),
        Command::Man { dir } => docs::man_pages(definition, &dir),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plugin_is_recognised_by_its_file_name_only() {
        assert!(is_kubectl_plugin("kubectl-kubedev".as_ref()));
        assert!(is_kubectl_plugin("/usr/local/bin/kubectl-kubedev".as_ref()));
        assert!(is_kubectl_plugin(
            "C:/krew/bin/kubectl-kubedev.exe".as_ref()
        ));
        assert!(!is_kubectl_plugin("/usr/bin/kubedev".as_ref()));
        assert!(!is_kubectl_plugin(
            "/opt/kubectl-kubedev/bin/kubedev".as_ref()
        ));
    }

    #[test]
    fn the_command_line_definition_is_consistent() {
        use clap::CommandFactory as _;
        Cli::command().debug_assert();
    }
}
