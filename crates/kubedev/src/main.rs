//! The `kubedev` binary: the command line with the backends this build includes (see
//! [`kubedev::registry::Registry::builtin`]; each is behind a cargo feature).

fn main() -> std::process::ExitCode {
    kubedev::cli::main(kubedev::registry::Registry::builtin())
}
