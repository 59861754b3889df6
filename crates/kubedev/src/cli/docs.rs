//! `kubedev completion SHELL` (a shell completion script) and the hidden `kubedev man --dir D`
//! (the manual pages), both generated from the command line's definition.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context as _;

use super::output::write_stdout;

/// `kubedev completion SHELL`: the completion script of `definition` for `shell`, on stdout.
pub(super) fn completion(
    mut definition: clap::Command,
    shell: clap_complete::Shell,
) -> anyhow::Result<ExitCode> {
    let name = definition.get_name().to_string();
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut definition, name, &mut script);
    let text = String::from_utf8(script).context("the completion script is not UTF-8")?;
    write_stdout(&text).map(|()| ExitCode::SUCCESS)
}

/// `kubedev man --dir D`: one page per command into `dir` (`kubedev.1`, `kubedev-explain.1`,
/// `kubedev-cdi-generate.1`, …), hidden commands left out; the paths written on stdout.
pub(super) fn man_pages(definition: clap::Command, dir: &Path) -> anyhow::Result<ExitCode> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let written = write_pages(definition, dir)?;
    let mut listing = String::new();
    for path in written {
        listing.push_str(&format!("{}\n", path.display()));
    }
    write_stdout(&listing).map(|()| ExitCode::SUCCESS)
}

/// Writes the pages of `definition` and of its visible subcommands into `dir`.
fn write_pages(definition: clap::Command, dir: &Path) -> anyhow::Result<Vec<std::path::PathBuf>> {
    let mut root = definition.disable_help_subcommand(true);
    root.build();
    let mut pending = vec![root];
    let mut written = Vec::new();
    while let Some(command) = pending.pop() {
        pending.extend(
            command
                .get_subcommands()
                .filter(|s| !s.is_hide_set())
                .cloned(),
        );
        let page = clap_mangen::Man::new(command);
        let path = page
            .generate_to(dir)
            .with_context(|| format!("writing a manual page into {}", dir.display()))?;
        written.push(path);
    }
    written.sort();
    Ok(written)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn every_visible_command_gets_a_page_and_hidden_ones_none() {
        use clap::CommandFactory as _;
        let dir = tempfile::tempdir().unwrap();
        let written = write_pages(super::super::Cli::command(), dir.path()).unwrap();
        let names: Vec<String> = written
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        for page in [
            "kubedev.1",
            "kubedev-explain.1",
            "kubedev-status.1",
            "kubedev-cdi-generate.1",
            "kubedev-policy-check.1",
            "kubedev-completion.1",
        ] {
            assert!(names.iter().any(|n| n == page), "{page} missing: {names:?}");
        }
        assert!(!names.iter().any(|n| n == "kubedev-man.1"), "{names:?}");
        let status = std::fs::read_to_string(dir.path().join("kubedev-status.1")).unwrap();
        assert!(
            status.starts_with(".ie") || status.contains(".TH"),
            "{status}"
        );
        assert!(status.contains("all\\-namespaces"), "{status}");
    }
}
