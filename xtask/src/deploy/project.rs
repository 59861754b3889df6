//! The project's address and license, said once: the address is `[workspace.package]
//! repository` in the root `Cargo.toml`, the license the kubedev crate's. Every other place that
//! names either must agree, so that a fork or a publisher changes one line:
//!
//! - every package of the workspace that may be published inherits both (`cargo metadata`
//!   reports them per package);
//! - the project's other workspaces (`plugins/`, `tools/cdi-chroot`, `examples/vendor-driver`)
//!   carry the same license, and the address where they name one;
//! - `LICENSE` at the root holds that license's text;
//! - the krew manifest's `homepage` is the address and each platform's archive lies under its
//!   `releases/download/`;
//! - the chart's default `metrics.prometheusRule.runbookBaseUrl` lies under the address.
//!
//! (The image's `org.opencontainers.image.source` label is checked with the image.)
//! `cargo xtask deploy-check --write` rewrites the krew manifest, the chart's values and the
//! Dockerfile from the address the krew manifest had to the workspace's.

use std::path::Path;

use anyhow::Context as _;
use serde_json::Value;

use super::image::workspace_package_key;
use super::krew;

/// The chart's default values, relative to the workspace root.
const VALUES: &str = "deploy/helm/kubedev/values.yaml";
/// The image definition, relative to the workspace root.
const DOCKERFILE: &str = "deploy/Dockerfile";
/// The project's workspaces besides the root one, whose manifests name the license.
const OTHER_MANIFESTS: &[&str] = &[
    "plugins/Cargo.toml",
    "tools/cdi-chroot/Cargo.toml",
    "examples/vendor-driver/Cargo.toml",
];
/// The files `--write` moves to a new address.
const REWRITTEN: &[&str] = &[krew::MANIFEST, VALUES, DOCKERFILE];

/// What the workspace says the project is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Project {
    /// `[workspace.package] repository`.
    pub(super) url: String,
    /// The kubedev crate's license (an SPDX expression).
    pub(super) license: String,
}

/// The problems of the project's address and license under `root`, with `metadata` from
/// `cargo metadata`; with `write`, the files of [`REWRITTEN`] are first moved to the
/// workspace's address.
pub(super) fn check(root: &Path, metadata: &Value, write: bool) -> anyhow::Result<Vec<String>> {
    let read = |rel: &str| {
        std::fs::read_to_string(root.join(rel)).with_context(|| format!("reading {rel}"))
    };
    let manifest = read("Cargo.toml")?;
    let packages = metadata["packages"].as_array().cloned().unwrap_or_default();
    let license = packages
        .iter()
        .find(|p| p["name"] == "kubedev")
        .and_then(|p| p["license"].as_str())
        .context("cargo metadata names no kubedev package, or it has no license")?;
    let project = Project {
        url: workspace_package_key(&manifest, "repository").unwrap_or_default(),
        license: license.to_string(),
    };
    if write {
        rewrite(root, &project.url)?;
    }
    let mut out = members(metadata, &project);
    for rel in OTHER_MANIFESTS {
        out.extend(other_workspace(rel, &read(rel)?, &project));
    }
    out.extend(license_file(
        std::fs::read_to_string(root.join("LICENSE"))
            .ok()
            .as_deref(),
        &project,
    ));
    let krew: Value = serde_saphyr::from_str(&read(krew::MANIFEST)?)
        .with_context(|| format!("{}: not valid YAML", krew::MANIFEST))?;
    out.extend(krew_links(&krew, &project));
    let values: Value = serde_saphyr::from_str(&read(VALUES)?)
        .with_context(|| format!("{VALUES}: not valid YAML"))?;
    out.extend(runbook(&values, &project));
    Ok(out)
}

/// Each workspace member that may be published (`publish` not `false`) whose repository or
/// license is not the project's.
fn members(metadata: &Value, project: &Project) -> Vec<String> {
    let ids: Vec<&str> = metadata["workspace_members"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let mut out = Vec::new();
    if project.url.is_empty() {
        out.push("Cargo.toml: [workspace.package] names no repository".to_string());
    }
    for p in metadata["packages"].as_array().into_iter().flatten() {
        let unpublished = p["publish"].as_array().is_some_and(Vec::is_empty);
        if unpublished || !ids.contains(&p["id"].as_str().unwrap_or_default()) {
            continue;
        }
        let name = p["name"].as_str().unwrap_or_default();
        for (key, want) in [("repository", &project.url), ("license", &project.license)] {
            let have = p[key].as_str().unwrap_or_default();
            if have != want {
                out.push(format!(
                    "package {name}: {key} is {have:?}, not the workspace's {want:?} (write \
                     `{key}.workspace = true`)"
                ));
            }
        }
    }
    out
}

/// A manifest of another workspace of the project whose license (package or workspace
/// package) is not the project's, or whose repository, where it names one, is another.
fn other_workspace(rel: &str, text: &str, project: &Project) -> Vec<String> {
    let Ok(manifest) = text.parse::<toml::Table>() else {
        return vec![format!("{rel}: not valid TOML")];
    };
    let tables = [
        manifest.get("workspace").and_then(|w| w.get("package")),
        manifest.get("package"),
    ];
    let mut out = Vec::new();
    let mut license_named = false;
    for table in tables.into_iter().flatten() {
        if let Some(license) = table.get("license").and_then(toml::Value::as_str) {
            license_named = true;
            if license != project.license {
                out.push(format!(
                    "{rel}: license is {license:?}, not the project's {:?}",
                    project.license
                ));
            }
        }
        if let Some(url) = table.get("repository").and_then(toml::Value::as_str)
            && url != project.url
        {
            out.push(format!(
                "{rel}: repository is {url:?}, not the project's {:?}",
                project.url
            ));
        }
    }
    if !license_named {
        out.push(format!("{rel}: names no license"));
    }
    out
}

/// Whether `LICENSE` (its text, `None` when missing) is the project's license.
fn license_file(text: Option<&str>, project: &Project) -> Vec<String> {
    let Some(text) = text else {
        return vec![format!(
            "LICENSE is missing; every manifest says {:?}",
            project.license
        )];
    };
    let head: String = text.lines().take(5).collect::<Vec<_>>().join(" ");
    let known = match project.license.as_str() {
        "Apache-2.0" => Some(["Apache License", "Version 2.0"]),
        _ => None,
    };
    match known {
        Some(marks) if !marks.iter().all(|m| head.contains(m)) => vec![format!(
            "LICENSE does not start as the {} text does ({:?})",
            project.license,
            marks.join(", ")
        )],
        _ => Vec::new(),
    }
}

/// The krew manifest's homepage and archives against the project's address.
fn krew_links(manifest: &Value, project: &Project) -> Vec<String> {
    let mut out = Vec::new();
    let homepage = manifest["spec"]["homepage"].as_str().unwrap_or_default();
    if homepage != project.url {
        out.push(format!(
            "{}: spec.homepage is {homepage:?}, not the project's {:?}",
            krew::MANIFEST,
            project.url
        ));
    }
    let downloads = format!("{}/releases/download/", project.url);
    for (i, p) in manifest["spec"]["platforms"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let uri = p["uri"].as_str().unwrap_or_default();
        if !uri.starts_with(&downloads) {
            out.push(format!(
                "{}: spec.platforms[{i}].uri {uri:?} does not lie under {downloads:?}",
                krew::MANIFEST
            ));
        }
    }
    out
}

/// The chart's default runbook address against the project's.
fn runbook(values: &Value, project: &Project) -> Vec<String> {
    let url = values
        .pointer("/metrics/prometheusRule/runbookBaseUrl")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let under = format!("{}/", project.url);
    if url.starts_with(&under) {
        return Vec::new();
    }
    vec![format!(
        "{VALUES}: metrics.prometheusRule.runbookBaseUrl {url:?} does not lie under the \
         project's {:?}",
        project.url
    )]
}

/// Moves the files of [`REWRITTEN`] from the address the krew manifest's homepage had to
/// `url`.
fn rewrite(root: &Path, url: &str) -> anyhow::Result<()> {
    let krew_text = std::fs::read_to_string(root.join(krew::MANIFEST))
        .with_context(|| format!("reading {}", krew::MANIFEST))?;
    let krew: Value = serde_saphyr::from_str(&krew_text)
        .with_context(|| format!("{}: not valid YAML", krew::MANIFEST))?;
    let old = krew["spec"]["homepage"].as_str().unwrap_or_default();
    if old.is_empty() || url.is_empty() || old == url {
        return Ok(());
    }
    for rel in REWRITTEN {
        let path = root.join(rel);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let moved = moved(&text, old, url);
        if moved != text {
            std::fs::write(&path, moved).with_context(|| format!("writing {}", path.display()))?;
            eprintln!("deploy-check: {rel}: {old} -> {url}");
        }
    }
    Ok(())
}

/// `text` with every address at or under `old` moved to `new` (an address that only starts
/// with the same characters, `old` followed by a letter, stays).
fn moved(text: &str, old: &str, new: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find(old) {
        let after = &rest[i + old.len()..];
        let whole = after
            .chars()
            .next()
            .is_none_or(|c| !(c.is_alphanumeric() || c == '-' || c == '_' || c == '.'));
        out.push_str(&rest[..i]);
        out.push_str(if whole { new } else { old });
        rest = after;
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn project() -> Project {
        Project {
            url: "https://git.example.com/org/kubedev".into(),
            license: "Apache-2.0".into(),
        }
    }

    fn root() -> &'static Path {
        Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
    }

    #[test]
    fn the_tree_names_one_address_and_one_license() {
        let metadata = serde_json::json!({
            "packages": [{"id": "k", "name": "kubedev", "license": "Apache-2.0",
                          "repository": workspace_package_key(
                              &std::fs::read_to_string(root().join("Cargo.toml")).unwrap(),
                              "repository").unwrap()}],
            "workspace_members": ["k"],
        });
        assert_eq!(
            check(root(), &metadata, false).unwrap(),
            Vec::<String>::new()
        );
    }

    #[test]
    fn a_member_that_does_not_inherit_is_named() {
        let p = project();
        let metadata = serde_json::json!({
            "packages": [
                {"id": "a", "name": "kubedev", "license": "Apache-2.0", "repository": p.url},
                {"id": "b", "name": "forked", "license": "MIT", "repository": "https://x.test/y"},
                {"id": "c", "name": "not-a-member", "license": "MIT"},
                {"id": "d", "name": "tooling", "publish": []},
            ],
            "workspace_members": ["a", "b", "d"],
        });
        let found = members(&metadata, &p);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(
            found[0].starts_with("package forked: repository"),
            "{found:?}"
        );
        assert!(found[1].starts_with("package forked: license"), "{found:?}");
    }

    #[test]
    fn other_workspaces_must_carry_the_license() {
        let p = project();
        let ok = "[workspace.package]\nlicense = \"Apache-2.0\"\n";
        assert!(other_workspace("a/Cargo.toml", ok, &p).is_empty());
        let bad = "[package]\nlicense = \"MIT\"\nrepository = \"https://x.test\"\n";
        let found = other_workspace("a/Cargo.toml", bad, &p);
        assert_eq!(found.len(), 2, "{found:?}");
        assert_eq!(
            other_workspace("a/Cargo.toml", "[package]\nname = \"x\"\n", &p),
            ["a/Cargo.toml: names no license"]
        );
    }

    #[test]
    fn a_missing_or_other_license_file_is_reported() {
        let p = project();
        assert!(license_file(None, &p)[0].starts_with("LICENSE is missing"));
        assert_eq!(license_file(Some("MIT License\n\nCopyright"), &p).len(), 1);
        let apache = "\n                                 Apache License\n                           Version 2.0, January 2004\n";
        assert!(license_file(Some(apache), &p).is_empty());
    }

    #[test]
    fn krew_and_runbook_links_elsewhere_are_reported() {
        let p = project();
        let krew = serde_json::json!({"spec": {
            "homepage": "https://example.invalid/kubedev",
            "platforms": [{"uri": format!("{}/releases/download/v1/a.tar.gz", p.url)},
                          {"uri": "https://example.invalid/kubedev/releases/download/v1/b.tar.gz"}],
        }});
        let found = krew_links(&krew, &p);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[1].contains("spec.platforms[1].uri"), "{found:?}");
        let values =
            |url: &str| serde_json::json!({"metrics": {"prometheusRule": {"runbookBaseUrl": url}}});
        assert!(runbook(&values(&format!("{}/blob/main/README.md", p.url)), &p).is_empty());
        assert_eq!(
            runbook(&values("https://elsewhere.test/README.md"), &p).len(),
            1
        );
    }

    #[test]
    fn an_address_moves_only_where_it_is_whole() {
        let text = "a https://old.test/k b https://old.test/k/releases/x c https://old.test/kx";
        assert_eq!(
            moved(text, "https://old.test/k", "https://new.test/o/k"),
            "a https://new.test/o/k b https://new.test/o/k/releases/x c https://old.test/kx"
        );
    }

    #[test]
    fn write_moves_every_link_to_the_workspace_address() {
        let dir = tempfile::tempdir().unwrap();
        for rel in REWRITTEN {
            let to = dir.path().join(rel);
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            std::fs::copy(root().join(rel), &to).unwrap();
        }
        let url = "https://git.example.com/org/kubedev";
        rewrite(dir.path(), url).unwrap();
        let p = Project {
            url: url.into(),
            license: "Apache-2.0".into(),
        };
        let read = |rel: &str| std::fs::read_to_string(dir.path().join(rel)).unwrap();
        let krew: Value = serde_saphyr::from_str(&read(krew::MANIFEST)).unwrap();
        assert_eq!(krew_links(&krew, &p), Vec::<String>::new());
        let values: Value = serde_saphyr::from_str(&read(VALUES)).unwrap();
        assert_eq!(runbook(&values, &p), Vec::<String>::new());
        assert!(read(DOCKERFILE).contains(&format!("org.opencontainers.image.source=\"{url}\"")));
    }
}
