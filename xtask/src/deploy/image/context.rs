//! The build context: `.dockerignore` rules, the paths the Dockerfile copies from the context,
//! what cargo needs of the workspace, and the builder's build directory recreated from them,
//! which `cargo metadata --locked` must load.

use std::path::Path;

use anyhow::Context as _;

use super::dockerfile::{Dockerfile, at, copy, join};
use super::{DOCKERFILE, DOCKERIGNORE, Workspace};

/// One `.dockerignore` rule.
#[derive(Debug)]
pub(super) struct IgnoreRule {
    exception: bool,
    segments: Vec<String>,
}

/// Parses `.dockerignore`: a pattern per line, `#` comments, `!` for exceptions, paths
/// relative to the context root.
pub(super) fn parse_ignore(text: &str) -> Vec<IgnoreRule> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (exception, pattern) = match l.strip_prefix('!') {
                Some(p) => (true, p.trim()),
                None => (false, l),
            };
            IgnoreRule {
                exception,
                segments: pattern
                    .split('/')
                    .filter(|s| !s.is_empty() && *s != ".")
                    .map(str::to_string)
                    .collect(),
            }
        })
        .collect()
}

/// Whether `path` (relative to the context root) reaches the build: the last rule that
/// matches it or one of its parent directories decides.
pub(super) fn kept(rules: &[IgnoreRule], path: &str) -> bool {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let mut kept = true;
    for rule in rules {
        let pattern: Vec<&str> = rule.segments.iter().map(String::as_str).collect();
        if (1..=segments.len()).any(|n| glob_path(&pattern, &segments[..n])) {
            kept = rule.exception;
        }
    }
    kept
}

/// Matches path segments against pattern segments; `**` matches any number of segments.
fn glob_path(pattern: &[&str], path: &[&str]) -> bool {
    match pattern.split_first() {
        None => path.is_empty(),
        Some((&"**", rest)) => (0..=path.len()).any(|n| glob_path(rest, &path[n..])),
        Some((p, rest)) => path.split_first().is_some_and(|(s, tail)| {
            glob_segment(p.as_bytes(), s.as_bytes()) && glob_path(rest, tail)
        }),
    }
}

/// Matches one segment: `*` is any run of characters, `?` one character.
fn glob_segment(p: &[u8], s: &[u8]) -> bool {
    match p.split_first() {
        None => s.is_empty(),
        Some((b'*', rest)) => (0..=s.len()).any(|n| glob_segment(rest, &s[n..])),
        Some((b'?', rest)) => !s.is_empty() && glob_segment(rest, &s[1..]),
        Some((c, rest)) => s.first() == Some(c) && glob_segment(rest, &s[1..]),
    }
}

/// The build context: `.dockerignore` keeps every path the Dockerfile copies from it, the
/// workspace manifest, lock file and every member's manifest are copied, and `target/`
/// stays out.
pub(super) fn check_context(df: &Dockerfile, rules: &[IgnoreRule], ws: &Workspace) -> Vec<String> {
    let mut problems = Vec::new();
    let mut sources = Vec::new();
    for stage in &df.stages {
        for i in stage.all("COPY").chain(stage.all("ADD")) {
            let Ok(c) = copy(i) else { continue };
            if c.from.is_some() {
                continue;
            }
            for s in c.sources {
                let s = s.trim_start_matches("./").trim_end_matches('/').to_string();
                let s = if s.is_empty() { ".".to_string() } else { s };
                if s != "." && !kept(rules, &s) {
                    problems.push(format!(
                        "{}: copies {s}, which {DOCKERIGNORE} leaves out of the build context",
                        at(c.line)
                    ));
                }
                sources.push(s);
            }
        }
    }
    let copied = |path: &str| {
        sources.iter().any(|s| {
            s == "." || {
                let pattern: Vec<&str> = s.split('/').collect();
                let segments: Vec<&str> = path.split('/').collect();
                (1..=segments.len()).any(|n| glob_path(&pattern, &segments[..n]))
            }
        })
    };
    let mut required = vec!["Cargo.toml".to_string(), "Cargo.lock".to_string()];
    required.extend(ws.members.iter().cloned());
    for path in required {
        if !kept(rules, &path) {
            problems.push(format!(
                "{DOCKERIGNORE} leaves {path} out of the build context; cargo needs it"
            ));
        } else if !copied(&path) {
            problems.push(format!(
                "{DOCKERFILE} does not copy {path} into the builder; cargo needs every \
                     workspace member's manifest"
            ));
        }
    }
    if kept(rules, "target/release") {
        problems.push(format!(
            "{DOCKERIGNORE} does not leave target/ out: the build context would carry the \
                 whole target directory"
        ));
    }
    problems
}

/// Recreates what the builder stage's context COPYs put in its build directory (only the
/// files `.dockerignore` keeps) under `into`, relative to the WORKDIR of `cargo build`.
/// Returns the problems: sources that do not exist or a stage without `cargo build`.
pub(super) fn copy_context(
    root: &Path,
    df: &Dockerfile,
    rules: &[IgnoreRule],
    into: &Path,
) -> anyhow::Result<Vec<String>> {
    let Some(builder) = df
        .stages
        .iter()
        .find(|s| s.all("RUN").any(|i| i.args.contains("cargo build")))
    else {
        return Ok(vec![format!(
            "{DOCKERFILE} has no stage that runs `cargo build`"
        )]);
    };
    let build_dir = {
        let mut dir = "/".to_string();
        for i in &builder.body {
            if i.keyword == "WORKDIR" {
                dir = join(&dir, i.args.trim());
            } else if i.keyword == "RUN" && i.args.contains("cargo build") {
                break;
            }
        }
        dir
    };
    let mut problems = Vec::new();
    let mut workdir = "/".to_string();
    for i in &builder.body {
        match i.keyword.as_str() {
            "WORKDIR" => workdir = join(&workdir, i.args.trim()),
            "RUN" if i.args.contains("cargo build") => break,
            "COPY" | "ADD" => {}
            _ => continue,
        }
        let Ok(c) = copy(i) else { continue };
        if c.from.is_some() {
            continue;
        }
        let dest = join(&workdir, &c.dest);
        let Some(relative) = dest
            .strip_prefix(build_dir.trim_end_matches('/'))
            .map(|r| r.trim_start_matches('/'))
        else {
            continue;
        };
        let into_dir = c.dest.ends_with('/') || c.sources.len() > 1;
        for source in &c.sources {
            let path = root.join(source.trim_start_matches("./"));
            let name = source
                .trim_end_matches('/')
                .rsplit('/')
                .next()
                .unwrap_or(source);
            if path.is_dir() {
                // A directory's contents go to the destination.
                copy_tree(root, &path, rules, &into.join(relative))?;
            } else if path.is_file() {
                let target = if into_dir {
                    into.join(relative).join(name)
                } else {
                    into.join(relative)
                };
                if let Some(parent) = target.parent() {
                    std::fs::create_dir_all(parent)
                        .with_context(|| format!("creating {}", parent.display()))?;
                }
                std::fs::copy(&path, &target)
                    .with_context(|| format!("copying {}", path.display()))?;
            } else {
                problems.push(format!(
                    "{}: copies {source}, which is not in the repository",
                    at(c.line)
                ));
            }
        }
    }
    Ok(problems)
}

/// Copies the files beneath `dir` that `.dockerignore` keeps into `to`.
fn copy_tree(root: &Path, dir: &Path, rules: &[IgnoreRule], to: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(to).with_context(|| format!("creating {}", to.display()))?;
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let entry = entry.with_context(|| format!("reading {}", dir.display()))?;
        let path = entry.path();
        let relative = path
            .strip_prefix(root)
            .unwrap_or(&path)
            .display()
            .to_string();
        if !kept(rules, &relative) {
            continue;
        }
        let kind = entry
            .file_type()
            .with_context(|| format!("reading {}", path.display()))?;
        let target = to.join(entry.file_name());
        if kind.is_dir() {
            copy_tree(root, &path, rules, &target)?;
        } else if kind.is_file() {
            std::fs::copy(&path, &target).with_context(|| format!("copying {}", path.display()))?;
        }
    }
    Ok(())
}

/// Runs `cargo metadata --locked` in the recreated build directory: cargo loads the workspace
/// from what the image build sees, and the lock file needs no change. Not `--offline`: loading
/// the lock file needs every locked package's manifest, for other platforms too, which a cargo
/// cache that only ever built for this machine does not hold (the image build downloads them
/// the same way).
pub(super) fn cargo_loads(build_dir: &Path) -> Vec<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .current_dir(build_dir)
        .args(["metadata", "--locked", "--format-version", "1"])
        .env("CARGO_TARGET_DIR", build_dir.join("target"))
        .output();
    match out {
        Ok(o) if o.status.success() => Vec::new(),
        Ok(o) => vec![format!(
            "cargo cannot load the workspace from what {DOCKERFILE} copies into the builder \
                 (as {DOCKERIGNORE} filters it): {}",
            String::from_utf8_lossy(&o.stderr)
                .trim()
                .replace(&build_dir.display().to_string(), "<builder WORKDIR>")
        )],
        Err(e) => vec![format!("running cargo metadata: {e}")],
    }
}
