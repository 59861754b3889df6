//! The example commands in README.md (`sh` blocks) and docs/*.md (`$ ` lines of `console`
//! blocks) run as written from the repository root.
//!
//! A command runs when every file it reads (the value of `--config`, `-f` or `--policy`, a
//! `.wasm` module) is in the repository; the others are examples for a node
//! (`/etc/kubedev/...`) or for a file the text has the reader make first, and are left out, as
//! are `who-uses`, which asks a running kubelet, and `explain` without `-f`, which reads a live
//! cluster. `run` must still be serving after a few seconds; every other command must succeed.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The example command lines of one Markdown file.
fn commands(text: &str, fence: &str, prompt: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut inside = false;
    for line in text.lines() {
        let trimmed = line.trim();
        if let Some(rest) = trimmed.strip_prefix("```") {
            inside = !inside && rest == fence;
            continue;
        }
        if !inside {
            continue;
        }
        let Some(cmd) = trimmed.strip_prefix(prompt) else {
            continue;
        };
        let cmd = cmd.split(" # ").next().unwrap_or_default().trim();
        if !cmd.is_empty() && !cmd.starts_with('#') {
            out.push(cmd.to_string());
        }
    }
    out
}

/// Environment variables set on a command line.
type Env = Vec<(String, String)>;

/// `kubedev` arguments and environment of a command line, when it runs kubedev.
fn as_kubedev(line: &str) -> Option<(Env, Vec<String>)> {
    let mut words: Vec<String> = line.split_whitespace().map(str::to_string).collect();
    let mut env = Vec::new();
    while let Some((k, v)) = words.first().and_then(|w| w.split_once('=')) {
        env.push((k.to_string(), v.to_string()));
        words.remove(0);
    }
    let args = match words.first().map(String::as_str) {
        Some("kubedev") => words[1..].to_vec(),
        Some("cargo") => {
            let sep = words.iter().position(|w| w == "--")?;
            words[..sep]
                .contains(&"kubedev".to_string())
                .then(|| words[sep + 1..].to_vec())?
        }
        _ => return None,
    };
    Some((env, args))
}

/// The files a command reads, as paths from the repository root.
fn inputs(args: &[String]) -> Vec<PathBuf> {
    let options = args
        .windows(2)
        .filter(|w| matches!(w[0].as_str(), "--config" | "-f" | "--policy"))
        .map(|w| PathBuf::from(&w[1]));
    let modules = args
        .iter()
        .filter(|a| a.ends_with(".wasm"))
        .map(PathBuf::from);
    options.chain(modules).collect()
}

fn run_one(env: &[(String, String)], args: &[String]) -> Result<(), String> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kubedev"))
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .current_dir(repo())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    let serving = args.iter().any(|a| a == "run");
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            let mut err = String::new();
            std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).ok();
            return if status.success() && !serving {
                Ok(())
            } else {
                Err(format!("exited with {status}: {}", err.trim()))
            };
        }
        if serving && started.elapsed() > Duration::from_secs(3) {
            let _ = child.kill();
            let _ = child.wait();
            return Ok(());
        }
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            return Err("still running after 60 s".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn example_commands_run_as_written() {
    let root = repo();
    let mut lines = Vec::new();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    lines.extend(
        commands(&readme, "sh", "")
            .into_iter()
            .map(|c| ("README.md".to_string(), c)),
    );
    for doc in std::fs::read_dir(root.join("docs")).unwrap() {
        let path = doc.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            let text = std::fs::read_to_string(&path).unwrap();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            lines.extend(
                commands(&text, "console", "$ ")
                    .into_iter()
                    .map(|c| (name.clone(), c)),
            );
        }
    }
    let mut ran = Vec::new();
    let mut failed = Vec::new();
    for (file, line) in &lines {
        let Some((env, args)) = as_kubedev(line) else {
            continue;
        };
        let node_only = args.first().is_some_and(|a| a == "who-uses")
            || (args.first().is_some_and(|a| a == "explain")
                && !args.iter().any(|a| a == "-f" || a == "--file"));
        if node_only || !inputs(&args).iter().all(|p| root.join(p).exists()) {
            continue;
        }
        match run_one(&env, &args) {
            Ok(()) => ran.push(format!("{file}: {line}")),
            Err(e) => failed.push(format!("{file}: {line}: {e}")),
        }
    }
    assert!(
        failed.is_empty(),
        "example commands that fail:\n{}",
        failed.join("\n")
    );
    // README's own examples all run (none of them is for a node only), and so do the docs'.
    let from_readme = ran.iter().filter(|r| r.starts_with("README.md")).count();
    assert!(from_readme >= 5, "only these ran: {ran:#?}");
    assert!(ran.len() >= 9, "only these ran: {ran:#?}");
}
