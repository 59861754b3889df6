//! `kubedev policy check`: load a module, check the contract, run the sample requests and
//! report what they cost.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::PolicyError;
use crate::limits::Limits;
use crate::policy::{Evaluation, WasmPolicy};
use crate::samples::{self, Sample};
use crate::sandbox::{Sandbox, check_magic, policy_name, read_module};

/// Checks the policy module at `path` in a sandbox with the default [`Limits`]. A module
/// that cannot be read, compiled or that breaks the contract is an error; failures on the
/// sample requests are part of the report.
pub fn check(path: impl AsRef<Path>) -> Result<CheckReport, PolicyError> {
    Sandbox::new(Limits::default())?.check_file(path.as_ref())
}

/// The outcome of [`check`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct CheckReport {
    /// Policy name.
    pub name: String,
    /// The file checked, if any.
    pub path: Option<PathBuf>,
    /// SHA-256 of the module, hex.
    pub digest: String,
    /// Module size, bytes.
    pub module_bytes: usize,
    /// Compile time.
    pub compile_time: Duration,
    /// The module imports `kubedev.log`.
    pub imports_log: bool,
    /// The limits the samples ran under.
    pub limits: Limits,
    /// One entry per sample request.
    pub samples: Vec<SampleReport>,
    /// The first sample gave the same answer and used the same fuel when run again.
    pub deterministic: bool,
}

/// One sample request and how the policy answered it.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct SampleReport {
    /// Sample name.
    pub name: String,
    /// What the sample node looks like.
    pub about: String,
    /// Number of candidates.
    pub candidates: usize,
    /// Devices wanted.
    pub count: usize,
    /// The answer, or why there was none.
    pub outcome: Result<SampleRun, PolicyError>,
}

/// A successful sample call.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct SampleRun {
    /// Device names, most preferred first (rejected ones last).
    pub order: Vec<String>,
    /// Rejected devices and the reasons.
    pub rejected: Vec<(String, String)>,
    /// Fuel used.
    pub fuel_used: u64,
    /// Largest linear memory, bytes.
    pub memory_bytes: usize,
    /// Wall time including instantiating or restoring the instance.
    pub elapsed: Duration,
    /// Log lines written.
    pub log: Vec<String>,
}

impl CheckReport {
    /// True when every sample was answered and the answers are deterministic.
    pub fn passed(&self) -> bool {
        self.deterministic && self.samples.iter().all(|s| s.outcome.is_ok())
    }

    /// Most fuel any sample used.
    pub fn max_fuel(&self) -> u64 {
        self.runs().map(|r| r.fuel_used).max().unwrap_or(0)
    }

    /// Largest memory any sample used, bytes.
    pub fn max_memory(&self) -> usize {
        self.runs().map(|r| r.memory_bytes).max().unwrap_or(0)
    }

    fn runs(&self) -> impl Iterator<Item = &SampleRun> {
        self.samples.iter().filter_map(|s| s.outcome.as_ref().ok())
    }
}

fn run_sample(policy: &WasmPolicy, sample: &Sample) -> Result<Evaluation, PolicyError> {
    policy.evaluate(&sample.input())
}

/// Runs every sample; the first failure is returned (used to validate hot reloads).
pub(crate) fn validate(policy: &WasmPolicy) -> Result<(), PolicyError> {
    for s in samples::all() {
        run_sample(policy, &s)?;
    }
    Ok(())
}

impl Sandbox {
    /// [`check`] in this sandbox, of a file.
    pub fn check_file(&self, path: &Path) -> Result<CheckReport, PolicyError> {
        let bytes = read_module(path, self.limits().max_module_bytes)?;
        check_magic(path, &bytes)?;
        let mut report = self.check(&policy_name(path), &bytes)?;
        report.path = Some(path.to_path_buf());
        Ok(report)
    }

    /// [`check`] in this sandbox, of module bytes.
    pub fn check(&self, name: &str, wasm: &[u8]) -> Result<CheckReport, PolicyError> {
        let policy = self.load(name, wasm)?;
        let samples = samples::all();
        let mut reports = Vec::with_capacity(samples.len());
        let mut first: Option<Evaluation> = None;
        for s in &samples {
            let outcome = run_sample(&policy, s).map(|e| {
                let names = |i: usize| s.devices[i].name.clone();
                let run = SampleRun {
                    order: e.decision.preference().into_iter().map(names).collect(),
                    rejected: e
                        .decision
                        .rejections
                        .iter()
                        .map(|r| (names(r.index), r.reason.clone()))
                        .collect(),
                    fuel_used: e.fuel_used,
                    memory_bytes: e.memory_bytes,
                    elapsed: e.elapsed,
                    log: e.log.clone(),
                };
                if first.is_none() {
                    first = Some(e);
                }
                run
            });
            reports.push(SampleReport {
                name: s.name.to_string(),
                about: s.about.to_string(),
                candidates: s.devices.len(),
                count: s.count,
                outcome,
            });
        }
        let deterministic = match (&first, samples.first()) {
            (Some(a), Some(s)) => run_sample(&policy, s)
                .is_ok_and(|b| a.decision == b.decision && a.fuel_used == b.fuel_used),
            _ => false,
        };
        Ok(CheckReport {
            name: policy.name().to_string(),
            path: None,
            digest: policy.digest(),
            module_bytes: policy.module_bytes(),
            compile_time: policy.compile_time(),
            imports_log: policy.imports_log(),
            limits: self.limits().clone(),
            samples: reports,
            deterministic,
        })
    }
}

fn bytes(n: usize) -> String {
    if n >= 1 << 20 {
        format!("{:.1} MiB", n as f64 / (1 << 20) as f64)
    } else if n >= 1 << 10 {
        format!("{:.1} KiB", n as f64 / 1024.0)
    } else {
        format!("{n} B")
    }
}

impl fmt::Display for CheckReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.path {
            Some(p) => writeln!(f, "policy {} ({})", self.name, p.display())?,
            None => writeln!(f, "policy {}", self.name)?,
        }
        writeln!(
            f,
            "  module         {}, sha256 {}, compiled in {:.1?}",
            bytes(self.module_bytes),
            self.digest,
            self.compile_time
        )?;
        writeln!(
            f,
            "  contract       ABI version {}, imports: {}",
            crate::abi::ABI_VERSION,
            if self.imports_log {
                "kubedev.log"
            } else {
                "none"
            }
        )?;
        writeln!(
            f,
            "  limits         fuel {} per call, memory {}, wall clock {:?}",
            self.limits.fuel,
            bytes(self.limits.memory_bytes),
            self.limits.timeout
        )?;
        for s in &self.samples {
            write!(
                f,
                "  sample {} ({} candidates, {} wanted): ",
                s.name, s.candidates, s.count
            )?;
            match &s.outcome {
                Ok(r) => {
                    writeln!(
                        f,
                        "ok, fuel {} ({:.2}% of the limit), memory {}, {:.1?}",
                        r.fuel_used,
                        r.fuel_used as f64 * 100.0 / self.limits.fuel as f64,
                        bytes(r.memory_bytes),
                        r.elapsed
                    )?;
                    writeln!(f, "      {}", s.about)?;
                    let shown: Vec<&str> = r.order.iter().take(12).map(String::as_str).collect();
                    let more = if r.order.len() > shown.len() {
                        format!(" … ({} more)", r.order.len() - shown.len())
                    } else {
                        String::new()
                    };
                    writeln!(f, "      order: {}{more}", shown.join(" "))?;
                    for (name, reason) in &r.rejected {
                        writeln!(f, "      rejected {name}: {reason}")?;
                    }
                    for line in &r.log {
                        writeln!(f, "      log: {line}")?;
                    }
                }
                Err(e) => writeln!(f, "FAILED: {e}")?,
            }
        }
        writeln!(
            f,
            "  deterministic  {}",
            if self.deterministic {
                "yes (same answer and fuel when run again)"
            } else {
                "NO"
            }
        )?;
        write!(
            f,
            "  result         {} (max fuel {}, max memory {})",
            if self.passed() { "PASS" } else { "FAIL" },
            self.max_fuel(),
            bytes(self.max_memory())
        )
    }
}
