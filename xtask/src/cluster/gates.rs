//! The API server emulator's feature gates against the real release's: every gate the testkit's
//! emulator models, at every release it models up to the cluster's, must have the stage, the
//! default and the lock that `pkg/features/kube_features.go` of the `k8s.io/kubernetes` module
//! the cluster is built from declares. The emulator's per-release field drops and validation
//! follow these gates, so a wrong one makes every test against it answer as no real server does.

use std::path::Path;
use std::process::Command;

use anyhow::{Context as _, bail};
use kubedev_testkit::apiserver::{FeatureGates, FeatureStage, KubeRelease};

/// One entry of a gate's versioned spec: from `since` (a minor of 1.x) on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct UpstreamStage {
    pub(super) since: u32,
    pub(super) stage: FeatureStage,
    pub(super) default: bool,
    pub(super) locked: bool,
}

/// Compares the emulator with the Kubernetes module of `version` under `tools/cluster`; fails
/// naming every gate and release where they differ.
pub(crate) fn check(root: &Path, version: &str) -> anyhow::Result<()> {
    let version = version.trim_start_matches('v');
    let module = root
        .join("tools/cluster")
        .join(format!("kubernetes-v{version}"));
    let out = Command::new("go")
        .args(["list", "-m", "-f", "{{.Dir}}", "k8s.io/kubernetes"])
        .current_dir(&module)
        .env("GOTOOLCHAIN", super::build::go_toolchain(&module)?)
        .env("GOFLAGS", "-mod=readonly")
        .output()
        .with_context(|| format!("running `go list -m` in {}", module.display()))?;
    if !out.status.success() {
        bail!(
            "`go list -m k8s.io/kubernetes` in {} failed: {}",
            module.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let dir = String::from_utf8(out.stdout)?.trim().to_string();
    let file = Path::new(&dir).join("pkg/features/kube_features.go");
    let text =
        std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
    let minor: u32 = version
        .strip_prefix("1.")
        .and_then(|v| v.split('.').next())
        .and_then(|m| m.parse().ok())
        .with_context(|| format!("{version} is not a 1.x version"))?;
    let releases: Vec<KubeRelease> = KubeRelease::ALL
        .into_iter()
        .filter(|r| r.minor() <= minor)
        .collect();
    let differences = compare(&text, &releases)?;
    if !differences.is_empty() {
        bail!(
            "the API server emulator's feature gates differ from Kubernetes {version}'s ({}):\n  {}",
            file.display(),
            differences.join("\n  ")
        );
    }
    eprintln!(
        "the emulator's {} feature gates agree with Kubernetes {version} at {}",
        FeatureGates::modelled().len(),
        releases
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(())
}

/// Every difference between the emulator and `kube_features.go`'s text at `releases`.
pub(super) fn compare(text: &str, releases: &[KubeRelease]) -> anyhow::Result<Vec<String>> {
    let mut differences = Vec::new();
    for gate in FeatureGates::modelled() {
        let history = versioned_spec(text, gate)?;
        for &release in releases {
            let upstream = history
                .iter()
                .rev()
                .find(|s| s.since <= release.minor())
                .map(|s| (s.stage, s.default, s.locked));
            let gates = release.default_feature_gates();
            let emulator = gates
                .stage(gate)
                .zip(gates.get(gate))
                .map(|(stage, default)| (stage, default, gates.locked(gate)));
            if upstream != emulator {
                differences.push(format!(
                    "{gate} in {release}: upstream {}, the emulator {}",
                    describe(upstream),
                    describe(emulator)
                ));
            }
        }
    }
    Ok(differences)
}

fn describe(stage: Option<(FeatureStage, bool, bool)>) -> String {
    match stage {
        None => "does not have it".into(),
        Some((stage, default, locked)) => format!(
            "{stage:?}, {}{}",
            if default { "on" } else { "off" },
            if locked { ", locked" } else { "" }
        ),
    }
}

/// The versioned spec of `gate` in `kube_features.go`: the lines `\t<gate>: {` up to `\t},`,
/// one `{Version: version.MustParse("1.N"), Default: …, PreRelease: featuregate.…}` each.
pub(super) fn versioned_spec(text: &str, gate: &str) -> anyhow::Result<Vec<UpstreamStage>> {
    let head = format!("\t{gate}: {{");
    let mut lines = text.lines().skip_while(|l| l.trim_end() != head);
    if lines.next().is_none() {
        bail!("kube_features.go has no versioned spec for {gate}");
    }
    let mut history = Vec::new();
    for line in lines.take_while(|l| l.trim_end() != "\t},") {
        let line = line.trim();
        if line.is_empty() || line.starts_with("//") {
            continue;
        }
        let field = |name: &str| -> Option<&str> {
            let rest = &line[line.find(name)? + name.len()..];
            Some(rest.split([',', '}']).next()?.trim())
        };
        let since = field("Version: version.MustParse(")
            .and_then(|v| v.trim_matches(|c| c == '"' || c == ')').strip_prefix("1."))
            .and_then(|m| m.parse().ok());
        let stage = match field("PreRelease: featuregate.") {
            Some("Alpha") => Some(FeatureStage::Alpha),
            Some("Beta") => Some(FeatureStage::Beta),
            Some("GA") => Some(FeatureStage::Ga),
            _ => None,
        };
        let default = match field("Default:") {
            Some("true") => Some(true),
            Some("false") => Some(false),
            _ => None,
        };
        let (Some(since), Some(stage), Some(default)) = (since, stage, default) else {
            bail!("{gate}: cannot read the versioned spec line {line:?}");
        };
        history.push(UpstreamStage {
            since,
            stage,
            default,
            locked: field("LockToDefault:") == Some("true"),
        });
    }
    if history.is_empty() {
        bail!("{gate}: its versioned spec in kube_features.go lists no version");
    }
    Ok(history)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A versioned spec as kube_features.go writes one, with a comment and a second gate after.
    const SPEC: &str = "var defaultVersionedKubernetesFeatureGates = map[featuregate.Feature]featuregate.VersionedSpecs{\n\
        \tDRAExample: {\n\
        \t\t{Version: version.MustParse(\"1.34\"), Default: false, PreRelease: featuregate.Alpha},\n\
        \t\t// promoted\n\
        \t\t{Version: version.MustParse(\"1.36\"), Default: true, PreRelease: featuregate.Beta},\n\
        \t\t{Version: version.MustParse(\"1.38\"), Default: true, PreRelease: featuregate.GA, LockToDefault: true}, // remove in 1.41\n\
        \t},\n\
        \n\
        \tDRAOther: {\n\
        \t\t{Version: version.MustParse(\"1.36\"), Default: false, PreRelease: featuregate.Alpha},\n\
        \t},\n\
        }\n";

    #[test]
    fn a_versioned_spec_is_read_line_by_line_with_its_lock() {
        let h = versioned_spec(SPEC, "DRAExample").unwrap();
        let read: Vec<(u32, FeatureStage, bool, bool)> = h
            .iter()
            .map(|s| (s.since, s.stage, s.default, s.locked))
            .collect();
        assert_eq!(
            read,
            vec![
                (34, FeatureStage::Alpha, false, false),
                (36, FeatureStage::Beta, true, false),
                (38, FeatureStage::Ga, true, true),
            ]
        );
        assert_eq!(versioned_spec(SPEC, "DRAOther").unwrap().len(), 1);
        let err = versioned_spec(SPEC, "DRAMissing").unwrap_err().to_string();
        assert!(err.contains("no versioned spec for DRAMissing"), "{err}");
        let garbled = SPEC.replace("Default: true, PreRelease: featuregate.Beta", "Beta");
        let err = versioned_spec(&garbled, "DRAExample")
            .unwrap_err()
            .to_string();
        assert!(err.contains("cannot read"), "{err}");
    }

    #[test]
    fn a_gate_the_emulator_gets_wrong_is_named_with_both_sides() {
        // Every modelled gate, alpha and off from 1.34: wrong for the emulator's 1.37 on most.
        let text: String = FeatureGates::modelled()
            .iter()
            .map(|g| {
                format!(
                    "\t{g}: {{\n\t\t{{Version: version.MustParse(\"1.34\"), Default: false, PreRelease: featuregate.Alpha}},\n\t}},\n"
                )
            })
            .collect();
        let differences = compare(&text, &[KubeRelease::V1_37]).unwrap();
        assert!(
            differences
                .iter()
                .any(|d| d == "DRADeviceTaints in 1.37: upstream Alpha, off, the emulator Ga, on"),
            "{differences:?}"
        );
    }
}
