//! ARCHITECTURE.md against the tree: every source file is named in it, and every file path it
//! names exists.
//!
//! The document is read as sections: each heading of level 1 to 3 starts one. A section whose
//! heading is a single path in backticks (`` ### `crates/core` ``) is that directory's section.
//! A source file is *named* when
//!
//! - its path from the repository root is written in backticks anywhere in the document, or
//! - its path relative to the directory of a section, or to that directory's `src/`, is written
//!   in backticks in that section (`dra_driver/claim_status.rs` or
//!   `src/dra_driver/claim_status.rs` in the section of `crates/kubedev`).
//!
//! Source files are the files git lists (tracked, or new and not ignored) that exist and end in
//! `.rs`, `.go`, `.py`, `.c`, `.sh` or `.proto`, except tests (in a directory named `tests` or
//! ending in `_tests`, or a file named `tests.rs` or ending in `_tests.rs`), generated code (an
//! `@generated` line among its first ten), fuzz seeds, corpora and artifacts, and build output
//! (anything under a `target` directory).
//!
//! A backticked word *names a file path* when it is made of letters, digits and `_.-/` only,
//! starts with neither `/` (a host path) nor `.` nor `target/` (build output), and ends in `/`
//! (a directory) or in a file extension of the tree (source, `.toml`, `.md`, `.yaml`, `.yml`,
//! `.json`, `.mod`, `.sum`). It must exist relative to its section's directory, that
//! directory's `src/`, or the repository root.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};

/// The document, at the repository root.
const DOC: &str = "ARCHITECTURE.md";

/// What a source file's name ends in.
const SOURCE_EXTENSIONS: &[&str] = &["rs", "go", "py", "c", "sh", "proto"];

/// What else a backticked word that names a file of the tree may end in.
const OTHER_FILE_EXTENSIONS: &[&str] = &["toml", "md", "yaml", "yml", "json", "mod", "sum"];

/// The folders of `fuzz/` that hold inputs rather than code.
const FUZZ_INPUTS: &[&str] = &["seeds", "corpus", "artifacts", "coverage"];

/// One section of the document: the directory its heading names, if any, and the words written
/// in backticks in it (its heading's included).
#[derive(Debug)]
struct Section {
    heading: String,
    dir: Option<String>,
    words: BTreeSet<String>,
}

/// The document's sections, in order; text before the first heading is a section without a
/// heading. Fenced code blocks are skipped.
fn sections(doc: &str) -> anyhow::Result<Vec<Section>> {
    fn close(heading: String, text: &str, out: &mut Vec<Section>) -> anyhow::Result<()> {
        let spans: Vec<&str> = text.split('`').collect();
        if spans.len().is_multiple_of(2) {
            bail!("{DOC}: a backtick is not closed in the section {heading:?}");
        }
        let words = spans
            .iter()
            .skip(1)
            .step_by(2)
            .map(|w| w.trim().to_string())
            .collect();
        out.push(Section {
            dir: directory_heading(&heading),
            heading,
            words,
        });
        Ok(())
    }

    let mut out = Vec::new();
    let mut heading = String::new();
    let mut text = String::new();
    let mut fenced = false;
    for line in doc.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let level = line.chars().take_while(|&c| c == '#').count();
        if (1..=3).contains(&level) && line[level..].starts_with(' ') {
            if !heading.is_empty() || !text.trim().is_empty() {
                close(std::mem::take(&mut heading), &text, &mut out)?;
            }
            text.clear();
            heading = line[level..].trim().to_string();
        }
        text.push_str(line);
        text.push('\n');
    }
    if fenced {
        bail!("{DOC}: a fenced code block is not closed");
    }
    close(heading, &text, &mut out)?;
    Ok(out)
}

/// The directory a heading names: the heading is one word in backticks, a path.
fn directory_heading(heading: &str) -> Option<String> {
    let word = heading.strip_prefix('`')?.strip_suffix('`')?;
    (!word.is_empty() && !word.contains('`') && is_path_text(word))
        .then(|| word.trim_end_matches('/').to_string())
}

/// Letters, digits and `_.-/` only.
fn is_path_text(word: &str) -> bool {
    word.chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | '/'))
}

/// What a path's file name ends in after its last dot, if it has one.
fn extension(path: &str) -> Option<&str> {
    let name = path.rsplit('/').next()?;
    let (stem, ext) = name.rsplit_once('.')?;
    (!stem.is_empty()).then_some(ext)
}

/// Whether a backticked word names a file or directory of the tree (see the module docs).
fn names_a_path(word: &str) -> bool {
    if word.is_empty()
        || !is_path_text(word)
        || word.starts_with(['/', '.'])
        || word.starts_with("target/")
        || word.contains("//")
    {
        return false;
    }
    if word.ends_with('/') {
        return word.chars().any(|c| c.is_ascii_alphabetic());
    }
    extension(word)
        .is_some_and(|e| SOURCE_EXTENSIONS.contains(&e) || OTHER_FILE_EXTENSIONS.contains(&e))
}

/// Whether a path from the repository root is a source file the document must name, judged
/// by its path alone (see [`is_generated`] for the rest).
fn is_source_path(path: &str) -> bool {
    if !extension(path).is_some_and(|e| SOURCE_EXTENSIONS.contains(&e)) {
        return false;
    }
    let parts: Vec<&str> = path.split('/').collect();
    let Some((file, dirs)) = parts.split_last() else {
        return false;
    };
    let stem = file.rsplit_once('.').map_or(*file, |(stem, _)| stem);
    let test_dir = dirs.iter().any(|d| *d == "tests" || d.ends_with("_tests"));
    let test_file = stem == "tests" || stem.ends_with("_tests");
    let build_output = dirs.contains(&"target");
    let fuzz_input =
        dirs.first() == Some(&"fuzz") && dirs.get(1).is_some_and(|d| FUZZ_INPUTS.contains(d));
    !(test_dir || test_file || build_output || fuzz_input)
}

/// Whether a file says it is generated: `@generated` in one of its first ten lines.
fn is_generated(file: &Path) -> anyhow::Result<bool> {
    let bytes = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
    Ok(String::from_utf8_lossy(&bytes)
        .lines()
        .take(10)
        .any(|line| line.contains("@generated")))
}

/// The repository root, from this crate's directory.
fn root() -> anyhow::Result<PathBuf> {
    crate::commands::workspace_root()
}

/// The source files the document must name, as paths from the repository root: what git
/// lists (tracked files and new ones it does not ignore) that exists, is source and is not
/// generated.
fn source_files(root: &Path) -> anyhow::Result<BTreeSet<String>> {
    let out = Command::new("git")
        .args([
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
        ])
        .current_dir(root)
        .output()
        .with_context(|| format!("running git ls-files in {}", root.display()))?;
    if !out.status.success() {
        bail!(
            "git ls-files in {} failed ({}): {}",
            root.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let listed = String::from_utf8(out.stdout).context("git ls-files printed a non-UTF-8 path")?;
    let mut files = BTreeSet::new();
    for path in listed.split('\0').filter(|p| !p.is_empty()) {
        let file = root.join(path);
        // A file moved or deleted in the working tree but not yet in the index is listed.
        if is_source_path(path) && file.is_file() && !is_generated(&file)? {
            files.insert(path.to_string());
        }
    }
    Ok(files)
}

/// Whether `path` (from the repository root) is named in the document (see the module docs).
fn is_named(path: &str, sections: &[Section]) -> bool {
    sections.iter().any(|s| {
        s.words.contains(path)
            || s.dir.as_deref().is_some_and(|dir| {
                let Some(rel) = path.strip_prefix(dir).and_then(|p| p.strip_prefix('/')) else {
                    return false;
                };
                s.words.contains(rel)
                    || rel
                        .strip_prefix("src/")
                        .is_some_and(|r| s.words.contains(r))
            })
    })
}

/// The source files the document does not name.
fn unnamed<'a>(files: &'a BTreeSet<String>, sections: &[Section]) -> Vec<&'a str> {
    files
        .iter()
        .map(String::as_str)
        .filter(|f| !is_named(f, sections))
        .collect()
}

/// The paths the document names that do not exist, each with its section's heading, and the
/// sections whose directory does not exist.
fn dangling(root: &Path, sections: &[Section]) -> Vec<String> {
    let exists = |rel: &str, dir_only: bool| {
        let p = root.join(rel);
        if dir_only { p.is_dir() } else { p.exists() }
    };
    let mut out = Vec::new();
    for s in sections {
        if let Some(dir) = &s.dir
            && !exists(dir, true)
        {
            out.push(format!("`{dir}` (a section's directory)"));
        }
        for word in s.words.iter().filter(|w| names_a_path(w)) {
            let dir_only = word.ends_with('/');
            let mut candidates = vec![word.clone()];
            if let Some(dir) = &s.dir {
                candidates.push(format!("{dir}/{word}"));
                candidates.push(format!("{dir}/src/{word}"));
            }
            if !candidates.iter().any(|c| exists(c, dir_only)) {
                out.push(format!("`{word}` in the section {:?}", s.heading));
            }
        }
    }
    out
}

fn read_doc(root: &Path) -> anyhow::Result<Vec<Section>> {
    let path = root.join(DOC);
    let doc =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    sections(&doc)
}

#[test]
fn every_source_file_is_named_in_architecture_md() -> anyhow::Result<()> {
    let root = root()?;
    let files = source_files(&root)?;
    // The listing itself works: this very file is one of many.
    assert!(
        files.contains("xtask/src/architecture.rs") && files.len() > 100,
        "git ls-files found {} source files, without xtask/src/architecture.rs",
        files.len()
    );
    let sections = read_doc(&root)?;
    let missing = unnamed(&files, &sections);
    assert!(
        missing.is_empty(),
        "{} of {} source files are not named in {DOC}. Name each in backticks in the section \
         of its directory (a heading like ### `crates/core`), as its path relative to that \
         directory or to its src/, or anywhere by its path from the repository root, with what \
         it does:\n  {}",
        missing.len(),
        files.len(),
        missing.join("\n  ")
    );
    Ok(())
}

#[test]
fn every_path_architecture_md_names_exists() -> anyhow::Result<()> {
    let root = root()?;
    let sections = read_doc(&root)?;
    let checked = sections
        .iter()
        .flat_map(|s| &s.words)
        .filter(|w| names_a_path(w))
        .count();
    assert!(checked > 100, "only {checked} paths found in {DOC}");
    let gone = dangling(&root, &sections);
    assert!(
        gone.is_empty(),
        "{} of the paths {DOC} names do not exist (relative to their section's directory, its \
         src/, or the repository root); rename or remove them:\n  {}",
        gone.len(),
        gone.join("\n  ")
    );
    Ok(())
}

#[test]
fn the_rule_reads_sections_relative_paths_and_exclusions() -> anyhow::Result<()> {
    let doc = "# t\n\nAnywhere: `crates/b/src/full.rs`.\n\n## Codemap\n\n\
               ### `crates/a`\n\n- `lib.rs`, `src/main.rs`, `benches/x.rs`, `sub/deep.rs`\n\n\
               ```\n`crates/a/src/fenced.rs`\n```\n\n\
               ### `crates/b`\n\n- `other.rs`, `/dev/vfio`, `.wasm`, `v1.2`, `k8s.io/x`, \
               `tests/all/`, `<d>/x.rs`\n";
    assert!(
        sections("# t\n`a.rs\n").is_err(),
        "an unclosed backtick is refused"
    );
    let sections = sections(doc)?;
    let dirs: Vec<_> = sections.iter().map(|s| s.dir.as_deref()).collect();
    assert_eq!(dirs, [None, None, Some("crates/a"), Some("crates/b")]);

    let named = |p: &str| is_named(p, &sections);
    assert!(named("crates/a/src/lib.rs"));
    assert!(named("crates/a/src/main.rs"));
    assert!(named("crates/a/benches/x.rs"));
    assert!(named("crates/a/src/sub/deep.rs"));
    assert!(named("crates/b/src/full.rs"));
    assert!(named("crates/b/src/other.rs"));
    // Named in another crate's section, inside a code block, or not at all.
    assert!(!named("crates/a/src/other.rs"));
    assert!(!named("crates/a/src/fenced.rs"));
    assert!(!named("crates/a/src/deep.rs"));
    assert!(!named("crates/ab/src/lib.rs"));

    let paths: Vec<_> = sections[3]
        .words
        .iter()
        .filter(|w| names_a_path(w))
        .collect();
    assert_eq!(paths, ["other.rs", "tests/all/"]);

    assert!(is_source_path("crates/a/src/lib.rs"));
    assert!(is_source_path("tools/gpu-check/run.sh"));
    assert!(is_source_path("crates/a/proto/x/v1/api.proto"));
    for not_source in [
        "crates/a/tests/all/main.rs",
        "crates/a/src/tests.rs",
        "crates/a/src/x/block_yaml_tests.rs",
        "crates/a/src/release_tests/gates.rs",
        "fuzz/seeds/x/a.rs",
        "plugins/target/x.rs",
        "crates/a/Cargo.toml",
        "crates/a/interop/python/__pycache__/x.pyc",
    ] {
        assert!(!is_source_path(not_source), "{not_source}");
    }

    let root = root()?;
    assert!(is_generated(
        &root.join("crates/kubelet-grpc/src/generated/dra_v1.rs")
    )?);
    assert!(!is_generated(&root.join("xtask/src/architecture.rs"))?);
    Ok(())
}
