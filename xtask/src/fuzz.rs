//! `cargo xtask fuzz`: builds every cargo-fuzz target in `fuzz/` (installing cargo-fuzz when it
//! is missing; no sanitizer, so it works on the stable toolchain), seeds each target's corpus
//! from `fuzz/seeds/` and the project's test fixtures, runs the targets for a while, a few at a
//! time, and prints what each did: executions, seconds, executions per second.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context as _, bail};

/// How `cargo xtask fuzz` runs.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Args {
    /// Seconds per target.
    #[arg(long, default_value_t = 60)]
    pub(crate) seconds: u32,
    /// Stop a target after this many executions, if that comes first.
    #[arg(long)]
    pub(crate) runs: Option<u64>,
    /// Targets run at the same time.
    #[arg(long, default_value_t = 1)]
    pub(crate) jobs: usize,
    /// Only these targets (comma-separated); all by default.
    #[arg(long, value_delimiter = ',')]
    pub(crate) only: Vec<String>,
}

/// The longest one input may take before libFuzzer calls it a hang, in seconds.
const INPUT_TIMEOUT_S: u32 = 25;

/// The fuzz targets: the `[[bin]]` names in `fuzz/Cargo.toml`.
fn targets(fuzz_dir: &Path) -> anyhow::Result<Vec<String>> {
    let out = Command::new("cargo")
        .args(["fuzz", "list"])
        .current_dir(fuzz_dir)
        .output()
        .context("run `cargo fuzz list`")?;
    if !out.status.success() {
        bail!(
            "`cargo fuzz list` failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect())
}

fn ensure_cargo_fuzz(root: &Path) -> anyhow::Result<()> {
    let installed = Command::new("cargo")
        .args(["fuzz", "--version"])
        .current_dir(root)
        .output()
        .is_ok_and(|o| o.status.success());
    if !installed {
        crate::commands::run(root, "cargo", &["install", "cargo-fuzz", "--locked"])?;
    }
    Ok(())
}

/// The host's target triple, where cargo-fuzz puts the binaries.
fn host_triple() -> anyhow::Result<String> {
    let out = Command::new("rustc")
        .arg("-vV")
        .output()
        .context("rustc -vV")?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .map(str::to_string)
        .context("no host line in `rustc -vV`")
}

/// Test fixtures that make good starting inputs for `target`, as (file name, content).
fn fixture_seeds(root: &Path, target: &str) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
    let conformance = root.join("crates/allocator/tests/conformance");
    let read_dir = |dir: &Path, ext: &str| -> anyhow::Result<Vec<(String, Vec<u8>)>> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(dir).with_context(|| format!("{}", dir.display()))? {
            let path = entry?.path();
            if path.extension().is_some_and(|e| e == ext) {
                let name = path.file_name().unwrap_or_default().to_string_lossy();
                out.push((format!("fixture-{name}"), std::fs::read(&path)?));
            }
        }
        Ok(out)
    };
    Ok(match target {
        "scenario" | "cluster_dump" => read_dir(&conformance, "yaml")?,
        "config" => [
            "docs/examples/kubedev.yaml",
            "examples/vendor-driver/fpga.yaml",
        ]
        .iter()
        .map(|p| {
            let name = p.replace('/', "-");
            Ok((format!("fixture-{name}"), std::fs::read(root.join(p))?))
        })
        .collect::<anyhow::Result<_>>()?,
        "cel" => {
            // Every selector the conformance scenarios use.
            let mut expressions = BTreeSet::new();
            for (_, text) in read_dir(&conformance, "yaml")? {
                for line in String::from_utf8_lossy(&text).lines() {
                    if let Some(e) = line.trim().strip_prefix("expression:") {
                        let e = e.trim();
                        let e = e
                            .strip_prefix('\'')
                            .and_then(|e| e.strip_suffix('\''))
                            .unwrap_or(e);
                        expressions.insert(e.to_string());
                    }
                }
            }
            expressions
                .into_iter()
                .enumerate()
                .map(|(i, e)| (format!("fixture-{i}"), e.into_bytes()))
                .collect()
        }
        _ => Vec::new(),
    })
}

/// One target's run: executions and seconds from libFuzzer's final statistics.
struct Outcome {
    target: String,
    runs: Option<u64>,
    seconds: f64,
    log: PathBuf,
    passed: bool,
}

fn executions(log: &str) -> Option<u64> {
    log.lines()
        .rev()
        .find_map(|l| l.strip_prefix("stat::number_of_executed_units:"))
        .and_then(|n| n.trim().parse().ok())
}

/// Builds and runs the fuzz targets as `args` says; fails when any finds a crash.
pub(crate) fn fuzz(root: &Path, args: &Args) -> anyhow::Result<()> {
    ensure_cargo_fuzz(root)?;
    let dir = root.join("fuzz");
    let selected = selected_targets(&dir, &args.only)?;
    crate::commands::run(&dir, "cargo", &["fuzz", "build", "-s", "none"])?;
    let bin_dir = dir.join("target").join(host_triple()?).join("release");
    let logs = dir.join("target").join("fuzz-logs");
    std::fs::create_dir_all(&logs)?;
    let runner = Runner {
        root,
        dir,
        bin_dir,
        logs,
        args,
    };
    let mut outcomes = runner.run_all(selected)?;
    outcomes.sort_by(|a, b| a.target.cmp(&b.target));
    print_table(&outcomes);
    let failed: Vec<&str> = outcomes
        .iter()
        .filter(|o| !o.passed)
        .map(|o| o.target.as_str())
        .collect();
    if !failed.is_empty() {
        bail!(
            "fuzz targets failed: {} (crash inputs under fuzz/artifacts/<target>/)",
            failed.join(", ")
        );
    }
    Ok(())
}

/// Every fuzz target, or only those `only` names (each must exist).
fn selected_targets(fuzz_dir: &Path, only: &[String]) -> anyhow::Result<Vec<String>> {
    let mut all = targets(fuzz_dir)?;
    if !only.is_empty() {
        for t in only {
            if !all.contains(t) {
                bail!("no fuzz target {t}; the targets are {}", all.join(", "));
            }
        }
        all.retain(|t| only.contains(t));
    }
    Ok(all)
}

/// Where the fuzz targets are, their binaries and logs, and how to run them.
struct Runner<'a> {
    root: &'a Path,
    /// `fuzz/`.
    dir: PathBuf,
    /// Where cargo-fuzz put the built targets.
    bin_dir: PathBuf,
    /// Where each target's output goes, as `<target>.log`.
    logs: PathBuf,
    args: &'a Args,
}

/// A fuzz target running: its process, its log file and when it started.
struct Running {
    target: String,
    child: std::process::Child,
    log: PathBuf,
    started: Instant,
}

impl Runner<'_> {
    /// Runs `targets`, `args.jobs` at a time, in the order given; returns each one's outcome.
    fn run_all(&self, targets: Vec<String>) -> anyhow::Result<Vec<Outcome>> {
        let mut pending: Vec<String> = targets.into_iter().rev().collect();
        let mut running: Vec<Running> = Vec::new();
        let mut outcomes = Vec::new();
        while !pending.is_empty() || !running.is_empty() {
            while running.len() < self.args.jobs.max(1)
                && let Some(target) = pending.pop()
            {
                running.push(self.start(target)?);
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
            let mut i = 0;
            while i < running.len() {
                if let Some(status) = running[i].child.try_wait()? {
                    outcomes.push(finished(running.swap_remove(i), status));
                } else {
                    i += 1;
                }
            }
        }
        Ok(outcomes)
    }

    /// Seeds `target`'s corpus from the fixtures and starts it, its output going to its log.
    fn start(&self, target: String) -> anyhow::Result<Running> {
        let dir = &self.dir;
        let corpus = dir.join("corpus").join(&target);
        std::fs::create_dir_all(&corpus)?;
        for (name, bytes) in fixture_seeds(self.root, &target)? {
            let path = corpus.join(name);
            if !path.exists() {
                std::fs::write(path, bytes)?;
            }
        }
        let artifacts = dir.join("artifacts").join(&target);
        std::fs::create_dir_all(&artifacts)?;
        let log = self.logs.join(format!("{target}.log"));
        let mut cmd = Command::new(self.bin_dir.join(&target));
        cmd.arg(&corpus);
        let seeds = dir.join("seeds").join(&target);
        if seeds.is_dir() {
            cmd.arg(&seeds);
        }
        cmd.arg(format!("-max_total_time={}", self.args.seconds))
            .arg(format!("-timeout={INPUT_TIMEOUT_S}"))
            .arg("-print_final_stats=1")
            .arg(format!("-artifact_prefix={}/", artifacts.display()));
        if let Some(runs) = self.args.runs {
            cmd.arg(format!("-runs={runs}"));
        }
        let file = std::fs::File::create(&log)?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .with_context(|| format!("start fuzz target {target}"))?;
        eprintln!("fuzzing {target} for up to {} s", self.args.seconds);
        Ok(Running {
            target,
            child,
            log,
            started: Instant::now(),
        })
    }
}

/// The outcome of a target that exited with `status`; a failure prints the end of its log.
fn finished(run: Running, status: std::process::ExitStatus) -> Outcome {
    let text = std::fs::read_to_string(&run.log).unwrap_or_default();
    let outcome = Outcome {
        runs: executions(&text),
        seconds: run.started.elapsed().as_secs_f64(),
        passed: status.success(),
        target: run.target,
        log: run.log,
    };
    if !outcome.passed {
        eprintln!(
            "fuzz target {} failed ({status}); its log, {}, ends:\n{}",
            outcome.target,
            outcome.log.display(),
            text.lines()
                .rev()
                .take(30)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    outcome
}

/// Prints each target's executions, seconds and executions per second.
fn print_table(outcomes: &[Outcome]) {
    eprintln!(
        "\n{:<24} {:>14} {:>9} {:>10}  result",
        "target", "executions", "seconds", "exec/s"
    );
    for o in outcomes {
        let runs = o.runs.map_or("?".to_string(), |r| r.to_string());
        let rate = o.runs.map_or("?".to_string(), |r| {
            format!("{:.0}", r as f64 / o.seconds.max(0.001))
        });
        eprintln!(
            "{:<24} {:>14} {:>9.0} {:>10}  {}",
            o.target,
            runs,
            o.seconds,
            rate,
            if o.passed { "no crash" } else { "FAILED" }
        );
    }
}
