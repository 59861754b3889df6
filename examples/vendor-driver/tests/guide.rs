//! docs/writing-a-backend.md cannot drift from this example: every `rust`, `toml` and `yaml`
//! block in it is an excerpt copied verbatim from the example's files, every path of the example
//! it names exists, and its commands (`$ cargo run … --manifest-path
//! examples/vendor-driver/Cargo.toml -- ARGS`) print what it shows.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

fn example() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn repo() -> PathBuf {
    example().join("../..")
}

fn guide() -> String {
    std::fs::read_to_string(repo().join("docs/writing-a-backend.md")).unwrap()
}

/// The fenced blocks of `text`: (info string, content).
fn blocks(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut open: Option<(String, String)> = None;
    for line in text.lines() {
        match (&mut open, line.trim_start().strip_prefix("```")) {
            (None, Some(info)) => open = Some((info.trim().to_string(), String::new())),
            (Some(_), Some(_)) => out.push(open.take().unwrap()),
            (Some((_, body)), None) => {
                body.push_str(line);
                body.push('\n');
            }
            (None, None) => {}
        }
    }
    assert!(open.is_none(), "a block of the guide is not closed");
    out
}

/// The files of the example whose names end in one of `extensions`, read.
fn sources(extensions: &[&str]) -> Vec<(PathBuf, String)> {
    fn walk(dir: &Path, extensions: &[&str], out: &mut Vec<(PathBuf, String)>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_dir() && !matches!(name.as_str(), "target" | "host") {
                walk(&path, extensions, out);
            } else if extensions.iter().any(|e| name.ends_with(e)) {
                out.push((path.clone(), std::fs::read_to_string(&path).unwrap()));
            }
        }
    }
    let mut out = Vec::new();
    walk(&example(), extensions, &mut out);
    out
}

#[test]
fn every_code_block_of_the_guide_is_copied_from_the_example() {
    let mut checked = 0;
    let mut drifted = Vec::new();
    for (info, body) in blocks(&guide()) {
        let extensions: &[&str] = match info.split([',', ' ']).next().unwrap_or_default() {
            "rust" => &[".rs"],
            "toml" => &[".toml"],
            "yaml" => &[".yaml"],
            "console" | "text" | "" => continue,
            other => panic!(
                "a ```{other} block: the guide's blocks are rust, toml, yaml, console or text"
            ),
        };
        checked += 1;
        if !sources(extensions)
            .iter()
            .any(|(_, text)| text.contains(&body))
        {
            drifted.push(format!("```{info}\n{body}```"));
        }
    }
    assert!(
        drifted.is_empty(),
        "these blocks of docs/writing-a-backend.md are not in examples/vendor-driver (copy them \
         again from the files):\n\n{}",
        drifted.join("\n\n")
    );
    assert!(checked >= 8, "only {checked} code blocks in the guide");
}

#[test]
fn every_file_of_the_example_the_guide_names_exists() {
    let text = guide();
    let prefix = "examples/vendor-driver/";
    let mut named = 0;
    for (i, _) in text.match_indices(prefix) {
        let rest = &text[i..];
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || "/._-".contains(c)))
            .unwrap_or(rest.len());
        let path = rest[..end].trim_end_matches(['.', '/']);
        assert!(
            repo().join(path).exists(),
            "the guide names {path}, which does not exist"
        );
        named += 1;
    }
    assert!(
        named >= 5,
        "the guide names only {named} files of the example"
    );
}

/// The arguments of the driver in a guide command `cargo run … examples/vendor-driver/… -- ARGS`.
fn driver_args(command: &str) -> Option<Vec<String>> {
    let (cargo, args) = command.split_once(" -- ")?;
    (cargo.starts_with("cargo run") && cargo.contains("examples/vendor-driver/Cargo.toml"))
        .then(|| args.split_whitespace().map(str::to_string).collect())
}

#[test]
fn the_guide_commands_print_what_it_shows() {
    let mut ran = 0;
    for (info, body) in blocks(&guide()) {
        if info != "console" {
            continue;
        }
        // Each `$ ` line with the lines up to the next one: a command and its output.
        let mut commands: Vec<(String, String)> = Vec::new();
        for line in body.lines() {
            match line.strip_prefix("$ ") {
                Some(cmd) => commands.push((cmd.to_string(), String::new())),
                None => {
                    let (_, shown) = commands.last_mut().expect("console blocks start with `$ `");
                    shown.push_str(line.trim_end());
                    shown.push('\n');
                }
            }
        }
        for (command, shown) in commands {
            let Some(args) = driver_args(&command) else {
                continue;
            };
            let out = Command::new(env!("CARGO_BIN_EXE_fpga-driver"))
                .args(&args)
                .current_dir(repo())
                .output()
                .unwrap();
            assert!(out.status.success(), "`{command}` failed: {out:?}");
            let printed: String = String::from_utf8(out.stdout)
                .unwrap()
                .lines()
                .map(|l| format!("{}\n", l.trim_end()))
                .collect();
            assert_eq!(
                printed, shown,
                "`{command}` printed something else than the guide shows"
            );
            ran += 1;
        }
    }
    assert!(ran >= 3, "only {ran} commands of the guide ran");
}
