//! The peer: `tools/allocsim`, built for one Kubernetes release, one process answering one
//! scenario per line.

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use anyhow::{Context as _, bail, ensure};
use kubedev_allocator::Scenario;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Outcome, normalise};

/// The release CI compares with: the newest GA release the module proxy serves.
pub(crate) const DEFAULT_RELEASE: &str = "1.37.2";

/// Upstream's allocator, running.
pub(crate) struct Upstream {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    release: String,
    next_id: u64,
}

/// Upstream's timing of one scenario (process CPU, median per run).
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Timing {
    /// Warm `Allocate`, nanoseconds.
    pub(crate) allocate_cpu_ns: u64,
    /// A fresh allocator over all slices plus one `Allocate`, nanoseconds.
    pub(crate) build_allocate_cpu_ns: u64,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Answer {
    id: String,
    outcome: String,
    #[serde(default)]
    error: String,
    #[serde(default)]
    allocations: Vec<Value>,
    #[serde(default)]
    steps: u64,
    timing: Option<Timing>,
}

/// The Go module's build settings for `release`: its go.mod (`go.mod` for the default,
/// `<release>.mod` beside it otherwise) and its build tags.
fn module_files(dir: &Path, release: &str) -> anyhow::Result<(Option<PathBuf>, &'static str)> {
    if release == DEFAULT_RELEASE {
        // The default's release line picks its source files too (when 1.38 becomes the
        // default, go.mod is 1.38's and needs its tag).
        return Ok((None, release_tag(release)));
    }
    let modfile = dir.join(format!("v{release}.mod"));
    ensure!(
        modfile.exists(),
        "no allocator peer for Kubernetes {release}: tools/allocsim has go.mod ({DEFAULT_RELEASE}) \
         and v<release>.mod files for: {}",
        known(dir).join(", ")
    );
    Ok((Some(modfile), release_tag(release)))
}

/// The build tag of the source files of a release line.
fn release_tag(release: &str) -> &'static str {
    if release.starts_with("1.38") {
        "dra038"
    } else {
        ""
    }
}

/// The `k8s.io` modules allocsim requires at the staging version of its release.
const STAGING: [&str; 4] = [
    "k8s.io/api",
    "k8s.io/apimachinery",
    "k8s.io/client-go",
    "k8s.io/dynamic-resource-allocation",
];

/// Fails unless allocsim's module file `path` (text `go_mod`) is `release`'s: a module left at
/// another release would run under this one's name.
fn check_module(go_mod: &str, path: &Path, release: &str) -> anyhow::Result<()> {
    crate::gomod::check_release(go_mod, &path.display().to_string(), release, &STAGING)
        .with_context(|| {
            format!(
                "tools/allocsim/go.mod is the module of the default release ({DEFAULT_RELEASE}), \
                 and v<release>.mod beside it that of each other release: {} does not fit \
                 Kubernetes {release}",
                path.display()
            )
        })
}

fn known(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            Some(name.strip_prefix('v')?.strip_suffix(".mod")?.to_string())
        })
        .collect();
    v.sort();
    v
}

/// Builds `tools/allocsim` for `release` into the target directory (Go's build cache makes a
/// second build a second).
pub(crate) fn build(root: &Path, release: &str) -> anyhow::Result<PathBuf> {
    let dir = root.join("tools/allocsim");
    let (modfile, tags) = module_files(&dir, release)?;
    let out = crate::commands::target_dir(root)
        .join("allocsim")
        .join(format!("allocsim-{release}"));
    // A release whose module names a newer Go than the machine's (`toolchain go1.27.3`) gets
    // it from the module proxy: the machine's GOTOOLCHAIN may say `local`.
    let go_mod_path = modfile.clone().unwrap_or_else(|| dir.join("go.mod"));
    let go_mod = std::fs::read_to_string(&go_mod_path)
        .with_context(|| format!("reading {}", go_mod_path.display()))?;
    check_module(&go_mod, &go_mod_path, release)?;
    let toolchain = crate::gomod::toolchain(&go_mod).unwrap_or("local");
    let mut cmd = Command::new("go");
    cmd.arg("build").arg("-trimpath");
    if let Some(modfile) = &modfile {
        cmd.arg(format!("-modfile={}", modfile.display()));
    }
    if !tags.is_empty() {
        cmd.args(["-tags", tags]);
    }
    let output = cmd
        .arg("-o")
        .arg(&out)
        .arg(".")
        .current_dir(&dir)
        // The module's go.sum is the truth: never let a build rewrite it.
        .env("GOFLAGS", "-mod=readonly -buildvcs=false")
        .env("CGO_ENABLED", "0")
        .env("GOTOOLCHAIN", toolchain)
        .output()
        .context(
            "`go` is not on PATH: the differential test builds upstream's allocator from Go \
             modules (Go 1.26 or newer)",
        )?;
    if !output.status.success() {
        let printed: Vec<String> = String::from_utf8_lossy(&output.stderr)
            .lines()
            .filter(|l| !l.starts_with("go: downloading "))
            .map(str::to_string)
            .collect();
        bail!(
            "building tools/allocsim for Kubernetes {release} failed ({}):\n{}",
            output.status,
            printed.join("\n")
        );
    }
    Ok(out)
}

impl Upstream {
    /// Builds and starts the peer for `release`.
    pub(crate) fn start(root: &Path, release: &str) -> anyhow::Result<Upstream> {
        let bin = build(root, release)?;
        let mut child = Command::new(&bin)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let stdin = child.stdin.take().context("allocsim's stdin")?;
        let stdout = BufReader::new(child.stdout.take().context("allocsim's stdout")?);
        Ok(Upstream {
            child,
            stdin,
            stdout,
            release: release.to_string(),
            next_id: 0,
        })
    }

    /// Which allocator this is.
    pub(crate) fn describe(&self) -> String {
        format!(
            "k8s.io/dynamic-resource-allocation of Kubernetes {} (tools/allocsim)",
            self.release
        )
    }

    fn ask(&mut self, scenario: &Scenario, repeat: u64) -> anyhow::Result<Answer> {
        self.next_id += 1;
        let id = self.next_id.to_string();
        let request = json!({"id": id, "scenario": scenario, "repeat": repeat});
        let mut line = serde_json::to_string(&request)?;
        line.push('\n');
        self.stdin
            .write_all(line.as_bytes())
            .and_then(|()| self.stdin.flush())
            .context("writing to allocsim")?;
        let mut reply = String::new();
        let n = self
            .stdout
            .read_line(&mut reply)
            .context("reading from allocsim")?;
        ensure!(n > 0, "allocsim exited without answering");
        let answer: Answer =
            serde_json::from_str(&reply).with_context(|| format!("allocsim's answer {reply:?}"))?;
        ensure!(answer.id == id, "allocsim answered {} for {id}", answer.id);
        ensure!(
            answer.outcome != "badRequest",
            "allocsim could not read the scenario: {}",
            answer.error
        );
        Ok(answer)
    }

    /// Upstream's answer for a scenario.
    pub(crate) fn allocate(&mut self, scenario: &Scenario) -> anyhow::Result<Outcome> {
        let answer = self.ask(scenario, 0)?;
        outcome(answer)
    }

    /// Upstream's answer, its search steps and its timing over `repeat` runs.
    pub(crate) fn time(
        &mut self,
        scenario: &Scenario,
        repeat: u64,
    ) -> anyhow::Result<(Outcome, u64, Timing)> {
        let mut answer = self.ask(scenario, repeat)?;
        let timing = answer.timing.take().context("allocsim sent no timing")?;
        let steps = answer.steps;
        Ok((outcome(answer)?, steps, timing))
    }

    /// Stops the peer.
    pub(crate) fn finish(mut self) -> anyhow::Result<()> {
        drop(self.stdin);
        let status = self.child.wait()?;
        ensure!(status.success(), "allocsim exited with {status}");
        Ok(())
    }
}

fn outcome(answer: Answer) -> anyhow::Result<Outcome> {
    Ok(match answer.outcome.as_str() {
        "allocated" => Outcome::Allocated(answer.allocations.into_iter().map(normalise).collect()),
        "unsatisfiable" => Outcome::Unsatisfiable,
        "failedOnNode" => Outcome::FailedOnNode(answer.error),
        "error" => Outcome::Error(answer.error),
        "panic" => Outcome::Panic(answer.error),
        other => bail!("allocsim answered an unknown outcome {other:?}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every module file of tools/allocsim is the release it is used for: go.mod the default
    /// release's, each v<release>.mod that release's (so a release day that names a new default
    /// without moving the files fails here, before any Go build).
    #[test]
    fn each_module_file_is_its_releases() -> anyhow::Result<()> {
        let dir = crate::commands::workspace_root()?.join("tools/allocsim");
        let default = dir.join("go.mod");
        check_module(
            &std::fs::read_to_string(&default)?,
            &default,
            DEFAULT_RELEASE,
        )?;
        let others = known(&dir);
        assert!(!others.is_empty(), "no v<release>.mod in {}", dir.display());
        for release in others {
            let path = dir.join(format!("v{release}.mod"));
            check_module(&std::fs::read_to_string(&path)?, &path, &release)?;
        }
        Ok(())
    }
}
