//! `kubedev simulate` (a scenario's claims allocated as the scheduler would) and `kubedev policy
//! check`, with the WebAssembly selection policy both may load.

use std::path::Path;
use std::process::ExitCode;

use super::args::{Output, SimulateArgs};
use super::output::{Level, say, write_stdout};

/// The exit code of `simulate --fail-closed` when the policy failed and the allocation was
/// refused.
const EXIT_POLICY_REFUSED: u8 = 3;

/// `kubedev simulate`.
pub(super) fn simulate(args: SimulateArgs) -> anyhow::Result<ExitCode> {
    let SimulateArgs {
        file,
        explain,
        output,
        repeat,
        policy,
        fail_closed,
    } = args;
    // Every scenario error names the file (and the line, for what is in it).
    let scenario = kubedev_inputs::read_scenario(&file)?;
    let mut options = kubedev_allocator::SimulateOptions::default()
        .with_explain(explain)
        .with_fail_closed(fail_closed);
    if let Some(n) = repeat {
        options = options.with_repeat(n);
    }
    let (out, policy_failure) = simulate_with_policy(&scenario, options, policy.as_deref())?;
    let text = match output {
        Output::Text => out.to_text(),
        Output::Json => format!("{}\n", out.to_json()),
        Output::Yaml => serde_saphyr::to_string(&out).unwrap_or_else(|e| format!("error: {e}\n")),
    };
    write_stdout(&text)?;
    match policy_failure {
        Some(failure) if fail_closed => {
            say(
                Level::Error,
                &format!("the policy failed and --fail-closed refused the allocation: {failure}"),
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

/// Runs the allocator on `scenario`, with the WebAssembly policy at `policy` ordering the
/// candidates; returns the output and how the policy failed, if it did (the caller says what
/// that meant: the default order, or with `--fail-closed` a refused allocation).
#[cfg(feature = "wasm")]
fn simulate_with_policy(
    scenario: &kubedev_allocator::Scenario,
    options: kubedev_allocator::SimulateOptions<'_>,
    policy: Option<&Path>,
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
fn policy_error(doing: &str, path: &Path, error: kubedev_sandbox::PolicyError) -> anyhow::Error {
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
    policy: Option<&Path>,
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
pub(super) fn check_policy(path: &Path) -> anyhow::Result<()> {
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
pub(super) fn check_policy(path: &Path) -> anyhow::Result<()> {
    anyhow::bail!(
        "policy check {}: this kubedev was built without the `wasm` feature",
        path.display()
    )
}
