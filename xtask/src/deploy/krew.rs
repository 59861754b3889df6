//! The krew plugin manifest, `deploy/krew/kubedev.yaml`: a krew `Plugin` whose version is the
//! workspace's, and whose every platform installs the release archive's binary under the name
//! its `bin` gives, `kubectl-kubedev` (the name under which kubedev answers as a kubectl plugin).

use std::path::Path;

use anyhow::Context as _;
use serde_json::Value;

/// The manifest, relative to the workspace root.
pub(super) const MANIFEST: &str = "deploy/krew/kubedev.yaml";

/// The executable krew links onto `PATH`.
const BIN: &str = "kubectl-kubedev";

/// The problems of the manifest under `root`; `metadata` is `cargo metadata`'s output, which
/// gives the kubedev crate's version.
pub(super) fn check(root: &Path, metadata: &Value) -> anyhow::Result<Vec<String>> {
    let path = root.join(MANIFEST);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let manifest: Value =
        serde_saphyr::from_str(&text).with_context(|| format!("{MANIFEST}: not valid YAML"))?;
    let version = metadata["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == "kubedev")
        .and_then(|p| p["version"].as_str())
        .context("cargo metadata names no kubedev package")?;
    Ok(problems(&manifest, version)
        .into_iter()
        .map(|p| format!("{MANIFEST}: {p}"))
        .collect())
}

/// What is wrong with `manifest` for kubedev at `version`.
fn problems(manifest: &Value, version: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut expect = |pointer: &str, wanted: &str| {
        if manifest.pointer(pointer).and_then(Value::as_str) != Some(wanted) {
            out.push(format!(
                "{pointer} must be {wanted:?}, is {}",
                manifest.pointer(pointer).unwrap_or(&Value::Null)
            ));
        }
    };
    expect(
        "/apiVersion",
        "krew.googlecontainertools.github.com/v1alpha2",
    );
    expect("/kind", "Plugin");
    expect("/metadata/name", "kubedev");
    expect("/spec/version", &format!("v{version}"));
    for field in ["homepage", "shortDescription", "description"] {
        let text = manifest["spec"][field].as_str().unwrap_or_default();
        if text.trim().is_empty() {
            out.push(format!("spec.{field} is missing or empty"));
        }
    }
    let platforms = manifest["spec"]["platforms"].as_array();
    if platforms.is_none_or(Vec::is_empty) {
        out.push("spec.platforms lists no platform".into());
    }
    for (i, platform) in platforms.into_iter().flatten().enumerate() {
        for p in platform_problems(platform, version) {
            out.push(format!("spec.platforms[{i}]: {p}"));
        }
    }
    out
}

/// What is wrong with one platform of the manifest.
fn platform_problems(platform: &Value, version: &str) -> Vec<String> {
    let mut out = Vec::new();
    let labels = &platform["selector"]["matchLabels"];
    let os = labels["os"].as_str().unwrap_or_default();
    if os.is_empty() || labels["arch"].as_str().unwrap_or_default().is_empty() {
        out.push("selector.matchLabels must name an os and an arch".into());
    }
    let uri = platform["uri"].as_str().unwrap_or_default();
    if !uri.starts_with("https://") || !uri.contains(&format!("v{version}")) {
        out.push(format!(
            "uri {uri:?} must be an https:// address of the v{version} release"
        ));
    }
    let sha = platform["sha256"].as_str().unwrap_or_default();
    if sha.len() != 64
        || !sha
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        out.push(format!("sha256 {sha:?} is not 64 lowercase hex digits"));
    }
    let bin = platform["bin"].as_str().unwrap_or_default();
    let wanted = if os == "windows" {
        format!("{BIN}.exe")
    } else {
        BIN.to_string()
    };
    if bin != wanted {
        out.push(format!("bin must be {wanted:?}, is {bin:?}"));
    }
    let files = platform["files"].as_array();
    let installs_bin = files.into_iter().flatten().any(|f| {
        let (from, to) = (f["from"].as_str().unwrap_or_default(), f["to"].as_str());
        to == Some(bin) || (matches!(to, Some(".") | None) && from == bin)
    });
    if !installs_bin {
        out.push(format!(
            "files must give the binary the name bin says, {bin:?} (e.g. from: kubedev, to: {bin})"
        ));
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn manifest() -> Value {
        let text = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("..")
                .join(MANIFEST),
        )
        .unwrap();
        serde_saphyr::from_str(&text).unwrap()
    }

    #[test]
    fn the_manifest_in_the_tree_is_sound_for_its_version() {
        let m = manifest();
        let version = m["spec"]["version"]
            .as_str()
            .unwrap()
            .trim_start_matches('v');
        assert_eq!(problems(&m, version), Vec::<String>::new());
        let wrong = problems(&m, "9.9.9");
        assert!(
            wrong.iter().any(|p| p.contains("/spec/version")),
            "{wrong:?}"
        );
    }

    #[test]
    fn a_binary_left_under_its_archive_name_or_a_bad_hash_is_reported() {
        let mut m = manifest();
        let version = m["spec"]["version"]
            .as_str()
            .unwrap()
            .trim_start_matches('v')
            .to_string();
        m["spec"]["platforms"][0]["files"] = serde_json::json!([{"from": "kubedev", "to": "."}]);
        m["spec"]["platforms"][0]["sha256"] = serde_json::json!("ABC");
        m["spec"]["platforms"][1]["bin"] = serde_json::json!("kubedev");
        let found = problems(&m, &version);
        assert!(
            found
                .iter()
                .any(|p| p.starts_with("spec.platforms[0]: files")),
            "{found:?}"
        );
        assert!(
            found
                .iter()
                .any(|p| p.starts_with("spec.platforms[0]: sha256")),
            "{found:?}"
        );
        assert!(
            found
                .iter()
                .any(|p| p.starts_with("spec.platforms[1]: bin")),
            "{found:?}"
        );
    }
}
