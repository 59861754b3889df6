//! The builder stage: the official Rust image at the workspace's rust-version on the runtime's
//! Debian release, `cargo build --locked -p kubedev` with an optimized profile, the FEATURES
//! build argument and cache mounts; and the cargo features each rendering's configuration needs, which the
//! default FEATURES must build.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::dockerfile::{Run, Stage, at, debian_of_tag, image_ref, join, pairs, run, version};
use super::{DOCKERFILE, Workspace};

/// The features `requested` turn on, following `features` (`dep:` entries are not features).
pub(super) fn resolve(
    features: &BTreeMap<String, Vec<String>>,
    requested: impl IntoIterator<Item = String>,
) -> BTreeSet<String> {
    let mut on = BTreeSet::new();
    let mut todo: Vec<String> = requested.into_iter().collect();
    while let Some(f) = todo.pop() {
        if let Some(implied) = features.get(&f)
            && on.insert(f)
        {
            todo.extend(implied.iter().cloned());
        }
    }
    on.remove("default");
    on
}

/// The builder stage: the official Rust image at the workspace's rust-version or newer, on
/// the runtime's Debian release; `cargo build --locked -p kubedev` with an optimized profile,
/// the FEATURES build argument and cache mounts, writing `artifact` (what the runtime
/// copies). Returns the problems and the features the default FEATURES builds.
pub(super) fn check_builder(
    builder: &Stage,
    artifact: &str,
    ws: &Workspace,
    runtime_debian: Option<u32>,
) -> (Vec<String>, Option<BTreeSet<String>>) {
    let b_at = at(builder.line);
    let mut problems = check_builder_image(builder, ws, runtime_debian);

    // ARG FEATURES and its default.
    let Some(default) = features_arg(builder) else {
        problems.push(format!(
            "{b_at}: the builder stage declares no ARG FEATURES (the cargo features to \
                 build)"
        ));
        return (problems, None);
    };

    // The build step.
    let Some((build, workdir)) = build_step(builder) else {
        problems.push(format!("{b_at}: the builder stage runs no `cargo build`"));
        return (problems, None);
    };
    problems.extend(check_build_command(&build, artifact, &ws.release_profiles));
    problems.extend(check_build_caches(&build, &workdir));

    // What the default FEATURES builds.
    let (requested, feature_problems) = default_features(&default, ws, &b_at);
    problems.extend(feature_problems);
    (problems, Some(resolve(&ws.features, requested)))
}

/// The builder image: the official Rust image, tagged with the workspace's rust-version or
/// newer and the runtime's Debian release; returns the problems.
fn check_builder_image(
    builder: &Stage,
    ws: &Workspace,
    runtime_debian: Option<u32>,
) -> Vec<String> {
    let b_at = at(builder.line);
    let image = image_ref(&builder.image);
    if image.name != "rust" {
        return vec![format!(
            "{b_at}: the builder image is {}, not the official Rust image (rust:<version>-…)",
            builder.image
        )];
    }
    let mut problems = Vec::new();
    let tag = image.tag.as_deref().unwrap_or("latest");
    let wanted = version(&ws.rust_version);
    match (tag.split('-').next().and_then(version), wanted) {
        (Some(have), Some(want)) if have >= want => {}
        (Some(_), Some(_)) => problems.push(format!(
            "{b_at}: the builder image {} is older than the workspace's rust-version {}",
            builder.image, ws.rust_version
        )),
        (None, _) => problems.push(format!(
            "{b_at}: the builder image tag {tag:?} names no Rust version \
                 (major.minor, e.g. rust:{}-slim-bookworm); the build would float",
            ws.rust_version
        )),
        (_, None) => problems.push(format!(
            "the kubedev crate's rust-version {:?} is not major.minor[.patch]",
            ws.rust_version
        )),
    }
    match (debian_of_tag(tag), runtime_debian) {
        (Some(b), Some(r)) if b == r => {}
        (Some(b), Some(r)) => problems.push(format!(
            "{b_at}: the builder is Debian {b} but the runtime image is Debian {r}; a \
                 binary linked against a newer glibc than the runtime's does not start"
        )),
        (None, _) => problems.push(format!(
            "{b_at}: the builder tag {tag:?} names no Debian release (bookworm, \
                 trixie); pin it to the runtime image's release"
        )),
        // An unknown runtime image is reported with the runtime stage.
        (_, None) => {}
    }
    problems
}

/// The default of the builder stage's `ARG FEATURES` (empty when it has none), or `None`
/// when the stage declares no such argument.
fn features_arg(builder: &Stage) -> Option<String> {
    let mut default = None;
    for i in builder.all("ARG") {
        if let Ok(pairs) = pairs(&i.args) {
            for (k, v) in pairs {
                if k == "FEATURES" {
                    default = Some(v.unwrap_or_default());
                }
            }
        }
    }
    default
}

/// The builder stage's last RUN of `cargo build`, with the WORKDIR it runs in.
fn build_step(builder: &Stage) -> Option<(Run<'_>, String)> {
    let mut workdir = "/".to_string();
    let mut build = None;
    for i in &builder.body {
        match i.keyword.as_str() {
            "WORKDIR" => workdir = join(&workdir, i.args.trim()),
            "RUN" if i.args.contains("cargo build") => {
                build = Some((run(i), workdir.clone()));
            }
            _ => {}
        }
    }
    build
}

/// The build command: an optimized profile (`--release`, or `--profile` naming one of
/// `release_profiles`), `--locked -p kubedev`, `$FEATURES` with `--no-default-features`, and
/// that profile's binary copied to `artifact`; returns the problems.
fn check_build_command(
    build: &Run<'_>,
    artifact: &str,
    release_profiles: &BTreeSet<String>,
) -> Vec<String> {
    let mut problems = Vec::new();
    let r_at = at(build.line);
    let tokens: Vec<&str> = build
        .command
        .split_whitespace()
        .map(|t| t.trim_matches(|c| c == ';' || c == '"' || c == '\''))
        .collect();
    let has = |t: &str| tokens.contains(&t);
    let has_pair = |a: &str, b: &str| tokens.windows(2).any(|w| w[0] == a && w[1] == b);
    let named = tokens
        .windows(2)
        .find(|w| w[0] == "--profile")
        .map(|w| w[1])
        .or_else(|| tokens.iter().find_map(|t| t.strip_prefix("--profile=")));
    let profile = match named {
        Some(name) if release_profiles.contains(name) => Some(name),
        Some(name) => {
            problems.push(format!(
                "{r_at}: cargo build --profile {name}: not a profile that optimizes as release \
                 does (release, or a workspace profile that inherits from it: {})",
                release_profiles
                    .iter()
                    .map(String::as_str)
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
            None
        }
        None if has("--release") => Some("release"),
        None => {
            problems.push(format!(
                "{r_at}: cargo build without --release (or --profile naming a profile that \
                 inherits from release)"
            ));
            None
        }
    };
    if !has("--locked") {
        problems.push(format!("{r_at}: cargo build without --locked"));
    }
    if !(has_pair("-p", "kubedev") || has_pair("--package", "kubedev") || has("--package=kubedev"))
    {
        problems.push(format!("{r_at}: cargo build does not select -p kubedev"));
    }
    let passes_features = ["$FEATURES", "${FEATURES}"]
        .iter()
        .any(|v| has_pair("--features", v) || has_pair("-F", v) || has(&format!("--features={v}")));
    if !passes_features {
        problems.push(format!(
            "{r_at}: the build does not pass $FEATURES to cargo, so --build-arg FEATURES \
                 changes nothing"
        ));
    }
    if !has("--no-default-features") {
        problems.push(format!(
            "{r_at}: a FEATURES list must build exactly those features: pass \
                 --no-default-features with it"
        ));
    }
    if let Some(profile) = profile {
        let binary = format!("target/{profile}/kubedev");
        if !(build.command.contains(&binary) && build.command.contains(artifact)) {
            problems.push(format!(
                "{r_at}: the runtime stage copies {artifact}, but this step does not copy \
                 {binary} there"
            ));
        }
    }
    problems
}

/// BuildKit cache mounts for the cargo registry and the target directory (beneath
/// `workdir`); returns the problems.
fn check_build_caches(build: &Run<'_>, workdir: &str) -> Vec<String> {
    let r_at = at(build.line);
    let caches: BTreeSet<String> = build
        .mounts
        .iter()
        .filter(|m| m.get("type").map(String::as_str) == Some("cache"))
        .filter_map(|m| {
            m.get("target")
                .or_else(|| m.get("dst"))
                .or_else(|| m.get("destination"))
                .map(|t| join(workdir, t).trim_end_matches('/').to_string())
        })
        .collect();
    let mut problems = Vec::new();
    for (dir, what) in [
        (
            "/usr/local/cargo/registry".to_string(),
            "the cargo registry",
        ),
        (join(workdir, "target"), "the target directory"),
    ] {
        if !caches.contains(&dir) {
            problems.push(format!(
                "{r_at}: no BuildKit cache mount for {what} ({dir}); every build would \
                     start cold"
            ));
        }
    }
    problems
}

/// The features the FEATURES default requests (`default` when empty), each a feature of the
/// kubedev crate; with the problems.
fn default_features(default: &str, ws: &Workspace, b_at: &str) -> (Vec<String>, Vec<String>) {
    let requested: Vec<String> = if default.trim().is_empty() {
        vec!["default".into()]
    } else {
        default
            .split([',', ' '])
            .filter(|f| !f.is_empty())
            .map(str::to_string)
            .collect()
    };
    let mut problems = Vec::new();
    for f in &requested {
        if !ws.features.contains_key(f) {
            problems.push(format!(
                "{b_at}: ARG FEATURES names {f:?}, which is not a feature of the kubedev \
                     crate ({:?})",
                ws.features.keys().collect::<Vec<_>>()
            ));
        }
    }
    (requested, problems)
}

/// The cargo features a rendered configuration needs: one per enabled backend that is not
/// built into core, and `wasm` for selection policies. Each comes with the setting that
/// needs it. A backend deploy-check does not know is an error.
pub(super) fn needed_features(config: &Value) -> Result<Vec<(String, &'static str)>, String> {
    let mut needs = Vec::new();
    if let Some(backends) = config.get("backends").and_then(Value::as_object) {
        for name in backends.keys() {
            let feature = match name.as_str() {
                // Built into kubedev-core.
                "static" => continue,
                "nvidia" => "nvidia",
                "vfio" => "vfio",
                "usb" => "usb",
                "host" => "host",
                other => {
                    return Err(format!(
                        "config.yaml enables backends.{other}, and deploy-check does not know \
                             which cargo feature it needs; add it to needed_features in \
                             xtask/src/deploy/image/builder.rs"
                    ));
                }
            };
            needs.push((format!("backends.{name}"), feature));
        }
    }
    let dp = config.get("devicePlugin");
    if dp
        .and_then(|d| d.get("policyDir"))
        .and_then(Value::as_str)
        .is_some_and(|d| !d.is_empty())
    {
        needs.push(("devicePlugin.policyDir".into(), "wasm"));
    }
    let resources = dp
        .and_then(|d| d.get("resources"))
        .and_then(Value::as_array);
    for (i, r) in resources.into_iter().flatten().enumerate() {
        if r.get("policy").is_some_and(|p| !p.is_null()) {
            needs.push((format!("devicePlugin.resources[{i}].policy"), "wasm"));
        }
    }
    Ok(needs)
}

/// Each `(rendering, setting, feature)` whose feature the image's default FEATURES leaves
/// out is a problem.
pub(super) fn check_features(
    built: &BTreeSet<String>,
    needs: &[(String, String, &'static str)],
) -> Vec<String> {
    needs
        .iter()
        .filter(|(_, _, feature)| !built.contains(*feature))
        .map(|(label, setting, feature)| {
            format!(
                "{label}: {setting} needs the cargo feature `{feature}`, which the image \
                     built with {DOCKERFILE}'s default FEATURES leaves out (it builds {built:?}); \
                     the chart runs that image"
            )
        })
        .collect()
}
