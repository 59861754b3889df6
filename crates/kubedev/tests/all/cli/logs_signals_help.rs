//! The daemon process and the command line as a whole: fatal errors as JSON log lines, SIGTERM
//! with nobody reading the logs, and help with examples for every command.

use std::process::Command;

use super::{fails_naming, kubedev, write_config};

#[test]
fn fatal_errors_are_json_lines_under_log_format_json() {
    let out = kubedev(&[
        "--log-format",
        "json",
        "simulate",
        "-f",
        "/nonexistent/scenario.yaml",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    let line: serde_json::Value = serde_json::from_str(err.trim_end()).unwrap();
    assert_eq!(line["level"], "ERROR", "{line}");
    assert_eq!(line["target"], "kubedev", "{line}");
    let message = line["fields"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("read scenario file /nonexistent/scenario.yaml: "),
        "{message}"
    );
    assert!(
        line["timestamp"].as_str().is_some_and(|t| !t.is_empty()),
        "{line}"
    );

    // Text stays text.
    let err = fails_naming(
        &["simulate", "-f", "/nonexistent/scenario.yaml"],
        "kubedev: read scenario file /nonexistent/scenario.yaml: ",
    );
    assert!(!err.starts_with('{'), "{err}");
}

#[test]
fn sigterm_stops_the_daemon_even_when_nobody_reads_its_logs() {
    let dir = tempfile::tempdir().unwrap();
    let dp = dir.path().join("dp");
    std::fs::create_dir_all(&dp).unwrap();
    let config = write_config(
        dir.path(),
        &format!(
            "devicePlugin:\n  directory: {}\n  resources:\n    - name: example.com/dev\nbackends:\n  static:\n    pool: p\n    devices:\n      - name: dev-0\n",
            dp.display()
        ),
    );
    let mut child = Command::new(env!("CARGO_BIN_EXE_kubedev"))
        .args(["run", "--config", &config])
        .env("RUST_LOG", "debug")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until it serves (its socket appears), then close the read end of its stderr.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !std::fs::read_dir(&dp).unwrap().any(|e| {
        e.unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with("kubedev-")
    }) {
        assert!(
            std::time::Instant::now() < deadline,
            "kubedev did not start"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    drop(child.stderr.take());
    let pid = rustix::process::Pid::from_raw(i32::try_from(child.id()).unwrap()).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("kubedev did not stop after SIGTERM with its stderr closed");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert!(status.success(), "{status}");
}

#[test]
fn every_command_has_help_with_examples_one_per_line() {
    for cmd in [
        &["run"][..],
        &["simulate"],
        &["discover"],
        &["who-uses"],
        &["check-config"],
        &["cdi", "generate"],
        &["policy", "check"],
    ] {
        let mut args = cmd.to_vec();
        args.push("--help");
        let out = kubedev(&args);
        assert!(out.status.success(), "{cmd:?}");
        let help = String::from_utf8_lossy(&out.stdout);
        let examples: Vec<&str> = help
            .split("Examples:\n")
            .nth(1)
            .unwrap_or_else(|| panic!("{cmd:?} --help has no examples:\n{help}"))
            .lines()
            .take_while(|l| l.starts_with("  "))
            .collect();
        assert!(!examples.is_empty(), "{cmd:?}:\n{help}");
        let prefix = format!("kubedev {}", cmd.join(" "));
        // One command per line, each starting with the command it documents.
        assert!(
            examples[0].trim_start().starts_with(&prefix),
            "{cmd:?}: {examples:?}"
        );
        for e in &examples {
            assert!(e.matches("kubedev ").count() <= 1, "{cmd:?}: {e:?}");
        }
    }
}
